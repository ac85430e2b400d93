"""Promises of docs/CERTIFY.md that no other test guards, each against an independent computation:

- ``summary.json``'s results are the documented functions of the rows ("Files": certified accuracy at r is the
  share of images with ``correct`` and ``radius >= r``, at radii 0, 0.25, ... up to ``max_certifiable_radius``
  = sigma * Phi^-1(alpha^(1/n)); abstention and wrong rates; ACR; samples per second = N (n0 + n) / seconds);
- an adaptive run's ``max_certifiable_radius`` is R in decide mode and, in estimate mode, sigma * Phi^-1 of the
  all-votes bound at n_max at level alpha / K; the look schedule and the price of the union bound are the
  figures the doc states (20 looks up to 100,000, the last two 94,661 and 100,000; 0.930 against 0.953);
- ``settings.json`` holds at least the documented keys, the checkpoint's absolute path and its weights' SHA-256
  (hashlib over the file here); resume: "checkpoint and data paths may differ", but the checkpoint hashes must
  match;
- ``certify-merge`` "refuses folders of different runs".
"""
from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from scipy.stats import norm

from certify.rundir import CertifyRecord
from certify.summary import summarize
from tests.conftest import run_cli

SIGMA, N0, N, ALPHA = 0.5, 100, 1000, 0.001


def record(idx, label, prediction, radius, seconds, samples=None):
    return CertifyRecord(idx, label, prediction, radius, prediction == label, seconds, samples=samples)


# (label, predict, radius, seconds): certified right at various radii (one exactly on a grid radius),
# an abstention, and a certified but wrong prediction
ROWS = [(1, 1, 0.6, 0.5), (2, 2, 0.1, 1.0), (3, -1, 0.0, 1.5), (4, 5, 0.9, 2.0), (0, 0, 1.1, 2.5), (7, 7, 0.25, 0.5)]


def test_summary_results_are_the_documented_functions_of_the_rows():
    records = [record(i, *row) for i, row in enumerate(ROWS)]
    summary = summarize(records, sigma=SIGMA, n0=N0, n=N, alpha=ALPHA)
    count = len(ROWS)
    cap = SIGMA * norm.ppf(ALPHA ** (1 / N))  # the doc's closed form: all n samples vote for the class
    assert summary["max_certifiable_radius"] == pytest.approx(cap, rel=1e-9)
    assert 1.0 < cap < 1.25  # so the table's radii are exactly these five
    expected_table = {0.0: 4, 0.25: 3, 0.5: 2, 0.75: 1, 1.0: 1}  # counted by hand from ROWS (correct, radius >= r)
    assert [row["radius"] for row in summary["certified_accuracy"]] == list(expected_table)
    for row in summary["certified_accuracy"]:
        assert row["certified_accuracy"] == pytest.approx(expected_table[row["radius"]] / count), row
    assert summary["smoothed_clean_accuracy"] == pytest.approx(4 / count)
    assert summary["abstention_rate"] == pytest.approx(1 / count)
    assert summary["wrong_rate"] == pytest.approx(1 / count)  # certified but wrong, abstentions not included
    assert summary["average_certified_radius"] == pytest.approx((0.6 + 0.1 + 1.1 + 0.25) / count)  # wrong row: 0
    assert summary["largest_certified_radius"] == pytest.approx(1.1)
    seconds = sum(row[3] for row in ROWS)
    assert summary["seconds_per_image"] == pytest.approx(seconds / count)
    assert summary["noisy_samples_per_second"] == pytest.approx(count * (N0 + N) / seconds)


def test_adaptive_summaries_give_the_documented_radius_cap_and_saving():
    n_max, sigma, alpha = 100_000, 0.25, 0.001
    rows = [record(0, 1, 1, 0.5, 1.0, samples=164), record(1, 2, -1, 0.0, 1.0, samples=100 + 100_000),
            record(2, 3, 3, 0.5, 1.0, samples=340)]
    decide = summarize(rows, sigma=sigma, n0=100, n=n_max, alpha=alpha,
                       adaptive={"mode": "decide", "radius": 0.5, "sequential_method": "union-cp"})
    assert decide["max_certifiable_radius"] == 0.5  # "R in decide mode"
    assert 0.5 in [row["radius"] for row in decide["certified_accuracy"]]
    assert decide["fixed_n_samples_per_image"] == 100 + n_max
    mean = (164 + 100_100 + 340) / 3
    assert decide["samples_per_image"]["mean"] == pytest.approx(mean) and decide["samples_per_image"]["max"] == 100_100
    assert decide["saving_vs_fixed_n"] == pytest.approx((100 + n_max) / mean)

    estimate = summarize(rows, sigma=sigma, n0=100, n=n_max, alpha=alpha,
                         adaptive={"mode": "estimate", "tolerance": 0.05, "sequential_method": "union-cp"})
    looks = estimate["sequential"]["looks"]
    # the doc: t_1 = 64, each look about 1.5 times the one before, 20 looks up to 100,000, the last two 94,661
    # and 100,000
    assert looks[0] == 64 and len(looks) == 20 and looks[-2:] == [94_661, 100_000]
    assert all(1.4 < b / a < 1.6 for a, b in zip(looks[:-2], looks[1:-1], strict=True))
    assert estimate["sequential"]["alpha_per_look"] == pytest.approx([alpha / 20] * 20)
    # the all-votes one-sided Clopper-Pearson bound at level alpha / K is (alpha / K)^(1 / n_max)
    cap = sigma * norm.ppf((alpha / 20) ** (1 / n_max))
    assert estimate["max_certifiable_radius"] == pytest.approx(cap, rel=1e-9)
    assert round(cap, 3) == 0.930 and round(sigma * norm.ppf(alpha ** (1 / n_max)), 3) == 0.953  # the doc's figures


# ----------------------------------------------------------------------------------------------- CLI

FAST = ["--sigma", "0.25", "--n0", "8", "--n", "24", "--batch-size", "64", "--alpha", "0.01", "--device", "cpu",
        "--threads", "1"]


def test_resume_accepts_a_moved_checkpoint_but_refuses_other_weights(random_classifier_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = [*FAST, "--max-index", "4", "--out", out]
    assert run_cli(["certify", "--classifier", random_classifier_dir, *args], capsys)[0] == 0
    # "settings holds at least" these (what resume and merge compare, and what audit rebuilds the run from)
    settings = json.loads((out / "settings.json").read_text())
    documented = {"classifier", "denoiser", "dataset", "data_root", "split_seed", "split", "sigma", "n0", "n", "alpha",
                  "batch", "skip", "max", "seed", "indices", "shards", "pack", "noise_device", "memory_format",
                  "precision"}
    assert documented <= set(settings), documented - set(settings)
    assert settings["classifier"] == str(random_classifier_dir.resolve()) and settings["denoiser"] is None
    assert settings["precision"] == "float32" and (settings["sigma"], settings["n0"], settings["n"]) == (0.25, 8, 24)
    weights_sha256 = hashlib.sha256((random_classifier_dir / "weights.safetensors").read_bytes()).hexdigest()
    assert weights_sha256 in json.dumps(settings)  # the SHA-256 of the checkpoint's weights
    assert any("fingerprint" in key for key in settings) and any("size" in key for key in settings)
    lines = (out / "certify.tsv").read_text().splitlines(keepends=True)
    (out / "certify.tsv").write_text("".join(lines[:3]))  # header and 2 of the 4 rows: an interrupted run
    (out / "summary.json").unlink()

    moved = tmp_path / "elsewhere" / "classifier"
    shutil.copytree(random_classifier_dir, moved)
    code, stdout, err = run_cli(["certify", "--classifier", moved, *args], capsys)
    assert code == 0, err
    assert "2 images done now, 2 done before" in stdout
    assert len((out / "certify.tsv").read_text().splitlines()) == 1 + 4

    # the same folder layout and metadata, other weights: a different model, so the run is refused
    from training.checkpoint import save_checkpoint
    from training.models import build_model

    torch.manual_seed(1)
    meta = json.loads((random_classifier_dir / "metadata.json").read_text())
    other = save_checkpoint(tmp_path / "other" / "classifier", build_model("cnn28", **meta["arch_kwargs"]),
                            {k: meta[k] for k in ("kind", "architecture", "arch_kwargs", "num_classes", "input_shape",
                                                  "class_names", "test_accuracy")})
    (out / "certify.tsv").write_text("".join(lines[:3]))
    code, _, err = run_cli(["certify", "--classifier", other, *args], capsys)
    assert code == 2 and "different settings" in err and len(err.strip().splitlines()) == 1
    assert len((out / "certify.tsv").read_text().splitlines()) == 3  # nothing was added to the run


def test_merge_refuses_shards_of_different_runs(random_classifier_dir, tmp_path, capsys):
    # batch 16 over n0 + n = 108 samples: one image per unit, so each shard certifies two of the four images
    common = ["certify", "--classifier", random_classifier_dir, *FAST, "--n", "100", "--batch-size", "16",
              "--max-index", "4"]
    first, second = tmp_path / "part0", tmp_path / "part1"
    assert run_cli([*common, "--seed", "0", "--shard", "0/2", "--out", first], capsys)[0] == 0
    assert run_cli([*common, "--seed", "1", "--shard", "1/2", "--out", second], capsys)[0] == 0  # another seed
    code, _, err = run_cli(["certify-merge", first, second, "--out", tmp_path / "merged"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "seed 0 there, 1 now" in err
    assert len((first / "certify.shard-0-of-2.tsv").read_text().splitlines()) == 1 + 2  # both shards did work
    assert len((second / "certify.shard-1-of-2.tsv").read_text().splitlines()) == 1 + 2
    assert not (tmp_path / "merged" / "certify.tsv").exists()
