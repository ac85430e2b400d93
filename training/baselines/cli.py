"""Subcommand ``baseline-certify``: a baseline's own robustness certificate beside randomized smoothing of the same
randomised model, per image (SecureSGD: Phan et al.'s PixelDP-style bound of the noise layer)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from transdenoiser.argtypes import nonnegative_int, open_unit_interval, positive_float, positive_int
from transdenoiser.errors import UserError

COLUMNS = ("idx", "label", "phan_predict", "phan_radius", "phan_correct", "phan_p_lower", "phan_p_upper",
           "phan_epsilon", "phan_delta", "smooth_predict", "smooth_radius", "smooth_correct")
RADII = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def register(subparsers, common) -> None:
    from training.cli import add_dataset_args

    p = subparsers.add_parser(
        "baseline-certify", parents=[common],
        help="a baseline's own robustness certificate (SecureSGD) beside randomized smoothing of the same model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="For each image of a split: Phan et al.'s certificate of a SecureSGD checkpoint (argmax counts "
                    "over the noise layer's draws, n0 to select the class, n to bound its probability and the "
                    "runner-up's with Clopper-Pearson at --alpha, then the largest attack size whose (epsilon, delta) "
                    "meets Lecuyer et al.'s condition under the HGM calibration), and randomized smoothing (Cohen et "
                    "al.) of the SAME randomised model (input noise --sigma plus the noise layer). Writes "
                    "OUT/baseline_certify.tsv (columns: " + " ".join(COLUMNS) + ") and OUT/summary.json. "
                    "Radii are L2 in [0,1]-pixel units. See docs/BASELINES.md.",
        epilog="example: transdenoiser baseline-certify --model runs/ssgd_sct --out runs/bcert_sct --max-images 100")
    p.add_argument("--model", type=Path, required=True, help="a securesgd-prt (denoiser) or securesgd-sct checkpoint")
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
                   help="randomized smoothing sigma (default: the model's training sigma)")
    p.add_argument("--batch-size", type=positive_int, default=500, help="draws per forward pass (default: 500)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.set_defaults(handler=cmd_baseline_certify)


def cmd_baseline_certify(args) -> int:
    from transdenoiser.lock import RunLock

    with RunLock(args.out, purpose="baseline-certify"):
        return _run(args)


def _run(args) -> int:
    import json
    import time

    import numpy as np
    import torch

    from certify.core import Smooth, validate_sampling
    from training.baselines.securesgd import argmax_counts, load_securesgd, phan_certificate
    from training.checkpoint import load_checkpoint, write_json, write_text
    from training.cli import load_dataset_from_args
    from transdenoiser.checks import check_same_dataset
    from transdenoiser.progress import bar
    from transdenoiser.runtime import hardware_description, resolve_device, seed_everything

    validate_sampling(args.n0, args.n, args.alpha)
    device = resolve_device(args.device)
    seed_everything(args.seed)
    baseline = load_securesgd(args.model, device)
    meta = baseline.metadata
    dataset = load_dataset_from_args(args)
    check_same_dataset(dataset.name, meta, f"model {args.model}")
    noisy = baseline.noisy().to(device)
    if meta["kind"] == "denoiser":
        classifier_dir = args.classifier or Path(meta["classifier"]["path"])
        classifier = load_checkpoint(classifier_dir, kind="classifier", map_location=device).model.eval()
        for p in classifier.parameters():
            p.requires_grad_(False)
        num_classes = int(meta["classifier"]["num_classes"])

        def predict(x):
            return classifier(noisy(x))

        smooth = Smooth(classifier, num_classes, args.sigma or meta["sigma"], denoiser=noisy,
                        batch_size=args.batch_size, device=device)
    else:
        if args.classifier is not None:
            raise UserError("--classifier is only for securesgd-prt denoisers; a securesgd-sct model is a classifier")
        num_classes = int(meta["num_classes"])
        predict = noisy
        smooth = Smooth(noisy, num_classes, args.sigma or meta["sigma"], batch_size=args.batch_size, device=device)
    split = dataset.split(args.split)
    if tuple(dataset.image_shape) != tuple(meta["input_shape"]):
        raise UserError(f"{dataset.name} has images of shape {dataset.image_shape}, the model takes "
                        f"{meta['input_shape']}")
    indices = list(range(0, len(split), args.skip))
    if args.max_images:
        indices = indices[:args.max_images]
    images, labels = split.subset(np.asarray(indices, dtype=np.int64)).tensors(device)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    started = time.perf_counter()
    for i in bar(range(len(indices)), desc="baseline-certify", total=len(indices)):
        idx, x, y = indices[i], images[i], int(labels[i])
        torch.manual_seed(np.random.SeedSequence([args.seed, idx, 1]).generate_state(1)[0])
        selection = argmax_counts(predict, x, args.n0, num_classes, args.batch_size)
        estimation = argmax_counts(predict, x, args.n, num_classes, args.batch_size)
        phan = phan_certificate(selection, estimation, args.alpha, baseline.attack_size)
        cohen = smooth.certify(x, args.n0, args.n, args.alpha, smooth.image_generator(args.seed, idx))
        rows.append({"idx": idx, "label": y, "phan_predict": phan.prediction, "phan_radius": phan.radius,
                     "phan_correct": int(phan.prediction == y), "phan_p_lower": phan.p_lower,
                     "phan_p_upper": phan.p_upper, "phan_epsilon": phan.epsilon, "phan_delta": phan.delta,
                     "smooth_predict": cohen.prediction, "smooth_radius": cohen.radius,
                     "smooth_correct": int(cohen.prediction == y)})
    smooth.close()
    lines = ["\t".join(COLUMNS)] + ["\t".join("" if r[c] is None else (f"{r[c]:.6g}" if isinstance(r[c], float)
                                                                     else str(r[c])) for c in COLUMNS) for r in rows]
    write_text(args.out / "baseline_certify.tsv", "\n".join(lines) + "\n")

    def certified_accuracy(prefix: str) -> dict[str, float]:
        return {f"{radius:g}": float(np.mean([r[f"{prefix}_correct"] and r[f"{prefix}_radius"] >= radius
                                              and (radius == 0 or r[f"{prefix}_radius"] > 0) for r in rows]))
                for radius in RADII}

    summary = {
        "model": str(args.model), "arm": meta.get("arm"), "dataset": dataset.name, "split": args.split,
        "num_images": len(rows), "n0": args.n0, "n": args.n, "alpha": args.alpha, "seed": args.seed,
        "smoothing_sigma": args.sigma or meta["sigma"],
        "phan": {"certified_accuracy": certified_accuracy("phan"),
                 "accuracy": float(np.mean([r["phan_correct"] for r in rows])) if rows else None,
                 "note": ("Phan et al.'s certificate: the noise layer's draws only (input noise not counted); "
                          "accuracy at radius 0 is the top class's accuracy, radius r > 0 needs a certificate")},
        "smoothing": {"certified_accuracy": certified_accuracy("smooth"),
                      "note": "randomized smoothing (Cohen et al.) of the same randomised model; abstentions count "
                              "as wrong"},
        "noise_layer": meta.get("securesgd"), "privacy": meta.get("privacy"),
        "seconds": time.perf_counter() - started, "hardware": hardware_description(device),
    }
    write_json(args.out / "summary.json", summary)
    print(f"{len(rows)} images of {dataset.name}'s {args.split} split; certified accuracy by L2 radius:")
    print("  radius  phan     smoothing")
    for radius in RADII:
        key = f"{radius:g}"
        print(f"  {radius:>5g}  {100 * summary['phan']['certified_accuracy'][key]:6.1f}%  "
              f"{100 * summary['smoothing']['certified_accuracy'][key]:6.1f}%")
    print(f"wrote {args.out}/baseline_certify.tsv and summary.json", file=sys.stderr)
    _ = json  # summary is JSON through write_json
    return 0
