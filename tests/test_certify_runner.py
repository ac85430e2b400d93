"""Certification over a dataset: per-image seeds, shards + merge == one run, resume, CLI files and errors."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from certify.core import Smooth
from certify.report import format_certified_accuracy_table
from certify.rundir import read_rows
from certify.runner import certify_dataset, rank_device
from certify.summary import radius_grid, summarize
from certify.units import Shard, pack_size, plan_units, select_indices
from tests.conftest import run_cli
from transdenoiser.cli import main
from transdenoiser.errors import UserError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


FAST = ["--sigma", "0.25", "--n0", "8", "--n", "40", "--batch-size", "64", "--alpha", "0.01", "--device", "cpu"]


@pytest.fixture(scope="module")
def tiny_classifier_dir(tmp_path_factory):
    """A randomly initialised cnn28 checkpoint: the files and the bookkeeping are under test, not accuracy."""
    from training.checkpoint import save_checkpoint
    from training.models import build_model

    torch.manual_seed(0)
    kwargs = {"in_channels": 1, "num_classes": 10}
    model = build_model("cnn28", **kwargs)
    meta = {"kind": "classifier", "architecture": "cnn28", "arch_kwargs": kwargs, "num_classes": 10,
            "input_shape": [1, 28, 28], "class_names": [str(d) for d in range(10)], "test_accuracy": None}
    return save_checkpoint(tmp_path_factory.mktemp("tiny") / "classifier", model, meta)


def rows_without_time(path):
    return [line.rsplit("\t", 1)[0] for line in path.read_text().splitlines()]


# ----------------------------------------------------------------------------------------------- library

class Halfspace(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.full((4,), 0.5), requires_grad=False)

    def forward(self, x):
        score = x.flatten(1) @ self.w - 0.3
        return torch.stack([-score, score], dim=1)


def test_certify_dataset_is_reproducible_and_split_independent():
    smooth = Smooth(Halfspace(), num_classes=2, sigma=0.5, batch_size=100, device="cpu")
    images = torch.rand(12, 1, 2, 2)
    labels = torch.randint(0, 2, (12,))
    whole = certify_dataset(smooth, images, labels, list(range(12)), 10, 50, 0.01, seed=3)
    again = certify_dataset(smooth, images, labels, list(range(12)), 10, 50, 0.01, seed=3)
    parts = (certify_dataset(smooth, images, labels, [0, 1, 2, 3, 4], 10, 50, 0.01, seed=3)
             + certify_dataset(smooth, images, labels, [5, 6, 7, 8, 9, 10, 11], 10, 50, 0.01, seed=3))
    key = [(r.idx, r.prediction, r.radius, r.count) for r in whole]
    assert key == [(r.idx, r.prediction, r.radius, r.count) for r in again]
    assert key == [(r.idx, r.prediction, r.radius, r.count) for r in parts]
    other = certify_dataset(smooth, images, labels, list(range(12)), 10, 50, 0.01, seed=4)
    assert [r.count for r in other] != [r.count for r in whole]
    summary = summarize(whole, sigma=0.5, n0=10, n=50, alpha=0.01)
    assert summary["images"] == 12
    assert summary["certified_accuracy"][0]["certified_accuracy"] == summary["smoothed_clean_accuracy"]
    assert summary["average_certified_radius"] == pytest.approx(sum(r.radius for r in whole if r.correct) / 12)
    assert "certified accuracy" in format_certified_accuracy_table(summary)
    with pytest.raises(UserError, match="past the end"):
        certify_dataset(smooth, images, labels, [12], 10, 50, 0.01, seed=3)


def test_work_list_units_and_shards():
    assert select_indices(10, skip=3) == [0, 3, 6, 9]
    assert select_indices(10, skip=2, max_index=5) == [0, 2, 4]
    assert select_indices(10, indices=[7, 2]) == [7, 2]
    for bad in ({"max_index": 11}, {"indices": [10]}, {"indices": [1, 1]}):
        with pytest.raises(UserError):
            select_indices(10, **bad)
    units = plan_units(list(range(23)), pack=4)
    shards = [Shard(i, 3).take(units) for i in range(3)]
    flat = sorted(i for shard in shards for unit in shard for i in unit)
    assert flat == list(range(23))  # disjoint and complete
    assert pack_size(100 + 100_000, 1000) == 1 and pack_size(100 + 100, 1000) == 40
    assert Shard.parse("1/4") == Shard(1, 4)
    for bad in ("4/4", "-1/2", "1", "a/b"):
        with pytest.raises(UserError):
            Shard.parse(bad)
    assert Shard.from_environment({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}) == Shard(2, 4)
    assert Shard.from_environment({}) is None
    for rank, world in (("5", "2"), ("-1", "2"), ("0", "0")):  # set by hand, not by torchrun: refused, not skewed
        with pytest.raises(UserError, match="expected 0 <= RANK < WORLD_SIZE"):
            Shard.from_environment({"RANK": rank, "WORLD_SIZE": world})
    assert rank_device(torch.device("cuda"), {"LOCAL_RANK": "3"}) == torch.device("cuda", 3)
    assert rank_device(torch.device("cpu"), {"LOCAL_RANK": "3"}) == torch.device("cpu")
    assert radius_grid(0.8) == [0.0, 0.25, 0.5, 0.75]


def test_cli_choices_match_the_library():
    import certify.cli
    import certify.core
    import training.datasets

    assert certify.cli.MEMORY_FORMATS == certify.core.MEMORY_FORMATS
    assert certify.cli.SPLITS == training.datasets.SPLITS


# ----------------------------------------------------------------------------------------------- CLI

def test_cli_writes_all_four_files_and_report_overlays(tiny_classifier_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = run_cli(["certify", "--classifier", tiny_classifier_dir, *FAST, "--max-index", "6", "--out", out],
                              capsys)
    assert code == 0, stdout
    for name in ("certify.tsv", "summary.json", "report.md", "certified_accuracy.png"):
        assert (out / name).is_file(), name
    assert (out / "certify.tsv").read_text().splitlines()[0].split("\t") == ["idx", "label", "predict", "radius",
                                                                            "correct", "time"]
    summary = json.loads((out / "summary.json").read_text())
    settings = summary["settings"]
    for key in ("classifier", "denoiser", "dataset", "data_root", "split_seed", "split", "sigma", "n0", "n", "alpha",
                "batch", "skip", "max", "seed"):
        assert key in settings, key
    assert settings["classifier"] == str(tiny_classifier_dir.resolve()) and settings["denoiser"] is None
    assert summary["images"] == 6 and summary["classifier_metadata"]["architecture"] == "cnn28"
    assert summary["denoiser_metadata"] is None and summary["hardware"]
    assert (out / "certified_accuracy.png").read_bytes()[:4] == b"\x89PNG"

    other = tmp_path / "run_sigma"
    code, _, _ = run_cli(["certify", "--classifier", tiny_classifier_dir, *FAST, "--sigma", "0.5", "--max-index", "4",
                          "--new-test", "--out", other], capsys)  # another sigma on the same draws: another test
    assert code == 0
    code, stdout, _ = run_cli(["report", out, other, "--out", tmp_path / "overlay"], capsys)
    assert code == 0
    table = (tmp_path / "overlay" / "report.md").read_text()
    assert "no denoiser, sigma 0.25" in table and "no denoiser, sigma 0.5" in table
    assert (tmp_path / "overlay" / "certified_accuracy.png").is_file()
    code, _, _ = run_cli(["report", out, other, out, "--out", tmp_path / "overlay_same"], capsys)
    assert code == 2  # a run listed twice
    from certify.figures import denoiser_arm, run_label

    assert run_label({"settings": {"sigma": 0.1, "denoiser": "d"}, "denoiser_metadata": {"privacy": {"arm": "sepdp"}}}
                     ) == "sepdp, sigma 0.1"
    stability = {"kind": "denoiser", "privacy": {"arm": "sepdp"}, "objective": "stability+mse"}
    assert run_label({"settings": {"sigma": 0.5, "denoiser": "d"}, "denoiser_metadata": stability}
                     ) == "sepdp, objective stability+mse, sigma 0.5"  # a non-MSE objective is named
    from_config = {"kind": "denoiser", "privacy": {"arm": "nodp"}, "config": {"objective": "classification"}}
    assert run_label({"settings": {"sigma": 0.5}, "denoiser_metadata": from_config}
                     ) == "nodp, objective classification, sigma 0.5"
    assert run_label({"settings": {"sigma": 0.5}, "denoiser_metadata": {"kind": "denoiser", "objective": "mse",
                                                                         "privacy": {"arm": "sepdp"}}}
                     ) == "sepdp, sigma 0.5"  # MSE, the default, is not named
    assert denoiser_arm({"architecture": "x"}) is None and run_label({}) == "no denoiser, sigma ?"
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli(["report", out, tmp_path / "empty", "--out", tmp_path / "overlay2"], capsys)
    assert code == 2 and "neither certify.tsv nor attack.json" in err


def test_shards_merge_to_the_single_run(tiny_classifier_dir, tmp_path, capsys):
    # 8 + 41 samples per image, batch 16: units of 3 images whose forward passes straddle images
    common = ["certify", "--classifier", tiny_classifier_dir, *FAST, "--n", "41", "--batch-size", "16",
              "--indices", "0-8,20", "--seed", "5"]
    single = tmp_path / "single"
    assert run_cli([*common, "--out", single], capsys)[0] == 0
    shared = tmp_path / "shared"
    code, stdout, _ = run_cli([*common, "--out", shared, "--shard", "1/3"], capsys)
    assert code == 0 and "waiting for the other shards" in stdout
    assert run_cli([*common, "--out", shared, "--shard", "0/3"], capsys)[0] == 0
    assert not (shared / "summary.json").exists()
    assert run_cli([*common, "--out", shared, "--shard", "2/3"], capsys)[0] == 0  # the last one merges
    assert rows_without_time(shared / "certify.tsv") == rows_without_time(single / "certify.tsv")
    assert len(read_rows(shared / "certify.shard-1-of-3.tsv", "certify")) == 3  # shards did share the work
    # shards in separate folders (separate machines), merged explicitly
    parts = []
    for i in range(3):
        parts.append(tmp_path / f"part{i}")
        assert run_cli([*common, "--out", parts[-1], "--shard", f"{i}/3"], capsys)[0] == 0
    code, _, err = run_cli(["certify-merge", parts[0], parts[1], "--out", tmp_path / "merged"], capsys)
    assert code == 2 and "not complete" in err
    assert run_cli(["certify-merge", *parts, "--out", tmp_path / "merged"], capsys)[0] == 0
    assert rows_without_time(tmp_path / "merged" / "certify.tsv") == rows_without_time(single / "certify.tsv")
    merged = json.loads((tmp_path / "merged" / "summary.json").read_text())
    alone = json.loads((single / "summary.json").read_text())
    for key in ("certified_accuracy", "smoothed_clean_accuracy", "abstention_rate", "average_certified_radius"):
        assert merged[key] == alone[key], key


def test_resume_skips_done_rows_and_tolerates_a_cut_line(tiny_classifier_dir, tmp_path, capsys):
    args = ["certify", "--classifier", tiny_classifier_dir, *FAST, "--max-index", "5"]
    full = tmp_path / "full"
    assert run_cli([*args, "--out", full], capsys)[0] == 0
    out = tmp_path / "cut"
    assert run_cli([*args, "--out", out], capsys)[0] == 0
    lines = (out / "certify.tsv").read_text().splitlines(keepends=True)
    (out / "certify.tsv").write_text("".join(lines[:3]) + lines[3][:5])  # header, 2 rows, a row cut mid-line
    (out / "summary.json").unlink()
    status = json.loads((out / "certify.status.json").read_text())  # as if the first process had been killed
    status["sessions"][0].update(state="running", wall_seconds=7.0)
    (out / "certify.status.json").write_text(json.dumps(status))
    code, stdout, _ = run_cli([*args, "--out", out], capsys)
    assert code == 0 and "3 images done now, 2 done before" in stdout
    timing = json.loads((out / "summary.json").read_text())["timing"]
    assert timing["sessions"] == 2 and timing["wall_seconds"] >= 7.0
    assert "1 session(s) killed before closing" in timing["note"] and "may fall short" in timing["note"]
    assert (out / "certify.tsv").read_text().splitlines(keepends=True)[:3] == lines[:3]  # kept as they were
    assert rows_without_time(out / "certify.tsv") == rows_without_time(full / "certify.tsv")
    assert len(read_rows(out / "certify.tsv", "certify")) == 5
    code, stdout, _ = run_cli([*args, "--out", out], capsys)  # nothing left to do
    assert code == 0 and "0 images done now, 5 done before" in stdout


def test_predict_writes_cohen_columns(tiny_classifier_dir, tmp_path, capsys):
    out = tmp_path / "predict"
    code, stdout, _ = run_cli(["predict", "--classifier", tiny_classifier_dir, "--sigma", "0.25", "--n", "40",
                               "--batch-size", "64", "--device", "cpu", "--skip", "200", "--out", out], capsys)
    assert code == 0
    lines = (out / "predict.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["idx", "label", "predict", "correct", "time"]
    assert [int(line.split("\t")[0]) for line in lines[1:]] == list(range(0, 2004, 200))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["task"] == "predict" and summary["images"] == 11 and (out / "report.md").is_file()


@pytest.mark.parametrize(("extra", "message"), [
    (["--sigma", "0"], "--sigma: must be > 0"),
    (["--n0", "0"], "--n0: must be >= 1"),
    (["--n", "0"], "--n: must be >= 1"),
    (["--alpha", "1.5"], "--alpha: must lie strictly between 0 and 1"),
    (["--shard", "3/3"], "0 <= I < K"),
])
def test_bad_flags_exit_2_naming_the_problem(tiny_classifier_dir, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as stop:
        main(["certify", "--classifier", str(tiny_classifier_dir), *FAST, *extra, "--out", str(tmp_path / "bad")])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]  # argparse: usage line, then the error


@pytest.mark.parametrize(("extra", "message"), [
    (["--max-index", "5000"], "--max-index 5000 is past the end of mnist10k's test split (2004 images)"),
    (["--indices", "2003-2004"], "index 2004 is past the end"),
])
def test_bad_data_choice_exits_2_with_one_line(tiny_classifier_dir, tmp_path, capsys, extra, message):
    code, _, err = run_cli(["certify", "--classifier", tiny_classifier_dir, *FAST, *extra, "--out", tmp_path / "bad"],
                           capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err


def test_refuses_to_mix_runs_and_unfit_models(tiny_classifier_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["certify", "--classifier", tiny_classifier_dir, *FAST, "--max-index", "2", "--out", out],
                   capsys)[0] == 0
    code, _, err = run_cli(["certify", "--classifier", tiny_classifier_dir, *FAST, "--max-index", "2", "--n", "41",
                            "--out", out], capsys)
    assert code == 2 and "different settings" in err and "n 40 there, 41 now" in err
    assert len(err.strip().splitlines()) == 1

    from training.checkpoint import save_checkpoint
    from training.models import build_model

    kwargs = {"in_channels": 1, "num_classes": 3}
    three = save_checkpoint(tmp_path / "three", build_model("cnn28", **kwargs),
                            {"kind": "classifier", "architecture": "cnn28", "arch_kwargs": kwargs, "num_classes": 3,
                             "input_shape": [1, 28, 28]})
    code, _, err = run_cli(["certify", "--classifier", three, *FAST, "--out", tmp_path / "three_run"], capsys)
    assert code == 2 and "10 classes" in err and "3" in err


# ----------------------------------------------------------------------------------------------- adaptive runs

ADAPTIVE = ["--sigma", "0.25", "--n0", "8", "--n-max", "300", "--batch-size", "64", "--alpha", "0.01",
            "--device", "cpu"]


def rows_but_time(path):
    """Rows with the time column (the 6th) left out: adaptive rows end with ``samples``."""
    return [[f for i, f in enumerate(line.split("\t")) if i != 5] for line in path.read_text().splitlines()]


def test_cli_choices_match_the_sequential_library():
    import certify.cli
    import certify.confidence
    import certify.sequential

    assert certify.cli.SEQUENTIAL_METHODS == certify.confidence.METHODS
    assert certify.cli.DEFAULT_SEQUENTIAL == certify.confidence.DEFAULT_METHOD
    assert certify.cli.DEFAULT_TOLERANCE == certify.sequential.DEFAULT_TOLERANCE


@pytest.mark.parametrize("mode", [["--radius", "0.1"], ["--adaptive", "--tolerance", "0.05"]])
def test_adaptive_runs_write_samples_resume_shard_merge_and_overlay(tiny_classifier_dir, tmp_path, capsys, mode):
    common = ["certify", "--classifier", tiny_classifier_dir, *ADAPTIVE, *mode, "--indices", "0-2,300,900"]
    single = tmp_path / "single"
    code, stdout, _ = run_cli([*common, "--out", single], capsys)
    assert code == 0 and "fewer" in stdout
    lines = (single / "certify.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["idx", "label", "predict", "radius", "correct", "time", "samples"]
    rows = read_rows(single / "certify.tsv", "certify")
    assert len(rows) == 5 and all(8 + 16 <= r.samples <= 8 + 300 for r in rows)  # n0 8, first look 16
    if mode[0] == "--radius":
        # every row keeps the selected class; certified rows have radius R, the others 0 (no abstention in decide)
        assert all(r.radius in (0.1, 0.0) and r.prediction != -1 for r in rows)
    summary = json.loads((single / "summary.json").read_text())
    samples = [int(line.split("\t")[6]) for line in lines[1:]]
    assert summary["samples_per_image"]["mean"] == pytest.approx(sum(samples) / 5)
    assert summary["saving_vs_fixed_n"] == pytest.approx((8 + 300) / (sum(samples) / 5))
    assert summary["mode"] == ("decide" if mode[0] == "--radius" else "estimate")
    assert summary["settings"]["n"] == 300 and "anytime-valid" in summary["guarantee"]
    assert "samples per image" in (single / "report.md").read_text()
    if mode[0] == "--radius":
        # decide measures one radius: no clean accuracy, ACR or abstention is claimed, only the three outcomes at R
        certified = [r for r in rows if r.radius > 0]
        assert summary["smoothed_clean_accuracy"] is None and summary["average_certified_radius"] is None
        assert summary["abstention_rate"] is None and summary["wrong_rate"] is None
        assert [row["radius"] for row in summary["certified_accuracy"]] == [0.1]
        assert summary["decide"]["certified_correct"] == pytest.approx(sum(r.correct for r in certified) / 5)
        assert summary["decide"]["not_certified"] == pytest.approx((5 - len(certified)) / 5)
        assert summary["decide"]["certified_wrong"] == pytest.approx(sum(not r.correct for r in certified) / 5)
        assert "not certified" in (single / "report.md").read_text() and "not certified" in stdout
        assert "clean accuracy (" not in (single / "report.md").read_text()
        fixed = tmp_path / "fixed_for_decide"
        assert run_cli(["certify", "--classifier", tiny_classifier_dir, *FAST, "--max-index", "3", "--out", fixed,
                        "--new-test"], capsys)[0] == 0  # images 0-2 again, fixed n beside the ladder: another test
        assert run_cli(["report", single, fixed, "--out", tmp_path / "overlay_decide"], capsys)[0] == 0
        overlay = json.loads((tmp_path / "overlay_decide" / "overlay.json").read_text())
        decide_row = next(row for row in overlay if "decide R = 0.1" in row["label"])
        assert {r for r, v in decide_row["certified_accuracy"].items() if v is not None} == {"0.10"}
        assert all(v is not None for v in overlay[1]["certified_accuracy"].values())
        assert "'-' marks the radii" in (tmp_path / "overlay_decide" / "report.md").read_text()
        return  # the bookkeeping below is the same for both modes

    # resume after a cut line, and shards in separate folders merged: the same rows as one run
    cut = tmp_path / "cut"
    assert run_cli([*common, "--out", cut], capsys)[0] == 0
    text = (cut / "certify.tsv").read_text().splitlines(keepends=True)
    (cut / "certify.tsv").write_text("".join(text[:3]) + text[3][:6])
    code, stdout, _ = run_cli([*common, "--out", cut], capsys)
    assert code == 0 and "2 done before" in stdout
    assert rows_but_time(cut / "certify.tsv") == rows_but_time(single / "certify.tsv")
    parts = [tmp_path / f"part{i}" for i in range(2)]
    for i, part in enumerate(parts):
        assert run_cli([*common, "--out", part, "--shard", f"{i}/2"], capsys)[0] == 0
    assert run_cli(["certify-merge", *parts, "--out", tmp_path / "merged"], capsys)[0] == 0
    assert rows_but_time(tmp_path / "merged" / "certify.tsv") == rows_but_time(single / "certify.tsv")

    # an adaptive run is a run of its own: other modes and fixed n are refused in its folder
    code, _, err = run_cli(["certify", "--classifier", tiny_classifier_dir, *FAST, "--indices", "0-2,300,900",
                            "--out", single], capsys)
    assert code == 2 and "different settings" in err
    fixed = tmp_path / "fixed"
    assert run_cli(["certify", "--classifier", tiny_classifier_dir, *FAST, "--max-index", "3", "--out", fixed,
                    "--new-test"], capsys)[0] == 0  # images 0-2 again, fixed n beside the ladder: another test
    assert run_cli(["report", single, fixed, "--out", tmp_path / "overlay"], capsys)[0] == 0
    assert (tmp_path / "overlay" / "certified_accuracy.png").is_file()


def test_audit_reads_an_adaptive_run(tiny_classifier_dir, tmp_path, capsys):
    out = tmp_path / "decide"
    assert run_cli(["certify", "--classifier", tiny_classifier_dir, *ADAPTIVE, "--radius", "0.1",
                    "--indices", "0-3", "--out", out], capsys)[0] == 0
    certified = [r for r in read_rows(out / "certify.tsv", "certify") if r.prediction != -1 and r.radius > 0]
    code, stdout, _ = run_cli(["audit", out, "--steps", "2", "--m", "2", "--n", "50", "--device", "cpu"], capsys)
    assert code in (0, 1), stdout  # 1 would be a failed audit: a finding, not a read error
    result = json.loads((out / "audit.json").read_text())
    assert result["audited"] == len(certified) == result["certified_in_run"] and result["rows_in_run"] == 4


@pytest.mark.parametrize(("extra", "message"), [
    (["--n-max", "100"], "--n-max and --tolerance are for adaptive certification"),
    (["--radius", "0.5", "--tolerance", "0.1"], "--tolerance is for --adaptive"),
])
def test_adaptive_flag_errors_exit_2(tiny_classifier_dir, tmp_path, capsys, extra, message):
    code, _, err = run_cli(["certify", "--classifier", tiny_classifier_dir, *FAST, *extra, "--out", tmp_path / "bad"],
                           capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_radius_and_adaptive_are_exclusive(tiny_classifier_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["certify", "--classifier", str(tiny_classifier_dir), *FAST, "--radius", "0.5", "--adaptive",
              "--out", str(tmp_path / "bad")])
    assert stop.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_a_killed_session_keeps_its_time_and_is_marked_interrupted(tmp_path, monkeypatch):
    """A process killed outright never closes its session: its wall time up to the last heartbeat stays in the
    status file, the next session marks it interrupted, and the summary says the sum may fall short."""
    from certify import rundir
    from certify.rundir import RunDirectory, RunSettings

    settings = RunSettings(task="certify", classifier="c", classifier_sha256="0", denoiser=None, denoiser_sha256=None,
                           dataset="mnist10k", data_root=None, split_seed=0, split="test", split_fingerprint="f",
                           split_size=10, sigma=0.25, n0=8, n=40, alpha=0.01, batch=64, skip=1, max=None,
                           indices=None, seed=0, shards=1, pack=1, noise_device="cpu", memory_format="contiguous")
    cpu = torch.device("cpu")
    killed = RunDirectory(tmp_path, settings, None)
    killed.open()
    killed.start_session(cpu, "CPU A")
    monkeypatch.setattr(rundir, "HEARTBEAT_SECONDS", 0.0)
    killed.heartbeat(rows=3)  # ... and then the process is killed: update_status never runs
    status = json.loads((tmp_path / "certify.status.json").read_text())
    assert status["rows"] == 3 and status["complete"] is False
    [first] = status["sessions"]
    assert first["state"] == "running" and first["hardware"] == "CPU A" and first["wall_seconds"] >= 0.0
    resumed = RunDirectory(tmp_path, settings, None)
    resumed.start_session(cpu, "CPU B")
    resumed.update_status(cpu, "CPU B", 12.5, rows=10, complete=True)
    status = json.loads((tmp_path / "certify.status.json").read_text())
    assert [s["state"] for s in status["sessions"]] == ["interrupted", "finished"]
    assert [s["wall_seconds"] for s in status["sessions"]] == [first["wall_seconds"], 12.5]
    assert status["rows"] == 10 and status["complete"] is True


def test_another_seed_or_alpha_is_a_new_test_refused_without_new_test(tmp_path):
    """Each certification with a fresh seed spends alpha again: the run directory refuses it unless asked, and
    keeps the earlier test's files and its seed and alpha on record."""
    import dataclasses
    import json

    from certify.rundir import RunDirectory, RunSettings

    settings = RunSettings(task="certify", classifier="c", classifier_sha256="x", denoiser=None, denoiser_sha256=None,
                           dataset="mnist10k", data_root=None, split_seed=0, split="test", split_fingerprint="f",
                           split_size=10, sigma=0.25, n0=10, n=100, alpha=0.001, batch=8, skip=1, max=None,
                           indices=None, seed=0, shards=1, pack=1, noise_device="cpu", memory_format="auto")
    out = tmp_path / "run"
    RunDirectory(out, settings, None).open()
    (out / "certify.tsv").write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\t0.1\n")
    for change in ({"seed": 1}, {"alpha": 0.01}):
        with pytest.raises(UserError, match="new test that spends its alpha again.*--new-test"):
            RunDirectory(out, dataclasses.replace(settings, **change), None).open()
    with pytest.raises(UserError, match="different settings"):  # other changes: another --out, as before
        RunDirectory(out, dataclasses.replace(settings, n=200), None, new_test=True).open()
    RunDirectory(out, dataclasses.replace(settings, seed=1), None, new_test=True).open()
    assert json.loads((out / "settings.json").read_text())["seed"] == 1 and not (out / "certify.tsv").exists()
    assert (out / "tests" / "1" / "certify.tsv").exists()
    assert json.loads((out / "tests.json").read_text()) == [{"folder": "tests/1", "seed": 0, "alpha": 0.001,
                                                             "task": "certify"}]
    RunDirectory(out, dataclasses.replace(settings, seed=1), None, new_test=True).open()  # resumes the new test
    assert len(json.loads((out / "tests.json").read_text())) == 1
