"""Ghost clipping and the clipping engine: the clipped sum equals a plain per-example autograd loop (clip each
example's gradient to C, sum) for every supported layer type, random shapes, both norm methods, noise draws
averaged before clipping, the per-layer vmap fallback, vmap chunkings and physical batch pieces."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import training.privacy.ghost_clipping as gc
from training.privacy.clipping import (
    AUTO,
    CPU_CHUNK_SIZE,
    ClippedGradients,
    ExecutionPlan,
    device_chunk_size,
    measure_engines,
    parse_size,
    plan_execution,
)
from training.privacy.ghost_clipping import GhostClipping, GhostUnsupported, ghost_layer_kinds

CLIP = 0.5


class Scale(nn.Module):
    """A layer ghost clipping does not know: its parameter gets per-example gradients by vmap."""

    def __init__(self, channels: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(channels, 1, 1))

    def forward(self, x):
        return x * self.w


class Twice(nn.Module):
    """One layer applied twice per forward pass (weight sharing)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 3)

    def forward(self, x):
        return self.layer(torch.tanh(self.layer(x)))


def reference(model, z, x, rows, clip=CLIP):
    """(per-example norms, sum_i min(1, C/||g_i||) g_i) one example at a time with torch.autograd."""
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    total = {k: torch.zeros_like(p) for k, p in zip(names, params, strict=True)}
    norms = []
    for i in range(len(z) // rows):
        part = slice(i * rows, (i + 1) * rows)
        loss = (model(z[part]) - x[part]).pow(2).flatten(1).sum(1).mean()
        grads = torch.autograd.grad(loss, params)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        norms.append(norm)
        for k, g in zip(names, grads, strict=True):
            total[k] += min(1.0, clip / float(norm)) * g
    return torch.stack(norms), total


def data(model, in_shape, n, rows, seed):
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn((n * rows, *in_shape), generator=generator)
    with torch.no_grad():
        out_shape = model(z[:1]).shape[1:]
    return z, torch.randn((n * rows, *out_shape), generator=generator)


def random_models(seed: int):
    """Random shapes of every supported layer type (and one unknown layer), with their input shapes."""
    g = torch.Generator().manual_seed(seed)

    def r(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    groups = r(1, 2)
    c_in, c_mid = 2 * groups, 3 * groups
    side = r(5, 9)
    torch.manual_seed(seed)
    return [
        (nn.Sequential(nn.Linear(6, r(2, 5))), (6,)),
        (nn.Sequential(nn.Linear(5, 4), nn.SiLU(), nn.Linear(4, 3, bias=False)), (r(1, 4), 5)),
        (nn.Sequential(nn.Conv2d(c_in, c_mid, r(1, 3), stride=r(1, 2), padding=r(0, 2), dilation=r(1, 2),
                                 groups=groups), nn.SiLU(), nn.Conv2d(c_mid, 2, 3, padding=1)), (c_in, side, side)),
        (nn.Sequential(nn.ConvTranspose2d(c_in, c_mid, 3, stride=2, padding=1, output_padding=1, groups=groups),
                       nn.SiLU(), nn.ConvTranspose2d(c_mid, 1, r(2, 3), stride=r(1, 2), dilation=r(1, 2))),
         (c_in, side, side)),
        (nn.Sequential(nn.Conv2d(c_in, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(), Scale(4)),
         (c_in, side, side)),
    ]


@pytest.mark.parametrize("seed", [0])
@pytest.mark.parametrize("discount", [0, 10 ** 9])  # 0: ghost norm (Gram matrices) everywhere; 1e9: instantiation
@pytest.mark.parametrize("rows", [1, 3])  # input-noise draws per example, averaged before clipping
def test_ghost_clipped_sum_equals_the_per_example_loop(seed, discount, rows, monkeypatch):
    monkeypatch.setattr(gc, "GHOST_DISCOUNT", discount)
    for model, in_shape in random_models(seed):
        z, x = data(model, in_shape, 4, rows, seed)
        batch = GhostClipping(model)(z, x, rows)
        norms, expected = reference(model, z, x, rows)
        assert torch.allclose(batch.norms, norms, rtol=1e-4), model
        assert (batch.norms > CLIP).any(), "the test needs clipping to be active"
        summed = batch.weighted_sum((CLIP / batch.norms).clamp(max=1))
        for k, v in expected.items():
            assert torch.allclose(summed[k], v, rtol=1e-4, atol=1e-6), (model, k)


def test_group_norm_rows_use_the_forward_statistics_which_equal_recomputed_ones(monkeypatch):
    """The engine reads GroupNorm's mean and 1/std from the forward's autograd node (no second pass over the
    input); they are the side-by-side layout's statistics, so the per-example gradients are the same."""
    torch.manual_seed(0)
    norm = nn.GroupNorm(3, 6)
    a = torch.randn(5, 6, 4, 4, requires_grad=True)
    out = norm(a)
    statistics = gc._saved_group_norm_statistics(out, a)
    assert statistics is not None and statistics[0].shape == (5, 3)
    b = torch.randn_like(out)
    reused = gc._group_norm_rows(norm, a.detach(), b, 5, statistics)
    recomputed = gc._group_norm_rows(norm, a.detach(), b, 5)
    for k in ("weight", "bias"):
        assert torch.allclose(reused[k], recomputed[k], rtol=1e-5, atol=1e-6)
    # an output not made by the GroupNorm kernel has none: they are recomputed
    assert gc._saved_group_norm_statistics(out * 2, a) is None
    # a GhostClipping pass hands the saved statistics to the rows (no forward GroupNorm call of its own)
    calls = []
    original = gc._group_norm_rows
    monkeypatch.setattr(gc, "_group_norm_rows", lambda m, a, b, n, stats=None: (calls.append(stats), original(
        m, a, b, n, stats))[1])
    model = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.GroupNorm(3, 6), nn.Conv2d(6, 1, 3, padding=1))
    z, x = torch.randn(4, 1, 5, 5), torch.randn(4, 1, 5, 5)
    batch = GhostClipping(model)(z, x)
    assert len(calls) == 1 and calls[0] is not None
    norms, _ = reference(model, z, x, 1)
    assert torch.allclose(batch.norms, norms, rtol=1e-4)


def test_layer_kinds_and_unsupported_structures():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.GroupNorm(1, 2), Scale(2), nn.ConvTranspose2d(2, 1, 3))
    assert ghost_layer_kinds(model) == {"0": "conv2d", "1": "group_norm", "2": "vmap", "3": "conv_transpose2d"}
    twice = Twice()
    with pytest.raises(GhostUnsupported, match="ran 2 times"):
        GhostClipping(twice)(torch.randn(2, 3), torch.randn(2, 3))
    # a layer output changed in place by the next module: handed on as a copy, the sum still exact
    inplace = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 3))
    z, x = torch.randn(4, 3), torch.randn(4, 3)
    batch = GhostClipping(inplace)(z, x)
    norms, expected = reference(inplace, z, x, 1)
    assert torch.allclose(batch.norms, norms, rtol=1e-4)
    summed = batch.weighted_sum((CLIP / batch.norms).clamp(max=1))
    assert all(torch.allclose(summed[k], v, rtol=1e-4, atol=1e-6) for k, v in expected.items())
    # the engine falls back to vmap for the whole model, with the same clipped sum
    plan = ExecutionPlan("ghost", 0, 0)
    z, x = torch.randn(5, 3), torch.randn(5, 3)
    sums = ClippedGradients(twice, CLIP, plan)(z, x)
    assert plan.clipping == "vmap" and "cannot follow" in plan.reasons[-1]
    _, expected = reference(twice, z, x, 1)
    for k, v in expected.items():
        assert torch.allclose(sums.whole()[k], v, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("clipping,chunk,piece", [("vmap", 0, 0), ("vmap", 1, 0), ("vmap", 3, 2), ("ghost", 0, 1),
                                                  ("ghost", 0, 3), ("ghost", 0, 0)])
def test_chunkings_and_physical_pieces_give_equal_clipped_sums(clipping, chunk, piece):
    """Many chunks (1 example each) and physical pieces (1 example each) give the one-call sums."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.GroupNorm(2, 4), nn.SiLU(),
                          nn.ConvTranspose2d(4, 1, 3, stride=2, padding=1, output_padding=1))
    z, x = data(model, (1, 8, 8), 7, 1, 3)
    split = lambda zp, xp: zp.flatten(1).mean(1) > 0  # noqa: E731  a split by example, as Algorithm 1's
    sums = ClippedGradients(model, CLIP, ExecutionPlan(clipping, chunk, piece))(z, x, split=split)
    norms, expected = reference(model, z, x, 1)
    mask = split(z, x)
    assert torch.equal(sums.mask, mask)
    assert torch.allclose(sums.factors, (CLIP / norms).clamp(max=1), rtol=1e-4)
    for k, v in expected.items():
        assert torch.allclose(sums.whole()[k], v, rtol=1e-4, atol=1e-6), k
    _, nonneg = reference(model, z[mask], x[mask], 1)
    for k, v in nonneg.items():
        assert torch.allclose(sums.sums["nonneg"][k], v, rtol=1e-4, atol=1e-6), k


def test_device_sizing_and_plan():
    model = nn.Linear(10, 10)
    assert device_chunk_size(model, torch.device("cpu"), 64) == (CPU_CHUNK_SIZE, device_chunk_size(
        model, torch.device("cpu"), 64)[1])
    assert device_chunk_size(model, torch.device("cpu"), 64, 5)[0] == 5
    plan = plan_execution(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1)), (1, 6, 6), 4, torch.device("cpu"))
    assert plan.clipping in ("ghost", "vmap") and set(plan.timings) == {"ghost", "vmap"}
    assert "auto" in plan.describe()
    forced = plan_execution(model, (10,), 4, torch.device("cpu"), clipping="vmap", grad_chunk_size=3,
                            physical_batch_size=2)
    assert (forced.clipping, forced.grad_chunk_size, forced.physical_batch_size) == ("vmap", 3, 2)
    assert parse_size("auto", "x") == AUTO and parse_size("0", "x") == 0
    with pytest.raises(ValueError, match="auto or an integer"):
        parse_size("-2", "--grad-chunk-size")


# ------------------------------------------------------------------------------------------------ the arms

def _arm_gradient(arm_name: str, clipping: str, physical: int, seed: int = 3, **overrides):
    from training.arms import ARM_CLASSES
    from training.models import build_model
    from training.train_config import TrainConfig

    torch.manual_seed(0)
    model = build_model("autoencoder", in_channels=1, widths=[4, 8], norm="group", groups=2)
    config = TrainConfig(arm=arm_name, clip_norm=0.05, clipping=clipping, physical_batch_size=physical,
                         grad_chunk_size=2, max_smin_dim=1, **overrides)
    arm = ARM_CLASSES[arm_name](model, config, xi_up=2.0, expected_batch=4.0, total_steps=10)
    x = torch.rand((7, 1, 8, 8), generator=torch.Generator().manual_seed(seed))
    grads, record = arm.gradient(x, torch.Generator().manual_seed(seed))
    assert arm.execution.clipping == clipping
    return grads, record


@pytest.mark.parametrize("arm_name,overrides", [("sepdp", {}), ("sepdp", {"noise_draws": 3}),
                                                ("transdenoiser", {}),
                                                ("transdenoiser", {"merge_uncredited_noise": False})])
def test_arms_release_the_same_update_with_either_engine_and_any_pieces(arm_name, overrides):
    """The same generator gives the same update (noise included) with vmap, ghost, and ghost in pieces of 2;
    with noise draws each example's K-draw mean gradient is what is clipped in every engine."""
    reference, record = _arm_gradient(arm_name, "vmap", 0, **overrides)
    for clipping, physical in (("ghost", 0), ("ghost", 2), ("vmap", 3)):
        grads, other = _arm_gradient(arm_name, clipping, physical, **overrides)
        assert (other.num_nonnegative, other.explicit_multiplier) == (record.num_nonnegative,
                                                                      record.explicit_multiplier)
        for k, v in reference.items():
            assert torch.allclose(grads[k], v, rtol=1e-4, atol=1e-5), (clipping, physical, k)


def test_train_cli_flags_reach_the_plan_and_the_private_record(classifier_dir, tmp_path, capsys):
    import json

    from training.release import load_private_record
    from transdenoiser.cli import build_parser

    out = tmp_path / "run"
    args = build_parser().parse_args([
        "train", "--arm", "sepdp", "--denoiser", "tiny", "--denoiser-width", "2", "--epochs", "1",
        "--batch-size", "16", "--train-examples", "64", "--eval-examples", "20", "--delta", "1e-3",
        "--clipping", "ghost", "--grad-chunk-size", "3", "--physical-batch-size", "5", "--classifier",
        str(classifier_dir), "--out", str(out), "--json", "--device", "cpu"])
    assert args.handler(args) == 0
    assert "clipping: ghost, pieces of 5" in capsys.readouterr().err
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["config"]["clipping"] == "ghost" and meta["config"]["physical_batch_size"] == 5
    execution = load_private_record(out)["execution"]
    assert (execution["clipping"], execution["grad_chunk_size"], execution["physical_batch_size"]) == ("ghost", 3, 5)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--grad-chunk-size", "-3"])


@pytest.mark.parametrize("arm", ["securesgd-sct", "securesgd-denoiser"])
def test_baseline_dpsgd_step_clips_alike_with_ghost_and_vmap(arm):
    """SecureSGD's DP-SGD step (a model taking an image and its layer noise; cnn28's ReLUs are in place) gives
    the same clipped sum and norms with ghost clipping as with vmap per-example gradients."""
    from training.baselines.common import DPSGDStep, example_loss_of
    from training.baselines.securesgd import _task_loss, _task_row_loss, build_noise_layer_model

    torch.manual_seed(0)
    model, _, _ = build_noise_layer_model(arm, (1, 28, 28), 10, [0.5], [0.25], [4, 8], "relu")
    model.eval()  # as train_securesgd: no dropout
    kind = model.kind
    generator = torch.Generator().manual_seed(1)
    x = torch.rand((5, 1, 28, 28), generator=generator)
    with torch.no_grad():
        hidden = model.hidden(x)
    noise = 0.1 * torch.randn(hidden.shape, generator=generator)
    target = torch.randint(0, 10, (5,), generator=generator) if kind == "classifier" else x
    results = {}
    for engine in ("vmap", "ghost"):
        step = DPSGDStep(model, example_loss_of(model, _task_loss(kind)), 0.01, 1.0, 5.0, row_loss=_task_row_loss(kind))
        step.engine = engine
        if engine == "ghost":
            step._ghost = GhostClipping(model, _task_row_loss(kind))
        results[engine] = step.clipped_sum((x, noise, target))
    (vmap_sum, vmap_norms, vmap_losses), (ghost_sum, ghost_norms, ghost_losses) = results["vmap"], results["ghost"]
    assert torch.allclose(ghost_norms, vmap_norms, rtol=1e-4) and (vmap_norms > 0.01).all()
    assert torch.allclose(ghost_losses, vmap_losses, rtol=1e-5)
    for k, v in vmap_sum.items():
        assert torch.allclose(ghost_sum[k], v, rtol=1e-4, atol=1e-6), k
    auto = DPSGDStep(model, example_loss_of(model, _task_loss(kind)), 0.01, 1.0, 5.0, row_loss=_task_row_loss(kind))
    auto.clipped_sum((x, noise, target))
    assert auto.engine in ("ghost", "vmap")


def test_ghost_norms_and_weighted_sums_are_formed_without_tf32_and_the_settings_come_back():
    """A layer's ghost norm and its weighted sum come from different kernels; on CUDA both run in float32 (cuDNN's
    and cuBLAS's TF32 switched off inside), so clipping holds to float32 rounding; the user's settings return."""
    from training.privacy.ghost_clipping import _float32_products

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, True
        with _float32_products(cuda=True):
            assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (False, False)
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)
        with _float32_products(cuda=False):  # CPU: nothing to switch
            assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


class TiedLayers(nn.Module):
    """Two Linear layers sharing one weight (tied weights): each layer's hooks see only its own use."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)
        self.second.weight = self.first.weight

    def forward(self, x):
        return self.second(torch.tanh(self.first(x)))


class WeightReadOutside(nn.Module):
    """A layer's weight also read by a functional call in the parent's forward, outside the layer."""

    def __init__(self):
        super().__init__()
        self.layer, self.out = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = torch.tanh(self.layer(x))
        return self.out(h) + torch.nn.functional.linear(h, self.layer.weight)


@pytest.mark.parametrize("model_class", [TiedLayers, WeightReadOutside])
def test_a_parameter_shared_or_used_outside_its_module_takes_the_per_example_path(model_class):
    """Ghost clipping sees a parameter through the hooks of the module owning it: tied weights or a use outside
    that module would give silently wrong norms and clipped sums. Either is detected (tied weights at set-up, the
    outside use in the first forward pass) and the engine takes the per-example vmap path, which equals the
    per-example autograd loop; the plan says why."""
    torch.manual_seed(0)
    model = model_class()
    z, x = data(model, (4,), 6, 1, seed=2)
    clip = float(reference(model, z, x, 1)[0].median())
    norms, expected = reference(model, z, x, 1, clip=clip)
    assert (norms > clip).any() and (norms < clip).any()  # some examples clipped, some not
    with pytest.raises(GhostUnsupported, match="shared by several modules|used outside the module"):
        GhostClipping(model)(z, x)
    plan = ExecutionPlan("ghost", 0, 0)
    engine = ClippedGradients(model, clip, plan)
    clipped = engine(z, x)
    assert plan.clipping == "vmap" and "ghost clipping cannot follow this model" in "; ".join(plan.reasons)
    torch.testing.assert_close(clipped.factors, (clip / norms).clamp(max=1.0), rtol=1e-5, atol=1e-7)
    for k, v in clipped.whole().items():
        torch.testing.assert_close(v, expected[k], rtol=1e-5, atol=1e-6)
    timings = measure_engines(model, (4,), 6, torch.device("cpu"),
                              {"ghost": ExecutionPlan("ghost", 0, 0), "vmap": ExecutionPlan("vmap", 0, 0)}, repeats=1)
    assert set(timings) == {"vmap"}  # auto never times (or picks) ghost clipping for such a model


def test_reading_a_weight_outside_its_layer_without_a_gradient_keeps_ghost_clipping():
    """Only uses that take part in autograd count: reading a weight's shape, or using it under no_grad, does not
    send the model to the slower path."""

    class Reads(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 4)

        def forward(self, x):
            with torch.no_grad():
                scale = self.layer.weight.abs().max()
            return self.layer(x) * (self.layer.weight.shape[0] / 4) + 0 * scale

    torch.manual_seed(0)
    model = Reads()
    z, x = data(model, (4,), 5, 1, seed=3)
    norms, expected = reference(model, z, x, 1, clip=0.5)
    plan = ExecutionPlan("ghost", 0, 0)
    clipped = ClippedGradients(model, 0.5, plan)(z, x)
    assert plan.clipping == "ghost"
    for k, v in clipped.whole().items():
        torch.testing.assert_close(v, expected[k], rtol=1e-5, atol=1e-6)
