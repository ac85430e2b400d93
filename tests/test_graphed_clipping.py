"""CUDA-graph clipped sums: every piece padded with zero-weight rows to a multiple of the granule gives the
unpadded sums, factors and losses (tested on CPU with the same buffers run eagerly: ``record=False``); the
plan turns graphs on only on CUDA and never for a model with batch statistics; a failed capture leaves the run
eager and says why. The graph replay itself is compared with the eager sums by the CUDA-only test at the end
(skipped without a GPU; docs/results/gpu.md says where it ran)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from training.privacy.clipping import ClippedGradients, ExecutionPlan, plan_execution
from training.privacy.graphed import GraphedPieces, default_granule, graphs_possible, padded_size

CLIP = 0.5


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.GroupNorm(2, 4), nn.SiLU(),
                         nn.ConvTranspose2d(4, 1, 3, stride=2, padding=1, output_padding=1))


def _data(n: int, rows: int = 1, seed: int = 3):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand((n * rows, 1, 8, 8), generator=generator)
    return x + 0.3 * torch.randn(x.shape, generator=generator), x


def _padded_engine(model, granule: int, physical: int = 0, budget: int = 10 ** 12) -> ClippedGradients:
    """The ghost engine with graphs on, its GraphedPieces running the padded buffers eagerly (CPU)."""
    plan = ExecutionPlan("ghost", 0, physical, [], cuda_graphs=True, graph_granule=granule)
    engine = ClippedGradients(model, CLIP, plan)
    engine.graphs = GraphedPieces(engine._graph_piece, granule, bytes_per_example=1, free_bytes=budget,
                                  record=False)
    return engine


def test_granule_and_padded_sizes():
    assert [default_granule(b) for b in (1, 7, 64, 100, 256, 300, 1024)] == [8, 8, 8, 8, 32, 32, 128]
    assert [padded_size(n, 32) for n in (1, 31, 32, 33, 250)] == [32, 32, 32, 64, 256]
    with pytest.raises(ValueError, match="must be >= 1"):
        padded_size(0, 8)
    with pytest.raises(ValueError, match="granule must be >= 1"):
        GraphedPieces(lambda z, x, m: None, 0, 1, 1)


@pytest.mark.parametrize("n,rows,granule,physical", [(7, 1, 8, 0), (5, 3, 4, 0), (9, 1, 4, 4), (8, 1, 8, 0)])
def test_padded_pieces_give_the_unpadded_sums(n, rows, granule, physical):
    """Zero rows with clip weight 0 add nothing: sums, factors and losses equal the eager unpadded ones."""
    model = _model()
    z, x = _data(n, rows)
    eager = ClippedGradients(model, CLIP, ExecutionPlan("ghost", 0, physical, []))(z, x, rows)
    padded_engine = _padded_engine(model, granule, physical)
    padded = padded_engine(z, x, rows)
    assert padded.factors.shape == (n,) and padded.losses.shape == (n,)
    assert torch.allclose(padded.factors, eager.factors, rtol=1e-5)
    assert torch.allclose(padded.losses, eager.losses, rtol=1e-5)
    for k, v in eager.whole().items():
        assert torch.allclose(padded.whole()[k], v, rtol=1e-5, atol=1e-7), k
    sizes = sorted(key[0] for key in padded_engine.graphs.captures)
    assert all(size % granule == 0 for size in sizes)
    # a second batch of another size reuses or adds a padded size, never one per batch size
    padded_engine(*_data(n - 1 if n > 1 else n, rows, seed=4), rows)
    assert len(padded_engine.graphs.captures) <= len(sizes) + 1


def test_padding_rows_do_not_leak_into_the_next_piece():
    """Buffers are reused across calls: a smaller batch after a larger one of the same padded size sees zero
    rows, not the larger batch's leftovers."""
    model = _model()
    engine = _padded_engine(model, 8)
    z, x = _data(7)
    engine(z, x)
    small = engine(z[:3], x[:3])
    expected = ClippedGradients(model, CLIP, ExecutionPlan("ghost", 0, 0, []))(z[:3], x[:3])
    for k, v in expected.whole().items():
        assert torch.allclose(small.whole()[k], v, rtol=1e-5, atol=1e-7), k
    assert len(engine.graphs.captures) == 1


def test_no_capture_beyond_the_memory_budget_runs_eagerly():
    model = _model()
    engine = _padded_engine(model, 8, budget=0)
    z, x = _data(5)
    sums = engine(z, x)
    assert engine.graphs.captures == {}  # nothing fitted: the piece ran on the eager path
    expected = ClippedGradients(model, CLIP, ExecutionPlan("ghost", 0, 0, []))(z, x)
    for k, v in expected.whole().items():
        assert torch.allclose(sums.whole()[k], v, rtol=1e-5, atol=1e-7), k


def test_a_failed_capture_leaves_the_run_eager_and_recorded():
    model = _model()
    engine = _padded_engine(model, 8)

    def broken(*args):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    engine.graphs.piece = broken
    z, x = _data(5)
    sums = engine(z, x)
    assert engine.plan.cuda_graphs is False and engine.graphs is None
    assert "CUDA graph capture failed (RuntimeError: operation not permitted" in engine.plan.reasons[-1]
    assert sums.whole().keys() == dict(model.named_parameters()).keys()


def test_split_steps_and_vmap_never_use_graphs():
    model = _model()
    engine = _padded_engine(model, 8)
    z, x = _data(6)
    engine(z, x, split=lambda zp, xp: zp.flatten(1).mean(1) > 0)
    assert engine.graphs.captures == {}


def test_plan_turns_graphs_on_only_on_cuda_and_without_batch_statistics():
    cpu = plan_execution(_model(), (1, 8, 8), 64, torch.device("cpu"), clipping="ghost")
    assert cpu.cuda_graphs is False and cpu.graph_granule == 0
    assert "cuda_graphs" in cpu.as_dict() and cpu.as_dict()["cuda_graphs"] is False
    assert graphs_possible(_model(), torch.device("cpu"))[0] is False
    possible, why = graphs_possible(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)), torch.device("cuda"))
    assert possible is False and "mixes the examples" in why
    assert graphs_possible(_model(), torch.device("cuda"))[0] is True
    with pytest.raises(ValueError, match="cuda_graphs must be one of auto, off"):
        plan_execution(_model(), (1, 8, 8), 4, torch.device("cpu"), clipping="ghost", cuda_graphs="on")
    restored = ExecutionPlan.from_dict({"clipping": "ghost", "grad_chunk_size": 0, "physical_batch_size": 0,
                                        "reasons": ["x"]}, "kept")
    assert restored.cuda_graphs is False and restored.reasons == ["x", "kept"]


def test_a_padded_piece_never_exceeds_the_piece_size(monkeypatch):
    """On CUDA (planned here with graphs allowed on CPU) a memory-sized piece is rounded down to whole granules,
    and a configured piece size gets a granule that divides it."""
    import training.privacy.clipping as clipping

    monkeypatch.setattr(clipping, "graphs_possible", lambda model, device: (True, "CUDA graphs: test"))
    monkeypatch.setattr(clipping, "device_physical_batch",
                        lambda model, name, shape, device, configured: (100 if configured == -1 else configured, "x"))
    auto = plan_execution(_model(), (1, 8, 8), 256, torch.device("cpu"), clipping="ghost")
    assert (auto.graph_granule, auto.physical_batch_size) == (32, 96)
    configured = plan_execution(_model(), (1, 8, 8), 256, torch.device("cpu"), clipping="ghost",
                                physical_batch_size=100)
    assert (configured.graph_granule, configured.physical_batch_size) == (25, 100)
    assert padded_size(100, configured.graph_granule) == 100


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_equals_the_eager_sums():
    device = torch.device("cuda")
    model = _model().to(device)
    z, x = (t.to(device) for t in _data(37))
    eager = ClippedGradients(model, CLIP, ExecutionPlan("ghost", 0, 0, []))(z, x)
    plan = plan_execution(model, (1, 8, 8), 37, device, clipping="ghost")
    assert plan.cuda_graphs and plan.graph_granule == 8
    engine = ClippedGradients(model, CLIP, plan)
    for batch in (37, 30, 37):
        sums = engine(z[:batch], x[:batch])
        assert plan.cuda_graphs, plan.reasons
    reference = ClippedGradients(model, CLIP, ExecutionPlan("ghost", 0, 0, []))(z[:37], x[:37])
    for k, v in reference.whole().items():
        assert torch.allclose(sums.whole()[k], v, rtol=1e-4, atol=1e-6), k
    assert torch.allclose(sums.factors, eager.factors, rtol=1e-4)
    assert len(engine.graphs.captures) == 2  # 40 and 32 examples
