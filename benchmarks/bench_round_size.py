"""What a scheduling round's size costs in throughput: one large request alone, served with rounds of each size.

    python -m benchmarks.bench_round_size [--classifier-dir runs/demo/classifier] [--sizes 100 200] [--rounds 2]
    python -m benchmarks.bench_round_size --quick     # 1 image, n = 200, 1 round: a smoke run

For each of ``--rounds`` rounds and each ``--sizes`` value in turn (the order alternating between rounds), a real
server (``transdenoiser serve``, default settings but ``round_samples`` = that size, sigma 0.25) starts on
127.0.0.1 and answers one warm-up request and then ``--requests`` requests of ``--images`` images at ``--n``, one
after another. Figure per size: noisy samples per second of each request (images x (n0 + n) / its latency), their
median over every round, and the ratio to the first size's median. A smaller round lets a small request arriving
wait for less (docs/SERVING.md, "How requests share the compute"); this measures what the extra scheduling steps
cost. Loopback only; about 20 s per server.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_overload import JSON_HEADERS, N0
from benchmarks.serving_common import (
    check_classifier_dir,
    mnist_test_images,
    model_args,
    run_record,
    running_server,
    save_result,
)
from transdenoiser.argtypes import positive_int


def request_body(images: int, n: int) -> bytes:
    """A JSON body of the first ``images`` mnist10k test images at ``n``."""
    return json.dumps({"images": [image.tolist() for image in mnist_test_images(images)], "n": n}).encode()


def measure(url: str, body: bytes, samples: int, requests: int) -> list[float]:
    """Noisy samples per second of each of ``requests`` requests sent one after another (after one warm-up)."""
    import httpx

    rates = []
    with httpx.Client(base_url=url, timeout=600) as http:
        assert http.post("/predict", content=body, headers=JSON_HEADERS).status_code == 200
        for _ in range(requests):
            started = time.perf_counter()
            response = http.post("/predict", content=body, headers=JSON_HEADERS)
            if response.status_code != 200:
                raise RuntimeError(f"the request was answered {response.status_code}: {response.text[:200]}")
            rates.append(samples / (time.perf_counter() - started))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_round_size", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=[100, 200], help="round_samples values")
    parser.add_argument("--rounds", type=positive_int, default=2, help="rounds over the sizes (order alternating)")
    parser.add_argument("--images", type=positive_int, default=16, help="images per request")
    parser.add_argument("--n", type=positive_int, default=1000, help="n per image")
    parser.add_argument("--requests", type=positive_int, default=3, help="timed requests per server")
    parser.add_argument("--quick", action="store_true", help="1 image, n = 200, 1 round, 1 request")
    parser.add_argument("--out", default="runs/bench/round_size.json", help="JSON results file")
    args = parser.parse_args(argv)
    check_classifier_dir(parser, args)
    if args.quick:
        args.images, args.n, args.rounds, args.requests = 1, 200, 1, 1
    record = run_record(argv, "benchmarks.bench_round_size")
    body = request_body(args.images, args.n)
    samples = args.images * (N0 + args.n)
    rates: dict[int, list[float]] = {size: [] for size in args.sizes}
    for round_index in range(args.rounds):
        for size in args.sizes if round_index % 2 == 0 else list(reversed(args.sizes)):
            with tempfile.TemporaryDirectory(prefix="bench_round_size_") as tmp, \
                    running_server(Path(tmp), args.classifier_dir, args.denoiser_dir, sigma=0.25,
                                   round_samples=size) as server:
                rates[size].extend(measure(server.url, body, samples, args.requests))
    medians = {size: statistics.median(values) for size, values in rates.items()}
    first = medians[args.sizes[0]]
    for size in args.sizes:
        print(f"round_samples {size}: median {medians[size]:.0f} noisy samples/s "
              f"({medians[size] / first:.3f}x of {args.sizes[0]}); each: {', '.join(f'{r:.0f}' for r in rates[size])}")
    save_result(args.out, {**record, "images": args.images, "n": args.n, "n0": N0, "samples_per_request": samples,
                           "samples_per_second": {str(size): values for size, values in rates.items()},
                           "median_samples_per_second": {str(size): medians[size] for size in args.sizes},
                           "ratio_to_first": {str(size): medians[size] / first for size in args.sizes}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
