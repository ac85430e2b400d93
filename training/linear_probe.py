"""The ``linear-probe`` classifier: a frozen feature extractor, per-example normalisation, a linear head.

Features: ``penultimate`` (the input of a registered classifier's last ``nn.Linear``, whose ``head`` is an
``nn.Sequential`` ending in it: cnn28, resnet20) or ``pixels`` (the flattened image). Each feature vector f is
mapped to x = [f / ||f||, 1] / sqrt(2) (f = 0 gives [0, 1] / sqrt(2)), so ||x|| <= 1 for every input: the
Lipschitz constants of training/convex/losses.py hold whatever the data. Logits are x @ weight (d + 1, K).
Takes [0, 1] pixels like every classifier here, so smoothing noise is added in pixel space.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from training.classifiers import build_classifier
from training.model_registry import register
from transdenoiser.errors import UserError

FEATURES = ("penultimate", "pixels")


def penultimate_extractor(base: nn.Module) -> tuple[nn.Module, int]:
    """``base`` with its last linear layer replaced by the identity, and that layer's input width."""
    head = getattr(base, "head", None)
    if not isinstance(head, nn.Sequential) or not isinstance(head[-1], nn.Linear):
        raise UserError(f"{type(base).__name__}: penultimate features need a classifier whose `head` is an "
                        "nn.Sequential ending in nn.Linear (cnn28, resnet20); use --features pixels")
    width = head[-1].in_features
    head[-1] = nn.Identity()
    return base, width


def normalise_features(features: torch.Tensor) -> torch.Tensor:
    """[f / ||f||, 1] / sqrt(2) per row: norm 1 (or 1/sqrt(2) for f = 0)."""
    norms = features.norm(dim=1, keepdim=True)
    unit = torch.where(norms > 0, features / norms.clamp_min(1e-30), torch.zeros_like(features))
    ones = torch.ones(len(features), 1, dtype=features.dtype, device=features.device)
    return torch.cat([unit, ones], dim=1) / math.sqrt(2.0)


@register("linear-probe")
class LinearProbe(nn.Module):
    """Frozen extractor + normalisation + linear head, ``weight`` of shape (feature_dim + 1, num_classes)."""

    def __init__(self, features: str = "penultimate", num_classes: int = 10, feature_dim: int = 0,
                 base_architecture: str | None = None, base_kwargs: dict | None = None):
        super().__init__()
        if features not in FEATURES:
            raise UserError(f"features must be one of {', '.join(FEATURES)}, got {features!r}")
        self.features = features
        if features == "penultimate":
            if base_architecture is None:
                raise UserError("penultimate features need the base classifier's architecture")
            self.extractor, width = penultimate_extractor(build_classifier(base_architecture, **(base_kwargs or {})))
            if feature_dim and feature_dim != width:
                raise UserError(f"feature_dim {feature_dim} does not match the extractor's width {width}")
            feature_dim = width
            for p in self.extractor.parameters():
                p.requires_grad_(False)
            self.extractor.eval()
        elif feature_dim < 1:
            raise UserError("pixel features need feature_dim = C * H * W")
        self.feature_dim = feature_dim
        self.weight = nn.Parameter(torch.zeros(feature_dim + 1, num_classes), requires_grad=False)

    def train(self, mode: bool = True):  # the extractor is frozen: dropout and batch norm stay in eval mode
        super().train(mode)
        if self.features == "penultimate":
            self.extractor.eval()
        return self

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised feature vectors (N, feature_dim + 1), each of norm <= 1."""
        raw = self.extractor(x) if self.features == "penultimate" else x.flatten(1)
        return normalise_features(raw.flatten(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x) @ self.weight
