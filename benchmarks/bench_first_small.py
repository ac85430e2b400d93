"""What a small request arriving with large ones waits for: its latency beside 1 or 8 large requests, or 8 refused.

    python -m benchmarks.bench_first_small [--classifier-dir runs/demo/classifier] [--repeats 3]

A real server (``transdenoiser serve``, default settings, sigma 0.25, 20 s deadline) starts on 127.0.0.1. After
idle small requests (1 image, n = 100), each case sends its large bodies (16 images each, encoded beforehand) at
once from threads of their own, then 2 ms later one small request and, after it, a second one; per case and
repeat: both small requests' status, latency (and error, if refused) and the large requests' statuses. Cases: one
large request that is admitted and computes for seconds (sized as bench_overload's: 0.3 of the deadline's work);
eight of them (one admitted, the rest refused); one large request that finishes within a second; eight bodies
refused for an n above max_n (read and parsed, no compute). Compares what parsing the large bodies costs the small
request with what waiting for the admitted request's pass costs it (bench_overload's first small request).
Loopback only; about a minute.
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.bench_overload import JSON_HEADERS, large_body, large_n, metric_value, small_body
from benchmarks.serving_common import (
    check_classifier_dir,
    mnist_test_images,
    model_args,
    percentiles,
    run_record,
    running_server,
    save_result,
)
from transdenoiser.argtypes import positive_int

DEADLINE_S = 20.0
# (name, large requests, n per image); None: sized as bench_overload's large requests (LARGE_FRACTION of what the
# server computes within the deadline); n = 100,000 is above the default max_n: 400 after parsing, no compute
CASES = (("1 large, admitted", 1, None), ("8 large, 1 admitted", 8, None), ("1 large, under a second", 1, 100),
         ("8 large, refused after parsing", 8, 100_000))


def measure(url: str, images, repeats: int) -> dict:
    import httpx

    small = small_body(images)

    with httpx.Client(base_url=url, timeout=80) as client:
        idle = []
        for _ in range(8):
            started = time.perf_counter()
            assert client.post("/predict", content=small, headers=JSON_HEADERS).status_code == 200
            idle.append(time.perf_counter() - started)
        rate = metric_value(client, "transdenoiser_compute_rate")
        sized = large_n(rate, DEADLINE_S)
        cases = {}
        for name, count, n in CASES:
            n = sized if n is None else n
            rows = []
            for _ in range(repeats):
                bodies = [large_body(images, index, n) for index in range(count)]
                clients = [httpx.Client(base_url=url, timeout=80) for _ in range(count)]
                statuses: list[int] = []

                def send(index: int, bodies=bodies, clients=clients, statuses=statuses) -> None:
                    statuses.append(clients[index].post("/predict", content=bodies[index], headers=JSON_HEADERS)
                                    .status_code)

                threads = [threading.Thread(target=send, args=(index,)) for index in range(count)]
                for thread in threads:
                    thread.start()
                time.sleep(0.002)
                row = {}
                for which in ("first", "second"):
                    started = time.perf_counter()
                    response = client.post("/predict", content=small, headers=JSON_HEADERS)
                    row[which] = {"status": response.status_code, "seconds": round(time.perf_counter() - started, 4)}
                    if response.status_code != 200:  # why it was refused (the error's one line)
                        row[which]["error"] = response.text[:200]
                for thread in threads:
                    thread.join()
                for other in clients:
                    other.close()
                rows.append({**row, "large_statuses": sorted(statuses)})
                time.sleep(0.5)
            cases[name] = rows
    return {"idle_small": percentiles(idle[1:]), "rate_samples_per_s": rate, "large_n": sized, "cases": cases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_first_small", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--repeats", type=positive_int, default=3, help="repeats of each case")
    parser.add_argument("--out", default="runs/bench/first_small.json", help="JSON results file")
    args = parser.parse_args(argv)
    check_classifier_dir(parser, args)
    images = mnist_test_images()
    record = run_record(argv, "benchmarks.bench_first_small")
    with tempfile.TemporaryDirectory(prefix="bench_first_small_") as tmp, \
            running_server(Path(tmp), args.classifier_dir, args.denoiser_dir, sigma=0.25,
                           max_latency_ms=int(DEADLINE_S * 1000)) as server:
        figures = measure(server.url, images, args.repeats)
    print(f"idle small request: median {figures['idle_small']['p50_s']:.3f} s")
    for name, rows in figures["cases"].items():
        print(f"{name}: first small " + ", ".join(f"{row['first']['status']} {row['first']['seconds']:.3f} s"
                                                  for row in rows)
              + "; second " + ", ".join(f"{row['second']['status']} {row['second']['seconds']:.3f} s" for row in rows))
    save_result(args.out, {**record, **figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
