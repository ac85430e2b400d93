"""The resumable state of a training run: optimiser state, the generator, the per-step history, and the
checkpoint written after every epoch.

:func:`save_epoch_checkpoint` writes the released files and the private training record in one crash-safe
rename; :func:`resume_training_state` refuses a resume whose configuration, data, classifier or world size
differs, then restores weights, optimiser and generator so the run continues bit-for-bit and the per-step privacy
history is neither lost nor counted twice.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.checkpoint import (
    load_checkpoint,
    load_tensors,
    read_metadata,
    replace_directory,
    save_checkpoint,
    save_tensors,
    write_json,
    write_text,
)
from training.privacy.report import format_privacy_report
from training.privacy.smin import METHODS
from training.release import PRIVATE_DIR, RECORD_FILE, REPORT_FILE, load_private_record
from training.train_config import HISTORY_FIELDS, StepRecord, TrainConfig
from transdenoiser.errors import UserError

STATE_FILE = "training_state"


def build_optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """``config.optimizer`` (SGD with momentum, or Adam) over the model's trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.learning_rate, momentum=config.momentum)
    return torch.optim.Adam(params, lr=config.learning_rate)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list]:
    state = optimizer.state_dict()
    tensors, layout = {}, []
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value
                layout.append([index, key, "tensor"])
            else:
                layout.append([index, key, value])
    return tensors, layout


def _restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], layout: list,
                       param_groups: list, device: torch.device) -> None:
    state: dict[int, dict[str, Any]] = {}
    for index, key, value in layout:
        state.setdefault(int(index), {})[key] = tensors[f"optimizer.{index}.{key}"] if value == "tensor" else value
    for entries in state.values():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor) and key != "step":
                entries[key] = value.to(device)
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})


def _history_tensors(records: list[StepRecord]) -> dict[str, torch.Tensor]:
    out = {}
    for name in HISTORY_FIELDS:
        if name == "smin_method":
            values = [METHODS.index(r.smin_method) if r.smin_method else -1 for r in records]
            out[f"history.{name}"] = torch.tensor(values, dtype=torch.int64)
        else:
            dtype = torch.int64 if name in ("batch_size", "num_nonnegative") else torch.float64
            out[f"history.{name}"] = torch.tensor([getattr(r, name) for r in records], dtype=dtype)
    return out


def _records_from_tensors(tensors: dict[str, torch.Tensor]) -> list[StepRecord]:
    columns = {name: tensors[f"history.{name}"].tolist() for name in HISTORY_FIELDS}
    records = []
    for i in range(len(columns["batch_size"])):
        values = {name: columns[name][i] for name in HISTORY_FIELDS}
        values["smin_method"] = METHODS[values["smin_method"]] if values["smin_method"] >= 0 else ""
        records.append(StepRecord(**values))
    return records


def save_epoch_checkpoint(directory: Path, model, optimizer, generator, records, metadata, record,
                          extra_state=None) -> None:
    """One epoch's checkpoint, written to a staging directory and renamed into place (crash-safe). ``model``: the
    released weights (the parameter average with ``ema_decay``; ``extra_state`` then holds the live weights)."""
    opt_tensors, layout = _optimizer_tensors(optimizer)
    state = {"rng.cpu": generator.get_state(), **opt_tensors, **_history_tensors(records), **(extra_state or {})}

    def write(staging: Path) -> None:
        save_checkpoint(staging, model, metadata)
        write_text(staging / REPORT_FILE, format_privacy_report(metadata["privacy"]) + "\n")
        sha = save_tensors(staging / PRIVATE_DIR / f"{STATE_FILE}.safetensors", state)
        write_json(staging / PRIVATE_DIR / RECORD_FILE, {
            **record, "resume_state": {"optimizer_layout": layout,
                                       "optimizer_param_groups": optimizer.state_dict()["param_groups"]},
            "files": {f"{STATE_FILE}.safetensors": sha}})

    replace_directory(directory, write)


def resume_training_state(directory: Path, config, dataset, classifier, model, optimizer, generator, device,
                          world_size: int = 1, average=None) -> tuple[int, list[StepRecord], list[dict], float]:
    """Continue the run saved in ``directory``: refuse it unless its configuration, data, classifier and world size
    are this run's, then restore the weights, the optimiser, the generator (and the live weights under the
    parameter average) in place. Returns (epochs done, per-step records, per-epoch metrics, seconds trained)."""
    meta = read_metadata(directory)
    if meta.get("kind") != "denoiser":
        raise UserError(f"{directory} holds a {meta.get('kind')}, not a denoiser training run")
    record = load_private_record(directory)
    saved_world = int(record.get("world_size", 1))
    if saved_world != world_size:
        raise UserError(f"--resume: the run in {directory} was trained by {saved_world} process(es), this resume "
                        f"has {world_size}; resume it with the same world size (torchrun's --nnodes x "
                        f"--nproc_per_node = {saved_world}{', or without torchrun' if saved_world == 1 else ''})")
    stored = TrainConfig.from_dict(meta["config"], source=f"{directory}/metadata.json")
    if asdict(stored) != asdict(config):
        diff = [f"{k}: saved {v!r}, now {asdict(config)[k]!r}" for k, v in asdict(stored).items()
                if asdict(config)[k] != v]
        raise UserError(f"--resume needs the saved configuration unchanged; differs in {'; '.join(diff)}")
    if record.get("dataset_fingerprints") != dataset.fingerprints():
        raise UserError(f"--resume: the data differs from the run saved in {directory} (split fingerprints)")
    saved_sha = meta["classifier"].get("weights_sha256")
    if saved_sha != classifier.weights_sha256:
        raise UserError(f"--resume: classifier {classifier.path} is not the one the saved run used "
                        f"({meta['classifier'].get('path')})")
    saved = load_checkpoint(directory, kind="denoiser", map_location=device)
    model.load_state_dict(saved.model.state_dict())
    name = f"{STATE_FILE}.safetensors"
    tensors = load_tensors(directory / PRIVATE_DIR / name, (record.get("files") or {}).get(name))
    resume_state = record["resume_state"]
    _restore_optimizer(optimizer, tensors, resume_state["optimizer_layout"],
                       resume_state["optimizer_param_groups"], device)
    generator.set_state(tensors["rng.cpu"])
    if average is not None:  # the saved weights are the average; the live ones are in the private state
        average.restore(model, {k: v.to(device) for k, v in tensors.items()})
    records = _records_from_tensors(tensors)
    test_metrics = {row["epoch"]: row for row in meta["metrics"]}
    metrics = [{**test_metrics[row["epoch"]], **row} for row in record["epochs"]]
    return int(meta["epochs_done"]), records, metrics, float(record.get("seconds", 0.0))
