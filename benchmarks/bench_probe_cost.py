"""What one request costs the server's event loop: CPU time of the worker's main thread per request, two versions of
the server side by side.

    mkdir /tmp/before && git archive COMMIT | tar -x -C /tmp/before
    python -m benchmarks.bench_probe_cost --before /tmp/before --after . [--seconds 4] [--rounds 3]
    python -m benchmarks.bench_probe_cost --quick     # this checkout against itself, 1 round of 1 s: a smoke run

Two servers start on 127.0.0.1, one from each code checkout (as ``bench_burst_ab`` starts them), over one model
directory (default settings, sigma 0.25). Then, ``--rounds`` times, each server in turn (the order alternating) is
sent, from one client, requests back to back for ``--seconds`` s per kind: ``GET /livez``, ``GET /readyz``, a
``POST /predict`` whose body is refused by validation (400: the whole middleware stack, the body read and parsed,
no compute) and one certified with n = 100 (one grey image of the classifier's input shape: the whole stack, the
scheduler and n0 + n = 200 noisy samples computed in the worker's other threads). Figure per server and kind:
the CPU seconds of the worker's main thread (the event loop; from ``/proc``, as psutil reads it) per request,
median over the rounds, and the requests answered per second. CPU time of one thread does not depend on other jobs
sharing the machine as wall time does.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.bench_burst_ab import code_checkout, start
from benchmarks.serving_common import check_classifier_dir, model_args, run_record, save_result, worker_process
from serving.bundle import write_model_dir
from serving.process import stop_on_terminate
from transdenoiser.argtypes import positive_float, positive_int

KINDS = {"livez": ("GET", "/livez", None), "readyz": ("GET", "/readyz", None),
         "predict_400": ("POST", "/predict", b'{"images": []}'), "certify_n100": ("POST", "/predict", None)}


def request_bodies(classifier_dir: str) -> dict[str, tuple[str, str, bytes | None]]:
    """``KINDS`` with the certify request's body: one grey image (0.5) of the classifier's input shape, n = 100."""
    import json

    import numpy as np

    from training.checkpoint import read_record

    shape = read_record(classifier_dir).input_shape
    body = json.dumps({"images": [np.full(shape, 0.5).tolist()], "n": 100}).encode()
    return {**KINDS, "certify_n100": ("POST", "/predict", body)}


def main_thread_cpu_s(worker) -> float:
    """CPU seconds (user + system) of the worker's main thread, the one running the event loop."""
    for thread in worker.threads():
        if thread.id == worker.pid:
            return thread.user_time + thread.system_time
    raise RuntimeError(f"worker {worker.pid} has no main thread")


def measure(url: str, worker, seconds: float, kinds: dict[str, tuple[str, str, bytes | None]]) -> dict:
    """Per kind: requests sent back to back for ``seconds`` s, the worker main thread's CPU ms per request."""
    figures = {}
    with httpx.Client(base_url=url, timeout=30, headers={"content-type": "application/json"}) as http:
        for _ in range(50):
            http.get("/livez")  # connected and warm
        for kind, (method, path, body) in kinds.items():
            cpu_before, started, count = main_thread_cpu_s(worker), time.perf_counter(), 0
            while time.perf_counter() - started < seconds:
                http.request(method, path, content=body)
                count += 1
            wall = time.perf_counter() - started
            figures[kind] = {"requests": count, "per_s": count / wall,
                             "cpu_ms_per_request": (main_thread_cpu_s(worker) - cpu_before) / count * 1e3}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_probe_cost", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--before", type=code_checkout, default=None, help="code checkout of the first server")
    parser.add_argument("--after", type=code_checkout, default=Path("."), help="code checkout of the second server "
                                                                                "(default: this one)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="measurements of each server")
    parser.add_argument("--seconds", type=positive_float, default=4.0, help="seconds of requests per kind")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s per kind; --before defaults to --after")
    parser.add_argument("--out", default="runs/bench/probe_cost.json", help="JSON results file")
    args = parser.parse_args(argv)
    if args.before is None and not args.quick:
        parser.error("--before is required (a code checkout to compare with), except with --quick")
    check_classifier_dir(parser, args)
    kinds = request_bodies(args.classifier_dir)
    before = args.before if args.before is not None else args.after
    rounds, seconds = (1, 1.0) if args.quick else (args.rounds, args.seconds)
    record = run_record(argv, "benchmarks.bench_probe_cost")
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="bench_probe_cost_") as tmp, stop_on_terminate():  # stopped: servers too
        model_dir = write_model_dir(Path(tmp) / "model", args.classifier_dir, args.denoiser_dir, sigma=0.25)
        servers = {}
        try:
            for name, code in (("before", before), ("after", args.after)):
                servers[name] = start(code, model_dir, Path(tmp) / f"{name}.log")
            for server in servers.values():
                server.wait_ready(time.monotonic() + 600)
            for index in range(rounds):
                for name in ("before", "after") if index % 2 == 0 else ("after", "before"):
                    runs[name].append(measure(servers[name].url, worker_process(servers[name]), seconds, kinds))
        finally:
            for server in servers.values():
                server.stop()
    medians = {name: {kind: {key: statistics.median(run[kind][key] for run in done)
                             for key in ("cpu_ms_per_request", "per_s")} for kind in KINDS}
               for name, done in runs.items()}
    for kind in KINDS:
        print(f"{kind:12s} " + "; ".join(
            f"{name}: {medians[name][kind]['cpu_ms_per_request']:.3f} ms of the event loop's CPU per request, "
            f"{medians[name][kind]['per_s']:.0f} requests/s" for name in runs), flush=True)
    save_result(args.out, {**record, "before": str(before), "after": str(args.after), "rounds": rounds,
                           "seconds": seconds, "runs": runs, "medians": medians})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
