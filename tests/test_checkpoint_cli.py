"""Checkpoints refuse truncated, tampered and mismatched files; the CLI turns bad input into one line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from training.checkpoint import load_checkpoint, save_checkpoint
from training.models import build_model
from transdenoiser.cli import main
from transdenoiser.errors import CheckpointError, UserError


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def test_round_trip_keeps_predictions(classifier_dir, classifier, mnist10k):
    x, _ = mnist10k.test.tensors()
    again = load_checkpoint(classifier_dir, kind="classifier").model
    with torch.inference_mode():
        assert torch.equal(classifier(x[:64]), again(x[:64]))
    meta = json.loads((classifier_dir / "metadata.json").read_text())
    assert meta["dataset"]["fingerprints"] == mnist10k.released_fingerprints()
    assert 0.9 < meta["test_accuracy"] <= 1.0 and meta["package_version"]


def test_truncated_weights_are_refused(classifier_dir, tmp_path):
    ckpt = _copy(classifier_dir, tmp_path)
    weights = ckpt / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="SHA-256 does not match"):
        load_checkpoint(ckpt)


def test_tampered_weights_are_refused(classifier_dir, tmp_path):
    ckpt = _copy(classifier_dir, tmp_path)
    data = bytearray((ckpt / "weights.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (ckpt / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="truncated or modified"):
        load_checkpoint(ckpt)


def test_mismatched_architecture_is_refused(classifier_dir, tmp_path):
    ckpt = _copy(classifier_dir, tmp_path)
    meta = json.loads((ckpt / "metadata.json").read_text())
    meta["arch_kwargs"]["num_classes"] = 7
    (ckpt / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="do not fit architecture"):
        load_checkpoint(ckpt)


def test_error_types_are_value_errors():
    """API users catch bad input as ValueError; integrity failures alone as CheckpointError."""
    assert issubclass(UserError, ValueError) and issubclass(CheckpointError, UserError)
    assert not issubclass(UserError, CheckpointError)


def test_cli_tampered_checkpoint_is_one_line(classifier_dir, tmp_path, capsys):
    ckpt = _copy(classifier_dir, tmp_path)
    data = bytearray((ckpt / "weights.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (ckpt / "weights.safetensors").write_bytes(bytes(data))
    code = main(["train", "--dataset", "mnist10k", "--classifier", str(ckpt), "--epochs", "1", "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "truncated or modified" in err[0], err


def test_wrong_kind_and_garbage_metadata(classifier_dir, tmp_path):
    with pytest.raises(UserError, match="expected a denoiser") as wrong_kind:
        load_checkpoint(classifier_dir, kind="denoiser")
    assert not isinstance(wrong_kind.value, CheckpointError)  # a wrong file given, not a damaged one
    ckpt = _copy(classifier_dir, tmp_path)
    (ckpt / "metadata.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(ckpt)
    with pytest.raises(UserError, match="no such directory"):
        load_checkpoint(tmp_path / "missing")


def test_save_refuses_incomplete_metadata(tmp_path):
    model = build_model("cnn28")
    with pytest.raises(ValueError, match="architecture"):
        save_checkpoint(tmp_path / "x", model, {"kind": "classifier"})


def test_cli_data_json(capsys):
    assert main(["data", "--dataset", "mnist10k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"] == 10_000 and set(out["splits"]) == {"public", "private", "test"}


def test_cli_corrupt_weights_file_is_one_line(tmp_path, capsys):
    from tests.test_datasets import make_cifar_layout

    make_cifar_layout(tmp_path / "data", n_per_batch=2)
    bad = tmp_path / "weights.safetensors"
    bad.write_bytes(b"\x00" * 10)
    code = main(["import-classifier", "--dataset", "cifar10", "--data-root", str(tmp_path / "data"), "--arch",
                 "resnet18", "--weights", str(bad), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "weights.safetensors" in err[0]


def test_cli_missing_data_root_is_one_line_subprocess(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "transdenoiser", "data", "--dataset", "mnist", "--data-root",
                           str(tmp_path / "none")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_bad_flag_value():
    with pytest.raises(SystemExit) as exc:
        main(["pretrain", "--epochs", "0"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["data", "--device", "tpu"])


def test_cuda_requested_without_gpu_is_an_error():
    from transdenoiser.runtime import resolve_device

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(UserError, match="no CUDA GPU"):
        resolve_device("cuda")


def test_import_classifier_round_trip(tmp_path, capsys):
    """A user's own torchvision state dict (.pt, loaded with weights_only=True) becomes a checkpoint."""
    from tests.test_datasets import make_cifar_layout
    from training.datasets import load_dataset

    make_cifar_layout(tmp_path / "data", n_per_batch=4)
    import torchvision

    net = torchvision.models.get_model("resnet18", weights=None, num_classes=10)
    torch.save(net.state_dict(), tmp_path / "r18.pt")
    code = main(["import-classifier", "--dataset", "cifar10", "--data-root", str(tmp_path / "data"), "--arch",
                 "resnet18", "--weights", str(tmp_path / "r18.pt"), "--out", str(tmp_path / "ckpt")])
    assert code == 0, capsys.readouterr().err
    loaded = load_checkpoint(tmp_path / "ckpt", kind="classifier").model
    x, _ = load_dataset("cifar10", tmp_path / "data").test.tensors()
    with torch.inference_mode():
        net.eval()
        expected = net((x - loaded.normalize.mean) / loaded.normalize.std)
        assert torch.allclose(loaded(x), expected, atol=1e-5)


def test_keep_freed_memory_yields_to_the_users_settings(monkeypatch):
    import platform

    from transdenoiser.runtime import MALLOC_ENV_VARIABLES, keep_freed_memory

    for name in MALLOC_ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRANSDENOISER_MALLOC", "system")
    assert keep_freed_memory() is False
    monkeypatch.delenv("TRANSDENOISER_MALLOC")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    on_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is on_glibc


def test_one_atomic_writer_replaces_whole_files_with_usual_permissions(tmp_path):
    import os

    import certify.rundir
    from training import checkpoint

    assert certify.rundir.write_text is checkpoint.write_text  # run directories use the checkpoints' fsyncing writer
    path = tmp_path / "f.txt"
    checkpoint.write_text(path, "old")
    checkpoint.write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]  # no temporary left
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
