"""``baseline-certify``'s files and numbers: its row schema in the shared run directory, its table and summary.

A row holds, for one image, the baseline's own certificate (the ``phan_*`` columns; StoBatch adds its own) beside
randomized smoothing of the same randomised model (the ``smooth_*`` columns). The rows go through the same run
directory as ``certify``'s (:class:`certify.rundir.RunDirectory` with :func:`certify.baseline_job.baseline_layout`):
settings file, crash-safe rows, status file and lock; only the rows' format (a JSON object per line, nullable
columns) and the files' names are the baseline's.

Files (``--out DIR``): ``baseline_certify.settings.json`` (the run's settings), ``baseline_certify.rows.jsonl`` (one
JSON row per image, flushed as done), ``baseline_certify.status.json`` (each session's hardware and wall time),
and once every image is done ``baseline_certify.tsv`` (the rows in work-list order), ``summary.json``
(:class:`transdenoiser.records.BaselineCertificationSummary`) and ``report.md`` (:mod:`certify.baseline_report`).

No torch here: the command line reads the column names to describe its files.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from certify.rowfile import json_row_schema

TASK = "baseline-certify"
KINDS = ("securesgd-prt", "securesgd-sct", "stobatch")  # the checkpoints baseline-certify takes (their "arm")
COLUMNS = ("idx", "label", "phan_predict", "phan_radius", "phan_correct", "phan_p_lower", "phan_p_upper",
           "phan_epsilon", "phan_delta", "smooth_predict", "smooth_radius", "smooth_correct", "smooth_p_lower",
           "smooth_count")
# after COLUMNS in a stobatch run: the own certificate's vote count and its L1 and L-infinity radii, and the paper's
# kappa + phi bound (NOT a certificate; docs/BASELINES.md)
STOBATCH_COLUMNS = ("stobatch_count", "stobatch_radius_l1", "stobatch_radius_linf", "stobatch_paper_bound_l1")
RADII = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
STEM = "baseline_certify"
SETTINGS_FILE = f"{STEM}.settings.json"
ROWS_FILE = f"{STEM}.rows.jsonl"
STATUS_FILE = f"{STEM}.status.json"
TABLE_FILE = f"{STEM}.tsv"
SUMMARY_FILE = "summary.json"
# one JSON object per line: the columns above (None where a certificate has no value), plus "seconds"
ROW_SCHEMA = json_row_schema(TASK, key="idx")


def format_value(value: Any) -> str:
    """A table cell: empty for None, 6 significant digits for floats."""
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def table_text(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """``baseline_certify.tsv``: the header, then one line per row."""
    lines = ["\t".join(columns)] + ["\t".join(format_value(r[c]) for c in columns) for r in rows]
    return "\n".join(lines) + "\n"


def certified_accuracy_by_radius(rows: Sequence[dict[str, Any]], prefix: str) -> dict[str, float]:
    """:func:`certify.summary.certified_accuracy` of the ``prefix`` certificates of ``rows`` at each radius of
    ``RADII`` (L2, pixels in [0, 1]), keyed by the radius as text."""
    from certify.summary import certified_accuracy

    certificates = [{"radius": r[f"{prefix}_radius"], "correct": r[f"{prefix}_correct"]} for r in rows]
    return {f"{radius:g}": certified_accuracy(certificates, radius) for radius in RADII}


def _mean(values: list) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: list[float]) -> float | None:
    import numpy as np

    return float(np.median(values)) if values else None


def certificate_summary(rows: Sequence[dict[str, Any]], prefix: str, note: str) -> dict[str, Any]:
    """One certificate's part of summary.json: certified accuracy by radius, abstentions, median radius."""
    part: dict[str, Any] = {"certified_accuracy": certified_accuracy_by_radius(rows, prefix)}
    if prefix == "phan":
        part["accuracy"] = _mean([r["phan_correct"] for r in rows])
    part.update({"abstain_rate": _mean([r[f"{prefix}_predict"] == -1 for r in rows]),
                 "median_radius": _median([r[f"{prefix}_radius"] for r in rows]), "note": note})
    return part


def format_table(summary: dict[str, Any]) -> list[str]:
    """The lines the command prints: certified accuracy of both certificates at each radius of ``RADII``."""
    lines = [f"{summary['num_images']} images of {summary['dataset']}'s {summary['split']} split ({summary['arm']}); "
             "certified accuracy by L2 radius:",
             f"  radius  {'own' if summary['arm'] == 'stobatch' else 'phan':<7}  smoothing"]
    for radius in RADII:
        key = f"{radius:g}"
        lines.append(f"  {radius:>5g}  {100 * summary['phan']['certified_accuracy'][key]:6.1f}%  "
                     f"{100 * summary['smoothing']['certified_accuracy'][key]:6.1f}%")
    return lines


__all__ = ["COLUMNS", "KINDS", "RADII", "ROWS_FILE", "ROW_SCHEMA", "SETTINGS_FILE", "STATUS_FILE", "STOBATCH_COLUMNS",
           "SUMMARY_FILE", "TABLE_FILE", "certificate_summary", "certified_accuracy_by_radius", "format_table",
           "table_text"]
