"""Denoiser architectures: sizes, shapes, checks, checkpoint round trip."""
from __future__ import annotations

import pytest
import torch

from training.denoisers import check_denoiser_fits, denoiser_kwargs
from training.models import architectures, build_model, count_parameters
from transdenoiser.errors import UserError


@pytest.mark.parametrize("arch,channels,expected", [
    ("autoencoder", 1, 37_569), ("autoencoder", 3, 38_723), ("tiny", 1, 737), ("tiny", 3, 1_027),
    ("dncnn", 1, 556_097), ("dncnn", 3, 558_403)])
def test_parameter_counts_match_docs(arch, channels, expected):
    assert count_parameters(build_model(arch, in_channels=channels)) == expected


@pytest.mark.parametrize("arch,shape", [("autoencoder", (1, 28, 28)), ("autoencoder", (3, 32, 32)),
                                        ("tiny", (1, 28, 28)), ("dncnn", (3, 32, 32))])
def test_output_shape_and_range(arch, shape):
    torch.manual_seed(0)
    kwargs = {"depth": 3, "width": 8} if arch == "dncnn" else {}
    model = build_model(arch, in_channels=shape[0], **kwargs)
    z = torch.rand(2, *shape)
    with torch.no_grad():
        out = model(z)
    assert out.shape == z.shape
    if arch != "dncnn":
        assert float(out.min()) >= 0 and float(out.max()) <= 1


def test_dncnn_is_residual():
    model = build_model("dncnn", in_channels=1, depth=3, width=8)
    for p in model.net[-1].parameters():
        torch.nn.init.zeros_(p)
    z = torch.rand(2, 1, 12, 12)
    assert torch.equal(model(z), z)


def test_registered():
    assert {"autoencoder", "tiny", "dncnn"} <= set(architectures())


@pytest.mark.parametrize("activation", ["relu", "tanh", "silu", "softplus"])
def test_activation_option(activation):
    model = build_model("tiny", activation=activation)
    names = {type(m).__name__.lower() for m in model.modules()}
    assert activation in names


def test_bad_arguments_rejected():
    with pytest.raises(UserError, match="activation"):
        build_model("tiny", activation="gelu")
    with pytest.raises(UserError, match="BatchNorm"):
        build_model("dncnn", norm="batch")
    with pytest.raises(UserError, match="divisible"):
        check_denoiser_fits(build_model("autoencoder"), (1, 30, 30))
    with pytest.raises(UserError, match="unknown denoiser"):
        denoiser_kwargs("unet", 1, "relu")


def test_checkpoint_round_trip(tmp_path):
    from training.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    kwargs = denoiser_kwargs("tiny", 1, "silu", {"width": 4})
    model = build_model("tiny", **kwargs)
    save_checkpoint(tmp_path / "d", model, {"kind": "denoiser", "architecture": "tiny", "arch_kwargs": kwargs})
    loaded = load_checkpoint(tmp_path / "d", kind="denoiser").model
    z = torch.rand(1, 1, 28, 28)
    assert torch.equal(loaded(z), model(z))
