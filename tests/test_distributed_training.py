"""Private training split over 2 processes (CPU, gloo) against one process: same batches, history, report, weights.

The 2 ranks are spawned once (torch.multiprocessing) and run every case; the one-process references run here.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from training.distributed import RankGroup
from training.private_train import train_denoiser
from training.release import load_private_record
from training.train_config import TrainConfig
from transdenoiser.errors import UserError

BASE = dict(denoiser="tiny", denoiser_kwargs={"width": 2}, activation="silu", batch_size=16, train_examples=64,
            eval_examples=50, learning_rate=0.05, optimizer="sgd", momentum=0.9, delta=1e-3, seed=3,
            reproducible_noise=True, grad_chunk_size=5)
WIDTH2_PARAMETERS = 77  # tiny denoiser, width 2, 1 channel: counted below independently of the code under test
CASES = {
    # sepdp over 2 epochs, interrupted after the first and resumed by the same 2 ranks
    "sepdp": (dict(BASE, arm="sepdp", epochs=2), 1),
    "nodp": (dict(BASE, arm="nodp", epochs=1, optimizer="adam", learning_rate=1e-3), None),
    # S_min computed from the whole non-negative group (w = 77 <= max_smin_dim) and the paper's per-group noise
    "transdenoiser": (dict(BASE, arm="transdenoiser", epochs=1, max_smin_dim=100, merge_uncredited_noise=False,
                           xi_low=0.0), None),
    # S_min never computed (w > max_smin_dim) with merge_uncredited_noise: every step the merged sepdp step
    "transdenoiser_merged": (dict(BASE, arm="transdenoiser", epochs=1, max_smin_dim=10), None),
}
# Two spawned ranks pay for importing torch and the training modules: generous on a shared machine (measured: 12 min
# of wall time at load average 17 for this module, 2.5 min of CPU); a deadlock would still be caught.
pytestmark = pytest.mark.timeout(1800)
HISTORY_EXACT = ("batch_size", "num_nonnegative", "smin_method")
HISTORY_CLOSE = ("smin", "input_multiplier", "sigma_bar", "explicit_multiplier", "mean_loss")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recording_sampler(log: list):
    """Wrap PoissonSampler.sample / torch.randperm-free: record every Poisson batch drawn."""
    from training import private_train

    original = private_train.PoissonSampler.sample

    def sample(self, generator):
        index = original(self, generator)
        log.append(index.tolist())
        return index

    private_train.PoissonSampler.sample = sample
    return original


def _run_case(name, overrides, stop_after, dataset, classifier, out: Path, group):
    from training import private_train

    batches: list = []
    original = _recording_sampler(batches)
    try:
        config = TrainConfig(**overrides)
        kwargs = dict(checkpoint_dir=out / name, group=group)
        if stop_after is not None:
            train_denoiser(config, dataset, classifier, torch.device("cpu"), stop_after_epochs=stop_after, **kwargs)
            model, _ = train_denoiser(config, dataset, classifier, torch.device("cpu"), resume=True, **kwargs)
        else:
            model, _ = train_denoiser(config, dataset, classifier, torch.device("cpu"), **kwargs)
    finally:
        private_train.PoissonSampler.sample = original
    return model, batches


def _worker(rank: int, world_size: int, port: int, classifier_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist

    from training.checkpoint import load_checkpoint
    from training.datasets import load_dataset
    from training.distributed import close, rank_group_from_environment

    group = rank_group_from_environment(torch.device("cpu"))
    calls: list[int] = []
    original_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):  # every all-reduce of the run goes through here
        calls.append(tensor.numel() * tensor.element_size())
        return original_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    dataset, classifier = load_dataset("mnist10k"), load_checkpoint(classifier_dir, kind="classifier")
    root = Path(out)
    facts = {}
    for name, (overrides, stop_after) in CASES.items():
        calls.clear()
        model, batches = _run_case(name, overrides, stop_after, dataset, classifier, root / "ddp", group)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(root / f"{name}.rank{rank}.st"))
        facts[name] = {"all_reduce_bytes": list(calls), "batches": batches}
    group.check_same("the same settings", "the training settings")  # agreeing ranks pass
    try:  # rank 1 launched with other settings: every rank refuses with the same line, none is left waiting
        group.check_same(f"settings of rank {rank if rank == 1 else 0}", "the training settings")
        facts["disagreement"] = None
    except UserError as exc:
        facts["disagreement"] = str(exc)
    (root / f"facts.rank{rank}.json").write_text(json.dumps(facts))
    dist.all_reduce = original_all_reduce
    threads_before = len(os.listdir("/proc/self/task"))
    close(group)
    (root / f"threads.rank{rank}.json").write_text(json.dumps([threads_before, len(os.listdir("/proc/self/task"))]))


@pytest.fixture(scope="module")
def runs(mnist10k, classifier_dir, tmp_path_factory):
    """(2-rank output folder, one-process output folder, one-process results): the 2 ranks run in the background
    while the one-process references run here."""
    from training.checkpoint import load_checkpoint

    out = tmp_path_factory.mktemp("ddp")
    ranks = mp.start_processes(_worker, args=(2, _free_port(), str(classifier_dir), str(out)), nprocs=2, join=False,
                               start_method="spawn")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the 2 ranks hold a core each
    try:
        single_dir = tmp_path_factory.mktemp("single")
        classifier = load_checkpoint(classifier_dir, kind="classifier")
        single = {}
        for name, (overrides, _) in CASES.items():  # uninterrupted reference runs
            model, batches = _run_case(name, overrides, None, mnist10k, classifier, single_dir, None)
            single[name] = ({k: v.clone() for k, v in model.state_dict().items()}, batches)
    finally:
        torch.set_num_threads(threads)
        while not ranks.join():
            pass
    return out, single_dir, single


def _assert_same_report(got, want, where="privacy"):
    """Equal reports: same keys, strings and integers; floats equal to float rounding (data-dependent entries
    such as the explicit multipliers are computed from per-step values that are)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (where, sorted(got), sorted(want))
        for key in want:
            _assert_same_report(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _assert_same_report(a, b, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert got == pytest.approx(want, rel=1e-6, nan_ok=True), where
    else:
        assert got == want, where


def _history(directory: Path) -> dict[str, np.ndarray]:
    tensors = load_file(str(directory / "private" / "training_state.safetensors"))
    return {k.split(".", 1)[1]: v.numpy() for k, v in tensors.items() if k.startswith("history.")}


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_equal_one_process(name, runs):
    two_ranks, single_dir, single = runs
    single_weights, single_batches = single[name]
    facts = [json.loads((two_ranks / f"facts.rank{r}.json").read_text())[name] for r in (0, 1)]
    # the same Poisson batches on both ranks and in one process
    if CASES[name][0]["arm"] != "nodp":
        assert facts[0]["batches"] == facts[1]["batches"] == single_batches
        assert len(single_batches) == 4 * CASES[name][0]["epochs"]
    # the same per-step privacy history
    ours, reference = _history(two_ranks / "ddp" / name), _history(single_dir / name)
    assert set(ours) == set(reference)
    for key in HISTORY_EXACT:
        assert np.array_equal(ours[key], reference[key]), key
    for key in HISTORY_CLOSE:
        assert np.allclose(ours[key], reference[key], rtol=1e-5, atol=1e-7, equal_nan=True), (key, ours[key],
                                                                                           reference[key])
    if name == "transdenoiser":  # S_min was really computed (eigvalsh), from the whole non-negative group
        from training.privacy.smin import METHODS

        assert (ours["smin_method"] == METHODS.index("eigvalsh")).any(), ours["smin_method"]
    # the same privacy report and accountant
    report, expected = (load_private_record(d)["privacy"] for d in (two_ranks / "ddp" / name, single_dir / name))
    _assert_same_report(report, expected)
    assert load_private_record(two_ranks / "ddp" / name)["world_size"] == 2
    # weights: both ranks identical, and equal to one process's up to float rounding
    ranks = [load_file(str(two_ranks / f"{name}.rank{r}.st")) for r in (0, 1)]
    for key, value in single_weights.items():
        assert torch.equal(ranks[0][key], ranks[1][key]), key
        assert torch.allclose(ranks[0][key], value, rtol=1e-4, atol=1e-6), (key, (ranks[0][key] - value).abs().max())


@pytest.mark.parametrize("name", ["sepdp", "transdenoiser", "transdenoiser_merged"])
def test_one_bucketed_all_reduce_per_step(name, runs):
    """Counted by wrapping torch.distributed.all_reduce: one call per step, carrying every parameter's clipped sum
    (sepdp, and the transdenoiser arm when no step can be credited: w floats + the loss sum; transdenoiser
    otherwise: both groups' sums + loss sum + the batch's flags and factors)."""
    two_ranks = runs[0]
    facts = json.loads((two_ranks / "facts.rank0.json").read_text())[name]
    history = _history(two_ranks / "ddp" / name)
    nonempty = history["batch_size"] > 0
    assert len(facts["all_reduce_bytes"]) == int(nonempty.sum())
    if name in ("sepdp", "transdenoiser_merged"):  # merged, no step creditable: sepdp's step and all-reduce
        expected = [4 * (WIDTH2_PARAMETERS + 1)] * int(nonempty.sum())
    else:
        expected = [4 * (2 * WIDTH2_PARAMETERS + 1 + 2 * int(b)) for b in history["batch_size"] if b > 0]
    assert facts["all_reduce_bytes"] == expected


def test_parameter_count_of_the_test_model():
    from training.models import build_model

    model = build_model("tiny", width=2, in_channels=1)
    # conv 1->2 (3x3 + bias), conv 2->2 (3x3 + bias), conv-transpose 2->1 (3x3 + bias)
    assert sum(p.numel() for p in model.parameters()) == (9 * 2 + 2) + (2 * 2 * 9 + 2) + (2 * 9 + 1)
    assert WIDTH2_PARAMETERS == (9 * 2 + 2) + (2 * 2 * 9 + 2) + (2 * 9 + 1)


def test_ranks_that_disagree_on_their_settings_all_refuse_with_one_line(runs):
    out, _, _ = runs
    facts = [json.loads((out / f"facts.rank{rank}.json").read_text()) for rank in (0, 1)]
    want = ("the 2 training processes disagree on the training settings (rank(s) 1 differ from rank 0); launch "
            "every rank with the same command and data")
    assert [f["disagreement"] for f in facts] == [want, want]


def test_close_joins_the_process_groups_threads(runs):
    """After the ranks' collectives (which make torch import torch.distributed.nn, whose functions take group.WORLD
    as a default argument), close() still destroys the process group: its gloo threads are gone, so none can be
    caught releasing a collective while the interpreter exits (an abort, SIGABRT, seen when they were not)."""
    out = runs[0]
    for rank in (0, 1):
        before, after = json.loads((out / f"threads.rank{rank}.json").read_text())
        assert after < before, f"rank {rank}: {before} threads before close(), {after} after: the group outlived it"


def test_resume_with_another_world_size_is_refused(runs, mnist10k, classifier_dir):
    from training.checkpoint import load_checkpoint

    two_ranks = runs[0]
    classifier = load_checkpoint(classifier_dir, kind="classifier")
    with pytest.raises(UserError, match="trained by 2 process.*this resume has 1"):
        train_denoiser(TrainConfig(**CASES["nodp"][0]), mnist10k, classifier, torch.device("cpu"),
                       checkpoint_dir=two_ranks / "ddp" / "nodp", resume=True)


@pytest.mark.parametrize("size,world", [(0, 2), (1, 2), (7, 2), (16, 3), (5, 8)])
def test_shares_partition_the_batch(size, world):
    """Contiguous near-equal shares, as numpy's array_split cuts them."""
    expected = [part.tolist() for part in np.array_split(np.arange(size), world)]
    got = [list(range(size))[RankGroup(rank=r, world_size=world).share(size)] for r in range(world)]
    assert got == expected


def test_bench_ddp_quick_measures_one_and_two_processes(tmp_path):
    from benchmarks import bench_ddp

    assert bench_ddp.main(["--quick", "--out", str(tmp_path / "ddp.json")]) == 0
    result = json.loads((tmp_path / "ddp.json").read_text())
    two = result["configurations"]["2 processes x 1 thread"]
    one = result["configurations"]["1 process x 1 thread"]
    assert two["all_reduce_calls_per_step"] == [1.0] and one["all_reduce_calls_per_step"] == [0.0]
    assert two["bytes_per_all_reduce"] == 4 * (WIDTH2_PARAMETERS + 1)  # every clipped sum + the loss sum, float32
    assert one["median_examples_per_second"] > 0 and two["median_examples_per_second"] > 0


class _RecordingGroup(RankGroup):
    """Rank ``rank`` of 2 without a process group: keeps what it would all-reduce and returns it unsummed."""

    def sum_over_ranks(self, tensors):
        self.sent = {k: v.clone() for k, v in tensors.items()}
        return tensors


@pytest.mark.parametrize("noise_draws", [1, 3])
def test_rank_shares_sum_to_the_whole_batch(noise_draws):
    """Each rank's contribution (its share of 5 examples, each the mean over noise_draws input-noise draws, clipped)
    summed over the 2 ranks is the one-process clipped sum, and every rank consumes the generator exactly as one
    process does (so the shared generator stays in step)."""
    from training.arms import SepDPArm
    from training.models import build_model

    torch.manual_seed(0)
    model = build_model("tiny", width=2, in_channels=1)
    config = TrainConfig(**dict(BASE, arm="sepdp", noise_draws=noise_draws, clip_norm=0.05))
    x = torch.rand(5, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    single = SepDPArm(model, config, 2.0, 4.0, 10)
    generator = torch.Generator().manual_seed(7)
    _, grads, losses, factors = single.clipped(x, generator)
    whole = single.clipper.weighted_sum(grads, factors)
    assert float(factors.min()) < 1  # clipping is active
    sent = []
    for rank in (0, 1):
        group = _RecordingGroup(rank=rank, world_size=2)
        rank_generator = torch.Generator().manual_seed(7)
        SepDPArm(model, config, 2.0, 4.0, 10, group=group).gradient(x, rank_generator)
        sent.append(group.sent)
        # after the clipped sums, the one-process arm would draw the DP noise from the same generator state
        reference = torch.Generator().manual_seed(7)
        single.clipped(x, reference)
        single.noise.add(whole, 2.0, reference)
        assert torch.equal(rank_generator.get_state(), reference.get_state())
    for name, value in whole.items():
        assert torch.allclose(sent[0][f"grad.{name}"] + sent[1][f"grad.{name}"], value, rtol=1e-5, atol=1e-7), name
    assert float(sent[0]["loss_sum"] + sent[1]["loss_sum"]) == pytest.approx(float(losses.sum()), rel=1e-5)
