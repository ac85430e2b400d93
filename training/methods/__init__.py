"""Training methods: one interface (:class:`~training.methods.base.Method`) for every way to train, and a registry
by name. ``transdenoiser train --arm NAME`` runs :func:`get_method` (NAME).

- :mod:`training.methods.denoiser`: ``nodp``, ``sepdp``, ``transdenoiser`` (and the tuned recipe, their
  ``batch_size = "auto"`` mode);
- :mod:`training.methods.securesgd`: ``securesgd-prt``, ``securesgd-sct``;
- :mod:`training.methods.stobatch`: ``stobatch``.

Importing this package is cheap (no torch); a method's module is imported the first time it is looked up.
"""
from training.methods.base import (
    Hooks,
    Method,
    SettingsSource,
    TrainResult,
    get_method,
    method_names,
    register,
    unregister,
)

__all__ = ["Hooks", "Method", "SettingsSource", "TrainResult", "get_method", "method_names", "register",
           "unregister"]
