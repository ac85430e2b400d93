"""Soak test of the prediction API: C clients for a fixed time, mixed load, one malformed request in every ten.

    python -m benchmarks.bench_soak [--classifier-dir runs/demo/classifier] [--clients 16] [--seconds 300]
    python -m benchmarks.bench_soak --seconds 1800 --warm-up-fraction 0.33   # the 30-minute soak
    python -m benchmarks.bench_soak --quick      # 4 clients for 20 s (the smoke test's setting)

A real server (``transdenoiser serve``, default settings, sigma 0.25) starts on 127.0.0.1, or ``--url`` points
at one already running (loopback only). Each client sends requests back to back; request kinds rotate
through ``small`` (1 image, n = 100, JSON), ``batch`` (4 images, n = 500, JSON) and ``png`` (1 PNG upload,
n = 100), and every tenth request is ``malformed`` (NaN, a boolean pixel, an over-long integer, a wrong shape,
an undecodable PNG, ``n = "1_000"``, a wrong Content-Type, broken JSON, an oversized body). Unless ``--plain``,
every 7th request is ``heavy`` (16 images, n = 2,000: 33,600 noisy samples) and every 25th a ``burst``
(8 bodies of about 1.5 MB at once); these may be refused by admission or by the parsing limit (503 with
Retry-After), the designed answer under load, as may any request. Pass criteria: no 5xx answer other than 503
refusals, no dropped connection, every malformed request refused with a 4xx and every other one answered 200 or
refused with 503 (heavy and burst also 400: too large for the deadline at the measured rate), and the worker's
resident memory at most 5 % above its value at the end of
the warm-up (``--warm-up-fraction`` of the run, default a fifth). Reports p50/p99 latency per kind. Bounded: no
new request after ``--seconds``.
"""
from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from benchmarks.serving_common import (
    check_classifier_dir,
    model_args,
    percentiles,
    run_record,
    running_server,
    save_result,
    worker_process,
)
from transdenoiser.argtypes import positive_float, positive_int

SMALL_N, BATCH_N, BATCH_IMAGES = 100, 500, 4
HEAVY_N, HEAVY_IMAGES, HEAVY_EVERY = 2000, 16, 7
BURST_BODIES, BURST_EVERY = 8, 25
MAX_MEMORY_GROWTH = 0.05
REFUSALS = {"400", "503"}  # admission and the parsing limit: refused at once, by design
PAYLOAD_LIMIT = 2 * 1024 * 1024  # the default max_payload_bytes


def _png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray((image[0] * 255).round().astype(np.uint8), mode="L").save(buffer, "PNG")
    return buffer.getvalue()


def malformed_requests(image: list, payload_limit: int = PAYLOAD_LIMIT) -> list[dict]:
    """Bad requests (httpx keyword arguments); each must get a 4xx with a JSON error."""
    text = json.dumps(image)
    png = ("images", ("a.png", _png(np.asarray(image)), "image/png"))
    json_type = {"content-type": "application/json"}
    return [
        {"content": '{"images": [' + text.replace("0.0", "NaN", 1) + "]}", "headers": json_type},
        {"content": '{"images": [' + text.replace("0.0", "true", 1) + "]}", "headers": json_type},
        {"content": '{"images": [' + text + '], "n": ' + "9" * 5000 + "}", "headers": json_type},
        {"json": {"images": [np.zeros(784).tolist()]}},
        {"files": [("images", ("a.png", b"\x89PNG\r\n\x1a\n broken", "image/png"))]},
        {"files": [png], "data": {"n": "1_000"}},
        {"content": b"\x00\x01", "headers": {"content-type": "image/png"}},
        {"content": "{images", "headers": json_type},
        {"content": b" " * (payload_limit + 1), "headers": json_type},
    ]


def run_soak(url: str, images: np.ndarray, clients: int, seconds: float, memory_of=None,
             warm_up_fraction: float = 0.2, payload_limit: int = PAYLOAD_LIMIT, malformed_every: int = 10,
             mixed: bool = False) -> dict:
    """Drive ``url`` with ``clients`` threads for ``seconds``; return the figures (see the module docstring).
    Request ``i`` (counted over all clients) is malformed when ``i % malformed_every == malformed_every - 1``."""
    bad = malformed_requests(images[0].tolist(), payload_limit)
    latencies: dict[str, list[float]] = defaultdict(list)
    statuses: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    dropped: list[str] = []
    unexpected: list[str] = []
    lock = threading.Lock()
    counter = itertools.count()
    start = time.perf_counter()
    stop = threading.Event()
    memory: list[tuple[float, int]] = []
    load: list[float] = []  # the machine's 1-minute load average, every 2 s (the machine may be shared)

    def request_for(index: int) -> tuple[str, dict]:
        if index % malformed_every == malformed_every - 1:
            return "malformed", bad[(index // malformed_every) % len(bad)]
        if mixed and index % BURST_EVERY == BURST_EVERY - 1:
            padding = " " * int(0.7 * payload_limit)
            return "burst", {"content": '{"images": [' + json.dumps(images[index % len(images)].tolist()) + "]"
                                        + padding + "}", "headers": {"content-type": "application/json"}}
        if mixed and index % HEAVY_EVERY == HEAVY_EVERY - 1:
            chosen = [images[(index + k) % len(images)].tolist() for k in range(HEAVY_IMAGES)]
            return "heavy", {"json": {"images": chosen, "n": HEAVY_N}}
        kind = ("small", "batch", "png")[index % 3]
        pick = images[index % len(images)]
        if kind == "small":
            return kind, {"json": {"images": [pick.tolist()], "n": SMALL_N}}
        if kind == "batch":
            chosen = [images[(index + k) % len(images)].tolist() for k in range(BATCH_IMAGES)]
            return kind, {"json": {"images": chosen, "n": BATCH_N}}
        return kind, {"files": [("images", (f"{index}.png", _png(pick), "image/png"))], "data": {"n": str(SMALL_N)}}

    def client() -> None:
        with httpx.Client(base_url=url, timeout=300) as http:
            while time.perf_counter() - start < seconds:
                index = next(counter)
                kind, request = request_for(index)
                sent = time.perf_counter()
                copies = BURST_BODIES if kind == "burst" else 1
                try:
                    if copies == 1:
                        responses = [http.post("/predict", **request)]
                    else:
                        with ThreadPoolExecutor(copies) as pool:
                            responses = list(pool.map(lambda same: httpx.post(url + "/predict", timeout=300, **same),
                                                      [request] * copies))
                except httpx.TransportError as exc:
                    with lock:
                        dropped.append(f"{kind}: {type(exc).__name__}: {exc}")
                    continue
                elapsed = time.perf_counter() - sent
                for response in responses:
                    status = str(response.status_code)
                    if kind == "malformed":
                        good = 400 <= response.status_code < 500
                    elif kind in ("heavy", "burst"):
                        good = status == "200" or status in REFUSALS
                    else:
                        good = status in ("200", "503")  # 503: refused at once by admission, with Retry-After
                    with lock:
                        latencies[kind].append(elapsed)
                        statuses[kind][status] += 1
                        if not good:
                            unexpected.append(f"{kind} #{index}: {status} {response.text[:200]}")

    def sample_memory() -> None:
        while not stop.is_set():
            if memory_of is not None:
                memory.append((time.perf_counter() - start, memory_of()))
            load.append(os.getloadavg()[0])
            stop.wait(2.0)

    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    sampler.join(timeout=5)
    if memory_of is not None:
        memory.append((time.perf_counter() - start, memory_of()))
    wall = time.perf_counter() - start
    result = {"clients": clients, "seconds": seconds, "wall_s": wall,
              "requests": sum(len(v) for v in latencies.values()) + len(dropped),
              "per_kind": {kind: {**percentiles(values), "statuses": dict(statuses[kind])}
                           for kind, values in sorted(latencies.items())},
              "responses_5xx": sum(count for kind in statuses for status, count in statuses[kind].items()
                                   if status.startswith("5") and status != "503"),
              "refusals_503": sum(statuses[kind].get("503", 0) for kind in statuses),
              "admitted_not_finished_504": sum(statuses[kind].get("504", 0) for kind in statuses),
              "load_average_1min": {"min": min(load), "median": float(np.median(load)), "max": max(load)}
              if load else None,
              "dropped_connections": len(dropped), "dropped_examples": dropped[:5],
              "unexpected": len(unexpected), "unexpected_examples": unexpected[:5]}
    if memory:
        warm = [rss for t, rss in memory if t <= warm_up_fraction * wall] or [memory[0][1]]
        after = [rss for t, rss in memory if t > warm_up_fraction * wall] or [memory[-1][1]]
        result["memory"] = {"rss_end_of_warm_up_mib": warm[-1] / 2**20, "rss_max_after_mib": max(after) / 2**20,
                            "rss_final_mib": memory[-1][1] / 2**20,
                            "growth_after_warm_up": max(after) / warm[-1] - 1, "samples": len(memory),
                            "warm_up_fraction": warm_up_fraction,
                            "rss_mib_by_minute": [round(rss / 2**20, 1) for t, rss in memory if int(t) % 60 < 2]}
    result["passed"] = (result["responses_5xx"] == 0 and result["dropped_connections"] == 0
                        and result["unexpected"] == 0
                        and ("memory" not in result or result["memory"]["growth_after_warm_up"] <= MAX_MEMORY_GROWTH))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_soak", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--url", default=None, help="a running server on 127.0.0.1 (default: start one)")
    parser.add_argument("--clients", type=positive_int, default=16)
    parser.add_argument("--seconds", type=positive_float, default=300.0, help="no new request after this")
    parser.add_argument("--warm-up-fraction", type=float, default=0.2,
                        help="memory growth is measured after this fraction of the run (default 0.2)")
    parser.add_argument("--plain", action="store_true", help="no heavy requests and no bursts of large bodies")
    parser.add_argument("--quick", action="store_true", help="4 clients for 20 s")
    parser.add_argument("--out", default="runs/bench/soak.json", help="JSON results file")
    args = parser.parse_args(argv)
    check_classifier_dir(parser, args)
    if args.quick:
        args.clients, args.seconds = 4, 20.0
    if args.url is not None and not args.url.startswith(("http://127.0.0.1:", "http://localhost:")):
        parser.error("--url must be a loopback address (http://127.0.0.1:PORT)")
    from training.datasets import load_dataset

    x, _ = load_dataset("mnist10k").test.tensors()
    images = x[:32].numpy()
    record = run_record(argv, "benchmarks.bench_soak")
    if args.url is not None:
        result = run_soak(args.url, images, args.clients, args.seconds, warm_up_fraction=args.warm_up_fraction,
                          mixed=not args.plain)
    else:
        with tempfile.TemporaryDirectory(prefix="bench_soak_") as tmp, \
                running_server(Path(tmp), args.classifier_dir, args.denoiser_dir, sigma=0.25) as server:
            worker = worker_process(server)
            result = run_soak(server.url, images, args.clients, args.seconds, lambda: worker.memory_info().rss,
                              warm_up_fraction=args.warm_up_fraction, mixed=not args.plain)
    result = {**record, **result}
    for kind, figures in result["per_kind"].items():
        print(f"{kind:10s} requests={figures['count']:5d} p50={figures['p50_s']:.3f}s p99={figures['p99_s']:.3f}s "
              f"statuses={figures['statuses']}")
    print(f"admitted but not finished (504): {result['admitted_not_finished_504']}; machine load "
          f"{result['load_average_1min']}")
    print(f"5xx={result['responses_5xx']} dropped={result['dropped_connections']} unexpected={result['unexpected']} "
          f"memory={result.get('memory')} passed={result['passed']}")
    save_result(args.out, result)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
