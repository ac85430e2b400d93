"""``transdenoiser report``: one overlay of several run folders, certify runs (certify.tsv) and attack runs
(attack.json) alike; each kind is drawn by its own report code (:mod:`certify.overlay`, :mod:`certify.attacks.report`).
A ``baseline-certify`` run is given alone: its report.md is rendered again (:mod:`certify.baseline_report`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from certify.attacks.report import overlay_attack_runs
from certify.baseline_report import is_baseline_run, render_baseline_run
from certify.overlay import overlay_certify_runs
from certify.report import SUMMARY_FILE
from transdenoiser.errors import UserError


def overlay_runs(run_dirs: Sequence[Path], out_dir: Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """One figure and one table over several runs: certify runs (certify.tsv) and attack runs (attack.json).

    ``warn(line)`` receives a warning when the certify runs differ in dataset or sigma (also written into report.md).
    One ``baseline-certify`` run: its report.md rendered again into ``out_dir`` (which may be the run's own folder).
    """
    run_dirs = [Path(d) for d in run_dirs]
    baselines = [d for d in run_dirs if d.is_dir() and is_baseline_run(d)]
    if baselines:
        if len(run_dirs) > 1:
            raise UserError(f"{baselines[0]} is a baseline-certify run: give it alone ('report' renders one "
                            "baseline-certify run's report.md again; it is not overlaid with other runs)")
        from transdenoiser.lock import RunLock

        with RunLock(out_dir, purpose="report"):  # not while a run writes there
            return [render_baseline_run(baselines[0], out_dir)]
    if any(out_dir.resolve() == d.resolve() for d in run_dirs):
        raise UserError(f"--out {out_dir} is one of the runs: the overlay would overwrite its report; choose another")
    resolved = [d.resolve() for d in run_dirs]
    if len(set(resolved)) != len(resolved):
        raise UserError("a run folder is listed twice")
    certify_dirs, attack_dirs = [], []
    for run_dir in run_dirs:
        if (run_dir / "certify.tsv").is_file() or (run_dir / SUMMARY_FILE).is_file():
            certify_dirs.append(run_dir)
        elif (run_dir / "attack.json").is_file():
            attack_dirs.append(run_dir)
        elif run_dir.is_dir():
            raise UserError(f"{run_dir} holds neither certify.tsv nor attack.json: not a certify or attack run")
        else:
            raise UserError(f"{run_dir}: no such run directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if certify_dirs:
        written += overlay_certify_runs(certify_dirs, out_dir, warn)
    if attack_dirs:
        written += overlay_attack_runs(attack_dirs, out_dir)
    return written
