"""The baselines that ``baseline-certify`` certifies, each as what one image's row needs: the baseline's own
certificate of its randomised model and randomized smoothing (:class:`certify.core.Smooth`) of the same model.

SecureSGD (arms securesgd-prt, securesgd-sct): Phan et al. 2019's PixelDP-style bound of the Gaussian noise layer
(:func:`training.baselines.securesgd_certify.phan_certificate`); StoBatch (arm stobatch): its Laplace noise layer's
bound (:mod:`training.baselines.stobatch_certify`). The certificates themselves live with the baselines in
``training/baselines/``; this module only runs them per image.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from certify.baseline_rows import COLUMNS, KINDS, STOBATCH_COLUMNS
from transdenoiser.errors import UserError


def baseline_arm(model_dir: Path) -> str:
    """The arm that wrote ``model_dir``, from its metadata (the ``arm`` key and the arm's own section)."""
    from training.checkpoint import read_metadata

    meta = read_metadata(model_dir)
    arm = meta.get("arm")
    section = {"securesgd-prt": "securesgd", "securesgd-sct": "securesgd", "stobatch": "stobatch"}.get(arm)
    if section is None or not isinstance(meta.get(section), dict):
        what = f"arm {arm}" if isinstance(arm, str) else f"a {meta.get('kind')} with no baseline arm"
        raise UserError(f"{model_dir} is {what}; baseline-certify takes checkpoints of arm {', '.join(KINDS)}")
    return arm


@dataclass
class Baseline:
    """What a row needs of one baseline: the model's metadata, a function giving one image's own certificate as the
    phan_* columns (and any extra ones), randomized smoothing of the randomised model, the table's columns, the
    note on the own certificate and the summary's arm-specific parts."""

    meta: dict[str, Any]
    own: Callable[[int, Any, int], dict[str, Any]]  # (idx, image, label) -> columns
    smooth: Any  # certify.core.Smooth
    columns: tuple[str, ...]
    note: str
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sampling:
    """The certificates' sampling: ``n0`` selection and ``n`` estimation draws, failure probability ``alpha``,
    ``batch_size`` draws per forward pass, ``seed`` of every image's draws, smoothing's ``sigma`` (None: the
    model's training sigma)."""

    n0: int
    n: int
    alpha: float
    batch_size: int
    seed: int
    sigma: float | None


def load_baseline(arm: str, model_dir: Path, classifier_dir: Path | None, sampling: Sampling, device) -> Baseline:
    """The baseline of ``arm`` (from :func:`baseline_arm`) at ``model_dir``, ready to certify images on ``device``."""
    if arm == "stobatch":
        return _stobatch(model_dir, classifier_dir, sampling, device)
    return _securesgd(model_dir, classifier_dir, sampling, device)


def _securesgd(model_dir: Path, classifier_dir: Path | None, s: Sampling, device) -> Baseline:
    import torch

    from certify.core import Smooth
    from training.baselines.common import argmax_counts, certificate_seed
    from training.baselines.securesgd_certify import load_securesgd, phan_certificate
    from training.checkpoint import load_checkpoint
    from transdenoiser.records import CheckpointMetadata

    baseline = load_securesgd(model_dir, device)
    meta = baseline.metadata
    record = CheckpointMetadata.from_json(meta, f"{model_dir}/metadata.json")
    noisy = baseline.noisy().to(device)
    sigma = s.sigma or record.trained_sigma
    if sigma is None:
        raise UserError(f"{model_dir} records no training sigma: give --sigma")
    # workers=1: the noise layer draws from torch's global generator, whose order must not depend on threads
    if record.kind == "denoiser":
        recorded_path = (record.classifier or {}).get("path")
        if classifier_dir is None and not recorded_path:
            raise UserError(f"{model_dir} records no classifier path: give --classifier")
        classifier_dir = classifier_dir or Path(recorded_path)
        classifier = load_checkpoint(classifier_dir, kind="classifier", map_location=device).model.eval()
        for p in classifier.parameters():
            p.requires_grad_(False)
        num_classes = record.classifier_classes
        if num_classes is None:
            raise UserError(f"{model_dir} records no classifier.num_classes")

        def predict(x):
            return classifier(noisy(x))

        smooth = Smooth(classifier, num_classes, sigma, denoiser=noisy, batch_size=s.batch_size, device=device,
                        workers=1)
    else:
        if classifier_dir is not None:
            raise UserError("--classifier is only for securesgd-prt denoisers; a securesgd-sct model is a classifier")
        if record.num_classes is None:
            raise UserError(f"{model_dir} records no num_classes")
        num_classes = record.num_classes
        predict = noisy
        smooth = Smooth(noisy, num_classes, sigma, batch_size=s.batch_size, device=device, workers=1)

    def own(idx: int, x, y: int) -> dict[str, Any]:
        torch.manual_seed(certificate_seed(s.seed, idx))  # the noise layer's draws, then smoothing's layer draws
        selection = argmax_counts(predict, x, s.n0, num_classes, s.batch_size)
        estimation = argmax_counts(predict, x, s.n, num_classes, s.batch_size)
        phan = phan_certificate(selection, estimation, s.alpha, baseline.attack_size)
        return {"phan_predict": phan.prediction, "phan_radius": phan.radius, "phan_correct": int(phan.prediction == y),
                "phan_p_lower": phan.p_lower, "phan_p_upper": phan.p_upper, "phan_epsilon": phan.epsilon,
                "phan_delta": phan.delta}

    note = ("Phan et al.'s certificate (2019): the noise layer's draws only (input noise not counted); accuracy at "
            "radius 0 is the top class's accuracy, radius r > 0 needs a certificate")
    return Baseline(meta, own, smooth, COLUMNS, note, {"noise_layer": meta.get("securesgd")})


def _stobatch(model_dir: Path, classifier_dir: Path | None, s: Sampling, device) -> Baseline:
    import torch

    from certify.core import Smooth
    from training.baselines.common import certificate_seed
    from training.baselines.stobatch_certify import ABSTAIN, certificate_generator, load_stobatch

    if classifier_dir is not None:
        raise UserError("--classifier is only for securesgd-prt denoisers; a stobatch model is a classifier")
    if s.sigma is None:
        raise UserError("give --sigma for a stobatch model: it records no Gaussian training sigma (its training "
                        "noise is Laplace)")
    baseline = load_stobatch(model_dir, device)
    # smoothing's base classifier: the randomised model, its Laplace draws from torch's global generator (seeded
    # per image below; workers=1 so their order does not depend on threads)
    smooth = Smooth(baseline.noisy(), baseline.num_classes, s.sigma, batch_size=s.batch_size, device=device,
                    workers=1)

    def own(idx: int, x, y: int) -> dict[str, Any]:
        cert = baseline.certify(x, s.n0, s.n, s.alpha, s.batch_size, certificate_generator(s.seed, idx))
        torch.manual_seed(certificate_seed(s.seed, idx, stream=2))  # smoothing's Laplace draws: a stream apart
        certified = cert.prediction != ABSTAIN
        return {"phan_predict": cert.prediction, "phan_radius": cert.radius_l2,
                "phan_correct": int(certified and cert.prediction == y), "phan_p_lower": cert.p_lower,
                "phan_p_upper": 1.0 - cert.p_lower, "phan_epsilon": cert.epsilon_r if certified else None,
                "phan_delta": 0.0 if certified else None, "stobatch_count": cert.count,
                "stobatch_radius_l1": cert.radius_l1, "stobatch_radius_linf": cert.radius_linf,
                "stobatch_paper_bound_l1": cert.paper_bound_l1}

    note = ("StoBatch's certificate (Phan et al. 2020, made sound): the Laplace noise at the input and the first layer "
            f"only (smoothing's input noise not counted); an L1 radius, written as L2 = L1 / sqrt(d), d = "
            f"{baseline.pixels}; ABSTAIN (phan_predict -1, counted wrong) unless p_lower > 1/2; phan_p_upper is "
            "1 - p_lower, phan_epsilon the robust epsilon_r, phan_delta 0 (pure DP)")
    settings = baseline.metadata["stobatch"]
    summary = {"noise_layer": {"input_laplace_scale": baseline.input_scale,
                               "hidden_laplace_scale": baseline.hidden_scale,
                               "first_layer_l1_norm": baseline.first_layer_l1_norm, "pixels": baseline.pixels,
                               "first_layer": settings.get("first_layer")}}
    return Baseline(baseline.metadata, own, smooth, COLUMNS + STOBATCH_COLUMNS, note, summary)


__all__ = ["Baseline", "Sampling", "baseline_arm", "load_baseline"]
