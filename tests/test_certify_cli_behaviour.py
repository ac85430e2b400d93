"""certify: one writer per run, status that agrees with the rows after Ctrl-C and the exact resume command,
sigma and dataset mismatches refused, renamed flags with their old spellings still working."""
from __future__ import annotations

import json
import shlex

import pytest

from transdenoiser.cli import main

PRIVACY = {"arm": "sepdp",
           "privacy_claim": "a data-independent (epsilon, delta)-DP guarantee for the released denoiser:",
           "sigma": 0.25, "clip_norm": 1.0, "xi_up": 1.0, "sample_rate": 0.0625, "steps_planned": 16, "delta": 1e-5,
           "guarantees": [{"name": "sepdp", "label": "DP-SGD (sepdp)", "data_independent": True,
                           "epsilon": {"rdp": 2.9971234567891, "pld": 2.338123456, "gdp_epsilon": 1.3531234}}]}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """An untrained cnn28 (certificates need no accuracy) and a tiny denoiser trained at sigma 0.25, on mnist10k."""
    import torch

    from training.checkpoint import save_checkpoint
    from training.models import build_model

    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    dataset = {"name": "mnist10k"}
    classifier = save_checkpoint(root / "classifier", build_model("cnn28"), {
        "kind": "classifier", "architecture": "cnn28", "arch_kwargs": {}, "input_shape": [1, 28, 28],
        "num_classes": 10, "dataset": dataset, "test_accuracy": 0.9800399201596807})
    denoiser = save_checkpoint(root / "denoiser", build_model("tiny", in_channels=1), {
        "kind": "denoiser", "architecture": "tiny", "arch_kwargs": {"in_channels": 1}, "input_shape": [1, 28, 28],
        "sigma": 0.25, "classifier": {"num_classes": 10}, "dataset": dataset, "privacy": PRIVACY})
    fashion = save_checkpoint(root / "fashion", build_model("cnn28"), {
        "kind": "classifier", "architecture": "cnn28", "arch_kwargs": {}, "input_shape": [1, 28, 28],
        "num_classes": 10, "dataset": {"name": "fashion-mnist"}})
    return classifier, denoiser, fashion


def certify_argv(classifier, out, *extra):
    return ["certify", "--classifier", str(classifier), "--sigma", "0.25", "--n0", "8", "--n", "16",
            "--batch-size", "32", "--max-index", "6", "--out", str(out), "--device", "cpu", *extra]


def test_ctrl_c_keeps_rows_status_agrees_and_prints_the_resume_command(models, tmp_path, monkeypatch, capsys):
    from certify import rundir as runner

    classifier, _, _ = models
    out = tmp_path / "run"
    argv = certify_argv(classifier, out)
    real_write = runner.RowWriter.write
    calls = []

    def write_then_interrupt(self, record):
        calls.append(record)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real_write(self, record)

    monkeypatch.setattr(runner.RowWriter, "write", write_then_interrupt)
    assert main(argv) == 130
    err = capsys.readouterr().err
    rows = (out / "certify.tsv").read_text().strip().splitlines()[1:]
    assert len(rows) == 2
    status = json.loads((out / "certify.status.json").read_text())
    assert status["rows"] == 2 and status["complete"] is False
    assert f"2 of 6 images are saved in {out / 'certify.tsv'}" in err
    resume = err.split("resume with: ", 1)[1].strip()
    assert shlex.split(resume) == ["transdenoiser", *argv]
    monkeypatch.setattr(runner.RowWriter, "write", real_write)
    assert main(shlex.split(resume)[1:]) == 0
    status = json.loads((out / "certify.status.json").read_text())
    assert status["rows"] == 6 and status["complete"] is True


def test_second_writer_into_one_run_is_refused_naming_the_holder(models, tmp_path, capsys):
    import os

    from transdenoiser.lock import RunLock

    classifier, _, _ = models
    with RunLock(tmp_path / "run", purpose="transdenoiser certify --out run"):
        assert main(certify_argv(classifier, tmp_path / "run")) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"being written by process {os.getpid()}" in line
    assert not (tmp_path / "run" / "certify.tsv").exists()


def test_sigma_other_than_the_denoisers_is_refused_unless_allowed(models, tmp_path, capsys):
    classifier, denoiser, _ = models
    argv = [*certify_argv(classifier, tmp_path / "run"), "--denoiser", str(denoiser)]
    argv[argv.index("--sigma") + 1] = "0.5"
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert "--sigma 0.5 differs from the sigma denoiser" in line and "(0.25)" in line and "\n" not in line
    assert main([*argv, "--allow-sigma-mismatch", "--max-index", "1"]) == 0
    assert "warning: --sigma 0.5 differs" in capsys.readouterr().err


def test_classifier_of_another_dataset_is_refused_naming_both(models, tmp_path, capsys):
    _, _, fashion = models
    assert main(certify_argv(fashion, tmp_path / "run")) == 2
    assert "trained on fashion-mnist, the data is mnist10k" in capsys.readouterr().err


def test_denoiser_of_another_dataset_is_refused_naming_both(models, tmp_path, capsys):
    """The denoiser's recorded dataset is checked as the classifier's is: a Fashion-MNIST denoiser in front of an
    mnist10k classifier on mnist10k data is refused before anything is certified."""
    from training.checkpoint import load_checkpoint, save_checkpoint

    classifier, denoiser, _ = models
    source = load_checkpoint(denoiser, kind="denoiser")
    fashion_denoiser = save_checkpoint(tmp_path / "fashion_denoiser", source.model,
                                       {**source.metadata, "dataset": {"name": "fashion-mnist"}})
    assert main([*certify_argv(classifier, tmp_path / "run"), "--denoiser", str(fashion_denoiser)]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "fashion_denoiser was trained on fashion-mnist, the data is mnist10k" in line
    assert not (tmp_path / "run" / "certify.tsv").exists()


def test_old_flag_spellings_still_work_with_a_note(models, tmp_path, capsys):
    classifier, _, _ = models
    argv = certify_argv(classifier, tmp_path / "run")
    argv[argv.index("--batch-size")] = "--batch"
    argv[argv.index("--max-index")] = "--max"
    argv[argv.index("--max") + 1] = "2"
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "--batch is now spelled --batch-size" in err and "--max is now spelled --max-index" in err
    settings = json.loads((tmp_path / "run" / "settings.json").read_text())
    assert settings["batch"] == 32 and settings["max"] == 2


def test_report_has_a_privacy_table_rounded_numbers_legends_and_the_radius_cap(models, tmp_path, capsys):
    import re

    from certify.figures import cap_note, certified_accuracy_figure, legend_label
    from certify.report import read_certify_run

    classifier, denoiser, _ = models
    with_denoiser, plain = tmp_path / "td", tmp_path / "plain"
    assert main([*certify_argv(classifier, with_denoiser, "--denoiser", str(denoiser)), "--max-index", "3"]) == 0
    argv = certify_argv(classifier, plain, "--max-index", "3")
    argv[argv.index("--sigma") + 1] = "0.5"
    assert main(argv) == 0
    report = (with_denoiser / "report.md").read_text()
    assert "```json" not in report and not re.search(r"\d\.\d{7,}", report)
    assert "| DP-SGD (sepdp) | yes | 2.997 | 2.338 | 1.353 |" in report and "test accuracy 0.98 " in report

    summary, records = read_certify_run(with_denoiser)
    assert legend_label(summary) == "sepdp, sigma 0.25, eps 3 (RDP, delta 1e-05), n 16, mnist10k"
    cap, text = cap_note(summary)
    assert cap == pytest.approx(summary["max_certifiable_radius"]) and text.startswith("largest certifiable radius")
    figure = certified_accuracy_figure([(legend_label(summary), records)], caps=[(cap, text)])
    assert any(list(figure.axes[0].lines[i].get_xdata()) == [cap, cap] for i in range(len(figure.axes[0].lines)))
    assert text in [t.get_text().replace("\n", " ") for t in figure.legends[0].get_texts()]  # named below the plot

    capsys.readouterr()
    assert main(["report", str(with_denoiser), str(plain), "--out", str(tmp_path / "overlay")]) == 0
    warning = "warning: the overlaid runs are on different sigmas (0.25, 0.5)"
    assert warning in capsys.readouterr().err
    overlay = (tmp_path / "overlay" / "report.md").read_text()
    assert warning in overlay and "n 16, mnist10k" in overlay
    # the second run minus the first, paired over their 3 common images: exactly the difference of the two runs' files
    from certify.summary import certified_accuracy

    rows = json.loads((tmp_path / "overlay" / "overlay.json").read_text())
    paired = rows[1]["paired_to_first_run"]
    _, plain_records = read_certify_run(plain)
    assert paired["images"] == 3 and "paired_to_first_run" not in rows[0]
    assert paired["difference"] == pytest.approx([certified_accuracy(plain_records, r) - certified_accuracy(records, r)
                                                 for r in paired["radii"]])
    assert all(lo <= d <= hi for d, lo, hi in zip(paired["difference"], paired["low"], paired["high"], strict=True))
    assert "minus **sepdp, sigma 0.25" in overlay


def test_merge_is_refused_while_a_run_writes_into_the_folder(tmp_path, capsys):
    from transdenoiser.lock import RunLock

    (tmp_path / "run").mkdir()  # exists, so the command's path check passes and the lock is what refuses
    with RunLock(tmp_path / "run"):
        assert main(["certify-merge", str(tmp_path / "run")]) == 2
    assert "being written by process" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["certify", "predict"])
def test_a_run_whose_rows_recorded_no_time_still_reports(models, tmp_path, command):
    """Each row's seconds are written to 4 decimals, so a fast run can sum to 0 s: it has no samples-per-second
    figure (None in summary.json), and every text that shows the speed says so instead of failing."""
    from certify.report import format_certified_accuracy_table, format_prediction_summary, format_run_report

    classifier, _, _ = models
    out = tmp_path / "run"
    argv = certify_argv(classifier, out, "--max-index", "2")
    if command == "predict":
        argv[0] = "predict"
        del argv[argv.index("--n0"):argv.index("--n0") + 2]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    summary["noisy_samples_per_second"] = None
    text = format_certified_accuracy_table(summary) if command == "certify" else format_prediction_summary(summary)
    for shown in (text, format_run_report(summary)):
        assert "no samples-per-second figure (the rows recorded 0 s in all)" in shown
