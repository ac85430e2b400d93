"""The pause of CPython's full garbage collection in the prediction worker's process: start-up objects frozen or
not, and after a run of probes with BentoML's request timers kept (BentoML's own timeout middleware) or cancelled.

    python -m benchmarks.bench_gc_pause [--classifier-dir runs/demo/classifier] [--repeats 5] [--probes 5000]
    python -m benchmarks.bench_gc_pause --quick      # 1 repeat, 200 probes: a smoke run

The service starts in this process through Starlette's test client, as the worker starts it (model loading,
warm-up and the freeze of the start-up's objects, ``transdenoiser.runtime.freeze_start_up_objects``). While a
collection runs, the event loop, hence every request and probe, waits. Two measurements, each timed in
wall-clock seconds and in CPU seconds of this process (which do not depend on other jobs sharing the machine):

- *after probes*: ``--probes`` requests for a path no route has (each answered 404 by BentoML's router, so it
  passes every BentoML middleware; the health probes, ``/livez`` and ``/readyz``, were sent here before the front
  door, ``serving.front_door``, began answering them ahead of those middlewares), then one full collection, with
  BentoML's ``TimeoutMiddleware.__call__`` as BentoML ships it ("timers_kept": each request's 600 s timer, and
  the request's context it holds, stays) or as the server patches it ("timers_cancelled",
  ``serving.library_patches.cancel_request_timers``), in alternating order; after each run the timers still
  pending are cancelled and collected, so that the next run starts from the same heap. Also the objects the
  collector tracks after the probes, against before them.
- *start-up objects*: alternately ``gc.unfreeze()`` + ``gc.collect()`` (the server before the freeze: a full
  collection scans every start-up object) and ``gc.freeze()`` + ``gc.collect()`` (the server now).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.serving_common import check_classifier_dir, model_args, run_record, save_result
from transdenoiser.argtypes import positive_int

TIMER_MODES = ("timers_kept", "timers_cancelled")
# the requests sent: a path no route has (404 from BentoML's router), so each passes through every BentoML
# middleware, its timeout middleware included; the health probes no longer do (the front door answers them first)
THROUGH_BENTOML = "/no-such-path"


def _timed_collection() -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    gc.collect()
    return time.perf_counter() - wall, time.process_time() - cpu


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "max": max(values)}


def measure(repeats: int) -> dict:
    timings: dict[str, dict[str, list[float]]] = {mode: {"wall_s": [], "cpu_s": []} for mode in ("unfrozen", "frozen")}
    for _ in range(repeats):
        for mode in ("unfrozen", "frozen"):
            gc.unfreeze() if mode == "unfrozen" else gc.freeze()
            wall, cpu = _timed_collection()
            timings[mode]["wall_s"].append(wall)
            timings[mode]["cpu_s"].append(cpu)
    return {mode: {key: _summary(values) for key, values in kinds.items()} for mode, kinds in timings.items()}


async def _cancel_long_timers() -> int:
    """Cancel the event loop's timers due in more than 5 minutes (the requests' 600 s timers); how many."""
    loop = asyncio.get_running_loop()
    pending = [handle for handle in loop._scheduled if not handle.cancelled() and handle.when() - loop.time() > 300]
    for handle in pending:
        handle.cancel()
    return len(pending)


def measure_after_probes(client, probes: int, repeats: int) -> dict:
    """A full collection after ``probes`` probes, BentoML's request timers kept or cancelled (see the module)."""
    from bentoml._internal.server.http.traffic import TimeoutMiddleware

    from serving.library_patches import cancel_request_timers

    cancel_request_timers()
    patched, original = TimeoutMiddleware.__call__, TimeoutMiddleware._transdenoiser_original_call
    runs: dict[str, dict[str, list[float]]] = {mode: {"wall_s": [], "cpu_s": [], "objects_added": [],
                                                      "timers_left": []} for mode in TIMER_MODES}
    try:
        for index in range(repeats):
            for mode in TIMER_MODES if index % 2 == 0 else TIMER_MODES[::-1]:
                TimeoutMiddleware.__call__ = original if mode == "timers_kept" else patched
                gc.collect()
                tracked = len(gc.get_objects())
                for _ in range(probes):
                    client.get(THROUGH_BENTOML)
                wall, cpu = _timed_collection()
                runs[mode]["objects_added"].append(len(gc.get_objects()) - tracked)
                runs[mode]["wall_s"].append(wall)
                runs[mode]["cpu_s"].append(cpu)
                runs[mode]["timers_left"].append(client.portal.call(_cancel_long_timers))
                TimeoutMiddleware.__call__ = patched
                client.get("/livez")  # one more turn of the loop: the cancelled timers leave its heap
                gc.collect()
    finally:
        TimeoutMiddleware.__call__ = patched
    return {mode: {key: _summary(values) for key, values in kinds.items()} for mode, kinds in runs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_gc_pause", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--repeats", type=positive_int, default=5, help="collections timed in each mode")
    parser.add_argument("--probes", type=positive_int, default=5000, help="probes before each timed collection")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 200 probes: a smoke run")
    parser.add_argument("--out", default="runs/bench/gc_pause.json", help="JSON results file")
    args = parser.parse_args(argv)
    check_classifier_dir(parser, args)
    repeats, probes = (1, 200) if args.quick else (args.repeats, args.probes)
    from starlette.testclient import TestClient

    from serving.bundle import write_model_dir

    record = run_record(argv, "benchmarks.bench_gc_pause")
    with tempfile.TemporaryDirectory(prefix="bench_gc_pause_") as tmp:
        model_dir = write_model_dir(Path(tmp) / "model", args.classifier_dir, args.denoiser_dir, sigma=0.25)
        os.environ.update(TRANSDENOISER_MODEL_DIR=str(model_dir), TRANSDENOISER_DEVICE="cpu")
        from serving.service import TransDenoiser

        with TestClient(TransDenoiser.to_asgi()) as client:
            assert client.get("/readyz").status_code == 200
            frozen_at_start = gc.get_freeze_count()
            after_probes = measure_after_probes(client, probes, repeats)
            figures = measure(repeats)
    result = {**record, "frozen_at_start_up": frozen_at_start, "repeats": repeats, "probes": probes,
              "after_probes": after_probes, **figures}
    for mode, run in after_probes.items():
        print(f"after {probes} requests, {mode.replace('_', ' ')}: a full collection (medians of {repeats}) "
              f"{run['wall_s']['median']:.4f} s wall, {run['cpu_s']['median']:.4f} s CPU; "
              f"{run['objects_added']['median']:.0f} objects more tracked, {run['timers_left']['median']:.0f} "
              "request timers pending")
    unfrozen, frozen = figures["unfrozen"], figures["frozen"]
    print(f"{frozen_at_start} objects frozen at start-up; a full collection (medians of {repeats}): unfrozen "
          f"{unfrozen['wall_s']['median']:.4f} s wall, {unfrozen['cpu_s']['median']:.4f} s CPU; frozen "
          f"{frozen['wall_s']['median']:.4f} s wall, {frozen['cpu_s']['median']:.4f} s CPU")
    save_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
