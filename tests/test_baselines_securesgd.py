"""SecureSGD baselines (training/baselines): clipping, noise, privacy report, the paper's certificate, the CLI.

Every check compares against an independent computation: a plain autograd loop, dp-accounting called directly,
statsmodels' Clopper-Pearson interval, the exact Gaussian mechanism delta, dense matrices, closed forms."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from training.baselines import common, securesgd
from training.baselines.securesgd import SecureSGDConfig
from training.baselines.securesgd_certify import phan_certificate
from training.baselines.securesgd_mechanisms import (
    NoiseLayerModel,
    build_noise_layer_model,
    egm_noise_multiplier,
    hgm_attack_size,
    hgm_noise_std,
)


def _model(arm: str) -> NoiseLayerModel:
    torch.manual_seed(0)
    model, _, _ = build_noise_layer_model(arm, (1, 28, 28), 10, [0.13], [0.3], [8, 16], "relu")
    return model.eval()


def _loop_clipped_sum(model, loss, tensors, clip):
    """Per-example gradients by one autograd call per example, clipped to ``clip``, summed."""
    params = [p for p in model.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in params]
    norms = []
    for example in zip(*tensors, strict=True):
        *inputs, target = example
        out = model(*(t.unsqueeze(0) for t in inputs))
        grads = torch.autograd.grad(loss(out, target.unsqueeze(0)), params)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        norms.append(float(norm))
        factor = min(1.0, clip / float(norm))
        total = [t + factor * g for t, g in zip(total, grads, strict=True)]
    return total, norms


@pytest.mark.parametrize("arm", ["securesgd-prt", "securesgd-sct"])
def test_per_example_gradients_are_clipped_to_c_against_an_autograd_loop(arm):
    model = _model(arm)
    kind = model.kind
    x = torch.rand(6, 1, 28, 28)
    noise = torch.randn(6, *model.hidden_shape((1, 28, 28))) * 0.3
    target = torch.randint(0, 10, (6,)) if kind == "classifier" else x
    loss = securesgd._task_loss(kind)
    clip = 0.05  # small enough that every example is clipped
    step = common.DPSGDStep(model, common.example_loss_of(model, loss), clip, 1.0, 6.0, chunk_size=4)
    summed, norms, _ = step.clipped_sum((x, noise, target))
    expected, loop_norms = _loop_clipped_sum(model, loss, (x, noise, target), clip)
    assert min(loop_norms) > clip  # the test exercises clipping
    np.testing.assert_allclose(norms.numpy(), loop_norms, rtol=1e-4)
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    for name, value in zip(names, expected, strict=True):
        torch.testing.assert_close(summed[name], value, rtol=1e-4, atol=1e-6)
    total_norm = math.sqrt(sum(float(v.pow(2).sum()) for v in summed.values()))
    assert total_norm <= 6 * clip * (1 + 1e-5)  # the sum of 6 clipped gradients


def test_training_noise_matches_the_privacy_report_and_dp_accounting(monkeypatch, mnist10k, tmp_path):
    """Back the gradient noise out of a real run (what GaussianNoise.add returned minus what it was given); its
    std must be the report's noise multiplier times C; the report's epsilon must equal dp-accounting's."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    from training.privacy.accounting import RDP_ORDERS

    backed_out = []
    original = common.GaussianNoise.add

    def recording(self, tensors, noise_multiplier, generator):
        out = original(self, tensors, noise_multiplier, generator)
        backed_out.append(torch.cat([(out[k] - tensors[k]).flatten() for k in tensors]))
        return out

    monkeypatch.setattr(common.GaussianNoise, "add", recording)
    from training.checkpoint import load_checkpoint

    classifier = load_checkpoint(_random_classifier(tmp_path / "clf", mnist10k), kind="classifier")
    config = SecureSGDConfig(arm="securesgd-prt", epochs=1, batch_size=16, train_examples=64, eval_examples=50,
                             target_epsilon=3.0, clip_norm=0.7, redistribution_steps=2, reproducible_noise=True)
    _, meta = securesgd.train_securesgd(config, mnist10k, "cpu", classifier)
    privacy = meta["privacy"]
    steps = privacy["steps_done"]
    assert len(backed_out) == steps == 4
    noise = torch.cat(backed_out)
    expected_std = privacy["xi_up"] * privacy["clip_norm"]
    assert abs(float(noise.std()) / expected_std - 1) < 0.01  # millions of coordinates
    assert abs(float(noise.mean())) < 0.015 * expected_std
    accountant = RdpAccountant(orders=RDP_ORDERS)
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        16 / 64, dp_accounting.GaussianDpEvent(privacy["xi_up"])), steps))
    (guarantee,) = privacy["guarantees"]
    assert guarantee["data_independent"] and guarantee["name"] == "dp_sgd"
    assert guarantee["epsilon"]["rdp"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    assert guarantee["epsilon"]["rdp"] <= 3.0  # calibrated to the target
    layer = privacy["noise_layer"]
    assert "NOT a privacy guarantee" in layer["label"] and layer["robust_delta_exact_gaussian"] <= 1e-5


def test_egm_calibration_is_sound_against_the_exact_gaussian_mechanism():
    """The paper's bound for every epsilon > 0: the exact delta (Balle & Wang) at its std never exceeds delta."""
    from training.privacy.accounting import gaussian_mechanism_delta

    for delta in (1e-9, 1e-5, 1e-3, 0.05, 0.3, 0.49):
        for epsilon in (0.01, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 32.0, 100.0):
            assert gaussian_mechanism_delta(epsilon, egm_noise_multiplier(epsilon, delta)) <= delta


def test_hgm_std_protects_the_least_noisy_coordinate():
    r = torch.tensor([0.25, 1.0, 1.75])  # sum K = 3
    sigma = hgm_noise_std(1.0, 1e-5, 0.2, r)
    from training.privacy.accounting import gaussian_mechanism_delta

    # the worst case puts the whole sensitivity on the coordinate of variance sigma^2 * 0.25
    assert gaussian_mechanism_delta(1.0, sigma * math.sqrt(0.25) / 0.2) <= 1e-5
    assert hgm_attack_size(1.0, 1e-5, sigma, 0.25, 1.0) == pytest.approx(0.2, rel=1e-12)


def test_clopper_pearson_bounds_against_statsmodels():
    from statsmodels.stats.proportion import proportion_confint

    counts = np.array([900, 60, 40, 0, 0])
    lower, upper = common.clopper_pearson_bounds(counts, 0, alpha=0.01)
    assert lower == pytest.approx(proportion_confint(900, 1000, alpha=2 * 0.005, method="beta")[0], rel=1e-9)
    each = 0.01 / (2 * 4)
    assert upper == pytest.approx(proportion_confint(60, 1000, alpha=2 * each, method="beta")[1], rel=1e-9)


def test_largest_robust_size_against_closed_form_and_brute_force():
    # attack size = epsilon, independent of delta: the sup is ln(p_lower / p_upper) / 2 (delta -> 0)
    size, eps, delta = common.largest_robust_size(0.9, 0.05, lambda e, d: e, max_delta=0.5)
    assert size == pytest.approx(math.log(0.9 / 0.05) / 2, rel=1e-6)
    assert common.robustness_condition(0.9, 0.05, eps, delta)
    # the HGM attack size: compare with a dense grid over (epsilon, delta)

    def attack(e, d):
        return hgm_attack_size(e, d, noise_std=0.4, redistribution_min=0.5, sensitivity_per_unit=1.0)

    size, eps, delta = common.largest_robust_size(0.97, 0.01, attack, max_delta=0.5)
    assert 0.97 > math.exp(2 * eps) * 0.01 + (1 + math.exp(eps)) * delta  # the condition, written out
    assert size == pytest.approx(attack(eps, delta), rel=1e-12)
    best = 0.0
    for e in np.linspace(1e-3, math.log(97) / 2, 400):
        for d in np.geomspace(1e-12, 0.5, 400):
            if 0.97 > math.exp(2 * e) * 0.01 + (1 + math.exp(e)) * d:
                best = max(best, attack(float(e), float(d)))
    assert best * (1 - 1e-3) <= size <= best * 1.05
    assert common.largest_robust_size(0.5, 0.5, attack, 0.5)[0] == 0.0


def test_phan_certificate_from_counts():
    selection = np.array([0, 0, 20, 0, 0, 0, 0, 0, 0, 0])
    estimation = np.array([3, 0, 995, 2, 0, 0, 0, 0, 0, 0])
    cert = phan_certificate(selection, estimation, 0.001, lambda e, d: hgm_attack_size(e, d, 0.5, 0.5, 1.0))
    assert cert.prediction == 2 and cert.certified
    assert cert.p_lower > math.exp(2 * cert.epsilon) * cert.p_upper + (1 + math.exp(cert.epsilon)) * cert.delta
    assert cert.radius == pytest.approx(hgm_attack_size(cert.epsilon, cert.delta, 0.5, 0.5, 1.0))
    split = phan_certificate(selection, np.array([0, 0, 500, 500, 0, 0, 0, 0, 0, 0]), 0.001, lambda e, d: 1.0)
    assert not split.certified and split.radius == 0.0


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_sensitivity_bound_holds_against_the_dense_operator(stride):
    torch.manual_seed(stride)
    weight = torch.randn(4, 2, 3, 3)

    def conv(flat):
        return torch.nn.functional.conv2d(flat.view(1, 2, 8, 8), weight, stride=stride, padding=1).flatten()

    dense = torch.autograd.functional.jacobian(conv, torch.zeros(128))
    exact = float(torch.linalg.matrix_norm(dense, ord=2))
    bound = common.conv_operator_norm_bound(weight, (stride, stride))
    assert exact <= bound <= 3.0 * exact


def test_projection_sets_the_first_layer_sensitivity_to_one():
    for arm in securesgd.ARMS:
        model = _model(arm)
        model.project()
        assert model.sensitivity_per_unit() == pytest.approx(1.0, rel=1e-6)


def _random_classifier(path, mnist10k):
    from training.checkpoint import save_checkpoint
    from training.models import build_model

    kwargs = {"in_channels": 1, "num_classes": 10}
    meta = {"kind": "classifier", "architecture": "cnn28", "arch_kwargs": kwargs, "input_shape": [1, 28, 28],
            "num_classes": 10, "class_names": list(mnist10k.classes), "test_accuracy": None,
            "dataset": {"name": "mnist10k"}}
    torch.manual_seed(0)
    return save_checkpoint(path, build_model("cnn28", **kwargs).eval(), meta)


def test_both_arms_train_certify_and_attack_through_the_cli(tmp_path, mnist10k):
    from training.baselines.securesgd_certify import load_securesgd
    from training.checkpoint import load_checkpoint
    from transdenoiser.cli import main

    small = ["--epochs", "1", "--batch-size", "8", "--train-examples", "16", "--eval-examples", "20",
             "--target-epsilon", "4", "--seed", "1"]
    clf = _random_classifier(tmp_path / "clf", mnist10k)
    assert main(["train", "--arm", "securesgd-prt", "--classifier", str(clf), "--out", str(tmp_path / "prt"),
                 *small]) == 0
    assert main(["train", "--arm", "securesgd-sct", "--out", str(tmp_path / "sct"), *small]) == 0
    prt = load_checkpoint(tmp_path / "prt", kind="denoiser")
    sct = load_checkpoint(tmp_path / "sct", kind="classifier")
    assert prt.metadata["privacy"]["arm"] == "securesgd-prt" and sct.metadata["privacy"]["guarantees"]
    loaded = load_securesgd(tmp_path / "sct")  # the projection kept the first layer's sensitivity where it started
    assert loaded.model.sensitivity_per_unit() == pytest.approx(
        loaded.metadata["securesgd"]["sensitivity_per_unit_input"], rel=1e-5)
    few = ["--n0", "5", "--n", "20", "--max-index", "2"]
    assert main(["certify", "--classifier", str(clf), "--denoiser", str(tmp_path / "prt"), "--sigma", "0.25",
                 *few, "--out", str(tmp_path / "cert_prt")]) == 0
    assert main(["certify", "--classifier", str(tmp_path / "sct"), "--sigma", "0.25", *few,
                 "--out", str(tmp_path / "cert_sct")]) == 0
    for name in ("cert_prt", "cert_sct"):
        assert len((tmp_path / name / "certify.tsv").read_text().splitlines()) == 3
    assert main(["attack", "--classifier", str(tmp_path / "sct"), "--attack", "pgd", "--eps", "0.5",
                 "--max-images", "2", "--threat", "classifier", "--out", str(tmp_path / "att_sct")]) == 0
    assert main(["attack", "--classifier", str(clf), "--denoiser", str(tmp_path / "prt"), "--attack", "fgsm",
                 "--eps", "0.5", "--max-images", "2", "--sigma", "0.25", "--threat", "pipeline",
                 "--out", str(tmp_path / "att_prt")]) == 0
    assert main(["baseline-certify", "--model", str(tmp_path / "prt"), "--n0", "5", "--n", "30", "--max-images",
                 "2", "--out", str(tmp_path / "bc_prt")]) == 0
    rows = (tmp_path / "bc_prt" / "baseline_certify.tsv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].split("\t")[:4] == ["idx", "label", "phan_predict", "phan_radius"]
    summary = json.loads((tmp_path / "bc_prt" / "summary.json").read_text())
    assert set(summary["phan"]["certified_accuracy"]) == set(summary["smoothing"]["certified_accuracy"])
    report = (tmp_path / "bc_prt" / "report.md").read_text()
    assert "## Own certificate: SecureSGD's own certificate (Phan et al. 2019" in report
    assert "## Randomized smoothing of the same randomised model" in report
    assert report.count("| L2 radius | certified accuracy |") == 2 and "under `privacy`" in report
    assert main(["train", "--arm", "securesgd-sct", "--out", str(tmp_path / "sct"), *small]) == 2  # no overwrite
