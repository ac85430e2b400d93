"""Mismatches the checkpoints' metadata can tell: refused with one line naming both sides, or a warning line.

Library-level checks (they raise :class:`~transdenoiser.errors.UserError` or return the warning text; the
CLI prints it). Used by ``bundle``/``serve`` and by ``certify`` and ``attack``; the denoiser worse than no
denoiser (:func:`worse_than_classifier`, its warning and ``bundle``'s refusal) also by ``train``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from transdenoiser.errors import UserError
from transdenoiser.records import CheckpointMetadata, VersusClassifier, trained_sigma

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


ALLOW_WORSE_FLAG = "--allow-worse-than-classifier"


def _versus(denoiser_metadata: CheckpointMetadata | Mapping[str, Any] | None) -> VersusClassifier | None:
    if denoiser_metadata is None or (isinstance(denoiser_metadata, Mapping) and not denoiser_metadata):
        return None
    if not isinstance(denoiser_metadata, CheckpointMetadata):
        denoiser_metadata = CheckpointMetadata.from_json(denoiser_metadata, "the denoiser's metadata")
    return denoiser_metadata.versus_classifier


def worse_than_classifier(denoiser_metadata: CheckpointMetadata | Mapping[str, Any] | None) -> VersusClassifier | None:
    """The denoiser's recorded figures when they make it worse than no denoiser (:attr:`VersusClassifier.worse`);
    None when it is not, or when the figures are not recorded (no denoiser, a checkpoint not written by ``train``)."""
    versus = _versus(denoiser_metadata)
    return versus if versus is not None and versus.worse else None


def _figures(versus: VersusClassifier) -> str:
    """"with denoiser 0.3889; without 0.7778 (7 fewer of 18 test images, one noise draw each)", with the sigma."""
    lost = (f"{versus.images_lost} fewer of {versus.images} test images" if versus.images is not None
            else "the number of test images is not recorded")
    sigma = f" + N(0, {versus.sigma:g}^2)" if versus.sigma is not None else " + noise"
    return (f"classifier accuracy on test images{sigma}: with denoiser {versus.with_denoiser:.4f}; without "
            f"{versus.without_denoiser:.4f} ({lost}, one noise draw each)")


def worse_than_classifier_warning(versus: VersusClassifier, denoiser: str = "the denoiser") -> str:
    """The multi-line warning ``train``, ``certify``, ``bundle`` and ``serve`` print for a denoiser worse than none:
    the two figures, the rule, and the likely causes with this run's own numbers."""
    data = f"{versus.private_examples} private examples" if versus.private_examples else "the private examples"
    epsilon = versus.epsilon
    at = f" at epsilon {epsilon:.3g}" if epsilon is not None and math.isfinite(epsilon) else ""
    steps = f"{versus.steps} steps" if versus.steps is not None else "the steps taken"
    causes = [] if versus.arm == "nodp" else [
        f"too little private data for this epsilon: {data}{at} (more private data, or a larger epsilon)"]
    causes.append(f"too few steps: {steps} (more --epochs)")
    rule = (f"lower by more than {versus.margin:.4f}, a one-sided 5% sampling margin on {versus.images} images"
            if versus.images is not None else "lower")
    return "\n".join([
        f"WARNING: {denoiser} makes the classifier LESS accurate under noise than no denoiser at all:",
        f"  {_figures(versus)};",
        f"  worse means {rule} (docs/TRAINING.md, \"A denoiser worse than none\").",
        "  Certified or served, it gives fewer correct answers, with certificates, than the classifier alone.",
        "  Likely causes:",
        *(f"  - {cause}" for cause in causes),
        f"  `transdenoiser bundle` refuses it unless given {ALLOW_WORSE_FLAG}."])


def check_not_worse_than_classifier(denoiser_metadata: CheckpointMetadata | Mapping[str, Any] | None, *,
                                    allow: bool, denoiser: str = "the denoiser") -> str | None:
    """Refuse (UserError, one line naming the two figures and the flag) a denoiser worse than no denoiser unless
    ``allow``; when allowed, return the multi-line warning to print; None when it is not worse (or not recorded)."""
    versus = worse_than_classifier(denoiser_metadata)
    if versus is None:
        return None
    if not allow:
        raise UserError(f"{denoiser} makes the classifier less accurate under noise than no denoiser: "
                        f"{_figures(versus)}; retrain it (more private data or steps) or pass {ALLOW_WORSE_FLAG} "
                        "to bundle it anyway (recorded on the model card)")
    return worse_than_classifier_warning(versus, denoiser) + f" (allowed by {ALLOW_WORSE_FLAG}: recorded on the card)"
