"""SecureSGD's mechanisms (Phan et al., IJCAI 2019; the overview in :mod:`training.baselines.securesgd`): the
Extended and Heterogeneous Gaussian mechanisms (EGM, HGM) and the models with the noise layer after their first
layer."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from training.baselines.common import conv_operator_norm_bound
from transdenoiser.errors import UserError

ARMS = ("securesgd-prt", "securesgd-sct")
NOISE_LAYER_FILE = "noise_layer"  # noise_layer.safetensors beside the weights: the redistribution vector r
MAX_ROBUST_DELTA = 0.5  # the EGM bound needs s = ln(sqrt(2/pi)/delta) > 0, i.e. delta < 0.798; capped lower


# ------------------------------------------------------------------------------------------ EGM / HGM

def egm_noise_multiplier(epsilon: float, delta: float) -> float:
    """std / Delta of the paper's extended Gaussian mechanism: sqrt(2) (sqrt(s) + sqrt(s + eps)) / (2 eps),
    s = ln(sqrt(2/pi) / delta); for every epsilon > 0 and 0 < delta < sqrt(2/pi)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise UserError(f"epsilon must be > 0, got {epsilon}")
    if not 0 < delta < math.sqrt(2 / math.pi):
        raise UserError(f"delta must lie in (0, sqrt(2/pi)) for the EGM bound, got {delta}")
    s = math.log(math.sqrt(2 / math.pi) / delta)
    return math.sqrt(2) * (math.sqrt(s) + math.sqrt(s + epsilon)) / (2 * epsilon)


def hgm_noise_std(epsilon: float, delta: float, sensitivity: float, redistribution: torch.Tensor) -> float:
    """sigma_h such that f(D) + N(0, sigma_h^2 diag(r)) is (epsilon, delta)-DP for L2 sensitivity ``sensitivity``:
    the EGM bound with the r-weighted sensitivity ``sensitivity / sqrt(min r)``."""
    r_min = float(redistribution.min())
    if not r_min > 0:
        raise UserError("every entry of the redistribution vector must be > 0 (a zero variance has no DP)")
    return egm_noise_multiplier(epsilon, delta) * sensitivity / math.sqrt(r_min)


def hgm_attack_size(epsilon: float, delta: float, noise_std: float, redistribution_min: float,
                    sensitivity_per_unit: float) -> float:
    """The largest input L2 change L for which the noise layer is (epsilon, delta)-DP by the EGM/HGM bound:
    L = sigma_h sqrt(min r) / (sensitivity_per_unit * egm(epsilon, delta))."""
    return noise_std * math.sqrt(redistribution_min) / (sensitivity_per_unit * egm_noise_multiplier(epsilon, delta))


# ------------------------------------------------------------------------------------------ models

class NoiseLayerModel(nn.Module):
    """A registered architecture (``cnn28`` or ``autoencoder``) run with noise added after its first convolution.

    ``forward(x, layer_noise)``: ``layer_noise`` (shape of the first layer's output) is added before the first
    activation; without it the model is exactly the registered one (what ``load_checkpoint`` builds)."""

    def __init__(self, base: nn.Module, kind: str):
        super().__init__()
        if kind not in ("classifier", "denoiser"):
            raise ValueError(f"kind must be classifier or denoiser, got {kind!r}")
        self.base, self.kind = base, kind
        self.target_sensitivity = 1.0  # what :meth:`project` keeps :meth:`sensitivity_per_unit` at

    @property
    def first_layer(self) -> nn.Conv2d:
        return self.base.features[0] if self.kind == "classifier" else self.base.encoder[0]

    @property
    def first_layer_name(self) -> str:
        return "features.0" if self.kind == "classifier" else "encoder.0"

    def input_scale(self) -> float:
        """How much one unit of input L2 norm is stretched before the first layer (1 / min std for cnn28)."""
        if self.kind == "classifier":
            return 1.0 / float(self.base.normalize.std.min())
        return 1.0

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "classifier":
            return self.first_layer(self.base.normalize(x))
        return self.first_layer(x)

    def forward(self, x: torch.Tensor, layer_noise: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden(x)
        if layer_noise is not None:
            h = h + layer_noise
        if self.kind == "classifier":
            return self.base.head(self.base.features[1:](h))
        return torch.sigmoid(self.base.decoder(self.base.encoder[1:](h)))

    def sensitivity_per_unit(self) -> float:
        """Upper bound on ||h(x) - h(x')||_2 / ||x - x'||_2: :func:`conv_operator_norm_bound` times the input scale."""
        layer = self.first_layer
        return conv_operator_norm_bound(layer.weight, layer.stride) * self.input_scale()

    @torch.no_grad()
    def project(self) -> None:
        """Rescale the first layer's weight so that :meth:`sensitivity_per_unit` is ``target_sensitivity``
        (post-processing of the private update; the noise layer was calibrated for that sensitivity)."""
        self.first_layer.weight.mul_(self.target_sensitivity / self.sensitivity_per_unit())

    def hidden_shape(self, image_shape: tuple[int, int, int]) -> tuple[int, ...]:
        with torch.no_grad():
            probe = torch.zeros((1, *image_shape), device=self.first_layer.weight.device)
            return tuple(self.hidden(probe).shape[1:])


class WithLayerNoise(nn.Module):
    """``model(x)`` with fresh layer noise N(0, noise_std^2 diag(r)) each call (torch's global generator): the
    randomised model whose robustness the paper certifies; randomized smoothing of it is valid too."""

    def __init__(self, model: NoiseLayerModel, noise_std: float, redistribution: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("scale", noise_std * redistribution.sqrt())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.randn((len(x), *self.scale.shape), device=x.device, dtype=x.dtype) * self.scale
        return self.model(x, noise)


def build_noise_layer_model(arm: str, image_shape: tuple[int, int, int], num_classes: int,
                            mean: list[float], std: list[float], widths: list[int], activation: str
                            ) -> tuple[NoiseLayerModel, str, dict[str, Any]]:
    """(model, registered architecture, its arch_kwargs) for ``arm``."""
    from training.models import build_model

    if arm == "securesgd-sct":
        kwargs = {"in_channels": image_shape[0], "num_classes": num_classes, "mean": list(mean), "std": list(std)}
        architecture = "cnn28"
        if tuple(image_shape[1:]) != (28, 28):
            raise UserError(f"securesgd-sct trains the cnn28 classifier, which takes 28x28 images, got {image_shape}")
        return NoiseLayerModel(build_model(architecture, **kwargs), "classifier"), architecture, kwargs
    kwargs = {"in_channels": image_shape[0], "activation": activation, "widths": [int(w) for w in widths]}
    return NoiseLayerModel(build_model("autoencoder", **kwargs), "denoiser"), "autoencoder", kwargs
