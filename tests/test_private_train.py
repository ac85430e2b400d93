"""Private training: the three arms, DP mechanics, resume, reports, bad input, the CLI."""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
import torch

from training.arms import ARM_CLASSES, SepDPArm, TransDenoiserArm, line16_sigma_bar
from training.checkpoint import load_checkpoint, read_metadata
from training.models import build_model
from training.privacy.dp import (
    GaussianNoise,
    PerExampleClipper,
    PerExampleGradients,
    PoissonSampler,
    device_generator,
    per_example_norms,
    standard_normal,
)
from training.private_train import plan, train_denoiser
from training.release import load_private_record
from training.train_config import TrainConfig
from transdenoiser.errors import UserError

FAST = dict(denoiser="tiny", denoiser_kwargs={"width": 2}, activation="silu", epochs=1, batch_size=16,
            train_examples=64, eval_examples=50, max_smin_dim=10, learning_rate=0.05, optimizer="sgd",
            momentum=0.9, delta=1e-3)


@pytest.fixture(scope="module")
def clf(classifier_dir):
    return load_checkpoint(classifier_dir, kind="classifier")


def cfg(**overrides) -> TrainConfig:
    return TrainConfig(**{**FAST, **overrides})


# ------------------------------------------------------------------------------------------------ mechanics

def test_per_example_gradients_match_autograd():
    torch.manual_seed(0)
    model = build_model("tiny", width=2)
    x = torch.rand(3, 1, 8, 8)
    z = x + 0.25 * torch.randn_like(x)
    grads, losses = PerExampleGradients(model)(z, x)
    for i in range(3):
        model.zero_grad()
        loss = (model(z[i:i + 1]) - x[i:i + 1]).pow(2).sum()
        loss.backward()
        assert math.isclose(float(losses[i]), loss.item(), rel_tol=1e-5)
        for name, p in model.named_parameters():
            assert torch.allclose(grads[name][i], p.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk_size", [2, 3, 7])
def test_chunked_per_example_gradients_equal_one_vmap(chunk_size):
    """Near-equal chunks (7 examples in chunks of at most 2 or 3) give the whole batch's gradients, in order."""
    torch.manual_seed(0)
    model = build_model("tiny", width=2)
    x = torch.rand(7, 1, 8, 8)
    z = x + 0.25 * torch.randn_like(x)
    whole, whole_losses = PerExampleGradients(model)(z, x)
    chunked, chunked_losses = PerExampleGradients(model, chunk_size=chunk_size)(z, x)
    assert torch.allclose(chunked_losses, whole_losses, rtol=1e-6)
    for name, g in whole.items():
        assert chunked[name].shape == g.shape
        assert torch.allclose(chunked[name], g, atol=1e-6, rtol=1e-5)


def test_clipping_bounds_per_example_norms():
    torch.manual_seed(0)
    grads = {"a": torch.randn(50, 7) * 10, "b": torch.randn(50, 3, 2) * 0.01}
    clipper = PerExampleClipper(clip_norm=0.5)
    factors = clipper.factors(per_example_norms(grads))
    clipped = {k: v * factors.view(-1, *[1] * (v.dim() - 1)) for k, v in grads.items()}
    norms = per_example_norms(clipped)
    assert float(norms.max()) <= 0.5 * (1 + 1e-6)
    small = per_example_norms(grads) <= 0.5
    assert torch.all(factors[small] == 1)  # short gradients untouched
    summed = clipper.weighted_sum(grads, factors)
    assert torch.allclose(summed["a"], clipped["a"].sum(0))


def test_noise_std_matches_multiplier_times_clip_norm():
    noise = GaussianNoise(clip_norm=0.7)
    out = noise.add({"w": torch.zeros(400_000)}, 1.5, torch.Generator().manual_seed(0))["w"]
    assert abs(float(out.std()) / (1.5 * 0.7) - 1) < 0.01
    assert abs(float(out.mean())) < 0.01
    assert torch.equal(noise.add({"w": torch.ones(3)}, 0.0, torch.Generator())["w"], torch.ones(3))


def test_noise_on_cpu_is_drawn_from_the_run_generator_itself():
    """On CPU every draw comes straight from the run's CPU generator, bit for bit as torch.randn draws it."""
    assert device_generator(torch.Generator().manual_seed(0), "cpu") is None
    ours, plain = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(standard_normal((3, 4), ours, torch.device("cpu")), torch.randn((3, 4), generator=plain))
    tensors = {"w": torch.zeros(2, 3), "b": torch.zeros(5)}
    noisy = GaussianNoise(clip_norm=0.5).add(tensors, 2.0, ours)
    assert torch.equal(noisy["w"], torch.randn((2, 3), generator=plain))
    assert torch.equal(noisy["b"], torch.randn(5, generator=plain))
    assert torch.equal(ours.get_state(), plain.get_state())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check runs it)")
def test_cuda_noise_is_seeded_by_the_run_generator_one_number_per_draw():
    """On CUDA the noise is drawn on the device by a generator the CPU generator seeds: the same CPU state gives the
    same noise, and the CPU generator moves by exactly one number per draw (so a resumed run repeats bit for bit)."""
    first, second = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    a = standard_normal((1000, 3), first, torch.device("cuda"))
    b = standard_normal((1000, 3), second, torch.device("cuda"))
    assert a.device.type == "cuda" and torch.equal(a, b)
    reference = torch.Generator().manual_seed(9)
    torch.randint(0, 2 ** 63 - 1, (), generator=reference)
    assert torch.equal(first.get_state(), reference.get_state())
    noise = GaussianNoise(clip_norm=1.0).add({"w": torch.zeros(200_000, device="cuda")}, 1.0, first)["w"]
    assert noise.device.type == "cuda" and abs(float(noise.std()) - 1) < 0.01
    assert not torch.equal(standard_normal((1000, 3), first, torch.device("cuda")), a)  # the next draw is fresh


def test_poisson_sampler_rate_and_empty_batches():
    sampler = PoissonSampler(1000, 0.05)
    gen = torch.Generator().manual_seed(0)
    sizes = [len(sampler.sample(gen)) for _ in range(200)]
    assert abs(np.mean(sizes) - 50) < 3
    tiny = PoissonSampler(3, 0.01)
    assert any(len(tiny.sample(gen)) == 0 for _ in range(50))


@pytest.mark.parametrize("arm_class", [SepDPArm, TransDenoiserArm])
def test_empty_poisson_batch_still_noised_and_counted(arm_class):
    torch.manual_seed(0)
    model = build_model("tiny", width=2)
    arm = arm_class(model, cfg(arm=arm_class.name, clip_norm=2.0), xi_up=1.5, expected_batch=4.0, total_steps=10)
    grads, record = arm.gradient(torch.zeros(0, 1, 28, 28), torch.Generator().manual_seed(0))
    flat = torch.cat([g.flatten() for g in grads.values()])
    assert record.batch_size == 0 and record.explicit_multiplier == 1.5
    assert abs(float(flat.std()) * 4.0 / (1.5 * 2.0) - 1) < 0.2  # (0 + N(0, (xi C)^2)) / B


def test_line16():
    assert line16_sigma_bar(0.1, xi_low=0.5, xi_up=2.0) == 2.0
    assert math.isclose(line16_sigma_bar(1.2, 0.5, 2.0), math.sqrt(4 - 1.44))
    assert line16_sigma_bar(2.0, 0.5, 2.0) == 0.0
    assert line16_sigma_bar(3.0, 0.5, 2.0) == 0.0


def rdp_epsilon_by_dp_accounting(q: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """dp-accounting's RDP accountant called directly on `steps` Poisson-subsampled Gaussian steps."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    from training.privacy.accounting import RDP_ORDERS

    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier))
    return RdpAccountant(orders=RDP_ORDERS).compose(dp_accounting.SelfComposedDpEvent(event, steps)).get_epsilon(delta)


def test_target_epsilon_calibrates_xi_up():
    config = cfg(arm="sepdp", target_epsilon=2.0, delta=1e-5, train_examples=0)
    schedule = plan(config, 3000)
    assert schedule["sample_rate"] == 16 / 3000
    eps = rdp_epsilon_by_dp_accounting(schedule["sample_rate"], schedule["xi_up"], schedule["total_steps"], 1e-5)
    assert 1.99 < eps <= 2.0  # calibrated to the target, never above it
    assert rdp_epsilon_by_dp_accounting(schedule["sample_rate"], 0.98 * schedule["xi_up"],
                                        schedule["total_steps"], 1e-5) > 2.0  # and not more noise than needed


# ------------------------------------------------------------------------------------------------ training runs

@pytest.mark.parametrize("arm", ["nodp", "sepdp", "transdenoiser"])
def test_each_arm_trains_and_writes_checkpoint_with_report(arm, mnist10k, clf, tmp_path):
    from certify.pipeline import load_pipeline

    out = tmp_path / arm
    model, meta = train_denoiser(cfg(arm=arm), mnist10k, clf, torch.device("cpu"), checkpoint_dir=out)
    saved = read_metadata(out)
    assert saved["kind"] == "denoiser" and saved["architecture"] == "tiny"
    released_fingerprints = {k: v for k, v in mnist10k.fingerprints().items() if k != "private"}
    assert saved["classifier"]["num_classes"] == 10 and saved["dataset"]["fingerprints"] == released_fingerprints
    assert len(saved["metrics"]) == 1 and {"mse", "psnr", "accuracy_denoised"} <= set(saved["metrics"][0])
    text = (out / "privacy_report.txt").read_text()
    privacy = saved["privacy"]
    assert privacy["steps_done"] == privacy["steps_planned"] == 4  # round(64 / 16) Poisson steps
    if arm == "nodp":
        assert "no privacy claim" in text and privacy["guarantees"] == []
    elif arm == "sepdp":
        (g,) = privacy["guarantees"]
        assert g["data_independent"] is True
        assert g["epsilon"]["rdp"] == pytest.approx(rdp_epsilon_by_dp_accounting(0.25, 2.0, 4, 1e-3), rel=1e-9)
    else:
        mmga, same_as_sepdp = privacy["guarantees"]
        assert mmga["name"] == "mmga" and mmga["data_independent"] is False
        # merge_uncredited_noise (default) and w = 77 > max_smin_dim = 10: every step is the sepdp step
        assert same_as_sepdp["name"] == "sepdp_equivalent" and same_as_sepdp["data_independent"] is True
        assert same_as_sepdp["epsilon"]["rdp"] == pytest.approx(rdp_epsilon_by_dp_accounting(0.25, 2.0, 4, 1e-3),
                                                                rel=1e-9)
        assert "NOT a data-independent guarantee" in text and "the sepdp mechanism exactly" in text
        private = load_private_record(out)["privacy"]
        (explicit,) = [g for g in private["guarantees"] if g["name"] == "explicit_noise_alone"]
        assert explicit["name"] == "explicit_noise_alone" and explicit["data_independent"] is False
        assert "max_smin_dim=10" in private["transdenoiser"]["smin_not_computed"]  # w = 77 > 10: treated as 0
        assert "transdenoiser" not in privacy and "S_min(K_t)" not in text and "empty Poisson" not in text
    pipeline = load_pipeline(saved["classifier"]["path"], out)
    x = mnist10k.test.tensors()[0][:2]
    assert torch.allclose(pipeline.denoiser(x), model(x))


def test_transdenoiser_computes_smin_and_follows_line16(mnist10k, clf, tmp_path):
    config = cfg(arm="transdenoiser", max_smin_dim=4096, train_examples=20, batch_size=5, sigma=0.5,
                 xi_up=2.0, xi_low=0.0, delta=1e-2)  # q = 0.25, 4 steps
    train_denoiser(config, mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "td")
    record = load_private_record(tmp_path / "td")
    td = record["privacy"]["transdenoiser"]
    assert td["smin_methods"].get("eigvalsh", 0) >= 1
    assert td["smin"]["max"] > 0  # silu: S_min > 0
    from training.checkpoint import load_tensors

    name = "training_state.safetensors"
    hist = load_tensors(tmp_path / "td" / "private" / name, record["files"][name])
    m, sb = hist["history.input_multiplier"], hist["history.sigma_bar"]
    ok = ~torch.isnan(sb)
    expected = torch.tensor([line16_sigma_bar(float(a), 0.0, 2.0) for a in m[ok]], dtype=torch.float64)
    assert torch.allclose(sb[ok], expected)


def test_resume_is_bit_identical(mnist10k, clf, tmp_path):
    config = cfg(arm="transdenoiser", epochs=2, optimizer="adam", learning_rate=1e-2, reproducible_noise=True)
    full, full_meta = train_denoiser(config, mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "full")
    train_denoiser(config, mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "part", stop_after_epochs=1)
    assert read_metadata(tmp_path / "part")["privacy"]["complete"] is False
    resumed, meta = train_denoiser(config, mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "part",
                                   resume=True)
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert meta["privacy"] == full_meta["privacy"]  # no step lost or counted twice
    assert meta["steps_done"] == full_meta["steps_done"] == 8
    private, full_private = load_private_record(tmp_path / "part"), load_private_record(tmp_path / "full")
    assert private["privacy"] == full_private["privacy"]  # the private per-step history too


def test_existing_checkpoint_and_changed_config_refused(mnist10k, clf, tmp_path):
    train_denoiser(cfg(arm="sepdp"), mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "run")
    with pytest.raises(UserError, match="already holds a checkpoint"):
        train_denoiser(cfg(arm="sepdp"), mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "run")
    with pytest.raises(UserError, match="xi_up"):
        train_denoiser(cfg(arm="sepdp", xi_up=3.0), mnist10k, clf, torch.device("cpu"),
                       checkpoint_dir=tmp_path / "run", resume=True)


@pytest.mark.parametrize("overrides,message", [
    ({"sigma": 0.0}, "sigma"), ({"clip_norm": -1.0}, "clip norm"), ({"delta": 0.02}, "delta"),
    ({"arm": "transdenoiser", "xi_low": 3.0, "xi_up": 2.0}, "xi_low"), ({"batch_size": 65}, "sample rate"),
    ({"arm": "foo"}, "arm"),
    ({"optimizer": "rmsprop"}, "optimizer"), ({"denoiser_kwargs": {"in_channels": 3}}, "in_channels")])
def test_bad_input_rejected_before_training(overrides, message, mnist10k, clf, tmp_path, monkeypatch):
    for arm_class in ARM_CLASSES.values():
        monkeypatch.setattr(arm_class, "gradient", lambda *a, **k: pytest.fail("trained despite bad input"))
    with pytest.raises(UserError, match=message):
        train_denoiser(cfg(**{"arm": "sepdp", **overrides}), mnist10k, clf, torch.device("cpu"),
                       checkpoint_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_xi_low_binds_only_the_arm_that_uses_it():
    """xi_low is Algorithm 1's line-16 threshold: a high target epsilon (xi_up below the default xi_low 0.5) is
    refused for the transdenoiser arm, with a way out, and planned for sepdp, which never reads xi_low."""
    high = {"target_epsilon": 8.0, "batch_size": 64, "epochs": 5, "delta": 1e-5}
    sepdp = plan(cfg(arm="sepdp", **high), 30_000)
    assert sepdp["xi_up"] < 0.5 == cfg().xi_low
    with pytest.raises(UserError, match="exceeds the calibrated xi_up.*--xi-low"):
        plan(cfg(arm="transdenoiser", **high), 30_000)
    assert plan(cfg(arm="transdenoiser", xi_low=0.25, **high), 30_000)["xi_up"] == pytest.approx(sepdp["xi_up"])
    cfg(arm="sepdp", target_epsilon=None, xi_low=3.0, xi_up=2.0).validate(500)
    with pytest.raises(UserError, match="must not exceed xi_up"):
        cfg(arm="transdenoiser", target_epsilon=None, xi_low=3.0, xi_up=2.0).validate(500)


def test_empty_dataset_and_misfit_classifier_rejected(mnist10k, clf):
    import dataclasses

    from training.datasets import Split

    empty = dataclasses.replace(mnist10k, private=Split(mnist10k.private.images[:0], mnist10k.private.labels[:0]))
    with pytest.raises(UserError, match="empty"):
        train_denoiser(cfg(arm="sepdp", train_examples=0), empty, clf, torch.device("cpu"))
    wrong = dataclasses.replace(mnist10k, classes=tuple("abcde"))
    with pytest.raises(UserError, match="classes"):
        train_denoiser(cfg(arm="sepdp"), wrong, clf, torch.device("cpu"))


# ------------------------------------------------------------------------------------------------ CLI

def _parser():
    from training import train_cli
    from transdenoiser.cli import common_parser

    parser = argparse.ArgumentParser(prog="transdenoiser")
    train_cli.register(parser.add_subparsers(dest="command"), common_parser())
    return parser


def test_cli_help_and_bad_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["train", "--help"])
    assert exc.value.code == 0
    assert "--target-epsilon" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["train", "--out", "x", "--sigma", "-1"])
    assert exc.value.code == 2


def test_cli_config_file_and_flag_override(classifier_dir, tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('arm = "nodp"\ndenoiser = "tiny"\nepochs = 1\nbatch_size = 32\ntrain_examples = 64\n'
                      'eval_examples = 50\n[denoiser_kwargs]\nwidth = 2\n')
    args = _parser().parse_args(["train", "--config", str(config), "--arm", "sepdp", "--delta", "1e-3",
                                 "--classifier", str(classifier_dir), "--out", str(tmp_path / "o"), "--json",
                                 "--device", "cpu"])
    assert args.handler(args) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["config"]["arm"] == "sepdp" and meta["config"]["batch_size"] == 32
    assert meta["privacy"]["guarantees"][0]["name"] == "sepdp"
    bad = tmp_path / "bad.toml"
    bad.write_text("sigmaa = 1\n")
    args = _parser().parse_args(["train", "--config", str(bad), "--classifier", str(classifier_dir),
                                 "--out", str(tmp_path / "b")])
    with pytest.raises(UserError, match="sigmaa"):
        args.handler(args)
