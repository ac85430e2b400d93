"""Noisy samples per second of ``certify`` against a straightforward per-image loop in Cohen et al.'s style.

    python -m benchmarks.bench_certify                 # short: 6 images, n0 100, n 1000
    python -m benchmarks.bench_certify --n 10000 --images 3 --repeats 3 --json runs/bench/certify.json

Both sides certify the same images with the same model, the same n0, n and alpha, on the same device,
one after the other (interleaved, best of --repeats):
- baseline: Cohen's ``Smooth._sample_noise`` loop: per image, ``x.repeat`` a batch of copies,
  ``randn_like`` noise, forward, argmax, count; NCHW models as loaded; ``torch.no_grad``; run at
  the batch size of Cohen's certify.py (1000) and at ours, so the gain from batch sizing shows apart;
- ours: :func:`certify.runner.certify_dataset` (images packed into shared forward passes,
  ``inference_mode``, noise drawn on the device, channels-last and parallel forward workers on CPU;
  float32 on both sides).
Both run in one process, after the same allocator set-up (:func:`transdenoiser.runtime.keep_freed_memory`,
as the CLI does).
Each is run with the classifier alone and with a denoiser in front. Without ``--denoiser`` the
denoiser is a small randomly initialised conv/transposed-conv autoencoder built here (the speed
depends on the architecture, not on the weights). Without ``--classifier``, runs/classifier is
used if it exists, else a randomly initialised cnn28 (same architecture, same cost).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks import prepare_process
from certify.cli import DEFAULT_BATCH, workers_arg
from certify.core import Smooth, certificate_from_counts
from certify.runner import certify_dataset
from transdenoiser.runtime import hardware_description

DEFAULT_CLASSIFIER = Path("runs/classifier")
COHEN_DEFAULT_BATCH = 1000  # the --batch default of Cohen et al.'s certify.py


def inline_autoencoder(channels: int = 1) -> nn.Module:
    """A small conv / transposed-conv autoencoder (the paper's denoiser family), randomly initialised."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1), nn.ReLU(),
        nn.ConvTranspose2d(32, channels, 4, stride=2, padding=1), nn.Sigmoid()).eval()


class CohenLoop:
    """The per-image loop of Cohen et al.'s reference code (core.py), kept deliberately plain."""

    def __init__(self, base: nn.Module, num_classes: int, sigma: float, device: torch.device):
        self.base, self.num_classes, self.sigma, self.device = base.eval(), num_classes, sigma, device

    def _sample_noise(self, x: torch.Tensor, num: int, batch_size: int) -> np.ndarray:
        with torch.no_grad():
            counts = np.zeros(self.num_classes, dtype=int)
            remaining = num
            for _ in range(math.ceil(num / batch_size)):
                this_batch_size = min(batch_size, remaining)
                remaining -= this_batch_size
                batch = x.repeat((this_batch_size, 1, 1, 1))
                noise = torch.randn_like(batch, device=self.device) * self.sigma
                predictions = self.base(batch + noise).argmax(1)
                counts += np.bincount(predictions.cpu().numpy(), minlength=self.num_classes)
            return counts

    def certify(self, x: torch.Tensor, n0: int, n: int, alpha: float, batch_size: int):
        selection = self._sample_noise(x, n0, batch_size)
        estimation = self._sample_noise(x, n, batch_size)
        return certificate_from_counts(selection, estimation, alpha, self.sigma)


def load_models(args, device):
    from training.checkpoint import load_checkpoint
    from training.models import build_model

    path = args.classifier or (DEFAULT_CLASSIFIER if (DEFAULT_CLASSIFIER / "metadata.json").is_file() else None)
    if path is not None:
        classifier = load_checkpoint(path, kind="classifier", map_location=device).model
        what = f"checkpoint {path}"
    else:
        torch.manual_seed(0)
        classifier = build_model("cnn28", in_channels=1, num_classes=10).to(device).eval()
        what = "randomly initialised cnn28"
    if args.denoiser is not None:
        denoiser = load_checkpoint(args.denoiser, kind="denoiser", map_location=device).model
        den_what = f"checkpoint {args.denoiser}"
    else:
        torch.manual_seed(1)
        denoiser = inline_autoencoder().to(device)
        den_what = "inline conv autoencoder (randomly initialised: the cost is the architecture's)"
    return classifier, what, denoiser, den_what


def time_call(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_pair(classifier, denoiser, images, labels, args, device) -> dict:
    """Time Cohen's loop at each baseline batch size and ours, interleaved, ``args.repeats`` times each."""
    base = classifier if denoiser is None else nn.Sequential(denoiser, classifier).eval()
    baseline = CohenLoop(base, 10, args.sigma, device)
    smooth = Smooth(classifier, 10, args.sigma, denoiser, batch_size=args.batch, device=device,
                    workers=args.workers)
    indices = list(range(len(images)))
    samples = len(images) * (args.n0 + args.n)

    def run_baseline(batch: int):
        torch.manual_seed(args.seed)
        for x in images:
            baseline.certify(x.to(device), args.n0, args.n, args.alpha, batch)

    def run_ours():
        certify_dataset(smooth, images, labels, indices, args.n0, args.n, args.alpha, args.seed)

    runs = {f"baseline_batch_{b}": (lambda b=b: run_baseline(b)) for b in args.baseline_batches}
    runs["ours"] = run_ours
    with torch.inference_mode():  # warm-up: first calls pay for kernel selection and allocation
        for b in args.baseline_batches:
            base(images[:1].repeat(b, 1, 1, 1).to(device))
    run_ours()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            times[name].append(time_call(fn))
    smooth.close()
    best = {k: min(v) for k, v in times.items()}
    return {"noisy_samples": samples,
            "samples_per_second": {k: samples / v for k, v in best.items()},
            "speedup": {k: best[k] / best["ours"] for k in runs if k != "ours"},
            "seconds": times, "memory_format": smooth.memory_format, "workers": smooth.workers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_certify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=6, help="test images certified per measurement (default: 6)")
    parser.add_argument("--n0", type=int, default=100, help="selection samples (default: 100)")
    parser.add_argument("--n", type=int, default=1000, help="estimation samples (default: 1000)")
    parser.add_argument("--batch", type=int, default=None,
                        help="our samples per forward pass (default: the certify CLI's default for the device)")
    parser.add_argument("--baseline-batch", type=int, action="append", default=None, dest="baseline_batches",
                        help="the Cohen loop's batch; repeat the flag for several (default: 1000, the default of "
                             "Cohen et al.'s certify.py, and ours)")
    parser.add_argument("--workers", type=workers_arg, default="auto",
                        help="our forward-pass worker threads (default: auto)")
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--repeats", type=int, default=1, help="measurements per side; the best counts (default: 1)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda (default: auto)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--classifier", type=Path, default=None, help="classifier checkpoint (default: see above)")
    parser.add_argument("--denoiser", type=Path, default=None, help="denoiser checkpoint (default: inline autoencoder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    allocator, device = prepare_process(args.threads, args.device)
    from training.datasets import load_dataset

    args.batch = args.batch or DEFAULT_BATCH.get(device.type, DEFAULT_BATCH["cpu"])
    args.baseline_batches = sorted(set(args.baseline_batches or [COHEN_DEFAULT_BATCH, args.batch]), reverse=True)

    images, labels = load_dataset("mnist10k").test.tensors("cpu")
    images, labels = images[:args.images], labels[:args.images]
    classifier, what, denoiser, den_what = load_models(args, device)
    hardware = hardware_description(device)
    print(f"bench_certify: {args.images} mnist10k test images, n0 {args.n0}, n {args.n}, sigma {args.sigma}, "
          f"float32, best of {args.repeats}; {hardware}")
    print(f"  classifier: {what}; denoiser: {den_what}; allocator: {allocator}")
    results = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "hardware": hardware, "allocator": allocator, "classifier": what, "denoiser": den_what, "runs": {}}
    columns = [f"Cohen @{b}" for b in args.baseline_batches] + [f"ours @{args.batch}"]
    print(f"  {'pipeline':<22} " + " ".join(f"{c:>14}" for c in columns) + "  speedup vs "
          + ", ".join(f"@{b}" for b in args.baseline_batches))
    for name, den in (("classifier alone", None), ("denoiser + classifier", denoiser)):
        row = bench_pair(classifier, den, images, labels, args, device)
        results["runs"][name] = row
        rates = row["samples_per_second"]
        print(f"  {name:<22} " + " ".join(f"{rates[k]:>12,.0f}/s" for k in rates) + "  "
              + ", ".join(f"{v:.2f}x" for v in row["speedup"].values()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"  wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
