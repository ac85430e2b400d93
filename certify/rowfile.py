"""A run's rows file, whatever its rows are: one row per line, appended and flushed as each row is done.

A :class:`RowSchema` says what a row is: its header line (TSV files) or none (JSON lines), how a line is parsed and
written, and the image index that keys it. ``certify``/``predict`` rows (Cohen's TSV columns,
:mod:`certify.rundir`) and ``baseline-certify`` rows (one JSON object per line, :mod:`certify.baseline_rows`) are
two schemas of this one file handling:

- :class:`RowWriter` writes the header of a new file, flushes every row as it comes and fsyncs the file when
  closed, so an interrupted run keeps the rows it finished;
- :func:`read_row_file` reads the rows back; a last line cut short by the interruption (no newline) is dropped,
  and cut off the file when ``repair``, so that the next row starts on a line of its own; any other line that is
  not a row of the schema is refused with one line naming the file and the line (a corrupted file is never
  silently half-read).

No torch here: the command line imports the schemas to describe its files.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transdenoiser.errors import UserError


@dataclass(frozen=True)
class RowSchema:
    """What the rows of one kind of run are.

    ``name``: the rows' task in messages (``certify``, ``baseline-certify``). ``header``: the first line a new file
    gets (None: the file has no header line); ``other_headers``: further first lines a file of this schema may
    have been written with (an adaptive certify run's extra column). ``parse(line, header)``: one line (without its
    newline) to a record, ValueError when it is not one; ``header`` is the header line the file has (None without
    one). ``format(record)``: the record as one line, no newline. ``key(record)``: its image index.
    """

    name: str
    header: str | None
    parse: Callable[[str, str | None], Any]
    format: Callable[[Any], str]
    key: Callable[[Any], int]
    other_headers: tuple[str, ...] = ()


def read_row_file(path: Path, schema: RowSchema, repair: bool = False) -> list[Any]:
    """The rows of ``path`` in file order ([] when there is no such file). A last line cut short by an interrupted
    run is dropped (and cut off the file when ``repair``); a line that is not a row is refused (UserError)."""
    if not path.exists():
        return []
    text = path.read_text()
    if not text.endswith("\n"):
        cut = text.rfind("\n") + 1  # 0 when even the first line is incomplete
        text = text[:cut]
        if repair:
            with path.open("r+") as handle:
                handle.truncate(len(text.encode()))
    lines = text.splitlines()
    if not lines:
        return []
    header = None
    first = 1
    if schema.header is not None:
        header, first = lines[0], 2
        if header not in (schema.header, *schema.other_headers):
            raise UserError(f"{path}: header is {header!r}, expected the columns {schema.header!r} "
                            f"(not a {schema.name} run file)")
        lines = lines[1:]
    records = []
    for number, line in enumerate(lines, start=first):
        try:
            records.append(schema.parse(line, header))
        except ValueError as exc:
            raise UserError(f"{path}, line {number}: not a valid {schema.name} row ({exc})") from None
    return records


class RowWriter:
    """Appends rows to a rows file, writing the schema's header first in a new (or empty) file; every row is
    flushed as it comes, and the file is fsynced by :meth:`close`. ``header`` overrides the schema's."""

    def __init__(self, path: Path, schema: RowSchema, header: str | None = None):
        self.path, self.schema = path, schema
        new = not path.exists() or path.stat().st_size == 0
        self.handle = path.open("a")
        header = header if header is not None else schema.header
        if new and header is not None:
            self.handle.write(header + "\n")
            self.handle.flush()

    def write(self, record: Any) -> None:
        self.handle.write(self.schema.format(record) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


def json_row_schema(name: str, key: str = "idx") -> RowSchema:
    """Rows that are JSON objects, one per line, keyed by the integer ``key``; no header line."""

    def parse(line: str, header: str | None) -> dict[str, Any]:
        row = json.loads(line)  # json.JSONDecodeError is a ValueError
        if not isinstance(row, dict) or not isinstance(row.get(key), int):
            raise ValueError(f"not a JSON object with an integer {key!r}")
        return row

    return RowSchema(name=name, header=None, parse=parse, format=json.dumps, key=lambda row: row[key])


__all__ = ["RowSchema", "RowWriter", "json_row_schema", "read_row_file"]
