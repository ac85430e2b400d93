"""Health probes from a process of their own: /readyz and /livez back to back, until standard input closes.

    python -m benchmarks.prober URL

Prints ``ready`` once its client is connected, then, when standard input closes, one JSON line: every probe's
start (s, from the first probe) and latency (s). The benchmarks that send load from many threads of one Python
process (bench_overload's burst of 100 bodies at once) measure probe latency here instead of in one of their own
threads: there the probe would wait for the load threads' turn at the interpreter lock (100 clients built at
once, each loading TLS certificates), and the figure would be the load generator's pause, not the server's.
This process imports only httpx, and its garbage collector is off while it probes (it makes no cycles worth
collecting in a minute), so its own figures hold no pause of its own either.
"""
from __future__ import annotations

import gc
import json
import sys
import threading
import time

import httpx

PATHS = ("/readyz", "/livez")


def probe_until(url: str, stop: threading.Event) -> tuple[list[float], list[float]]:
    """(each probe's start in s from the first one, each probe's latency in s), probed back to back until
    ``stop`` is set (at least one round)."""
    starts: list[float] = []
    latencies: list[float] = []
    with httpx.Client(base_url=url, timeout=60) as http:
        http.get(PATHS[0])  # connected before the caller starts its load
        print("ready", flush=True)
        origin = time.perf_counter()
        while True:
            for path in PATHS:
                started = time.perf_counter()
                http.get(path)
                latencies.append(time.perf_counter() - started)
                starts.append(started - origin)
            if stop.is_set():
                return starts, latencies


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.prober URL", file=sys.stderr)
        return 2
    gc.disable()
    stop = threading.Event()

    def wait_for_stdin_to_close() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_stdin_to_close, daemon=True).start()
    starts, latencies = probe_until(args[0], stop)
    print(json.dumps({"starts_s": starts, "latencies_s": latencies}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
