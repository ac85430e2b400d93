"""Mismatches the checkpoints' metadata can tell: refused with one line naming both sides, or a warning line.

Library-level checks (they raise :class:`~transdenoiser.errors.UserError` or return the warning text; the
CLI prints it). Used by ``bundle``/``serve`` and by ``certify`` and ``attack``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from transdenoiser.errors import UserError
from transdenoiser.records import CheckpointMetadata, trained_sigma

SIGMA_RTOL = 1e-9  # sigmas are settings, not measurements: equal means equal up to float formatting
SAME_DISTRIBUTION = {"mnist10k": "mnist"}  # dataset names whose images come from one distribution


def denoiser_sigma(denoiser_metadata: CheckpointMetadata | Mapping[str, Any] | None) -> float | None:
    """The input-noise sigma a denoiser was trained at (its metadata's ``sigma``), or None if unknown."""
    if isinstance(denoiser_metadata, CheckpointMetadata):
        return denoiser_metadata.trained_sigma
    if not denoiser_metadata:
        return None
    return trained_sigma(denoiser_metadata.get("sigma"), denoiser_metadata.get("config"))


def check_sigma(sigma: float, denoiser_metadata: CheckpointMetadata | Mapping[str, Any] | None, *, allow_mismatch: bool,
                where: str = "--sigma", denoiser: str = "the denoiser") -> str | None:
    """Refuse a smoothing ``sigma`` other than the denoiser's training sigma unless ``allow_mismatch``.

    Returns None when they agree (or no denoiser / no recorded sigma), the warning line when they differ and
    the mismatch is allowed; raises UserError otherwise.
    """
    trained = denoiser_sigma(denoiser_metadata)
    if trained is None or math.isclose(sigma, trained, rel_tol=SIGMA_RTOL):
        return None
    text = (f"{where} {sigma:g} differs from the sigma {denoiser} was trained at ({trained:g}); a denoiser removes "
            "the noise level it was trained on")
    if not allow_mismatch:
        raise UserError(f"{text}: use {where} {trained:g}, or pass --allow-sigma-mismatch to do it anyway")
    return f"warning: {text} (allowed by --allow-sigma-mismatch)"


def check_same_dataset(data_name: str, model_metadata: CheckpointMetadata | Mapping[str, Any], model: str) -> None:
    """Refuse data from another dataset than the one ``model`` was trained or measured on (when recorded)."""
    if isinstance(model_metadata, CheckpointMetadata):
        recorded = model_metadata.dataset.name if model_metadata.dataset else None
    else:
        recorded = (model_metadata.get("dataset") or {}).get("name")
    if recorded and data_name and SAME_DISTRIBUTION.get(recorded, recorded) != SAME_DISTRIBUTION.get(data_name,
                                                                                                    data_name):
        raise UserError(f"{model} was trained on {recorded}, the data is {data_name}; pass --dataset {recorded} "
                        "(or a model trained on this dataset)")
