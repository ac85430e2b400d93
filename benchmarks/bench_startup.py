"""Start-up time of the command line, side by side: ``transdenoiser --help`` as it runs (only the
running command's module is imported) against the same help with every command's module imported
(what every invocation paid before), and a flag error of a command. Interleaved repeats, medians.

    python -m benchmarks.bench_startup --repeats 5 [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

SIDES = {
    "help": [sys.executable, "-m", "transdenoiser", "--help"],
    "help_all_modules": [sys.executable, "-c",
                         "from transdenoiser.cli import build_parser; build_parser().format_help()"],
    "flag_error": [sys.executable, "-m", "transdenoiser", "certify", "--sigma", "abc"],
    "train_flag_error": [sys.executable, "-m", "transdenoiser", "train", "--epochs", "x"],
}


def _seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, capture_output=True, check=False)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per side (default: 5)")
    parser.add_argument("--quick", action="store_true", help="one repeat, the fast sides only (smoke test)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    sides = {k: v for k, v in SIDES.items() if not (args.quick and k == "help_all_modules")}
    repeats = 1 if args.quick else args.repeats
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, command in sides.items():
            times[name].append(_seconds(command))
    from transdenoiser.runtime import _cpu_model

    result = {"repeats": repeats, "seconds": times,
              "median_seconds": {name: statistics.median(values) for name, values in times.items()},
              "hardware": f"CPU {_cpu_model()}, python {sys.version.split()[0]}"}
    if "help_all_modules" in times:
        medians = result["median_seconds"]
        result["all_modules_over_help"] = medians["help_all_modules"] / medians["help"]
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
