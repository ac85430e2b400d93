"""The frozen classifier's checks and the per-epoch evaluation on the test split, shared by every training arm.

:func:`subset` picks the fixed subsets ``train_examples`` and ``eval_examples`` name; :func:`evaluate` measures a
denoiser in front of the classifier on fixed noise; :func:`classifier_baselines` the classifier alone.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from training.checkpoint import Checkpoint
from training.datasets import Dataset
from transdenoiser.errors import UserError

EVAL_BATCH = 500
SUBSET_SEED = 0  # train_examples / eval_examples take a fixed random subset (the splits are sorted by class)


def subset(split, size: int):
    """The whole split (size 0) or a fixed random subset of ``size`` examples (seed 0, order kept)."""
    if not size or size >= len(split):
        return split
    return split.subset(np.sort(np.random.default_rng(SUBSET_SEED).permutation(len(split))[:size]))


@torch.no_grad()
def evaluate(denoiser: nn.Module, classifier: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float,
             noise_seed: int) -> dict[str, float]:
    """Reconstruction MSE (per pixel) and PSNR on x + N(0, sigma^2) with a fixed noise seed, and the frozen
    classifier's accuracy on g(x + noise)."""
    was_training = denoiser.training
    denoiser.eval()
    generator = torch.Generator().manual_seed(noise_seed)
    squared, correct = 0.0, 0
    for start in range(0, len(x), EVAL_BATCH):
        xb = x[start:start + EVAL_BATCH]
        zb = xb + sigma * torch.randn(xb.shape, generator=generator).to(xb.device)
        out = denoiser(zb)
        squared += float((out - xb).pow(2).sum())
        correct += int((classifier(out).argmax(1) == y[start:start + EVAL_BATCH]).sum())
    denoiser.train(was_training)
    mse = squared / max(1, x.numel())
    return {"mse": mse, "psnr": 10 * math.log10(1 / mse) if mse > 0 else math.inf,
            "accuracy_denoised": correct / max(1, len(x))}


@torch.no_grad()
def classifier_baselines(classifier: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float,
                         noise_seed: int) -> dict[str, float]:
    """The classifier alone on clean and on noisy test images (same noise as :func:`evaluate`), and how many images
    (``images``: what a comparison with :func:`evaluate`'s accuracy needs, transdenoiser.records.VersusClassifier)."""
    generator = torch.Generator().manual_seed(noise_seed)
    clean = noisy = 0
    for start in range(0, len(x), EVAL_BATCH):
        xb, yb = x[start:start + EVAL_BATCH], y[start:start + EVAL_BATCH]
        zb = xb + sigma * torch.randn(xb.shape, generator=generator).to(xb.device)
        clean += int((classifier(xb).argmax(1) == yb).sum())
        noisy += int((classifier(zb).argmax(1) == yb).sum())
    return {"accuracy_clean": clean / max(1, len(x)), "accuracy_noisy_no_denoiser": noisy / max(1, len(x)),
            "images": len(x)}

@dataclass(frozen=True)
class FrozenClassifier:
    """The frozen classifier h that a denoiser trains in front of: its module and what a release records of it.

    Made from a classifier checkpoint (:meth:`of`) or, by the Python API, from any ``nn.Module`` with its
    ``architecture`` description, input shape and number of classes (``path`` names where it came from;
    ``weights_sha256`` is None when there is no weights file).
    """

    model: nn.Module
    architecture: str | None
    input_shape: tuple[int, ...] | None
    num_classes: int | None
    path: str
    weights_sha256: str | None = None
    test_accuracy: float | None = None
    dataset: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, classifier: Checkpoint | FrozenClassifier) -> FrozenClassifier:
        """``classifier`` itself, or the classifier a checkpoint holds (refused if it holds something else)."""
        if isinstance(classifier, FrozenClassifier):
            return classifier
        meta = classifier.metadata
        if meta.get("kind") != "classifier":
            raise UserError(f"{classifier.path} holds a {meta.get('kind')}, expected a classifier")
        shape = meta.get("input_shape")
        return cls(model=classifier.model, architecture=meta.get("architecture"),
                   input_shape=tuple(shape) if shape is not None else None, num_classes=meta.get("num_classes"),
                   path=str(classifier.path), weights_sha256=meta.get("files", {}).get("weights.safetensors"),
                   test_accuracy=meta.get("test_accuracy"), dataset=meta.get("dataset"))

    def summary(self) -> dict[str, Any]:
        """What a released denoiser's metadata records of its classifier (``"classifier"``)."""
        return {"num_classes": self.num_classes, "architecture": self.architecture,
                "input_shape": list(self.input_shape) if self.input_shape is not None else None,
                "test_accuracy": self.test_accuracy, "path": self.path, "weights_sha256": self.weights_sha256,
                "dataset": dict(self.dataset) if self.dataset is not None else None}


def check_classifier_fits(classifier: FrozenClassifier, dataset: Dataset) -> None:
    if list(classifier.input_shape or []) != list(dataset.image_shape):
        shape = list(classifier.input_shape) if classifier.input_shape is not None else None
        raise UserError(f"classifier {classifier.path} takes images of shape {shape}, "
                        f"{dataset.name} has {list(dataset.image_shape)}")
    if classifier.num_classes != dataset.num_classes:
        raise UserError(f"classifier {classifier.path} has {classifier.num_classes} classes, "
                        f"{dataset.name} has {dataset.num_classes}")
