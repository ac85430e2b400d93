"""The pause of CPython's full garbage collection in the prediction worker's process, start-up objects frozen or not.

    python -m benchmarks.bench_gc_pause [--classifier-dir runs/demo/classifier] [--repeats 5]

The service starts in this process through Starlette's test client, as the worker starts it (model loading,
warm-up and the freeze of the start-up's objects, ``transdenoiser.runtime.freeze_start_up_objects``). Then,
alternately, ``gc.unfreeze()`` + ``gc.collect()`` (the server before the freeze: a full collection scans every
start-up object) and ``gc.freeze()`` + ``gc.collect()`` (the server now), each timed in wall-clock seconds and in
CPU seconds of this process (which do not depend on other jobs sharing the machine). While a collection runs, the
event loop, hence every request and probe, waits.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.serving_common import model_args, run_record, save_result
from transdenoiser.argtypes import positive_int


def measure(repeats: int) -> dict:
    timings: dict[str, dict[str, list[float]]] = {mode: {"wall_s": [], "cpu_s": []} for mode in ("unfrozen", "frozen")}
    for _ in range(repeats):
        for mode in ("unfrozen", "frozen"):
            gc.unfreeze() if mode == "unfrozen" else gc.freeze()
            wall, cpu = time.perf_counter(), time.process_time()
            gc.collect()
            timings[mode]["wall_s"].append(time.perf_counter() - wall)
            timings[mode]["cpu_s"].append(time.process_time() - cpu)
    return {mode: {key: {"median": statistics.median(values), "max": max(values)} for key, values in kinds.items()}
            for mode, kinds in timings.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_gc_pause", description=__doc__.split("\n")[0])
    model_args(parser)
    parser.add_argument("--repeats", type=positive_int, default=5, help="collections timed in each mode")
    parser.add_argument("--out", default="runs/bench/gc_pause.json", help="JSON results file")
    args = parser.parse_args(argv)
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
            figures = measure(args.repeats)
    result = {**record, "frozen_at_start_up": frozen_at_start, **figures}
    unfrozen, frozen = figures["unfrozen"], figures["frozen"]
    print(f"{frozen_at_start} objects frozen at start-up; a full collection (medians of {args.repeats}): unfrozen "
          f"{unfrozen['wall_s']['median']:.4f} s wall, {unfrozen['cpu_s']['median']:.4f} s CPU; frozen "
          f"{frozen['wall_s']['median']:.4f} s wall, {frozen['cpu_s']['median']:.4f} s CPU")
    save_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
