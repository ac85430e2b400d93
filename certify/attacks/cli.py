"""Subcommands ``attack`` (accuracy under attack, per epsilon) and ``audit`` (do certificates survive an attack?)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from transdenoiser.argtypes import (
    add_deprecated_spelling,
    float_list,
    nonnegative_float,
    open_unit_interval,
    positive_float,
    positive_int,
)
from transdenoiser.errors import UserError
from transdenoiser.progress import bar
from transdenoiser.runtime import hardware_description, resolve_device, seed_everything

EXIT_AUDIT_FAILED = 1


def nonnegative_float_list(text: str) -> list[float]:
    """Comma-separated epsilons, each >= 0, e.g. ``0.5,1,1.5,2``."""
    values = float_list(text)
    negative = [v for v in values if v < 0]
    if negative:
        raise argparse.ArgumentTypeError(f"epsilon must be >= 0, got {negative[0]:g}")
    return values


def margin_fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {value}")
    return value


def register(subparsers, common) -> None:
    from certify.attacks.names import ATTACK_NAMES as ATTACKS
    from certify.attacks.names import DEFAULT_MOMENTUM_DECAY, NORMS, THREATS
    from training.cli import add_dataset_args

    p = subparsers.add_parser(
        "attack", parents=[common], help="accuracy of the smoothed and noisy predictions under FGSM/I-FGSM/MIM/PGD",
        description="Attack test images under one threat model at each epsilon and report the accuracy of the "
                    "smoothed prediction (abstain = wrong) and of a single noisy pass on the adversarial examples, "
                    "with the clean values as reference. Writes OUT/attack.json, attack.tsv and attack.png.")
    p.add_argument("--classifier", type=Path, required=True, help="classifier checkpoint directory")
    p.add_argument("--denoiser", type=Path, default=None, help="denoiser checkpoint directory (default: none)")
    add_dataset_args(p)
    p.add_argument("--split", choices=("public", "private", "test"), default="test",
                   help="split whose images are attacked (default: test)")
    p.add_argument("--attack", choices=tuple(ATTACKS), required=True, help="fgsm, ifgsm (BIM), mim or pgd")
    p.add_argument("--norm", choices=NORMS, default="l2", help="perturbation norm (default: l2)")
    p.add_argument("--eps", type=nonnegative_float_list, default=[0.5, 1.0, 1.5, 2.0],
                   help="comma-separated budgets in [0,1]-pixel units of --norm (default: 0.5,1,1.5,2)")
    p.add_argument("--threat", choices=THREATS, default="pipeline",
                   help="classifier: white-box on the classifier alone; pipeline: denoiser+classifier with EOT over "
                        "the Gaussian noise; smoothed: SmoothAdv on the smoothed soft classifier (default: pipeline)")
    p.add_argument("--sigma", type=positive_float, default=0.25,
                   help="smoothing noise standard deviation, pixels in [0,1] (default: 0.25)")
    p.add_argument("--steps", type=positive_int, default=10, help="iterations of ifgsm/mim/pgd (default: 10)")
    p.add_argument("--step-size", type=positive_float, default=None,
                   help="step length in --norm units (default: 2.5 * eps / steps, Madry et al.)")
    p.add_argument("--decay", type=nonnegative_float, default=DEFAULT_MOMENTUM_DECAY,
                   help=f"MIM momentum decay mu (default: {DEFAULT_MOMENTUM_DECAY:g})")
    p.add_argument("--eot", type=positive_int, default=8,
                   help="noise draws per gradient for the pipeline and smoothed threats (default: 8)")
    p.add_argument("--n", type=positive_int, default=100, help="noise samples per smoothed prediction (default: 100)")
    p.add_argument("--alpha", type=open_unit_interval, default=0.001,
                   help="smoothed prediction's abstention test level (default: 0.001)")
    p.add_argument("--max-images", dest="max_images", type=positive_int, default=100,
                   help="how many images are attacked, spread evenly over the split (a count; default: 100)")
    add_deprecated_spelling(p, "--max", "--max-images", "max_images", type=positive_int)
    p.add_argument("--batch-size", type=positive_int, default=100, help="images attacked at once (default: 100)")
    p.add_argument("--allow-sigma-mismatch", action="store_true",
                   help="allow a --sigma other than the denoiser's training sigma (refused by default)")
    from certify.cli import add_numerics_args

    add_numerics_args(p.add_argument_group("predictions (the attack's gradients are float32, eager)"))
    p.add_argument("--out", type=Path, default=Path("runs/attack"), help="output directory (default: runs/attack)")
    p.set_defaults(handler=cmd_attack)

    p = subparsers.add_parser(
        "audit", parents=[common], help="attack a certify run's certified examples inside their radius",
        description="For each certified example of a certify run, run SmoothAdv-PGD (L2) at radius*(1-margin), "
                    "just inside its certified radius, re-predict with the smoothed classifier (fresh noise) and "
                    "count changed predictions. More changes than alpha allows (one-sided binomial test) is a bug: "
                    f"the command says so and exits {EXIT_AUDIT_FAILED}. Writes RUN_DIR/audit.json and audit.tsv.")
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a certify run (certify.tsv + summary.json)")
    p.add_argument("--max", type=positive_int, default=None, help="audit at most this many certified examples")
    p.add_argument("--steps", type=positive_int, default=20, help="PGD iterations (default: 20)")
    p.add_argument("--step-size", type=positive_float, default=None,
                   help="PGD step length (default: 2.5 * eps / steps)")
    p.add_argument("--m", type=positive_int, default=8, help="noise draws per SmoothAdv gradient (default: 8)")
    p.add_argument("--n", type=positive_int, default=1000, help="noise samples per re-prediction (default: 1000)")
    p.add_argument("--margin", type=margin_fraction, default=0.01,
                   help="attack at radius * (1 - margin) (default: 0.01)")
    p.add_argument("--predict-alpha", type=open_unit_interval, default=None,
                   help="re-prediction's test level (default: the certify run's alpha)")
    p.add_argument("--batch-size", type=positive_int, default=50, help="examples attacked at once (default: 50)")
    add_numerics_args(p.add_argument_group("re-predictions (must be the certify run's)"), default_precision=None)
    p.add_argument("--out", type=Path, default=None, help="where audit.json/audit.tsv go (default: RUN_DIR)")
    p.set_defaults(handler=cmd_audit)


def _checkpoint_path(path: Path | None, flag: str) -> Path | None:
    if path is not None and not path.is_dir():
        raise UserError(f"{flag} {path}: no such checkpoint directory")
    return path


def cmd_attack(args) -> int:
    from certify.attacks.evaluate import AttackConfig
    from certify.numerics import canonical_precision

    started = time.perf_counter()
    device = resolve_device(args.device)
    seed_everything(args.seed)
    config = AttackConfig(attack=args.attack, norm=args.norm, eps=tuple(args.eps), threat=args.threat,
                          sigma=args.sigma, steps=args.steps, step_size=args.step_size, eot=args.eot, n=args.n,
                          alpha=args.alpha, decay=args.decay, batch_size=args.batch_size,
                          precision=canonical_precision(args.precision), compile=args.compile)
    config.validate()
    from transdenoiser.lock import RunLock

    with RunLock(args.out, purpose="attack"):  # one writer per run directory: two attacks never share an --out
        return _attack(args, config, device, started)


def _attack(args, config, device, started: float) -> int:
    from certify.attacks.evaluate import FORMAT_VERSION, RESULT_FORMAT, evenly_spaced, run_attack_eval
    from certify.attacks.report import write_attack_outputs
    from certify.job import check_models_and_data
    from certify.pipeline import check_dataset_fits, load_pipeline
    from training.cli import load_dataset_from_args

    pipeline = load_pipeline(_checkpoint_path(args.classifier, "--classifier"),
                             _checkpoint_path(args.denoiser, "--denoiser"), device)
    dataset = load_dataset_from_args(args)
    split = dataset.split(args.split)
    check_dataset_fits(pipeline, dataset.image_shape, dataset.num_classes, f"dataset {dataset.name}")
    check_models_and_data(args, pipeline, dataset.name, warn=lambda message: print(message, file=sys.stderr))
    indices = evenly_spaced(len(split), args.max_images)
    images, labels = split.subset(indices).tensors(device)
    record = run_attack_eval(pipeline, images, labels, config, args.seed, track=bar)
    record = {
        "format": RESULT_FORMAT, "format_version": FORMAT_VERSION,
        "settings": {**record["settings"], "classifier": str(args.classifier),
                     "denoiser": str(args.denoiser) if args.denoiser else None, "dataset": dataset.name,
                     "data_root": str(args.data_root) if args.data_root else None, "split_seed": args.split_seed,
                     "split": args.split, "max": args.max_images, "image_selection": "evenly spaced over the split",
                     "seed": args.seed, "device": str(device)},
        "hardware": hardware_description(device),
        "command": " ".join(["transdenoiser"] + sys.argv[1:]),
        "num_images": record["num_images"], "image_indices": indices.tolist(),
        "clean": record["clean"], "results": record["results"],
        "classifier_metadata": pipeline.classifier_metadata, "denoiser_metadata": pipeline.denoiser_metadata,
        "seconds": time.perf_counter() - started,
    }
    files = write_attack_outputs(record, args.out)
    print(f"{args.attack} ({args.norm}) under threat {args.threat}, sigma {args.sigma:g}, {record['num_images']} "
          f"{dataset.name} {args.split} images, {record['hardware']}")
    print(f"{'eps':>6}  {'smoothed acc':>12}  {'abstain':>7}  {'noisy acc':>9}  {'base acc':>8}  {'max norm':>8}")
    rows = [{"eps": 0.0, **record["clean"], "max_norm": 0.0}] + record["results"]
    for row in rows:
        print(f"{row['eps']:>6g}  {row['smoothed_accuracy']:>12.3f}  {row['smoothed_abstain_rate']:>7.3f}  "
              f"{row['noisy_accuracy']:>9.3f}  {row['base_accuracy']:>8.3f}  {row['max_norm']:>8.4f}")
    print(f"(eps 0 = clean reference; {record['seconds']:.0f} s) wrote {', '.join(str(f) for f in files)}")
    return 0


def _write_audit(result: dict, out_dir: Path) -> list[Path]:
    from training.checkpoint import write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "audit.json"
    write_text(json_path, json.dumps(result, indent=2) + "\n")
    tsv_path = out_dir / "audit.tsv"
    columns = ("idx", "label", "certified", "radius", "eps", "norm", "after", "outcome")
    lines = ["\t".join(columns)] + ["\t".join(str(row[c]) for c in columns) for row in result["examples"]]
    write_text(tsv_path, "\n".join(lines) + "\n")
    return [json_path, tsv_path]


def cmd_audit(args) -> int:
    from certify.attacks.evaluate import AuditConfig, audit_certify_run, audit_numerics, read_run_to_audit
    from certify.pipeline import check_dataset_fits, load_pipeline
    from training.datasets import load_dataset

    device = resolve_device(args.device)
    seed_everything(args.seed)
    run = read_run_to_audit(args.run_dir)
    settings = run.settings
    config = AuditConfig(margin=args.margin, steps=args.steps, step_size=args.step_size, m=args.m, n=args.n,
                         predict_alpha=args.predict_alpha, max_examples=args.max, batch_size=args.batch_size,
                         precision=args.precision, compile=args.compile)
    audit_numerics(run, config)  # another precision than the run's is refused before anything is loaded
    denoiser = Path(settings["denoiser"]) if settings.get("denoiser") else None
    pipeline = load_pipeline(_checkpoint_path(Path(settings["classifier"]), "classifier"),
                             _checkpoint_path(denoiser, "denoiser"), device)
    dataset = load_dataset(settings["dataset"], settings.get("data_root"), int(settings["split_seed"]))
    check_dataset_fits(pipeline, dataset.image_shape, dataset.num_classes, f"dataset {dataset.name}")
    split = dataset.split(settings["split"])
    for row in run.rows:
        if not 0 <= row["idx"] < len(split) or int(split.labels[row["idx"]]) != row["label"]:
            raise UserError(f"{args.run_dir}: row idx {row['idx']} (label {row['label']}) does not match the "
                            f"{settings['split']} split of {dataset.name} (split seed {settings['split_seed']})")
    images, _ = split.tensors(device)
    result = audit_certify_run(run, pipeline, images, config, args.seed, track=bar)
    result["hardware"] = hardware_description(device)
    files = _write_audit(result, args.out or args.run_dir)
    print(f"audit of {args.run_dir}: {result['audited']} certified examples attacked (SmoothAdv-PGD L2, "
          f"{args.steps} steps, m={args.m}) at radius*(1-{args.margin:g}), re-predicted with n={args.n}")
    print(f"kept {result['kept']}, abstained {result['abstained']} (not violations), "
          f"CHANGED {result['changed']} (rate {result['changed_rate']:.4f})")
    print(f"certify alpha {result['alpha']:g}, re-predict alpha {result['settings']['predict_alpha']:g}: "
          f"allowed rate {result['null_rate']:g}; one-sided binomial p-value {result['pvalue']:.3g}")
    print(f"wrote {', '.join(str(f) for f in files)}")
    if result["failed"]:
        print(f"AUDIT FAILED: {result['changed']} of {result['audited']} certified predictions changed inside "
              f"their certified radius, more than alpha allows (p = {result['pvalue']:.3g} < {result['alpha']:g}). "
              "The certificates are not valid: this is a bug to fix.", file=sys.stderr)
        return EXIT_AUDIT_FAILED
    if result["changed"]:
        print(f"note: {result['changed']} changed prediction(s), within what alpha allows", file=sys.stderr)
    return 0
