"""Privacy promises of training, end to end, each against an independent computation:

- the noise each DP arm adds on NON-empty batches, backed out of the gradient it returns (the clipped sum is
  recomputed with a plain autograd loop), has std multiplier x C on the sum, and that multiplier is the one the
  step record (what the accountant sees) holds: sepdp, and Algorithm 1's line 17, line 22 and both together;
- Poisson sampling: batch sizes Binomial(N, q) in mean and variance, inclusion independent across steps, and
  the rate of the sampler a training run builds equal to the q its report gives the accountant;
- every epsilon a run reports equals dp-accounting called directly with the run's q, multipliers and the steps
  actually taken, after a resume too;
- S_min of a singular K is 0 (never a rounded-up positive value); checkpoint files are checked against their hash.
"""
from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from training import private_train
from training.arms import SepDPArm, TransDenoiserArm
from training.models import build_model
from training.privacy.accounting import RDP_ORDERS
from training.privacy.dp import PoissonSampler
from training.privacy.report import REMAINDER_NOT_COMPUTED
from training.privacy.smin import smallest_eigenvalue_lower_bound
from training.private_train import train_denoiser
from training.train_config import TrainConfig
from transdenoiser.errors import UserError

IMAGE = (1, 8, 8)
FAST = dict(denoiser="tiny", denoiser_kwargs={"width": 2}, activation="silu", epochs=1, batch_size=16,
            train_examples=64, eval_examples=20, max_smin_dim=10, learning_rate=0.05, optimizer="sgd",
            momentum=0.9, delta=1e-3, reproducible_noise=True)


def config(**overrides) -> TrainConfig:
    return TrainConfig(**{**FAST, **overrides})


# ------------------------------------------------------------------------------------------------ noise


def clipped_sum_by_autograd(model: torch.nn.Module, z: torch.Tensor, x: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """sum_i min(1, C / ||g_i||) g_i, one example at a time with torch.autograd (flattened, float64)."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    for i in range(len(x)):
        loss = (model(z[i:i + 1]) - x[i:i + 1]).pow(2).sum()
        g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, params)]).double()
        factor = min(1.0, clip_norm / float(g.norm()))
        assert factor < 1.0, "the test needs clipping to be active"
        total += factor * g
    return total


def backed_out_noise(arm, x: torch.Tensor, seed: int):
    """(noise actually added to the clipped sum, the step record): the arm's gradient times B minus the sum."""
    seen = {}
    noisy = arm.noisy

    def spy(batch, generator):
        seen["z"] = noisy(batch, generator)
        return seen["z"]

    arm.noisy = spy
    grads, record = arm.gradient(x, torch.Generator().manual_seed(seed))
    names = [k for k, p in arm.model.named_parameters() if p.requires_grad]
    released = torch.cat([grads[k].reshape(-1) for k in names]).double() * arm.expected_batch
    return released - clipped_sum_by_autograd(arm.model, seen["z"], x, arm.config.clip_norm), record


def make_arm(arm_class, width=8, **overrides):
    torch.manual_seed(0)
    model = build_model("tiny", width=width, activation="silu")
    # C = 0.05 lies below every per-example gradient norm here: clipping is active, so a skipped clip shows
    cfg = config(**{"arm": arm_class.name, "clip_norm": 0.05, "sigma": 0.25, "xi_up": 2.0, "xi_low": 0.5,
                    **overrides})
    return arm_class(model, cfg, xi_up=2.0, expected_batch=4.0, total_steps=100)


def batch(n=6, seed=0):
    return torch.rand((n, *IMAGE), generator=torch.Generator().manual_seed(seed))


def assert_std(noise: torch.Tensor, expected: float, what: str, minimum: int = 2000, tolerance: float = 0.08) -> None:
    """Sample std within ``tolerance`` (8%) of ``expected``: over thousands of coordinates the estimate's own error
    is ~1-2%, so a noise off by a factor 2, or by sqrt(2), fails by many standard errors."""
    assert noise.numel() >= minimum, noise.numel()
    ratio = float(noise.std()) / expected
    assert abs(ratio - 1) < tolerance, f"{what}: noise std {float(noise.std()):.4g}, expected {expected:.4g}"
    assert abs(float(noise.mean())) < 0.1 * expected, what


def test_sepdp_noise_on_nonempty_batches_is_xi_up_times_c():
    arm = make_arm(SepDPArm)
    pieces = []
    for seed in range(4):
        noise, record = backed_out_noise(arm, batch(seed=seed), seed)
        assert record.batch_size == 6 and record.explicit_multiplier == 2.0
        pieces.append(noise)
    assert_std(torch.cat(pieces), record.explicit_multiplier * arm.config.clip_norm, "sepdp")


def route(arm, nonnegative: list[bool]):
    """Force line 8's split: True rows go to lines 12-18 (line 17's noise), False rows to lines 19-23 (line 22)."""
    signs = torch.tensor([1.0 if flag else -1.0 for flag in nonnegative], dtype=torch.float64)
    arm.remainders = lambda z, x: (signs.clone(), torch.zeros_like(signs))


@pytest.mark.parametrize(("split", "groups"), [
    ([False] * 6, "line 22 only"), ([True] * 6, "line 17 only"), ([True, False] * 3, "both groups")])
def test_algorithm1_noise_on_nonempty_batches_matches_the_recorded_multiplier(split, groups):
    """The paper as written (merge_uncredited_noise off): each non-empty group gets its own noise."""
    arm = make_arm(TransDenoiserArm, merge_uncredited_noise=False)  # w = 737 > n v = 384: S_min taken as 0
    route(arm, split)
    pieces = []
    for seed in range(4):
        noise, record = backed_out_noise(arm, batch(seed=seed), seed)
        assert record.batch_size == 6 and record.num_nonnegative == sum(split)
        expected_variance = 0.0
        if any(split):  # S_min = 0: input multiplier 0 < xi_low, line 16 gives sigma_bar = xi_up
            assert record.smin == 0.0 and record.smin_method in ("rank_bound", "too_large")
            assert record.sigma_bar == 2.0
            expected_variance += record.sigma_bar ** 2
        if not all(split):
            expected_variance += 2.0 ** 2  # line 22: xi_up
        assert record.explicit_multiplier == pytest.approx(math.sqrt(expected_variance), rel=1e-12)
        pieces.append(noise / record.explicit_multiplier)
    assert_std(torch.cat(pieces), arm.config.clip_norm, groups)


def test_a_zero_taylor_remainder_counts_as_negative():
    """With z = x exactly (sigma far below a float32 ulp) line 8's remainder is 0: rounding must never move an
    example to the reduced-noise side, so every example gets line 22's full noise."""
    arm = make_arm(TransDenoiserArm, sigma=1e-30, merge_uncredited_noise=False)  # the remainders are computed
    x = 0.1 + 0.9 * batch(n=6, seed=2)  # no zero pixel, so x + 1e-30 * noise == x in float32
    assert torch.equal(arm.noisy(x, torch.Generator().manual_seed(0)), x)
    _, record = arm.gradient(x, torch.Generator().manual_seed(0))
    assert record.num_nonnegative == 0 and record.explicit_multiplier == 2.0


@pytest.mark.parametrize("split", [[False] * 6, [True] * 6, [True, False] * 3])
def test_uncredited_steps_add_xi_up_noise_once_to_the_whole_sum(split):
    """merge_uncredited_noise (the default): no input-noise credit (S_min taken as 0), so one draw of xi_up x C
    on the whole clipped sum, whatever the split: the step is sepdp's. (max_smin_dim >= w, so the split is
    computed; S_min is 0 by the rank bound, w = 737 > n v = 384.)"""
    arm = make_arm(TransDenoiserArm, max_smin_dim=4096)
    assert arm.config.merge_uncredited_noise is True
    route(arm, split)
    pieces = []
    for seed in range(4):
        noise, record = backed_out_noise(arm, batch(seed=seed), seed)
        assert record.batch_size == 6 and record.num_nonnegative == sum(split)
        assert record.explicit_multiplier == 2.0
        pieces.append(noise)
    assert_std(torch.cat(pieces), 2.0 * arm.config.clip_norm, "merged step")


def test_line17_noise_follows_line16_when_smin_is_positive():
    """S_min computed (w = 142 <= 3 * 64): sigma_bar = sqrt(xi_up^2 - m^2) with m = sigma sqrt(T S_min) / C,
    and the noise line 17 adds has std sigma_bar x C."""
    arm = make_arm(TransDenoiserArm, width=3, max_smin_dim=4096)
    route(arm, [True] * 3)
    x = batch(n=3, seed=1)
    _, probe = backed_out_noise(arm, x, 0)
    assert probe.smin_method == "eigvalsh" and probe.smin > 0
    sigma, clip, xi_up = arm.config.sigma, arm.config.clip_norm, 2.0
    arm.total_steps = max(1, round((1.2 * clip / sigma) ** 2 / probe.smin))  # puts m near 1.2 in (xi_low, xi_up)
    pieces = []
    for seed in range(8):
        noise, record = backed_out_noise(arm, x, seed)
        m = sigma * math.sqrt(arm.total_steps * record.smin) / clip
        assert record.input_multiplier == pytest.approx(m, rel=1e-9)
        assert 0.5 <= m < xi_up, m
        assert record.sigma_bar == pytest.approx(math.sqrt(xi_up ** 2 - m ** 2), rel=1e-9)
        assert record.explicit_multiplier == pytest.approx(record.sigma_bar, rel=1e-12)
        pieces.append(noise / record.sigma_bar)
    assert_std(torch.cat(pieces), clip, "line 17 with S_min > 0", minimum=1100, tolerance=0.1)


# ------------------------------------------------------------------------------------------------ sampling

def test_poisson_sampling_joins_with_at_most_the_accounted_rate():
    """The accountant is given q; each example joins with floor(q 2^62) / 2^62: never above q (a higher real rate
    would spend more privacy than reported), within 2^-62 below it. ``torch.rand(n) < q`` in float32 joins with
    ceil(q 2^24) / 2^24, above q for most q (shown here for q = 1e-7: 19% above)."""
    from fractions import Fraction

    rng = np.random.default_rng(0)
    for q in [1e-12, 1e-7, 1 / 3, 0.1, 64 / 2998, 1.0, *rng.uniform(0, 1, 50)]:
        p = PoissonSampler(10, float(q)).inclusion_probability
        assert Fraction(p) <= Fraction(float(q)) and float(q) - p <= 2.0 ** -62
    float32_rate = math.ceil(1e-7 * 2 ** 24) / 2 ** 24
    assert float32_rate > 1.19e-7  # what sampling with torch.rand would have given


def test_poisson_sample_joins_below_the_threshold_and_never_at_it(monkeypatch):
    """``sample()`` itself keeps the promise ``inclusion_probability`` states: an example joins when its uniform
    integer in [0, 2^62) is strictly below floor(q 2^62), so exactly floor(q 2^62) of the 2^62 values join. Here the
    random integers are set by hand around the threshold: the one at the threshold itself stays out (joining there
    too, ``<=``, would join with probability (floor(q 2^62) + 1) / 2^62, above q for a q on the 2^-62 grid), the one
    just below joins; at q = 1 every integer the draw can return joins."""
    resolution = 2 ** PoissonSampler.RESOLUTION_BITS
    drawn = {}

    def draws_of(values):
        def randint(low, high, size, *, generator=None, dtype=None):
            drawn.update(low=low, high=high, size=size, dtype=dtype)
            return torch.tensor(values, dtype=torch.int64)
        return randint

    for q in (0.25, 64 / 2998, 1e-12):
        sampler = PoissonSampler(5, q)
        t = sampler.threshold
        monkeypatch.setattr(torch, "randint", draws_of([t - 1, t, t + 1, 0, resolution - 1]))
        assert sampler.sample(torch.Generator()).tolist() == [0, 3], q
        assert (drawn["low"], drawn["high"], tuple(drawn["size"]), drawn["dtype"]) == (0, resolution, (5,), torch.int64)
    sampler = PoissonSampler(3, 1.0)  # threshold 2^62: above every value randint(0, 2^62) returns
    monkeypatch.setattr(torch, "randint", draws_of([0, resolution // 2, resolution - 1]))
    assert sampler.sample(torch.Generator()).tolist() == [0, 1, 2]


def test_poisson_batches_are_binomial_and_independent_across_steps():
    n, q, steps = 200, 0.1, 2000
    sampler = PoissonSampler(n, q)
    generator = torch.Generator().manual_seed(0)
    masks = np.zeros((steps, n), dtype=bool)
    for t in range(steps):
        index = sampler.sample(generator)
        assert index.dtype == torch.int64 and len(torch.unique(index)) == len(index)
        masks[t, index.numpy()] = True
    sizes = masks.sum(1)
    mean, variance = n * q, n * q * (1 - q)  # Binomial(N, q)
    assert abs(sizes.mean() - mean) < 5 * math.sqrt(variance / steps)
    assert abs(sizes.var(ddof=1) - variance) < 5 * variance * math.sqrt(2 / (steps - 1))
    per_example = masks.sum(0)  # each example joins with probability q
    assert np.abs(per_example - steps * q).max() < 5 * math.sqrt(steps * q * (1 - q))
    overlap = (masks[1:] & masks[:-1]).sum(1)  # independent steps: |B_t & B_t+1| ~ Binomial(N, q^2)
    assert abs(overlap.mean() - n * q * q) < 5 * math.sqrt(n * q * q / (steps - 1))
    # an example's inclusion now says nothing about its next one
    rows = masks[:-1].reshape(-1).astype(float), masks[1:].reshape(-1).astype(float)
    assert abs(np.corrcoef(*rows)[0, 1]) < 5 / math.sqrt(rows[0].size)


@pytest.fixture(scope="module")
def small_classifier(tmp_path_factory):
    """An untrained cnn28 saved as a classifier checkpoint: training's privacy does not depend on its accuracy."""
    from training.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = build_model("cnn28")
    meta = {"kind": "classifier", "architecture": "cnn28", "arch_kwargs": {}, "input_shape": [1, 28, 28],
            "num_classes": 10}
    return load_checkpoint(save_checkpoint(tmp_path_factory.mktemp("clf") / "classifier", model, meta),
                           kind="classifier")


class Spy:
    """Records the samplers a run builds, the batches they draw, and every step record the arms return."""

    def __init__(self, monkeypatch):
        self.samplers, self.batches, self.records = [], [], []
        spy = self

        class RecordingSampler(PoissonSampler):
            def __init__(self, num_examples, sample_rate):
                super().__init__(num_examples, sample_rate)
                spy.samplers.append(self)

            def sample(self, generator):
                index = super().sample(generator)
                spy.batches.append(len(index))
                return index

        monkeypatch.setattr(private_train, "PoissonSampler", RecordingSampler)
        for arm_class in (SepDPArm, TransDenoiserArm):
            original = arm_class.gradient

            def gradient(self, x, generator, _original=original):
                grads, record = _original(self, x, generator)
                spy.records.append(dataclasses.replace(record))
                return grads, record

            monkeypatch.setattr(arm_class, "gradient", gradient)


def direct_rdp_epsilon(q: float, multipliers: list[float], delta: float) -> float:
    """dp-accounting's RDP accountant, one Poisson-subsampled Gaussian event per step actually taken."""
    accountant = RdpAccountant(orders=RDP_ORDERS)
    for multiplier in multipliers:
        accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(multiplier)))
    return accountant.get_epsilon(delta)


def guarantee(report: dict, name: str) -> dict:
    (found,) = [g for g in report["guarantees"] if g["name"] == name]
    return found


def test_sampler_rate_is_the_q_the_accountant_is_given_also_after_resume(mnist10k, small_classifier, monkeypatch,
                                                                          tmp_path):
    spy = Spy(monkeypatch)
    cfg = config(arm="sepdp", epochs=2, xi_up=4.0)  # much noise: a small privacy-loss support, quick accounting
    out = tmp_path / "run"
    train_denoiser(cfg, mnist10k, small_classifier, torch.device("cpu"), checkpoint_dir=out, stop_after_epochs=1)
    _, meta = train_denoiser(cfg, mnist10k, small_classifier, torch.device("cpu"), checkpoint_dir=out, resume=True)
    report = meta["privacy"]
    q, n = report["sample_rate"], report["num_examples"]
    assert q == cfg.batch_size / cfg.train_examples and n == cfg.train_examples
    assert len(spy.samplers) == 2  # one per leg
    assert all((sampler.sample_rate, sampler.num_examples) == (q, n) for sampler in spy.samplers)
    steps = len(spy.batches)
    assert steps == len(spy.records) == report["steps_done"] == 8  # both legs, no step lost or repeated
    assert [r.batch_size for r in spy.records] == spy.batches
    assert abs(np.mean(spy.batches) - q * n) < 5 * math.sqrt(n * q * (1 - q) / steps)
    eps = guarantee(report, "sepdp")["epsilon"]["rdp"]
    assert eps == pytest.approx(direct_rdp_epsilon(q, [cfg.xi_up] * steps, cfg.delta), rel=1e-9)


# ------------------------------------------------------------------------------------------------ reports

def test_transdenoiser_reports_equal_dp_accounting_after_resume(mnist10k, small_classifier, monkeypatch, tmp_path):
    from training.release import load_private_record

    spy = Spy(monkeypatch)
    cfg = config(arm="transdenoiser", epochs=2, xi_up=4.0)
    out = tmp_path / "run"
    train_denoiser(cfg, mnist10k, small_classifier, torch.device("cpu"), checkpoint_dir=out, stop_after_epochs=1)
    first_leg = len(spy.records)
    _, meta = train_denoiser(cfg, mnist10k, small_classifier, torch.device("cpu"), checkpoint_dir=out, resume=True)
    steps = len(spy.records)
    assert first_leg == 4 and steps == 8  # both legs, no step lost or repeated
    q = cfg.batch_size / cfg.train_examples
    released = meta["privacy"]
    assert released["steps_done"] == steps and released["sample_rate"] == q
    full = load_private_record(out)["privacy"]
    assert full["steps_done"] == steps
    every_step_xi_up = direct_rdp_epsilon(q, [cfg.xi_up] * steps, cfg.delta)
    # MMGA's figure and (S_min never computed, uncredited steps merged) the sepdp-equivalent one: xi_up every step
    for report in (released, full):
        for name in ("mmga", "sepdp_equivalent"):
            assert guarantee(report, name)["epsilon"]["rdp"] == pytest.approx(every_step_xi_up, rel=1e-9), name
    # explicit noise alone: every step's recorded multiplier, composed step by step
    explicit = [r.explicit_multiplier for r in spy.records]
    assert all(m in (cfg.xi_up, pytest.approx(math.sqrt(2) * cfg.xi_up)) for m in explicit)
    direct = direct_rdp_epsilon(q, explicit, cfg.delta)
    reported = guarantee(full, "explicit_noise_alone")["epsilon"]["rdp"]
    assert direct * (1 - 1e-9) <= reported <= direct * 1.02  # grouping may only round multipliers down
    seen = sum(r.batch_size for r in spy.records)
    assert full["transdenoiser"]["examples_seen"] == seen
    # merged noise and w = 77 > max_smin_dim = 10: no step can be credited, so line 8's remainder is never
    # computed, and the report says so instead of a share
    assert all(r.num_nonnegative == REMAINDER_NOT_COMPUTED for r in spy.records if r.batch_size)
    assert full["transdenoiser"]["nonnegative_share"] is None and full["transdenoiser"]["examples_split"] == 0
    assert f"not computed in {sum(1 for r in spy.records if r.batch_size)} steps ({seen} examples)" in \
        full["transdenoiser"]["remainder_not_computed"]


# ------------------------------------------------------------------------------------------------ S_min, integrity

def test_smin_of_a_singular_matrix_is_zero():
    """K = A A^T with A of shape 30 x 29 is singular: S_min = 0, although eigvalsh of the rounded K returns a
    tiny positive smallest eigenvalue for most such draws (a bound without the rounding term would be > 0)."""
    rng = np.random.default_rng(1)
    positive_raw = 0
    for _ in range(20):
        a = rng.standard_normal((30, 29))
        value, raw, bound = smallest_eigenvalue_lower_bound(torch.from_numpy(a @ a.T), inner_dim=29)
        assert value == 0.0, (value, raw, bound)
        positive_raw += raw > 0
    assert positive_raw >= 1  # the case the rounding bound exists for did occur
    # and on a well-conditioned K the bound sits just below the true smallest eigenvalue
    q, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    k = (q * np.linspace(1.0, 3.0, 12)) @ q.T
    value, _, _ = smallest_eigenvalue_lower_bound(torch.from_numpy((k + k.T) / 2), inner_dim=12)
    assert 1.0 - 1e-9 < value < 1.0


def test_checkpoint_files_are_checked_against_their_hash(tmp_path):
    from training.checkpoint import load_checkpoint, save_checkpoint

    model = build_model("tiny", width=2)
    directory = save_checkpoint(tmp_path / "ckpt", model, {"kind": "denoiser", "architecture": "tiny",
                                                           "arch_kwargs": {"width": 2}})
    assert load_checkpoint(directory).metadata["kind"] == "denoiser"
    weights = directory / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(UserError, match="SHA-256"):
        load_checkpoint(directory)
