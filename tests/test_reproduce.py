"""scripts/reproduce.sh --quick: every step of the paper's comparisons runs end to end on tiny settings, the tables
agree with the runs' own files, missing baseline arms are reported as skipped, and a second run redoes nothing.

The quick mode here runs two arms (trained on 128 private examples for one epoch) through every figure, about 17
commands in one process; the classifier is the suite's session fixture. Slow for a smoke test (about a minute of
CPU; many minutes when other jobs share the 2 cores): it is the only test that runs the whole comparison.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "reproduce.sh"
# The arms the smoke test runs (Figure 4's two DP arms; the other arms take the same code paths with other flags,
# and every arm's commands are checked in the plan test).
OUR_RUNS = ("sepdp", "transdenoiser")
LABELS = {"transdenoiser": "TransDenoiser", "sepdp": "TransDenoiser_sepdp"}
PAPER_RUNS = {"nodp": "nodp", "sepdp": "sepdp", "transdenoiser": "transdenoiser",
              "transdenoiser_sigma010": "transdenoiser", "securesgd-prt": "securesgd-prt",
              "securesgd-sct": "securesgd-sct", "stobatch": "stobatch"}


def run_script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def certified_fraction(tsv: Path, radius: float) -> float:
    """Cohen et al.'s certified accuracy, counted straight from certify.tsv."""
    lines = tsv.read_text().splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
    return sum(1 for r in rows if r["correct"] == "1" and float(r["radius"]) >= radius) / len(rows)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, classifier_dir):
    """The quick mode, given the suite's session classifier (a `transdenoiser pretrain` checkpoint) in the place
    of its own pretraining, which the script then reports as done."""
    out = tmp_path_factory.mktemp("reproduce")
    shutil.copytree(classifier_dir, out / "mnist10k" / "classifier")
    with pytest.MonkeyPatch.context() as patch:  # a ledger of its own: other tests certify the same classifier
        patch.setenv("TRANSDENOISER_STATE_DIR", str(tmp_path_factory.mktemp("reproduce-state")))
        first = run_script("--quick", "--runs", ",".join(OUR_RUNS), "--out", str(out))
    return out, first


@pytest.mark.slow
def test_quick_mode_runs_every_step_of_our_arms(quick_run):
    out, first = quick_run
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "done: mnist10k: pretrain" in first.stdout
    root = out / "mnist10k"
    for run in OUR_RUNS:
        assert (root / "certify" / f"{run}_s0" / "certify.tsv").exists(), run
        for attack in ("fgsm", "ifgsm", "mim", "pgd"):
            assert (root / "attack" / f"{run}_s0" / attack / "attack.json").exists(), (run, attack)
    assert not (root / "train" / "stobatch_s0").exists()
    for figure in ("figure2", "figure3", "figure4", "figure7"):
        assert (root / "figures" / f"{figure}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert steps and all(step["exit"] == 0 and step["seconds"] > 0 for step in steps)


@pytest.mark.slow
def test_tables_agree_with_the_runs_files(quick_run):
    out, _ = quick_run
    root = out / "mnist10k"
    tables = (root / "tables.md").read_text()
    for run, label in (("none", "no denoiser"), *((run, LABELS[run]) for run in OUR_RUNS)):
        tsv = root / "certify" / f"{run}_s0" / "certify.tsv"
        expected = [f"{100 * certified_fraction(tsv, r):.1f}" for r in (0.0, 0.25, 0.5)]
        row = re.search(rf"^\| {re.escape(label)} \(sigma 0\.25\) \| (\d+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|",
                        tables, re.MULTILINE)
        assert row, label
        assert int(row.group(1)) == len(tsv.read_text().splitlines()) - 1
        assert [row.group(i).strip() for i in (2, 3, 4)] == expected, label
    # the paired table: transdenoiser minus sepdp on the same images, the exact difference of the two runs' files
    sepdp_tsv, td_tsv = (root / "certify" / f"{run}_s0" / "certify.tsv" for run in ("sepdp", "transdenoiser"))
    paired = re.search(rf"^\| {re.escape(LABELS['transdenoiser'])} \| 0 \| (\d+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|",
                       tables, re.MULTILINE)
    assert paired, "paired row"
    for column, radius in zip((2, 3, 4), (0.0, 0.25, 0.5), strict=True):
        expected = 100 * (certified_fraction(td_tsv, radius) - certified_fraction(sepdp_tsv, radius))
        assert paired.group(column).strip().startswith(f"{expected:+.1f} ["), (radius, paired.group(column))
    results = json.loads((root / "results.json").read_text())
    record = json.loads((root / "attack" / "transdenoiser_s0" / "pgd" / "attack.json").read_text())
    # under attack, paired: transdenoiser minus sepdp at every bound (0: clean) is the difference of the two runs'
    # smoothed accuracies, image by image on the same images
    base = json.loads((root / "attack" / "sepdp_s0" / "pgd" / "attack.json").read_text())
    paired_attack = results["attack_paired"]["transdenoiser"]["pgd"]
    assert paired_attack["bounds"] == [0.0, *(row["eps"] for row in record["results"])]
    assert paired_attack["difference"] == pytest.approx(
        [a["smoothed_accuracy"] - b["smoothed_accuracy"]
         for a, b in zip([record["clean"], *record["results"]], [base["clean"], *base["results"]], strict=True)])
    assert "each run minus sepdp (points; paired over the same images" in tables
    got = results["attack"]["transdenoiser"]["pgd"]
    assert got["0"]["mean"] == record["clean"]["smoothed_accuracy"]
    for row in record["results"]:
        assert got[f"{row['eps']:g}"]["mean"] == row["smoothed_accuracy"]
    # Figure 4: the epsilon-8 point is the attack at bound 2 on the model trained with --target-epsilon 8.
    eps8 = json.loads((root / "eps" / "transdenoiser_eps8_s0" / "attack_pgd" / "attack.json").read_text())
    assert eps8["results"][0]["eps"] == 2.0
    assert results["figure4"]["transdenoiser"]["pgd"]["8"]["mean"] == eps8["results"][0]["smoothed_accuracy"]
    meta = json.loads((root / "eps" / "transdenoiser_eps8_s0" / "metadata.json").read_text())
    assert meta["config"]["target_epsilon"] == 8.0
    # Figure 4's error bars: transdenoiser minus sepdp at each epsilon, image by image at bound 2 (epsilon 1: the
    # paper-setting runs' attacks), exactly the difference of the two files' accuracies
    sepdp8 = json.loads((root / "eps" / "sepdp_eps8_s0" / "attack_pgd" / "attack.json").read_text())
    paired4 = results["figure4_paired"]["transdenoiser"]["pgd"]
    assert paired4["epsilons"] == [1.0, 8.0] and paired4["images"] == len(eps8["image_indices"])

    def at_bound_2(attack: dict) -> float:
        return next(row["smoothed_accuracy"] for row in attack["results"] if row["eps"] == 2.0)

    assert paired4["difference"] == pytest.approx([at_bound_2(record) - at_bound_2(base),
                                                   at_bound_2(eps8) - at_bound_2(sepdp8)])
    assert all(low <= d <= high for d, low, high in zip(paired4["difference"], paired4["low"], paired4["high"],
                                                        strict=True))
    row4 = re.search(rf"^\| {re.escape(LABELS['transdenoiser'])} \| 0 \| \d+ \| ([^|]+) \| ([^|]+) \|$",
                     tables.split("each arm minus sepdp at the same epsilon")[1], re.MULTILINE)
    assert row4 and row4.group(2).strip().startswith(f"{100 * paired4['difference'][1]:+.1f} [")


@pytest.mark.slow
def test_second_run_redoes_nothing(quick_run):
    out, _ = quick_run
    before = (out / "steps.jsonl").read_text()
    again = run_script("--quick", "--runs", ",".join(OUR_RUNS), "--out", str(out), timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "+ transdenoiser" not in again.stdout
    assert again.stdout.count("done: ") >= before.count("\n")
    assert (out / "steps.jsonl").read_text() == before


@pytest.mark.slow
def test_export_keeps_what_the_tables_rest_on_and_nothing_private(quick_run, tmp_path):
    """--export copies certification rows, attack outcomes, released metadata and the steps' log (never weights,
    never a checkpoint's private/ record); --figures-only on the copy draws the same tables."""
    out, _ = quick_run
    dest = tmp_path / "exported"
    exported = run_script("--quick", "--runs", ",".join(OUR_RUNS), "--out", str(out), "--export", str(dest))
    assert exported.returncode == 0, exported.stderr[-2000:]
    files = {path.relative_to(dest).as_posix() for path in dest.rglob("*") if path.is_file()}
    assert not any(name.endswith(".safetensors") or "/private/" in name for name in files)
    assert any((out / "mnist10k" / "train" / "sepdp_s0" / "private").iterdir())  # there was a private record
    for name in ("steps.jsonl", "mnist10k/certify/sepdp_s0/certify.tsv", "mnist10k/train/sepdp_s0/metadata.json",
                 "mnist10k/train/sepdp_s0/privacy_report.txt", "mnist10k/attack/transdenoiser_s0/pgd/attack.json",
                 "mnist10k/eps/transdenoiser_eps8_s0/attack_pgd/attack.json", "mnist10k/tables.md"):
        assert name in files, name
        assert (dest / name).read_bytes() == (out / name).read_bytes(), name
    redrawn = run_script("--quick", "--runs", ",".join(OUR_RUNS), "--out", str(dest), "--figures-only")
    assert redrawn.returncode == 0, redrawn.stderr[-2000:]

    def body(path: Path) -> list[str]:
        return [line for line in path.read_text().splitlines() if not line.startswith("Command: ")]

    assert body(dest / "mnist10k" / "tables.md") == body(out / "mnist10k" / "tables.md")
    assert re.search(r"\(steps run at [0-9a-f]{7,40}", (out / "mnist10k" / "tables.md").read_text())
    inside = run_script("--quick", "--out", str(out), "--export", str(out / "copy"))
    assert inside.returncode == 2 and "must not be the run's folder" in inside.stderr
    assert not (out / "copy").exists()


def planned_trainings(stdout: str) -> list[list[str]]:
    """The argv (after `transdenoiser`) of every `transdenoiser train` step a --plan lists."""
    return [shlex.split(line.split("transdenoiser ", 1)[1]) for line in stdout.splitlines()
            if "transdenoiser train " in line]


@pytest.mark.slow
def test_plan_and_estimate_name_the_full_mode_without_running(quick_run):
    from training.choices import ARMS

    out, _ = quick_run
    plan = run_script("--plan", "--datasets", "mnist10k", "--out", str(out / "full"), timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    for run, arm in PAPER_RUNS.items():  # every paper arm: planned if `train --help` lists it, else skipped
        planned = f"--arm {arm} " in plan.stdout and f"/train/{run}_s2 " in plan.stdout
        assert planned == (arm in ARMS), run
        assert (f"skipped: arm {arm} not available" in plan.stdout) == (arm not in ARMS), run
    assert "--adaptive --n-max 10000" in plan.stdout and "--max-images 500" in plan.stdout
    assert not (out / "full").exists()
    # seed by seed: every step of a seed before any of the next, and the shared steps once
    steps = [line for line in plan.stdout.splitlines() if line.startswith(("to do ", "done  "))]
    seed_of = [max(map(int, re.findall(r"_s(\d+)\b", line)), default=0) for line in steps]
    assert seed_of == sorted(seed_of) and set(seed_of) == {0, 1, 2}
    assert sum(" pretrain " in line for line in steps) == 1 and sum("/none_s0" in line for line in steps) == 1
    # every planned baseline training passes only flags its arm takes (checked by the arm's own flag reader)
    from training.train_flags import config_from_args as method_config_from_args
    from transdenoiser.cli import build_parser

    baselines = ("stobatch", "securesgd-prt", "securesgd-sct")
    checked = set()
    for words in planned_trainings(plan.stdout):
        arm = words[words.index("--arm") + 1] if "--arm" in words else None
        if arm in baselines and arm in ARMS:
            method_config_from_args(build_parser(words).parse_args(words))  # the method refuses what it ignores
            checked.add(arm)
    assert checked == {arm for arm in baselines if arm in ARMS}
    # every planned training of our arms, on both data sets, passes the product's own planner (xi_up calibrated
    # to its epsilon, xi_low <= xi_up for Algorithm 1) on the full-size private split
    from dataclasses import asdict

    from tests.test_datasets import make_mnist_layout
    from training.datasets import load_dataset
    from training.private_train import plan as plan_training
    from training.train_cli import config_from_args
    from training.train_config import TrainConfig

    # full Fashion-MNIST's shape (60,000 training and 10,000 test images) in the torchvision layout, so the plan does
    # not need the data installed; the split sizes, all the planner reads, are those of the real data
    fashion_root = out / "fashion-fixture"
    make_mnist_layout(fashion_root, "FashionMNIST", 60_000, 10_000, compress=False)
    fashion = run_script("--plan", "--datasets", "fashion-mnist", "--data-root", str(fashion_root),
                         "--out", str(out / "full"), timeout=300)
    assert fashion.returncode == 0, fashion.stderr[-2000:]
    sizes, checked_configs = {}, set()
    for words in planned_trainings(plan.stdout) + planned_trainings(fashion.stdout):
        if "--config" not in words:
            continue
        dataset = words[words.index("--dataset") + 1]
        if dataset not in sizes:
            data_root = words[words.index("--data-root") + 1] if "--data-root" in words else None
            sizes[dataset] = len(load_dataset(dataset, data_root).split("private"))
        arm_config, _ = config_from_args(build_parser(words).parse_args(words))
        config = arm_config.train_config()  # the run the arm's settings make (what a checkpoint records)
        assert isinstance(config, TrainConfig)
        key = (dataset, json.dumps({k: v for k, v in asdict(config).items() if k != "seed"}, sort_keys=True,
                                   default=str))
        if key in checked_configs:  # the same training at another seed: the planner's answer is the same
            continue
        config.validate(sizes[dataset])
        plan_training(config, sizes[dataset])
        checked_configs.add(key)
    assert checked_configs and set(sizes) == {"mnist10k", "fashion-mnist"}
    estimate = run_script("--estimate-from", str(out / "steps.jsonl"), "--datasets", "mnist10k",
                          "--out", str(out / "full"), timeout=300)
    assert estimate.returncode == 0, estimate.stderr[-2000:]
    found = json.loads(estimate.stdout[:estimate.stdout.rindex("}") + 1])
    assert found["seconds"] > 0 and found["mode"] == "full"


@pytest.mark.parametrize("name, sigma, channels, size", [
    ("paper_fashion_sigma025", 0.25, 1, 28), ("paper_fashion_sigma010", 0.1, 1, 28),
    ("paper_cifar10_sigma025", 0.25, 3, 32), ("paper_cifar10_sigma010", 0.1, 3, 32)])
def test_paper_configs_hold_the_papers_settings(name, sigma, channels, size):
    """The paper's settings: input sigma 0.25 (0.1 for the ablation), (1.0, 1e-5)-DP, C = 1; the denoiser fits."""
    import torch

    from training.denoisers import denoiser_kwargs
    from training.models import build_model
    from training.train_config import TrainConfig
    from transdenoiser.toml import read_toml

    path = REPO / "configs" / f"{name}.toml"
    config = TrainConfig.from_dict(read_toml(path, "--config"), source=str(path))
    assert (config.sigma, config.target_epsilon, config.delta, config.clip_norm) == (sigma, 1.0, 1e-5, 1.0)
    model = build_model(config.denoiser, **denoiser_kwargs(config.denoiser, channels, config.activation,
                                                           config.denoiser_kwargs))
    assert model(torch.rand(2, channels, size, size)).shape == (2, channels, size, size)


def reproduce_module():
    """scripts/reproduce.py as a module (it is a script, not a package member)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce_script", REPO / "scripts" / "reproduce.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def reproduce_part(part: str):
    """scripts/reproduce_PART.py, one of the modules scripts/reproduce.py is made of, as the script imports it."""
    import importlib

    reproduce_module()  # puts scripts/ on sys.path, as running the script does
    return importlib.import_module(f"reproduce_{part}")


def test_estimate_counts_steps_not_done_at_the_first_files_rates():
    """The wall-time estimate skips finished steps, takes each kind's median rate from the first steps file that
    measured it (a run's own rates before another run's), keeps the adaptive and fixed-n certification rates
    apart, and names the steps no file has a rate for."""
    estimate = reproduce_module().estimate

    def certify(seconds, adaptive, done=False):
        work = {"kind": "certify", "images": 10, "samples_per_image": 1000, "adaptive": adaptive}
        return {"name": "c", "exit": 0, "seconds": seconds, "work": work, "done": done}

    train = {"kind": "train", "arm": "sepdp", "examples": 100, "epochs": 2}
    plan = [certify(0, True, done=True), certify(0, True), certify(0, False),
            {"name": "t", "done": False, "work": train}, {"name": "b", "done": False, "work": {"kind": "bcert"}}]
    own = [certify(20.0, True), certify(40.0, True), certify(30.0, True),  # median 30 s per 10,000 samples
           {**certify(2.0, True), "resumed": True},  # the last part of an interrupted step, its share unknown
           {**certify(3.0, True), "resumed": True, "images_before": 9}]  # 1 of 10 images in 3 s: a rate, 30 s
    other = [certify(1.0, True), certify(5.0, False), {"exit": 0, "seconds": 8.0, "work": train},
             {"exit": 1, "seconds": 50.0, "work": {"kind": "bcert"}}]  # a failed step measures nothing
    found = estimate(plan, own, other)
    assert found["by_kind"] == pytest.approx({"certify": 30.0 + 5.0, "train": 8.0})
    assert found["seconds"] == pytest.approx(43.0)
    assert (found["steps"], found["to_do"], found["not_estimated"]) == (5, 4, ["b"])
    assert estimate(plan, other, own)["by_kind"]["certify"] == pytest.approx(1.0 + 5.0)  # order decides
    resumed_only = [{**certify(4.0, True), "resumed": True, "images_before": 8}]  # 2 images in 4 s: 20 s for 10
    assert estimate(plan, resumed_only)["by_kind"]["certify"] == pytest.approx(20.0 + 20.0)
    assert estimate(plan, [{**certify(4.0, True), "resumed": True}])["by_kind"] == {}


def test_a_certification_is_timed_by_its_own_files_even_when_it_resumed(tmp_path):
    """A resumed certification logs only its last part; the estimate times it by its own files instead (every
    image's time in certify.tsv, baseline-certify's summary.json), found beside the steps file as an export lays
    them out, and rates each baseline's own certificate apart from the others'."""
    module = reproduce_module()
    estimate_part = reproduce_part("estimate")
    steps_file = tmp_path / "export" / "steps.jsonl"
    folder = tmp_path / "export" / "mnist10k" / "certify" / "sepdp_s0"
    folder.mkdir(parents=True)
    (folder / "certify.tsv").write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n"
                                        "0\t7\t7\t0.5\t1\t10.0\n4\t2\t2\t0.4\t1\t20.0\n")
    bcert = tmp_path / "export" / "mnist10k" / "baseline_certify" / "stobatch_s0"
    bcert.mkdir(parents=True)
    (bcert / "summary.json").write_text(json.dumps({"num_images": 2, "seconds": 90.0}))

    def step(kind, out, seconds, images=2, **extra):
        work = {"kind": kind, "dataset": "mnist10k", "images": images, "samples_per_image": 100, **extra}
        return {"name": f"mnist10k: {kind} {extra.get('arm', 'stobatch')} seed 0", "argv": [kind, "--out", str(out)],
                "exit": 0, "seconds": seconds, "work": work, "resumed": True}

    ran_at = Path("/elsewhere/runs/full/mnist10k")  # where the run was, on another machine: not there now
    certify = step("certify", ran_at / "certify" / "sepdp_s0", 3.0, adaptive=True)
    baseline = step("baseline-certify", ran_at / "baseline_certify" / "stobatch_s0", 5.0)
    partial = step("certify", ran_at / "certify" / "sepdp_s0", 3.0, images=3, adaptive=True)  # 2 rows of 3
    assert estimate_part.recorded_seconds(certify, steps_file) == pytest.approx(30.0)
    assert estimate_part.recorded_seconds(baseline, steps_file) == pytest.approx(90.0)
    assert estimate_part.recorded_seconds(partial, steps_file) is None
    timed = module.with_recorded_seconds([certify, baseline, partial], steps_file)
    assert [(t["seconds"], t["resumed"]) for t in timed] == [(30.0, False), (90.0, False), (3.0, True)]
    assert timed[1]["work"]["arm"] == "stobatch"  # from the step's name: logged before work named the arm
    assert estimate_part.recorded_seconds(certify, tmp_path / "elsewhere" / "steps.jsonl") is None  # nothing there
    damaged = tmp_path / "damaged" / "mnist10k" / "certify" / "sepdp_s0"
    damaged.mkdir(parents=True)
    (damaged / "certify.tsv").write_text("idx\ttime\n0\t10.0\n4\n")  # a cut-off row: no rate, no crash
    assert estimate_part.recorded_seconds(certify, tmp_path / "damaged" / "steps.jsonl") is None

    plan = [{**step("baseline-certify", "x", 0, arm="stobatch"), "done": False},
            {**step("baseline-certify", "y", 0, arm="securesgd-prt"), "done": False}]
    found = module.estimate(plan, timed)
    assert found["by_kind"] == {"baseline-certify": pytest.approx(90.0)}
    assert found["not_estimated"] == ["mnist10k: baseline-certify securesgd-prt seed 0"]  # StoBatch's is not prt's


def test_estimate_rates_an_attack_by_its_bounds_and_its_clean_pass():
    """An attack run pays its clean smoothed prediction once, then each bound: its work is images x (bounds + 1), so
    a run at six bounds and one at a single bound (Figure 4) rate each other."""
    estimate = reproduce_module().estimate

    def attack(bounds, seconds=None, done=False):
        work = {"kind": "attack", "attack": "pgd", "threat": "classifier", "denoiser": True, "images": 500,
                "eps": bounds}
        return {"name": "a", "exit": 0, "seconds": seconds, "work": work, "done": done}

    six_bounds = [attack(6, 210.0)]  # 7 units of 500 images: 30 s each
    assert estimate([attack(1)], six_bounds)["by_kind"]["attack"] == pytest.approx(60.0)
    assert estimate([attack(6)], [attack(1, 60.0)])["by_kind"]["attack"] == pytest.approx(210.0)


def test_an_interrupted_baseline_training_is_set_aside_not_lost(tmp_path):
    """The baselines cannot resume: reproduce.py moves an interrupted one to RUN.interrupted (then -2, ...) so the
    step trains again, and leaves a complete checkpoint (or none) where it is."""
    module = reproduce_module()
    run = tmp_path / "securesgd-prt_s0"
    assert module.set_aside_interrupted(run) is None  # nothing there
    for number, suffix in ((1, ".interrupted"), (2, ".interrupted-2")):
        run.mkdir()
        (run / "metadata.json").write_text(json.dumps({"kind": "denoiser", "complete": False, "epoch": number}))
        aside = module.set_aside_interrupted(run)
        assert aside == tmp_path / f"securesgd-prt_s0{suffix}" and not run.exists()
        assert json.loads((aside / "metadata.json").read_text())["epoch"] == number
    run.mkdir()
    (run / "metadata.json").write_text(json.dumps({"kind": "denoiser", "complete": True}))
    assert module.set_aside_interrupted(run) is None and (run / "metadata.json").exists()


def test_stages_choose_which_steps_are_planned(tmp_path):
    """--stages limits a run to some of the figures (the trainings they need come along); an unknown stage is a
    one-line error naming it and the choices."""
    def planned(*stages: str) -> list[str]:
        args = ["--plan", "--datasets", "mnist10k", "--seeds", "1", "--runs", "sepdp,securesgd-prt",
                "--out", str(tmp_path / "out")]
        result = run_script(*args, *(("--stages", ",".join(stages)) if stages else ()), timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return [line.split("transdenoiser ", 1)[1].split()[0] for line in result.stdout.splitlines()
                if line.startswith(("to do ", "done  "))]

    everything = planned()
    assert {"pretrain", "train", "certify", "baseline-certify", "attack"} <= set(everything)
    figure2 = planned("figure2")
    assert set(figure2) == {"pretrain", "train", "certify"} and figure2.count("certify") == 3  # none, sepdp, prt
    assert set(planned("attacks")) == {"pretrain", "train", "attack"}
    assert set(planned("baseline-certify")) == {"pretrain", "train", "baseline-certify"}
    figure4 = planned("figure4")
    assert "certify" not in figure4 and "baseline-certify" not in figure4
    assert len(everything) == len(figure2) + len(planned("attacks", "baseline-certify", "figure4")) - 3  # shared
    assert not (tmp_path / "out").exists()
    bad = run_script("--plan", "--stages", "figure2,figure9", "--out", str(tmp_path / "out"), timeout=300)
    assert bad.returncode == 2 and "unknown: stage 'figure9' (one of figure2, baseline-certify" in bad.stderr
    assert not (tmp_path / "out").exists()


def test_only_seeds_plans_those_training_seeds_and_nothing_of_the_others(tmp_path):
    """--only-seeds 1,2 adds seeds to a run whose first seed ran elsewhere: every planned training, certification
    and attack is of seed 1 or 2, the classifier alone is certified at seeds 1 and 2 only; a seed outside
    --seeds or a word is a one-line error naming it."""
    def planned(*extra: str) -> list[str]:
        result = run_script("--plan", "--datasets", "mnist10k", "--seeds", "3", "--runs", "sepdp",
                            "--stages", "figure2,attacks", "--out", str(tmp_path / "out"), *extra, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return [line for line in result.stdout.splitlines() if line.startswith(("to do ", "done  "))]

    everything, some = planned(), planned("--only-seeds", "2,1")
    def seeds_of(lines: list[str]) -> list[str]:
        return [m.group(1) for m in (re.search(r"_s(\d+)\b", line) for line in lines) if m]

    def seeded(lines: list[str]) -> list[str]:
        return sorted(line for line in lines if re.search(r"_s[12]\b", line))

    assert set(seeds_of(everything)) == {"0", "1", "2"} and set(seeds_of(some)) == {"1", "2"}
    assert seeded(everything) == seeded(some) and len(seeded(some)) == len(seeds_of(some))  # the full plan's steps
    assert seeds_of(some)[0] == "2"  # seed by seed, in the order given
    assert any("certify/none_s0" in line for line in everything) and not any("none_s0" in line for line in some)
    assert all(any(re.search(rf"certify/none_s{seed}$", line) for line in some) for seed in (1, 2))  # each seed
    alone = planned("--only-seeds", "1,2", "--runs", "none")  # the classifier alone, nothing else
    steps = [line for line in alone if " pretrain " not in line]  # the classifier is pre-trained first
    assert len(alone) == 3 and sorted(line.rsplit("/", 1)[1] for line in steps) == ["none_s1", "none_s2"]
    assert all(" certify " in line for line in steps)
    for value, message in (("3", "seed(s) 3 not in 0..2 (--seeds 3)"), ("one", "expected comma-separated seeds")):
        bad = run_script("--plan", "--seeds", "3", "--only-seeds", value, "--out", str(tmp_path / "out"), timeout=300)
        assert bad.returncode == 2 and f"--only-seeds: {message}" in bad.stderr
    assert not (tmp_path / "out").exists()


def test_a_step_another_worker_is_running_is_left_to_it(tmp_path, capsys):
    """Two workers on one --out: a step whose output folder another process holds the run lock of is skipped
    (not failed, not run, not logged), and runs once the lock is free."""
    from transdenoiser.lock import RunLock

    module = reproduce_module()
    runner_part = reproduce_part("runner")
    settings = module.Settings(datasets=["mnist10k"], out=tmp_path)
    runner = module.Runner(settings)
    calls = []
    runner._call = lambda argv: calls.append(argv) or 0
    out = tmp_path / "mnist10k" / "certify" / "sepdp_s0"
    argv = ["certify", "--sigma", "0.25", "--out", str(out)]
    holder = RunLock(out, purpose="transdenoiser certify (the other worker)").acquire()
    try:
        assert runner.step("certify sepdp", argv, done=False, work={}) is False
    finally:
        holder.release()
    said = capsys.readouterr().out
    assert "busy: certify sepdp:" in said and "(the other worker)" in said
    assert calls == [] and runner.failures == [] and runner.busy == ["certify sepdp"]
    assert not (tmp_path / "steps.jsonl").exists()
    again = module.Runner(settings)
    again._call = lambda argv: calls.append(argv) or 0
    assert again.step("certify sepdp", argv, done=False, work={}) is True
    assert calls == [argv] and again.busy == []
    logged = json.loads((tmp_path / "steps.jsonl").read_text())
    assert logged["name"] == "certify sepdp" and logged["exit"] == 0 and logged["resumed"] is False  # out was empty
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+modified)?|unknown", logged["commit"])  # the code that ran the step
    assert re.fullmatch(r"CPU .*, \d+ cores, \d+ torch threads?, torch .*", logged["hardware"])  # and where
    out.mkdir(parents=True, exist_ok=True)
    (out / "certify.tsv").write_text("idx\tlabel\n3\t1\n5\t2\n")  # an interrupted run's 2 rows: resumed
    assert again.step("certify sepdp again", argv, done=False, work={}) is True
    logged = json.loads((tmp_path / "steps.jsonl").read_text().splitlines()[1])
    assert logged["resumed"] is True and logged["images_before"] == 2
    bcert = tmp_path / "bcert"
    bcert.mkdir()
    (bcert / "baseline_certify.rows.jsonl").write_text('{"idx": 0}\n{"idx": 20}\n{"idx": 40}\n')
    assert runner_part.images_done(bcert) == 3 and runner_part.images_done(tmp_path / "nothing") is None


def test_the_tables_name_the_commits_and_hardware_of_their_steps(tmp_path):
    tables_part = reproduce_part("tables")
    steps = tmp_path / "steps.jsonl"
    lines = [{"name": "mnist10k: certify a", "exit": 0, "commit": "abc1234", "hardware": "CPU X, 2 cores"},
             {"name": "mnist10k: certify b", "exit": 1, "commit": "fff0000", "hardware": "CPU Y, 8 cores"},
             {"name": "fashion-mnist: certify a", "exit": 0, "commit": "0123456", "hardware": "CPU Z, 4 cores"},
             {"name": "mnist10k: train c", "exit": 0, "commit": "abc1234+modified", "hardware": "CPU X, 2 cores"},
             {"name": "mnist10k: pretrain", "exit": 0}]  # a step logged before commits and hardware were
    steps.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert tables_part.step_commits(steps, "mnist10k") == ["abc1234", "abc1234+modified"]  # failed steps left out
    assert tables_part.step_commits(steps, "mnist10k", "hardware") == ["CPU X, 2 cores"]
    assert tables_part.step_commits(steps, "mnist10k", "name", having="hardware") == ["mnist10k: certify a",
                                                                                 "mnist10k: train c"]
    assert len(tables_part.step_commits(steps, "mnist10k", "name")) == 3  # one of them recorded no hardware
    assert tables_part.step_commits(tmp_path / "absent.jsonl", "mnist10k") == []
    packed = tmp_path / "summaries" / "steps.jsonl.gz"  # the gzip copy the summaries keep, read in its place
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(steps.read_bytes()))
    for path in (packed, packed.with_name("steps.jsonl")):
        assert tables_part.step_commits(path, "mnist10k") == ["abc1234", "abc1234+modified"]


def test_summaries_keep_the_tables_figures_and_a_gzipped_steps_log(tmp_path):
    """--summaries writes what docs/results/reproduce_full keeps: per data set tables.md, results.json and the
    figures as palette PNGs, commands.txt, and steps.jsonl as steps.jsonl.gz (the same bytes however often it runs,
    read by the estimate and the tables as the plain log); never the per-run files. --export refuses the folder."""
    from PIL import Image

    run, dest = tmp_path / "run", tmp_path / "summaries"
    figures = run / "mnist10k" / "figures"
    figures.mkdir(parents=True)
    (run / "mnist10k" / "certify" / "sepdp_s0").mkdir(parents=True)
    (run / "mnist10k" / "certify" / "sepdp_s0" / "certify.tsv").write_text("idx\ttime\n")
    (run / "mnist10k" / "tables.md").write_text("# tables\n")
    (run / "mnist10k" / "results.json").write_text("{}\n")
    pixels = np.full((20, 30, 4), 255, dtype=np.uint8)
    pixels[5:8, :, :3] = (31, 119, 180)
    Image.fromarray(pixels, mode="RGBA").save(figures / "figure2.png")
    (run / "commands.txt").write_text("scripts/reproduce.sh --seeds 1\n")
    steps = [{"name": "mnist10k: certify a", "exit": 0, "commit": "abc1234", "argv": ["certify", "--out", "/x"]}]
    (run / "steps.jsonl").write_text("".join(json.dumps(step) + "\n" for step in steps))
    done = run_script("--out", str(run), "--summaries", str(dest), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted(path.relative_to(dest).as_posix() for path in dest.rglob("*") if path.is_file())
    assert files == ["commands.txt", "mnist10k/figures/figure2.png", "mnist10k/results.json", "mnist10k/tables.md",
                     "steps.jsonl.gz"]
    packed = (dest / "steps.jsonl.gz").read_bytes()
    assert gzip.decompress(packed) == (run / "steps.jsonl").read_bytes()
    assert reproduce_part("common").step_lines(dest / "steps.jsonl") == (run / "steps.jsonl").read_text().splitlines()
    figure = Image.open(dest / "mnist10k" / "figures" / "figure2.png")
    assert figure.mode == "P" and (np.asarray(figure.convert("RGBA")) == pixels).all()
    again = run_script("--out", str(run), "--summaries", str(dest), timeout=120)
    assert again.returncode == 0 and (dest / "steps.jsonl.gz").read_bytes() == packed
    refused = run_script("--out", str(run), "--export", str(dest), timeout=120)
    assert refused.returncode == 2 and "holds a run of its own or its summaries" in refused.stderr
    both = run_script("--out", str(run), "--export", str(tmp_path / "x"), "--summaries", str(dest), timeout=120)
    assert both.returncode == 2 and "give one" in both.stderr


def test_a_data_sets_header_names_only_the_commands_that_ran_it():
    """commands.txt is shared by the data sets of one --out: a figure's header keeps the lines that ran its data
    set, read from --datasets (either spelling) or the mode's default."""
    datasets = reproduce_module().command_datasets
    assert datasets("scripts/reproduce.sh --seeds 1 --datasets mnist10k --stages figure4") == ["mnist10k"]
    assert datasets("scripts/reproduce.sh --datasets=fashion-mnist,cifar10") == ["fashion-mnist", "cifar10"]
    assert datasets("scripts/reproduce.sh --seeds 1") == ["mnist10k", "fashion-mnist"]
    assert datasets("scripts/reproduce.sh --quick --runs sepdp") == ["mnist10k"]
    assert datasets("scripts/reproduce.sh --runs 'unclosed") == []


def documented_reproduce_commands() -> list[tuple[str, list[str]]]:
    """Every `scripts/reproduce.sh ...` the docs and README show, in code blocks (continuation lines joined) and in
    inline code (which may wrap a line): (where, its arguments), cut at a comment, a pipe or a redirection."""
    found = []
    command = re.compile(r"scripts/reproduce\.sh((?: +[^\s`#|>&()]+)*)")
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
        prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
        pieces = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
        pieces += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]
        for piece in pieces:
            for match in command.finditer(piece):
                words = match.group(1).split()
                if "..." not in words:
                    found.append((path.name, words))
    return found


@pytest.mark.parametrize("where, words", documented_reproduce_commands(), ids=lambda value: str(value)[:60])
def test_every_documented_reproduce_command_parses(where, words, tmp_path, monkeypatch):
    """The flags the docs tell a user to pass are the script's flags, with valid values."""
    monkeypatch.chdir(tmp_path)
    for flag, value in zip(words, words[1:], strict=False):
        if flag == "--estimate-from":  # a steps file the script checks exists; an earlier run's, here made up
            (tmp_path / value).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / value).write_text("")
    settings, _ = reproduce_module().parse_args(words)
    assert settings.datasets and settings.stages, where


def test_the_kept_steps_log_estimates_under_its_plain_name_and_a_missing_data_set_is_one_line(tmp_path, capsys):
    """docs/REPRODUCTION.md's command: --estimate-from names steps.jsonl, of which docs/results/reproduce_full keeps
    only the gzip copy; the estimate reads it. A data set that is not installed is refused in one line, not a
    traceback."""
    main = reproduce_module().main
    kept = REPO / "docs" / "results" / "reproduce_full" / "steps.jsonl"
    assert not kept.exists() and kept.with_name("steps.jsonl.gz").is_file()
    assert main(["--datasets", "mnist10k", "--out", str(tmp_path / "empty"), "--estimate-from", str(kept)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"estimated wall time: [0-9.]+ h for the (\d+) steps not done \(of \1;", printed)
    missing_data = ["--datasets", "fashion-mnist", "--data-root", str(tmp_path), "--out", str(tmp_path / "e"), "--plan"]
    assert main(missing_data) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("scripts/reproduce.sh: error: fashion-mnist:") and "\n" not in error
    assert not (tmp_path / "e").exists()


def test_figure4_error_bars_pair_each_arm_with_sepdp_image_by_image(tmp_path):
    """Figure 4's paired differences on hand-made attack files: arm minus sepdp at each epsilon both have, the mean
    of the per-image differences at bound 2, the paper-setting run's attack as the epsilon-1 point; an epsilon whose
    images differ from sepdp's, or from the other epsilons', is left out rather than mispaired."""
    module = reproduce_module()
    results_part = reproduce_part("results")
    tables_part = reproduce_part("tables")
    root = tmp_path / "mnist10k"

    def write(folder: Path, correct: list[int], indices: list[int]) -> None:
        folder.mkdir(parents=True)
        results = [{"eps": 0.5, "smoothed_accuracy": 0.0, "smoothed_correct": [0] * len(correct)},
                   {"eps": 2.0, "smoothed_accuracy": sum(correct) / len(correct), "smoothed_correct": correct}]
        (folder / "attack.json").write_text(json.dumps({"image_indices": indices, "num_images": len(indices),
                                                        "clean": {"smoothed_accuracy": 1.0}, "results": results}))

    indices = [0, 5, 10, 15]
    write(root / "attack" / "sepdp_s0" / "pgd", [1, 0, 0, 0], indices)             # epsilon 1
    write(root / "attack" / "transdenoiser_s0" / "pgd", [1, 1, 1, 0], indices)     # +50 points
    write(root / "eps" / "sepdp_eps8_s0" / "attack_pgd", [1, 1, 1, 1], indices)
    write(root / "eps" / "transdenoiser_eps8_s0" / "attack_pgd", [1, 0, 1, 1], indices)  # -25 points
    write(root / "eps" / "sepdp_eps0.1_s0" / "attack_pgd", [0, 0, 0, 0], indices)
    write(root / "eps" / "transdenoiser_eps0.1_s0" / "attack_pgd", [1, 1, 1, 1], [1, 2, 3, 4])  # other images
    write(root / "eps" / "sepdp_eps4_s0" / "attack_pgd", [0, 1], [0, 5])  # both on 2 images, not the other columns'
    write(root / "eps" / "transdenoiser_eps4_s0" / "attack_pgd", [1, 1], [0, 5])
    settings = module.Settings(datasets=["mnist10k"], out=tmp_path, epsilons=(0.1, 1.0, 4.0, 8.0),
                               figure4_attacks=("pgd",), runs=("sepdp", "transdenoiser"))
    paired = results_part.figure4_paired_to_sepdp(root, settings)
    entry = paired["transdenoiser"]["pgd"]
    assert entry["seed"] == 0 and entry["images"] == 4 and entry["epsilons"] == [1.0, 8.0]
    assert entry["difference"] == pytest.approx([0.5, -0.25])
    assert entry["low"][0] <= 0.5 <= entry["high"][0] and entry["low"][1] <= -0.25 <= entry["high"][1]
    assert list(paired) == ["transdenoiser"]  # sepdp is the reference, not a row
    result = results_part.collect(root, settings)
    assert result["figure4_paired"] == paired
    tables_part.write_tables(result, tmp_path / "tables.md", settings, "header")
    tables = (tmp_path / "tables.md").read_text()
    assert "| TransDenoiser | 0 | 4 | - | +50.0 [" in tables and "| -25.0 [" in tables


def test_paired_differences_are_given_at_every_seed_and_between_seeds(tmp_path):
    """With two training seeds certified for both, the paired table has a row per seed (each the exact difference
    of that seed's two files) and the between-seeds table their mean, min and max; one seed gives no such table."""
    module = reproduce_module()
    results_part = reproduce_part("results")
    tables_part = reproduce_part("tables")
    root = tmp_path / "mnist10k"

    def write(run: str, radii: list[float]) -> None:  # four images, label 1; radius -1: abstained
        folder = root / "certify" / run
        folder.mkdir(parents=True)
        rows = "".join(f"{idx}\t1\t{1 if r >= 0 else -1}\t{max(r, 0.0)}\t{int(r >= 0)}\t1.0\t100\n"
                       for idx, r in zip((0, 5, 10, 15), radii, strict=True))
        (folder / "certify.tsv").write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\tsamples\n" + rows)
        (folder / "summary.json").write_text(json.dumps({"sigma": 0.25, "average_certified_radius": 0.1,
                                                         "abstention_rate": 0.0}))

    write("sepdp_s0", [0.3, 0.3, 0.1, -1])
    write("transdenoiser_s0", [0.3, 0.3, 0.3, 0.3])  # +25 points at r = 0, +50 at 0.25
    settings = module.Settings(datasets=["mnist10k"], out=tmp_path, runs=("sepdp", "transdenoiser"))
    result = results_part.collect(root, settings)
    assert "between_seeds" not in result["paired"]["transdenoiser"]
    tables_part.write_tables(result, tmp_path / "one.md", settings, "header")
    assert "Between training seeds" not in (tmp_path / "one.md").read_text()
    write("sepdp_s1", [0.3, -1, -1, -1])
    write("transdenoiser_s1", [0.3, 0.3, -1, -1])  # +25 at r = 0, +25 at 0.25
    result = results_part.collect(root, settings)
    entry = result["paired"]["transdenoiser"]
    assert [e["seed"] for e in entry["per_seed"]] == [0, 1] and entry["seed"] == 0
    assert entry["per_seed"][1]["difference"][:2] == pytest.approx([0.25, 0.25])
    between = entry["between_seeds"]
    assert between["seeds"] == [0, 1]
    assert between["mean"][:2] == pytest.approx([0.25, 0.375]) and between["low"][1] == pytest.approx(0.25)
    assert between["high"][1] == pytest.approx(0.5)
    tables_part.write_tables(result, tmp_path / "two.md", settings, "header")
    tables = (tmp_path / "two.md").read_text()
    assert "| TransDenoiser | 0 | 4 | +25.0 [" in tables and "| TransDenoiser | 1 | 4 | +25.0 [" in tables
    assert "| TransDenoiser | 0, 1 | +25.0 [+25.0, +25.0] | +37.5 [+25.0, +50.0] |" in tables
    assert "mean over the training seeds that have run, up to 2" in tables


def test_the_baselines_own_certificates_are_named_and_shown_beside_smoothing(tmp_path):
    """tables.md names each baseline's own certificate (Phan et al.'s bound for SecureSGD, StoBatch's own for
    StoBatch: not Phan et al.'s 2019 bound) and gives randomized smoothing of the same randomised model beside it,
    each computed from baseline_certify.tsv's columns."""
    module = reproduce_module()
    results_part = reproduce_part("results")
    tables_part = reproduce_part("tables")
    root = tmp_path / "mnist10k"
    header = "idx\tlabel\tphan_predict\tphan_radius\tphan_correct\tsmooth_predict\tsmooth_radius\tsmooth_correct\n"
    for run in ("securesgd-prt_s0", "stobatch_s0"):  # four images: own certificate 1.0, 1.0, 0.1, wrong
        folder = root / "baseline_certify" / run  # smoothing: 0.3, abstained, abstained, abstained
        folder.mkdir(parents=True)
        (folder / "baseline_certify.tsv").write_text(header + "0\t1\t1\t1.0\t1\t1\t0.3\t1\n5\t1\t1\t1.0\t1\t-1\t0\t0\n"
                                                     "10\t1\t1\t0.1\t1\t-1\t0\t0\n15\t1\t2\t0.5\t0\t-1\t0\t0\n")
    settings = module.Settings(datasets=["mnist10k"], out=tmp_path, runs=("securesgd-prt", "stobatch"))
    tables_part.write_tables(results_part.collect(root, settings), tmp_path / "tables.md", settings, "header")
    tables = (tmp_path / "tables.md").read_text()
    assert "| SecureSGD_prt, Phan et al.'s bound | 4 | 75.0 | 50.0 | 50.0 | 50.0 | 50.0 |" in tables
    assert "| StoBatch, StoBatch's own certificate | 4 | 75.0 | 50.0 | 50.0 | 50.0 | 50.0 |" in tables
    assert "| StoBatch, randomized smoothing of the randomised model | 4 | 25.0 | 25.0 | 0.0 | 0.0 | 0.0 |" in tables
    assert "StoBatch, Phan et al." not in tables
