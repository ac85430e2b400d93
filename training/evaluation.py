"""The frozen classifier's checks and the per-epoch evaluation on the test split, shared by every training arm.

:func:`subset` picks the fixed subsets ``train_examples`` and ``eval_examples`` name; :func:`evaluate` measures a
denoiser in front of the classifier on fixed noise; :func:`classifier_baselines` the classifier alone.
"""
from __future__ import annotations

import math
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
    """The classifier alone on clean and on noisy test images (same noise as :func:`evaluate`)."""
    generator = torch.Generator().manual_seed(noise_seed)
    clean = noisy = 0
    for start in range(0, len(x), EVAL_BATCH):
        xb, yb = x[start:start + EVAL_BATCH], y[start:start + EVAL_BATCH]
        zb = xb + sigma * torch.randn(xb.shape, generator=generator).to(xb.device)
        clean += int((classifier(xb).argmax(1) == yb).sum())
        noisy += int((classifier(zb).argmax(1) == yb).sum())
    return {"accuracy_clean": clean / max(1, len(x)), "accuracy_noisy_no_denoiser": noisy / max(1, len(x))}

def classifier_summary(classifier: Checkpoint) -> dict[str, Any]:
    meta = classifier.metadata
    return {"num_classes": meta.get("num_classes"), "architecture": meta.get("architecture"),
            "input_shape": meta.get("input_shape"), "test_accuracy": meta.get("test_accuracy"),
            "path": str(classifier.path), "weights_sha256": meta.get("files", {}).get("weights.safetensors"),
            "dataset": meta.get("dataset")}


def check_classifier_fits(classifier: Checkpoint, dataset: Dataset) -> None:
    meta = classifier.metadata
    if meta.get("kind") != "classifier":
        raise UserError(f"{classifier.path} holds a {meta.get('kind')}, expected a classifier")
    if list(meta.get("input_shape", [])) != list(dataset.image_shape):
        raise UserError(f"classifier {classifier.path} takes images of shape {meta.get('input_shape')}, "
                        f"{dataset.name} has {list(dataset.image_shape)}")
    if meta.get("num_classes") != dataset.num_classes:
        raise UserError(f"classifier {classifier.path} has {meta.get('num_classes')} classes, "
                        f"{dataset.name} has {dataset.num_classes}")
