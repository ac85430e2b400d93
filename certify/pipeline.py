"""Load the defended pipeline: a frozen classifier checkpoint and an optional denoiser checkpoint in front."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.checkpoint import load_checkpoint
from transdenoiser.errors import UserError
from transdenoiser.records import CheckpointMetadata


@dataclass
class Pipeline:
    classifier: nn.Module
    classifier_metadata: dict[str, Any]
    denoiser: nn.Module | None
    denoiser_metadata: dict[str, Any] | None
    device: torch.device
    classifier_record: CheckpointMetadata = field(init=False, repr=False)
    denoiser_record: CheckpointMetadata | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.classifier_record = CheckpointMetadata.from_json(self.classifier_metadata, "the classifier's metadata")
        for key in ("num_classes", "input_shape"):
            if getattr(self.classifier_record, key) is None:
                raise UserError(f"the classifier's metadata records no {key!r}")
        self.denoiser_record = (None if self.denoiser_metadata is None else
                                CheckpointMetadata.from_json(self.denoiser_metadata, "the denoiser's metadata"))

    @property
    def num_classes(self) -> int:
        return int(self.classifier_record.num_classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.classifier_record.input_shape)  # type: ignore[return-value]

    @property
    def class_names(self) -> list[str]:
        return list(self.classifier_record.class_names or map(str, range(self.num_classes)))



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
        d_record, c_record = den.record, clf.record
        d_shape, c_shape = d_record.input_shape, c_record.input_shape
        if d_shape != c_shape:
            raise UserError(f"denoiser {denoiser_dir} takes images of shape {_shape(d_shape)}, classifier "
                            f"{classifier_dir} takes {_shape(c_shape)}: they do not fit together")
        d_classes = d_record.classifier_classes
        if d_classes is not None and d_classes != c_record.num_classes:
            raise UserError(f"denoiser {denoiser_dir} was trained for a {d_classes}-class classifier, "
                            f"{classifier_dir} has {c_record.num_classes} classes")
    return Pipeline(clf.model, clf.metadata, den.model if den else None, den.metadata if den else None, device)


def _shape(shape: tuple[int, ...] | None) -> list[int] | None:
    """A recorded shape as the metadata wrote it (a list), for messages."""
    return None if shape is None else list(shape)


def check_dataset_fits(pipeline: Pipeline, image_shape: tuple[int, ...], num_classes: int, what: str) -> None:
    """Refuse data whose image shape or class count differs from the classifier's."""
    if tuple(image_shape) != pipeline.input_shape:
        raise UserError(f"{what} has images of shape {tuple(image_shape)}, the classifier takes {pipeline.input_shape}")
    if num_classes != pipeline.num_classes:
        raise UserError(f"{what} has {num_classes} classes, the classifier has {pipeline.num_classes}")
