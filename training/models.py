"""Every model architecture, by name: ``build_model(name, **kwargs)``.

Every model takes images with pixels in [0, 1] (N, C, H, W); classifiers normalise inside, so randomized
smoothing can add its noise in pixel space. The architectures live in training/classifiers.py,
training/denoisers.py and training/linear_probe.py (the private linear head, ``linear-probe``), each registered
in training/model_registry.py; importing this module registers them all.
"""
from __future__ import annotations

from torch import nn

import training.denoisers  # noqa: F401  (registers the denoiser architectures)
import training.linear_probe  # noqa: F401  (registers the private linear head, linear-probe)
from training.classifiers import build_classifier
from training.model_registry import registered_names


def build_model(architecture: str, **kwargs) -> nn.Module:
    """Build a registered architecture, or ``torchvision:NAME`` for any torchvision classification model."""
    return build_classifier(architecture, **kwargs)


def architectures() -> list[str]:
    return registered_names()


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
