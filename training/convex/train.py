"""Train a private linear head on the private split and package it as a classifier checkpoint.

The feature extractor must not have seen the private split: penultimate features come only from a classifier
whose metadata says it was trained on a ``public`` split (of this dataset, with the same split, or of another
dataset). The head is fitted on the private split's normalised features by OPERA, GRPUA or DP-SGD; the test split
is used only to measure accuracy.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.convex import mechanisms
from training.convex.losses import LOSSES, ConvexLoss
from training.datasets import Dataset
from training.linear_probe import FEATURES, LinearProbe
from training.privacy.report import json_safe
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent

ALGORITHMS = ("opera", "grpua", "dpsgd")


@dataclass(frozen=True)
class HeadConfig:
    algorithm: str = "opera"
    loss: str = "logistic"
    epsilon: float = 1.0
    delta: float = 1e-5
    reg: float = 1e-3  # lambda, the paper's value
    features: str = "penultimate"
    calibration: str = "analytic"  # or classical (OutPert / SgdPert)
    opera_sensitivity: str = "gd"
    grpua_accountant: str = "theorem7"
    steps: int | None = None  # OPERA: gradient steps; GRPUA: T (default n^2, the paper's)
    radius: float | None = None  # GRPUA without regularisation
    batch_size: int = 256  # DP-SGD
    epochs: float = 10.0  # DP-SGD
    learning_rate: float = 1.0  # DP-SGD
    reproducible_noise: bool = False  # True: the DP noise is drawn from the seed (research only, flagged)

    def validate(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise UserError(f"--algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if self.loss not in LOSSES:
            raise UserError(f"--loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.features not in FEATURES:
            raise UserError(f"--features must be one of {', '.join(FEATURES)}, got {self.features!r}")
        if not self.epsilon > 0:
            raise UserError(f"--epsilon must be > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise UserError(f"--delta must lie in (0, 1), got {self.delta}")
        if self.algorithm == "dpsgd" and self.calibration != "analytic":
            raise UserError("DP-SGD is calibrated by its accountant: leave --calibration at analytic")


def check_public_features(classifier_meta: dict[str, Any], dataset: Dataset) -> dict[str, Any]:
    """Refuse a feature extractor that may have seen the private split; return where its features come from."""
    trained = classifier_meta.get("dataset", {})
    if trained.get("trained_on") != "public":
        raise UserError(f"the classifier's metadata says it was trained on {trained.get('trained_on')!r}, not a "
                        "public split: its features may encode private data (use a classifier from "
                        "`transdenoiser pretrain`, or --features pixels)")
    if trained.get("name") == dataset.name:
        theirs = trained.get("fingerprints", {}).get("public")
        if theirs != dataset.fingerprints()["public"]:
            raise UserError(f"the classifier was trained on a different public split of {dataset.name} (split seed "
                            f"{trained.get('split_seed')}, this is {dataset.split_seed}): it may have seen this "
                            "private split")
    return {"classifier_dataset": trained.get("name"), "classifier_trained_on": "public",
            "classifier_public_fingerprint": trained.get("fingerprints", {}).get("public")}


@torch.inference_mode()
def embed(probe: LinearProbe, images: torch.Tensor, device: torch.device, batch_size: int = 500) -> np.ndarray:
    probe.eval()
    parts = [probe.embed(images[i:i + batch_size].to(device)).double().cpu() for i in range(0, len(images), batch_size)]
    features = torch.cat(parts).numpy()
    # float32 rounding can leave a norm a hair above 1: project back onto the unit ball in float64
    return features / np.maximum(1.0, np.linalg.norm(features, axis=1, keepdims=True))


def build_probe(dataset: Dataset, features: str, classifier_dir: str | Path | None,
                device: torch.device) -> tuple[LinearProbe, dict[str, Any], dict[str, Any]]:
    """The untrained probe (extractor weights loaded), its architecture kwargs and the features' provenance."""
    if features == "pixels":
        kwargs = {"features": "pixels", "num_classes": dataset.num_classes,
                  "feature_dim": int(np.prod(dataset.image_shape))}
        return LinearProbe(**kwargs).to(device), kwargs, {"features": "pixels"}
    if classifier_dir is None:
        raise UserError("--features penultimate needs --classifier DIR (a classifier trained on the public split)")
    from training.checkpoint import load_checkpoint

    base = load_checkpoint(classifier_dir, kind="classifier")
    provenance = check_public_features(base.metadata, dataset)
    if list(base.metadata.get("input_shape", [])) != list(dataset.image_shape):
        raise UserError(f"classifier {classifier_dir} takes images of shape {base.metadata.get('input_shape')}, "
                        f"{dataset.name} has {list(dataset.image_shape)}")
    kwargs = {"features": "penultimate", "num_classes": dataset.num_classes,
              "base_architecture": base.metadata["architecture"], "base_kwargs": base.metadata["arch_kwargs"]}
    probe = LinearProbe(**kwargs)
    kwargs["feature_dim"] = probe.feature_dim
    missing, unexpected = probe.extractor.load_state_dict(base.model.state_dict(), strict=False)
    last = [k for k in unexpected if k.startswith("head.")]
    if missing or len(last) != len(unexpected):
        raise UserError(f"classifier {classifier_dir}: its weights do not fit the feature extractor "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    provenance.update({"features": "penultimate", "classifier": str(Path(classifier_dir).resolve()),
                       "classifier_sha256": base.metadata.get("files", {}).get("weights.safetensors")})
    return probe.to(device), kwargs, provenance


def fit_head(X: np.ndarray, labels: np.ndarray, config: HeadConfig, num_classes: int, seed: int,
             track: Track = silent) -> mechanisms.Release:
    """Run the configured private algorithm on normalised features ``X`` (n, d)."""
    config.validate()
    loss = ConvexLoss(config.loss, num_classes)
    rng = np.random.default_rng(seed)
    if config.algorithm == "opera":
        solution = mechanisms.opera_solve(X, labels, loss, config.reg, sensitivity=config.opera_sensitivity,
                                          steps=config.steps, track=track)
        return mechanisms.opera_release(solution, config.epsilon, config.delta, rng, config.calibration)
    if config.algorithm == "grpua":
        return mechanisms.grpua(X, labels, loss, config.epsilon, config.delta, config.reg, rng, steps=config.steps,
                                accountant=config.grpua_accountant, calibration=config.calibration,
                                radius=config.radius, track=track)
    return mechanisms.dpsgd_head(X, labels, loss, config.epsilon, config.delta, config.reg, rng,
                                 batch_size=config.batch_size, epochs=config.epochs,
                                 learning_rate=config.learning_rate, track=track)


def train_head(dataset: Dataset, config: HeadConfig, classifier_dir: str | Path | None, device: torch.device,
               seed: int, track: Track = silent) -> tuple[LinearProbe, dict[str, Any]]:
    """Fit a private head on the private split; return the probe (eval mode) and its checkpoint metadata."""
    config.validate()
    started = time.perf_counter()
    probe, arch_kwargs, provenance = build_probe(dataset, config.features, classifier_dir, device)
    x_private, y_private = dataset.private.tensors("cpu")
    X = embed(probe, x_private, device)
    noise_seed = seed if config.reproducible_noise else secrets.randbits(63)  # never stored when secret
    release = fit_head(X, y_private.numpy(), config, dataset.num_classes, noise_seed, track)
    with torch.no_grad():
        probe.weight.copy_(torch.from_numpy(release.weights).to(probe.weight))
    x_test, y_test = dataset.test.tensors("cpu")
    with torch.inference_mode():
        predictions = torch.cat([probe(x_test[i:i + 500].to(device)).argmax(1).cpu()
                                 for i in range(0, len(x_test), 500)])
    test_accuracy = float((predictions == y_test).double().mean())
    privacy = json_safe(release.privacy)
    privacy["noise"] = noise_description(config, seed)
    metadata = {
        "kind": "classifier", "architecture": "linear-probe", "arch_kwargs": arch_kwargs,
        "input_shape": list(dataset.image_shape), "num_classes": dataset.num_classes,
        "class_names": list(dataset.classes),
        "dataset": {"name": dataset.name, "split_seed": dataset.split_seed, "trained_on": "private",
                    "fingerprints": dataset.fingerprints(), "source": dataset.source, "features_from": provenance},
        "test_accuracy": test_accuracy,
        "train": {"config": asdict(config), "seed": seed, "seconds": time.perf_counter() - started,
                  "device": str(device), "private_examples": len(X), "feature_dim": int(X.shape[1])},
        "privacy": privacy,
    }
    return probe.eval(), metadata


def noise_description(config: HeadConfig, seed: int) -> dict[str, Any]:
    """How the DP noise was drawn: secret (CSPRNG seed, never stored) unless ``reproducible_noise``."""
    if config.reproducible_noise:
        return {"mode": "reproducible", "seed": seed,
                "warning": (f"REPRODUCIBLE NOISE: the DP noise can be recomputed from the recorded seed ({seed}); no "
                            "epsilon in this report holds against anyone who has the seed. Research only.")}
    return {"mode": "secret", "seed": None,
            "source": "numpy generator seeded from the operating system's CSPRNG; the seed is not recorded"}


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, (int, float)) else str(value)


def format_head_privacy(privacy: dict[str, Any]) -> str:
    """The privacy report as text (privacy_report.txt beside the checkpoint)."""
    lines = [f"mechanism: {privacy['mechanism']}",
             f"epsilon = {_number(privacy['epsilon'])}, delta = {_number(privacy['delta'])} "
             f"(neighbouring relation: {privacy['neighbouring']})",
             f"data independent: {str(privacy['data_independent']).lower()}"]
    noise = privacy.get("noise", {})
    if noise.get("mode") == "reproducible":
        lines.insert(0, noise["warning"])
    elif noise:
        lines.append(f"noise: secret ({noise['source']})")
    for key in ("theorem", "calibration", "sensitivity_bound", "sensitivity", "query", "query_sensitivity",
                "noise_std", "noise_multiplier", "steps", "n"):
        if key in privacy:
            lines.append(f"{key.replace('_', ' ')}: {privacy[key]}")
    for key, value in privacy.get("epsilons", {}).items():
        lines.append(f"epsilon by {key}: {_number(value)}  [{privacy['analyses'][key]}]")
    for key, value in privacy.get("analyses", {}).items():
        if key not in privacy.get("epsilons", {}):
            lines.append(f"analysis {key}: {value}")
    return "\n".join(lines) + "\n"
