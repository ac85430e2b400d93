"""Fair scheduling: latency of a small request on an idle server and next to a large request in flight.

    python -m benchmarks.bench_fairness [--classifier-dir runs/demo/classifier] [--repeats 3] [--small-requests 10]
    python -m benchmarks.bench_fairness --quick     # a 4-image n = 2,000 large request, 1 repeat

A real server (``transdenoiser serve``, default settings but a 300 s deadline: n0 = 100, round_samples "auto"
(100 on CPU), one request's round per forward pass on CPU) starts on 127.0.0.1. Phases alternate, ``--repeats``
times: *idle*, ``--small-requests`` small requests (1 image, n = 100) one after another; *loaded*, the same while a
large request (16 images, n = 10,000: 161,600 noisy samples) is in flight, sent on a raw socket that is closed after
the phase, so the server drops the rest of its work (and the run stays short); a large request the server does not admit
stops the benchmark with its answer. The figure is the ratio of the loaded to the idle
median (and p99) latency; the target is at most 3.
"""
from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.serving_common import (
    check_classifier_dir,
    model_args,
    percentiles,
    phase_summary,
    run_record,
    running_server,
    save_result,
)
from transdenoiser.argtypes import positive_int

TARGET_RATIO = 3.0
# the server's deadline: long enough that the large request (161,600 samples) is admitted down to about 1,440
# samples/s (admission takes 37.5 % of the deadline's work); it is dropped after each phase anyway
DEADLINE_MS = 300_000


def queue_depth(http: httpx.Client) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "transdenoiser_queue_depth":
                return sample.value
    return 0.0


def send_and_hold(url: str, body: dict) -> socket.socket:
    """POST ``body`` to /predict on a raw socket; the caller closes it (the server then drops the request)."""
    host, port = url.split("://")[1].split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return sock


def wait_depth(http: httpx.Client, predicate, timeout: float = 60) -> bool:
    """Wait until the scheduler's queue depth satisfies ``predicate``; whether it did within ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate(queue_depth(http)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def measure(url: str, small: dict, large: dict, repeats: int, small_requests: int) -> dict:
    phases: dict[str, list[float]] = {"idle": [], "loaded": []}
    with httpx.Client(base_url=url, timeout=300) as http:
        assert http.post("/predict", json=small).status_code == 200  # warm the HTTP path
        for _ in range(repeats):
            for phase in ("idle", "loaded"):
                held = None
                if phase == "loaded":
                    held = send_and_hold(url, large)
                    if not wait_depth(http, lambda depth: depth >= 1):
                        answer = held.recv(300).decode(errors="replace").replace("\r\n", " ")
                        raise RuntimeError(f"the large request was not admitted, so nothing would load the server: "
                                           f"{answer[:240]}")
                for _ in range(small_requests):
                    started = time.perf_counter()
                    response = http.post("/predict", json=small)
                    elapsed = time.perf_counter() - started
                    if response.status_code != 200:
                        raise RuntimeError(f"small request failed: {response.status_code} {response.text[:200]}")
                    phases[phase].append(elapsed)
                if held is not None:
                    held.close()
                    wait_depth(http, lambda depth: depth == 0)
    figures = {phase: percentiles(values) for phase, values in phases.items()}
    figures["median_ratio"] = figures["loaded"]["p50_s"] / figures["idle"]["p50_s"]
    figures["p99_ratio"] = figures["loaded"]["p99_s"] / figures["idle"]["p99_s"]
    figures["target_met"] = figures["median_ratio"] <= TARGET_RATIO
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_fairness", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--repeats", type=positive_int, default=3, help="idle/loaded phase pairs")
    parser.add_argument("--small-requests", type=positive_int, default=10, help="small requests per phase")
    parser.add_argument("--quick", action="store_true", help="a 4-image n = 2,000 large request, 1 repeat")
    parser.add_argument("--out", default="runs/bench/fairness.json", help="JSON results file")
    args = parser.parse_args(argv)
    check_classifier_dir(parser, args)
    from training.datasets import load_dataset

    x, _ = load_dataset("mnist10k").test.tensors()
    images = x[:16].numpy()
    large_images, large_n = (4, 2000) if args.quick else (16, 10_000)
    repeats = 1 if args.quick else args.repeats
    small = {"images": [images[0].tolist()], "n": 100}
    large = {"images": images[:large_images].tolist(), "n": large_n}
    record = run_record(argv, "benchmarks.bench_fairness")
    with tempfile.TemporaryDirectory(prefix="bench_fairness_") as tmp, \
            running_server(Path(tmp), args.classifier_dir, args.denoiser_dir, sigma=0.25,
                           max_latency_ms=DEADLINE_MS) as server:
        figures = measure(server.url, small, large, repeats, args.small_requests)
    result = {**record, "small": "1 image, n = 100", "large": f"{large_images} images, n = {large_n}",
              "repeats": repeats, **figures}
    for phase in ("idle", "loaded"):
        print(phase_summary(phase, figures[phase]))
    print(f"loaded / idle: median {figures['median_ratio']:.2f}x, p99 {figures['p99_ratio']:.2f}x "
          f"(target <= {TARGET_RATIO:g}x: {'met' if figures['target_met'] else 'NOT met'})")
    save_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
