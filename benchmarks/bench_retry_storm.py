"""Retry storm: clients that obey Retry-After, heavy and small requests mixed; does every admitted request finish?

    python -m benchmarks.bench_retry_storm --runs 10 --seconds 180 --out docs/results/retry_storm.json
    python -m benchmarks.bench_retry_storm --quick --out /tmp/storm.json    # one run of 5 s, lighter requests

Each run starts a fresh ``transdenoiser serve`` (default settings: deadline 120 s, sigma 0.25) on 127.0.0.1 for a
classifier-only model directory (``--classifier-dir``; without it an untrained cnn28 with seeded random weights:
the compute per sample is the same as a trained one's). After a few idle small requests (their latency is the
reference), ``--clients`` asyncio clients (aiohttp, one connection each, in this one process) send requests back to
back for ``--seconds``: each request heavy (16 images, n = 3,000: 49,600 noisy samples with n0 = 100) with
probability ``--heavy-share``, else small (1 image, n = 100: 200 samples), drawn from a seeded generator per
client. A 503 is retried as it is (the same request) after its Retry-After; any other answer moves the client on to
its next request. When the time is up no request is started or retried; those in flight are awaited (at most the
deadline plus a minute).

Per run: requests admitted (answered 200, or admitted and then stopped: 504), answered, 504s, goodput (answered /
admitted), refusals by reason, Retry-After values, the small requests' outcomes and latencies (answered, and time to
a refusal) against their idle latency, the heavy requests' latencies, and the server's own counts from /metrics
(requests dropped at their deadline, refusals by reason) and its measured rate (sampled every 2 s). The JSON is
rewritten after every run, so an interrupted measurement keeps the runs it finished. Loopback only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.serving_common import mnist_test_images, percentiles, run_record, running_server, save_result, setting
from transdenoiser.argtypes import positive_float, positive_int

HEAVY_IMAGES, HEAVY_N, SMALL_N, N0 = 16, 3000, 100, 100
QUICK_HEAVY_N = 100  # --quick: heavy requests of 16 x 200 samples, so that a run of seconds drains in seconds
DEADLINE_S = 120.0  # the server's default max_latency_ms
IDLE_REQUESTS = 5
RATE_EVERY_S = 2.0
AT_ONCE_S = 1.0  # a refusal within this is "at once" (the summary counts the ones over it)


def random_classifier(directory: Path) -> Path:
    """An untrained cnn28 (torch seed 0) saved as an mnist10k classifier checkpoint in ``directory``."""
    import torch

    from training.checkpoint import save_checkpoint
    from training.models import build_model

    torch.manual_seed(0)
    kwargs = {"in_channels": 1, "num_classes": 10}
    meta = {"kind": "classifier", "architecture": "cnn28", "arch_kwargs": kwargs, "input_shape": [1, 28, 28],
            "num_classes": 10, "class_names": [str(d) for d in range(10)], "test_accuracy": None,
            "dataset": {"name": "mnist10k", "trained_on": "public"}}
    return save_checkpoint(directory / "classifier", build_model("cnn28", **kwargs), meta)


def bodies(images: np.ndarray, heavy_n: int) -> dict[str, list[bytes]]:
    """Pre-encoded JSON bodies: heavy ones (``HEAVY_IMAGES`` images from a rotating offset, ``heavy_n``) and small
    ones (one image, ``SMALL_N``), a few of each so that the server's duplicate detection sees distinct images."""
    def body(offset: int, count: int, n: int) -> bytes:
        chosen = [images[(offset + k) % len(images)].tolist() for k in range(count)]
        return json.dumps({"images": chosen, "n": n}).encode()

    return {"heavy": [body(8 * k, HEAVY_IMAGES, heavy_n) for k in range(4)],
            "small": [body(k, 1, SMALL_N) for k in range(len(images))]}


def refusal_reason(status: int, text: str) -> str:
    """A refusal's reason from its status and message: admission (``busy``, ``never``), the in-flight bound
    (``queue``), the body slots (``parsing``), or the status itself."""
    if status == 503 and "would not finish within its deadline" in text:
        return "busy"
    if status == 503 and "max_queued_requests" in text and "in flight" in text:
        return "queue"
    if status == 503 and ("request bodies" in text or "max_parsing_requests" in text):
        return "parsing"
    if status == 400 and "max_latency_ms" in text:
        return "never"
    return str(status)


async def client(session, url: str, index: int, seed: int, heavy_share: float, request_bodies: dict,
                 stop_at: float, deadline_s: float, records: list[dict]) -> None:
    """One client: requests back to back until ``stop_at`` (time.monotonic()), each retried after its Retry-After
    while it is refused with 503; every attempt's outcome appended to ``records``."""
    import aiohttp

    draw = random.Random(seed * 1000 + index)
    number = 0
    while time.monotonic() < stop_at:
        kind = "heavy" if draw.random() < heavy_share else "small"
        body = request_bodies[kind][number % len(request_bodies[kind])]
        number += 1
        attempt = 0
        while time.monotonic() < stop_at:
            sent = time.monotonic()
            record = {"client": index, "kind": kind, "attempt": attempt, "sent_s": sent}
            try:
                async with session.post(f"{url}/predict", data=body, headers={"content-type": "application/json"},
                                        timeout=aiohttp.ClientTimeout(total=deadline_s + 60)) as response:
                    text = await response.text()
                    record.update(status=response.status, seconds=time.monotonic() - sent,
                                  retry_after=response.headers.get("retry-after"))
                    if response.status != 200:
                        record["reason"] = refusal_reason(response.status, text)
                        record["message"] = text[:300]
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                record.update(status=0, seconds=time.monotonic() - sent, reason=type(exc).__name__)
            records.append(record)
            if record["status"] != 503:
                if record["status"] != 200:
                    await asyncio.sleep(1.0)  # not retryable as it is: move on, without spinning
                break
            attempt += 1
            await asyncio.sleep(min(float(record["retry_after"] or 1), max(0.0, stop_at - time.monotonic())))


async def metric_sampler(session, url: str, stop: asyncio.Event, rates: list[float]) -> None:
    """The server's measured rate (``transdenoiser_compute_rate``) every ``RATE_EVERY_S`` until ``stop``."""
    while not stop.is_set():
        try:
            async with session.get(f"{url}/metrics") as response:
                for line in (await response.text()).splitlines():
                    if line.startswith("transdenoiser_compute_rate"):
                        rates.append(float(line.split()[-1]))
        except Exception:  # noqa: BLE001 - a missed sample is only a missed sample
            pass
        try:
            await asyncio.wait_for(stop.wait(), RATE_EVERY_S)
        except asyncio.TimeoutError:
            pass


async def server_counts(session, url: str) -> dict[str, float]:
    """From /metrics: requests dropped at their deadline, and refused at admission by reason."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "transdenoiser_dropped_requests_total":
                counts[f"dropped_{sample.labels['reason']}"] = sample.value
            elif sample.name == "transdenoiser_refused_requests_total":
                counts[f"refused_{sample.labels['reason']}"] = sample.value
    return counts


async def storm(url: str, request_bodies: dict, clients: int, seconds: float, heavy_share: float, seed: int,
                deadline_s: float) -> dict:
    """One run against a started server: idle small requests, then the storm; its summary."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        idle = []
        for _ in range(IDLE_REQUESTS + 1):
            started = time.monotonic()
            async with session.post(f"{url}/predict", data=request_bodies["small"][0],
                                    headers={"content-type": "application/json"}) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"an idle small request got {response.status}")
            idle.append(time.monotonic() - started)
        before = await server_counts(session, url)
        records: list[dict] = []
        rates: list[float] = []
        stop = asyncio.Event()
        sampler = asyncio.create_task(metric_sampler(session, url, stop, rates))
        started = time.monotonic()
        load_before = os.getloadavg()
        await asyncio.gather(*(client(session, url, index, seed, heavy_share, request_bodies, started + seconds,
                                      deadline_s, records) for index in range(clients)))
        wall_s = time.monotonic() - started
        stop.set()
        await sampler
        after = await server_counts(session, url)
    summary = summarise(records, idle[1:])
    summary.update(wall_s=wall_s, load_average_before=load_before, load_average_after=os.getloadavg(),
                   server={key: after.get(key, 0.0) - before.get(key, 0.0) for key in sorted(set(after) | set(before))},
                   compute_rate=({"samples": len(rates), "min": min(rates), "median": float(np.median(rates)),
                                  "max": max(rates)} if rates else None))
    return summary


def summarise(records: list[dict], idle: list[float]) -> dict:
    """A run's figures from every attempt's record (see the module docstring)."""
    def of(kind: str, status: int | None = None) -> list[dict]:
        return [r for r in records if r["kind"] == kind and (status is None or r["status"] == status)]

    answered = [r for r in records if r["status"] == 200]
    timed_out = [r for r in records if r["status"] == 504]
    admitted = len(answered) + len(timed_out)
    small_refused = [r for r in of("small") if r["status"] not in (200, 504)]
    idle_p50 = float(np.median(idle)) if idle else None
    return {
        "attempts": len(records), "admitted": admitted, "answered": len(answered), "admitted_then_504": len(timed_out),
        "goodput": len(answered) / admitted if admitted else None,
        "statuses": dict(Counter(str(r["status"]) for r in records)),
        "refusals": dict(Counter(r["reason"] for r in records if r["status"] != 200)),
        "retry_after_s": dict(Counter(str(r.get("retry_after")) for r in records if r["status"] == 503)),
        "refusal_messages": sorted({r["message"][:160] for r in records if r.get("message")})[:8],
        "heavy": {"attempts": len(of("heavy")), "answered": len(of("heavy", 200)),
                  "admitted_then_504": len(of("heavy", 504)), "answered_latency": percentiles(
                      [r["seconds"] for r in of("heavy", 200)]),
                  "504_after_s": sorted(round(r["seconds"], 1) for r in of("heavy", 504))},
        "small": {"attempts": len(of("small")), "answered": len(of("small", 200)), "refused": len(small_refused),
                  "admitted_then_504": len(of("small", 504)), "idle_p50_s": idle_p50,
                  "answered_latency": percentiles([r["seconds"] for r in of("small", 200)]),
                  "refused_latency": percentiles([r["seconds"] for r in small_refused]),
                  "refused_after_more_than_s": AT_ONCE_S,
                  "refused_not_at_once": sum(r["seconds"] > AT_ONCE_S for r in small_refused)},
    }


def totals(runs: list[dict]) -> dict:
    """The runs together: admitted, answered, 504s, goodput; the small requests' worst latencies."""
    admitted = sum(run["admitted"] for run in runs)
    answered = sum(run["answered"] for run in runs)
    small_answered_max = [run["small"]["answered_latency"]["max_s"] for run in runs
                          if run["small"]["answered_latency"]["max_s"] is not None]
    small_refused_max = [run["small"]["refused_latency"]["max_s"] for run in runs
                         if run["small"]["refused_latency"]["max_s"] is not None]
    return {"runs": len(runs), "admitted": admitted, "answered": answered,
            "admitted_then_504": sum(run["admitted_then_504"] for run in runs),
            "goodput": answered / admitted if admitted else None,
            "goodput_per_run": [run["goodput"] for run in runs],
            "heavy_answered": sum(run["heavy"]["answered"] for run in runs),
            "small_answered": sum(run["small"]["answered"] for run in runs),
            "small_refused": sum(run["small"]["refused"] for run in runs),
            "small_504": sum(run["small"]["admitted_then_504"] for run in runs),
            "small_refused_not_at_once": sum(run["small"]["refused_not_at_once"] for run in runs),
            "refusals": dict(sum((Counter(run["refusals"]) for run in runs), Counter())),
            "small_answered_max_s": max(small_answered_max, default=None),
            "small_refused_max_s": max(small_refused_max, default=None)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classifier-dir", default=None,
                        help="classifier checkpoint (default: an untrained cnn28 with seeded random weights)")
    parser.add_argument("--runs", type=positive_int, default=10)
    parser.add_argument("--seconds", type=positive_float, default=180.0, help="storm length of one run")
    parser.add_argument("--clients", type=positive_int, default=64)
    parser.add_argument("--heavy-share", type=float, default=0.5, help="probability that a request is heavy")
    parser.add_argument("--seed", type=int, default=0, help="seed of the clients' draws (run r uses seed + r)")
    parser.add_argument("--quick", action="store_true",
                        help=f"one run of 5 s, 8 clients, heavy requests of n = {QUICK_HEAVY_N} (a smoke test)")
    parser.add_argument("--heavy-n", type=positive_int, default=None,
                        help=f"n of a heavy request (default {HEAVY_N}; --quick: {QUICK_HEAVY_N})")
    parser.add_argument("--setting", type=setting, action="append", default=[], metavar="KEY=VALUE",
                        help="a serving setting of the server (repeatable), e.g. forward_nice=0 on a shared machine")
    parser.add_argument("--out", default="docs/results/retry_storm.json")
    args = parser.parse_args(argv)
    if not 0 <= args.heavy_share <= 1:
        parser.error(f"--heavy-share must lie in [0, 1], got {args.heavy_share}")
    if args.classifier_dir is not None and not (Path(args.classifier_dir) / "metadata.json").is_file():
        parser.error(f"--classifier-dir {args.classifier_dir}: not a classifier checkpoint (no metadata.json)")
    if args.quick:
        args.runs, args.seconds, args.clients = 1, 5.0, 8
    heavy_n = args.heavy_n or (QUICK_HEAVY_N if args.quick else HEAVY_N)
    settings = dict(args.setting)
    request_bodies = bodies(mnist_test_images(32), heavy_n)
    record = {**run_record(argv, "benchmarks.bench_retry_storm"),
              "settings": {"clients": args.clients, "seconds": args.seconds, "heavy_share": args.heavy_share,
                           "heavy": {"images": HEAVY_IMAGES, "n": heavy_n, "n0": N0,
                                     "samples": HEAVY_IMAGES * (heavy_n + N0)},
                           "small": {"images": 1, "n": SMALL_N, "n0": N0, "samples": SMALL_N + N0},
                           "server": "transdenoiser serve, a fresh server per run, sigma 0.25, default settings "
                                     "(max_latency_ms 120000) but those in server_settings",
                           "server_settings": settings,
                           "classifier": args.classifier_dir or "untrained cnn28, torch seed 0"},
              "runs": []}
    with tempfile.TemporaryDirectory(prefix="retry_storm_") as tmp:
        classifier = args.classifier_dir or str(random_classifier(Path(tmp)))
        for run in range(args.runs):
            with running_server(Path(tmp) / f"run{run}", classifier, sigma=0.25, **settings) as server:
                summary = asyncio.run(storm(server.url, request_bodies, args.clients, args.seconds,
                                            args.heavy_share, args.seed + run, DEADLINE_S))
            record["runs"].append({"run": run, **summary})
            record["totals"] = totals(record["runs"])
            save_result(args.out, record, prefix=f"run {run + 1}/{args.runs}: admitted {summary['admitted']}, "
                                                 f"answered {summary['answered']}, 504 "
                                                 f"{summary['admitted_then_504']}; ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
