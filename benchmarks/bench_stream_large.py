"""A large request next to a steady stream of small ones: is it ever admitted if its client honours Retry-After?

    python -m benchmarks.bench_stream_large [--classifier-dir runs/demo/classifier] [--small-clients 1] [--seconds 40]
        [--fraction 0.3]

A real server (``transdenoiser serve``, default settings, sigma 0.25, 20 s deadline) starts on 127.0.0.1. After
idle small requests (1 image, n = 100) the measured rate sizes a large request of 16 images at ``--fraction`` of
what the server computes within the deadline (default 0.3, as bench_overload's; admission takes at most 0.375).
``--small-clients`` clients then send small requests back to back, while one client sends the large request for
``--seconds``: again at once after a 200, after ``Retry-After`` seconds after a 503, not after a 400. Figures:
every large attempt's status, seconds and Retry-After, and the small requests' statuses and latencies. Loopback
only; bounded by ``--seconds`` plus one large request.
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from benchmarks.bench_overload import (
    JSON_HEADERS,
    LARGE_FRACTION,
    LARGE_IMAGES,
    N0,
    large_body,
    large_n,
    metric_value,
    small_body,
)
from benchmarks.serving_common import (
    check_classifier_dir,
    mnist_test_images,
    model_args,
    percentiles,
    run_record,
    running_server,
    save_result,
)
from transdenoiser.argtypes import positive_float, positive_int

DEADLINE_S = 20.0


def measure(url: str, images, small_clients: int, seconds: float, fraction: float = LARGE_FRACTION) -> dict:
    import httpx

    small = small_body(images)
    with httpx.Client(base_url=url, timeout=DEADLINE_S + 60) as client:
        for _ in range(6):
            assert client.post("/predict", content=small, headers=JSON_HEADERS).status_code == 200
        rate = metric_value(client, "transdenoiser_compute_rate")
    per_image = large_n(rate, DEADLINE_S, fraction)
    large_samples = LARGE_IMAGES * (N0 + per_image)
    large = large_body(images, 0, per_image)
    stop = threading.Event()
    smalls: list[tuple[int, float]] = []

    def loop() -> None:
        with httpx.Client(base_url=url, timeout=DEADLINE_S + 60) as own:
            while not stop.is_set():
                sent = time.perf_counter()
                status = own.post("/predict", content=small, headers=JSON_HEADERS).status_code
                smalls.append((status, time.perf_counter() - sent))

    threads = [threading.Thread(target=loop) for _ in range(small_clients)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # the stream is running
    attempts = []
    with httpx.Client(base_url=url, timeout=DEADLINE_S + 60) as client:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            sent = time.perf_counter()
            response = client.post("/predict", content=large, headers=JSON_HEADERS)
            retry = response.headers.get("retry-after")
            attempts.append({"status": response.status_code, "seconds": round(time.perf_counter() - sent, 3),
                             "retry_after_s": int(retry) if retry else None})
            if response.status_code == 503 and retry:
                time.sleep(int(retry))
            elif 400 <= response.status_code < 500:
                break  # refused for its size (400): it never fits on this server, trying again cannot help
    stop.set()
    for thread in threads:
        thread.join()
    answered = [seconds for status, seconds in smalls if status == 200]
    return {"rate_samples_per_s": rate, "deadline_s": DEADLINE_S,
            "large": f"{LARGE_IMAGES} images, n = {per_image} ({large_samples} noisy samples)",
            "large_alone_s": large_samples / rate, "small_clients": small_clients, "seconds": seconds,
            "large_attempts": attempts, "large_statuses": dict(Counter(str(a["status"]) for a in attempts)),
            "small_statuses": dict(Counter(str(status) for status, _ in smalls)),
            "small_answered": percentiles(answered) if answered else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_stream_large", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--small-clients", type=positive_int, default=1, help="clients sending small requests")
    parser.add_argument("--seconds", type=positive_float, default=40.0, help="how long the large client tries")
    parser.add_argument("--fraction", type=positive_float, default=LARGE_FRACTION,
                        help="the large request's work / what the server computes within the deadline")
    parser.add_argument("--out", default="runs/bench/stream_large.json", help="JSON results file")
    args = parser.parse_args(argv)
    check_classifier_dir(parser, args)
    images = mnist_test_images()
    record = run_record(argv, "benchmarks.bench_stream_large")
    with tempfile.TemporaryDirectory(prefix="bench_stream_large_") as tmp, \
            running_server(Path(tmp), args.classifier_dir, args.denoiser_dir, sigma=0.25,
                           max_latency_ms=int(DEADLINE_S * 1000)) as server:
        figures = measure(server.url, images, args.small_clients, args.seconds, args.fraction)
    retries = [a["retry_after_s"] for a in figures["large_attempts"] if a["retry_after_s"] is not None]
    print(f"rate {figures['rate_samples_per_s']:.0f} samples/s; large request {figures['large']}, "
          f"{figures['large_alone_s']:.1f} s alone; {args.small_clients} small client(s) back to back")
    print(f"large attempts in {args.seconds:g} s: {figures['large_statuses']}"
          + (f", Retry-After {min(retries)}-{max(retries)} s" if retries else "")
          + f"; small requests {figures['small_statuses']}")
    save_result(args.out, {**record, **figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
