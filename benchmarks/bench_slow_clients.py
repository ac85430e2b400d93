"""Slow clients: a good client's latency with thousands of stalled connections open, behind nginx and without.

    python -m benchmarks.bench_slow_clients [--classifier-dir runs/demo/classifier] [--stalled 2000] [--repeats 3]
    python -m benchmarks.bench_slow_clients --quick     # 200 stalled connections, 1 repeat, 10 requests

A real server (``transdenoiser serve``, default settings) and an nginx proxy in front of it
(``serving/nginx.conf.template`` with its defaults: header timeout 10 s, at most 4,096 connections) start on
127.0.0.1. Phases alternate, ``--repeats`` times, for each target (``proxy``, and ``direct`` to uvicorn for
comparison): *idle*, ``--requests`` good requests (1 image, n = 100) one after another; *stalled*, the same
while ``--stalled`` connections stay open having sent half a request line (a thread reopens the ones the
proxy times out, so the count stays up). The figure is p99 stalled / p99 idle; the target is under 3.
Loopback only; bounded by the counts.
"""
from __future__ import annotations

import argparse
import socket
import tempfile
import threading
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
HALF_REQUEST = b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"


class StalledConnections:
    """``count`` connections that send half a request line; closed ones are reopened until ``close``."""

    def __init__(self, url: str, count: int):
        host, port = url.split("://")[1].split(":")
        self.address = (host, int(port))
        self.count = count
        self.socks: list[socket.socket] = []
        self.reopened = 0
        self.failed = 0
        self._stop = threading.Event()
        for _ in range(count):
            self.socks.append(self._open())
        self._thread = threading.Thread(target=self._keep_up, daemon=True)
        self._thread.start()

    def _open(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=5)
        sock.sendall(HALF_REQUEST)
        sock.setblocking(False)
        return sock

    def _keep_up(self) -> None:
        while not self._stop.wait(0.5):
            for i, sock in enumerate(self.socks):
                try:
                    if sock.recv(1024) != b"":
                        continue  # an error page: the close follows
                except BlockingIOError:
                    continue  # still open
                except OSError:
                    pass
                sock.close()
                try:
                    self.socks[i] = self._open()
                    self.reopened += 1
                except OSError:
                    self.failed += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self.socks:
            sock.close()


def good_latencies(url: str, body: dict, requests: int) -> tuple[list[float], list[str]]:
    latencies, failures = [], []
    with httpx.Client(base_url=url, timeout=120) as http:
        for _ in range(requests):
            started = time.perf_counter()
            try:
                response = http.post("/predict", json=body)
            except httpx.TransportError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            if response.status_code == 200:
                latencies.append(time.perf_counter() - started)
            else:
                failures.append(f"{response.status_code}: {response.text[:200]}")
    return latencies, failures


def measure(urls: dict[str, str], body: dict, stalled: int, repeats: int, requests: int) -> dict:
    results = {}
    for target, url in urls.items():
        phases: dict[str, list[float]] = {"idle": [], "stalled": []}
        failures: list[str] = []
        reopened = 0
        good_latencies(url, body, 2)  # warm the path
        for _ in range(repeats):
            for phase in ("idle", "stalled"):
                held = StalledConnections(url, stalled) if phase == "stalled" else None
                try:
                    values, failed = good_latencies(url, body, requests)
                finally:
                    if held is not None:
                        held.close()
                        reopened += held.reopened
                phases[phase] += values
                failures += failed
        figures = {phase: percentiles(values) for phase, values in phases.items()}
        figures["failures"] = len(failures)
        figures["failure_examples"] = failures[:5]
        figures["stalled_reopened"] = reopened
        if figures["idle"]["count"] and figures["stalled"]["count"]:
            figures["p99_ratio"] = figures["stalled"]["p99_s"] / figures["idle"]["p99_s"]
            figures["target_met"] = figures["p99_ratio"] < TARGET_RATIO and not failures
        results[target] = figures
    return results


def main(argv: list[str] | None = None) -> int:
    from serving.process import free_port
    from serving.proxy import ProxyProcess, nginx_binary

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_slow_clients",
                                     description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--stalled", type=positive_int, default=2000, help="stalled connections held open")
    parser.add_argument("--repeats", type=positive_int, default=3, help="idle/stalled phase pairs per target")
    parser.add_argument("--requests", type=positive_int, default=30, help="good requests per phase")
    parser.add_argument("--no-direct", action="store_true", help="measure through the proxy only")
    parser.add_argument("--quick", action="store_true", help="200 stalled connections, 1 repeat, 10 requests")
    parser.add_argument("--out", default="runs/bench/slow_clients.json", help="JSON results file")
    args = parser.parse_args(argv)
    check_classifier_dir(parser, args)
    if args.quick:
        args.stalled, args.repeats, args.requests = 200, 1, 10
    if nginx_binary() is None:
        parser.error("nginx is not installed (Debian: apt-get install nginx-light)")
    from training.datasets import load_dataset

    x, _ = load_dataset("mnist10k").test.tensors()
    body = {"images": [x[0].tolist()], "n": 100}
    record = run_record(argv, "benchmarks.bench_slow_clients")
    with tempfile.TemporaryDirectory(prefix="bench_slow_") as tmp, \
            running_server(Path(tmp), args.classifier_dir, args.denoiser_dir, sigma=0.25) as server:
        proxy = ProxyProcess(server.url, Path(tmp) / "proxy", free_port())
        try:
            proxy.wait_ready()
            urls = {"proxy": proxy.url, **({} if args.no_direct else {"direct": server.url})}
            figures = measure(urls, body, args.stalled, args.repeats, args.requests)
        finally:
            proxy.stop()
    result = {**record, "stalled": args.stalled, "repeats": args.repeats, "requests_per_phase": args.requests,
              "good_request": "1 image, n = 100", "targets": figures}
    for target, f in figures.items():
        for phase in ("idle", "stalled"):
            print(f"{target:6s} " + phase_summary(phase, f[phase]))
        print(f"{target:6s} p99 stalled / idle: {f.get('p99_ratio')} failures={f['failures']} "
              f"target met: {f.get('target_met')}")
    save_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
