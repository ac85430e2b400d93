"""scripts/gpu_check.sh --quick: every computing command on CPU at the smallest sizes, then the certify benchmark,
as one script, so that the GPU check cannot rot between the times a GPU is lent. The slowest single test of the
suite (about 2 minutes of 2 CPU cores); the real GPU run is `make gpu-check`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_check_quick_runs_every_command_on_cpu(tmp_path):
    out = tmp_path / "gpu_check"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--quick", "--out", str(out)], env=env,
                            capture_output=True, text=True, timeout=900)
    record = json.loads((out / "gpu_check.json").read_text())
    # a failed step's whole traceback (a server's exit carries its log's tail) says why, not only its first line
    failed = {s["step"]: (s.get("error"), s.get("traceback")) for s in record["steps"] if s["status"] != "ok"}
    assert result.returncode == 0 and not failed, (failed, result.stderr[-3000:])
    steps = {s["step"]: s for s in record["steps"]}
    assert record["quick"] and record["device"] == "cpu" and len(steps) >= 17
    for name in ("pretrain (cnn28, mnist10k)", "train --arm transdenoiser, tiny denoiser, S_min computed",
                 "certify decide R=0.25", "certify estimate", "predict", "audit (certify fixed n run)",
                 "privacy-audit (whitebox, tiny)", "train-head (opera)", "bundle (bf16)"):
        assert name in steps, name
    assert steps["certify fixed n, bf16"]["figures"]["precision"] == "bfloat16"
    served = steps["serve: one certify, decide and estimate request"]["figures"]
    assert served["runtime"]["precision"] == "bf16" and {"certify", "decide", "estimate"} <= set(served)
    bench = steps["bench_certify mnist (fp32, bf16), tiny"]["figures"]["mnist"]
    assert set(bench["samples_per_second"]) >= {"cohen@1000", "ours:fp32", "ours:bf16"}
    table = result.stdout
    assert "steps ok" in table and "gpu_check.json" in table


def test_benchmark_figures_are_found_at_any_depth_of_their_json(tmp_path):
    """The check's table shows each benchmark's named figures wherever its JSON keeps them (a top-level dict, as
    bench_serving's speedup, or deep in rows, as bench_training's examples per second)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from gpu_check import _json_figures
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"speedup": {"16": 1.6}, "rows": [{"sepdp": {"median_examples_per_second": 9.0}}],
                                "other": 3}))
    assert _json_figures(0, path, ("speedup", "median_examples_per_second")) == {
        "speedup": {"16": 1.6}, "rows.0.sepdp.median_examples_per_second": 9.0}
    with pytest.raises(RuntimeError, match="exited 2"):
        _json_figures(2, path, ("speedup",))


def test_two_runs_in_one_checkout_each_start_from_a_clean_folder_of_their_own(tmp_path, monkeypatch):
    """A second run with the same --out (a second GPU loan in one session) must not meet the first run's outputs:
    train, privacy-audit and bundle refuse an --out that holds a checkpoint or a model directory (6 of 17 steps
    failed so). Each run gets a new folder under --out, every step's output path lies inside it, and
    OUT/gpu_check.json is the latest run's summary (OUT/latest its folder). The commands themselves are recorded
    here, not run (the slow test above runs them)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    calls: list[list[str]] = []

    def record(check, *argv):
        calls[-1].append([str(a) for a in argv])
        return {}

    monkeypatch.setattr(gpu_check.Check, "cli", record)
    for name in ("summary_figures", "_audit", "_serve"):
        monkeypatch.setattr(gpu_check, name, lambda *a, **k: {})
    base = tmp_path / "gpu_check"
    for _ in range(2):
        calls.append([])
        assert gpu_check.main(["--quick", "--skip-benchmarks", "--out", str(base)]) == 0
    outs = [[Path(argv[argv.index("--out") + 1]) for argv in argvs if "--out" in argv] for argvs in calls]
    assert len(outs[0]) >= 10 and len(set(outs[0])) == len(outs[0])
    assert not set(outs[0]) & set(outs[1]), "the second run writes where the first one did"
    runs = [out[0].parent for out in outs]  # each run's folder: where its first step (pretrain) writes
    assert runs[0] != runs[1] and runs[0].parent == runs[1].parent == base
    for run, argvs in zip(runs, calls, strict=True):  # every path a command is given (--out, --classifier...)
        paths = [Path(a) for argv in argvs for a in argv if a.startswith(str(base))]
        assert all(run in path.parents for path in paths), paths
    summary = json.loads((base / "gpu_check.json").read_text())  # the stable path: the latest run's summary
    assert summary["run_dir"] == str(runs[1]) and not summary["failed"]
    assert json.loads((runs[0] / "gpu_check.json").read_text())["run_dir"] == str(runs[0])
    assert (base / "latest").resolve() == runs[1].resolve()
