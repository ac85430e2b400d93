"""Helpers shared by the serving benchmarks: their model arguments, a server started from a classifier checkpoint,
closed-loop client load, percentiles and their one-line summary, the server's worker process, the run record
(command, hardware, commit) and its saving. Loopback only."""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil

from benchmarks import checkout_commit, tracked_changes
from serving.bundle import write_model_dir
from serving.process import ServerProcess, stop_on_terminate

START_TIMEOUT_S = 300
DEMO_CLASSIFIER = "runs/demo/classifier"  # make demo writes it


def model_args(parser, classifier_default: str = DEMO_CLASSIFIER) -> None:
    """``--classifier-dir`` and ``--denoiser-dir``: the checkpoints the benchmark's server serves."""
    parser.add_argument("--classifier-dir", default=classifier_default, help="classifier checkpoint directory")
    parser.add_argument("--denoiser-dir", default=None, help="optional denoiser checkpoint directory")


def check_classifier_dir(parser, args) -> None:
    """Refuse (argparse's one-line error) a ``--classifier-dir`` that is not a classifier checkpoint, or a
    ``--denoiser-dir`` given that is not a denoiser checkpoint."""
    if not (Path(args.classifier_dir) / "metadata.json").is_file():
        hint = ("; run `make demo` first, or give --classifier-dir DIR" if args.classifier_dir == DEMO_CLASSIFIER
                else "")
        parser.error(f"--classifier-dir {args.classifier_dir}: not a classifier checkpoint (no metadata.json){hint}")
    denoiser = getattr(args, "denoiser_dir", None)
    if denoiser is not None and not (Path(denoiser) / "metadata.json").is_file():
        parser.error(f"--denoiser-dir {denoiser}: not a denoiser checkpoint (no metadata.json)")


def mnist_test_images(count: int = 32) -> np.ndarray:
    """The first ``count`` mnist10k test images, (count, 1, 28, 28) float32 in [0, 1]: the requests' images."""
    from training.datasets import load_dataset

    return load_dataset("mnist10k").test.tensors()[0][:count].numpy()


def save_result(out: str, result: dict, prefix: str = "") -> None:
    """Write ``result`` to the JSON file ``out`` and say where (the CLI's last line)."""
    from benchmarks import write_result

    write_result(out, result)
    print(f"{prefix}results in {out}")


@contextlib.contextmanager
def running_servers(tmp: Path, settings_by_name: dict[str, dict], classifier_dir: str,
                    denoiser_dir: str | None = None, device: str = "cpu") -> Iterator[dict[str, ServerProcess]]:
    """{name: a ``transdenoiser serve`` subprocess on 127.0.0.1 for a model directory written with that name's
    settings (in ``tmp / name``), computing on ``device``}: all started together (a start is mostly imports and
    warm-up), then each waited for; all stopped at the end."""
    servers: dict[str, ServerProcess] = {}
    with stop_on_terminate():  # terminated (timeout, a job runner): the servers are stopped all the same
        try:
            for name, settings in settings_by_name.items():
                model_dir = write_model_dir(Path(tmp) / name / "model", classifier_dir, denoiser_dir, **settings)
                servers[name] = ServerProcess(model_dir, Path(tmp) / name / "server.log", device=device)
            for server in servers.values():
                server.wait_ready(time.monotonic() + START_TIMEOUT_S)
            yield servers
        finally:
            for server in servers.values():
                server.stop()


@contextlib.contextmanager
def running_server(tmp: Path, classifier_dir: str, denoiser_dir: str | None = None, device: str = "cpu",
                   **settings) -> Iterator[ServerProcess]:
    """A ``transdenoiser serve`` subprocess on 127.0.0.1 for a model directory written with ``settings``, computing
    on ``device`` (:func:`running_servers` of one)."""
    with running_servers(tmp, {"": settings}, classifier_dir, denoiser_dir, device) as servers:
        yield servers[""]


def closed_loop(url: str, body_for: Callable[[int], dict], clients: int, max_requests: int, max_seconds: float,
                timeout: float = 600.0, on_answer: Callable[[int, dict], None] | None = None) -> dict:
    """Closed-loop load on ``/predict``: ``clients`` threads, each sending ``body_for(k)`` (k: the request's number,
    0, 1, ... across threads) and waiting for its answer, until ``max_requests`` are issued or ``max_seconds`` have
    passed. ``on_answer(k, json)`` sees each 200 answer (under the lock). Returns the answered requests'
    ``latencies`` (s), the ``failures`` ("status: text") and the phase's ``wall_s``."""
    import httpx

    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    issued = 0
    start = time.perf_counter()

    def client() -> None:
        nonlocal issued
        with httpx.Client(base_url=url, timeout=timeout) as http:
            while True:
                with lock:
                    if issued >= max_requests or time.perf_counter() - start > max_seconds:
                        return
                    number = issued
                    issued += 1
                sent = time.perf_counter()
                response = http.post("/predict", json=body_for(number))
                elapsed = time.perf_counter() - sent
                with lock:
                    if response.status_code == 200:
                        latencies.append(elapsed)
                        if on_answer is not None:
                            on_answer(number, response.json())
                    else:
                        failures.append(f"{response.status_code}: {response.text[:200]}")

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"latencies": latencies, "failures": failures, "wall_s": time.perf_counter() - start}


def server_totals(url: str) -> dict[str, float]:
    """The server's running totals from ``/metrics``: noisy samples (all kinds), passes, and the seconds the passes
    took to compute."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    totals = {"samples": 0.0, "passes": 0.0, "counter_seconds": 0.0}
    names = {"transdenoiser_noisy_samples_total": "samples", "transdenoiser_passes_total": "passes",
             "transdenoiser_counter_seconds_total": "counter_seconds"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                totals[names[sample.name]] += sample.value
    return totals


def server_figures(before: dict[str, float], after: dict[str, float], requests: int, wall_s: float) -> dict:
    """What the server did during a phase: passes per request, noisy samples per pass, and the fraction of the
    phase's wall time the passes took to compute (the rest: the host's work, or waiting for requests)."""
    passes = after["passes"] - before["passes"]
    return {"passes": passes, "passes_per_request": passes / requests if requests else None,
            "samples_per_pass": (after["samples"] - before["samples"]) / passes if passes else None,
            "counter_busy_fraction": (after["counter_seconds"] - before["counter_seconds"]) / wall_s
            if wall_s > 0 else None}


SERVER_RATES = ("passes_per_request", "samples_per_pass", "counter_busy_fraction")  # of server_figures


def describe_server(figures: dict) -> str:
    """:func:`server_figures`' rates (or medians of them) in words; "" where one is missing."""
    if any(figures.get(key) is None for key in SERVER_RATES):
        return ""
    return (f"{figures['passes_per_request']:.2f} passes per request, {figures['samples_per_pass']:.0f} samples "
            f"per pass, passes computing {100 * figures['counter_busy_fraction']:.0f}% of the time")


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "p50_s": None, "p99_s": None, "max_s": None}
    return {"count": len(values), "p50_s": float(np.percentile(values, 50)),
            "p99_s": float(np.percentile(values, 99)), "max_s": float(max(values))}


def phase_summary(name: str, figures: dict) -> str:
    """One line for a phase's ``percentiles``: its name, request count, p50 and p99."""
    def seconds(value) -> str:
        return "n/a" if value is None else f"{value:.3f}s"

    return f"{name:7s} requests={figures['count']:3d} p50={seconds(figures['p50_s'])} p99={seconds(figures['p99_s'])}"


def worker_process(server: ServerProcess) -> psutil.Process:
    """The process that computes (BentoML's worker): the descendant holding the most memory."""
    root = psutil.Process(server.process.pid)
    family = [root, *root.children(recursive=True)]
    return max(family, key=lambda p: p.memory_info().rss)


def run_record(argv: list[str] | None, module: str) -> dict:
    import torch

    from transdenoiser.runtime import hardware_description

    return {"command": f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv),
            "hardware": hardware_description(torch.device("cpu")), "cpu_count": os.cpu_count(),
            "load_average_at_start": os.getloadavg(), "commit": checkout_commit(),
            # a git checkout: its serving code as committed?
            "uncommitted_serving_changes": tracked_changes("serving", "benchmarks")}


def setting(text: str) -> tuple[str, object]:
    """A serving setting given as ``KEY=VALUE`` on a benchmark's command line: the value an integer, true or false,
    or else a string."""
    import argparse

    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    if value.lstrip("-").isdigit():
        return key, int(value)
    return key, {"true": True, "false": False}.get(value, value)
