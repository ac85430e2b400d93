# Two commands do everything on a fresh machine:
#   make demo   set up a virtual environment, install, and run the main job on the embedded data
#   make test   the same set-up, then the test suite
# then `make serve` serves the demo's model directory on http://127.0.0.1:3000 (Ctrl-C stops it).
# The command line is .venv/bin/transdenoiser; `source .venv/bin/activate` puts it on PATH as `transdenoiser`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test serve lint bench clean setup mutate gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/transdenoiser demo

test: $(STAMP)
	$(BIN)/python -m pytest

serve: $(STAMP)
	@test -f runs/demo/serve/serving.toml || { echo "make serve serves the demo's model directory: run 'make demo' first"; exit 2; }
	$(BIN)/transdenoiser serve --model-dir runs/demo/serve

lint: $(STAMP)
	$(BIN)/ruff check .

# A quick look at speed and load with the demo's models: certification, the autoencoder rows of private training and
# the serving load test at 16 clients; 156 s on 2 AMD EPYC cores. The full measurements' commands: docs/RESULTS.md.
bench: $(STAMP)
	@test -f runs/demo/denoiser/metadata.json || { echo "make bench measures the demo's models: run 'make demo' first"; exit 2; }
	$(BIN)/python -m benchmarks.bench_certify --repeats 3 --precision fp32,bf16 --classifier runs/demo/classifier --denoiser runs/demo/denoiser
	$(BIN)/python -m benchmarks.bench_training --only autoencoder:64,256 --repeats 3 --no-peak-memory
	$(BIN)/python -m benchmarks.bench_serving --classifier-dir runs/demo/classifier --denoiser-dir runs/demo/denoiser --clients 16 --seconds 5

# Every computing command with --device cuda on small sizes, then the speed benchmarks (scripts/gpu_check.sh);
# one table and runs/gpu_check/gpu_check.json. Its time on an H200: docs/results/gpu.md; needs no network.
gpu-check: $(STAMP)
	PYTHON=$(BIN)/python scripts/gpu_check.sh

# Mutation check (scripts/mutate.py): hand mutations of the privacy and certificate code, each run against its
# tests in a temporary copy of the checkout; prints survivors. About 20 minutes on 2 CPU cores; not part of 'make test'.
mutate: $(STAMP)
	$(BIN)/python scripts/mutate.py

clean:
	rm -rf $(VENV) runs .pytest_cache
