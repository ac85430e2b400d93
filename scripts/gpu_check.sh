#!/usr/bin/env bash
# One-command GPU check (scripts/gpu_check.py): every computing command with --device cuda on small sizes, then
# the speed benchmarks; one table on stdout, one JSON (runs/gpu_check/gpu_check.json). --quick: CPU, under 3 min.
# Each run writes into a clean folder of its own, runs/gpu_check/<UTC time>-<pid>/ (runs/gpu_check/latest links to
# it), so a second run in the same checkout works; gpu_check.json is the latest finished run's.
#   scripts/gpu_check.sh [--quick] [--out DIR] [--skip-benchmarks] [--verbose]
# PYTHON overrides the interpreter (default: .venv/bin/python if present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
exec "$PYTHON" scripts/gpu_check.py "$@"
