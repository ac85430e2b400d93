"""Load the defended pipeline: a frozen classifier checkpoint and an optional denoiser checkpoint in front."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.checkpoint import load_checkpoint
from transdenoiser.errors import UserError


@dataclass
class Pipeline:
    classifier: nn.Module
    classifier_metadata: dict[str, Any]
    denoiser: nn.Module | None
    denoiser_metadata: dict[str, Any] | None
    device: torch.device

    @property
    def num_classes(self) -> int:
        return int(self.classifier_metadata["num_classes"])

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.classifier_metadata["input_shape"])  # type: ignore[return-value]

    @property
    def class_names(self) -> list[str]:
        return list(self.classifier_metadata.get("class_names") or map(str, range(self.num_classes)))



def load_pipeline(classifier_dir: str | Path, denoiser_dir: str | Path | None = None,
                  device: torch.device | str = "cpu") -> Pipeline:
    """Load both checkpoints (hash-checked, never unpickled) and check that they fit together."""
    device = torch.device(device)
    clf = load_checkpoint(classifier_dir, kind="classifier", map_location=device)
    for p in clf.model.parameters():
        p.requires_grad_(False)
    den = None
    if denoiser_dir is not None:
        den = load_checkpoint(denoiser_dir, kind="denoiser", map_location=device)
        for p in den.model.parameters():
            p.requires_grad_(False)
        d_shape = den.metadata.get("input_shape")
        c_shape = clf.metadata.get("input_shape")
        if d_shape != c_shape:
            raise UserError(f"denoiser {denoiser_dir} takes images of shape {d_shape}, classifier {classifier_dir} "
                            f"takes {c_shape}: they do not fit together")
        d_classes = den.metadata.get("classifier", {}).get("num_classes")
        if d_classes is not None and d_classes != clf.metadata.get("num_classes"):
            raise UserError(f"denoiser {denoiser_dir} was trained for a {d_classes}-class classifier, "
                            f"{classifier_dir} has {clf.metadata.get('num_classes')} classes")
    return Pipeline(clf.model, clf.metadata, den.model if den else None, den.metadata if den else None, device)


def check_dataset_fits(pipeline: Pipeline, image_shape: tuple[int, ...], num_classes: int, what: str) -> None:
    """Refuse data whose image shape or class count differs from the classifier's."""
    if tuple(image_shape) != pipeline.input_shape:
        raise UserError(f"{what} has images of shape {tuple(image_shape)}, the classifier takes {pipeline.input_shape}")
    if num_classes != pipeline.num_classes:
        raise UserError(f"{what} has {num_classes} classes, the classifier has {pipeline.num_classes}")
