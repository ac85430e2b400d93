"""Every command's common input errors: one line, exit status 2, in well under a second, without importing torch.

The cases run in one fresh interpreter (tests/_input_errors_probe.py below, through ``-c``): each is timed in CPU
seconds of that process (robust to other jobs on the machine, unlike wall time), and the interpreter reports
whether torch, SciPy or BentoML were imported by any of them. Serving's own refusals (a busy port, a model
directory of another format version) follow.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from transdenoiser.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
LIMIT_CPU_SECONDS = 1.0
HEAVY = ("torch", "scipy", "bentoml")

PROBE = "HEAVY = " + repr(HEAVY) + r"""
import contextlib, io, json, sys, time
from transdenoiser.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    start = time.process_time()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    results.append({"argv": argv, "code": code, "cpu": time.process_time() - start, "stderr": err.getvalue()})
print(json.dumps({"results": results, "heavy": [m for m in HEAVY if m in sys.modules]}))
"""


def cases(tmp: Path) -> list[list[str]]:
    missing, ro = str(tmp / "missing"), "/proc/transdenoiser-out"
    blocked = tmp / "a_file"
    blocked.write_text("x")
    return [
        ["data", "--dataset", "nosuch"],
        ["data", "--dataset", "mnist", "--data-root", missing],
        ["pretrain", "--epochs", "0"],
        ["pretrain", "--out", str(blocked / "classifier")],
        ["import-classifier", "--arch", "resnet18", "--weights", missing, "--out", str(tmp / "o")],
        ["train", "--config", missing + ".toml", "--out", str(tmp / "o")],
        ["train", "--classifier", missing, "--arm", "sepdp", "--out", str(tmp / "o")],
        ["train", "--classifier", str(tmp), "--arm", "sepdp", "--out", ro],
        ["privacy", "--sample-rate", "2", "--noise-multiplier", "1", "--steps", "10"],
        ["certify", "--classifier", missing, "--sigma", "0.25", "--out", str(tmp / "o")],
        ["certify", "--classifier", str(tmp), "--sigma", "-1"],
        ["certify", "--classifier", str(tmp), "--sigma", "0.25", "--out", ro],
        ["certify", "--classifier", str(tmp), "--sigma", "0.25", "--n-max", "100", "--out", str(tmp / "o")],
        ["certify", "--classifier", str(tmp), "--sigma", "0.25", "--radius", "0.5", "--tolerance", "0.1",
         "--out", str(tmp / "o")],
        ["predict", "--classifier", missing, "--sigma", "0.25"],
        ["certify-merge", missing],
        ["report", missing, "--out", str(tmp / "o")],
        ["attack", "--classifier", missing, "--attack", "pgd", "--eps", "0.5", "--out", str(tmp / "o")],
        ["audit", missing],
        ["serve", "--model-dir", missing],
        ["serve", "--model-dir", str(tmp)],
        ["serve", "--port", "70000"],
        ["bundle", "--classifier", missing, "--out", str(tmp / "o")],
        ["bundle", "--classifier", str(tmp), "--out", str(blocked)],
        ["bundle", "--classifier", str(tmp), "--out", str(tmp / "o")],  # no --sigma and no denoiser to take it from
        ["demo", "--out", str(blocked / "demo")],
        ["train-head", "--classifier", missing, "--epsilon", "1", "--out", str(tmp / "o")],
        ["privacy-audit", "--classifier", missing, "--arm", "sepdp", "--out", str(tmp / "o")],
        ["baseline-certify", "--model", missing, "--out", str(tmp / "o")],
    ]


def test_every_commands_input_errors_are_one_line_status_2_within_a_second_without_torch(tmp_path):
    from transdenoiser.cli import COMMANDS

    argvs = cases(tmp_path)
    assert {argv[0] for argv in argvs} == set(COMMANDS)  # every command has its common errors here
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    for result in found["results"]:
        where = " ".join(result["argv"])
        assert result["code"] == 2, (where, result)
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in result["stderr"], (where, lines)
        assert result["cpu"] < LIMIT_CPU_SECONDS, (where, result["cpu"])
    assert found["heavy"] == [], f"an input error imported {found['heavy']}"


def test_serve_refuses_a_busy_port_and_another_format_version_in_one_line(random_classifier_dir, tmp_path, capsys):
    import shutil

    from serving.bundle import write_model_dir
    from tests.conftest import serve_dry_run
    from transdenoiser.cli import main

    model_dir = write_model_dir(tmp_path / "model", random_classifier_dir, sigma=0.25)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--model-dir", str(model_dir), "--port", str(port), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"port {port} on 127.0.0.1 is already in use" in err[0], err
    assert main(["serve", "--model-dir", str(model_dir), "--host", "192.0.2.1", "--dry-run"]) == 2  # TEST-NET-1
    assert "not an address of this machine" in capsys.readouterr().err

    other = tmp_path / "other_version"
    shutil.copytree(model_dir, other)
    meta_path = other / "classifier" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["format_version"] = 999
    meta_path.write_text(json.dumps(meta))
    assert main(serve_dry_run(other)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "format version 999" in err[0], err


@pytest.mark.parametrize("kind", ["file in the way", "read-only"])
def test_unwritable_output_folders_are_refused_before_anything_runs(tmp_path, capsys, kind):
    from transdenoiser.errors import UserError
    from transdenoiser.preflight import check_output_folder

    if kind == "file in the way":
        (tmp_path / "f").write_text("x")
        out, match = tmp_path / "f" / "run", "is a file"
    else:
        out, match = Path("/proc/transdenoiser-run"), "cannot be written"
    with pytest.raises(UserError, match=match):
        check_output_folder(out)
    check_output_folder(tmp_path / "new" / "run")  # a folder that can be made is fine, and nothing is left behind
    assert list(tmp_path.glob("**/.transdenoiser-write-check-*")) == [] and not (tmp_path / "new").exists()


@pytest.mark.parametrize("command", ["train", "privacy-audit"])
def test_denoiser_architecture_names_are_not_taken_for_paths(command, tmp_path):
    """``train`` and ``privacy-audit`` take ``--denoiser`` as an architecture name (``tiny``), not a checkpoint."""
    from types import SimpleNamespace

    from transdenoiser.preflight import check_paths

    args = SimpleNamespace(denoiser="tiny", out=tmp_path / "out")
    check_paths(command, args)  # no error: "tiny" is not looked up on disk
    with pytest.raises(UserError, match="--denoiser tiny: no such directory"):
        check_paths("certify", args)
