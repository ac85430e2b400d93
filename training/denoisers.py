"""Denoiser architectures g, registered in :mod:`training.model_registry` (``build_model("autoencoder", ...)``).

All take and return images with pixels in [0, 1] (N, C, H, W); the loss is eq. (1) of the TransDenoiser
paper, ``l(z, theta) = ||g(z) - x||^2`` summed over pixels. None uses batch statistics (no BatchNorm): a
per-example gradient must depend on that example alone, or DP-SGD's clipping bound is void.

- ``autoencoder``: the paper's convolution / transposed-convolution autoencoder (two stride-2 convolutions
  down, two stride-2 transposed convolutions up, sigmoid output). Height and width must be multiples of 4
  (28x28 and 32x32 are). Parameters with the default widths (32, 64): 37,569 for 28x28x1, 38,723 for 32x32x3.
  ``norm="group"`` adds GroupNorm after each hidden layer (+256 parameters).
- ``tiny``: one stride-2 convolution, one 3x3 convolution, one transposed convolution; width 8 gives 737
  parameters for one channel (1,027 for three), small enough that S_min of the w x w matrix is computable.
- ``dncnn``: DnCNN as used by Salman et al. (2020): ``depth`` 3x3 convolutions of ``width`` channels
  (default 17 and 64, 556,097 parameters for one channel, 558,403 for three), predicting the noise and
  returning ``z - noise``. Salman et al. use BatchNorm; here ``norm`` is ``group`` (GroupNorm, per-example,
  the Opacus replacement) or ``none``.
"""
from __future__ import annotations

import torch
from torch import nn

from training.model_registry import register
from transdenoiser.errors import UserError

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU, "softplus": nn.Softplus}
DENOISERS = ("autoencoder", "tiny", "dncnn")


def make_activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise UserError(f"unknown activation {name!r}; expected one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if int(value) < 1:
            raise UserError(f"denoiser {key} must be >= 1, got {value}")


@register("autoencoder")
class ConvAutoencoder(nn.Module):
    """The paper's denoising autoencoder: Conv(s2) -> Conv(s2) -> ConvT(s2) -> ConvT(s2) -> sigmoid."""

    def __init__(self, in_channels: int = 1, widths: tuple[int, int] | list[int] = (32, 64),
                 activation: str = "relu", norm: str = "none", groups: int = 8):
        super().__init__()
        if len(widths) != 2:
            raise UserError(f"autoencoder widths must be two numbers, got {list(widths)}")
        _check_positive(in_channels=in_channels, width_1=widths[0], width_2=widths[1], groups=groups)
        w1, w2 = int(widths[0]), int(widths[1])
        if norm not in ("group", "none"):
            raise UserError(f"autoencoder norm must be 'group' or 'none' (BatchNorm breaks per-example gradients), "
                            f"got {norm!r}")
        if norm == "group" and (w1 % groups or w2 % groups):
            raise UserError(f"autoencoder widths {[w1, w2]} are not divisible by groups {groups}")

        def hidden(width: int) -> list[nn.Module]:  # GroupNorm (per example) after each hidden layer, if asked
            return ([nn.GroupNorm(groups, width)] if norm == "group" else []) + [make_activation(activation)]

        self.encoder = nn.Sequential(
            nn.Conv2d(in_channels, w1, 3, stride=2, padding=1), *hidden(w1),
            nn.Conv2d(w1, w2, 3, stride=2, padding=1), *hidden(w2),
        )
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(w2, w1, 3, stride=2, padding=1, output_padding=1), *hidden(w1),
            nn.ConvTranspose2d(w1, in_channels, 3, stride=2, padding=1, output_padding=1),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.decoder(self.encoder(z)))


@register("tiny")
class TinyAutoencoder(nn.Module):
    """A very small autoencoder (737 parameters at width 8, one channel): S_min stays computable."""

    def __init__(self, in_channels: int = 1, width: int = 8, activation: str = "silu"):
        super().__init__()
        _check_positive(in_channels=in_channels, width=width)
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, stride=2, padding=1), make_activation(activation),
            nn.Conv2d(width, width, 3, padding=1), make_activation(activation),
            nn.ConvTranspose2d(width, in_channels, 3, stride=2, padding=1, output_padding=1),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(z))


@register("dncnn")
class DnCNN(nn.Module):
    """DnCNN (Zhang et al. 2017) as in Salman et al. (2020): residual output ``z - noise_estimate``."""

    def __init__(self, in_channels: int = 1, depth: int = 17, width: int = 64, activation: str = "relu",
                 norm: str = "group", groups: int = 8):
        super().__init__()
        _check_positive(in_channels=in_channels, depth=depth, width=width, groups=groups)
        if depth < 2:
            raise UserError(f"dncnn depth must be >= 2, got {depth}")
        if norm not in ("group", "none"):
            raise UserError(f"dncnn norm must be 'group' or 'none' (BatchNorm breaks per-example gradients), "
                            f"got {norm!r}")
        if norm == "group" and width % groups:
            raise UserError(f"dncnn width {width} is not divisible by groups {groups}")
        layers: list[nn.Module] = [nn.Conv2d(in_channels, width, 3, padding=1), make_activation(activation)]
        for _ in range(depth - 2):
            layers.append(nn.Conv2d(width, width, 3, padding=1, bias=norm == "none"))
            if norm == "group":
                layers.append(nn.GroupNorm(groups, width))
            layers.append(make_activation(activation))
        layers.append(nn.Conv2d(width, in_channels, 3, padding=1))
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z - self.net(z)


def denoiser_kwargs(architecture: str, in_channels: int, activation: str, extra: dict | None = None) -> dict:
    """The constructor arguments saved in a denoiser checkpoint (``arch_kwargs``)."""
    if architecture not in DENOISERS:
        raise UserError(f"unknown denoiser {architecture!r}; expected one of {', '.join(DENOISERS)}")
    kwargs = {"in_channels": int(in_channels), "activation": activation}
    kwargs.update(extra or {})
    if "widths" in kwargs:
        kwargs["widths"] = [int(v) for v in kwargs["widths"]]
    return kwargs


def check_denoiser_fits(model: nn.Module, image_shape: tuple[int, int, int]) -> None:
    """Refuse an image shape the denoiser cannot reproduce (e.g. autoencoder with sides not multiples of 4)."""
    probe = torch.zeros((1, *image_shape), device=next(model.parameters()).device)
    try:
        with torch.no_grad():
            out = model(probe)
    except RuntimeError as exc:
        raise UserError(f"denoiser cannot take images of shape {image_shape}: {str(exc).splitlines()[0]}") from None
    if tuple(out.shape[1:]) != tuple(image_shape):
        raise UserError(f"denoiser maps images of shape {tuple(image_shape)} to {tuple(out.shape[1:])}; "
                        "the autoencoders need height and width divisible by 4")
