"""Cost of sound noise (``--sound-noise``) against the default float32 sampler: end-to-end certify, interleaved.

    python -m benchmarks.bench_sound_noise                          # mnist pipeline, 4 images, n = 10,000
    python -m benchmarks.bench_sound_noise --images 4 --n 100000 --repeats 5 --json out.json
    python -m benchmarks.bench_sound_noise --quick                  # smoke test (seconds)

Both sides certify the same mnist10k test images with :func:`certify.runner.certify_dataset` (what
``transdenoiser certify`` runs per unit of images: noise, forward passes of the CLI's batch, counts, Clopper-Pearson)
through the same models: cnn28 behind the paper's autoencoder (random weights unless --classifier / --denoiser give
checkpoints: the cost is the architecture's). The sides alternate ``--repeats`` times; medians are compared.
Also measured apart: the noise alone (drawing n noisy copies of one image, no model), per side.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks import prepare_process, write_result
from certify.cli import DEFAULT_BATCH, workers_arg
from certify.core import Smooth
from certify.runner import certify_dataset
from transdenoiser.runtime import hardware_description

SIDES = ("gaussian", "sound")


def noise_only_seconds(smooth: Smooth, image: torch.Tensor, n: int) -> float:
    """Seconds to draw ``n`` noisy copies of ``image`` the way ``Smooth.sample_counts_many`` does (in its pieces)."""
    from certify import sound_noise
    from certify.core import NOISE_PIECE_ELEMENTS

    generator = smooth.generator(0)
    piece = max(1, NOISE_PIECE_ELEMENTS // image.numel())
    start = time.perf_counter()
    levels = sound_noise.grid_levels(image) if smooth.noise == "sound" else None
    for first in range(0, n, piece):
        size = min(piece, n - first)
        if levels is not None:
            sound_noise.sampler(smooth.sigma).noisy(levels, size, generator, image.dtype)
        else:
            torch.randn((size, *image.shape), generator=generator, dtype=image.dtype).mul_(smooth.sigma).add_(image)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    from benchmarks.bench_certify import build_pipeline

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sound_noise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4, help="images certified per measurement (default: 4)")
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--n", type=int, default=10_000, help="estimation samples (default: 10000)")
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--repeats", type=int, default=3, help="measurements per side, interleaved (default: 3)")
    parser.add_argument("--batch", type=int, default=None, help="samples per forward pass (default: the CLI's)")
    parser.add_argument("--workers", type=workers_arg, default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--classifier", type=Path, default=None, help="classifier checkpoint (default: random)")
    parser.add_argument("--denoiser", default=None, help="denoiser checkpoint (default: the autoencoder, random)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 image, n 200, 1 repeat")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.n0, args.n, args.repeats = 1, 20, 200, 1
    for flag in ("images", "n0", "n", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    allocator, device = prepare_process(args.threads, args.device)
    args.batch = args.batch or DEFAULT_BATCH.get(device.type, DEFAULT_BATCH["cpu"])
    classifier, denoiser, what, den_what, images, labels = build_pipeline("mnist", args, device)
    smooths = {side: Smooth(classifier, 10, args.sigma, denoiser, batch_size=args.batch, device=device,
                            workers=args.workers, noise=side) for side in SIDES}
    indices = list(range(len(images)))
    hardware = hardware_description(device)
    print(f"bench_sound_noise: {len(indices)} images, n0 {args.n0}, n {args.n}, sigma {args.sigma}, batch "
          f"{args.batch}, median of {args.repeats} (sides interleaved); {hardware}; allocator: {allocator}")
    results: dict[str, list] = {side: [] for side in SIDES}
    noise_only: dict[str, list] = {side: [] for side in SIDES}
    radii: dict[str, list] = {}
    for side in SIDES:  # warm-up (and the sound sampler's table, built once per sigma)
        certify_dataset(smooths[side], images, labels, indices[:1], args.n0, min(args.n, 200), args.alpha, args.seed)
    for _ in range(args.repeats):
        for side in SIDES:
            start = time.perf_counter()
            records = certify_dataset(smooths[side], images, labels, indices, args.n0, args.n, args.alpha, args.seed)
            results[side].append(time.perf_counter() - start)
            radii[side] = [round(r.radius, 4) for r in records]
            noise_only[side].append(noise_only_seconds(smooths[side], images[0], args.n0 + args.n))
    for smooth in smooths.values():
        smooth.close()
    median = {side: statistics.median(v) for side, v in results.items()}
    noise_median = {side: statistics.median(v) for side, v in noise_only.items()}
    samples = len(indices) * (args.n0 + args.n)
    ratio = median["sound"] / median["gaussian"]
    for side in SIDES:
        print(f"  {side:<9} {median[side]:8.2f} s  ({samples / median[side]:,.0f} samples/s; noise alone "
              f"{noise_median[side] * 1000:,.0f} ms per image)")
    print(f"  sound / gaussian: {ratio:.3f}x end to end ({(ratio - 1) * 100:+.1f}%)")
    if args.json:
        write_result(args.json, {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                                 "hardware": hardware, "allocator": allocator, "classifier": what, "denoiser": den_what,
                                 "seconds": results, "median_seconds": median, "ratio_sound_to_gaussian": ratio,
                                 "noise_only_seconds_per_image": noise_only, "radii": radii})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
