"""Checkpoints: a directory with ``weights.safetensors`` and ``metadata.json``.

Nothing is ever unpickled. ``metadata.json`` records the architecture and its arguments,
the dataset with its split fingerprints, the package version, and the SHA-256 of the weights
file, so a truncated or tampered file is refused before it is parsed. Extra tensors (optimiser
state for ``--resume``) go in further safetensors files beside the weights, same rules.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save
from torch import nn

import transdenoiser
from training.models import build_model, count_parameters
from transdenoiser.errors import UserError

FORMAT = "transdenoiser-checkpoint"
FORMAT_VERSION = 1
WEIGHTS = "weights.safetensors"
METADATA = "metadata.json"


@dataclass
class Checkpoint:
    model: nn.Module
    metadata: dict[str, Any]
    path: Path


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """Write tensors atomically as safetensors; return the file's SHA-256 (hashed from memory, not re-read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    _atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def load_tensors(path: Path, expected_sha256: str | None) -> dict[str, torch.Tensor]:
    """Read a safetensors file, refusing it if its SHA-256 differs from the recorded one (one read of the file)."""
    if not path.is_file():
        raise UserError(f"checkpoint file missing: {path}")
    data = path.read_bytes()
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise UserError(f"{path}: SHA-256 does not match the checkpoint metadata (truncated or modified file)")
    try:
        return load(data)
    except (SafetensorError, OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable safetensors file ({exc})") from None


def save_checkpoint(directory: str | Path, model: nn.Module, metadata: dict[str, Any],
                    extra_tensors: dict[str, dict[str, torch.Tensor]] | None = None) -> Path:
    """Save ``model`` with ``metadata`` (must hold ``architecture`` and ``arch_kwargs``) into ``directory``.

    ``extra_tensors`` maps file stems to tensors saved as ``STEM.safetensors`` (their hashes
    go into ``metadata['files']``). Metadata is written last, so a crash mid-save leaves the
    previous checkpoint's metadata pointing at hashes that no longer match: it is refused, not misread.
    """
    for key in ("kind", "architecture", "arch_kwargs"):
        if key not in metadata:
            raise ValueError(f"checkpoint metadata needs {key!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = dict(metadata)
    meta["format"] = FORMAT
    meta["format_version"] = FORMAT_VERSION
    meta["package_version"] = transdenoiser.__version__
    meta["torch_version"] = torch.__version__
    meta["num_parameters"] = count_parameters(model)
    files = {WEIGHTS: save_tensors(directory / WEIGHTS, model.state_dict())}
    for stem, tensors in (extra_tensors or {}).items():
        files[f"{stem}.safetensors"] = save_tensors(directory / f"{stem}.safetensors", tensors)
    meta["files"] = files
    _atomic_write_bytes(directory / METADATA, json.dumps(meta, indent=2, sort_keys=True).encode())
    return directory


def read_metadata(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"checkpoint {directory}: no such directory (a checkpoint is a directory with "
                        f"{WEIGHTS} and {METADATA})")
    path = directory / METADATA
    if not path.is_file():
        raise UserError(f"checkpoint {directory}: {METADATA} is missing")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"checkpoint {directory}: {METADATA} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"checkpoint {directory}: {METADATA} is not a {FORMAT} file")
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(f"checkpoint {directory}: format version {meta.get('format_version')} is not supported "
                        f"(this is {FORMAT_VERSION})")
    return meta


def load_extra_tensors(directory: str | Path, stem: str) -> dict[str, torch.Tensor]:
    meta = read_metadata(directory)
    name = f"{stem}.safetensors"
    if name not in meta.get("files", {}):
        raise UserError(f"checkpoint {directory}: has no {name}")
    return load_tensors(Path(directory) / name, meta["files"][name])


def load_checkpoint(directory: str | Path, kind: str | None = None,
                    map_location: torch.device | str = "cpu") -> Checkpoint:
    """Load a checkpoint, checking its hash, its kind and that the weights fit the architecture."""
    directory = Path(directory)
    meta = read_metadata(directory)
    if kind is not None and meta.get("kind") != kind:
        raise UserError(f"checkpoint {directory} holds a {meta.get('kind')}, expected a {kind}")
    files = meta.get("files", {})
    if WEIGHTS not in files:
        raise UserError(f"checkpoint {directory}: metadata lists no {WEIGHTS}")
    state = load_tensors(directory / WEIGHTS, files[WEIGHTS])
    model = build_model(meta["architecture"], **meta.get("arch_kwargs", {}))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "mismatch"
        raise UserError(f"checkpoint {directory}: weights do not fit architecture {meta['architecture']} "
                        f"({first})") from None
    model.to(map_location).eval()
    return Checkpoint(model=model, metadata=meta, path=directory)
