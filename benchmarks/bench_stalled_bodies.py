"""Stalled request bodies against ``transdenoiser serve`` alone (no nginx): small requests' latency while hundreds of
connections send their headers and then nothing, or a few bytes of a small body.

    python -m benchmarks.bench_stalled_bodies --random-classifier          # 200 + 200 stalled for 60 s
    python -m benchmarks.bench_stalled_bodies --random-classifier --quick  # 50 + 50 for 10 s

A server (default settings: the body pace of ``body_timeout_ms`` and ``min_body_bytes_per_s``, 64 small-body slots)
starts on 127.0.0.1. *Idle*: small requests (1 image as JSON, n = 100) one after another, ``--pause`` s between an
answer and the next request, for ``--idle-seconds``, from a process of their own (``benchmarks/small_client.py``).
*Stalled*: the same for ``--seconds`` while ``--stalled`` connections send a POST's headers (a 5,000-byte JSON body
declared) and nothing more, and as many send the headers and 13 bytes of that body; each one the server closes is
opened again at once (an attacker who reconnects; ``--no-reopen``: opened once). The figure is p99 stalled / p99
idle (the target: at most 3, every small request answered 200), with how long the server kept each stalled
connection. ``--set KEY=VALUE`` changes a setting of the served model directory. Loopback only; bounded by time.
"""
from __future__ import annotations

import argparse
import json
import selectors
import socket
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_audit_seeds import untrained_classifier
from benchmarks.bench_overload import SmallClient
from benchmarks.serving_common import (
    check_classifier_dir,
    model_args,
    percentiles,
    phase_summary,
    run_record,
    running_server,
    save_result,
    setting,
)
from transdenoiser.argtypes import positive_float, positive_int

TARGET_RATIO = 3.0
DECLARED_BODY_BYTES = 5000  # a small body (at most 64 KiB): it would take one of the max_queued_requests slots
BODY_PREFIX = b'{"images": [[['  # the 13 bytes a body-stalled connection sends


class _PacedSmallClient(SmallClient):
    """The small-request client with ``pause_s`` between an answer and the next request."""

    def __init__(self, url: str, body: bytes, pause_s: float):
        super().__init__(url, body)
        self.pause_s = pause_s

    def _args(self) -> list[str]:
        return [*super()._args(), str(self.pause_s)]


class StalledConnections:
    """``count`` connections stalled after their headers and ``count`` stalled inside a small body, until
    :meth:`close`; each one the server closes is timed (seconds it was kept) and, with ``reopen``, opened again."""

    def __init__(self, url: str, count: int, reopen: bool = True):
        host, port = url.split("://")[1].split(":")
        self.address = (host, int(port))
        self.head = (f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {DECLARED_BODY_BYTES}\r\n\r\n").encode()
        self.reopen = reopen
        self.kept_s: dict[str, list[float]] = {"headers": [], "body": []}
        self.statuses: dict[str, int] = {}
        self.failed_opens = 0
        self.open_at_close = 0
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        for kind in ("headers", "body"):
            for _ in range(count):
                self._open(kind)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _open(self, kind: str) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=5)
            sock.sendall(self.head + (BODY_PREFIX if kind == "body" else b""))
        except OSError:
            self.failed_opens += 1
            return
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, {"kind": kind, "opened": time.monotonic(), "got": b""})

    def _watch(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                data = key.data
                try:
                    chunk = key.fileobj.recv(65536)
                except OSError:
                    chunk = b""
                if chunk:
                    data["got"] += chunk
                    continue
                self._selector.unregister(key.fileobj)
                key.fileobj.close()
                self.kept_s[data["kind"]].append(time.monotonic() - data["opened"])
                status = data["got"][9:12].decode(errors="replace") or "closed without an answer"
                self.statuses[status] = self.statuses.get(status, 0) + 1
                if self.reopen and not self._stop.is_set():
                    self._open(data["kind"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        keys = list(self._selector.get_map().values())
        self.open_at_close = len(keys)
        for key in keys:
            key.fileobj.close()
        self._selector.close()

    def figures(self) -> dict:
        kept = {kind: {"count": len(values), "p50_s": float(np.percentile(values, 50)) if values else None,
                       "max_s": max(values) if values else None} for kind, values in self.kept_s.items()}
        return {"dropped": kept, "answers": self.statuses, "failed_opens": self.failed_opens,
                "open_at_end": self.open_at_close}


def small_requests(url: str, body: bytes, pause_s: float, seconds: float,
                   stalled: int = 0, reopen: bool = True) -> tuple[list[dict], dict | None]:
    """Small requests for ``seconds`` (with ``stalled`` + ``stalled`` stalled connections open meanwhile): each
    request's send time, status and latency, and the stalled connections' figures."""
    client = _PacedSmallClient(url, body, pause_s)
    client.start()
    held = StalledConnections(url, stalled, reopen) if stalled else None
    try:
        client.go()
        time.sleep(seconds)
    finally:
        results = client.finish()
        if held is not None:
            held.close()
    return results, held.figures() if held is not None else None


def phase(results: list[dict]) -> dict:
    answered = [r["seconds"] for r in results if r["status"] == 200]
    return {**percentiles(answered), "refused": sum(r["status"] != 200 for r in results),
            "statuses": sorted({r["status"] for r in results})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_stalled_bodies",
                                     description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--random-classifier", action="store_true",
                        help="serve an untrained cnn28 (the same cost per sample as a trained one) instead of "
                             "--classifier-dir")
    parser.add_argument("--stalled", type=positive_int, default=200, help="connections stalled of each kind")
    parser.add_argument("--seconds", type=positive_float, default=60.0, help="length of the stalled phase")
    parser.add_argument("--idle-seconds", type=positive_float, default=30.0, help="length of the idle phase")
    parser.add_argument("--pause", type=positive_float, default=0.5, help="s between an answer and the next request")
    parser.add_argument("--no-reopen", action="store_true", help="open the stalled connections once only")
    parser.add_argument("--set", type=setting, action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the served model directory (repeatable)")
    parser.add_argument("--quick", action="store_true", help="50 + 50 stalled, 10 s stalled, 5 s idle")
    parser.add_argument("--out", default="runs/bench/stalled_bodies.json", help="JSON results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.stalled, args.seconds, args.idle_seconds = 50, 10.0, 5.0
    record = run_record(argv, "benchmarks.bench_stalled_bodies")
    settings = dict(args.set)
    image = np.random.default_rng(0).integers(0, 256, (1, 28, 28)) / 255
    body = json.dumps({"images": [image.tolist()], "n": 100}).encode()
    with tempfile.TemporaryDirectory(prefix="bench_stalled_") as tmp:
        if args.random_classifier:
            args.classifier_dir = str(untrained_classifier(Path(tmp)))
        check_classifier_dir(parser, args)
        with running_server(Path(tmp), args.classifier_dir, args.denoiser_dir, sigma=0.25, **settings) as server:
            small_requests(server.url, body, args.pause, 2.0)  # warm the path
            idle, _ = small_requests(server.url, body, args.pause, args.idle_seconds)
            stalled, held = small_requests(server.url, body, args.pause, args.seconds, args.stalled,
                                           not args.no_reopen)
    figures = {"idle": phase(idle), "stalled": phase(stalled)}
    ratio = (figures["stalled"]["p99_s"] / figures["idle"]["p99_s"]
             if figures["idle"]["p99_s"] and figures["stalled"]["p99_s"] else None)
    result = {**record, "settings": settings, "stalled_each_kind": args.stalled, "seconds": args.seconds,
              "idle_seconds": args.idle_seconds, "pause_s": args.pause, "reopen": not args.no_reopen,
              "small_request": f"1 image as JSON ({len(body)} bytes), n = 100", **figures, "p99_ratio": ratio,
              "target_met": ratio is not None and ratio <= TARGET_RATIO and not figures["stalled"]["refused"],
              "stalled_connections": held, "small_requests": {"idle": idle, "stalled": stalled}}
    for name in ("idle", "stalled"):
        print(phase_summary(name, figures[name]) + f" refused={figures[name]['refused']}")
    print(f"p99 stalled / idle: {ratio}; stalled connections: {json.dumps(held)}; target met: "
          f"{result['target_met']}")
    save_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
