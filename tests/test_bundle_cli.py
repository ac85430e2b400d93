"""`transdenoiser bundle` writes a servable model directory; a sigma other than the denoiser's is refused or flagged."""
from __future__ import annotations

import pytest

from tests.conftest import serve_dry_run
from transdenoiser.cli import main
from transdenoiser.errors import UserError
from transdenoiser.toml import tomllib


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """An (untrained) classifier and a denoiser trained at sigma 0.25, as checkpoints: the metadata is what counts."""
    import torch

    from training.checkpoint import save_checkpoint
    from training.models import build_model

    root = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    classifier = save_checkpoint(root / "classifier", build_model("cnn28"), {
        "kind": "classifier", "architecture": "cnn28", "arch_kwargs": {}, "input_shape": [1, 28, 28],
        "num_classes": 10, "dataset": {"name": "mnist10k"}})
    denoiser = save_checkpoint(root / "denoiser", build_model("tiny", in_channels=1), {
        "kind": "denoiser", "architecture": "tiny", "arch_kwargs": {"in_channels": 1}, "input_shape": [1, 28, 28],
        "sigma": 0.25, "classifier": {"num_classes": 10}, "dataset": {"name": "mnist10k"}})
    return classifier, denoiser


def test_bundle_takes_the_denoisers_sigma_and_writes_what_serve_loads(checkpoints, tmp_path, capsys):
    classifier, denoiser = checkpoints
    out = tmp_path / "serve"
    assert main(["bundle", "--classifier", str(classifier), "--denoiser", str(denoiser), "--n", "500",
                 "--out", str(out)]) == 0
    config = tomllib.loads((out / "serving.toml").read_text())
    assert config["sigma"] == 0.25 and config["n"] == 500 and config["denoiser"] == "denoiser"
    assert sorted(p.name for p in (out / "denoiser").iterdir()) == ["metadata.json", "weights.safetensors"]
    assert main(serve_dry_run(out)) == 0
    assert "warning" not in capsys.readouterr().err


def test_bundle_refuses_another_sigma_unless_allowed(checkpoints, tmp_path, capsys):
    classifier, denoiser = checkpoints
    argv = ["bundle", "--classifier", str(classifier), "--denoiser", str(denoiser), "--sigma", "0.5"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "--sigma 0.5" in line and "(0.25)" in line and "--allow-sigma-mismatch" in line
    assert not (tmp_path / "a").exists()
    assert main([*argv, "--allow-sigma-mismatch", "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err.startswith("warning: --sigma 0.5 differs")
    assert main(serve_dry_run(tmp_path / "b")) == 0
    assert "serving.toml sigma 0.5 differs from the sigma its denoiser was trained at (0.25)" in capsys.readouterr().err


def test_bundle_without_denoiser_needs_a_sigma(checkpoints, tmp_path, capsys):
    classifier, _ = checkpoints
    assert main(["bundle", "--classifier", str(classifier), "--out", str(tmp_path / "c")]) == 2
    assert "give --sigma" in capsys.readouterr().err
    assert main(["bundle", "--classifier", str(classifier), "--sigma", "0.5", "--out", str(tmp_path / "c")]) == 0


def test_dataset_check_names_both_and_knows_mnist10k_is_mnist():
    from transdenoiser.checks import check_same_dataset

    with pytest.raises(UserError, match="trained on fashion-mnist, the data is mnist10k"):
        check_same_dataset("mnist10k", {"dataset": {"name": "fashion-mnist"}}, "classifier runs/c")
    check_same_dataset("mnist", {"dataset": {"name": "mnist10k"}}, "classifier runs/c")
    check_same_dataset("mnist10k", {}, "classifier without a record")


BENTO_SERVICE_CHECK = r"""
import json, sys
from starlette.testclient import TestClient
from serving.service import TransDenoiser

image = [[[0.5] * 28] * 28]
answers = {}
with TestClient(TransDenoiser.to_asgi(), raise_server_exceptions=False) as client:
    for kind, body in {"fixed": {}, "decide": {"radius": 0.1}, "estimate": {"adaptive": True}}.items():
        response = client.post("/predict", json={"images": [image], "n": 200, **body})
        answers[kind] = response.status_code
    answers["/metadata"] = client.post("/metadata").status_code  # the model card (/metrics: the real-server tests)
    for path in ("/readyz", "/livez"):
        answers[path] = client.get(path).status_code
ours = {name: getattr(module, "__file__", None) for name, module in sys.modules.items()
        if name.split(".")[0] in ("serving", "certify", "training", "transdenoiser")}
print(json.dumps({"answers": answers, "modules": ours}))
"""


def test_the_bento_holds_every_module_the_service_runs(checkpoints, tmp_path):
    """Copy only what bentofile.yaml includes, serve the three request kinds from that copy, and check every module
    of ours that ran came from it: a module the include list misses fails here, not in a user's container."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from serving.bundle import write_model_dir

    root = Path(__file__).resolve().parents[1]
    spec = yaml.safe_load((root / "bentofile.yaml").read_text())
    bento = tmp_path / "bento"
    for pattern in spec["include"]:  # as BentoML reads them: a "*" stays within one path component
        for path in root.glob(pattern):
            relative = path.relative_to(root)
            (bento / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, bento / relative)
    # every module the service can import (anywhere in a module, inside functions too, followed from
    # serving/service.py) is in the Bento
    import ast

    from tests.test_import_layers import imported_names, module_path

    todo, reached = ["serving/service.py"], set()
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        for name in imported_names(ast.parse((root / module).read_text()), root):
            assert module_path(bento, name) is not None, f"{module} imports {name}, which the Bento does not hold"
            todo.append(module_path(root, name))
    # the Bento ships no training code: of training/, only the core that loads models (tests/test_import_layers.py)
    shipped = sorted(path.relative_to(bento).as_posix() for path in (bento / "training").rglob("*.py"))
    assert shipped == ["training/__init__.py", "training/checkpoint.py", "training/classifiers.py",
                       "training/denoisers.py", "training/linear_probe.py", "training/model_registry.py",
                       "training/models.py"], shipped
    classifier, denoiser = checkpoints
    model_dir = write_model_dir(tmp_path / "model", classifier, denoiser, sigma=0.25, n0=20, n=100, max_n=400)
    env = {**os.environ, "PYTHONPATH": str(bento), "TRANSDENOISER_MODEL_DIR": str(model_dir),
           "TRANSDENOISER_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    env.pop("TRANSDENOISER_API_KEY", None)
    done = subprocess.run([sys.executable, "-c", BENTO_SERVICE_CHECK], cwd=bento, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["answers"] == {"fixed": 200, "decide": 200, "estimate": 200, "/metadata": 200, "/readyz": 200,
                                 "/livez": 200}
    outside = {name: file for name, file in result["modules"].items()
               if file is not None and not Path(file).resolve().is_relative_to(bento.resolve())}
    assert not outside, f"modules the Bento would lack (bentofile.yaml include): {outside}"
    assert "serving.compute.scheduler" in result["modules"] and "certify.sequential" in result["modules"]


def test_bundle_copies_contents_without_the_training_runs_timestamps(checkpoints, tmp_path):
    """The checkpoint's files carry the time training ended; the bundle's copies must not (no copy2)."""
    import os

    classifier, denoiser = checkpoints
    for path in (classifier, denoiser):
        for name in ("weights.safetensors", "metadata.json"):
            os.utime(path / name, (1_000_000_000, 1_000_000_000))  # 2001: clearly not "now"
    out = tmp_path / "serve"
    assert main(["bundle", "--classifier", str(classifier), "--denoiser", str(denoiser), "--out", str(out)]) == 0
    for sub, source in (("classifier", classifier), ("denoiser", denoiser)):
        for name in ("weights.safetensors", "metadata.json"):
            copy = out / sub / name
            assert copy.read_bytes() == (source / name).read_bytes()
            assert copy.stat().st_mtime > 1_500_000_000 and copy.stat().st_atime > 1_500_000_000
