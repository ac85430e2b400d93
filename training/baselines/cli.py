"""Subcommand ``baseline-certify``: a baseline's own robustness certificate beside randomized smoothing of the same
randomised model, per image. SecureSGD (arms securesgd-prt, securesgd-sct): Phan et al.'s PixelDP-style bound of
the Gaussian noise layer; StoBatch (arm stobatch): its Laplace noise layer's bound
(:func:`training.baselines.stobatch.certified_robustness`)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transdenoiser.argtypes import nonnegative_int, open_unit_interval, positive_float, positive_int
from transdenoiser.errors import UserError

KINDS = ("securesgd-prt", "securesgd-sct", "stobatch")  # the checkpoints baseline-certify takes (their "arm")
COLUMNS = ("idx", "label", "phan_predict", "phan_radius", "phan_correct", "phan_p_lower", "phan_p_upper",
           "phan_epsilon", "phan_delta", "smooth_predict", "smooth_radius", "smooth_correct", "smooth_p_lower",
           "smooth_count")
# after COLUMNS in a stobatch run: the own certificate's vote count and its L1 and L-infinity radii, and the paper's
# kappa + phi bound (NOT a certificate; docs/BASELINES.md)
STOBATCH_COLUMNS = ("stobatch_count", "stobatch_radius_l1", "stobatch_radius_linf", "stobatch_paper_bound_l1")
RADII = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
# A run's own record, so that an interrupted run resumes: its settings, and one JSON row per image, flushed as done.
SETTINGS_FILE = "baseline_certify.settings.json"
ROWS_FILE = "baseline_certify.rows.jsonl"


def register(subparsers, common) -> None:
    from training.cli import add_dataset_args

    p = subparsers.add_parser(
        "baseline-certify", parents=[common],
        help="a baseline's own robustness certificate (SecureSGD, StoBatch) beside randomized smoothing of the "
             "same model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="For each image of a split: the baseline's own certificate of its randomised model (argmax "
                    "counts over the noise layer's draws, n0 to select the class, n to bound it with "
                    "Clopper-Pearson at --alpha; SecureSGD: Phan et al. 2019's largest attack size whose (epsilon, "
                    "delta) meets Lecuyer et al.'s condition under the HGM calibration; StoBatch: Phan et al. "
                    "2020's Laplace bound, an L1 radius written as L2 = L1 / sqrt(d)), and randomized smoothing "
                    "(Cohen et al.) of the SAME randomised model (input noise --sigma plus the noise layer). Writes "
                    "OUT/baseline_certify.tsv (columns: " + " ".join(COLUMNS) + "; stobatch adds "
                    + " ".join(STOBATCH_COLUMNS) + ") and OUT/summary.json. Radii are L2 in [0,1]-pixel units. "
                    "Each image draws its noise from its own seed and is recorded as it is done "
                    f"(OUT/{ROWS_FILE}), so an interrupted run resumes where it stopped, with the same rows, when "
                    f"run again with the same --out and settings (OUT/{SETTINGS_FILE}; other settings are "
                    "refused). See docs/BASELINES.md.",
        epilog="examples: transdenoiser baseline-certify --model runs/ssgd_sct --out runs/bcert_sct --max-images 100\n"
               "          transdenoiser baseline-certify --model runs/stobatch --sigma 0.25 --out runs/bcert_stobatch")
    p.add_argument("--model", type=Path, required=True,
                   help="a checkpoint of arm " + ", ".join(KINDS) + " (read from its metadata)")
    p.add_argument("--classifier", type=Path, default=None,
                   help="the frozen classifier behind a securesgd-prt denoiser (default: the one recorded in it)")
    add_dataset_args(p)
    p.add_argument("--split", choices=("public", "private", "test"), default="test", help="split (default: test)")
    p.add_argument("--skip", type=positive_int, default=1, help="certify every SKIP-th image (default: 1)")
    p.add_argument("--max-images", type=nonnegative_int, default=100, help="at most this many images (0: all; "
                   "default: 100)")
    p.add_argument("--n0", type=positive_int, default=100, help="selection draws per image (default: 100)")
    p.add_argument("--n", type=positive_int, default=1000, help="estimation draws per image (default: 1000)")
    p.add_argument("--alpha", type=open_unit_interval, default=0.001,
                   help="failure probability of each certificate (default: 0.001)")
    p.add_argument("--sigma", type=positive_float, default=None,
                   help="randomized smoothing sigma (default: the model's training sigma; required for stobatch, "
                        "whose training noise is Laplace)")
    p.add_argument("--batch-size", type=positive_int, default=500, help="draws per forward pass (default: 500)")
    p.add_argument("--out", type=Path, required=True,
                   help="output folder; an interrupted run there with the same settings is resumed")
    p.set_defaults(handler=cmd_baseline_certify)


def cmd_baseline_certify(args) -> int:
    from transdenoiser.lock import RunLock

    arm = baseline_arm(args.model)  # before the lock: a wrong checkpoint leaves no output folder behind
    with RunLock(args.out, purpose="baseline-certify"):
        return _run(args, arm)


def baseline_arm(model_dir: Path) -> str:
    """The arm that wrote ``model_dir``, from its metadata (the ``arm`` key and the arm's own section)."""
    from training.checkpoint import read_metadata

    meta = read_metadata(model_dir)
    arm = meta.get("arm")
    section = {"securesgd-prt": "securesgd", "securesgd-sct": "securesgd", "stobatch": "stobatch"}.get(arm)
    if section is None or not isinstance(meta.get(section), dict):
        what = f"arm {arm}" if isinstance(arm, str) else f"a {meta.get('kind')} with no baseline arm"
        raise UserError(f"{model_dir} is {what}; baseline-certify takes checkpoints of arm {', '.join(KINDS)}")
    return arm


@dataclass
class _Baseline:
    """What the certificate loop needs of one baseline: the model's metadata, a function giving one image's own
    certificate as the phan_* columns (and any extra ones), randomized smoothing of the randomised model, and the
    summary's arm-specific parts."""

    meta: dict[str, Any]
    own: Callable[[int, Any, int], dict[str, Any]]  # (idx, image, label) -> columns
    smooth: Any  # certify.core.Smooth
    columns: tuple[str, ...]
    note: str
    summary: dict[str, Any] = field(default_factory=dict)


def _securesgd(args, device, seed: int) -> _Baseline:
    import torch

    from certify.core import Smooth
    from training.baselines.common import argmax_counts, certificate_seed
    from training.baselines.securesgd_certify import load_securesgd, phan_certificate
    from training.checkpoint import load_checkpoint

    baseline = load_securesgd(args.model, device)
    meta = baseline.metadata
    noisy = baseline.noisy().to(device)
    sigma = args.sigma or meta["sigma"]
    # workers=1: the noise layer draws from torch's global generator, whose order must not depend on threads
    if meta["kind"] == "denoiser":
        classifier_dir = args.classifier or Path(meta["classifier"]["path"])
        classifier = load_checkpoint(classifier_dir, kind="classifier", map_location=device).model.eval()
        for p in classifier.parameters():
            p.requires_grad_(False)
        num_classes = int(meta["classifier"]["num_classes"])

        def predict(x):
            return classifier(noisy(x))

        smooth = Smooth(classifier, num_classes, sigma, denoiser=noisy, batch_size=args.batch_size, device=device,
                        workers=1)
    else:
        if args.classifier is not None:
            raise UserError("--classifier is only for securesgd-prt denoisers; a securesgd-sct model is a classifier")
        num_classes = int(meta["num_classes"])
        predict = noisy
        smooth = Smooth(noisy, num_classes, sigma, batch_size=args.batch_size, device=device, workers=1)

    def own(idx: int, x, y: int) -> dict[str, Any]:
        torch.manual_seed(certificate_seed(seed, idx))  # the noise layer's draws, then smoothing's layer draws
        selection = argmax_counts(predict, x, args.n0, num_classes, args.batch_size)
        estimation = argmax_counts(predict, x, args.n, num_classes, args.batch_size)
        phan = phan_certificate(selection, estimation, args.alpha, baseline.attack_size)
        return {"phan_predict": phan.prediction, "phan_radius": phan.radius, "phan_correct": int(phan.prediction == y),
                "phan_p_lower": phan.p_lower, "phan_p_upper": phan.p_upper, "phan_epsilon": phan.epsilon,
                "phan_delta": phan.delta}

    note = ("Phan et al.'s certificate (2019): the noise layer's draws only (input noise not counted); accuracy at "
            "radius 0 is the top class's accuracy, radius r > 0 needs a certificate")
    return _Baseline(meta, own, smooth, COLUMNS, note, {"noise_layer": meta.get("securesgd")})


def _stobatch(args, device, seed: int) -> _Baseline:
    import torch

    from certify.core import Smooth
    from training.baselines.common import certificate_seed
    from training.baselines.stobatch_certify import ABSTAIN, certificate_generator, load_stobatch

    if args.classifier is not None:
        raise UserError("--classifier is only for securesgd-prt denoisers; a stobatch model is a classifier")
    if args.sigma is None:
        raise UserError("give --sigma for a stobatch model: it records no Gaussian training sigma (its training "
                        "noise is Laplace)")
    baseline = load_stobatch(args.model, device)
    # smoothing's base classifier: the randomised model, its Laplace draws from torch's global generator (seeded
    # per image below; workers=1 so their order does not depend on threads)
    smooth = Smooth(baseline.noisy(), baseline.num_classes, args.sigma, batch_size=args.batch_size, device=device,
                    workers=1)

    def own(idx: int, x, y: int) -> dict[str, Any]:
        cert = baseline.certify(x, args.n0, args.n, args.alpha, args.batch_size, certificate_generator(seed, idx))
        torch.manual_seed(certificate_seed(seed, idx, stream=2))  # smoothing's Laplace draws: a stream apart
        certified = cert.prediction != ABSTAIN
        return {"phan_predict": cert.prediction, "phan_radius": cert.radius_l2,
                "phan_correct": int(certified and cert.prediction == y), "phan_p_lower": cert.p_lower,
                "phan_p_upper": 1.0 - cert.p_lower, "phan_epsilon": cert.epsilon_r if certified else None,
                "phan_delta": 0.0 if certified else None, "stobatch_count": cert.count,
                "stobatch_radius_l1": cert.radius_l1, "stobatch_radius_linf": cert.radius_linf,
                "stobatch_paper_bound_l1": cert.paper_bound_l1}

    note = ("StoBatch's certificate (Phan et al. 2020, made sound): the Laplace noise at the input and the first layer "
            f"only (smoothing's input noise not counted); an L1 radius, written as L2 = L1 / sqrt(d), d = "
            f"{baseline.pixels}; ABSTAIN (phan_predict -1, counted wrong) unless p_lower > 1/2; phan_p_upper is "
            "1 - p_lower, phan_epsilon the robust epsilon_r, phan_delta 0 (pure DP)")
    settings = baseline.metadata["stobatch"]
    summary = {"noise_layer": {"input_laplace_scale": baseline.input_scale,
                               "hidden_laplace_scale": baseline.hidden_scale,
                               "first_layer_l1_norm": baseline.first_layer_l1_norm, "pixels": baseline.pixels,
                               "first_layer": settings.get("first_layer")}}
    return _Baseline(baseline.metadata, own, smooth, COLUMNS + STOBATCH_COLUMNS, note, summary)


def _format(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def certified_accuracy_by_radius(rows: list[dict[str, Any]], prefix: str) -> dict[str, float]:
    """:func:`certify.summary.certified_accuracy` of the ``prefix`` certificates of ``rows`` at each radius of
    ``RADII`` (L2, pixels in [0, 1]), keyed by the radius as text."""
    from certify.summary import certified_accuracy

    certificates = [{"radius": r[f"{prefix}_radius"], "correct": r[f"{prefix}_correct"]} for r in rows]
    return {f"{radius:g}": certified_accuracy(certificates, radius) for radius in RADII}


def _run(args, arm: str) -> int:
    import json
    import time

    import numpy as np

    from certify.core import validate_sampling
    from certify.journal import RowJournal
    from training.checkpoint import write_json, write_text
    from training.cli import load_dataset_from_args
    from transdenoiser.checks import check_same_dataset
    from transdenoiser.progress import bar
    from transdenoiser.runtime import hardware_description, resolve_device, seed_everything

    validate_sampling(args.n0, args.n, args.alpha)
    device = resolve_device(args.device)
    seed_everything(args.seed)
    baseline = (_stobatch if arm == "stobatch" else _securesgd)(args, device, args.seed)
    meta = baseline.meta
    dataset = load_dataset_from_args(args)
    check_same_dataset(dataset.name, meta, f"model {args.model}")
    split = dataset.split(args.split)
    if tuple(dataset.image_shape) != tuple(meta["input_shape"]):
        raise UserError(f"{dataset.name} has images of shape {dataset.image_shape}, the model takes "
                        f"{meta['input_shape']}")
    indices = list(range(0, len(split), args.skip))
    if args.max_images:
        indices = indices[:args.max_images]
    images, labels = split.subset(np.asarray(indices, dtype=np.int64)).tensors(device)
    args.out.mkdir(parents=True, exist_ok=True)
    smooth = baseline.smooth
    # everything a row depends on: image idx's noise comes from (seed, idx) alone, so a resumed run's rows are those
    # of an uninterrupted one (the batch size is kept too: it orders the noise layer's draws)
    recorded = meta.get("classifier")
    classifier = args.classifier or (recorded.get("path") if isinstance(recorded, dict) else None)
    settings = json.loads(json.dumps({
        "arm": arm, "model_files": meta.get("files"),
        "classifier": None if classifier is None else str(Path(classifier).resolve()), "dataset": dataset.name,
        "data_root": None if args.data_root is None else str(Path(args.data_root).resolve()),
        "split_seed": args.split_seed,
        "split": args.split, "indices": indices, "n0": args.n0, "n": args.n, "alpha": args.alpha,
        "seed": args.seed, "sigma": smooth.sigma, "batch_size": args.batch_size}))
    journal = RowJournal(args.out, SETTINGS_FILE, ROWS_FILE, key="idx", what="baseline-certify")
    done = journal.open(settings, indices)
    todo = [i for i, idx in enumerate(indices) if idx not in done]
    if done:
        print(f"resuming {args.out}: {len(done)} of {len(indices)} images done", file=sys.stderr)
    with journal.appending() as record:
        for i in bar(todo, desc="baseline-certify", total=len(todo)):
            idx, x, y = indices[i], images[i], int(labels[i])
            started = time.perf_counter()
            row = {"idx": idx, "label": y, **baseline.own(idx, x, y)}
            cohen = smooth.certify(x, args.n0, args.n, args.alpha, smooth.image_generator(args.seed, idx))
            row.update({"smooth_predict": cohen.prediction, "smooth_radius": cohen.radius,
                        "smooth_correct": int(cohen.prediction == y), "smooth_p_lower": cohen.p_lower,
                        "smooth_count": cohen.count, "seconds": time.perf_counter() - started})
            record.write(row)
            done[idx] = row
    smooth.close()
    rows = [done[idx] for idx in indices]
    lines = ["\t".join(baseline.columns)] + ["\t".join(_format(r[c]) for c in baseline.columns) for r in rows]
    write_text(args.out / "baseline_certify.tsv", "\n".join(lines) + "\n")

    def mean(values: list) -> float | None:
        return float(np.mean(values)) if values else None

    summary = {
        "model": str(args.model), "arm": arm, "dataset": dataset.name, "split": args.split,
        "num_images": len(rows), "indices": indices, "n0": args.n0, "n": args.n, "alpha": args.alpha,
        "seed": args.seed, "smoothing_sigma": smooth.sigma, "radius_units": "L2, pixels in [0, 1]",
        "phan": {"certified_accuracy": certified_accuracy_by_radius(rows, "phan"),
                 "accuracy": mean([r["phan_correct"] for r in rows]),
                 "abstain_rate": mean([r["phan_predict"] == -1 for r in rows]),
                 "median_radius": float(np.median([r["phan_radius"] for r in rows])) if rows else None,
                 "note": baseline.note},
        "smoothing": {"certified_accuracy": certified_accuracy_by_radius(rows, "smooth"),
                      "abstain_rate": mean([r["smooth_predict"] == -1 for r in rows]),
                      "median_radius": float(np.median([r["smooth_radius"] for r in rows])) if rows else None,
                      "note": f"randomized smoothing (Cohen et al.) at sigma {smooth.sigma:g} of the same randomised "
                              "model (its noise layer included); abstentions count as wrong"},
        **baseline.summary, "privacy": meta.get("privacy"),
        "seconds": sum(r.get("seconds", 0.0) for r in rows), "images_resumed": len(indices) - len(todo),
        "seconds_note": "wall seconds of the images' certificates, summed over this run and the runs it resumed",
        "hardware": hardware_description(device),
    }
    write_json(args.out / "summary.json", summary)
    print(f"{len(rows)} images of {dataset.name}'s {args.split} split ({arm}); certified accuracy by L2 radius:")
    print(f"  radius  {'own' if arm == 'stobatch' else 'phan':<7}  smoothing")
    for radius in RADII:
        key = f"{radius:g}"
        print(f"  {radius:>5g}  {100 * summary['phan']['certified_accuracy'][key]:6.1f}%  "
              f"{100 * summary['smoothing']['certified_accuracy'][key]:6.1f}%")
    print(f"wrote {args.out}/baseline_certify.tsv and summary.json", file=sys.stderr)
    return 0
