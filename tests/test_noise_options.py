"""Sound ways to spend less noise for the same privacy: merged noise in Algorithm 1's uncredited steps, and
gradients averaged over several input-noise draws (clipped once)."""
from __future__ import annotations

import hashlib
import json
import math
import shutil

import pytest
import torch

from training.arms import SepDPArm, TransDenoiserArm, line16_sigma_bar
from training.models import build_model
from training.privacy.dp import GaussianNoise
from training.privacy.report import REMAINDER_NOT_COMPUTED
from training.train_config import TrainConfig
from transdenoiser.errors import UserError


def _arm(cls, **overrides):
    torch.manual_seed(0)
    config = TrainConfig(**{"denoiser": "tiny", "denoiser_kwargs": {"width": 2}, "activation": "silu",
                            "max_smin_dim": 10, "xi_up": 2.0, "xi_low": 0.5, "clip_norm": 0.5, **overrides})
    model = build_model("tiny", in_channels=1, activation="silu", width=2)
    return cls(model, config, config.xi_up, 16.0, 100), model


class _Spy(GaussianNoise):
    def __init__(self, clip_norm):
        super().__init__(clip_norm)
        self.calls: list[float] = []

    def add(self, tensors, noise_multiplier, generator):
        self.calls.append(noise_multiplier)
        return super().add(tensors, noise_multiplier, generator)


def _batch(mnist10k, n=16):
    return mnist10k.private.tensors()[0][:n]


@pytest.mark.parametrize("merge,expected_calls", [(True, 1), (False, 2)])
def test_uncredited_steps_add_sepdp_noise_once_when_merged(merge, expected_calls, mnist10k):
    # S_min may be computed (max_smin_dim >= w = 77), so the remainders are; here it is 0: no credit
    arm, _ = _arm(TransDenoiserArm, merge_uncredited_noise=merge, sigma=0.5, max_smin_dim=4096)
    arm.noise = _Spy(arm.config.clip_norm)
    x = _batch(mnist10k)
    # a batch holding both groups: half the Taylor remainders non-negative
    split = torch.tensor([1.0, -1.0] * 8, dtype=torch.float64)
    arm.remainders = lambda z, x: (split, torch.zeros_like(split))
    arm.smin = lambda x_nonneg, factors: (0.0, "rank_bound")
    _, record = arm.gradient(x, torch.Generator().manual_seed(1))
    assert record.num_nonnegative == 8 and record.sigma_bar == 2.0
    assert arm.noise.calls == [2.0] * expected_calls
    # never more noise than sepdp when merged; the paper's version adds sqrt(2) xi_up in such a step
    assert record.explicit_multiplier == pytest.approx(2.0 if merge else 2.0 * math.sqrt(2))


@pytest.mark.parametrize("merge", [True, False])
@pytest.mark.parametrize("negatives", [0, 8])
def test_merged_credited_steps_never_add_more_noise_than_sepdp(merge, negatives, mnist10k):
    """A step with input-noise credit (sigma_bar < xi_up, S_min stubbed): merged, a batch with a negative group
    gets xi_up once (Algorithm 1 would add sqrt(sigma_bar^2 + xi_up^2) > xi_up) and an all-credited batch keeps
    sigma_bar; the paper's version noises each group."""
    arm, _ = _arm(TransDenoiserArm, merge_uncredited_noise=merge, sigma=0.5, max_smin_dim=4096)
    arm.noise = _Spy(arm.config.clip_norm)
    x = _batch(mnist10k)
    split = torch.tensor([1.0] * (16 - negatives) + [-1.0] * negatives, dtype=torch.float64)
    arm.remainders = lambda z, x: (split, torch.zeros_like(split))
    arm.smin = lambda x_nonneg, factors: (1e-2, "stub")
    _, record = arm.gradient(x, torch.Generator().manual_seed(1))
    xi_up = arm.xi_up
    credited = line16_sigma_bar(arm.config.sigma * math.sqrt(arm.total_steps * 1e-2) / arm.config.clip_norm,
                                arm.config.xi_low, xi_up)
    assert record.sigma_bar == pytest.approx(credited) and 0 < credited < xi_up  # the step is credited
    if merge and negatives:
        assert arm.noise.calls == [xi_up] and record.explicit_multiplier == xi_up
    elif negatives:
        assert arm.noise.calls == [credited, xi_up]
        assert record.explicit_multiplier == pytest.approx(math.hypot(credited, xi_up))
        assert record.explicit_multiplier > xi_up
    else:
        assert arm.noise.calls == [credited] and record.explicit_multiplier == pytest.approx(credited)
    if merge:
        assert record.explicit_multiplier <= xi_up


@pytest.mark.parametrize("clipping", ["ghost", "vmap"])
def test_merged_uncredited_step_equals_the_sepdp_step(clipping, mnist10k):
    """Same model, batch and generator state, no step creditable (merged, w = 77 > max_smin_dim = 10): the
    transdenoiser update is sepdp's bit for bit, line 8's remainder is never computed, and the record says so."""
    td, _ = _arm(TransDenoiserArm, merge_uncredited_noise=True, clipping=clipping)
    sep, _ = _arm(SepDPArm, clipping=clipping)
    assert td.credit_possible is False

    def never(*args):
        raise AssertionError("line 8's remainder computed although no step can be credited")

    td.remainders = td.smin = never
    x = _batch(mnist10k)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, record = td.gradient(x, g1)
    b, sep_record = sep.gradient(x, g2)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert torch.equal(g1.get_state(), g2.get_state())  # the same noise drawn, and no more
    assert record.num_nonnegative == REMAINDER_NOT_COMPUTED and record.smin_method == "too_large"
    assert record.explicit_multiplier == sep_record.explicit_multiplier == td.xi_up
    assert record.mean_loss == sep_record.mean_loss


def test_merged_arm_computes_the_remainders_when_credit_is_possible(mnist10k):
    """Merged but S_min computable (w = 77 <= max_smin_dim): the remainders are computed, the record counts
    the non-negative examples."""
    td, _ = _arm(TransDenoiserArm, merge_uncredited_noise=True, max_smin_dim=4096, sigma=0.5, clipping="vmap")
    assert td.credit_possible is True
    calls = []
    remainders = td.remainders
    td.remainders = lambda z, x: calls.append(len(z)) or remainders(z, x)
    _, record = td.gradient(_batch(mnist10k), torch.Generator().manual_seed(3))
    assert calls == [16] and 0 <= record.num_nonnegative <= 16


def test_noise_draws_average_then_clip_to_c(mnist10k):
    """Each example's gradient is the mean of its K per-draw gradients (checked with plain autograd on the
    same noise), and the averaged gradient is what is clipped: every clipped norm is <= C."""
    draws = 4
    arm, model = _arm(SepDPArm, noise_draws=draws, arm="sepdp", sigma=0.5)
    x = _batch(mnist10k, 3)
    generator = torch.Generator().manual_seed(5)
    state = generator.get_state()
    z, grads, losses, factors = arm.clipped(x, generator)
    assert z.shape[0] == 3 * draws
    params = [p for p in model.parameters() if p.requires_grad]
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    generator.set_state(state)
    noise = torch.randn((3 * draws, *x.shape[1:]), generator=generator)
    for i in range(3):
        per_draw = []
        for k in range(draws):
            zk = x[i:i + 1] + arm.config.sigma * noise[i * draws + k:i * draws + k + 1]
            loss = (model(zk) - x[i:i + 1]).pow(2).sum()
            per_draw.append(torch.autograd.grad(loss, params))
        for j, name in enumerate(names):
            mean = torch.stack([g[j] for g in per_draw]).mean(0)
            assert torch.allclose(grads[name][i], mean, atol=1e-5, rtol=1e-4), name
    clipped_norms = factors * torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
    assert bool((clipped_norms <= arm.config.clip_norm * (1 + 1e-5)).all())
    assert bool((factors < 1).any())  # C = 0.5 binds for some example: the check has teeth


def test_noise_draws_only_for_sepdp():
    with pytest.raises(UserError, match="sepdp arm only"):
        TrainConfig(arm="transdenoiser", noise_draws=2).validate(100)
    with pytest.raises(UserError, match="noise_draws"):
        TrainConfig(arm="sepdp", noise_draws=0).validate(100)


def test_paper_configs_keep_algorithm_1_as_written():
    from training.train_config import load_config_file

    for name in ("mnist_sigma025", "mnist_sigma010"):
        assert load_config_file(f"configs/{name}.toml").merge_uncredited_noise is False
    assert load_config_file("configs/tour_sigma025.toml").merge_uncredited_noise is True



# ------------------------------------------------------------------------------------------------ public initialisation

def test_public_initialisation_is_recorded_and_private_sources_refused(mnist10k, classifier_dir, tmp_path):
    from training.checkpoint import load_checkpoint, read_metadata
    from training.private_train import initialise_from_public, train_denoiser

    clf = load_checkpoint(classifier_dir, kind="classifier")
    fast = dict(denoiser="tiny", denoiser_kwargs={"width": 2}, activation="silu", epochs=1, batch_size=16,
                train_examples=64, eval_examples=20, max_smin_dim=10, delta=1e-3)
    public = tmp_path / "public"
    train_denoiser(TrainConfig(arm="nodp", train_on="public", **fast), mnist10k, clf, torch.device("cpu"),
                   checkpoint_dir=public)
    assert read_metadata(public)["dataset"]["trained_on"] == "public"
    config = TrainConfig(arm="sepdp", init_from=str(public), **fast)
    model = build_model("tiny", in_channels=1, activation="silu", width=2)
    initialise_from_public(model, config, mnist10k)
    source = load_checkpoint(public, kind="denoiser").model.state_dict()
    assert all(torch.equal(model.state_dict()[k], source[k]) for k in source)
    train_denoiser(config, mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "private")
    report = read_metadata(tmp_path / "private")["privacy"]
    assert report["initialisation"]["kind"] == "public" and report["initialisation"]["checkpoint"] == str(public)
    assert "initialisation: public" in (tmp_path / "private" / "privacy_report.txt").read_text()
    assert report["initialisation"]["weights_sha256"] == hashlib.sha256(
        (public / "weights.safetensors").read_bytes()).hexdigest()
    # a public checkpoint of another split (another fingerprint) is refused too
    other = tmp_path / "other_split"
    shutil.copytree(public, other)
    meta = json.loads((other / "metadata.json").read_text())
    meta["dataset"]["fingerprints"]["public"] = "0" * 64
    (other / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="not on this run's"):
        initialise_from_public(model, TrainConfig(arm="sepdp", init_from=str(other), **fast), mnist10k)
    with pytest.raises(UserError, match="only a denoiser trained on the public split"):
        initialise_from_public(model, TrainConfig(arm="sepdp", init_from=str(tmp_path / "private"), **fast),
                               mnist10k)
    with pytest.raises(UserError, match="use arm nodp"):
        TrainConfig(arm="sepdp", train_on="public").validate(100)
