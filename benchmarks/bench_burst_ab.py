"""The burst of large bodies (``bench_overload --mode burst``), or its overload, against two versions of the server,
interleaved.

    mkdir /tmp/before && git archive COMMIT | tar -x -C /tmp/before
    python -m benchmarks.bench_burst_ab --before /tmp/before --after . [--rounds 4] [--loop-seconds 15]
    python -m benchmarks.bench_burst_ab --before /tmp/before --after . --mode overload [--deadline-s 20]
    python -m benchmarks.bench_burst_ab --before /tmp/before --after . --before-setting round_samples=200 ...

Two servers start on 127.0.0.1, one from each code checkout (its own ``transdenoiser serve``, imported from that
directory), each over a model directory of its own (default settings, sigma 0.25, deadline 30 s; the first
server's with ``--before-setting`` values too). Then, ``--rounds`` times, the
burst benchmark's three phases (10 s of probes alone, ``--burst-bodies`` bodies of 2 MB at once, 2 clients looping
such bodies for ``--loop-seconds``) run against each server in turn, the order alternating, so that both see the
same machine; each run records the load average at its start. Figures per server: every run's probes (count, p50,
p99, max, over 100 ms) per phase, and their totals. With ``--mode overload`` (servers with the deadline
``--deadline-s``) each run is ``bench_overload``'s overload instead: its goodput, the large requests' statuses,
and each small request's latency against 3x its idle median; totals: small requests answered and within 3x.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.bench_overload import BURST_BODY_BYTES, burst_body_bytes, measure, measure_burst
from benchmarks.serving_common import (
    check_classifier_dir,
    mnist_test_images,
    model_args,
    run_record,
    save_result,
    setting,
    worker_process,
)
from serving.bundle import write_model_dir
from serving.process import ServerProcess, stop_on_terminate
from transdenoiser.argtypes import positive_float, positive_int

PHASES = ("quiet", "at_once", "looping")


def start(code: Path, model_dir: Path, log: Path) -> ServerProcess:
    """A server whose code is imported from ``code`` (the child's working directory and PYTHONPATH)."""
    previous_dir, previous_path = os.getcwd(), os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(code.resolve())
    os.chdir(code)
    try:
        return ServerProcess(model_dir, log)
    finally:
        os.chdir(previous_dir)
        if previous_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous_path


def code_checkout(text: str) -> Path:
    """A directory holding the server's code (``serving/service.py``), for ``--before`` and ``--after``."""
    path = Path(text)
    if not (path / "serving" / "service.py").is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a checkout of transdenoiser (no serving/service.py in it)")
    return path


def overload_totals(done: list[dict]) -> dict:
    """One server's overload runs together: small requests answered and within 3x idle, the slowest against its
    run's idle median, the lowest goodput."""
    answered = [run for run in done if run["small_answered"]]
    return {"small_answered": sum(run["small_answered"]["count"] for run in answered),
            "small_within_3x_idle": sum(run["small_within_3x_idle"] for run in done),
            "largest_ratio_to_idle": max((run["small_answered"]["max_s"] / run["idle_small"]["p50_s"]
                                          for run in answered), default=0.0),
            "lowest_goodput": min(run["goodput"] for run in done)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_burst_ab", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--before", type=code_checkout, required=True, help="code checkout of the first server")
    parser.add_argument("--after", type=code_checkout, required=True, help="code checkout of the second server")
    parser.add_argument("--rounds", type=positive_int, default=4, help="runs against each server")
    parser.add_argument("--burst-bodies", type=positive_int, default=100, help="bodies of the burst sent at once")
    parser.add_argument("--body-bytes", type=burst_body_bytes, default=BURST_BODY_BYTES,
                        help="size of each burst body (one image padded with spaces)")
    parser.add_argument("--loop-seconds", type=positive_float, default=15.0, help="how long 2 clients loop bodies")
    parser.add_argument("--mode", choices=("burst", "overload"), default="burst",
                        help="the burst of large bodies (default) or bench_overload's overload")
    parser.add_argument("--deadline-s", type=positive_float, default=None,
                        help="the servers' max_latency_ms, in s (default: 30 for burst, 20 for overload)")
    parser.add_argument("--before-setting", type=setting, action="append", default=[], metavar="KEY=VALUE",
                        help="a serving setting for the first server's model directory only (repeatable), e.g. "
                             "the older version's defaults where it refuses a newer value such as \"auto\"")
    parser.add_argument("--out", default="runs/bench/burst_ab.json", help="JSON results file")
    args = parser.parse_args(argv)
    deadline_s = args.deadline_s or (30.0 if args.mode == "burst" else 20.0)
    check_classifier_dir(parser, args)
    record = run_record(argv, "benchmarks.bench_burst_ab")
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="bench_burst_ab_") as tmp, stop_on_terminate():  # stopped: servers too
        model_dirs = {name: write_model_dir(Path(tmp) / f"model_{name}", args.classifier_dir, args.denoiser_dir,
                                            sigma=0.25, max_latency_ms=int(deadline_s * 1000), **settings)
                      for name, settings in (("before", dict(args.before_setting)), ("after", {}))}
        images = mnist_test_images() if args.mode == "overload" else None
        servers = {}
        try:
            for name in runs:
                servers[name] = start(getattr(args, name), model_dirs[name], Path(tmp) / f"{name}.log")
            for server in servers.values():
                server.wait_ready(time.monotonic() + 600)
            for index in range(args.rounds):
                for name in ("before", "after") if index % 2 == 0 else ("after", "before"):
                    load = os.getloadavg()[0]
                    if args.mode == "overload":
                        figures = measure(servers[name].url, images, deadline_s, 4.0)
                        runs[name].append({"load_at_start": load, **figures})
                        small = figures["small_answered"] or {"count": 0, "max_s": 0.0}
                        print(f"round {index} {name:6s} load {load:4.1f}: goodput {figures['goodput']:.3f}, large "
                              f"{figures['large_statuses']}, small {figures['small_within_3x_idle']} of "
                              f"{small['count']} within 3x idle ({figures['idle_small']['p50_s']:.3f} s), max "
                              f"{small['max_s']:.3f} s", flush=True)
                        continue
                    worker = worker_process(servers[name])
                    burst = measure_burst(servers[name].url, args.burst_bodies, args.body_bytes,
                                          lambda w=worker: w.memory_info().rss, 2, args.loop_seconds)
                    runs[name].append({"load_at_start": load, **burst})
                    print(f"round {index} {name:6s} load {load:4.1f}: " + "; ".join(
                        f"{phase} {burst[phase]['probes']['count']} probes, p99 {burst[phase]['probes']['p99_s']:.3f}"
                        f" s, max {burst[phase]['probes']['max_s']:.3f} s, {burst[phase]['probes_over_100ms']} over "
                        f"100 ms" for phase in PHASES), flush=True)
        finally:
            for server in servers.values():
                server.stop()
    if args.mode == "overload":
        totals = {name: overload_totals(done) for name, done in runs.items()}
        for name, t in totals.items():
            print(f"{name}: {t['small_within_3x_idle']} of {t['small_answered']} small requests within 3x idle "
                  f"(slowest {t['largest_ratio_to_idle']:.2f}x); lowest goodput {t['lowest_goodput']:.3f}")
        save_result(args.out, {**record, "mode": "overload", "deadline_s": deadline_s, "runs": runs, "totals": totals})
        return 0
    totals = {name: {phase: {"probes": sum(run[phase]["probes"]["count"] for run in done),
                             "over_100ms": sum(run[phase]["probes_over_100ms"] for run in done),
                             "max_s": max(run[phase]["probes"]["max_s"] for run in done)} for phase in PHASES}
              for name, done in runs.items()}
    for name, phases in totals.items():
        print(f"{name}: " + "; ".join(f"{phase} {t['over_100ms']} of {t['probes']} probes over 100 ms (max "
                                       f"{t['max_s']:.3f} s)" for phase, t in phases.items()))
    save_result(args.out, {**record, "runs": runs, "totals": totals})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
