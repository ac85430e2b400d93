"""Overload: 4x the work the server can finish within the deadline arrives at once; goodput and small requests.

    python -m benchmarks.bench_overload [--classifier-dir runs/demo/classifier] [--deadline-s 30] [--factor 4]
    python -m benchmarks.bench_overload --quick      # deadline 10 s
    python -m benchmarks.bench_overload --mode burst  # the burst of large bodies only (about a minute)

A real server (``transdenoiser serve``, default settings but ``max_latency_ms`` = the deadline, sigma 0.25) starts
on 127.0.0.1. After an idle phase (small requests: 1 image, n = 100, one after another), the measured rate
(``transdenoiser_compute_rate``) sizes the overload to this machine: large requests of 16 images, each about
``--large-fraction`` (0.3) of what the server computes within the deadline, ``--factor`` times as much work in all
as it can finish within the deadline, all sent at once (no retries), while one client, a process of its own
(benchmarks/small_client.py), keeps sending small requests one after another.
Figures: goodput (noisy samples of requests answered 200 / noisy samples computed, from /metrics), the large
requests' statuses and Retry-After values, the time to each refusal, and each small request's latency against
3x its idle median (or an immediate refusal). Then a burst: after 10 s of probes alone (the baseline),
``--burst-bodies`` JSON bodies just under the payload limit (2 MB; ``--body-bytes`` for smaller ones, e.g. 60000
for small bodies, which have body slots of their own) sent at once, then ``--loop-clients`` clients
sending such bodies back to back for ``--loop-seconds``, while /readyz and /livez are probed back to back
throughout from a process of their own (benchmarks/prober.py): the probes' latency (and the start and latency of
each one over 100 ms), the bodies' statuses and the worker's
memory before, at its peak (sampled every 50 ms) and after. Bounded: the overload phase ends when every large
request is answered (at most the deadline plus a margin), the burst when its bodies are answered, the loop after
``--loop-seconds``; loopback only.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from benchmarks.prober import PATHS as PROBE_PATHS
from benchmarks.serving_common import (
    check_classifier_dir,
    mnist_test_images,
    model_args,
    percentiles,
    run_record,
    running_server,
    save_result,
    worker_process,
)
from transdenoiser.argtypes import positive_float, positive_int

N0, SMALL_N, LARGE_IMAGES = 100, 100, 16
# a large request's work, as a fraction of what the server computes within the deadline: admission takes at most
# 37.5 % (75 % of the deadline at the half of the compute an admitted request is sure of, serving.compute.admission)
LARGE_FRACTION = 0.3
JSON_HEADERS = {"content-type": "application/json"}  # bodies sent already encoded
BURST_BODY_BYTES = 2 * 1024 * 1024 - 4096  # just under the default max_payload_bytes (2 MiB)
MIN_BURST_BODY_BYTES = 16 * 1024  # the one image of a burst body as JSON is about 11 kB


def burst_body_bytes(text: str) -> int:
    """argparse type of ``--body-bytes``: an integer from MIN_BURST_BODY_BYTES to BURST_BODY_BYTES."""
    value = positive_int(text)
    if not MIN_BURST_BODY_BYTES <= value <= BURST_BODY_BYTES:
        raise argparse.ArgumentTypeError(f"must be from {MIN_BURST_BODY_BYTES} to {BURST_BODY_BYTES} bytes, "
                                         f"got {value}")
    return value


def large_n(rate: float, deadline_s: float, fraction: float = LARGE_FRACTION) -> int:
    """n per image of a large request (``LARGE_IMAGES`` images, n0 ``N0`` each) worth about ``fraction`` of what the
    server computes within ``deadline_s`` at ``rate`` noisy samples/s: on a grid of 100, at least ``SMALL_N``."""
    return max(SMALL_N, int(rate * deadline_s * fraction / LARGE_IMAGES) - N0) // 100 * 100


def large_body(images, index: int, n: int) -> bytes:
    """A large request's JSON body: ``LARGE_IMAGES`` of ``images`` from ``index`` on (wrapping), ``n`` per image."""
    return json.dumps({"images": [images[(index + k) % len(images)].tolist() for k in range(LARGE_IMAGES)],
                       "n": n}).encode()


def small_body(images) -> bytes:
    """A small request's JSON body: the first of ``images``, n = ``SMALL_N``."""
    return json.dumps({"images": [images[0].tolist()], "n": SMALL_N}).encode()


def metric_value(http: httpx.Client, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(http.get("/metrics").text)
               for sample in family.samples if sample.name == name)


def measure(url: str, images, deadline_s: float, factor: float, idle_requests: int = 5,
            large_fraction: float = LARGE_FRACTION) -> dict:
    small = {"images": [images[0].tolist()], "n": SMALL_N}
    with httpx.Client(base_url=url, timeout=deadline_s + 60) as http:
        idle = []
        for _ in range(idle_requests + 1):
            started = time.perf_counter()
            assert http.post("/predict", json=small).status_code == 200
            idle.append(time.perf_counter() - started)
        idle = idle[1:]  # the first warms the HTTP path
        idle_p50 = percentiles(idle)["p50_s"]
        rate = metric_value(http, "transdenoiser_compute_rate")
        per_image = large_n(rate, deadline_s, large_fraction)
        large_samples = LARGE_IMAGES * (N0 + per_image)
        count = max(2, round(factor * rate * deadline_s / large_samples))
        computed_before = metric_value(http, "transdenoiser_noisy_samples_total")
    large_results: list[tuple[int, float, str | None]] = []
    lock = threading.Lock()

    # Every body is encoded, and every client made, before the clock starts; the small requests are sent and timed
    # by a process of their own (benchmarks/small_client.py), so that the large requests' threads, which share this
    # process's interpreter lock, cannot delay them.
    large_bodies = [large_body(images, index, per_image) for index in range(count)]
    clients = [httpx.Client(base_url=url, timeout=deadline_s + 60) for _ in range(count)]
    small_client = SmallClient(url, small_body(images))
    small_client.start()

    def send_large(index: int) -> None:
        sent = time.perf_counter()
        response = clients[index].post("/predict", content=large_bodies[index], headers=JSON_HEADERS)
        with lock:
            large_results.append((response.status_code, time.perf_counter() - sent,
                                  response.headers.get("retry-after")))

    threads = [threading.Thread(target=send_large, args=(i,)) for i in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    small_client.go()
    for thread in threads:
        thread.join(timeout=deadline_s + 90)
    smalls = small_client.finish()
    wall_s = time.perf_counter() - started
    small_results = [(small["status"], small["seconds"]) for small in smalls]
    small_sent = [small["sent_s"] for small in smalls]  # seconds after the large requests began (to within 1 ms)
    for client in clients:
        client.close()
    with httpx.Client(base_url=url, timeout=60) as http:
        computed = metric_value(http, "transdenoiser_noisy_samples_total") - computed_before
    answered_large = sum(status == 200 for status, _, _ in large_results)
    answered_small = sum(status == 200 for status, _ in small_results)
    good = answered_large * large_samples + answered_small * (N0 + SMALL_N)
    refused = [(seconds, retry) for status, seconds, retry in large_results if status == 503]
    small_ok = [seconds for status, seconds in small_results if status == 200]
    small_refused = [seconds for status, seconds in small_results if status != 200]
    return {
        "deadline_s": deadline_s, "factor": factor, "rate_samples_per_s": rate,
        "large": f"{LARGE_IMAGES} images, n = {per_image} ({large_samples} noisy samples)", "large_requests": count,
        "offered_samples": count * large_samples, "finishable_samples": rate * deadline_s,
        "large_statuses": dict(Counter(str(status) for status, _, _ in large_results)),
        "refusal_s": percentiles([seconds for seconds, _ in refused]) if refused else None,
        "retry_after_s": sorted(int(retry) for _, retry in refused if retry is not None),
        "computed_samples": computed, "completed_samples": good,
        "goodput": good / computed if computed else None,
        "idle_small": percentiles(idle), "small_answered": percentiles(small_ok) if small_ok else None,
        "small_statuses": dict(Counter(str(status) for status, _ in small_results)),
        "small_refusal_max_s": max(small_refused) if small_refused else None,
        "small_within_3x_idle": sum(seconds <= 3 * idle_p50 for seconds in small_ok), "wall_s": wall_s,
        "small_requests": [{"sent_s": round(at, 3), "status": status, "seconds": round(seconds, 4)}
                           for at, (status, seconds) in zip(small_sent, small_results, strict=True)],
    }


def burst_body(body_bytes: int) -> bytes:
    """A valid one-image JSON body padded with spaces to about ``body_bytes`` bytes."""
    import json

    import numpy as np

    image = json.dumps(np.full((1, 28, 28), 0.123456789).tolist())
    return ('{"images": [' + image + "]" + " " * (body_bytes - len(image) - 20) + "}").encode()


class HelperProcess:
    """A load-side helper run as a process of its own (``python -m benchmarks.MODULE URL ARGS...``), so that the
    load threads of this process cannot delay what it times: it prints ``ready`` once connected, works until its
    standard input closes (:meth:`finish`), then prints its figures as one JSON line."""

    module = ""
    what = ""

    def __init__(self, url: str):
        self.url = url
        self.process: subprocess.Popen | None = None

    def _args(self) -> list[str]:
        return []

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", f"benchmarks.{self.module}", self.url, *self._args()],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        cwd=Path(__file__).resolve().parent.parent)
        if self.process.stdout.readline().strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"the {self.what} of {self.url} did not start")

    def finish(self):
        """Close its standard input, wait for it, and return its figures (its last line of output, as JSON)."""
        output, _ = self.process.communicate(timeout=120)
        if self.process.returncode != 0:
            raise RuntimeError(f"the {self.what} of {self.url} exited with status {self.process.returncode}")
        return json.loads(output.strip().splitlines()[-1])


class SmallClient(HelperProcess):
    """Small requests one after another (0.2 s apart) from :mod:`benchmarks.small_client`, from :meth:`go` to
    :meth:`finish`: every small request's send time (s after go), status and latency (s)."""

    module, what = "small_client", "small-request client"

    def __init__(self, url: str, body: bytes):
        super().__init__(url)
        self._body_file = tempfile.NamedTemporaryFile(prefix="small_body_", suffix=".json")
        self._body_file.write(body)
        self._body_file.flush()

    def _args(self) -> list[str]:
        return [self._body_file.name]

    def go(self) -> None:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finish(self) -> list[dict]:
        try:
            return super().finish()
        finally:
            self._body_file.close()


class Prober(HelperProcess):
    """/readyz and /livez probed back to back by :mod:`benchmarks.prober` from :meth:`start` to :meth:`finish`:
    every probe's start (s from the first) and latency (s)."""

    module, what = "prober", "prober"


def _probe_in_thread(url: str, stop: threading.Event, latencies: list[float]) -> threading.Thread:
    """The same probes from a thread of this (the load's) process, for ``--in-process-probes``: what a probe
    measures when it shares the interpreter with the load threads."""
    def run() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while not stop.is_set():
                for path in PROBE_PATHS:
                    started = time.perf_counter()
                    http.get(path)
                    latencies.append(time.perf_counter() - started)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _slow_probes(probes: dict[str, list[float]], threshold_s: float = 0.1) -> list[list[float]]:
    """[start s, latency s] of every probe slower than ``threshold_s``."""
    return [[round(start, 3), round(latency, 4)]
            for start, latency in zip(probes["starts_s"], probes["latencies_s"], strict=True)
            if latency > threshold_s]


def _memory_sampler(memory_of, stop: threading.Event, peak: list[int]) -> threading.Thread:
    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], memory_of())
            stop.wait(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    return thread


def measure_burst(url: str, bodies: int, body_bytes: int, memory_of=None, loop_clients: int = 2,
                  loop_seconds: float = 30.0, in_process_probes: bool = False) -> dict:
    """``bodies`` JSON bodies of about ``body_bytes`` sent at once, then ``loop_clients`` clients sending such
    bodies back to back for ``loop_seconds``; /readyz and /livez probed back to back during each phase from a
    process of their own (and, with ``in_process_probes``, also from a thread of this one), the worker's resident
    memory sampled every 50 ms (its peak) and after each phase."""
    body = burst_body(body_bytes)

    def phase(threads: list[threading.Thread], statuses: list[int]) -> dict:
        peak = [memory_of() if memory_of else 0]
        before = peak[0]
        stop = threading.Event()
        sampler = _memory_sampler(memory_of, stop, peak) if memory_of else None
        prober = Prober(url)
        prober.start()
        cpu_started = time.process_time()
        in_process: list[float] = []
        in_thread = _probe_in_thread(url, stop, in_process) if in_process_probes else None
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        load_s = time.perf_counter() - started
        load_cpu_s = time.process_time() - cpu_started
        timed = prober.finish()
        probes = timed["latencies_s"]
        stop.set()
        if sampler is not None:
            sampler.join()
        extra = {}
        if in_thread is not None:
            in_thread.join()
            extra = {"in_process_probes": percentiles(in_process),
                     "in_process_probes_over_100ms": sum(p > 0.1 for p in in_process)}
        return {**extra, "statuses": dict(Counter(str(s) for s in statuses)), "probes": percentiles(probes),
                "probes_over_100ms": sum(p > 0.1 for p in probes), "load_s": round(load_s, 3),
                "load_process_cpu_s": round(load_cpu_s, 3),
                "slow_probes_start_latency_s": _slow_probes(timed),
                "rss_before_mib": before / 2**20 if memory_of else None,
                "rss_peak_mib": peak[0] / 2**20 if memory_of else None,
                "rss_after_mib": memory_of() / 2**20 if memory_of else None}

    def post(client: httpx.Client, statuses: list[int]) -> None:
        try:
            statuses.append(client.post("/predict", content=body, headers=JSON_HEADERS).status_code)
        except httpx.TransportError:
            statuses.append(0)  # a dropped connection: counted as status 0

    def once(client: httpx.Client, statuses: list[int]) -> None:
        try:
            post(client, statuses)
        finally:
            client.close()

    def connected_clients(count: int) -> list[httpx.Client]:
        """``count`` clients, each with its connection open (one GET /livez), made before the phase starts: the
        burst is the bodies, not 100 clients' set-up (TLS contexts, connections) in this process."""
        clients = [httpx.Client(base_url=url, timeout=300) for _ in range(count)]
        for client in clients:
            client.get("/livez")
        return clients

    def looping(statuses: list[int], until: float) -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            while time.perf_counter() < until:
                post(client, statuses)

    quiet_until = time.perf_counter() + min(10.0, loop_seconds)  # the probes without bodies: the baseline
    at_once: list[int] = []
    result = {"bodies": bodies, "body_bytes": len(body),
              "quiet": {"seconds": min(10.0, loop_seconds), **phase(
                  [threading.Thread(target=time.sleep, args=(max(0.0, quiet_until - time.perf_counter()),))], [])},
              "at_once": phase([threading.Thread(target=once, args=(client, at_once))
                                for client in connected_clients(bodies)], at_once)}
    if loop_clients > 0 and loop_seconds > 0:
        looped: list[int] = []
        until = time.perf_counter() + loop_seconds
        result["looping"] = {"clients": loop_clients, "seconds": loop_seconds, "requests": None, **phase(
            [threading.Thread(target=looping, args=(looped, until)) for _ in range(loop_clients)], looped)}
        result["looping"]["requests"] = len(looped)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_overload", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--deadline-s", type=positive_float, default=30.0, help="the server's max_latency_ms, in s")
    parser.add_argument("--factor", type=positive_float, default=4.0, help="offered work / finishable work")
    parser.add_argument("--large-fraction", type=positive_float, default=LARGE_FRACTION,
                        help="a large request's work / what the server computes within the deadline")
    parser.add_argument("--quick", action="store_true", help="deadline 10 s")
    parser.add_argument("--out", default="runs/bench/overload.json", help="JSON results file")
    parser.add_argument("--idle-requests", type=positive_int, default=5, help="small requests on the idle server")
    parser.add_argument("--mode", choices=("all", "overload", "burst"), default="all",
                        help="overload, burst of large bodies, or both (default)")
    parser.add_argument("--burst-bodies", type=positive_int, default=100, help="bodies of the burst sent at once")
    parser.add_argument("--body-bytes", type=burst_body_bytes, default=BURST_BODY_BYTES,
                        help="size of each burst body (one image padded with spaces)")
    parser.add_argument("--loop-clients", type=int, default=2, help="clients looping large bodies after the burst")
    parser.add_argument("--loop-seconds", type=positive_float, default=30.0, help="how long they loop")
    parser.add_argument("--in-process-probes", action="store_true",
                        help="also probe from a thread of the load's own process (for comparison: those probes "
                             "wait for the load threads' turn at the interpreter lock)")
    args = parser.parse_args(argv)
    check_classifier_dir(parser, args)
    deadline_s = 10.0 if args.quick else args.deadline_s
    record = run_record(argv, "benchmarks.bench_overload")
    with tempfile.TemporaryDirectory(prefix="bench_overload_") as tmp, \
            running_server(Path(tmp), args.classifier_dir, args.denoiser_dir, sigma=0.25,
                           max_latency_ms=int(deadline_s * 1000)) as server:
        figures = {}
        if args.mode in ("all", "overload"):
            figures = measure(server.url, mnist_test_images(), deadline_s, args.factor, args.idle_requests,
                              args.large_fraction)
        if args.mode in ("all", "burst"):
            worker = worker_process(server)
            figures["burst"] = measure_burst(server.url, args.burst_bodies, args.body_bytes,
                                             lambda: worker.memory_info().rss, args.loop_clients, args.loop_seconds,
                                             args.in_process_probes)
    result = {**record, **figures}
    if "goodput" in figures:
        print_overload(figures)
    if "burst" in figures:
        print_burst(figures["burst"])
    save_result(args.out, result)
    return 0


def print_overload(figures: dict) -> None:
    print(f"rate {figures['rate_samples_per_s']:.0f} samples/s; {figures['large_requests']} large requests "
          f"({figures['large']}), {figures['offered_samples'] / figures['finishable_samples']:.1f}x the finishable "
          f"work; statuses {figures['large_statuses']}; Retry-After {figures['retry_after_s']}")
    print(f"goodput {figures['goodput']:.3f} ({figures['completed_samples']:.0f} of {figures['computed_samples']:.0f} "
          f"computed samples); small requests {figures['small_statuses']}, "
          f"{figures['small_within_3x_idle']} within 3x idle ({figures['idle_small']['p50_s']:.3f} s)")


def print_burst(burst: dict) -> None:
    for name in ("quiet", "at_once", "looping"):
        if name not in burst:
            continue
        phase = burst[name]
        what = {"quiet": f"no bodies for {phase.get('seconds', 0):g} s (the baseline)",
                "at_once": f"{burst['bodies']} bodies of {burst['body_bytes']} bytes at once",
                "looping": f"{phase.get('clients')} clients looping such bodies for {phase.get('seconds', 0):g} s "
                           f"({phase.get('requests')} sent)"}[name]
        print(f"{what}: statuses {phase['statuses']}; probes p50 {phase['probes']['p50_s']:.3f} s, p99 "
              f"{phase['probes']['p99_s']:.3f} s, max {phase['probes']['max_s']:.3f} s, "
              f"{phase['probes_over_100ms']} of {phase['probes']['count']} over 100 ms; worker RSS "
              f"{phase['rss_before_mib']:.0f} MiB before, {phase['rss_peak_mib']:.0f} peak, "
              f"{phase['rss_after_mib']:.0f} after")
        if "in_process_probes" in phase:
            own = phase["in_process_probes"]
            print(f"  probes from a thread of the load's process: p50 {own['p50_s']:.3f} s, p99 {own['p99_s']:.3f} s, "
                  f"max {own['max_s']:.3f} s, {phase['in_process_probes_over_100ms']} of {own['count']} over 100 ms")


if __name__ == "__main__":
    raise SystemExit(main())
