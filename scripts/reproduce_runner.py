"""scripts/reproduce.py's steps: running one ``transdenoiser`` command (in this process or its own), skipping what
is complete, resuming what was cut, and recording every step in steps.jsonl."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from reproduce_common import REPO, Settings, flag_value, read_json


def images_done(out: Path) -> int | None:
    """How many images an interrupted certification under ``out`` had finished (its rows file), or None when
    ``out`` holds no certification rows (a training, an attack)."""
    for name, header in (("certify.tsv", 1), ("baseline_certify.tsv", 1), ("baseline_certify.rows.jsonl", 0)):
        path = out / name
        if path.is_file():
            return max(0, sum(1 for line in path.read_text().splitlines() if line.strip()) - header)
    return None


class Runner:
    """Runs steps (``transdenoiser`` commands), skips finished ones and records each step's time and work."""

    def __init__(self, settings: Settings, dry_run: bool = False):
        self.s = settings
        self.dry_run = dry_run
        self.failures: list[str] = []
        self.skipped: list[str] = []
        self.busy: list[str] = []
        self.planned: list[dict] = []
        self.answers: dict[str, bool] = {}
        self.log = settings.out / "steps.jsonl"
        self.commit: str | None = None  # the checkout's commit, looked up at the first step run
        self.hardware: str | None = None  # where the steps run (CPU model, cores, torch threads), likewise

    def step(self, name: str, argv: list[str], done: bool, work: dict) -> bool:
        """Run one command unless ``done``; True if its output is there afterwards. A step already planned or run
        in this invocation (one every seed needs, e.g. the pre-training) is not repeated: its answer stands."""
        if name in self.answers:
            return self.answers[name]
        self.answers[name] = answer = self._step(name, argv, done, work)
        return answer

    def _step(self, name: str, argv: list[str], done: bool, work: dict) -> bool:
        if self.dry_run:
            self.planned.append({"name": name, "argv": argv, "work": work, "done": done})
            return True  # plan the steps that depend on this one too
        if done:
            print(f"done: {name}", flush=True)
            return True
        holder = busy(flag_value(argv, "--out"))
        if holder is not None:  # another worker on the same --out runs this step now: not a failure, not redone
            print(f"busy: {name}: {holder}; skipped here", flush=True)
            self.busy.append(name)
            return False
        print("+ transdenoiser " + shlex.join(argv), flush=True)
        out = flag_value(argv, "--out")
        resumed = out is not None and Path(out).is_dir() and any(Path(out).iterdir())  # it goes on from there
        before = images_done(Path(out)) if resumed else None  # a resumed certification's share of its work
        started = time.perf_counter()
        self.commit = self.commit or checkout_commit()
        self.hardware = self.hardware or step_hardware(flag_value(argv, "--device"))
        code = self._call(argv)
        seconds = time.perf_counter() - started
        self.s.out.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as f:
            f.write(json.dumps({"name": name, "argv": argv, "exit": code, "seconds": round(seconds, 2),
                                "work": work, "mode": self.s.mode, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                "commit": self.commit, "hardware": self.hardware, "resumed": resumed,
                                **({"images_before": before} if before is not None else {})}) + "\n")
        if code != 0:
            print(f"FAILED (exit {code}): {name}", flush=True)
            self.failures.append(name)
            return False
        return True

    def _call(self, argv: list[str]) -> int:
        if self.s.subprocess:
            exe = Path(sys.executable).with_name("transdenoiser")
            command = [str(exe)] if exe.exists() else [sys.executable, "-m", "transdenoiser.cli"]
            return subprocess.call(command + argv)
        from transdenoiser.cli import main

        saved = sys.argv
        sys.argv = ["transdenoiser", *argv]  # the commands record the command line they were given
        try:
            return main(argv)
        except SystemExit as exc:  # argparse flag errors
            return int(exc.code or 0) if not isinstance(exc.code, str) else 2
        finally:
            sys.argv = saved

    def skip(self, message: str) -> None:
        if message not in self.skipped:
            self.skipped.append(message)
            if not self.dry_run:
                print(message, flush=True)


def checkout_commit() -> str:
    """The commit of the code that runs the steps (``+modified`` if the checkout has uncommitted changes to
    tracked files), or ``unknown`` outside a git checkout: steps.jsonl names it beside every step."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+modified" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def step_hardware(device: str | None) -> str:
    """What the steps run on (``transdenoiser.runtime.hardware_description``: CPU model, cores and torch threads, or
    the GPU): steps.jsonl names it beside every step, and the tables name the hardware of their steps."""
    import torch

    from transdenoiser.runtime import hardware_description

    try:
        return hardware_description(torch.device(device or "cpu"))
    except (RuntimeError, AssertionError):
        return hardware_description(torch.device("cpu"))


def busy(out: str | None) -> str | None:
    """None if no other process holds the run lock of the output folder ``out`` (transdenoiser.lock), else what
    the lock says of its holder. Two workers that share one --out (each with its own --runs) so never write into
    one run: the second skips the step the first is running, and either finds it done on its next pass."""
    if out is None:
        return None
    from transdenoiser.errors import UserError
    from transdenoiser.lock import RunLock

    probe = RunLock(out, purpose="scripts/reproduce.sh (probe)")
    try:
        probe.acquire()
    except UserError as exc:
        return str(exc).split(";")[0]
    probe.release()
    return None


def available_arms() -> set[str]:
    """The arms ``transdenoiser train --help`` lists."""
    from transdenoiser.cli import main

    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        main(["train", "--help"])
    found = re.search(r"--arm \{([^}]*)\}", text.getvalue())
    return set(found.group(1).split(",")) if found else set()


def available_commands() -> set[str]:
    from transdenoiser.cli import COMMANDS

    return set(COMMANDS)


def checkpoint_complete(path: Path) -> bool:
    meta = read_json(path / "metadata.json")
    return bool(meta) and meta.get("complete", True) is True and (path / "weights.safetensors").exists()


def set_aside_interrupted(run_dir: Path) -> Path | None:
    """Move an interrupted training of an arm that cannot resume (the baselines: SecureSGD saves after every epoch
    and cannot continue, StoBatch keeps no noise state) out of the way, to RUN.interrupted (or .interrupted-2, ...),
    so that the step can train again; nothing is deleted. None, and nothing moved, unless ``run_dir`` holds a
    checkpoint marked incomplete."""
    meta = read_json(run_dir / "metadata.json")
    if meta is None or meta.get("complete") is not False:
        return None
    aside, number = run_dir.with_name(run_dir.name + ".interrupted"), 1
    while aside.exists():
        number += 1
        aside = run_dir.with_name(f"{run_dir.name}.interrupted-{number}")
    run_dir.rename(aside)
    return aside


def split_sizes(dataset: str, data_root: str | None) -> dict[str, int]:
    from training.datasets import load_dataset

    data = load_dataset(dataset, data_root)
    return {name: len(data.split(name)) for name in ("public", "private", "test")}


def evenly_spaced_indices(size: int, count: int) -> str:
    count = min(count, size)
    return ",".join(str(int(i * size / count)) for i in range(count))
