"""TOML reading on every supported Python: the standard library's tomllib (3.11+) or tomli (3.10)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from transdenoiser.errors import UserError

__all__ = ["tomllib", "read_toml", "dataclass_from_dict"]


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The table in the TOML file ``path``; a missing or invalid file is a UserError naming ``what``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path}: no such file")
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} {path}: not valid TOML ({exc})") from None


def dataclass_from_dict(cls, values: dict[str, Any], source: str, kind: str = ""):
    """``cls(**values)`` for a settings dataclass; a key it does not have is a UserError naming ``source`` and
    listing the known ones (``kind``, e.g. "SecureSGD ", qualifies the word "setting")."""
    from dataclasses import fields

    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"{source}: unknown {kind}setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**values)
