"""Training methods: one interface (:class:`~training.methods.base.Method`) for every way to train, and a registry
by name. ``transdenoiser train --arm NAME`` runs :func:`get_method` (NAME).

- :mod:`training.methods.denoiser`: ``nodp``, ``sepdp``, ``transdenoiser`` (``batch_size = "auto"``: the tuned
  recipe's batch plan);
- :mod:`training.methods.recipe`: ``recipe``, the tuned recipe (the sepdp arm with the recipe's settings);
- :mod:`training.methods.securesgd`: ``securesgd-prt``, ``securesgd-sct``;
- :mod:`training.methods.stobatch`: ``stobatch``.

Importing this package is cheap (no torch); a method's module is imported the first time it is looked up.
"""
from training.methods.base import Hooks, Method, SettingsSource, TrainResult
from training.methods.registry import method_names, register, registered, unregister
from transdenoiser.errors import UserError

__all__ = ["Hooks", "Method", "SettingsSource", "TrainResult", "get_method", "method_names", "register",
           "unregister"]


def _load_builtin(name: str) -> None:
    if name in ("nodp", "sepdp", "transdenoiser"):
        import training.methods.denoiser  # noqa: F401  (registers the denoiser arms)
    elif name == "recipe":
        import training.methods.recipe  # noqa: F401
    elif name in ("securesgd-prt", "securesgd-sct"):
        import training.methods.securesgd  # noqa: F401
    elif name == "stobatch":
        import training.methods.stobatch  # noqa: F401


def get_method(name: str) -> Method:
    """The method registered as ``name``; an unknown name is one line listing the known ones."""
    if registered(name) is None:
        _load_builtin(name)
    method = registered(name)
    if method is None:
        raise UserError(f"unknown training method {name!r}; known: {', '.join(method_names())}")
    return method
