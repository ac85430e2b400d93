"""StoBatch's certificate (Phan et al., 2020; PixelDP-style, Lecuyer et al. 2019): the randomised classifier with
its Laplace noise layer, one-sided Clopper-Pearson bounds on its top class, and the certified L1 / L2 /
L-infinity radii; run by ``baseline-certify`` beside :class:`certify.core.Smooth` of the same model."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from training.baselines.stobatch_mechanisms import first_layer, l1_operator_norm, laplace_noise, noisy_logits
from training.baselines.stobatch_privacy import ARM
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent

ABSTAIN = -1


@dataclass(frozen=True)
class StoBatchCertificate:
    """One image's certificate: ``prediction`` (or ABSTAIN), the lower confidence bound ``p_lower`` of the top
    class under the noise layer, ``epsilon_r`` = ln(p_lower / (1 - p_lower)) / 2, and the certified radii: every
    perturbation with L1 norm below ``radius_l1`` (L2 below ``radius_l2``, L-infinity below ``radius_linf``) leaves
    the prediction unchanged, with probability >= 1 - alpha over the sampling."""

    prediction: int
    count: int
    n: int
    p_lower: float
    epsilon_r: float
    radius_l1: float
    radius_l2: float
    radius_linf: float
    paper_bound_l1: float  # the paper's composition kappa + phi (NOT a valid certificate: see docs/BASELINES.md)


def radius_from_p_lower(p_lower: float, input_scale: float, hidden_scale: float, first_layer_l1_norm: float
                        ) -> tuple[float, float, float]:
    """(epsilon_r, certified L1 radius, the paper's kappa + phi) for a top-class lower bound ``p_lower``.

    Lecuyer et al.'s condition for a pure epsilon-DP noise layer, with the runner-up bounded by 1 - p_lower:
    robust while p_lower > e^(2 eps) (1 - p_lower), i.e. eps < epsilon_r = ln(p_lower / (1 - p_lower)) / 2.
    A perturbation delta costs ||delta||_1 / b_x through the input noise (Laplace scale b_x) and at most
    S ||delta||_1 / b_h through the first-layer noise (b_h, S = the layer's L1 operator norm); either noise alone
    makes the network that DP, so the cost is the smaller one and the radius is epsilon_r max(b_x, b_h / S).
    The paper adds the two (kappa + phi = epsilon_r (b_x + b_h / S)), which a single perturbation does not
    allow (docs/BASELINES.md)."""
    if not p_lower > 0.5:
        return 0.0, 0.0, 0.0
    eps_r = 0.5 * math.log(p_lower / (1 - p_lower))
    hidden_part = hidden_scale / first_layer_l1_norm if first_layer_l1_norm > 0 else math.inf
    return eps_r, eps_r * max(input_scale, hidden_part), eps_r * (input_scale + hidden_part)


class NoisyStoBatch(nn.Module):
    """StoBatch's randomised classifier, the model its certificate is about: every call adds fresh Laplace noise at
    the input (scale ``input_scale``, pixels in [0, 1]) and at the first layer (``hidden_scale``), then runs
    :func:`noisy_logits`. The noise comes from ``generator`` (a CPU generator), or torch's global CPU generator when
    None (so that randomized smoothing can copy the module), and is moved to the input's device."""

    def __init__(self, model: nn.Module, input_scale: float, hidden_scale: float, hidden_shape: Sequence[int],
                 generator: torch.Generator | None = None):
        super().__init__()
        self.model = model
        self.input_scale, self.hidden_scale = float(input_scale), float(hidden_scale)
        self.hidden_shape = tuple(int(s) for s in hidden_shape)
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generator = self.generator if self.generator is not None else torch.default_generator
        x = x + laplace_noise(tuple(x.shape), self.input_scale, generator).to(device=x.device, dtype=x.dtype)
        hidden_noise = laplace_noise((len(x), *self.hidden_shape), self.hidden_scale, generator)
        return noisy_logits(self.model, x, hidden_noise.to(device=x.device, dtype=x.dtype))


@dataclass
class StoBatchModel:
    """A loaded ``stobatch`` checkpoint with its noise layer: the classifier (frozen, eval mode), its metadata, the
    Laplace scales b_x and b_h, and S, the first layer's L1 -> L1 operator norm (:func:`l1_operator_norm`)."""

    model: nn.Module
    metadata: dict[str, Any]
    input_scale: float
    hidden_scale: float
    first_layer_l1_norm: float
    hidden_shape: tuple[int, ...]

    @property
    def num_classes(self) -> int:
        return int(self.metadata["num_classes"])

    @property
    def pixels(self) -> int:
        """d: the number of input coordinates (channels x height x width)."""
        return int(np.prod(self.metadata["input_shape"]))

    def noisy(self, generator: torch.Generator | None = None) -> NoisyStoBatch:
        """The randomised classifier, its noise drawn from ``generator`` (None: torch's global CPU generator)."""
        return NoisyStoBatch(self.model, self.input_scale, self.hidden_scale, self.hidden_shape, generator)

    def certify(self, image: torch.Tensor, n0: int, n: int, alpha: float, batch_size: int,
                generator: torch.Generator) -> StoBatchCertificate:
        """One image's certificate: ``n0`` draws of the randomised classifier select the top class, ``n`` fresh
        draws give its one-sided Clopper-Pearson lower bound at level 1 - ``alpha``; ABSTAIN unless it exceeds 1/2;
        else :func:`radius_from_p_lower`'s L1 radius, with L2 = L1 / sqrt(d) and L-infinity = L1 / d."""
        from training.baselines.common import argmax_counts
        from transdenoiser.stats import clopper_pearson_lower

        noisy = self.noisy(generator)
        selection = argmax_counts(noisy, image, n0, self.num_classes, batch_size)
        top = int(selection.argmax())
        count = int(argmax_counts(noisy, image, n, self.num_classes, batch_size)[top])
        p_lower = clopper_pearson_lower(count, n, alpha)
        if not p_lower > 0.5:
            return StoBatchCertificate(ABSTAIN, count, n, p_lower, 0.0, 0.0, 0.0, 0.0, 0.0)
        eps_r, r1, paper = radius_from_p_lower(p_lower, self.input_scale, self.hidden_scale, self.first_layer_l1_norm)
        d = self.pixels
        return StoBatchCertificate(top, count, n, p_lower, eps_r, r1, r1 / math.sqrt(d), r1 / d, paper)


def load_stobatch(model_dir: str | Path, device: torch.device | str = "cpu") -> StoBatchModel:
    """Load a checkpoint written by the ``stobatch`` arm (hash-checked) with its noise layer's scales."""
    from training.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(model_dir, kind="classifier", map_location=device)
    meta = checkpoint.metadata
    settings = meta.get("stobatch")
    if meta.get("arm") != ARM or not isinstance(settings, dict):
        raise UserError(f"{model_dir} was not trained by the stobatch arm (no StoBatch noise layer in its metadata)")
    model = checkpoint.model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    conv = first_layer(model)
    with torch.no_grad():
        probe = torch.zeros((1, *meta["input_shape"]), device=conv.weight.device)
        hidden_shape = tuple(conv(model.normalize(probe)).shape[1:])
    return StoBatchModel(model, meta, float(settings["input_laplace_scale"]), float(settings["hidden_laplace_scale"]),
                         l1_operator_norm(conv, model.normalize.std.flatten().tolist()), hidden_shape)


def certificate_generator(seed: int, idx: int) -> torch.Generator:
    """The CPU generator of image ``idx``'s noise in a certificate run seeded with ``seed``: a stream of its own
    (:func:`training.baselines.common.certificate_seed`), so an image's certificate depends on (seed, idx) only."""
    from training.baselines.common import certificate_seed

    return torch.Generator().manual_seed(certificate_seed(seed, idx))


def certified_robustness(model_dir: str | Path, images: torch.Tensor | np.ndarray, *, n0: int = 100,
                         n: int = 1000, alpha: float = 0.001, batch_size: int = 500, seed: int = 0,
                         indices: Sequence[int] | None = None, device: torch.device | str = "cpu",
                         track: Track = silent) -> list[StoBatchCertificate]:
    """StoBatch's robustness certificate (the paper's PixelDP-style bound, made sound) for ``images``.

    ``model_dir``: a checkpoint written by the ``stobatch`` arm; ``images``: (N, C, H, W), pixels in [0, 1].
    For each image, :meth:`StoBatchModel.certify`: ``n0`` noisy forward passes (fresh Laplace noise at the input,
    scale b_x, and at the first layer, scale b_h, both from the checkpoint's metadata) select the top class; ``n``
    further passes give its one-sided Clopper-Pearson lower bound p_lower at level 1 - alpha; ABSTAIN
    unless p_lower > 1/2. The radius is :func:`radius_from_p_lower`'s; L2 and L-infinity radii follow from
    ||delta||_1 <= sqrt(d) ||delta||_2 <= d ||delta||_inf (d pixels). Image i's noise comes from
    :func:`certificate_generator` (``seed``, ``indices[i]``), ``indices`` defaulting to 0, 1, ...: repeatable, and
    the same as ``transdenoiser baseline-certify --seed SEED`` gives the split's image ``indices[i]``.
    """
    for name, value in (("n0", n0), ("n", n), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be an integer >= 1, got {value!r}")
    if not (isinstance(alpha, float) and 0 < alpha < 1):
        raise UserError(f"alpha must lie in (0, 1), got {alpha!r}")
    loaded = load_stobatch(model_dir, device)
    images = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images)
    expected = tuple(loaded.metadata["input_shape"])
    if images.dim() != 4 or tuple(images.shape[1:]) != expected:
        raise UserError(f"images must have shape (N, {', '.join(map(str, expected))}), got {tuple(images.shape)}")
    images = images.to(torch.float32)
    if images.numel() and (not bool(torch.isfinite(images).all()) or float(images.min()) < 0
                           or float(images.max()) > 1):
        raise UserError("images must be finite with pixels in [0, 1]")
    indices = list(range(len(images))) if indices is None else [int(i) for i in indices]
    if len(indices) != len(images) or any(i < 0 for i in indices):
        raise UserError(f"indices must be {len(images)} integers >= 0, one per image")
    return [loaded.certify(images[i].to(device), n0, n, alpha, batch_size, certificate_generator(seed, indices[i]))
            for i in track(range(len(images)), desc="stobatch certify", total=len(images))]
