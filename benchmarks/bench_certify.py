"""Noisy samples per second of ``certify`` against Cohen et al.'s per-image loop, per pipeline and precision.

    python -m benchmarks.bench_certify                                   # mnist pipeline, fp32, short
    python -m benchmarks.bench_certify --pipeline cifar --precision fp32,bf16 --compile --device cuda
    python -m benchmarks.bench_certify --denoiser runs/training/transdenoiser --repeats 5 --json out.json

Pipelines (random weights unless --classifier/--denoiser give checkpoints; the speed is the architecture's):
- ``mnist``: cnn28 behind the paper's conv/transposed-conv autoencoder, 1x28x28 (mnist10k test images);
- ``cifar``: resnet20 behind DnCNN-17x64 with GroupNorm (Salman et al.'s denoiser), 3x32x32 (uniform noise images);
- ``imagenet``: torchvision resnet50 alone (1000 classes), 3x224x224 (uniform noise images).

Sides, all certifying the same images with the same n0, n and alpha, on the same device, interleaved, each
measured ``--repeats`` times (median and best reported; ratios are of medians):
- ``cohen@B``: the loop of Cohen et al.'s core.py (``Smooth._sample_noise``), written here after his algorithm:
  per image, ``x.repeat`` a batch of B copies, ``randn_like`` noise, forward, argmax, ``np.bincount`` on the host;
  NCHW models as loaded, float32, ``torch.no_grad``. B = 1000 (his certify.py default) and ours;
- ``ours:P`` / ``ours:P+compile``: :func:`certify.runner.certify_dataset` at precision P (``--precision``, a
  comma-separated list), eager and, with ``--compile`` (every precision) or ``--compile bf16`` (those listed),
  through ``torch.compile`` (compilation happens in an untimed warm-up and is reported apart).
Achieved TFLOP/s = the pipeline's FLOPs per sample (``torch.utils.flop_counter``, one float32 forward pass)
x samples per second. With ``--peak``, the device's float32 matrix-multiply rate is measured in the same process
with the same threads (``torch.mm`` of square matrices, 2048 on CPU and 8192 on CUDA, best of 5, before and after
the sides), each side's TFLOP/s is given as a fraction of it, and so is the rate a side would need to reach 3x the
reference loop: above 1, no float32 pipeline with these FLOPs can reach it on this device.
Everything runs in one process after the CLI's allocator set-up.
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks import prepare_process, write_result
from certify.cli import DEFAULT_BATCH, workers_arg
from certify.core import Smooth, certificate_from_counts
from certify.runner import certify_dataset
from transdenoiser.runtime import hardware_description

COHEN_DEFAULT_BATCH = 1000  # the --batch default of Cohen et al.'s certify.py
PIPELINES = {
    "mnist": {"shape": (1, 28, 28), "classes": 10, "classifier": ("cnn28", {"in_channels": 1, "num_classes": 10}),
              "denoiser": ("autoencoder", {"in_channels": 1})},
    "cifar": {"shape": (3, 32, 32), "classes": 10, "classifier": ("resnet20", {"in_channels": 3, "num_classes": 10}),
              "denoiser": ("dncnn", {"in_channels": 3, "depth": 17, "width": 64, "norm": "group"})},
    "imagenet": {"shape": (3, 224, 224), "classes": 1000,
                 "classifier": ("torchvision:resnet50", {"num_classes": 1000}), "denoiser": None},
}


class CohenLoop:
    """The per-image sampling loop of Cohen et al.'s reference code (core.py), kept deliberately plain."""

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


def build_pipeline(name: str, args, device: torch.device):
    """(classifier, denoiser or None, description, images (N, C, H, W), labels) of pipeline ``name``."""
    from training.checkpoint import load_checkpoint
    from training.models import build_model

    spec = PIPELINES[name]
    if args.classifier is not None:
        classifier = load_checkpoint(args.classifier, kind="classifier", map_location=device).model
        what = f"checkpoint {args.classifier}"
    else:
        torch.manual_seed(0)
        classifier = build_model(spec["classifier"][0], **spec["classifier"][1])
        what = f"{spec['classifier'][0]} (random weights)"
    denoiser, den_what = None, "none"
    if args.denoiser is not None and str(args.denoiser) != "none":
        denoiser = load_checkpoint(args.denoiser, kind="denoiser", map_location=device).model
        den_what = f"checkpoint {args.denoiser}"
    elif args.denoiser is None and spec["denoiser"] is not None:
        torch.manual_seed(1)
        denoiser = build_model(spec["denoiser"][0], **spec["denoiser"][1])
        den_what = f"{spec['denoiser'][0]} {spec['denoiser'][1]} (random weights)"
    classifier = classifier.to(device).eval()
    denoiser = denoiser.to(device).eval() if denoiser is not None else None
    if name == "mnist":
        from training.datasets import load_dataset

        images, labels = load_dataset("mnist10k").test.tensors("cpu")
        images, labels = images[:args.images], labels[:args.images]
    else:
        generator = torch.Generator().manual_seed(args.seed)
        images = torch.rand((args.images, *spec["shape"]), generator=generator)
        labels = torch.zeros(args.images, dtype=torch.long)
    return classifier, denoiser, what, den_what, images, labels


def flops_per_sample(base: nn.Module, shape: tuple[int, ...], device: torch.device) -> int:
    """FLOPs of one float32 forward pass of one sample (torch.utils.flop_counter; convolutions and matmuls)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        base(torch.zeros((1, *shape), device=device))
    return int(counter.get_total_flops())


def matmul_peak_tflops(device: torch.device, dtype: torch.dtype = torch.float32, repeats: int = 5) -> float:
    """The device's matrix-multiply rate at ``dtype`` (TFLOP/s, best of ``repeats``): ``torch.mm`` of two square
    matrices (2048 on CPU, 8192 on CUDA), with this thread's torch CPU threads."""
    size = 8192 if device.type == "cuda" else 2048
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    best = math.inf
    with torch.inference_mode():
        torch.mm(a, b)  # warm-up
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            torch.mm(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e12


def bench_pipeline(name: str, args, device: torch.device) -> dict:
    classifier, denoiser, what, den_what, images, labels = build_pipeline(name, args, device)
    spec = PIPELINES[name]
    num_classes = int(spec["classes"]) if args.classifier is None else int(
        classifier(torch.zeros((1, *images.shape[1:]), device=device)).shape[1])
    base = classifier if denoiser is None else nn.Sequential(denoiser, classifier).eval()
    flops = flops_per_sample(base, tuple(images.shape[1:]), device)
    cohen = CohenLoop(base, num_classes, args.sigma, device)
    indices = list(range(len(images)))
    samples = len(images) * (args.n0 + args.n)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def cohen_side(batch: int):
        def run():
            torch.manual_seed(args.seed)
            for x in images:
                cohen.certify(x.to(device), args.n0, args.n, args.alpha, batch)
        return run

    sides, smooths, compile_seconds = {}, [], {}
    for b in args.baseline_batches:
        sides[f"cohen@{b}"] = cohen_side(b)
    for precision in args.precision:
        for compiled in ([False, True] if precision in args.compile else [False]):
            smooth = Smooth(classifier, num_classes, args.sigma, denoiser, batch_size=args.batch, device=device,
                            workers=args.workers, precision=precision, compile=compiled)
            smooths.append(smooth)
            label = f"ours:{precision}" + ("+compile" if compiled else "")
            sides[label] = (lambda s=smooth: certify_dataset(s, images, labels, indices, args.n0, args.n,
                                                             args.alpha, args.seed))
    # warm-up: kernel selection, allocation, and compilation (timed apart)
    with torch.inference_mode():
        for b in args.baseline_batches:
            base(images[:1].repeat(b, 1, 1, 1).to(device))
    for label, fn in sides.items():
        if label.startswith("ours"):
            start = time.perf_counter()
            fn()
            sync()
            compile_seconds[label] = round(time.perf_counter() - start, 3)
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.repeats):
        for label, fn in sides.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[label].append(time.perf_counter() - start)
    for smooth in smooths:
        smooth.close()
    median = {k: statistics.median(v) for k, v in times.items()}
    reference = f"cohen@{COHEN_DEFAULT_BATCH}" if f"cohen@{COHEN_DEFAULT_BATCH}" in median else \
        f"cohen@{args.baseline_batches[0]}"
    return {"pipeline": name, "image_shape": list(images.shape[1:]), "classifier": what, "denoiser": den_what,
            "flops_per_sample": flops, "noisy_samples": samples,
            "memory_format": smooths[0].memory_format, "workers": smooths[0].workers, "batch": args.batch,
            "samples_per_second": {k: samples / v for k, v in median.items()},
            "best_samples_per_second": {k: samples / min(v) for k, v in times.items()},
            "tflops": {k: flops * samples / v / 1e12 for k, v in median.items()},
            "speedup_vs": reference,
            "speedup": {k: median[reference] / v for k, v in median.items()},
            "warmup_seconds": compile_seconds, "seconds": times}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_certify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="mnist",
                        help="mnist, cifar, imagenet, or a comma-separated list (default: mnist)")
    parser.add_argument("--precision", default="fp32",
                        help="our sides' precisions, comma-separated from fp32, bf16, fp16 (default: fp32)")
    parser.add_argument("--compile", nargs="?", const="all", default=None, metavar="PRECISIONS",
                        help="add a torch.compile side for each precision, or for those listed (e.g. --compile bf16)")
    parser.add_argument("--images", type=int, default=6, help="images certified per measurement (default: 6)")
    parser.add_argument("--n0", type=int, default=100, help="selection samples (default: 100)")
    parser.add_argument("--n", type=int, default=1000, help="estimation samples (default: 1000)")
    parser.add_argument("--batch", type=int, default=None,
                        help="our samples per forward pass (default: the certify CLI's default for the device)")
    parser.add_argument("--baseline-batch", type=int, action="append", default=None, dest="baseline_batches",
                        help="Cohen's loop's batch; repeat for several (default: 1000, his certify.py's, and ours)")
    parser.add_argument("--workers", type=workers_arg, default="auto",
                        help="our forward-pass worker threads (default: auto)")
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--repeats", type=int, default=3, help="measurements per side (default: 3)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda (default: auto)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--classifier", type=Path, default=None, help="classifier checkpoint (default: random)")
    parser.add_argument("--denoiser", default=None,
                        help="denoiser checkpoint, or 'none' for the classifier alone (default: the pipeline's, "
                             "random weights)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--peak", action="store_true",
                        help="also measure the device's float32 matrix-multiply rate and give each side's TFLOP/s "
                             "as a fraction of it")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    pipelines = [p.strip() for p in args.pipeline.split(",") if p.strip()]
    unknown = [p for p in pipelines if p not in PIPELINES]
    if unknown or not pipelines:
        parser.error(f"--pipeline: unknown {', '.join(unknown) or 'empty list'}; expected {', '.join(PIPELINES)}")
    args.precision = [p.strip() for p in args.precision.split(",") if p.strip()]
    if not args.precision or any(p not in ("fp32", "bf16", "fp16") for p in args.precision):
        parser.error(f"--precision: expected fp32, bf16, fp16 (comma-separated), got {','.join(args.precision)!r}")
    if args.compile is None:
        args.compile = []
    elif args.compile == "all":
        args.compile = list(args.precision)
    else:
        args.compile = [p.strip() for p in args.compile.split(",") if p.strip()]
        if not args.compile or any(p not in args.precision for p in args.compile):
            parser.error(f"--compile {','.join(args.compile)}: name precisions that --precision measures")
    for flag in ("images", "n0", "n", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.classifier is not None and len(pipelines) > 1:
        parser.error("--classifier fits one pipeline: pass one --pipeline with it")
    allocator, device = prepare_process(args.threads, args.device)
    args.batch = args.batch or DEFAULT_BATCH.get(device.type, DEFAULT_BATCH["cpu"])
    args.baseline_batches = sorted(set(args.baseline_batches or [COHEN_DEFAULT_BATCH, args.batch]), reverse=True)
    hardware = hardware_description(device)
    print(f"bench_certify: {args.images} images per pipeline, n0 {args.n0}, n {args.n}, sigma {args.sigma}, "
          f"median of {args.repeats} (sides interleaved); {hardware}; allocator: {allocator}")
    results = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
               "hardware": hardware, "allocator": allocator, "pipelines": {}}
    peaks = [matmul_peak_tflops(device)] if args.peak else []
    for name in pipelines:
        row = bench_pipeline(name, args, device)
        results["pipelines"][name] = row
        print(f"\n{name}: {row['image_shape']}, classifier {row['classifier']}, denoiser {row['denoiser']}, "
              f"{row['flops_per_sample'] / 1e6:,.1f} MFLOP/sample; ours: batch {row['batch']}, "
              f"{row['memory_format']}, {row['workers']} worker(s)")
        print(f"  {'side':<22} {'samples/s':>12} {'best':>12} {'TFLOP/s':>9} {'vs ' + row['speedup_vs']:>14}"
              f" {'warm-up s':>10}")
        for label, rate in row["samples_per_second"].items():
            warm = row["warmup_seconds"].get(label)
            print(f"  {label:<22} {rate:>12,.0f} {row['best_samples_per_second'][label]:>12,.0f} "
                  f"{row['tflops'][label]:>9.4f} {row['speedup'][label]:>13.2f}x "
                  f"{'' if warm is None else f'{warm:>10.1f}'}")
    if args.peak:
        peaks.append(matmul_peak_tflops(device))
        peak = max(peaks)
        results["fp32_matmul_peak_tflops"] = {"before": peaks[0], "after": peaks[1], "peak": peak}
        print(f"\nfloat32 matrix-multiply rate (torch.mm, best of 5): {peaks[0]:.4f} TFLOP/s before the sides, "
              f"{peaks[1]:.4f} after")
        for name, row in results["pipelines"].items():
            row["fraction_of_fp32_peak"] = {k: v / peak for k, v in row["tflops"].items()}
            needed = 3 * row["tflops"][row["speedup_vs"]]
            row["tflops_for_3x"] = needed
            print(f"  {name}: " + ", ".join(f"{k} {v:.0%}" for k, v in row["fraction_of_fp32_peak"].items())
                  + f" of it; 3x {row['speedup_vs']} needs {needed:.4f} TFLOP/s = {needed / peak:.0%} of it")
    if args.json:
        write_result(args.json, results)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
