"""Attack evaluation and certificate audit: the library behind ``transdenoiser attack`` and ``transdenoiser audit``.

``run_attack_eval`` attacks a batch of images at each epsilon under one threat model and measures,
on the adversarial examples, the accuracy of the smoothed prediction (``Smooth.predict``; an
abstention counts as wrong), of a single noisy pass (argmax of f(D(x_adv + e)), one draw), and of
the base pipeline without noise; the clean images give the reference row.

``audit_certify_run`` re-attacks every certified example of a certify run inside its certified
radius with SmoothAdv-PGD (L2) and re-predicts with fresh noise. A changed prediction contradicts
the certificate unless the certificate (probability <= alpha) or the re-prediction (probability
<= predict alpha) erred, so the count of changes is at most Binomial(K, alpha + predict_alpha)
when everything is right; a one-sided binomial test at level alpha flags more than that.
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import binomtest

from certify.attacks.gradient import (
    ATTACKS,
    DEFAULT_MOMENTUM_DECAY,
    MADRY_STEP_FACTOR,
    PGD,
    build_attack,
    check_eps,
    check_norm,
    perturbation_norms,
)
from certify.attacks.threats import THREATS, SmoothedThreat, build_threat
from certify.core import ABSTAIN, Smooth
from certify.pipeline import Pipeline
from certify.rundir import read_rows
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent

RESULT_FORMAT = "transdenoiser-attack"
AUDIT_FORMAT = "transdenoiser-audit"
FORMAT_VERSION = 1
_SEED_PURPOSES = {"attack": 1, "smoothed": 2, "noisy": 3}


@dataclass(frozen=True)
class AttackConfig:
    """One attack evaluation. Pixels are in [0,1]; ``eps`` and ``step_size`` are in pixel units of ``norm``.

    ``step_size`` None means 2.5 * eps / steps (Madry et al.); ``eot`` is the number of Gaussian noise
    draws per gradient for the ``pipeline`` and ``smoothed`` threats; ``n`` and ``alpha`` are
    ``Smooth.predict``'s; ``batch_size`` images are attacked together (times ``eot`` in one forward pass);
    ``noise_batch_size`` noisy samples go through the model at once when predicting. ``precision`` and
    ``compile``: how the smoothed, noisy and base predictions run the pipeline (``certify.numerics``); the
    attack's gradients are always computed in float32, eagerly.
    """

    attack: str
    norm: str
    eps: tuple[float, ...]
    threat: str
    sigma: float
    steps: int = 10
    step_size: float | None = None
    eot: int = 8
    n: int = 100
    alpha: float = 0.001
    decay: float = DEFAULT_MOMENTUM_DECAY
    targeted: bool = False
    batch_size: int = 100
    noise_batch_size: int = 1000
    precision: str = "float32"
    compile: bool = False

    def validate(self) -> None:
        from certify.numerics import canonical_precision

        canonical_precision(self.precision)
        if self.attack not in ATTACKS:
            raise UserError(f"unknown attack {self.attack!r}; expected one of {', '.join(ATTACKS)}")
        check_norm(self.norm)
        if self.threat not in THREATS:
            raise UserError(f"unknown threat model {self.threat!r}; expected one of {', '.join(THREATS)}")
        if not self.eps:
            raise UserError("give at least one epsilon")
        for eps in self.eps:
            check_eps(eps)
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise UserError(f"sigma must be > 0, got {self.sigma}")
        for name in ("steps", "eot", "n", "batch_size", "noise_batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"{name.replace('_', ' ')} must be >= 1, got {getattr(self, name)}")
        if self.step_size is not None and not (math.isfinite(self.step_size) and self.step_size > 0):
            raise UserError(f"step size must be > 0, got {self.step_size}")
        if not 0 < self.alpha < 1:
            raise UserError(f"alpha must lie strictly between 0 and 1, got {self.alpha}")


def derived_seed(seed: int, purpose: str, eps: float) -> int:
    """A seed per (run seed, purpose, epsilon): one epsilon's numbers do not depend on which others ran."""
    state = np.random.SeedSequence([seed % 2**63, _SEED_PURPOSES[purpose], round(eps * 1_000_000)])
    return int(state.generate_state(1, dtype=np.uint64)[0] % 2**63)


def evenly_spaced(total: int, count: int | None) -> np.ndarray:
    """``count`` indices spread evenly over range(total) (splits are sorted by class), or all of them."""
    if count is None or count >= total:
        return np.arange(total)
    return np.unique(np.round(np.linspace(0, total - 1, count)).astype(np.int64))


def _batches(total: int, size: int):
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def smoothed_predictions(smooth: Smooth, images: torch.Tensor, n: int, alpha: float, generator: torch.Generator,
                         track: Track = silent, desc: str | None = None) -> np.ndarray:
    """``Smooth.predict`` for each image, images packed into shared forward passes. One generator serves all
    images in order, so the noise is the same as predicting them one by one."""
    per_pass = max(1, smooth.batch_size // n)
    chunks = [images[start:start + per_pass] for start in range(0, len(images), per_pass)]
    predictions: list[int] = []
    for chunk in track(chunks, desc=desc, total=len(chunks)):
        predictions.extend(smooth.predict_many(chunk, n, alpha, [generator] * len(chunk)))
    return np.array(predictions)


@torch.no_grad()
def _evaluate(smooth: Smooth, images: torch.Tensor, labels: torch.Tensor, n: int, alpha: float, seed: int,
              eps: float, track: Track, desc: str) -> dict[str, Any]:
    """Accuracies on ``images``: smoothed prediction (abstain = wrong), one noisy pass, and the base model; and
    ``smoothed_correct``, each image's smoothed outcome (1 correct, 0 wrong or abstained) in ``images``' order, so
    two runs on the same images can be compared image by image (a paired comparison)."""
    smoothed_gen = smooth.generator(derived_seed(seed, "smoothed", eps))
    noisy_gen = smooth.generator(derived_seed(seed, "noisy", eps))
    predictions = smoothed_predictions(smooth, images, n, alpha, smoothed_gen, track, desc)
    truth = labels.cpu().numpy()
    noise = torch.randn(images.shape, generator=noisy_gen, device=images.device, dtype=images.dtype)
    noisy = smooth.base_logits(images + smooth.sigma * noise).argmax(dim=1).cpu().numpy()
    base = smooth.base_logits(images).argmax(dim=1).cpu().numpy()
    return {
        "smoothed_accuracy": float(np.mean(predictions == truth)),
        "smoothed_correct": (predictions == truth).astype(int).tolist(),
        "smoothed_abstain_rate": float(np.mean(predictions == ABSTAIN)),
        "noisy_accuracy": float(np.mean(noisy == truth)),
        "base_accuracy": float(np.mean(base == truth)),
    }


def run_attack_eval(pipeline: Pipeline, images: torch.Tensor, labels: torch.Tensor, config: AttackConfig,
                    seed: int, track: Track = silent) -> dict[str, Any]:
    """Attack ``images`` (N, C, H, W in [0,1]) at every epsilon of ``config``; return the JSON-ready results.

    Keys: ``settings`` (the config), ``num_images``, ``clean`` (reference accuracies), ``results`` (one
    dict per epsilon: eps, step_size, the three accuracies, abstain rate, each image's smoothed outcome, mean/max
    perturbation norm, seconds). Same seed, same numbers.
    """
    config.validate()
    device = pipeline.device
    images, labels = images.to(device), labels.to(device)
    smooth = Smooth(pipeline.classifier, pipeline.num_classes, config.sigma, pipeline.denoiser,
                    batch_size=config.noise_batch_size, device=device, precision=config.precision,
                    compile=config.compile)
    threat = build_threat(config.threat, pipeline.classifier, pipeline.denoiser, config.sigma, config.eot)
    clean = _evaluate(smooth, images, labels, config.n, config.alpha, seed, 0.0, track, "clean")
    results = []
    for eps in config.eps:
        started = time.perf_counter()
        attack = build_attack(config.attack, threat, config.norm, eps, config.steps, config.step_size,
                              config.decay, config.targeted, device)
        generator = smooth.generator(derived_seed(seed, "attack", eps))
        adversarial = torch.cat([attack(images[part], labels[part], generator)
                                 for part in track(list(_batches(len(images), config.batch_size)),
                                                   desc=f"{config.attack} eps={eps:g}")])
        attack_seconds = time.perf_counter() - started
        norms = perturbation_norms(adversarial - images, config.norm)
        row = {"eps": eps, "step_size": None if config.attack == "fgsm" else
               (config.step_size if config.step_size is not None else MADRY_STEP_FACTOR * eps / config.steps)}
        row.update(_evaluate(smooth, adversarial, labels, config.n, config.alpha, seed, eps, track,
                             f"predict eps={eps:g}"))
        row.update({"mean_norm": float(norms.mean()), "max_norm": float(norms.max()),
                    "attack_seconds": attack_seconds, "seconds": time.perf_counter() - started})
        results.append(row)
    return {"settings": asdict(config), "num_images": len(images), "clean": clean, "results": results}


# ------------------------------------------------------------------------------------------- audit

@dataclass(frozen=True)
class AuditConfig:
    """The audit's attack (PGD L2 on the smoothed soft classifier) and re-prediction.

    Each certified example is attacked at eps = radius * (1 - margin); ``m`` noise draws per gradient;
    ``n`` samples for ``Smooth.predict``, at ``predict_alpha`` (None: the certify run's alpha).
    ``precision`` / ``compile``: None takes the certify run's (the certificate is about the pipeline as it ran
    there); another value is refused.
    """

    margin: float = 0.01
    steps: int = 20
    step_size: float | None = None
    m: int = 8
    n: int = 1000
    predict_alpha: float | None = None
    max_examples: int | None = None
    batch_size: int = 50
    precision: str | None = None
    compile: bool | None = None

    def validate(self) -> None:
        if not 0 <= self.margin < 1:
            raise UserError(f"margin must lie in [0, 1), got {self.margin}")
        for name in ("steps", "m", "n", "batch_size"):
            if getattr(self, name) < 1:
                raise UserError(f"{name.replace('_', ' ')} must be >= 1, got {getattr(self, name)}")
        if self.max_examples is not None and self.max_examples < 1:
            raise UserError(f"max must be >= 1, got {self.max_examples}")
        if self.step_size is not None and not (math.isfinite(self.step_size) and self.step_size > 0):
            raise UserError(f"step size must be > 0, got {self.step_size}")
        if self.predict_alpha is not None and not 0 < self.predict_alpha < 1:
            raise UserError(f"predict alpha must lie strictly between 0 and 1, got {self.predict_alpha}")


@dataclass
class CertifyRun:
    """A certify run read back: its settings and its rows (idx, label, predict, radius)."""

    directory: Path
    settings: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)


def read_run_to_audit(run_dir: str | Path) -> CertifyRun:
    """A finished certify run to audit: its summary read as the typed record (``certify.report.read_certify_summary``:
    task and format version checked) and its certify.tsv; anything malformed is refused in one line."""
    from certify.report import read_certify_summary

    run_dir = Path(run_dir)
    summary_path, tsv_path = run_dir / "summary.json", run_dir / "certify.tsv"
    for path in (summary_path, tsv_path):
        if not path.is_file():
            raise UserError(f"{run_dir} is not a certify run: {path.name} is missing")
    record = read_certify_summary(run_dir)
    if not isinstance(record.settings, Mapping):
        raise UserError(f"{summary_path}: not a certify summary with a 'settings' object")
    settings = dict(record.settings)
    needed = ("classifier", "denoiser", "dataset", "split_seed", "split", "sigma", "alpha")
    missing = [key for key in needed if key not in settings]
    if missing:
        raise UserError(f"{summary_path}: settings lack {', '.join(missing)}")
    records = read_rows(tsv_path, "certify")
    rows = [{"idx": r.idx, "label": r.label, "predict": r.prediction, "radius": r.radius} for r in records]
    return CertifyRun(run_dir, settings, rows)


def audit_numerics(run: CertifyRun, config: AuditConfig) -> dict[str, Any]:
    """The precision and compile flag the audit re-predicts with: the certify run's; a different one is refused."""
    from certify.numerics import canonical_precision, numeric_settings, short_name

    recorded = numeric_settings(run.settings)
    if config.precision is not None and canonical_precision(config.precision) != recorded["precision"]:
        raise UserError(f"--precision {config.precision}: {run.directory} was certified at "
                        f"{short_name(recorded['precision'])}; the audit re-predicts with the classifier as certified "
                        f"(leave --precision out)")
    if config.compile is not None and config.compile != recorded["compile"]:
        raise UserError(f"--compile: {run.directory} was certified {'with' if recorded['compile'] else 'without'} "
                        f"torch.compile; the audit re-predicts with the classifier as certified (leave it out)")
    return recorded


def binomial_excess_pvalue(violations: int, trials: int, rate: float) -> float:
    """P[Binomial(trials, rate) >= violations]: small means more violations than ``rate`` allows."""
    if trials == 0 or violations == 0:
        return 1.0
    return float(binomtest(violations, trials, p=min(rate, 1.0), alternative="greater").pvalue)


def audit_certify_run(run: CertifyRun, pipeline: Pipeline, images: torch.Tensor, config: AuditConfig, seed: int,
                      track: Track = silent) -> dict[str, Any]:
    """Attack each certified example of ``run`` just inside its radius and re-predict; count changed predictions.

    ``images`` holds the run's split (all of it, indexed by the run's ``idx``). Returns the JSON-ready audit:
    counts (audited, kept, abstained, changed), the violation rate, the null rate alpha + predict_alpha,
    the one-sided binomial p-value and ``failed`` (p-value < alpha), plus one row per audited example.
    """
    config.validate()
    settings = run.settings
    alpha = float(settings["alpha"])
    sigma = float(settings["sigma"])
    predict_alpha = config.predict_alpha if config.predict_alpha is not None else alpha
    certified = [row for row in run.rows if row["predict"] != ABSTAIN and row["radius"] > 0]
    if config.max_examples is not None:
        certified = certified[:config.max_examples]
    device = pipeline.device
    numeric = audit_numerics(run, config)
    smooth = Smooth(pipeline.classifier, pipeline.num_classes, sigma, pipeline.denoiser, device=device,
                    precision=numeric["precision"], compile=numeric["compile"])
    threat = SmoothedThreat(pipeline.classifier, sigma, pipeline.denoiser, config.m)
    attack_gen = smooth.generator(derived_seed(seed, "attack", 0.0))
    predict_gen = smooth.generator(derived_seed(seed, "smoothed", 0.0))
    records = []
    for part in track(list(_batches(len(certified), config.batch_size)), desc="audit"):
        rows = certified[part]
        index = torch.tensor([row["idx"] for row in rows], dtype=torch.long)
        if int(index.max()) >= len(images) or int(index.min()) < 0:
            raise UserError(f"{run.directory}: idx {int(index.max())} is outside the {settings['split']} split "
                            f"({len(images)} images)")
        x = images[index].to(device)
        predicted = torch.tensor([row["predict"] for row in rows], dtype=torch.long, device=device)
        eps = torch.tensor([row["radius"] * (1 - config.margin) for row in rows], dtype=torch.float64, device=device)
        attack = PGD(threat, "l2", eps, config.steps, config.step_size, device=device)
        adversarial = attack(x, predicted, attack_gen)  # untargeted: away from the certified prediction
        norms = perturbation_norms(adversarial - x, "l2").cpu().numpy()
        after_all = smoothed_predictions(smooth, adversarial, config.n, predict_alpha, predict_gen)
        for row, after, norm_value, eps_value in zip(rows, after_all, norms, eps.cpu().numpy(), strict=True):
            outcome = "kept" if after == row["predict"] else ("abstained" if after == ABSTAIN else "changed")
            records.append({"idx": row["idx"], "label": row["label"], "certified": row["predict"],
                            "radius": row["radius"], "eps": float(eps_value), "norm": float(norm_value),
                            "after": int(after), "outcome": outcome})
    audited = len(records)
    changed = sum(r["outcome"] == "changed" for r in records)
    null_rate = alpha + predict_alpha
    pvalue = binomial_excess_pvalue(changed, audited, null_rate)
    return {
        "format": AUDIT_FORMAT, "format_version": FORMAT_VERSION,
        "certify_run": str(run.directory), "certify_settings": settings,
        "settings": {**asdict(config), **numeric, "predict_alpha": predict_alpha, "attack": "pgd", "norm": "l2",
                     "threat": "smoothed", "seed": seed},
        "certified_in_run": sum(r["predict"] != ABSTAIN and r["radius"] > 0 for r in run.rows),
        "rows_in_run": len(run.rows),
        "audited": audited,
        "kept": sum(r["outcome"] == "kept" for r in records),
        "abstained": sum(r["outcome"] == "abstained" for r in records),
        "changed": changed,
        "changed_rate": changed / audited if audited else 0.0,
        "alpha": alpha, "null_rate": null_rate, "pvalue": pvalue, "failed": pvalue < alpha,
        "max_norm_over_eps": max((r["norm"] / r["eps"] for r in records if r["eps"] > 0), default=0.0),
        "examples": records,
    }
