"""The registry of training methods: name -> :class:`~training.methods.base.Method`.

The built-in methods register themselves here when their module is imported; :func:`training.methods.get_method`
imports a built-in method's module the first time it is looked up (they import torch).
"""
from __future__ import annotations

from training.methods.base import Method

_METHODS: dict[str, Method] = {}
# the methods of this package, registered when their module is first imported (they import torch)
BUILTIN = ("nodp", "sepdp", "transdenoiser", "recipe", "securesgd-prt", "securesgd-sct", "stobatch")
# the methods that train a denoiser with training.private_train (one console text, one audit: privacy-audit)
DENOISER_METHODS = ("nodp", "sepdp", "transdenoiser", "recipe")


def register(method: Method) -> Method:
    """Add ``method`` under ``method.name``; a name already taken is refused."""
    if not isinstance(getattr(method, "name", None), str) or not method.name:
        raise ValueError("a method needs a non-empty name")
    if method.name in _METHODS and _METHODS[method.name] is not method:
        raise ValueError(f"a training method named {method.name!r} is already registered")
    _METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove the method registered as ``name`` (tests; a built-in one comes back on the next lookup)."""
    _METHODS.pop(name, None)


def method_names() -> tuple[str, ...]:
    """Every method's name: the built-in ones in their order, then those registered since."""
    return BUILTIN + tuple(sorted(n for n in _METHODS if n not in BUILTIN))


def registered(name: str) -> Method | None:
    """The method registered as ``name``, or None (no built-in module is imported here)."""
    return _METHODS.get(name)
