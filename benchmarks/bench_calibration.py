"""Calibration time over random inputs: ``noise_multiplier_for_epsilon`` on the suite's calibration test's strategy.

    python -m benchmarks.bench_calibration --quick                 # seconds: a smoke run
    python -m benchmarks.bench_calibration --examples 300 --json runs/bench/calibration.json

The suite runs that test on the same 8 derandomized inputs every time (tests/test_release.py); this benchmark
draws ``--examples`` fresh ones from the same strategy (target epsilon 1e-3 to 1e6, sample rate 1e-6 to 1, 1 to 10^6
steps, accountant rdp / pld / gdp, delta 1e-5) and times each calibration, so that the slowest corner is known.
Prints the slowest inputs; the JSON has every one.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks import write_result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_calibration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=300, help="random inputs to time")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis's random seed")
    parser.add_argument("--quick", action="store_true", help="3 inputs (a smoke run)")
    parser.add_argument("--json", type=Path, default=Path("runs/bench/calibration.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.examples = 3
    if args.examples < 1:
        parser.error("--examples must be >= 1")
    import torch
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    from training.privacy.accounting import clear_caches, noise_multiplier_for_epsilon
    from transdenoiser.errors import UserError
    from transdenoiser.runtime import hardware_description

    rows: list[dict] = []

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(target=st.floats(min_value=1e-3, max_value=1e6), q=st.floats(min_value=1e-6, max_value=1),
           steps=st.integers(min_value=1, max_value=10 ** 6), accountant=st.sampled_from(["rdp", "pld", "gdp"]))
    def calibrate(target, q, steps, accountant):
        clear_caches()
        started = time.perf_counter()
        try:
            z, refused = noise_multiplier_for_epsilon(target, q, steps, 1e-5, accountant=accountant), None
        except UserError as exc:
            z, refused = None, str(exc)
        rows.append({"seconds": round(time.perf_counter() - started, 3), "target_epsilon": target,
                     "sample_rate": q, "steps": steps, "accountant": accountant, "noise_multiplier": z,
                     "refused": refused})

    calibrate()
    rows.sort(key=lambda row: -row["seconds"])
    write_result(args.json, {"command": "python -m benchmarks.bench_calibration "
                             + " ".join(sys.argv[1:] if argv is None else argv),
                             "hardware": hardware_description(torch.device("cpu")), "examples": len(rows),
                             "rows": rows})
    print(f"{len(rows)} calibrations; the slowest:")
    for row in rows[:5]:
        print(f"  {row['seconds']:7.2f} s  target {row['target_epsilon']:.6g}, q {row['sample_rate']:.3g}, "
              f"{row['steps']:,} steps, {row['accountant']}: "
              + (f"z = {row['noise_multiplier']:.6g}" if row["refused"] is None else "refused"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
