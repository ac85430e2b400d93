"""A resumable run whose rows are not Cohen's columns (``baseline-certify``): its settings file and its rows as
JSON lines, beside :class:`certify.rundir.RunDirectory` (certify's and predict's TSV rows, shards and statuses).

What both kinds of run directory promise: one writer at a time (:class:`transdenoiser.lock.RunLock`, taken by the
command); a second invocation with other settings is refused with one line naming them; every row is flushed as it
is done and the file fsynced when the run stops, so an interrupted run resumes with the rows it recorded; a last
row cut short by the interruption is dropped (and cut off the file), its image certified again.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from training.checkpoint import write_json, write_text  # the settings file as baseline-certify always wrote it
from transdenoiser.errors import UserError


class RowJournal:
    """``root/settings_name`` (the run's settings, compared as a whole) and ``root/rows_name`` (one JSON object per
    line, keyed by ``key``, e.g. the image index)."""

    def __init__(self, root: Path, settings_name: str, rows_name: str, key: str = "idx", what: str = "run"):
        self.root, self.key, self.what = Path(root), key, what
        self.settings_path, self.rows_path = self.root / settings_name, self.root / rows_name

    def open(self, settings: dict[str, Any], keys: list[Any]) -> dict[Any, dict[str, Any]]:
        """Start the run, or resume the one recorded with the same ``settings``: the rows it recorded whose key is
        in ``keys``, in file order (a row not whole, or not of this run, ends the recorded ones). Rows without a
        settings file are of unknown origin and are discarded; a run with other settings is refused."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.settings_path.exists():
            self.rows_path.unlink(missing_ok=True)
            write_json(self.settings_path, settings)
            return {}
        try:
            recorded = json.loads(self.settings_path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{self.settings_path} is unreadable ({exc}); give another --out") from exc
        if recorded != settings:
            changed = sorted(k for k in settings.keys() | recorded.keys() if recorded.get(k) != settings.get(k))
            raise UserError(f"{self.root} holds a {self.what} run with other settings ({', '.join(changed)}); give "
                            "another --out, or the same settings to resume it")
        wanted = set(keys)
        rows: dict[Any, dict[str, Any]] = {}
        lines = self.rows_path.read_text().splitlines(keepends=True) if self.rows_path.exists() else []
        for line in lines:
            try:
                row = json.loads(line) if line.endswith("\n") else None
            except ValueError:
                row = None
            if not isinstance(row, dict) or row.get(self.key) not in wanted:
                break  # cut short (or not ours): this row and any after it are done again
            rows[row[self.key]] = row
        if len(rows) != len(lines):  # keep only the whole rows, so that new ones start on a line of their own
            write_text(self.rows_path, "".join(json.dumps(row) + "\n" for row in rows.values()))
        return rows

    @contextmanager
    def appending(self) -> Iterator[_Appender]:
        """Append rows, each flushed as it comes; the file is fsynced when the block ends (normally or not)."""
        handle = self.rows_path.open("a")
        try:
            yield _Appender(handle)
        finally:
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()


class _Appender:
    def __init__(self, handle: TextIO):
        self.handle = handle

    def write(self, row: dict[str, Any]) -> None:
        self.handle.write(json.dumps(row) + "\n")
        self.handle.flush()


__all__ = ["RowJournal"]
