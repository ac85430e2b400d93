"""Load test of the prediction API: requests/s and p50/p99 latency, shared passes vs one request's round per pass.

    python -m benchmarks.bench_serving [--classifier-dir runs/classifier] [--n 1000] [--clients 1,16]

For each mode a real server (``transdenoiser serve``) starts on 127.0.0.1 (the two start together, then take
their phases one after the other; the idle one waits for requests) from a model directory built in a
temporary folder: ``batching = true`` (a forward pass gathers the rounds of several requests) or
``batching = false`` (a pass is one request's round; requests take turns, serving.compute.scheduler). Each phase
sends one-image requests from C concurrent clients,
at most ``max(--min-requests, C * --requests-per-client)`` requests and no new request after
``--max-seconds``; throughput counts completed requests over the phase's wall time. Loopback only.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks.serving_common import closed_loop, model_args, running_servers, save_result
from training.datasets import load_dataset
from transdenoiser.argtypes import positive_float, positive_int
from transdenoiser.runtime import hardware_description

MODES = {"adaptive": True, "one-at-a-time": False}


def run_phase(url: str, image: list, n: int, clients: int, total: int, max_seconds: float) -> dict:
    """``total`` requests from ``clients`` threads (no new request after ``max_seconds``)."""
    load = closed_loop(url, lambda _: {"images": [image], "n": n}, clients, total, max_seconds, timeout=600)
    latencies, wall = load["latencies"], load["wall_s"]
    return {"clients": clients, "requests": len(latencies), "failures": load["failures"], "wall_s": wall,
            "requests_per_s": len(latencies) / wall,
            "p50_s": float(np.percentile(latencies, 50)) if latencies else None,
            "p99_s": float(np.percentile(latencies, 99)) if latencies else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_serving", description=__doc__.split("\n")[0])
    model_args(parser, "runs/classifier")
    parser.add_argument("--sigma", type=positive_float, default=0.25, help="noise level, [0,1]-pixel units")
    parser.add_argument("--n", type=positive_int, default=1000, help="estimation samples per request")
    parser.add_argument("--clients", default="1,16", help="comma-separated concurrent client counts")
    parser.add_argument("--requests-per-client", type=positive_int, default=2)
    parser.add_argument("--min-requests", type=positive_int, default=8, help="fewest requests per phase")
    parser.add_argument("--max-seconds", type=positive_float, default=150, help="no new request after this")
    parser.add_argument("--device", default="cpu", help="server device (cpu, cuda)")
    parser.add_argument("--out", default="runs/bench_serving.json", help="JSON results file")
    args = parser.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]

    x, _ = load_dataset("mnist10k").test.tensors()
    image = x[0].tolist()
    results = {"command": "python -m benchmarks.bench_serving " + " ".join(sys.argv[1:] if argv is None else argv),
               "hardware": hardware_description(torch.device(args.device)), "cpu_count": os.cpu_count(),
               "load_average_at_start": os.getloadavg(), "python": platform.python_version(),
               "n": args.n, "n0": 100, "sigma": args.sigma, "modes": {}}
    settings = {mode: {"sigma": args.sigma, "n0": 100, "n": args.n, "max_n": max(args.n, 10_000),
                       "batching": batching, "max_latency_ms": 600_000} for mode, batching in MODES.items()}
    with tempfile.TemporaryDirectory(prefix="bench_serving_") as tmp, running_servers(
            Path(tmp), settings, args.classifier_dir, args.denoiser_dir, args.device) as servers:
        for mode, server in servers.items():  # the phases one server at a time; the other waits for requests
            run_phase(server.url, image, args.n, 1, 1, args.max_seconds)  # warm the HTTP path
            phases = []
            for count in clients:
                total = max(args.min_requests, count * args.requests_per_client)
                phases.append(run_phase(server.url, image, args.n, count, total, args.max_seconds))
                phase = phases[-1]
                print(f"{mode:14s} clients={count:3d} requests={phase['requests']:3d} "
                      f"req/s={phase['requests_per_s']:.3f} p50={phase['p50_s']:.2f}s p99={phase['p99_s']:.2f}s "
                      f"failures={len(phase['failures'])}", flush=True)
            results["modes"][mode] = phases
    for index, count in enumerate(clients):
        ratio = (results["modes"]["adaptive"][index]["requests_per_s"]
                 / results["modes"]["one-at-a-time"][index]["requests_per_s"])
        results.setdefault("speedup", {})[str(count)] = ratio
        print(f"adaptive / one-at-a-time throughput at {count} clients: {ratio:.2f}x")
    save_result(args.out, results, f"hardware: {results['hardware']}; ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
