"""Checks of a command's paths that need no heavy import: run before the command's handler imports torch.

A missing checkpoint, run folder, config or data folder, or an output folder that cannot be written, is one
line and exit status 2 within a fraction of a second, instead of after seconds of importing torch and SciPy
(tests/test_cli_input_errors.py times every command's common input errors). The commands repeat their own,
deeper checks later (hashes, kinds, settings); these only look at the file system.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from transdenoiser.errors import UserError

CHECKPOINT = "a checkpoint is a directory with weights.safetensors and metadata.json"

# argparse dest -> (flag as typed, what it must be): "checkpoint", "dir" (a run or data folder) or "file"
INPUTS: dict[str, tuple[str, str]] = {
    "classifier": ("--classifier", "checkpoint"),
    "denoiser": ("--denoiser", "checkpoint"),
    "model": ("--model", "checkpoint"),
    "init_from": ("--init-from", "checkpoint"),
    "run_dir": ("RUN_DIR", "dir"),
    "run_dirs": ("RUN_DIR", "dir"),
    "data_root": ("--data-root", "dir"),
    "config": ("--config", "file"),
    "weights": ("--weights", "file"),
}
# commands whose arguments of those names are not paths to read: there --denoiser names an architecture
NOT_INPUTS: dict[str, frozenset[str]] = {"train": frozenset({"denoiser"}), "privacy-audit": frozenset({"denoiser"})}


def _check_input(flag: str, kind: str, value: Any) -> None:
    path = Path(value)
    where = f"{flag} {path}" if flag.startswith("-") else str(path)
    if kind == "file":
        if not path.is_file():
            raise UserError(f"{where}: {'a directory, not a file' if path.is_dir() else 'no such file'}")
        return
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        if kind == "checkpoint":
            raise UserError(f"{where}: {what} ({CHECKPOINT})")
        raise UserError(f"{where}: {what}{' (a run folder)' if flag == 'RUN_DIR' else ''}")


def _read_only_filesystem(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_output_folder(out: Path, flag: str = "--out") -> None:
    """Refuse an output folder that cannot be created or written: a file in its place or on its path, a
    read-only file system, no write permission. Nothing is left behind (one empty file is created in the nearest
    existing folder and removed at once)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out}: a file is in the way (the output is a folder)")
    existing = out
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {out}: cannot be created, {existing} is a file")
    if _read_only_filesystem(existing):
        raise UserError(f"{flag} {out}: cannot be written, {existing} is on a read-only file system")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {out}: cannot be written, no write permission in {existing}")
    try:  # what the permission bits do not tell (special file systems, ACLs, root squash): try it
        fd, probe = tempfile.mkstemp(prefix=".transdenoiser-write-check-", dir=existing)
    except OSError as exc:
        raise UserError(f"{flag} {out}: cannot be written in {existing} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def check_paths(command: str, args: Any) -> None:
    """The file-system checks of ``args`` (a parsed command line): inputs exist, the output folder is writable."""
    skip = NOT_INPUTS.get(command, frozenset())
    for dest, (flag, kind) in INPUTS.items():
        value = getattr(args, dest, None)
        if value is None or dest in skip or isinstance(value, bool):
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            _check_input(flag, kind, item)
    out = getattr(args, "out", None)
    if isinstance(out, (str, Path)):
        check_output_folder(Path(out))
