"""SecureSGD's certificate (Phan et al., 2019): a checkpoint loaded with its noise layer, Monte-Carlo counts of the
noisy model's predictions, and Lecuyer et al.'s robustness condition for the noise layer's (epsilon, delta) with
Clopper-Pearson bounds (selection and estimation samples apart); run by ``baseline-certify``."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.baselines.common import clopper_pearson_bounds, largest_robust_size
from training.baselines.securesgd_mechanisms import (
    ARMS,
    MAX_ROBUST_DELTA,
    NOISE_LAYER_FILE,
    NoiseLayerModel,
    WithLayerNoise,
    hgm_attack_size,
)
from transdenoiser.errors import UserError


@dataclass
class SecureSGDModel:
    """A SecureSGD checkpoint with its noise layer: ``model(x, layer_noise)``, the noise std and r."""

    model: NoiseLayerModel
    noise_std: float
    redistribution: torch.Tensor
    metadata: dict[str, Any]

    def noisy(self) -> WithLayerNoise:
        return WithLayerNoise(self.model, self.noise_std, self.redistribution).eval()

    def attack_size(self, epsilon: float, delta: float) -> float:
        return hgm_attack_size(epsilon, delta, self.noise_std, float(self.redistribution.min()),
                               self.model.sensitivity_per_unit())


def load_securesgd(directory: str | Path, device: torch.device | str = "cpu") -> SecureSGDModel:
    """Load a SecureSGD checkpoint (hash-checked) with its noise layer."""
    from training.checkpoint import load_checkpoint, load_extra_tensors

    checkpoint = load_checkpoint(directory, map_location=device)
    meta = checkpoint.metadata
    section = meta.get("securesgd")
    if not isinstance(section, dict) or meta.get("arm") not in ARMS:
        raise UserError(f"{directory} is not a SecureSGD checkpoint (no 'securesgd' section in its metadata)")
    r = load_extra_tensors(directory, NOISE_LAYER_FILE)["redistribution"].to(device)
    kind = "classifier" if meta["kind"] == "classifier" else "denoiser"
    model = NoiseLayerModel(checkpoint.model, kind).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if tuple(r.shape) != model.hidden_shape(tuple(meta["input_shape"])) or not float(r.min()) > 0:
        raise UserError(f"{directory}: the noise layer's redistribution vector does not fit the model")
    return SecureSGDModel(model, float(section["noise_std"]), r, meta)


@dataclass(frozen=True)
class PhanCertificate:
    """Phan et al.'s (PixelDP-style) certificate for one image: ``radius`` is an L2 radius in [0,1]-pixel units
    (0 when the condition holds for no (epsilon, delta)); ``epsilon``/``delta`` the pair that gave it."""

    prediction: int
    radius: float
    p_lower: float
    p_upper: float
    epsilon: float | None
    delta: float | None
    n0: int
    n: int

    @property
    def certified(self) -> bool:
        return self.radius > 0


def phan_certificate(selection: np.ndarray, estimation: np.ndarray, alpha: float,
                     attack_size: Callable[[float, float], float],
                     max_delta: float = MAX_ROBUST_DELTA) -> PhanCertificate:
    """The certificate from counts of the randomised model's argmax: the class from ``selection``, bounds on its
    probability and on the runner-up's from ``estimation`` (:func:`clopper_pearson_bounds` at ``alpha``), and the
    largest ``attack_size(epsilon, delta)`` over the pairs meeting Lecuyer et al.'s condition."""
    top = int(np.asarray(selection).argmax())
    p_lower, p_upper = clopper_pearson_bounds(estimation, top, alpha)
    radius, eps, delta = largest_robust_size(p_lower, p_upper, attack_size, max_delta)
    return PhanCertificate(top, radius, p_lower, p_upper, eps, delta, int(np.sum(selection)), int(np.sum(estimation)))
