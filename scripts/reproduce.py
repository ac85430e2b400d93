"""Regenerate the comparisons of the TransDenoiser paper's Section 3.2 (Figures 2, 3, 4 and 7) with the product's
own commands, on mnist10k, full Fashion-MNIST and (given the data) CIFAR-10. Run through scripts/reproduce.sh.

Every step is one ``transdenoiser`` command (printed as ``+ transdenoiser ...`` before it runs), run in this process
by default (``--subprocess`` runs each as its own process; the results are the same); every step is skipped when its
output is complete and resumes where a checkpointed step stopped. A step that fails is reported and the others go
on; the exit status is 1 if any failed. Training arms that ``transdenoiser train --help`` does not list are reported
as ``skipped: arm X not available`` and run as soon as they exist.

Outputs, per data set D under --out: D/classifier, D/train/RUN_sSEED (checkpoints), D/certify/RUN_sSEED,
D/attack/RUN_sSEED/ATTACK, D/eps/ARM_epsE_sSEED (Figure 4's trainings and their attack at bound 2.0),
D/figures/{figure2,figure3,figure4,figure7}.png and D/tables.md, D/results.json; OUT/steps.jsonl records every
step's command, wall seconds and amount of work (``--estimate-from`` turns it into a wall-time estimate).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The paper's arms: (run name, training arm, input/smoothing sigma). Figure 2a compares transdenoiser with the
# baselines, Figure 2b with the ablations.
ARM_RUNS = (
    ("nodp", "nodp", 0.25),
    ("sepdp", "sepdp", 0.25),
    ("transdenoiser", "transdenoiser", 0.25),
    ("transdenoiser_sigma010", "transdenoiser", 0.1),
    ("securesgd-prt", "securesgd-prt", 0.25),
    ("securesgd-sct", "securesgd-sct", 0.25),
    ("stobatch", "stobatch", 0.25),
)
LABELS = {"nodp": "TransDenoiser_nodp", "sepdp": "TransDenoiser_sepdp", "transdenoiser": "TransDenoiser",
          "transdenoiser_sigma010": "TransDenoiser_inp_0.1", "securesgd-prt": "SecureSGD_prt",
          "securesgd-sct": "SecureSGD_sct", "stobatch": "StoBatch", "none": "no denoiser"}
OWN_CERTIFICATE = {"securesgd-prt": "Phan et al.'s bound", "securesgd-sct": "Phan et al.'s bound",
                   "stobatch": "StoBatch's own certificate"}  # transdenoiser baseline-certify's phan_* columns
BASELINE_RUNS = ("transdenoiser", "securesgd-prt", "securesgd-sct", "stobatch")
ABLATION_RUNS = ("transdenoiser", "nodp", "sepdp", "transdenoiser_sigma010")
DP_ARMS = ("sepdp", "transdenoiser", "securesgd-prt", "securesgd-sct", "stobatch")  # Figure 4's epsilon sweep
BASELINE_ARMS = ("securesgd-prt", "securesgd-sct", "stobatch")
FROM_SCRATCH_ARMS = ("securesgd-sct", "stobatch")  # they write a classifier, not a denoiser
ATTACKS = ("fgsm", "ifgsm", "mim", "pgd")
ATTACK_NAMES = {"fgsm": "FGSM", "ifgsm": "I-FGSM", "mim": "MIM", "pgd": "PGD (MadryEtAl)"}
PAPER_EPSILON = 1.0  # the (1.0, 1e-5)-DP of Figures 2, 3 and 7; configs/*_sigma025.toml's target
# Algorithm 1 needs xi_low <= xi_up; above epsilon 1 the calibrated xi_up can fall below the configs' 0.5 (0.483 at
# epsilon 8 on Fashion-MNIST's 30,000), so the transdenoiser arm's runs there use this line-16 threshold instead.
# With S_min = 0 (every step of the paper's denoiser) the input multiplier is 0, below either value: no effect.
XI_LOW_ABOVE_PAPER_EPSILON = 0.25
FIGURE4_BOUND = 2.0  # Figure 4's attack bound (L2)
# What a run can be limited to (--stages); trainings run wherever a chosen stage needs their checkpoint.
STAGES = {"figure2": "certify every arm (and the classifier alone) by randomized smoothing",
          "baseline-certify": "the baselines' own certificate (Phan et al.)",
          "attacks": "every arm under the four attacks at every bound (Figures 3 and 7)",
          "figure4": "the DP arms trained at each epsilon and attacked at bound 2 (Figure 4)"}
CONFIGS = {  # data set -> (config at sigma 0.25, config at sigma 0.1)
    "mnist10k": ("configs/mnist_sigma025.toml", "configs/mnist_sigma010.toml"),
    "mnist": ("configs/mnist_sigma025.toml", "configs/mnist_sigma010.toml"),
    "fashion-mnist": ("configs/paper_fashion_sigma025.toml", "configs/paper_fashion_sigma010.toml"),
    "cifar10": ("configs/paper_cifar10_sigma025.toml", "configs/paper_cifar10_sigma010.toml"),
}


@dataclass
class Settings:
    datasets: list[str]
    out: Path
    data_root: str | None = None
    device: str = "cpu"
    seeds: int = 1
    only_seeds: tuple[int, ...] | None = None  # run only these training seeds (None: every seed below ``seeds``)
    images: int = 500               # certified test images, evenly spread
    n0: int = 100
    n: int | None = None            # fixed n; None: adaptive (estimate) mode with n_max
    n_max: int = 10_000
    alpha: float = 0.001
    attack_images: int = 500
    attack_eps: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)
    attacks: tuple[str, ...] = ATTACKS
    figure4_attacks: tuple[str, ...] = ATTACKS
    epsilons: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
    threat: str = "classifier"
    attack_steps: int = 10
    attack_n: int = 100
    runs: tuple[str, ...] = tuple(name for name, _, _ in ARM_RUNS)
    figure4_arms: tuple[str, ...] = DP_ARMS
    pretrain_epochs: int | None = None
    train_extra: list[str] = field(default_factory=list)  # e.g. --epochs 1 in --quick
    subprocess: bool = False
    mode: str = "full"
    stages: tuple[str, ...] = tuple(STAGES)

    @property
    def run_seeds(self) -> tuple[int, ...]:
        """The training seeds whose steps this run plans, in order."""
        return self.only_seeds if self.only_seeds is not None else tuple(range(self.seeds))


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


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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


def flag_value(argv: list[str], flag: str, default=None):
    return argv[argv.index(flag) + 1] if flag in argv else default


def reproduce_dataset(runner: Runner, dataset: str, arms: set[str], commands: set[str], seeds: list[int]) -> None:
    """Plan or run one data set's steps for the training ``seeds`` (the steps that take no seed, once)."""
    s = runner.s
    root = s.out / dataset
    common = ["--dataset", dataset] + (["--data-root", s.data_root] if s.data_root else [])
    device = ["--device", s.device]
    sizes = split_sizes(dataset, s.data_root)
    cfg025, cfg010 = (str(REPO / c) for c in CONFIGS.get(dataset, CONFIGS["mnist10k"]))

    clf = root / "classifier"
    epochs = ["--epochs", str(s.pretrain_epochs)] if s.pretrain_epochs else []
    if not runner.step(f"{dataset}: pretrain", ["pretrain", *common, *device, *epochs, "--out", str(clf)],
                       checkpoint_complete(clf),
                       {"kind": "pretrain", "dataset": dataset, "images": sizes["public"],
                        "epochs": s.pretrain_epochs or 8}):
        return

    def train(run_dir: Path, arm: str, sigma: float, seed: int, epsilon: float | None, label: str) -> bool:
        if arm not in arms:
            runner.skip(f"skipped: arm {arm} not available (`transdenoiser train --help` does not list it)")
            return False
        meta = read_json(run_dir / "metadata.json")
        if arm in BASELINE_ARMS and not runner.dry_run:
            aside = set_aside_interrupted(run_dir)
            if aside is not None:
                print(f"note: {run_dir} held an interrupted {arm} training, which cannot resume: moved to {aside}; "
                      "training again from the start", flush=True)
                meta = None
        if meta is not None and meta.get("complete") is False and meta.get("kind") == "denoiser" \
                and arm not in BASELINE_ARMS:
            argv = ["train", "--out", str(run_dir), "--resume", *device]
        elif arm in BASELINE_ARMS:  # their own settings; the paper's shared ones as flags (the configs' other
            # keys are Algorithm 1's, which the baselines refuse)
            # StoBatch's noise is its own (Laplace, in the auto-encoder and the first layer): it refuses --sigma
            argv = ["train", "--arm", arm, *(["--sigma", f"{sigma:g}"] if arm != "stobatch" else []),
                    "--target-epsilon", f"{PAPER_EPSILON if epsilon is None else epsilon:g}",
                    "--delta", "1e-5", "--clip-norm", "1", "--batch-size", "64", "--epochs", "5",
                    "--classifier", str(clf), "--out", str(run_dir), *common, *device, "--seed", str(seed),
                    *s.train_extra]
        else:
            argv = ["train", "--config", cfg010 if sigma == 0.1 else cfg025, "--arm", arm, "--classifier", str(clf),
                    "--out", str(run_dir), *common, *device, "--seed", str(seed), *s.train_extra]
            if epsilon is not None:
                argv += ["--target-epsilon", f"{epsilon:g}"]
                if arm == "transdenoiser" and epsilon > PAPER_EPSILON:
                    argv += ["--xi-low", f"{XI_LOW_ABOVE_PAPER_EPSILON:g}"]
            if arm == "nodp":
                argv += ["--optimizer", "adam", "--lr", "1e-3"]  # as docs/RESULTS.md section 2
        examples = int(flag_value(s.train_extra, "--train-examples", 0)) or sizes["private"]
        return runner.step(f"{dataset}: train {label}", argv, checkpoint_complete(run_dir),
                           {"kind": "train", "arm": arm, "dataset": dataset, "examples": examples,
                            "epochs": int(flag_value(s.train_extra, "--epochs", 5))})

    def models(run_dir: Path, arm: str) -> list[str]:
        """--classifier/--denoiser for a trained run: classifiers trained from scratch stand alone."""
        meta = read_json(run_dir / "metadata.json") or {}
        if meta.get("kind", "classifier" if arm in FROM_SCRATCH_ARMS else "denoiser") == "classifier":
            return ["--classifier", str(run_dir)]
        return ["--classifier", str(clf), "--denoiser", str(run_dir)]

    def attack(run_dir: Path, arm: str, out: Path, sigma: float, name: str, eps: tuple[float, ...], seed: int) -> None:
        argv = ["attack", *models(run_dir, arm), *common, *device,
                "--attack", name, "--norm", "l2", "--eps", ",".join(f"{e:g}" for e in eps), "--threat", s.threat,
                "--sigma", f"{sigma:g}", "--steps", str(s.attack_steps), "--n", str(s.attack_n),
                "--alpha", f"{s.alpha:g}", "--max-images", str(s.attack_images), "--seed", str(seed),
                "--out", str(out)]
        runner.step(f"{dataset}: attack {out.relative_to(root)}", argv, (out / "attack.json").exists(),
                    {"kind": "attack", "attack": name, "threat": s.threat, "dataset": dataset,
                     "images": min(s.attack_images, sizes["test"]), "eps": len(eps), "steps": s.attack_steps,
                     "n": s.attack_n, "denoiser": arm not in FROM_SCRATCH_ARMS})

    indices = evenly_spaced_indices(sizes["test"], s.images)
    n_images = min(s.images, sizes["test"])
    estimation = (["--n", str(s.n)] if s.n else ["--adaptive", "--n-max", str(s.n_max)])

    def certify(model_args: list[str], out: Path, sigma: float, seed: int) -> None:
        argv = ["certify", *model_args, *common, *device, "--sigma", f"{sigma:g}", "--n0", str(s.n0), *estimation,
                "--alpha", f"{s.alpha:g}", "--indices", indices, "--seed", str(seed), "--out", str(out)]
        runner.step(f"{dataset}: certify {out.name}", argv, (out / "summary.json").exists(),
                    {"kind": "certify", "dataset": dataset, "images": n_images,
                     "samples_per_image": s.n0 + (s.n or s.n_max), "adaptive": not s.n})

    # Figures 2, 3 and 7: every arm at the paper's setting, certified and attacked.
    stages = set(s.stages)
    if "figure2" in stages:  # the classifier alone, at each seed's certify seed: every seed's rows pair with it
        for seed in seeds:
            certify(["--classifier", str(clf)], root / "certify" / f"none_s{seed}", 0.25, seed)
    for run, arm, sigma in ARM_RUNS:
        if run not in s.runs or not stages & {"figure2", "baseline-certify", "attacks"}:
            continue
        for seed in seeds:
            run_dir = root / "train" / f"{run}_s{seed}"
            if not train(run_dir, arm, sigma, seed, None, f"{run} seed {seed}"):
                continue
            if "figure2" in stages:
                certify(models(run_dir, arm), root / "certify" / f"{run}_s{seed}", sigma, seed)
            if "baseline-certify" in commands and arm in BASELINE_ARMS and "baseline-certify" in stages:
                out = root / "baseline_certify" / f"{run}_s{seed}"
                skip = max(1, sizes["test"] // n_images)
                runner.step(f"{dataset}: baseline-certify {run} seed {seed}",
                            ["baseline-certify", "--model", str(run_dir),
                             *([] if arm in FROM_SCRATCH_ARMS else ["--classifier", str(clf)]), *common, *device,
                             "--sigma", f"{sigma:g}", "--skip", str(skip), "--max-images", str(n_images),
                             "--n0", str(s.n0), "--n", str(s.n or s.n_max), "--alpha", f"{s.alpha:g}",
                             "--seed", str(seed), "--out", str(out)],
                            (out / "summary.json").exists(),
                            {"kind": "baseline-certify", "arm": run, "dataset": dataset, "images": n_images,
                             "samples_per_image": s.n0 + (s.n or s.n_max)})
    for run, arm, sigma in ARM_RUNS:  # attacks after every arm's certification: Figure 2 comes first
        if run not in s.runs or arm not in arms or "attacks" not in stages:
            continue
        for seed in seeds:
            run_dir = root / "train" / f"{run}_s{seed}"
            if runner.dry_run or checkpoint_complete(run_dir):
                for name in s.attacks:
                    attack(run_dir, arm, root / "attack" / f"{run}_s{seed}" / name, sigma, name, s.attack_eps, seed)

    # Figure 4: the DP arms trained at each epsilon, attacked at L2 bound 2.0 (epsilon 1.0: the runs above).
    if "figure4" not in stages:
        return
    for arm in DP_ARMS:
        if arm not in s.runs or arm not in s.figure4_arms:
            continue
        for epsilon in s.epsilons:
            for seed in seeds:
                if epsilon == PAPER_EPSILON:
                    continue  # the paper-setting run above is the epsilon-1.0 point
                run_dir = root / "eps" / f"{arm}_eps{epsilon:g}_s{seed}"
                if not train(run_dir, arm, 0.25, seed, epsilon, f"{arm} epsilon {epsilon:g} seed {seed}"):
                    continue
                for name in s.figure4_attacks:
                    attack(run_dir, arm, run_dir / f"attack_{name}", 0.25, name, (FIGURE4_BOUND,), seed)
        if PAPER_EPSILON in s.epsilons:
            for seed in seeds:
                run_dir = root / "train" / f"{arm}_s{seed}"
                if arm in arms and (runner.dry_run or checkpoint_complete(run_dir)):
                    for name in s.figure4_attacks:
                        if name not in s.attacks or FIGURE4_BOUND not in s.attack_eps:
                            attack(run_dir, arm, root / "eps" / f"{arm}_eps1_s{seed}_attack_{name}", 0.25, name,
                                   (FIGURE4_BOUND,), seed)
    if "nodp" in s.runs:  # Figure 4's no-privacy reference line
        for seed in seeds:
            run_dir = root / "train" / f"nodp_s{seed}"
            if "nodp" in arms and (runner.dry_run or checkpoint_complete(run_dir)):
                for name in s.figure4_attacks:
                    if name not in s.attacks or FIGURE4_BOUND not in s.attack_eps:
                        attack(run_dir, "nodp", root / "eps" / f"nodp_s{seed}_attack_{name}", 0.25, name,
                               (FIGURE4_BOUND,), seed)


# ---------------------------------------------------------------------------------------------------- results


def read_certify_rows(tsv: Path, *prefixes: str) -> list[list[dict]]:
    """Each image's radius and correctness from a certificate TSV, once per column prefix: ``""`` for certify.tsv's
    ``radius``/``correct``, ``"phan_"`` and ``"smooth_"`` for baseline_certify.tsv's two certificates."""
    lines = tsv.read_text().splitlines()
    header = lines[0].split("\t")
    values = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
    return [[{"radius": float(v[f"{prefix}radius"]), "correct": int(v[f"{prefix}correct"])} for v in values]
            for prefix in prefixes or ("",)]


def certified_accuracy(rows: list[dict], radius: float) -> float:
    """:func:`certify.report.certified_accuracy` of rows read by :func:`read_certify_rows` (abstentions count wrong)."""
    from certify.report import certified_accuracy as of_rows

    return of_rows(rows, radius)


def accuracy_by_radius(rows_per_seed: list[list[dict]], radii: list[float]) -> dict:
    """Certified accuracy at each radius: mean and range over the seeds' rows."""
    return {f"{r:g}": mean_and_range([certified_accuracy(rows, r) for rows in rows_per_seed]) for r in radii}


def mean_and_range(values: list[float]) -> dict:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return {"mean": None, "low": None, "high": None, "seeds": 0}
    return {"mean": sum(values) / len(values), "low": min(values), "high": max(values), "seeds": len(values)}


def attack_row(record: dict, eps: float) -> dict | None:
    """The row of an attack.json at L2 bound ``eps`` (0: the clean prediction), or None when it has no such bound."""
    if eps == 0:
        return record["clean"]
    return next((row for row in record["results"] if abs(row["eps"] - eps) < 1e-9), None)


def attack_accuracy(record: dict, eps: float) -> float | None:
    row = attack_row(record, eps)
    return None if row is None else row["smoothed_accuracy"]


def epsilons_of(meta: dict) -> dict:
    """Every epsilon the checkpoint's privacy report names (RDP upper bound), by guarantee name."""
    privacy = meta.get("privacy") or {}
    found = {}
    for guarantee in privacy.get("guarantees", []) or []:
        epsilon = guarantee.get("epsilon") or {}
        if isinstance(epsilon, dict) and epsilon.get("rdp") is not None:
            found[guarantee.get("name", "?")] = epsilon["rdp"]
    return found


def seed_folders(parent: Path, run: str) -> dict[int, Path]:
    """Training seed -> folder, for the folders RUN_sSEED under ``parent``."""
    found = {}
    for folder in parent.glob(f"{run}_s*"):
        match = re.fullmatch(rf"{re.escape(run)}_s(\d+)", folder.name)
        if match:
            found[int(match.group(1))] = folder
    return found


def paired_to_sepdp(root: Path, runs: list[str], radii: list[float]) -> dict:
    """Each run's certified accuracy minus sepdp's, paired over the same images at each training seed both have
    certified (the certify seed is the training seed, so each image's noise draws are shared too), with a 95%
    paired-bootstrap interval over images (certify.compare). A run's entry is its first common seed's, with
    ``per_seed`` (every common seed's) and, from two seeds on, ``between_seeds``: the mean of the seeds'
    differences and their min and max. A run on other images gets a note instead."""
    from certify.compare import paired_difference
    from certify.runner import read_rows
    from transdenoiser.errors import UserError

    def seeds(run: str) -> dict[int, Path]:
        return {seed: folder for seed, folder in seed_folders(root / "certify", run).items()
                if (folder / "summary.json").exists()}

    @functools.cache
    def rows(folder: Path) -> list:  # sepdp's rows are read once per seed, not once per run
        return read_rows(folder / "certify.tsv", "certify")

    base = seeds("sepdp")
    paired: dict = {}
    for run in runs:
        mine = seeds(run) if run != "sepdp" else {}
        per_seed = []
        for seed in sorted(set(mine) & set(base)):
            try:
                difference = paired_difference(rows(mine[seed]), rows(base[seed]), radii)
            except UserError as exc:
                per_seed.append({"seed": seed, "note": str(exc)})
                continue
            per_seed.append({"seed": seed, **difference.as_dict()})
        if not per_seed:
            continue
        paired[run] = {**per_seed[0], "per_seed": per_seed}
        measured = [entry for entry in per_seed if "note" not in entry]
        if len(measured) > 1:
            columns = [mean_and_range(list(column))
                       for column in zip(*(entry["difference"] for entry in measured), strict=True)]
            paired[run]["between_seeds"] = {
                "seeds": [entry["seed"] for entry in measured], "radii": list(radii),
                **{key: [column[key] for column in columns] for key in ("mean", "low", "high")}}
    return paired


def attack_paired_to_sepdp(root: Path, runs: list[str], attacks: tuple[str, ...]) -> dict:
    """Each run's smoothed accuracy under each attack minus sepdp's, at every bound (0: clean), paired over the same
    images at the first training seed both have attacked, with a 95% paired-bootstrap interval over images. Only
    runs whose attack.json has each image's outcome (``smoothed_correct``) on sepdp's images take part."""
    from certify.compare import paired_outcomes

    def outcomes(run: str, name: str) -> dict[int, dict]:
        found = {}
        for seed, folder in seed_folders(root / "attack", run).items():
            record = read_json(folder / name / "attack.json")
            rows = [record["clean"], *record["results"]] if record else []
            if rows and all("smoothed_correct" in row for row in rows):
                found[seed] = {"indices": record["image_indices"], "bounds": [0.0] + [
                    row["eps"] for row in record["results"]], "correct": [row["smoothed_correct"] for row in rows]}
        return found

    paired: dict = {}
    for name in attacks:
        base = outcomes("sepdp", name)
        for run in runs:
            mine = outcomes(run, name) if run != "sepdp" else {}
            common = sorted(seed for seed in set(mine) & set(base) if mine[seed]["indices"] == base[seed]["indices"]
                            and mine[seed]["bounds"] == base[seed]["bounds"])
            if not common:
                continue
            seed = common[0]
            ours, theirs = (list(zip(*entry[seed]["correct"], strict=True)) for entry in (mine, base))
            entry = paired_outcomes(ours, theirs, mine[seed]["bounds"]).as_dict()
            entry["bounds"] = entry.pop("radii")  # the attack's L2 bounds (0: clean)
            paired.setdefault(run, {})[name] = {"seed": seed, **entry}
    return paired


def collect(root: Path, settings: Settings) -> dict:
    """Everything the figures and tables show, read back from the runs' files."""
    result: dict = {"dataset": root.name, "certify": {}, "attack": {}, "figure4": {}, "training": {}}
    radii = [0.0, 0.25, 0.5, 0.75, 1.0]
    for run in ("none", *settings.runs):
        per_seed = sorted((root / "certify").glob(f"{run}_s*")) if (root / "certify").exists() else []
        per_seed = [p for p in per_seed if re.fullmatch(rf"{re.escape(run)}_s\d+", p.name)
                    and (p / "summary.json").exists()]
        if not per_seed:
            continue
        rows = [read_certify_rows(p / "certify.tsv")[0] for p in per_seed]
        summaries = [read_json(p / "summary.json") or {} for p in per_seed]
        result["certify"][run] = {
            "images": [len(r) for r in rows],
            "sigma": summaries[0].get("sigma"),
            "certified_accuracy": accuracy_by_radius(rows, radii),
            "acr": mean_and_range([s.get("average_certified_radius") for s in summaries]),
            "abstention": mean_and_range([s.get("abstention_rate") for s in summaries]),
            "runs": [str(p) for p in per_seed], "rows": rows,
        }
        train_dirs = [root / "train" / p.name for p in per_seed]
        metas = [read_json(d / "metadata.json") or {} for d in train_dirs if (d / "metadata.json").exists()]
        if metas:
            accuracies = [(m.get("metrics") or [{}])[-1].get("accuracy_denoised") for m in metas]
            result["training"][run] = {"accuracy_denoised": mean_and_range(accuracies),
                                       "epsilons": [epsilons_of(m) for m in metas]}
    result["paired"] = paired_to_sepdp(root, [run for run in ("none", *settings.runs) if run in result["certify"]],
                                       radii)
    for run in settings.runs:
        per_seed = sorted((root / "baseline_certify").glob(f"{run}_s*")) if (root / "baseline_certify").exists() else []
        # per seed: the baseline's own certificate, randomized smoothing of the same randomised model
        both = [read_certify_rows(folder / "baseline_certify.tsv", "phan_", "smooth_") for folder in per_seed
                if (folder / "baseline_certify.tsv").exists()]
        if both:
            rows, smoothed = [own for own, _ in both], [smooth for _, smooth in both]
            result.setdefault("baseline_certify", {})[run] = {
                "images": [len(r) for r in rows], "rows": rows, "certificate": OWN_CERTIFICATE.get(run, ""),
                "certified_accuracy": accuracy_by_radius(rows, radii),
                "smoothing_certified_accuracy": accuracy_by_radius(smoothed, radii)}
    for run in ("none", *settings.runs):
        base = root / "attack"
        if not base.exists():
            continue
        for name in settings.attacks:
            records = [read_json(p / name / "attack.json") for p in sorted(base.glob(f"{run}_s*"))
                       if re.fullmatch(rf"{re.escape(run)}_s\d+", p.name)]
            records = [r for r in records if r]
            if not records:
                continue
            eps = [0.0, *sorted({row["eps"] for r in records for row in r["results"]})]
            result["attack"].setdefault(run, {})[name] = {
                f"{e:g}": mean_and_range([attack_accuracy(r, e) for r in records]) for e in eps}
            result["attack"][run][name]["images"] = records[0]["num_images"]
    if (root / "attack").exists():
        result["attack_paired"] = attack_paired_to_sepdp(root, ["none", *settings.runs], settings.attacks)
    figure4_point = functools.lru_cache(maxsize=None)(functools.partial(figure4_record, root))  # read once each
    for arm in (*DP_ARMS, "nodp"):
        if arm not in settings.runs or (arm != "nodp" and arm not in settings.figure4_arms):
            continue
        for name in settings.figure4_attacks:
            points = {}
            for epsilon in settings.epsilons if arm != "nodp" else (None,):
                records = [figure4_point(arm, epsilon, seed, name) for seed in range(settings.seeds)]
                values = [attack_accuracy(record, FIGURE4_BOUND) for record in records if record]
                if values:
                    points["none" if epsilon is None else f"{epsilon:g}"] = mean_and_range(values)
            if points:
                result["figure4"].setdefault(arm, {})[name] = points
    if result["figure4"]:
        result["figure4_paired"] = figure4_paired_to_sepdp(root, settings, figure4_point)
    return result


def figure4_record(root: Path, arm: str, epsilon: float | None, seed: int, name: str) -> dict | None:
    """The attack.json behind one point of Figure 4 (``arm`` at ``epsilon``, training seed ``seed``, attack
    ``name``), or None: at the paper's epsilon (and for nodp, ``epsilon`` None) the paper-setting run's attack,
    else the run trained with ``--target-epsilon epsilon``; only a record that has the bound FIGURE4_BOUND."""
    if epsilon is None or epsilon == PAPER_EPSILON:
        candidates = [root / "attack" / f"{arm}_s{seed}" / name, root / "eps" / f"{arm}_eps1_s{seed}_attack_{name}",
                      root / "eps" / f"{arm}_s{seed}_attack_{name}"]
    else:
        candidates = [root / "eps" / f"{arm}_eps{epsilon:g}_s{seed}" / f"attack_{name}"]
    for candidate in candidates:
        record = read_json(candidate / "attack.json")
        if record and attack_accuracy(record, FIGURE4_BOUND) is not None:
            return record
    return None


def figure4_paired_to_sepdp(root: Path, settings: Settings, point=None) -> dict:
    """Figure 4's error bars: each DP arm's accuracy at bound FIGURE4_BOUND minus sepdp's at the same epsilon,
    paired over the same images at one training seed (the first at which both have a point), with a 95%
    paired-bootstrap interval over images; one column per epsilon both have. Only points whose attack.json records
    each image's outcome (``smoothed_correct``) take part. ``point(arm, epsilon, seed, attack)`` finds a point's
    attack.json (default: ``figure4_record`` under ``root``; ``collect`` passes the lookup it has read them with)."""
    from certify.compare import paired_outcomes

    point = point or functools.partial(figure4_record, root)

    def outcome(arm: str, epsilon: float, seed: int, name: str) -> tuple[list, list] | None:
        record = point(arm, epsilon, seed, name)
        row = attack_row(record, FIGURE4_BOUND) if record else None
        if row is None or "smoothed_correct" not in row:
            return None
        return list(record["image_indices"]), list(row["smoothed_correct"])

    def pair(arm: str, name: str, seed: int) -> dict | None:
        """``arm`` minus sepdp at every epsilon where both ran on the same images as the first epsilon taken."""
        columns, ours, theirs, images = [], [], [], None
        for epsilon in settings.epsilons:
            mine, base = outcome(arm, epsilon, seed, name), outcome("sepdp", epsilon, seed, name)
            if mine and base and mine[0] == base[0] and (not columns or mine[0] == images):
                images = mine[0]  # every column pairs the same images, so the bootstrap resamples them
                columns.append(epsilon)
                ours.append(mine[1])
                theirs.append(base[1])
        if not columns:
            return None
        entry = paired_outcomes(list(zip(*ours, strict=True)), list(zip(*theirs, strict=True)), columns).as_dict()
        entry["epsilons"] = entry.pop("radii")
        return {"seed": seed, **entry}

    paired: dict = {}
    for arm in DP_ARMS:
        if arm == "sepdp" or arm not in settings.runs or arm not in settings.figure4_arms:
            continue
        for name in settings.figure4_attacks:
            entry = next(filter(None, (pair(arm, name, seed) for seed in range(settings.seeds))), None)
            if entry:
                paired.setdefault(arm, {})[name] = entry
    return paired


def percent(entry: dict | None) -> str:
    if not entry or entry.get("mean") is None:
        return "-"
    text = f"{100 * entry['mean']:.1f}"
    if entry["seeds"] > 1:
        text += f" ({100 * entry['low']:.1f}-{100 * entry['high']:.1f})"
    return text


def number(value) -> str:
    try:
        return f"{float(value):.3g}"
    except (TypeError, ValueError):
        return str(value)


def write_tables(result: dict, path: Path, settings: Settings, header: str) -> None:
    from certify.compare import points_cell, points_cells

    lines = [f"# Reproduction of the TransDenoiser paper's Section 3.2 on {result['dataset']}", "", header, ""]
    most = max([len(entry["images"]) for entry in result["certify"].values()] + [settings.seeds])
    seeds_note = (f"Each cell is the mean over the training seeds that have run, up to {most} (min-max in "
                  "brackets when more than one)."
                  if most > 1 else "One training seed per arm.")
    lines += ["## Figure 2: certified accuracy (%) against L2 radius", "", seeds_note, "",
              "| run | images | r = 0 | 0.25 | 0.5 | 0.75 | 1.0 | ACR | abstained |",
              "|---|---|---|---|---|---|---|---|---|"]
    for run, entry in result["certify"].items():
        acc = entry["certified_accuracy"]
        acr = entry["acr"]["mean"]
        lines.append(f"| {LABELS.get(run, run)} (sigma {entry['sigma']:g}) | {entry['images'][0]} | "
                     + " | ".join(percent(acc[k]) for k in ("0", "0.25", "0.5", "0.75", "1"))
                     + f" | {acr:.3f} | {percent(entry['abstention'])} |")
    if result.get("paired"):
        lines += ["", "Each run minus sepdp in certified accuracy (points), paired over the same images at each "
                  "training seed both have certified (each image's noise draws shared), with a 95% paired-bootstrap "
                  "interval over images (10,000 resamples): an interval that includes 0 means these images do not "
                  "tell the two apart. It says nothing of the variation between training seeds.", "",
                  "| run - sepdp | seed | images | r = 0 | 0.25 | 0.5 | 0.75 | 1.0 |",
                  "|---|---|---|---|---|---|---|---|"]
        for run, first in result["paired"].items():
            for entry in first["per_seed"]:
                if "note" in entry:
                    lines.append(f"| {LABELS.get(run, run)} | {entry['seed']} | - | {entry['note']} | | | | |")
                    continue
                lines.append(f"| {LABELS.get(run, run)} | {entry['seed']} | {entry['images']} | "
                             + " | ".join(points_cells(entry)) + " |")
        between = {run: entry["between_seeds"] for run, entry in result["paired"].items() if "between_seeds" in entry}
        if between:
            lines += ["", "Between training seeds: the mean of the paired differences above over the seeds, [min, "
                      "max] over the seeds (points). The spread is that of the training seeds together with each "
                      "seed's certification noise; with a few seeds it is a range, not a confidence interval.", "",
                      "| run - sepdp | seeds | r = 0 | 0.25 | 0.5 | 0.75 | 1.0 |", "|---|---|---|---|---|---|---|"]
            for run, entry in between.items():
                cells = [points_cell(*cell) for cell in zip(entry["mean"], entry["low"], entry["high"], strict=True)]
                lines.append(f"| {LABELS.get(run, run)} | {', '.join(map(str, entry['seeds']))} | "
                             + " | ".join(cells) + " |")
    if result.get("baseline_certify"):
        lines += ["", "The baselines' own certificates (`transdenoiser baseline-certify`, same images: Phan et al. "
                  "2019's bound for SecureSGD, StoBatch's own for StoBatch), each beside randomized smoothing of the "
                  "same randomised model (abstentions count as wrong):",
                  "", "| run | images | r = 0 | 0.25 | 0.5 | 0.75 | 1.0 |", "|---|---|---|---|---|---|---|"]
        for run, entry in result["baseline_certify"].items():
            for name, acc in ((entry["certificate"], entry["certified_accuracy"]),
                              ("randomized smoothing of the randomised model",
                               entry["smoothing_certified_accuracy"])):
                lines.append(f"| {LABELS.get(run, run)}, {name} | {entry['images'][0]} | "
                             + " | ".join(percent(acc[k]) for k in ("0", "0.25", "0.5", "0.75", "1")) + " |")
    if result["training"]:
        lines += ["", "## The trained arms", "",
                  "| run | classifier accuracy on g(x + noise) (%) | epsilon at delta 1e-5 (RDP), per analysis "
                  "named in the report |",
                  "|---|---|---|"]
        for run, entry in result["training"].items():
            eps = "; ".join(", ".join(f"{k} {number(v)}" for k, v in e.items()) for e in entry["epsilons"][:1])
            lines.append(f"| {LABELS.get(run, run)} | {percent(entry['accuracy_denoised'])} | {eps or 'none'} |")
    for figure, names in (("7", ("fgsm", "ifgsm")), ("3", ("mim", "pgd"))):
        present = [n for n in names if any(n in a for a in result["attack"].values())]
        if not present:
            continue
        lines += ["", f"## Figure {figure}: accuracy (%) of the smoothed prediction under attack, by L2 bound", "",
                  f"Threat `{settings.threat}`; abstain = wrong; bound 0 = clean examples.", ""]
        for name in present:
            eps_keys = sorted({k for a in result["attack"].values() if name in a for k in a[name] if k != "images"},
                              key=float)
            lines += [f"**{ATTACK_NAMES[name]}**", "", "| run | images | " + " | ".join(eps_keys) + " |",
                      "|---|---|" + "---|" * len(eps_keys)]
            for run, per_attack in result["attack"].items():
                if name in per_attack:
                    lines.append(f"| {LABELS.get(run, run)} | {per_attack[name]['images']} | "
                                 + " | ".join(percent(per_attack[name].get(k)) for k in eps_keys) + " |")
            lines.append("")
            paired = {run: entry[name] for run, entry in (result.get("attack_paired") or {}).items() if name in entry}
            if paired:
                bounds = next(iter(paired.values()))["bounds"]
                lines += [f"{ATTACK_NAMES[name]}, each run minus sepdp (points; paired over the same images at one "
                          "training seed, 95% paired-bootstrap interval over images):", "",
                          "| run - sepdp | seed | images | " + " | ".join(f"{b:g}" for b in bounds) + " |",
                          "|---|---|---|" + "---|" * len(bounds)]
                for run, entry in paired.items():
                    lines.append(f"| {LABELS.get(run, run)} | {entry['seed']} | {entry['images']} | "
                                 + " | ".join(points_cells(entry)) + " |")
                lines.append("")
    if result["figure4"]:
        lines += ["", f"## Figure 4: accuracy (%) under attack at L2 bound {FIGURE4_BOUND:g} against epsilon", "",
                  "Each DP arm trained with `--target-epsilon E` (delta 1e-5); nodp has no epsilon.", ""]
        for name in settings.figure4_attacks:
            keys = [f"{e:g}" for e in settings.epsilons]
            lines += [f"**{ATTACK_NAMES[name]}**", "", "| arm | " + " | ".join(f"eps {k}" for k in keys) + " |",
                      "|---|" + "---|" * len(keys)]
            for arm, per_attack in result["figure4"].items():
                if name in per_attack:
                    points = per_attack[name]
                    cells = [percent(points.get("none")) for _ in keys] if arm == "nodp" else \
                        [percent(points.get(k)) for k in keys]
                    lines.append(f"| {LABELS.get(arm, arm)} | " + " | ".join(cells) + " |")
            lines.append("")
            paired = {arm: entry[name] for arm, entry in (result.get("figure4_paired") or {}).items()
                      if name in entry}
            if paired:
                lines += [f"{ATTACK_NAMES[name]} at bound {FIGURE4_BOUND:g}, each arm minus sepdp at the same epsilon "
                          "(points; paired over the same images at one training seed, 95% paired-bootstrap interval "
                          "over images):", "", "| arm - sepdp | seed | images | "
                          + " | ".join(f"eps {k}" for k in keys) + " |", "|---|---|---|" + "---|" * len(keys)]
                for arm, entry in paired.items():
                    by_epsilon = dict(zip((f"{e:g}" for e in entry["epsilons"]), points_cells(entry), strict=True))
                    lines.append(f"| {LABELS.get(arm, arm)} | {entry['seed']} | {entry['images']} | "
                                 + " | ".join(by_epsilon.get(k, "-") for k in keys) + " |")
                lines.append("")
    path.write_text("\n".join(lines) + "\n")


def plot_figures(result: dict, folder: Path, settings: Settings) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    dataset = result["dataset"]
    if result["certify"]:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        top = max((r["radius"] for e in result["certify"].values() for rows in e["rows"] for r in rows), default=1.0)
        grid = [top * 1.05 * i / 200 for i in range(201)]
        for ax, group, title in ((axes[0], BASELINE_RUNS, "(a) TransDenoiser and baselines"),
                                 (axes[1], ("none", *ABLATION_RUNS), "(b) ablations")):
            for run in group:
                entry = result["certify"].get(run)
                if not entry:
                    continue
                curves = [[certified_accuracy(rows, r) for r in grid] for rows in entry["rows"]]
                mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(grid))]
                line, = ax.plot(grid, mean, label=f"{LABELS.get(run, run)} (sigma {entry['sigma']:g})",
                                linestyle="--" if run == "none" else "-")
                own = result.get("baseline_certify", {}).get(run)
                if own and group is BASELINE_RUNS:
                    own_curves = [[certified_accuracy(rows, r) for r in grid] for rows in own["rows"]]
                    ax.plot(grid, [sum(c[i] for c in own_curves) / len(own_curves) for i in range(len(grid))],
                            color=line.get_color(), linestyle=":",
                            label=f"{LABELS.get(run, run)}: {own['certificate']}")
                if len(curves) > 1:
                    ax.fill_between(grid, [min(c[i] for c in curves) for i in range(len(grid))],
                                    [max(c[i] for c in curves) for i in range(len(grid))],
                                    color=line.get_color(), alpha=0.2)
            ax.set_title(title)
            ax.set_xlabel("L2 radius")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        axes[0].set_ylabel("certified accuracy")
        fig.suptitle(f"Figure 2 ({dataset}): certified accuracy against L2 radius")
        fig.tight_layout()
        written.append(folder / "figure2.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    for figure, names in (("7", ("fgsm", "ifgsm")), ("3", ("mim", "pgd"))):
        names = [n for n in names if any(n in a for a in result["attack"].values())]
        if not names:
            continue
        fig, axes = plt.subplots(len(names), 2, figsize=(11, 3.6 * len(names)), sharey=True, squeeze=False)
        for row, name in enumerate(names):
            for col, (group, title) in enumerate(((BASELINE_RUNS, "baselines"), (ABLATION_RUNS, "ablations"))):
                ax = axes[row][col]
                clean = None
                for run in group:
                    entry = result["attack"].get(run, {}).get(name)
                    if not entry:
                        continue
                    keys = sorted((k for k in entry if k not in ("images", "0")), key=float)
                    xs = [float(k) for k in keys]
                    means = [entry[k]["mean"] for k in keys]
                    line, = ax.plot(xs, means, marker="o", label=LABELS.get(run, run))
                    if entry[keys[0]]["seeds"] > 1:
                        ax.fill_between(xs, [entry[k]["low"] for k in keys], [entry[k]["high"] for k in keys],
                                        color=line.get_color(), alpha=0.2)
                    if run == "transdenoiser":
                        clean = (xs, entry["0"]["mean"])
                if clean:
                    ax.plot(clean[0], [clean[1]] * len(clean[0]), color="black", linestyle=":",
                            label="Clean examples (TransDenoiser)")
                ax.set_title(f"{ATTACK_NAMES[name]}: {title}")
                ax.set_xlabel("attack L2 bound")
                ax.grid(alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=8)
            axes[row][0].set_ylabel("accuracy (smoothed)")
        fig.suptitle(f"Figure {figure} ({dataset}): accuracy under attack (threat {settings.threat})")
        fig.tight_layout()
        written.append(folder / f"figure{figure}.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    if result["figure4"]:
        names = [n for n in settings.figure4_attacks if any(n in a for a in result["figure4"].values())]
        fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), sharey=True, squeeze=False)
        for ax, name in zip(axes[0], names, strict=False):
            for arm, per_attack in result["figure4"].items():
                points = per_attack.get(name)
                if not points:
                    continue
                if arm == "nodp":
                    value = points["none"]["mean"]
                    ax.axhline(value, color="grey", linestyle="--", label=LABELS["nodp"])
                    continue
                keys = sorted(points, key=float)
                xs = [float(k) for k in keys]
                line, = ax.plot(xs, [points[k]["mean"] for k in keys], marker="o", label=LABELS.get(arm, arm))
                if any(points[k]["seeds"] > 1 for k in keys):
                    ax.fill_between(xs, [points[k]["low"] for k in keys], [points[k]["high"] for k in keys],
                                    color=line.get_color(), alpha=0.2)
            ax.set_xscale("log")
            ax.set_title(f"{ATTACK_NAMES[name]}, L2 bound {FIGURE4_BOUND:g}")
            ax.set_xlabel("epsilon (delta 1e-5)")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        axes[0][0].set_ylabel("accuracy (smoothed)")
        fig.suptitle(f"Figure 4 ({dataset}):\naccuracy under attack against epsilon")
        fig.tight_layout()
        written.append(folder / "figure4.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def step_commits(steps: Path, dataset: str, field: str = "commit", having: str | None = None) -> list[str]:
    """The commits (in first-run order) that the successful steps of ``dataset`` recorded in ``steps``; with
    ``field="hardware"``, the hardware they ran on (``field="name"``: the steps; ``having``: only steps that
    recorded that field)."""
    try:
        lines = steps.read_text().splitlines()
    except OSError:
        return []
    commits: list[str] = []
    for line in lines:
        try:
            step = json.loads(line)
        except ValueError:
            continue
        commit = step.get(field)
        if having and not step.get(having):
            continue
        if commit and step.get("exit") == 0 and str(step.get("name", "")).startswith(f"{dataset}:") \
                and commit not in commits:
            commits.append(commit)
    return commits


def default_datasets(quick: bool) -> str:
    """The data sets a mode runs when --datasets is not given."""
    return "mnist10k" if quick else "mnist10k,fashion-mnist"


def command_datasets(line: str) -> list[str]:
    """The data sets a ``scripts/reproduce.sh`` command line of commands.txt ran (lines argparse accepted): its
    ``--datasets``, else its mode's default. A figure's header names only the commands that ran its data set's
    steps."""
    try:
        words = shlex.split(line)
    except ValueError:
        return []
    given = next((word.split("=", 1)[1] for word in words if word.startswith("--datasets=")),
                 flag_value(words, "--datasets"))
    return (given or default_datasets("--quick" in words)).split(",")


def write_results(root: Path, settings: Settings, command: str) -> list[Path]:
    import torch

    from transdenoiser.runtime import hardware_description

    result = collect(root, settings)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    ran_at = step_commits(root.parent / "steps.jsonl", root.name)
    ran_on = step_commits(root.parent / "steps.jsonl", root.name, "hardware")
    unrecorded = (len(step_commits(root.parent / "steps.jsonl", root.name, "name"))
                  - len(step_commits(root.parent / "steps.jsonl", root.name, "name", having="hardware")))
    hardware = ("; ".join(ran_on) if ran_on  # else the steps predate the record: say whose hardware this is
                else f"{hardware_description(torch.device('cpu'))} (of this drawing; the steps did not record theirs)")
    if ran_on and unrecorded:
        hardware += f" ({unrecorded} earlier steps did not record theirs)"
    shown = command if command.startswith("`") else f"`{command}`"  # --figures-only: the commands that ran
    header = (f"{'Commands' if '`; `' in shown else 'Command'}: {shown} ({settings.mode} mode). Hardware: {hardware}. "
              f"Commit: {commit}" + (f" (steps run at {', '.join(ran_at)})" if ran_at else "")
              + f". Certification: {settings.images} images requested, n0 {settings.n0}, "
              + (f"n {settings.n}" if settings.n else f"adaptive, n_max {settings.n_max}")
              + f", alpha {settings.alpha:g}. Attacks: {settings.attack_images} images requested, "
              f"{settings.attack_steps}"
              f" steps, smoothed prediction n {settings.attack_n}.")
    figures = plot_figures(result, root / "figures", settings)
    write_tables(result, root / "tables.md", settings, header)
    slim = json.loads(json.dumps(result, default=str))
    for entry in (*slim["certify"].values(), *slim.get("baseline_certify", {}).values()):
        entry.pop("rows", None)
    (root / "results.json").write_text(json.dumps({"header": header, "commit": commit, **slim}, indent=1) + "\n")
    return [*figures, root / "tables.md", root / "results.json"]


# ---------------------------------------------------------------------------------------------------- export

# The files a run's figures and tables are drawn from, and the record of how they were made: released metadata and
# privacy reports, certification rows, attack outcomes, settings, the steps' log. Never weights (the nodp arm's
# would reveal its private data) and never a checkpoint's private/ record.
EXPORTED_NAMES = frozenset({
    "metadata.json", "privacy_report.txt", "certify.tsv", "summary.json", "settings.json", "models.json",
    "report.md", "baseline_certify.tsv", "baseline_certify.settings.json", "attack.json", "attack.tsv",
    "tables.md", "results.json", "steps.jsonl", "commands.txt"})
EXPORTED_SUFFIXES = (".png",)
NEVER_EXPORTED_FOLDERS = frozenset({"private"})


def export_results(out: Path, dest: Path) -> list[Path]:
    """Copy what the figures and tables of the run under ``out`` rest on into ``dest``, in the same layout, so
    that ``--figures-only --out DEST`` redraws them and an auditor can recount every number; return the files
    copied. ``dest`` must not be inside ``out`` nor hold a run of its own."""
    import shutil

    out, dest = out.resolve(), dest.resolve()
    if dest == out or out in dest.parents:
        raise ValueError(f"--export {dest}: must not be the run's folder {out} or inside it")
    if (dest / "steps.jsonl").exists() and not (dest / ".exported").exists():
        raise ValueError(f"--export {dest}: holds a run of its own (steps.jsonl); choose another folder")
    copied = []
    for path in sorted(out.rglob("*")):
        relative = path.relative_to(out)
        if not path.is_file() or path.is_symlink() or NEVER_EXPORTED_FOLDERS & set(relative.parts[:-1]):
            continue
        if path.name not in EXPORTED_NAMES and not path.name.endswith(EXPORTED_SUFFIXES):
            continue
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        copied.append(target)
    (dest / ".exported").write_text(f"exported from {out} by scripts/reproduce.sh --export\n")
    return copied


# ---------------------------------------------------------------------------------------------------- estimate


def estimate(plan: list[dict], *measured: list[dict]) -> dict:
    """Wall time of the steps of ``plan`` (dry-run steps) not yet done, from the per-unit rates of ``measured`` steps
    (the lines of one or more steps.jsonl files). A kind of step takes its median rate from the first file that
    measured it, so a run's own rates come before those of another scale or machine load. A step that resumed an
    interrupted one logs only its own part of the time: a certification that recorded how many images it found
    done (``images_before``) gives the rate of the images it did, any other resumed step gives none."""
    def units(work: dict) -> float:
        kind = work.get("kind")
        if kind == "pretrain":
            return work["images"] * work["epochs"]
        if kind == "train":
            return work["examples"] * work["epochs"]
        if kind in ("certify", "baseline-certify"):
            return work["images"] * work["samples_per_image"]
        if kind == "attack":  # each bound, and the clean smoothed prediction every attack run makes first
            return work["images"] * (work["eps"] + 1)
        return 1.0

    def key(work: dict) -> tuple:
        kind = work.get("kind")
        if kind == "train":
            return (kind, work["arm"])
        if kind == "attack":
            return (kind, work["attack"], work["threat"], work["denoiser"])
        if kind == "certify":  # the adaptive mode stops early: its rate per budgeted sample is its own
            return (kind, bool(work.get("adaptive")))
        if kind == "baseline-certify":  # each baseline's own certificate runs its own model (StoBatch's is slower)
            return (kind, work.get("arm"))
        return (kind,)

    rates: dict[tuple, list[float]] = {}
    for steps in measured:
        found: dict[tuple, list[float]] = {}
        for step in steps:
            done_here = units(step["work"]) if step.get("exit") == 0 else 0.0
            if step.get("resumed"):
                images, before = step["work"].get("images"), step.get("images_before")
                done_here = done_here * (images - before) / images if images and before is not None else 0.0
            if step["seconds"] > 0 and done_here > 0:
                found.setdefault(key(step["work"]), []).append(step["seconds"] / done_here)
        for kind, per_unit in found.items():
            rates.setdefault(kind, per_unit)
    total, missing, by_kind = 0.0, [], {}
    for step in plan:
        if step["done"]:
            continue
        per_unit = rates.get(key(step["work"]))
        if not per_unit and step["work"].get("kind") == "certify":  # the other sampling's rate: better than none
            per_unit = next((v for k, v in rates.items() if k[0] == "certify"), None)
        if not per_unit:
            missing.append(step["name"])
            continue
        seconds = sorted(per_unit)[len(per_unit) // 2] * units(step["work"])
        total += seconds
        by_kind[step["work"]["kind"]] = by_kind.get(step["work"]["kind"], 0.0) + seconds
    return {"seconds": total, "by_kind": by_kind, "steps": len(plan),
            "to_do": sum(not step["done"] for step in plan), "not_estimated": missing}


def recorded_seconds(step: dict, steps_file: Path) -> float | None:
    """The wall seconds a finished certification step's own files record for all its images, summed over the runs
    it resumed (``certify.tsv``'s ``time`` column; ``baseline-certify``'s ``summary.json``), or None if they are not
    found or do not cover every image. Its folder is looked for beside ``steps_file`` (an export, or the run's own
    folder: the part of the step's ``--out`` from its data set's folder on), then at the ``--out`` it ran with.
    Unlike the step's logged seconds, this counts the images an interrupted run had done before it resumed (and
    leaves out the seconds of loading the models)."""
    work, out = step.get("work", {}), flag_value(step.get("argv", []), "--out")
    kind, dataset, images = work.get("kind"), work.get("dataset"), work.get("images")
    if kind not in ("certify", "baseline-certify") or out is None or not images:
        return None
    from certify.runner import read_rows
    from transdenoiser.errors import UserError

    parts = Path(out).parts
    candidates = [Path(out)]
    if dataset in parts:
        at = len(parts) - 1 - parts[::-1].index(dataset)
        candidates.insert(0, steps_file.parent.joinpath(*parts[at:]))
    for folder in candidates:
        if kind == "baseline-certify":
            summary = read_json(folder / "summary.json")
            if summary and summary.get("num_images") == images and isinstance(summary.get("seconds"), (int, float)):
                return float(summary["seconds"])
            continue
        try:
            records = read_rows(folder / "certify.tsv", "certify")  # [] where there is no such file
        except UserError:  # a damaged rows file gives no rate; the step's own log still does
            continue
        if len(records) == images:
            return sum(record.seconds for record in records)
    return None


def with_recorded_seconds(steps: list[dict], steps_file: Path) -> list[dict]:
    """``steps`` (one steps.jsonl's lines) with every finished certification that :func:`recorded_seconds` finds
    timed by its own files, as one whole run: a resumed certification (whose log has only its last part) then
    gives a rate too. A baseline-certify step logged before its work named the arm takes it from the step's name."""
    timed = []
    for step in steps:
        work = step.get("work", {})
        named = re.search(r": baseline-certify (\S+) seed \d+$", step.get("name", ""))
        if work.get("kind") == "baseline-certify" and "arm" not in work and named:  # logged before work named it
            step = {**step, "work": {**work, "arm": named.group(1)}}
        seconds = recorded_seconds(step, steps_file) if step.get("exit") == 0 else None
        if seconds is not None and seconds > 0:
            step = {**step, "seconds": seconds, "resumed": False}
            step.pop("images_before", None)
        timed.append(step)
    return timed


# ---------------------------------------------------------------------------------------------------- command line


def float_list(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x)


def parse_args(argv: list[str]) -> tuple[Settings, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="scripts/reproduce.sh", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--quick", action="store_true",
                   help="minutes: mnist10k, 1-epoch models on 128 private examples, 4 images, n 50, 2 bounds")
    p.add_argument("--datasets", default=None, help="comma-separated (default: mnist10k,fashion-mnist; --quick: "
                   "mnist10k); cifar10 needs --data-root")
    p.add_argument("--data-root", default=None, help="torchvision-layout data folder (cifar10, mnist)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: runs/reproduce/full or /quick)")
    p.add_argument("--images", type=int, default=None, help="certified test images (default: 500)")
    p.add_argument("--n", type=int, default=None, help="fixed n per image (default: adaptive, --n-max 10000)")
    p.add_argument("--n-max", type=int, default=None, help="adaptive mode's budget (default: 10000)")
    p.add_argument("--attack-images", type=int, default=None, help="attacked test images (default: 500)")
    p.add_argument("--attack-eps", type=float_list, default=None, help="L2 bounds (default: 0.5,1,1.5,2,2.5,3)")
    p.add_argument("--attacks", default=None, help="attacks of Figures 3 and 7 (default: fgsm,ifgsm,mim,pgd)")
    p.add_argument("--figure4-attacks", default=None, help="attacks of Figure 4 (default: fgsm,ifgsm,mim,pgd)")
    p.add_argument("--epsilons", type=float_list, default=None, help="Figure 4 (default: 0.1,0.25,0.5,1,2,4,8)")
    p.add_argument("--seeds", type=int, default=None, help="training seeds per arm (default: 3; --quick: 1)")
    p.add_argument("--only-seeds", default=None, metavar="LIST",
                   help="run only these training seeds, each below --seeds (e.g. 1,2 to add seeds to a run whose "
                        "first seed ran elsewhere); the figures use every seed present")
    p.add_argument("--runs", default=None,
                   help="subset of " + ",".join(name for name, _, _ in ARM_RUNS) + " (default: all); 'none' alone "
                        "plans only the classifier alone's certifications (figure2)")
    p.add_argument("--stages", default=None, metavar="LIST",
                   help="run only these stages, comma-separated (default: all): " + "; ".join(
                       f"{name}: {what}" for name, what in STAGES.items()))
    p.add_argument("--threat", default="classifier", choices=("classifier", "pipeline", "smoothed"),
                   help="attack threat model (default: classifier, the paper's white-box attack on the classifier)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--subprocess", action="store_true", help="run each step as its own transdenoiser process")
    p.add_argument("--plan", action="store_true", help="print the steps and whether each is done; run nothing")
    p.add_argument("--figures-only", action="store_true", help="only (re)write figures and tables from finished runs")
    p.add_argument("--export", type=Path, default=None, metavar="DIR",
                   help="copy the files the figures and tables rest on (no weights, no private records) to DIR in "
                        "the same layout, for --figures-only --out DIR; run nothing")
    p.add_argument("--estimate-from", type=Path, action="append", default=None, metavar="STEPS_JSONL",
                   help="estimate the wall time of this mode's steps not yet done from the step rates measured in "
                        "a steps.jsonl; repeat to fall back on other files' rates (the first that has a kind of "
                        "step is used); a certification is timed by its own files when they are beside the "
                        "steps.jsonl (an export) or at its --out; run nothing")
    args = p.parse_args(argv)
    quick = args.quick
    mode = "quick" if quick else ("full" if all(getattr(args, k) is None for k in
                                                ("images", "n", "n_max", "attack_images", "seeds", "epsilons",
                                                 "attack_eps")) else "custom")
    seeds = args.seeds or (1 if quick else 3)
    only_seeds = None
    if args.only_seeds is not None:
        try:
            only_seeds = tuple(dict.fromkeys(int(part) for part in args.only_seeds.split(",")))
        except ValueError:
            p.error(f"--only-seeds: expected comma-separated seeds such as 1,2, got {args.only_seeds!r}")
        outside = [seed for seed in only_seeds if not 0 <= seed < seeds]
        if outside:
            p.error(f"--only-seeds: seed(s) {', '.join(map(str, outside))} not in 0..{seeds - 1} (--seeds {seeds})")
    settings = Settings(
        datasets=(args.datasets or default_datasets(quick)).split(","),
        out=args.out or REPO / "runs" / "reproduce" / ("quick" if quick else "full"),
        data_root=args.data_root, device=args.device, mode=mode, subprocess=args.subprocess, threat=args.threat,
        seeds=seeds, only_seeds=only_seeds,
        images=args.images or (4 if quick else 500),
        n0=20 if quick else 100,
        n=args.n or (50 if quick else None),
        n_max=args.n_max or 10_000,
        attack_images=args.attack_images or (4 if quick else 500),
        attack_eps=args.attack_eps or ((0.5, 2.0) if quick else (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)),
        attacks=tuple((args.attacks or ",".join(ATTACKS)).split(",")),
        figure4_attacks=tuple((args.figure4_attacks or ("pgd" if quick else ",".join(ATTACKS))).split(",")),
        epsilons=args.epsilons or ((1.0, 8.0) if quick else (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)),
        attack_steps=2 if quick else 10, attack_n=10 if quick else 100,
        runs=tuple(args.runs.split(",")) if args.runs else tuple(name for name, _, _ in ARM_RUNS),
        stages=tuple(args.stages.split(",")) if args.stages else tuple(STAGES),
        pretrain_epochs=1 if quick else None,
        figure4_arms=("sepdp", "transdenoiser") if quick else DP_ARMS,
        train_extra=["--epochs", "1", "--train-examples", "128", "--eval-examples", "50"] if quick else [],
    )
    unknown = [d for d in settings.datasets if d not in CONFIGS]
    bad_attacks = [a for a in (*settings.attacks, *settings.figure4_attacks) if a not in ATTACKS]
    bad_runs = [r for r in settings.runs if r not in LABELS]
    bad_stages = [f"stage {stage!r} (one of {', '.join(STAGES)})" for stage in settings.stages if stage not in STAGES]
    if unknown or bad_attacks or bad_runs or bad_stages:
        p.error(f"unknown: {', '.join(unknown + bad_attacks + bad_runs + bad_stages)}")
    missing = [str(path) for path in args.estimate_from or () if not path.is_file()]
    if missing:
        p.error(f"--estimate-from: no such file: {', '.join(missing)}")
    return settings, args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    settings, args = parse_args(argv)
    if args.export is not None:
        if not (settings.out / "steps.jsonl").is_file():
            print(f"scripts/reproduce.sh: error: --export: {settings.out} holds no run (no steps.jsonl)",
                  file=sys.stderr)
            return 2
        try:
            copied = export_results(settings.out, args.export)
        except ValueError as exc:
            print(f"scripts/reproduce.sh: error: {exc}", file=sys.stderr)
            return 2
        print(f"exported {len(copied)} files to {args.export}")
        return 0
    command = "scripts/reproduce.sh " + shlex.join(argv)
    if not args.figures_only:
        from transdenoiser.runtime import keep_freed_memory

        keep_freed_memory()
    arms = available_arms()
    commands = available_commands()
    runner = Runner(settings, dry_run=args.plan or args.estimate_from is not None)
    if not (args.figures_only or runner.dry_run):
        settings.out.mkdir(parents=True, exist_ok=True)
        with (settings.out / "commands.txt").open("a") as f:
            f.write(command + "\n")
    ran: list[str] = []
    if args.figures_only and (settings.out / "commands.txt").exists():  # every command that ran the steps
        ran = list(dict.fromkeys((settings.out / "commands.txt").read_text().splitlines()))
    if not args.figures_only:  # seed by seed: a partial run has every arm and data set at the first seeds
        for seed in settings.run_seeds:
            for dataset in settings.datasets:
                reproduce_dataset(runner, dataset, arms, commands, [seed])
    if args.estimate_from is not None:
        measured = [with_recorded_seconds([json.loads(line) for line in path.read_text().splitlines() if line.strip()],
                                          path) for path in args.estimate_from]
        found = estimate(runner.planned, *measured)
        print(json.dumps({"mode": settings.mode, **found}, indent=1))
        print(f"estimated wall time: {found['seconds'] / 3600:.1f} h for the {found['to_do']} steps not done "
              f"(of {found['steps']}; {len(found['not_estimated'])} without a measured rate)")
        return 0
    if args.plan:
        for step in runner.planned:
            print(("done  " if step["done"] else "to do ") + "transdenoiser " + shlex.join(step["argv"]))
        for message in runner.skipped:
            print(message)
        return 0
    for dataset in settings.datasets:
        root = settings.out / dataset
        if root.exists():
            mine = [line for line in ran if dataset in command_datasets(line)]
            shown = "; ".join(f"`{line}`" for line in mine) + f" (figures redrawn by `{command}`)" if mine else command
            for path in write_results(root, settings, shown):
                print(f"wrote {path}")
    for message in runner.skipped:
        print(message)
    if runner.busy:
        print(f"{len(runner.busy)} step(s) left to the worker that was running them: " + "; ".join(runner.busy))
    if runner.failures:
        print(f"{len(runner.failures)} step(s) failed: " + "; ".join(runner.failures))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
