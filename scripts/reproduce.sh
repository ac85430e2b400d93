#!/usr/bin/env bash
# Regenerate every figure and table of the TransDenoiser paper's comparisons (Section 3.2: Figures 2, 3, 4, 7) on
# mnist10k and full Fashion-MNIST (CIFAR-10 with --datasets cifar10 --data-root DATA), all with the product's own
# commands. Every step is skipped when done and resumes where it stopped; arms that `transdenoiser train --help`
# does not list are reported as "skipped: arm X not available". See docs/REPRODUCTION.md.
#   scripts/reproduce.sh --quick                        # minutes: tiny models, 4 images (tests/test_reproduce.py)
#   scripts/reproduce.sh                                # full: 500 images, adaptive n_max 10,000, 3 seeds, both sets
#   scripts/reproduce.sh --images 100 --n 1000 --attack-images 100 --seeds 1 --out runs/reproduce/intermediate
#   scripts/reproduce.sh --plan | --figures-only | --estimate-from runs/reproduce/intermediate/steps.jsonl
# Run heavy modes at low priority: nice -n 10 scripts/reproduce.sh ... > runs/reproduce/log 2>&1 &
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$here/.venv/bin/python" ]; then python="$here/.venv/bin/python"; else python=python3; fi
fi
exec "$python" "$here/scripts/reproduce.py" "$@"
