"""Smoke tests of the benchmarks: tiny settings, so that a change that breaks a benchmark fails here, not
when someone next measures. The figures themselves are measured by hand (docs/RESULTS.md), never here."""
from __future__ import annotations

import json

import pytest


def test_bench_certify_writes_rates_for_every_side(tmp_path, classifier_dir):
    from benchmarks import bench_certify

    out = tmp_path / "certify.json"
    assert bench_certify.main(["--images", "1", "--n0", "5", "--n", "40", "--batch", "16", "--baseline-batch", "32",
                               "--classifier", str(classifier_dir), "--device", "cpu", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for row in result["runs"].values():
        assert set(row["samples_per_second"]) == {"baseline_batch_32", "ours"}
        assert all(rate > 0 for rate in row["samples_per_second"].values())
        assert row["noisy_samples"] == 45 and row["speedup"]["baseline_batch_32"] > 0


def test_bench_training_compares_sepdp_with_opacus(tmp_path):
    pytest.importorskip("opacus")
    from benchmarks import bench_training

    out = tmp_path / "training.json"
    assert bench_training.main(["--batch-size", "8", "--steps", "1", "--warmup", "1", "--repeats", "2",
                                "--smin-widths", "1", "--smin-examples", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    for name in ("sepdp", "opacus_dpsgd", "opacus_dpsgd_functorch", "transdenoiser_smin_not_computed"):
        assert len(result[name]["examples_per_second"]) == 2
        assert result[name]["median_examples_per_second"] > 0
    assert len(result["sepdp_over_opacus_per_repeat"]) == 2 and result["sepdp_over_opacus"] > 0
    assert result["smin_cost"][0]["smin"] >= 0
