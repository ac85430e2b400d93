"""Adaptive (anytime-valid) certification against Cohen's fixed n, on the same images with the same seeds.

    python -m benchmarks.bench_adaptive --quick                       # seconds: a smoke run
    nice -n 10 python -m benchmarks.bench_adaptive --images 500 --images-100k 100 --json runs/bench/adaptive.json

Images: ``--images`` evenly spaced over the test split, visited interleaved (0, 10 stride, 20 stride, ...)
so that each chunk spans all classes and a run stopped early is still spread over the split.

Sides, each on the same images with the same per-image generators (seed, idx), so every side selects
its class from the same n0 noise draws:
- ``fixed_n10000`` / ``fixed_n100000``: Cohen's CERTIFY (``Smooth.certify_many``) with n = 10,000 / 100,000;
  n = 100,000 runs on every k-th image only (``--images-100k``), and its figures say on how many;
- ``decide_r{R}``: ``Smooth.decide_many`` at each radius R of ``--radii``, budget ``--n-max``;
- ``estimate``: ``Smooth.certify_adaptive_many`` with budget ``--estimate-n-max`` and ``--tolerance``.
With ``--lookahead-ab`` each decide side and the estimate side run a second time with every launch drawn ahead
(``..._ahead_every``: the lookahead before launches were drawn ahead only when most of their images were expected
to use them; CUDA only, as lookahead is), so the two policies are timed side by side.
The sides are interleaved chunk by chunk (``--chunk`` images), so a change in machine load hits them
alike. For every side: mean and median noisy samples per image (n0 included), certified accuracy at each
radius, seconds per image; and the ratios the targets name. The JSON is rewritten after every chunk.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from benchmarks import prepare_process, stamped, write_result
from certify.cli import DEFAULT_BATCH, workers_arg
from certify.confidence import DEFAULT_METHOD
from certify.core import ABSTAIN, Smooth
from certify.sequential import DEFAULT_TOLERANCE
from transdenoiser.runtime import hardware_description

DEMO = Path("runs/demo")


def _side(rows: list[dict], radii: list[float], samples_total: int | None = None) -> dict:
    samples = [r["samples"] for r in rows]
    seconds = sum(r["seconds"] for r in rows)
    return {"images": len(rows),
            # noisy samples used per second of the side's wall time (an adaptive side also evaluates the rest
            # of each image's last block: ``computed_per_image``)
            "samples_per_second": sum(samples) / seconds if rows and seconds > 0 else None,
            "computed_per_image": statistics.fmean(r.get("computed", r["samples"]) for r in rows) if rows else None,
            "mean_samples_per_image": statistics.fmean(samples) if rows else None,
            "median_samples_per_image": statistics.median(samples) if rows else None,
            "certified_accuracy": {f"{radius:g}": sum(r["correct"] and r["radius"] >= radius for r in rows) / len(rows)
                                   for radius in radii} if rows else {},
            "abstained": sum(r["predict"] == ABSTAIN for r in rows),
            "seconds_per_image": seconds / len(rows) if rows else None}


def add_pipeline_arguments(parser: argparse.ArgumentParser, images: int) -> None:
    """The flags every adaptive benchmark shares: the demo models (or others), how many test images, sigma, n0."""
    parser.add_argument("--classifier", type=Path, default=DEMO / "classifier")
    parser.add_argument("--denoiser", type=Path, default=DEMO / "denoiser", help="'none' for the classifier alone")
    parser.add_argument("--images", type=int, default=images, help="test images, spread evenly over the split")
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--n0", type=int, default=100)


def spread_over_split(split_size: int, count: int) -> tuple[list[int], list[int]]:
    """``count`` indices evenly spaced over a test split, and the same indices in the order to visit them:
    mnist10k's test split is ordered by class, so they are interleaved (0, stride, 2 stride, ..., 1, ...) and every
    chunk (and so a partial run) covers the whole split rather than one or two classes."""
    step = max(1, split_size // count)
    spread = list(range(0, split_size, step))[:count]
    stride = max(1, len(spread) // 10)
    order = [spread[k + stride * j] for k in range(stride) for j in range(10) if k + stride * j < len(spread)]
    return spread, order + [i for i in spread if i not in set(order)]


@contextmanager
def launches_ahead(every: bool) -> Iterator[None]:
    """With ``every``, the adaptive driver draws every launch ahead (as before it drew ahead only launches most of
    whose images were expected to use them): the A/B side of ``--lookahead-ab``."""
    from certify import streams

    kept = streams.AHEAD_EXPECTED_USE
    streams.AHEAD_EXPECTED_USE = 0.0 if every else kept
    try:
        yield
    finally:
        streams.AHEAD_EXPECTED_USE = kept


def _record(idx: int, label: int, prediction: int, radius: float, samples: int, seconds: float,
            computed: int | None = None) -> dict:
    return {"idx": idx, "label": label, "predict": prediction, "radius": radius, "correct": prediction == label,
            "samples": samples, "seconds": seconds, "computed": samples if computed is None else computed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_adaptive", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pipeline_arguments(parser, images=500)
    parser.add_argument("--images-100k", type=int, default=100, help="of them, how many fixed n = 100,000 certifies")
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--radii", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--n-max", type=int, default=100_000, help="decide mode's budget of estimation samples")
    parser.add_argument("--estimate-n-max", type=int, default=100_000)
    parser.add_argument("--estimate-images", type=int, default=None,
                        help="how many of the images estimate mode certifies (default: all)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    parser.add_argument("--method", default=DEFAULT_METHOD)
    parser.add_argument("--fixed", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--chunk", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH["cpu"])
    parser.add_argument("--workers", type=workers_arg, default="auto")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lookahead-ab", action="store_true",
                        help="also run the adaptive sides with every launch drawn ahead (the sides ..._ahead_every)")
    parser.add_argument("--quick", action="store_true", help="4 images, small budgets (a smoke run)")
    parser.add_argument("--json", type=Path, default=Path("runs/bench/adaptive.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.images_100k, args.n_max, args.estimate_n_max, args.fixed, args.chunk = 4, 2, 400, 400, \
            [200, 400], 2
    allocator, device = prepare_process(args.threads, args.device)
    from certify.pipeline import load_pipeline
    from training.datasets import load_dataset

    denoiser = None if str(args.denoiser) == "none" else args.denoiser
    pipeline = load_pipeline(args.classifier, denoiser, device)
    images, labels = load_dataset("mnist10k").test.tensors("cpu")
    spread, indices = spread_over_split(len(images), args.images)
    big = max(args.fixed) if len(args.fixed) > 1 else None  # --images-100k limits only the largest of several
    every = max(1, round(len(spread) / max(1, args.images_100k)))  # evenly over the split, hence over classes
    big_indices = set(spread[::every][:args.images_100k])
    estimate_indices = set(spread if args.estimate_images is None else
                           spread[::max(1, round(len(spread) / max(1, args.estimate_images)))][:args.estimate_images])
    smooth = Smooth(pipeline.classifier, pipeline.num_classes, args.sigma, pipeline.denoiser, args.batch, device,
                    workers=args.workers)
    rows: dict[str, list[dict]] = {f"fixed_n{n}": [] for n in args.fixed}
    variants = ["", "_ahead_every"] if args.lookahead_ab else [""]
    rows.update({f"decide_r{r:g}{v}": [] for r in args.radii for v in variants})
    rows.update({f"estimate{v}": [] for v in variants})
    every_radius = sorted(set(args.radii) | {0.0})

    def generators(unit):
        return [smooth.image_generator(args.seed, i) for i in unit]

    def run_chunk(unit: list[int]) -> None:
        batch, unit_labels = images[unit], [int(labels[i]) for i in unit]
        for n in args.fixed:
            part = [i for i in unit if n != big or i in big_indices]
            if not part:
                continue
            start = time.perf_counter()
            certs = smooth.certify_many(images[part], args.n0, n, args.alpha, generators(part))
            seconds = (time.perf_counter() - start) / len(part)
            rows[f"fixed_n{n}"] += [_record(i, int(labels[i]), c.prediction, c.radius, args.n0 + n, seconds)
                                    for i, c in zip(part, certs, strict=True)]
        for variant in variants:
            with launches_ahead(every=variant == "_ahead_every"):
                run_adaptive(unit, unit_labels, batch, variant)

    def run_adaptive(unit: list[int], unit_labels: list[int], batch: torch.Tensor, variant: str) -> None:
        for radius in args.radii:
            start = time.perf_counter()
            certs = smooth.decide_many(batch, radius, args.n0, args.n_max, args.alpha, generators(unit), args.method)
            elapsed = time.perf_counter() - start
            total = sum(c.samples for c in certs)
            rows[f"decide_r{radius:g}{variant}"] += [
                _record(i, y, c.prediction, c.radius, c.samples, elapsed * c.samples / total, c.n0 + c.computed)
                for i, y, c in zip(unit, unit_labels, certs, strict=True)]
        part = [i for i in unit if i in estimate_indices]
        if part:
            start = time.perf_counter()
            certs = smooth.certify_adaptive_many(images[part], args.n0, args.estimate_n_max, args.alpha,
                                                 generators(part), args.tolerance, args.method)
            elapsed = time.perf_counter() - start
            total = sum(c.samples for c in certs)
            rows[f"estimate{variant}"] += [_record(i, int(labels[i]), c.prediction, c.radius, c.samples,
                                                   elapsed * c.samples / total, c.n0 + c.computed)
                                           for i, c in zip(part, certs, strict=True)]

    def summary() -> dict:
        sides = {name: _side(side_rows, every_radius) for name, side_rows in rows.items()}
        result = {"command": "python -m benchmarks.bench_adaptive " + " ".join(sys.argv[1:] if argv is None else argv),
                  "hardware": hardware_description(device), "allocator": allocator,
                  "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "images": len(indices), "images_fixed_largest_n": len(big_indices), "sides": sides,
                  "ratios": {}, "accuracy_gaps_points": {}, "rows": rows}
        for radius in args.radii:
            decide = sides[f"decide_r{radius:g}"]
            if not decide["images"]:
                continue
            done = {r["idx"] for r in rows[f"decide_r{radius:g}"]}
            for n in args.fixed:
                fixed_rows = [r for r in rows[f"fixed_n{n}"] if r["idx"] in done]
                if not fixed_rows:
                    continue
                same = [r for r in rows[f"decide_r{radius:g}"] if r["idx"] in {f["idx"] for f in fixed_rows}]
                key = f"decide_r{radius:g}_vs_fixed_n{n}"
                result["ratios"][key] = (statistics.fmean(r["samples"] for r in fixed_rows)
                                         / statistics.fmean(r["samples"] for r in same))
                fixed_rate = sum(r["samples"] for r in fixed_rows) / sum(r["seconds"] for r in fixed_rows)
                decide_rate = sum(r["samples"] for r in same) / sum(r["seconds"] for r in same)
                result.setdefault("samples_per_second_vs_fixed", {})[key] = decide_rate / fixed_rate
                fixed_acc = sum(r["correct"] and r["radius"] >= radius for r in fixed_rows) / len(fixed_rows)
                decide_acc = sum(r["correct"] and r["radius"] >= radius for r in same) / len(same)
                result["accuracy_gaps_points"][key] = {"images": len(same), "decide": 100 * decide_acc,
                                                       "fixed": 100 * fixed_acc,
                                                       "decide_minus_fixed": 100 * (decide_acc - fixed_acc)}
        for name in [k for k in rows if k + "_ahead_every" in rows and rows[k + "_ahead_every"]]:
            every_side, mine = sides[name + "_ahead_every"], sides[name]
            result.setdefault("lookahead_ab", {})[name] = {
                "samples_per_second_vs_every_launch_ahead": (mine["samples_per_second"]
                                                             / every_side["samples_per_second"]),
                "evaluated_per_image": mine["computed_per_image"],
                "evaluated_per_image_every_launch_ahead": every_side["computed_per_image"],
                "answers_identical": [(r["idx"], r["predict"], r["radius"]) for r in rows[name]]
                == [(r["idx"], r["predict"], r["radius"]) for r in rows[name + "_ahead_every"]]}
        return result

    args.json.parent.mkdir(parents=True, exist_ok=True)
    warm = indices[:2]  # untimed: the first passes on a device pay for kernel selection and allocation
    smooth.certify_many(images[warm], args.n0, 1000, args.alpha, generators(warm))
    smooth.decide_many(images[warm], args.radii[0], args.n0, 1000, args.alpha, generators(warm), args.method)
    provenance = stamped({})  # once: the JSON is rewritten after every chunk
    started = time.perf_counter()
    for position in range(0, len(indices), args.chunk):
        run_chunk(indices[position:position + args.chunk])
        result = {**summary(), **provenance}
        result["wall_seconds"] = round(time.perf_counter() - started, 1)
        result["complete"] = position + args.chunk >= len(indices)
        write_result(args.json, result)
        print(f"{min(position + args.chunk, len(indices))}/{len(indices)} images, "
              f"{result['wall_seconds']:.0f} s: " + ", ".join(f"{k} {v:.1f}x" for k, v in result["ratios"].items()),
              flush=True)
    smooth.close()
    for name, side in result["sides"].items():
        print(f"{name:16s} {side['images']:4d} images, {side['samples_per_second'] or 0:10,.0f} samples/s, "
              f"mean {side['mean_samples_per_image'] or 0:9.0f} samples, "
              f"median {side['median_samples_per_image'] or 0:9.0f}, {side['seconds_per_image'] or 0:.3f} s/image, "
              "certified accuracy " + " ".join(f"r{r}:{a:.3f}" for r, a in side["certified_accuracy"].items()))
    print(json.dumps({"accuracy_gaps_points": result["accuracy_gaps_points"],
                      "samples_per_second_vs_fixed": result.get("samples_per_second_vs_fixed", {}),
                      **({"lookahead_ab": result["lookahead_ab"]} if "lookahead_ab" in result else {})}, indent=1))
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    raise SystemExit(main())
