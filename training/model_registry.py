"""The registry of model architectures: a name -> the factory that builds it.

Classifiers (training/classifiers.py), denoisers (training/denoisers.py) and the private linear head
(training/linear_probe.py) register here; :func:`training.models.build_model` builds any of them.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from transdenoiser.errors import UserError

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register(name: str):
    """Decorator: make ``build_model(name, **kwargs)`` construct this architecture."""

    def wrap(factory):
        _REGISTRY[name] = factory
        return factory

    return wrap


def build_registered(architecture: str, **kwargs) -> nn.Module:
    """Build the architecture registered under ``architecture`` (one-line error if unknown or badly called)."""
    if architecture not in _REGISTRY:
        raise UserError(f"unknown architecture {architecture!r}; known: {', '.join(sorted(_REGISTRY))}, "
                        "torchvision:NAME")
    try:
        return _REGISTRY[architecture](**kwargs)
    except TypeError as exc:
        raise UserError(f"architecture {architecture!r}: bad arguments {kwargs} ({exc})") from None


def registered_names() -> list[str]:
    return sorted(_REGISTRY)
