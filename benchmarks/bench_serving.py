"""Load test of the prediction API: requests/s and p50/p99 latency, shared passes vs one request at a time.

    python -m benchmarks.bench_serving [--classifier-dir runs/demo/classifier] [--denoiser-dir DIR] [--n 1000]
        [--clients 1,16] [--seconds 10] [--repeats 3] [--warmup-seconds 3] [--device cpu] [--quick]

Three real servers (``transdenoiser serve``, 127.0.0.1 only) start together from model directories built in a
temporary folder, one per mode:

- *adaptive*: ``batching = true``, a forward pass gathers the rounds of several requests (the GPU default);
- *one-at-a-time*: ``batching = false``, a pass is one request's round of ``round_samples`` (the device's
  default), requests take turns (serving.compute.scheduler; the CPU default);
- *whole-requests*: ``batching = false`` with ``round_samples = n0 + n``: a request's samples all go in its one
  round, as a server that computes each request whole before the next would (the stronger baseline when passes
  have a fixed cost, as on a GPU).

For each client count C, each server first gets a warm-up phase of ``--warmup-seconds`` at C clients, discarded
(the passes' sizes at that load are met for the first time there: allocations, kernel selection), then the servers
take ``--repeats`` phases each, in turn, the order reversed every other repeat (ABC, CBA, ...). A phase sends
one-image fixed-n requests (``{"images": [x], "n": N}``, n0 = 100) from C client threads, no new request after
``--seconds`` (and at most ``--max-requests``); its throughput is completed requests over its wall time, which
includes the requests still running at the cut-off. The speed-up over a baseline at C clients is adaptive's median
requests per second over the baseline's; each repeat's ratio is kept too. From the server's ``/metrics`` around
each phase: passes per request, noisy samples per pass, and the fraction of the phase the passes took to compute
(the rest: the host's work, or waiting for requests).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.serving_common import (
    check_classifier_dir,
    closed_loop,
    describe_server,
    model_args,
    run_record,
    running_servers,
    save_result,
    server_figures,
    server_totals,
)
from transdenoiser.argtypes import nonnegative_float, positive_float, positive_int

MODES = ("adaptive", "one-at-a-time", "whole-requests")  # the first against each of the others
N0 = 100


def mode_settings(n: int) -> dict[str, dict]:
    """Each mode's serving settings beyond those the modes share (module docstring)."""
    return {"adaptive": {"batching": True}, "one-at-a-time": {"batching": False},
            "whole-requests": {"batching": False, "round_samples": N0 + n}}


def run_phase(url: str, image: list, n: int, clients: int, max_seconds: float, max_requests: int) -> dict:
    """One-image fixed-n requests from ``clients`` threads: no new request after ``max_seconds``, at most
    ``max_requests``; with the server's passes over the phase."""
    before = server_totals(url)
    load = closed_loop(url, lambda _: {"images": [image], "n": n}, clients, max_requests, max_seconds, timeout=600)
    latencies, wall = load["latencies"], load["wall_s"]
    return {"clients": clients, "requests": len(latencies), "failures": load["failures"], "wall_s": wall,
            "requests_per_s": len(latencies) / wall,
            "p50_s": float(np.percentile(latencies, 50)) if latencies else None,
            "p99_s": float(np.percentile(latencies, 99)) if latencies else None,
            "server": server_figures(before, server_totals(url), len(latencies), wall)}


def measure(urls: dict[str, str], image: list, n: int, clients: int, seconds: float, repeats: int,
            warmup_seconds: float, max_requests: int = 100_000) -> dict:
    """At ``clients`` clients: a discarded warm-up phase per server, then ``repeats`` phases per server, the servers
    in turn (the order reversed every other repeat). ``urls``: mode -> its server; the speed-ups are the first mode's
    median requests per second over each other mode's."""
    modes = list(urls)
    if warmup_seconds > 0:
        for url in urls.values():
            run_phase(url, image, n, clients, warmup_seconds, max_requests)
    phases: dict[str, list[dict]] = {mode: [] for mode in modes}
    for repeat in range(repeats):
        for mode in (modes if repeat % 2 == 0 else modes[::-1]):
            phase = run_phase(urls[mode], image, n, clients, seconds, max_requests)
            if not phase["requests"]:
                raise RuntimeError(f"no {mode} request was answered: {phase['failures'][:1]}")
            phases[mode].append(phase)
    medians = {mode: statistics.median(p["requests_per_s"] for p in phases[mode]) for mode in modes}
    first, *others = modes
    return {"clients": clients, "phases": phases, "median_requests_per_s": medians,
            "speedup": {other: medians[first] / medians[other] for other in others},
            "speedup_per_repeat": {other: [a["requests_per_s"] / b["requests_per_s"]
                                           for a, b in zip(phases[first], phases[other], strict=True)]
                                   for other in others}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_serving", description=__doc__.split("\n")[0])
    model_args(parser)  # make demo writes runs/demo/classifier
    parser.add_argument("--sigma", type=positive_float, default=0.25, help="noise level, [0,1]-pixel units")
    parser.add_argument("--n", type=positive_int, default=1000, help="estimation samples per request")
    parser.add_argument("--clients", default="1,16", help="comma-separated concurrent client counts")
    parser.add_argument("--seconds", type=positive_float, default=10, help="per phase: no new request after this")
    parser.add_argument("--max-requests", type=positive_int, default=100_000, help="per phase: at most this many")
    parser.add_argument("--repeats", type=positive_int, default=3, help="interleaved phases per mode and client count")
    parser.add_argument("--warmup-seconds", type=nonnegative_float, default=3,
                        help="a discarded phase per server and client count first (0: none)")
    parser.add_argument("--device", default="cpu", help="server device (cpu, cuda)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: n = 100, clients 1,4, 1 s phases, one repeat, a 0.5 s warm-up")
    parser.add_argument("--out", default="runs/bench_serving.json", help="JSON results file")
    args = parser.parse_args(argv)
    try:
        clients = [positive_int(c) for c in args.clients.split(",")]
    except (argparse.ArgumentTypeError, ValueError):
        parser.error(f"--clients {args.clients!r}: comma-separated whole numbers >= 1, e.g. 1,16")
    if args.quick:
        args.n, clients, args.seconds, args.repeats, args.warmup_seconds = 100, [1, 4], 1.0, 1, 0.5
    check_classifier_dir(parser, args)
    from training.datasets import load_dataset

    x, _ = load_dataset("mnist10k").test.tensors()
    image = x[0].tolist()
    record = {**run_record(argv, "benchmarks.bench_serving"), "device": args.device, "n": args.n, "n0": N0,
              "sigma": args.sigma, "seconds": args.seconds, "repeats": args.repeats,
              "warmup_seconds": args.warmup_seconds, "denoiser": args.denoiser_dir is not None, "by_clients": {}}
    if args.device != "cpu":
        import torch

        from transdenoiser.runtime import hardware_description

        record["hardware"] = hardware_description(torch.device(args.device))
    shared = {"sigma": args.sigma, "n0": N0, "n": args.n, "max_n": max(args.n, 10_000), "max_latency_ms": 600_000,
              "max_queued_requests": max(64, *clients)}
    settings = {mode: {**shared, **own} for mode, own in mode_settings(args.n).items()}
    with tempfile.TemporaryDirectory(prefix="bench_serving_") as tmp, running_servers(
            Path(tmp), settings, args.classifier_dir, args.denoiser_dir, args.device) as servers:
        urls = {mode: servers[mode].url for mode in MODES}
        for url in urls.values():
            run_phase(url, image, args.n, 1, 60, 1)  # warm the HTTP path
        for count in clients:
            result = measure(urls, image, args.n, count, args.seconds, args.repeats, args.warmup_seconds,
                             args.max_requests)
            record["by_clients"][str(count)] = result
            for mode in MODES:
                for phase in result["phases"][mode]:
                    described = describe_server(phase["server"])
                    print(f"{mode:14s} clients={count:3d} requests={phase['requests']:4d} "
                          f"req/s={phase['requests_per_s']:.2f} p50={phase['p50_s']:.3f}s p99={phase['p99_s']:.3f}s "
                          f"failures={len(phase['failures'])}" + (f"; {described}" if described else ""), flush=True)
    record["speedup"] = {count: result["speedup"] for count, result in record["by_clients"].items()}
    for count, result in record["by_clients"].items():
        for baseline, ratio in result["speedup"].items():
            per_repeat = ", ".join(f"{r:.2f}" for r in result["speedup_per_repeat"][baseline])
            print(f"adaptive / {baseline} throughput at {count} clients: {ratio:.2f}x "
                  f"(medians of {args.repeats} interleaved phases; per repeat: {per_repeat})")
    save_result(args.out, record, f"hardware: {record['hardware']}; ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
