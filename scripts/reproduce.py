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
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its parts: scripts/reproduce_*.py

from reproduce_common import (
    ARM_RUNS,
    ATTACKS,
    BASELINE_ARMS,
    CONFIGS,
    DP_ARMS,
    FIGURE4_BOUND,
    FROM_SCRATCH_ARMS,
    LABELS,
    PAPER_EPSILON,
    REPO,
    STAGES,
    XI_LOW_ABOVE_PAPER_EPSILON,
    Settings,
    flag_value,
    read_json,
    step_lines,
)
from reproduce_estimate import estimate, export_results, export_summaries, with_recorded_seconds
from reproduce_runner import (
    Runner,
    available_arms,
    available_commands,
    checkpoint_complete,
    evenly_spaced_indices,
    set_aside_interrupted,
    split_sizes,
)
from reproduce_tables import command_datasets, default_datasets, write_results


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
    p.add_argument("--summaries", type=Path, default=None, metavar="DIR",
                   help="write the summaries the docs keep to DIR (per data set tables.md, results.json and the "
                        "figures; commands.txt; steps.jsonl gzipped as steps.jsonl.gz); run nothing")
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
    if args.export is not None and args.summaries is not None:
        p.error("--export and --summaries: give one")
    missing = [str(path) for path in args.estimate_from or ()  # a steps.jsonl may be kept as steps.jsonl.gz
               if not (path.is_file() or path.with_name(path.name + ".gz").is_file())]
    if missing:
        p.error(f"--estimate-from: no such file: {', '.join(missing)}")
    return settings, args


def main(argv: list[str] | None = None) -> int:
    from transdenoiser.errors import UserError
    from transdenoiser.runtime import discard_stdout

    argv = sys.argv[1:] if argv is None else argv
    settings, args = parse_args(argv)
    try:
        return run(settings, args, argv)
    except UserError as exc:  # e.g. a data set that is not installed: one line, as the CLI gives it
        print(f"scripts/reproduce.sh: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the plan piped into `head` and the like: not an error
        discard_stdout()
        return 0


def run(settings: Settings, args: argparse.Namespace, argv: list[str]) -> int:
    """Export, plan, estimate or run the steps that ``settings`` name."""
    exports = {"--export": (args.export, export_results), "--summaries": (args.summaries, export_summaries)}
    for flag, (dest, write) in exports.items():
        if dest is None:
            continue
        if not (settings.out / "steps.jsonl").is_file():
            print(f"scripts/reproduce.sh: error: {flag}: {settings.out} holds no run (no steps.jsonl)",
                  file=sys.stderr)
            return 2
        try:
            copied = write(settings.out, dest)
        except ValueError as exc:
            print(f"scripts/reproduce.sh: error: {exc}", file=sys.stderr)
            return 2
        print(f"exported {len(copied)} files to {dest}")
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
        measured = []
        for path in args.estimate_from:  # a steps.jsonl, or the gzip copy steps.jsonl.gz the summaries keep
            try:
                steps = [json.loads(line) for line in step_lines(path) if line.strip()]
            except (OSError, ValueError) as exc:  # a damaged log: bad gzip, a line that is not JSON
                print(f"scripts/reproduce.sh: error: --estimate-from {path}: not a steps log ({exc})", file=sys.stderr)
                return 2
            measured.append(with_recorded_seconds(steps, path))
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
