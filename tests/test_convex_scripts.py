"""Smoke tests of the figure scripts' --quick modes (the full runs are in docs/CONVEX.md and docs/RESULTS.md)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_convex_figures_quick(tmp_path):
    code = _load("convex_figures").main(["--quick", "--losses", "logistic", "--out", str(tmp_path), "--name", "q"])
    assert code == 0
    record = json.loads((tmp_path / "q.json").read_text())
    rows = record["losses"]["logistic"]["rows"]
    assert set(rows["OPERA"]) == {"0.1", "3.0"} and set(rows["OutPert"]) == {"0.1"}  # classical: eps <= 1 only
    assert rows["non-private"]["3.0"] > 0.5
    assert (tmp_path / "q_logistic.png").stat().st_size > 1000


def test_shaped_noise_compare_quick(tmp_path):
    code = _load("shaped_noise_compare").main(["--quick", "--epsilons", "8", "--out", str(tmp_path)])
    assert code == 0
    record = json.loads((tmp_path / "shaped_noise_mnist10k_pixels.json").read_text())
    plain, shaped, paper = record["rows"]
    assert plain["epsilon_rdp"] == shaped["epsilon_rdp"] <= 8.0
    assert paper["privacy"]["data_independent_epsilon"] is None
