"""What building a request's work costs the server's event loop, before admission decides on it.

    python -m benchmarks.bench_work_build [--images 16] [--repeats 50]
    python -m benchmarks.bench_work_build --quick      # 2 images, 3 repeats: a smoke run

The server builds the scheduler's work of every parsed request on its event loop (``TransDenoiser._certify_work`` /
``_sequential_work``), and only then does admission accept or refuse it. Timed here, in this process, with the
server's default settings (sigma 0.25, n0 100, alpha 0.001, chunks of 100 samples), for ``--images`` 28x28 images:

- certify at n = 1,000 and 10,000: ``CertifyWork`` as built (job seeds derived as the rounds are taken), against
  deriving every job's seed up front (``plan_jobs``, the same jobs);
- decide (R = 0.5) and estimate at a budget of 10,000: ``SequentialWork`` as built (the images' tests share their
  block plan, ``SequentialTest.many``), against one ``SequentialTest`` built alone per image.

Figures: the median wall time of each over ``--repeats`` builds, in ms. No server, no model: a few seconds.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from transdenoiser.argtypes import positive_int

SIGMA, N0, ALPHA, CHUNK = 0.25, 100, 0.001, 100


def median_ms(build: Callable[[], object], repeats: int) -> float:
    build()  # untimed: first-call costs (imports, caches)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        build()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(images: int, repeats: int) -> dict:
    import torch

    from certify.core import sequential_rule
    from certify.streams import BlockPlan, SequentialTest
    from serving.compute.engine import CertifyWork, SequentialWork, plan_jobs

    pixels = torch.rand(images, 1, 28, 28)
    seeds = list(range(1000, 1000 + images))
    rows = {}
    for n in (1000, 10_000):
        rows[f"certify n={n}"] = {
            "as_built_ms": median_ms(lambda n=n: CertifyWork(pixels, seeds, N0, n, ALPHA, SIGMA, 10, CHUNK), repeats),
            "every_seed_up_front_ms": median_ms(lambda n=n: plan_jobs(pixels, seeds, N0, n, CHUNK), repeats)}
    for kind, radius in (("decide", 0.5), ("estimate", None)):
        rule = sequential_rule(kind, SIGMA, 10_000, ALPHA, radius=radius)

        def build(rule=rule, kind=kind):
            return SequentialWork(kind, pixels, seeds, N0, rule, SIGMA, 10, CHUNK,
                                  lambda seed: torch.Generator().manual_seed(seed), "cpu")

        rows[f"{kind} n_max=10000"] = {
            "as_built_ms": median_ms(build, repeats),
            "one_test_per_image_alone_ms": median_ms(
                lambda rule=rule: [SequentialTest(rule, BlockPlan()) for _ in range(images)], repeats)}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_work_build", description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=positive_int, default=16, help="images per request (default: max_images)")
    parser.add_argument("--repeats", type=positive_int, default=50, help="timed builds of each kind")
    parser.add_argument("--quick", action="store_true", help="2 images, 3 repeats: a smoke run")
    parser.add_argument("--out", default="runs/bench/work_build.json", help="JSON results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats = 2, 3
    from benchmarks.serving_common import run_record, save_result

    record = run_record(argv, "benchmarks.bench_work_build")
    rows = measure(args.images, args.repeats)
    print(f"building the work of a {args.images}-image request (median of {args.repeats}, ms):")
    for name, figures in rows.items():
        shown = ", ".join(f"{key[:-3].replace('_', ' ')} {value:.2f}" for key, value in figures.items())
        print(f"  {name:20s} {shown}")
    save_result(args.out, {**record, "images": args.images, "repeats": args.repeats, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
