"""Small requests from a process of their own: one after another, from a go signal until standard input closes.

    python -m benchmarks.small_client URL BODY_FILE [PAUSE_S]

Connects (one ``GET /livez``) and prints ``ready``; on a line ``go`` from standard input it sends the JSON body in
BODY_FILE to ``/predict``, waits for the answer, pauses ``PAUSE_S`` (default 0.2 s) and sends it again, until
standard input closes; then prints one JSON line: each request's send time (s after ``go``), status and latency
(s). bench_overload times its small requests here, as it probes here (benchmarks/prober.py): in a thread of the
process that sends the large requests, a small request would also wait for the large requests' threads' turns at
that process's interpreter lock (building and sending 14 bodies of 110 kB, reading their answers), and the figure
would hold the load generator's pauses, not only the server's. This process imports only httpx, and its garbage
collector is off while it sends.
"""
from __future__ import annotations

import gc
import json
import sys
import threading
import time

import httpx

JSON_HEADERS = {"content-type": "application/json"}


def send_until(url: str, body: bytes, pause_s: float, stop: threading.Event) -> list[dict]:
    """Send ``body`` after ``go`` until ``stop`` is set (at least once); each request's figures."""
    results: list[dict] = []
    with httpx.Client(base_url=url, timeout=600) as http:
        http.get("/livez")  # connected before the caller starts its load
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return results
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        origin = time.perf_counter()
        while True:
            sent = time.perf_counter()
            status = http.post("/predict", content=body, headers=JSON_HEADERS).status_code
            results.append({"sent_s": sent - origin, "status": status, "seconds": time.perf_counter() - sent})
            if stop.wait(pause_s):
                return results


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m benchmarks.small_client URL BODY_FILE [PAUSE_S]", file=sys.stderr)
        return 2
    with open(args[1], "rb") as file:
        body = file.read()
    gc.disable()
    results = send_until(args[0], body, float(args[2]) if len(args) == 3 else 0.2, threading.Event())
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
