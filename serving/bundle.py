"""Model directories: write one from checkpoints, load one into a servable pipeline."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from certify.pipeline import Pipeline, load_pipeline
from serving.config import CONFIG_NAMES, ServingConfig, load_config, to_toml, validate_config
from training.checkpoint import METADATA, WEIGHTS, write_text
from transdenoiser.errors import UserError


def write_model_dir(out_dir: str | Path, classifier_dir: str | Path, denoiser_dir: str | Path | None = None, *,
                    sigma: float, n0: int = ServingConfig.n0, n: int = ServingConfig.n,
                    max_n: int = ServingConfig.max_n, alpha: float = ServingConfig.alpha,
                    **settings) -> Path:
    """Copy the checkpoints into ``out_dir`` and write ``out_dir/serving.toml``; return ``out_dir``.

    ``settings`` takes any further :class:`ServingConfig` key (``batch_size``, ``max_images``,
    ``allow_client_seed``, ...). Everything is validated before anything is written. An existing
    ``out_dir`` is refused unless it is empty. A denoiser that training measured worse than no denoiser is
    not refused here (``transdenoiser bundle`` refuses it: ``transdenoiser.checks.check_not_worse_than_classifier``,
    which the caller may run first); ``allow_worse_than_classifier=True`` records in serving.toml, and so on the
    model card, that it was bundled knowingly, and ``serve`` warns about such a denoiser whatever the setting.
    """
    out_dir = Path(out_dir)
    raw = {"sigma": sigma, "n0": n0, "n": n, "max_n": max_n, "alpha": alpha, **settings,
           "classifier": "classifier", "denoiser": "denoiser" if denoiser_dir is not None else None}
    config = validate_config(raw, "write_model_dir")
    load_pipeline(classifier_dir, denoiser_dir)  # hash-checked checkpoints of the right kinds that fit together
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UserError(f"{out_dir} already exists and is not an empty directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_servable(classifier_dir, out_dir / config.classifier)
    if denoiser_dir is not None:
        _copy_servable(denoiser_dir, out_dir / config.denoiser)
    write_text(out_dir / CONFIG_NAMES[0], to_toml(config))
    return out_dir


def _copy_servable(checkpoint_dir: str | Path, destination: Path) -> None:
    """The weights and metadata only: a training run's optimiser state and step history are not served.

    Contents only (``shutil.copyfile``): the copies get fresh timestamps and permissions, so the bundle does not
    tell when the training run wrote its files (when training ended)."""
    destination.mkdir(parents=True)
    for name in (WEIGHTS, METADATA):
        shutil.copyfile(Path(checkpoint_dir) / name, destination / name)


@dataclass
class ModelBundle:
    """A loaded model directory: its settings and the (frozen) pipeline."""

    path: Path
    config: ServingConfig
    pipeline: Pipeline


def _inside(model_dir: Path, name: str, key: str) -> Path:
    path = (model_dir / name).resolve()
    if model_dir.resolve() not in path.parents:
        raise UserError(f"model directory {model_dir}: {key} = {name!r} points outside the model directory")
    return path


def load_model_dir(model_dir: str | Path, device: torch.device | str = "cpu") -> ModelBundle:
    """Validate the config and load both checkpoints (hash-checked) onto ``device``."""
    model_dir = Path(model_dir)
    config = load_config(model_dir)
    classifier = _inside(model_dir, config.classifier, "classifier")
    denoiser = _inside(model_dir, config.denoiser, "denoiser") if config.denoiser is not None else None
    pipeline = load_pipeline(classifier, denoiser, device=device)
    return ModelBundle(model_dir, config, pipeline)
