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
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save
from torch import nn

from training.models import build_model, count_parameters
from transdenoiser.errors import CheckpointError, UserError
from transdenoiser.records import CHECKPOINT_FORMAT, CheckpointMetadata
from transdenoiser.version import __version__

FORMAT = CHECKPOINT_FORMAT
FORMAT_VERSION = CheckpointMetadata.FORMAT_VERSION
WEIGHTS = "weights.safetensors"
METADATA = "metadata.json"


SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
SAVING_SUFFIX = ".saving"  # a checkpoint being written: .NAME.saving-PID beside NAME
PREVIOUS_SUFFIX = ".previous"  # the last good checkpoint while a new one replaces it: .NAME.previous


def _after_write(what: str) -> None:
    """Called after every file-system step of a save (tests replace it to simulate a crash there)."""


@dataclass
class Checkpoint:
    model: nn.Module
    metadata: dict[str, Any]
    path: Path

    @property
    def record(self) -> CheckpointMetadata:
        """The metadata as a typed record (refused with a :class:`CheckpointError` if it is malformed)."""
        return CheckpointMetadata.from_json(self.metadata, f"checkpoint {self.path}: {METADATA}")


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` atomically: into a fresh sibling file, flushed and fsynced, then renamed over ``path``.

    The one atomic file writer of the package (checkpoints, run directories, reports). A crash leaves either the
    old file or the new one, never a mix. The file gets the usual permissions (0o666 less the umask).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _after_write(f"write {path.name}")


def write_json(path: Path, value: Any) -> str:
    """Write ``value`` as indented, key-sorted JSON atomically; return the SHA-256 of the bytes written."""
    data = json.dumps(value, indent=2, sort_keys=True).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, text.encode())


def _check_sha256(directory: Path, name: str, value: Any) -> str:
    if not isinstance(value, str) or not SHA256_PATTERN.fullmatch(value):
        raise CheckpointError(f"checkpoint {directory}: {METADATA} gives no valid SHA-256 for {name} (got {value!r}); "
                        "every file of a checkpoint must carry its hash")
    return value


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """Write tensors atomically as safetensors; return the file's SHA-256 (hashed from memory, not re-read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def load_tensors(path: Path, expected_sha256: str) -> dict[str, torch.Tensor]:
    """Read a safetensors file, refusing it if its SHA-256 differs from the recorded one (one read of the file)."""
    _check_sha256(path.parent, path.name, expected_sha256)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file missing: {path}")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != expected_sha256:
        raise CheckpointError(f"{path}: SHA-256 does not match the checkpoint metadata (truncated or modified file)")
    try:
        return load(data)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


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
    meta["package_version"] = __version__
    meta["torch_version"] = torch.__version__
    meta["num_parameters"] = count_parameters(model)
    files = {WEIGHTS: save_tensors(directory / WEIGHTS, model.state_dict())}
    for stem, tensors in (extra_tensors or {}).items():
        files[f"{stem}.safetensors"] = save_tensors(directory / f"{stem}.safetensors", tensors)
    meta["files"] = files
    write_json(directory / METADATA, meta)
    return directory


def replace_directory(directory: str | Path, write: Callable[[Path], None]) -> Path:
    """Write a whole checkpoint directory so that a crash at any point leaves a loadable one.

    ``write(tmp)`` fills a fresh sibling directory; then the previous ``directory`` (if any) is renamed to
    ``.NAME.previous``, the new one renamed into place, and the previous one removed. After a crash,
    :func:`recover_interrupted_save` restores the last complete checkpoint.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    recover_interrupted_save(directory)
    staging = directory.parent / f".{directory.name}{SAVING_SUFFIX}-{os.getpid()}"
    previous = directory.parent / f".{directory.name}{PREVIOUS_SUFFIX}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    write(staging)
    _fsync_directory(staging)
    if directory.exists():
        os.replace(directory, previous)
        _after_write("rename previous")
    os.replace(staging, directory)
    _fsync_directory(directory.parent)
    _after_write("rename new")
    if previous.exists():
        shutil.rmtree(previous)
        _after_write("remove previous")
    return directory


def recover_interrupted_save(directory: str | Path) -> str | None:
    """Finish or undo a save that :func:`replace_directory` did not complete; say what was done (None: nothing).

    A staging directory is never trusted (it may be incomplete): it is removed. If the save stopped between
    its two renames, the previous checkpoint is put back; if it stopped after them, the leftover copy of the
    previous one is removed.
    """
    directory = Path(directory)
    parent = directory.parent
    if not parent.is_dir():
        return None
    done = []
    for staging in parent.glob(f".{directory.name}{SAVING_SUFFIX}-*"):
        shutil.rmtree(staging, ignore_errors=True)
        done.append(f"removed the incomplete save {staging.name}")
    previous = parent / f".{directory.name}{PREVIOUS_SUFFIX}"
    if previous.exists():
        if directory.exists():
            shutil.rmtree(previous)
            done.append("removed the previous checkpoint's leftover copy")
        else:
            os.replace(previous, directory)
            done.append("restored the last complete checkpoint")
    return "; ".join(done) or None


def _fsync_directory(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # not every platform opens directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_metadata(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"checkpoint {directory}: no such directory (a checkpoint is a directory with "
                        f"{WEIGHTS} and {METADATA})")
    path = directory / METADATA
    if not path.is_file():
        raise CheckpointError(f"checkpoint {directory}: {METADATA} is missing")
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint {directory}: {METADATA} is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {directory}: {METADATA} is not a {FORMAT} file")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {directory}: format version {meta.get('format_version')} is not supported "
                        f"(this is {FORMAT_VERSION})")
    for key, kind, what in (("kind", str, "a string"), ("architecture", str, "a string"),
                            ("files", dict, "a table of file hashes")):
        if not isinstance(meta.get(key), kind):
            raise CheckpointError(f"checkpoint {directory}: {METADATA} has no valid {key!r} (must be {what})")
    if not isinstance(meta.get("arch_kwargs", {}), dict):
        raise CheckpointError(f"checkpoint {directory}: {METADATA} has an invalid 'arch_kwargs' (must be a table)")
    return meta


def read_record(directory: str | Path) -> CheckpointMetadata:
    """The checkpoint's ``metadata.json`` as a typed record: :func:`read_metadata`'s checks, then every recorded
    field's type (a malformed dataset reference or privacy report is refused with a one-line
    :class:`CheckpointError`)."""
    return CheckpointMetadata.from_json(read_metadata(directory), f"checkpoint {directory}: {METADATA}")


def load_extra_tensors(directory: str | Path, stem: str) -> dict[str, torch.Tensor]:
    meta = read_metadata(directory)
    name = f"{stem}.safetensors"
    if name not in meta.get("files", {}):
        raise CheckpointError(f"checkpoint {directory}: has no {name}")
    return load_tensors(Path(directory) / name, meta["files"][name])


def load_checkpoint(directory: str | Path, kind: str | None = None,
                    map_location: torch.device | str = "cpu") -> Checkpoint:
    """Load a checkpoint, checking its hash, its kind and that the weights fit the architecture."""
    directory = Path(directory)
    meta = read_metadata(directory)
    record = CheckpointMetadata.from_json(meta, f"checkpoint {directory}: {METADATA}")
    if kind is not None and record.kind != kind:
        raise UserError(f"checkpoint {directory} holds a {record.kind}, expected a {kind}")
    files = meta["files"]
    if WEIGHTS not in files:
        raise CheckpointError(f"checkpoint {directory}: metadata lists no {WEIGHTS}")
    for name, value in files.items():
        _check_sha256(directory, name, value)
    state = load_tensors(directory / WEIGHTS, files[WEIGHTS])
    try:
        model = build_model(meta["architecture"], **meta.get("arch_kwargs", {}))
    except UserError as exc:
        raise CheckpointError(f"checkpoint {directory}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {directory}: architecture {meta['architecture']!r} does not take arguments "
                        f"{meta.get('arch_kwargs')} ({exc})") from None
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "mismatch"
        raise CheckpointError(f"checkpoint {directory}: weights do not fit architecture {meta['architecture']} "
                        f"({first})") from None
    model.to(map_location).eval()
    return Checkpoint(model=model, metadata=meta, path=directory)
