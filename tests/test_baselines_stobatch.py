"""The stobatch arm (Phan et al. 2020's StoBatch, training/baselines/stobatch.py): clipping, noise scales, the
privacy report against dp-accounting called directly, the CLI (train, certify, attack, baseline-certify) and the
certificate against its closed form. Every expected value is computed here, independently of the code under test."""
from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest
import torch
from scipy import stats
from torch.nn import functional as F

from training.baselines import stobatch as sb
from training.baselines import stobatch_certify as sbc
from training.baselines import stobatch_mechanisms as sbm
from training.baselines import stobatch_privacy as sbp
from training.checkpoint import load_checkpoint, save_checkpoint
from training.models import build_model
from transdenoiser.cli import main
from transdenoiser.errors import UserError

TINY_TRAIN = ["--train-examples", "40", "--eval-examples", "40", "--epochs", "1", "--batch-size", "20",
              "--reproducible-noise", "--device", "cpu"]


@pytest.fixture(scope="module")
def stobatch_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("stobatch") / "clf"
    assert main(["train", "--arm", "stobatch", "--out", str(out), "--target-epsilon", "1", *TINY_TRAIN]) == 0
    return out


def _model(seed: int = 0):
    torch.manual_seed(seed)
    return build_model("cnn28", in_channels=1, num_classes=10).eval()


def test_laplace_noise_has_the_asked_scale():
    scale = 3.5
    draws = sbm.laplace_noise((40000,), scale, torch.Generator().manual_seed(1)).double().numpy()
    assert stats.kstest(draws, stats.laplace(scale=scale).cdf).pvalue > 1e-3
    assert stats.kstest(draws, stats.laplace(scale=1.2 * scale).cdf).pvalue < 1e-6  # the test can fail


def test_laplace_noise_keeps_the_bits_of_the_plain_inversion():
    """The in-place sampler gives the very draws of the out-of-place formula, so certificates and trainings seeded
    before it are the same."""
    for shape, scale in (((3, 32, 28, 28), 0.37), ((5000,), 2.0), ((7,), 0.0)):
        generator = torch.Generator().manual_seed(11)
        u = torch.rand(shape, generator=torch.Generator().manual_seed(11), dtype=torch.float64) - 0.5
        plain = (scale * torch.sign(u) * -torch.log1p(-2 * u.abs().clamp(max=0.5 - 1e-17))).to(torch.float32)
        assert torch.equal(sbm.laplace_noise(shape, scale, generator), plain)


def test_paper_budget_matches_the_formulas():
    model = _model()
    conv = sbm.first_layer(model)
    delta_r = sbm.reconstruction_sensitivity(conv, (1, 28, 28))
    assert delta_r == 1 * 3 * 3 * (28 * 28 + 2)  # d (beta + 2): 9 inputs per hidden unit, 784 positions
    w = conv.weight.detach().double().reshape(32, -1).numpy()
    w_norm = float(np.linalg.svd(w, compute_uv=False).max())
    assert sbm.largest_singular_value(conv.weight) == pytest.approx(w_norm, rel=1e-9)
    total, share, m, d3 = 1.0, 0.5, 100.0, 256.0
    budget = sbp.paper_budget(total, share, delta_r, d3, w_norm, m)
    eps2 = share * total
    eps1 = (total - eps2) / (1 + m / delta_r + m * w_norm / (2 * delta_r))
    assert budget.eps1 == pytest.approx(eps1, rel=1e-12) and budget.eps2 == pytest.approx(eps2)
    assert budget.paper_epsilon == pytest.approx(total, rel=1e-12)
    assert budget.input_scale == pytest.approx(delta_r / (m * eps1), rel=1e-12)
    assert budget.hidden_scale == pytest.approx(2 * delta_r / (m * eps1), rel=1e-12)
    assert budget.output_scale == pytest.approx(d3 / (m * eps2), rel=1e-12)


def test_disjoint_batches_partition_the_examples():
    batches = sbm.disjoint_batches(1000, 7, torch.Generator().manual_seed(0))
    joined = torch.cat(batches).sort().values
    assert len(batches) == 7 and torch.equal(joined, torch.arange(1000))


def test_per_example_gradients_are_clipped_to_c():
    """Each example's two blocks are clipped to C/sqrt(2) each (whole gradient <= C), as a plain autograd loop over
    the examples, clipping each block by hand, computes."""
    model = _model(1)
    per_example, blocks = sbm.example_gradients(model, alpha=1.0)
    g = torch.Generator().manual_seed(2)
    x_bar = torch.rand(3, 1, 28, 28, generator=g)
    x_adv = (x_bar + 0.1 * torch.randn(3, 1, 28, 28, generator=g)).clamp(0, 1)
    onehot = F.one_hot(torch.tensor([0, 3, 9]), 10).float()
    n_h = 0.5 * torch.randn(1, 32, 28, 28, generator=g)
    clip = 0.05
    summed, norms = sbm.clipped_gradient_sum(model, per_example, blocks, x_bar, x_adv, onehot, n_h, clip, chunk_size=2)
    params = dict(model.named_parameters())
    expected = {k: torch.zeros_like(p) for k, p in params.items()}
    for i in range(3):
        conv = sbm.first_layer(model)
        hidden = F.relu(conv(model.normalize(x_bar[i:i + 1])) + n_h)
        recon = F.conv_transpose2d(hidden, conv.weight, padding=1)
        rec_loss = (math.log(2) + recon / 2 + recon ** 2 / 8 - x_bar[i:i + 1] * recon).sum()
        first = list(blocks[0])
        rec_grads = torch.autograd.grad(rec_loss, [params[k] for k in first])
        logits = sbm.noisy_logits(model, torch.cat([x_bar[i:i + 1], x_adv[i:i + 1]]), n_h)
        terms = (math.log(2) + logits / 2 + logits ** 2 / 8 - onehot[i] * logits).sum(1)
        cls_loss = (terms[0] + terms[1]) / 2
        rest = list(blocks[1])
        cls_grads = torch.autograd.grad(cls_loss, [params[k] for k in rest])
        for names, grads in ((first, rec_grads), (rest, cls_grads)):
            norm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads))
            factor = min(1.0, (clip / math.sqrt(2)) / float(norm))
            assert float(norm) > clip  # clipping is active in this test
            for k, gr in zip(names, grads, strict=True):
                expected[k] += factor * gr
    for k in expected:
        assert torch.allclose(summed[k], expected[k], rtol=1e-4, atol=1e-7), k
    assert float(norms.max()) <= clip * (1 + 1e-6)


def test_removing_one_example_moves_its_batchs_clipped_sum_by_at_most_c():
    """The sensitivity the privacy report's analysis rests on: each example's adversarial version reads only that
    example and its own draws (attack_draws: which attack, PGD's start), so the batch without one example has a
    clipped gradient sum within C of the whole batch's when every other example keeps its draws. An attack chosen
    by the row number fails this (checked last): removing the first example shifts the others' rows and attacks."""
    model = _model(1)
    per_example, blocks = sbm.example_gradients(model, alpha=1.0)
    g = torch.Generator().manual_seed(3)
    count, eps, clip = 12, 0.3, 1.0
    x_bar = torch.rand(count, 1, 28, 28, generator=g)
    onehot = F.one_hot(torch.randint(0, 10, (count,), generator=g), 10).float()
    n_h = 0.5 * torch.randn(1, 32, 28, 28, generator=g)
    adv = sbm.dp_adversarial_examples(model, x_bar, n_h, eps, 3, torch.Generator().manual_seed(7))
    kind, start = sbm.attack_draws(count, (1, 28, 28), eps, torch.Generator().manual_seed(7))
    assert torch.equal(adv, sbm.adversarial_examples(model, x_bar, n_h, eps, 3, kind, start))  # the same draws
    assert set(kind.tolist()) == {0, 1, 2} and not torch.equal(kind, torch.arange(count) % 3)
    whole, _ = sbm.clipped_gradient_sum(model, per_example, blocks, x_bar, adv, onehot, n_h, clip)
    for removed in (0, count // 2, count - 1):
        keep = [i for i in range(count) if i != removed]
        adv_kept = sbm.adversarial_examples(model, x_bar[keep], n_h, eps, 3, kind[keep], start[keep])
        part, _ = sbm.clipped_gradient_sum(model, per_example, blocks, x_bar[keep], adv_kept, onehot[keep], n_h,
                                           clip)
        change = sum(float((whole[k] - part[k]).pow(2).sum()) for k in whole) ** 0.5
        assert change <= clip * (1 + 1e-4), (removed, change)  # float noise only above C
    rows = torch.arange(count) % 3  # the attack by row number: the check above can fail
    by_row, _ = sbm.clipped_gradient_sum(model, per_example, blocks, x_bar,
                                         sbm.adversarial_examples(model, x_bar, n_h, eps, 3, rows, start), onehot, n_h,
                                         clip)
    shifted = sbm.adversarial_examples(model, x_bar[1:], n_h, eps, 3, torch.arange(count - 1) % 3, start[1:])
    part, _ = sbm.clipped_gradient_sum(model, per_example, blocks, x_bar[1:], shifted, onehot[1:], n_h, clip)
    assert sum(float((by_row[k] - part[k]).pow(2).sum()) for k in by_row) ** 0.5 > 1.1 * clip  # 1.18 C here


def test_noise_multiplier_and_epsilon_match_dp_accounting():
    config = sb.StoBatchConfig(target_epsilon=1.0, epochs=7, batch_size=50)
    schedule = sbp.plan(config, 1000)
    z = schedule["noise_multiplier"]

    def eps(multiplier):
        accountant = dp_accounting.rdp.RdpAccountant()
        accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(multiplier), 7))
        return accountant.get_epsilon(1e-5)

    assert eps(z) <= 1.0 + 1e-6 and eps(0.97 * z) > 1.0  # calibrated: meets the target, and barely
    assert schedule["num_batches"] == 20 and schedule["total_steps"] == 140
    budget = sbp.paper_budget(1.0, 0.5, 7074.0, 256.0, 1.0, 50.0)
    report = sbp.privacy_report(config, schedule, budget, 1000, 7)
    ours = report["guarantees"][0]
    assert ours["data_independent"] and ours["noise_multiplier"] == z
    assert ours["epsilon"]["rdp"] == pytest.approx(eps(z), rel=0.02)  # our finer order grid: equal or tighter
    assert not report["paper_analysis"]["data_independent"] and "NOT a guarantee" in report["paper_analysis"]["label"]


def test_noise_on_the_gradient_has_the_reported_scale():
    """An empty batch's privatised gradient is pure noise: its std must be z C / m."""
    model = _model(3)
    per_example, blocks = sbm.example_gradients(model)
    z, clip, m = 2.5, 0.7, 40.0
    empty = torch.zeros(0, 1, 28, 28)
    grads = sbm.privatised_gradient(model, per_example, blocks, empty, empty, torch.zeros(0, 10),
                                   torch.zeros(1, 32, 28, 28), clip, z, m, 8, torch.Generator().manual_seed(4))
    values = torch.cat([g.flatten() for g in grads.values()]).double().numpy()
    assert len(values) > 400_000
    assert np.std(values) == pytest.approx(z * clip / m, rel=0.01)
    assert abs(np.mean(values)) < 5 * z * clip / m / math.sqrt(len(values))


def test_certificate_radius_closed_form():
    for p, bx, bh, s in ((0.9, 2.0, 4.0, 3.0), (0.6, 0.5, 10.0, 1.0), (0.999, 1.0, 1.0, 0.1)):
        eps_r, r1, paper = sbc.radius_from_p_lower(p, bx, bh, s)
        assert eps_r == pytest.approx(0.5 * math.log(p / (1 - p)))
        assert r1 == pytest.approx(eps_r * max(bx, bh / s)) and paper == pytest.approx(eps_r * (bx + bh / s))
    assert sbc.radius_from_p_lower(0.5, 1.0, 1.0, 1.0) == (0.0, 0.0, 0.0)


def test_l1_operator_norm_bounds_and_is_attained():
    model = _model(5)
    conv = sbm.first_layer(model)
    std = [0.3]
    s = sbm.l1_operator_norm(conv, std)
    assert s == pytest.approx(float(conv.weight.detach().abs().sum()) / 0.3, rel=1e-6)
    g = torch.Generator().manual_seed(6)
    for _ in range(5):
        delta = torch.randn(1, 1, 28, 28, generator=g)
        out = F.conv2d(delta / 0.3, conv.weight.detach(), padding=1)
        assert float(out.abs().sum()) <= s * float(delta.abs().sum()) * (1 + 1e-6)
    pixel = torch.zeros(1, 1, 28, 28)
    pixel[0, 0, 14, 14] = 1.0  # an interior pixel meets every weight once: the bound is attained
    assert float(F.conv2d(pixel / 0.3, conv.weight.detach(), padding=1).abs().sum()) == pytest.approx(s, rel=1e-5)


def test_certified_robustness_of_a_constant_model(tmp_path):
    """A classifier that always says 3: every draw votes 3, so p_lower = alpha^(1/n) (Clopper-Pearson, n of n)."""
    model = _model(7)
    head = model.head[-1]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[3] = 5.0
    bx, bh = 0.8, 1.6
    meta = {"kind": "classifier", "architecture": "cnn28", "arch_kwargs": {"in_channels": 1, "num_classes": 10},
            "input_shape": [1, 28, 28], "num_classes": 10, "arm": "stobatch",
            "stobatch": {"input_laplace_scale": bx, "hidden_laplace_scale": bh}}
    directory = save_checkpoint(tmp_path / "const", model, meta)
    images = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(8))
    n, alpha = 50, 0.01
    certs = sbc.certified_robustness(directory, images, n0=5, n=n, alpha=alpha, batch_size=17)
    s = float(sbm.first_layer(model).weight.detach().abs().sum()) / float(model.normalize.std.flatten()[0])
    p_lower = alpha ** (1 / n)
    radius = 0.5 * math.log(p_lower / (1 - p_lower)) * max(bx, bh / s)
    for cert in certs:
        assert cert.prediction == 3 and cert.count == n
        assert cert.p_lower == pytest.approx(p_lower, rel=1e-9)
        assert cert.radius_l1 == pytest.approx(radius, rel=1e-6)
        assert cert.radius_l2 == pytest.approx(radius / 28) and cert.radius_linf == pytest.approx(radius / 784)
    with pytest.raises(UserError):
        sbc.certified_robustness(directory, images[:, :, :27], n0=5, n=n)


def test_train_cli_writes_a_classifier_checkpoint(stobatch_dir):
    checkpoint = load_checkpoint(stobatch_dir, kind="classifier")
    meta = checkpoint.metadata
    assert meta["arm"] == "stobatch" and meta["architecture"] == "cnn28"
    assert meta["dataset"]["trained_on"] == "private" and meta["dataset"]["train_examples"] == 40
    report = meta["privacy"]
    assert report["guarantees"][0]["epsilon"]["rdp"] <= 1.0 + 1e-6  # one epoch at target 1
    assert report["num_batches"] == 2 and report["steps_done"] == 2
    text = (stobatch_dir / "privacy_report.txt").read_text()
    assert "the paper's analysis" in text and "data-independent" in text
    assert not (stobatch_dir / "private").exists()  # nothing private is written
    with torch.inference_mode():
        out = checkpoint.model(torch.rand(2, 1, 28, 28))
    assert out.shape == (2, 10) and bool(torch.isfinite(out).all())


def test_certify_and_attack_cli_take_the_checkpoint(stobatch_dir, tmp_path):
    out = tmp_path / "cert"
    assert main(["certify", "--classifier", str(stobatch_dir), "--sigma", "0.25", "--n0", "5", "--n", "10",
                 "--skip", "500", "--out", str(out), "--device", "cpu"]) == 0
    rows = (out / "certify.tsv").read_text().splitlines()
    assert len(rows) == 1 + 5  # header + every 500th of the 2,004 test images
    att = tmp_path / "att"
    assert main(["attack", "--classifier", str(stobatch_dir), "--attack", "fgsm", "--norm", "l2", "--eps", "0.5",
                 "--threat", "classifier", "--max-images", "4", "--n", "10", "--out", str(att),
                 "--device", "cpu"]) == 0
    record = json.loads((att / "attack.json").read_text())
    assert record["classifier_metadata"]["arm"] == "stobatch" and record["num_images"] == 4


def test_train_cli_refuses_denoiser_flags(tmp_path, capsys):
    assert main(["train", "--arm", "stobatch", "--sigma", "0.5", "--out", str(tmp_path / "x"), *TINY_TRAIN]) == 2
    assert "--sigma" in capsys.readouterr().err
    with pytest.raises(UserError):
        sb.StoBatchConfig(batch_size=0).validate(100)
    with pytest.raises(UserError):
        sb.StoBatchConfig(target_epsilon=1.0, noise_multiplier=2.0).validate(100)


def _with_laplace_scales(stobatch_dir, directory, input_scale: float, hidden_scale: float):
    """The fixture's checkpoint, its noise layer's Laplace scales set to the given ones (the fixture's, about 700
    pixels, make every vote a coin toss)."""
    checkpoint = load_checkpoint(stobatch_dir, kind="classifier")
    meta = {k: v for k, v in checkpoint.metadata.items() if k != "files"}
    meta["stobatch"] = {**meta["stobatch"], "input_laplace_scale": input_scale, "hidden_laplace_scale": hidden_scale}
    return save_checkpoint(directory, checkpoint.model, meta)


def _tsv(path):
    lines = path.read_text().splitlines()
    header = lines[0].split("\t")
    return header, [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def test_baseline_certify_runs_stobatchs_certificate_beside_smoothing(stobatch_dir, tmp_path, mnist10k):
    """`baseline-certify` on a stobatch checkpoint (Laplace scales made small so that the votes split): each row's own
    certificate is certified_robustness's on the same images and seed; its p_lower is the Clopper-Pearson bound of its
    count (SciPy's beta), its L2 radius epsilon_r max(b_x, b_h / S) / sqrt(784) with S computed here from the
    weights; the smoothing radius is sigma Phi^-1(pA_lower) of the smoothing count, abstaining below 1/2."""
    bx, bh, n0, n, alpha, seed, sigma = 0.25, 0.5, 5, 40, 0.01, 3, 0.05
    model_dir = _with_laplace_scales(stobatch_dir, tmp_path / "small_noise", bx, bh)
    out = tmp_path / "bc"
    assert main(["baseline-certify", "--model", str(model_dir), "--sigma", str(sigma), "--n0", str(n0), "--n", str(n),
                 "--alpha", str(alpha), "--skip", "700", "--max-images", "3", "--seed", str(seed),
                 "--out", str(out), "--device", "cpu"]) == 0
    header, rows = _tsv(out / "baseline_certify.tsv")
    assert header[:4] == ["idx", "label", "phan_predict", "phan_radius"] and "stobatch_count" in header
    indices = [int(r["idx"]) for r in rows]
    assert indices == [0, 700, 1400]
    images, labels = mnist10k.split("test").subset(np.asarray(indices)).tensors("cpu")
    certificates = sbc.certified_robustness(model_dir, images, n0=n0, n=n, alpha=alpha, seed=seed, indices=indices)
    model = load_checkpoint(model_dir, kind="classifier").model
    s_norm = float(model.features[0].weight.detach().abs().sum()) / float(model.normalize.std.flatten()[0])
    certified = split = 0
    for row, cert, label in zip(rows, certificates, labels.tolist(), strict=True):
        assert int(row["label"]) == label
        assert int(row["phan_predict"]) == cert.prediction and int(row["stobatch_count"]) == cert.count
        count = cert.count
        p_lower = float(stats.beta.ppf(alpha, count, n - count + 1)) if count else 0.0
        assert float(row["phan_p_lower"]) == pytest.approx(p_lower, rel=1e-5)
        if p_lower > 0.5:
            radius = 0.5 * math.log(p_lower / (1 - p_lower)) * max(bx, bh / s_norm) / 28
            assert radius > 0 and float(row["phan_radius"]) == pytest.approx(radius, rel=1e-5)
            assert cert.radius_l2 == pytest.approx(radius, rel=1e-9)
            assert int(row["phan_correct"]) == int(cert.prediction == label)
            certified += 1
        else:
            assert cert.prediction == -1 and float(row["phan_radius"]) == 0 and row["phan_correct"] == "0"
        split += count < n
        smooth_count = int(row["smooth_count"])
        p_a = float(stats.beta.ppf(alpha, smooth_count, n - smooth_count + 1)) if smooth_count else 0.0
        assert float(row["smooth_p_lower"]) == pytest.approx(p_a, rel=1e-5)
        if p_a >= 0.5:
            assert float(row["smooth_radius"]) == pytest.approx(sigma * stats.norm.ppf(p_a), rel=1e-5, abs=1e-9)
            assert int(row["smooth_predict"]) >= 0
        else:
            assert row["smooth_predict"] == "-1" and float(row["smooth_radius"]) == 0
    assert certified >= 1 and split >= 1  # the comparison above covers a certified radius and a split vote
    summary = json.loads((out / "summary.json").read_text())
    assert summary["arm"] == "stobatch" and summary["smoothing_sigma"] == sigma and summary["n"] == n
    for prefix, key in (("phan", "phan"), ("smooth", "smoothing")):
        for radius in ("0", "0.0005", "0.05"):
            if radius in summary[key]["certified_accuracy"]:
                expected = np.mean([r[f"{prefix}_correct"] == "1" and float(r[f"{prefix}_radius"]) >= float(radius)
                                    for r in rows])
                assert summary[key]["certified_accuracy"][radius] == pytest.approx(expected)
    assert summary["phan"]["abstain_rate"] == pytest.approx(np.mean([c.prediction == -1 for c in certificates]))
    # report.md: one section per certificate, each with certify's table at the command's radii and its counts
    from certify.baseline_rows import RADII
    from transdenoiser.records import BaselineCertificationSummary

    assert summary["format_version"] == 1 and summary["task"] == "baseline-certify"
    assert BaselineCertificationSummary.from_json(summary).to_json() == summary
    report = (out / "report.md").read_text()
    own, smoothing = report.split("## Own certificate: ")[1].split("## Randomized smoothing of the same randomised")
    assert own.startswith("StoBatch's own certificate (Phan et al. 2020") and "L2 = L1 / sqrt(d), d = 784" in own
    smoothing = smoothing.split("## Speed and hardware")[0]
    for prefix, section in (("phan", own), ("smooth", smoothing)):
        table = section.split("| ---: | ---: |\n")[1].split("\n\n")[0].splitlines()
        assert [float(line.split("|")[1]) for line in table] == list(RADII)
        correct = sum(r[f"{prefix}_correct"] == "1" for r in rows)
        abstained = sum(r[f"{prefix}_predict"] == "-1" for r in rows)
        assert f"- certified correct at radius 0: {correct} of 3 images ({correct / 3:.1%})" in section
        assert f"- abstained (counted wrong): {abstained} of 3 images ({abstained / 3:.1%})" in section
        assert table[0] == f"| 0.00 | {correct / 3:.1%} |"
    assert "- hardware: " in report and "| seed | 3 |" in report


def test_baseline_certify_resumes_an_interrupted_run_with_the_same_rows(stobatch_dir, tmp_path, capsys):
    """An interrupted `baseline-certify` (two rows recorded, the third cut short) certifies only what is missing and
    writes the table of an uninterrupted run; run again, it redoes nothing; other settings in the same folder are
    refused with one line naming them, and the recorded rows are kept."""
    from training.baselines.cli import ROWS_FILE, SETTINGS_FILE

    args = ["baseline-certify", "--model", str(stobatch_dir), "--sigma", "0.25", "--n0", "5", "--n", "20",
            "--skip", "500", "--max-images", "4", "--seed", "1", "--device", "cpu"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main([*args, "--out", str(whole)]) == 0
    expected = (whole / "baseline_certify.tsv").read_text()
    lines = (whole / ROWS_FILE).read_text().splitlines(keepends=True)
    assert len(lines) == 4 and json.loads((whole / "summary.json").read_text())["images_resumed"] == 0
    cut.mkdir()
    (cut / SETTINGS_FILE).write_text((whole / SETTINGS_FILE).read_text())
    (cut / ROWS_FILE).write_text("".join(lines[:2]) + lines[2][:15])
    capsys.readouterr()
    assert main([*args, "--out", str(cut)]) == 0
    assert "2 of 4 images done" in capsys.readouterr().err
    assert (cut / "baseline_certify.tsv").read_text() == expected
    recorded = (cut / ROWS_FILE).read_text().splitlines()
    assert [json.loads(line)["idx"] for line in recorded] == [0, 500, 1000, 1500]
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["images_resumed"] == 2 and summary["num_images"] == 4 and summary["seconds"] > 0
    report = (cut / "report.md").read_text()
    assert main([*args, "--out", str(cut)]) == 0  # complete: nothing certified again
    assert summary["images_resumed"] == 2 and (cut / "baseline_certify.tsv").read_text() == expected
    assert (cut / "report.md").read_text() == report  # the same rows, the same report.md bytes

    def timeless(text):  # the rows' seconds aside, a resumed run's report is an uninterrupted run's
        return [line for line in text.splitlines() if " s per image " not in line]

    assert timeless(report) == timeless((whole / "report.md").read_text())
    assert main(["report", str(cut), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.md").read_text() == report
    assert main(["report", str(cut), "--out", str(cut)]) == 0 and (cut / "report.md").read_text() == report
    capsys.readouterr()
    assert main(["report", str(cut), str(whole), "--out", str(tmp_path / "both")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a baseline-certify run: give it alone" in err
    assert json.loads((cut / "summary.json").read_text())["images_resumed"] == 4
    capsys.readouterr()
    assert main([*args[:-4], "--seed", "2", "--device", "cpu", "--out", str(cut)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "different settings (seed 1 there, 2 now)" in err
    assert (cut / ROWS_FILE).read_text().splitlines() == recorded


def test_an_interrupted_baseline_certify_resumes_through_certifys_runner(stobatch_dir, tmp_path, monkeypatch,
                                                                         capsys):
    """Interrupted for real (Ctrl-C while the third row is being written: part of it reaches the file), a
    `baseline-certify` run goes through certify's runner: exit 130, the whole rows kept, the cut one cut off and the
    session closed in the status file. With a cut last row on disk (as a process killed outright leaves it), run
    again, the cut row is dropped, only the missing images are certified, and the rows and table are those of an
    uninterrupted run (the seconds aside)."""
    from certify import runner
    from certify.baseline_rows import ROWS_FILE, STATUS_FILE, TABLE_FILE

    args = ["baseline-certify", "--model", str(stobatch_dir), "--sigma", "0.25", "--n0", "5", "--n", "20",
            "--skip", "500", "--max-images", "4", "--seed", "1", "--device", "cpu"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main([*args, "--out", str(whole)]) == 0
    real_write = runner.RowWriter.write
    written = []

    def write_then_interrupt(self, record):
        if len(written) == 2:
            self.handle.write(self.schema.format(record)[:20])  # the third row, cut short
            self.handle.flush()
            raise KeyboardInterrupt
        written.append(record)
        real_write(self, record)

    monkeypatch.setattr(runner.RowWriter, "write", write_then_interrupt)
    capsys.readouterr()
    assert main([*args, "--out", str(cut)]) == 130
    err = capsys.readouterr().err
    assert "interrupted; 2 of 4 images are saved in" in err and not (cut / TABLE_FILE).exists()
    assert main(["report", str(cut), "--out", str(tmp_path / "early")]) == 2  # no report of an unfinished run
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "summary.json: missing" in err and "not complete" in err
    status = json.loads((cut / STATUS_FILE).read_text())
    assert status["complete"] is False and status["rows"] == 2 and status["sessions"][0]["state"] == "finished"
    kept = (cut / ROWS_FILE).read_text()
    assert len(kept.splitlines()) == 2 and kept.endswith("\n")  # the half row was cut off when the session closed
    with (cut / ROWS_FILE).open("a") as handle:  # ... as a process killed outright (SIGKILL) would leave it
        handle.write((whole / ROWS_FILE).read_text().splitlines()[2][:25])
    monkeypatch.setattr(runner.RowWriter, "write", real_write)
    assert main([*args, "--out", str(cut)]) == 0
    assert "resuming" in capsys.readouterr().err

    def rows(folder):
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"}
                for line in (folder / ROWS_FILE).read_text().splitlines()]

    assert rows(cut) == rows(whole) and len(rows(cut)) == 4
    assert (cut / TABLE_FILE).read_text() == (whole / TABLE_FILE).read_text()
    status = json.loads((cut / STATUS_FILE).read_text())
    assert status["complete"] is True and status["rows"] == 4 and len(status["sessions"]) == 2
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["images_resumed"] == 2 and summary["num_images"] == 4


def test_baseline_certify_refuses_other_checkpoints(stobatch_dir, tmp_path, capsys):
    """A checkpoint of no baseline arm, or a stobatch one without --sigma: exit 2, one line naming the problem."""
    plain = save_checkpoint(tmp_path / "plain", _model(9), {
        "kind": "classifier", "architecture": "cnn28", "arch_kwargs": {"in_channels": 1, "num_classes": 10},
        "input_shape": [1, 28, 28], "num_classes": 10})
    capsys.readouterr()
    assert main(["baseline-certify", "--model", str(plain), "--sigma", "0.25", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "securesgd-prt, securesgd-sct, stobatch" in err
    assert main(["baseline-certify", "--model", str(stobatch_dir), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--sigma" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_training_adds_the_reported_noise(monkeypatch, mnist10k):
    """The noise multiplier every training step uses is the one the privacy report states, and it meets the target
    by dp-accounting called directly (E = 1 epoch: one Gaussian mechanism)."""
    used = []
    original = sbm.privatised_gradient

    def spy(*args, **kwargs):
        used.append((args[7], args[8], args[9]))  # clip norm, noise multiplier, divisor m
        return original(*args, **kwargs)

    monkeypatch.setattr(sb, "privatised_gradient", spy)
    config = sb.StoBatchConfig(target_epsilon=2.0, epochs=1, batch_size=10, train_examples=20, eval_examples=20,
                               adv_steps=1, reproducible_noise=True)
    _, meta = sb.train_stobatch(config, mnist10k)
    z = meta["privacy"]["noise_multiplier"]
    assert used == [(1.0, z, 10.0)] * 2
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(z))
    assert accountant.get_epsilon(1e-5) <= 2.0 + 1e-6
    loose = dp_accounting.rdp.RdpAccountant()
    loose.compose(dp_accounting.GaussianDpEvent(0.97 * z))
    assert loose.get_epsilon(1e-5) > 2.0


def test_plan_is_refused_for_disjoint_batches(tmp_path, capsys):
    """``train --plan`` plans Poisson-sampled DP-SGD: for stobatch's disjoint batches it would print a wrong plan."""
    code = main(["train", "--arm", "stobatch", "--plan", "--target-epsilon", "1", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and "--plan" in err and "disjoint batches" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
