"""Attacks on the smoothed pipeline, one job per module.

- ``names``: the attack, norm and threat names and defaults (no torch: the CLI's flags read them).
- ``gradient``: FGSM, I-FGSM, MIM and PGD over one small base class (:class:`Attack`).
- ``threats``: what an attack differentiates (the classifier, the noisy pipeline, the smoothed pipeline).
- ``evaluate``: accuracy under attack over a bound sweep, and the audit of a certify run's certificates.
- ``report``: the attack run's TSV, figure and overlays.
- ``cli``: ``transdenoiser attack`` and ``transdenoiser audit``.

The attack classes are importable from here (``from certify.attacks import PGD``); they load torch on
first use, so importing the package for its names alone stays light.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "gradient": ("ATTACKS", "Attack", "BudgetViolation", "DEFAULT_MOMENTUM_DECAY", "FGSM", "IFGSM", "MADRY_STEP_FACTOR",
                 "MIM", "NORMS", "PGD", "Threat", "build_attack", "check_eps", "check_norm", "perturbation_norms",
                 "rounding_slack"),
    "threats": ("THREATS", "ClassifierThreat", "PipelineThreat", "SmoothedThreat", "build_threat"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
