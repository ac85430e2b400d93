"""Figures of certification runs (certified_accuracy.png) and the labels that name runs in them.

Drawn by matplotlib (Agg backend: no display needed), imported only when a figure is drawn.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from certify.rundir import CertifyRecord
from certify.summary import RADIUS_STEP
from training.checkpoint import write_bytes
from transdenoiser.errors import UserError
from transdenoiser.pngs import figure_png
from transdenoiser.records import Guarantee, PrivacyReport, recorded_arm, recorded_objective

CURVE_POINTS = 400


# ----------------------------------------------------------------------------------------------- labels

def denoiser_arm(denoiser_metadata: dict[str, Any] | None) -> str | None:
    """The training arm of a denoiser (nodp, sepdp, transdenoiser, ...) from its metadata, if it says
    (:func:`transdenoiser.records.recorded_arm`: the one place that knows where each writer records it)."""
    return recorded_arm(denoiser_metadata)


def run_label(summary: dict[str, Any]) -> str:
    """``transdenoiser, sigma 0.25`` / ``sepdp, objective stability+mse, sigma 0.5`` / ``no denoiser, sigma 0.25``:
    the objective is named when it is not MSE; tolerant of missing keys."""
    settings = summary.get("settings") or {}
    sigma = settings.get("sigma", summary.get("sigma"))
    sigma_text = f"sigma {sigma:g}" if isinstance(sigma, (int, float)) else "sigma ?"
    if summary.get("denoiser_metadata") is None and not settings.get("denoiser"):
        return f"no denoiser, {sigma_text}"
    arm = denoiser_arm(summary.get("denoiser_metadata"))
    objective = recorded_objective(summary.get("denoiser_metadata"))
    objective_text = f"objective {objective}, " if objective not in (None, "mse") else ""
    return f"{arm or 'denoiser'}, {objective_text}{sigma_text}"


def epsilon_text(denoiser_metadata: dict[str, Any] | None) -> str | None:
    """The denoiser's privacy in a few words for a legend, each epsilon with its analysis; None if unknown (no
    report, or one that is not a valid privacy report)."""
    privacy = (denoiser_metadata or {}).get("privacy") if isinstance(denoiser_metadata, dict) else None
    try:
        report = PrivacyReport.from_json(privacy) if isinstance(privacy, dict) else None
    except UserError:
        return None
    if report is None:
        return None
    if report.arm == "nodp":
        return "no DP"
    delta_text = f", delta {report.delta:g}" if report.delta is not None else ""

    def rdp(guarantee: Guarantee) -> str:
        value = guarantee.epsilon.value("rdp") if guarantee.epsilon else None
        return f"{value:.3g}" if value is not None and math.isfinite(value) else "inf"

    proven = report.data_independent()
    if proven:
        return f"eps {rdp(proven[0])} (RDP{delta_text})"
    mmga = report.named("mmga")
    if mmga:
        return f"no data-independent eps; MMGA eps {rdp(mmga)} (data-dependent, unproven{delta_text})"
    return None


def legend_label(summary: dict[str, Any]) -> str:
    """:func:`run_label` plus what tells runs apart in an overlay: privacy, n, dataset."""
    settings = summary.get("settings") or {}
    parts = [run_label(summary)]
    if settings.get("denoiser") or summary.get("denoiser_metadata") is not None:
        parts.append(epsilon_text(summary.get("denoiser_metadata")) or "privacy unknown")
    mode = settings.get("mode") or summary.get("mode")
    if mode == "decide":
        parts.append(f"decide R = {settings.get('radius', summary.get('radius'))}, n_max {settings.get('n')}")
    elif mode == "estimate":
        parts.append(f"estimate, n_max {settings.get('n')}")
    elif settings.get("n") is not None:
        parts.append(f"n {settings['n']}")
    if settings.get("dataset"):
        parts.append(str(settings["dataset"]))
    return ", ".join(parts)


def cap_note(summary: dict[str, Any]) -> tuple[float, str] | None:
    """The largest radius this run could certify (set by n and alpha), and its label on a figure."""
    cap = summary.get("max_certifiable_radius")
    if not isinstance(cap, (int, float)) or summary.get("mode") == "decide":  # decide: R is the question, no cap
        return None
    return float(cap), f"largest certifiable radius {cap:.3f} (n {summary.get('n')}, alpha {summary.get('alpha'):g})"


# ----------------------------------------------------------------------------------------------- figures

def _curve(records: Sequence[CertifyRecord], radii: np.ndarray) -> np.ndarray:
    correct_radii = np.array([r.radius for r in records if r.correct])
    return np.array([(correct_radii >= r).sum() / len(records) for r in radii])


LEGEND_WRAP = 72  # characters per legend line (x-small type on a 6.4-inch-wide figure)
FIGURE_WIDTH = 6.4  # inches
CAP_STYLES = (":", "-.", (0, (6, 3)), (0, (1, 4)))  # one dash pattern per cap, so the legend tells them apart
AXES_HEIGHT = 3.6  # inches: the plot keeps its size; the figure grows below it to hold the legend


def wrap_label(text: str, width: int = LEGEND_WRAP) -> str:
    """``text`` broken into lines of at most ``width`` characters, for a title or legend entry: at the ", " between
    its clauses where they fit (``sigma 0.25`` stays on one line), else at spaces."""
    import textwrap

    lines: list[str] = []
    for clause in text.replace(", ", ",\0").split("\0"):
        if lines and len(lines[-1]) + 1 + len(clause) <= width:
            lines[-1] += " " + clause
        else:
            lines.extend(textwrap.wrap(clause, width=width, break_long_words=True, break_on_hyphens=False))
    return "\n".join(lines) or text


def certified_accuracy_figure(curves: Sequence[tuple[str, Sequence[CertifyRecord]]], title: str = "Certified accuracy",
                              caps: Sequence[tuple[float, str]] = (), points: Sequence[tuple[str, float, float]] = ()):
    """The figure: certified accuracy (y) against L2 radius (x), one line per (label, records); each cap in ``caps``
    (radius, text) is drawn as a dotted vertical line: no radius beyond it can be certified with that run's n and
    alpha, so the curve's drop to 0 there is the sampling budget, not the model. Each of ``points``
    (label, radius, certified accuracy) is one marker: a decide run measures one radius only.

    Every label (curves, points and caps, whose text says what the dotted line is) goes into one legend below the
    axes, wrapped to :data:`LEGEND_WRAP` characters; the figure grows downwards to hold it, so nothing is clipped
    and nothing is written over the curves, whatever the labels' length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    largest = max([r.radius for _, records in curves for r in records] + [cap for cap, _ in caps]
                  + [1.25 * radius for _, radius, _ in points] + [RADIUS_STEP])  # a point is not drawn on the edge
    radii = np.linspace(0.0, largest * 1.08, CURVE_POINTS)
    labels = [wrap_label(label) for label, _ in curves] + [wrap_label(label) for label, _, _ in points] \
        + [wrap_label(text) for text in dict(caps).values()]
    legend_lines = sum(label.count("\n") + 1 for label in labels)
    legend_height = 0.3 + 0.16 * legend_lines + 0.04 * len(labels)  # inches: x-small lines plus entry spacing
    fig = plt.figure(figsize=(FIGURE_WIDTH, AXES_HEIGHT + legend_height), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    for label, records in curves:
        ax.plot(radii, _curve(records, radii), label=wrap_label(label), drawstyle="steps-post")
    for label, radius, accuracy in points:
        ax.plot([radius], [accuracy], marker="o", linestyle="none", label=wrap_label(label))
    for (cap, text), style in zip(dict(caps).items(), itertools.cycle(CAP_STYLES)):  # one line per distinct cap,
        ax.axvline(cap, color="0.35", linestyle=style, linewidth=1.2, label=wrap_label(text))  # named in the legend
    ax.set_xlabel("L2 radius (pixels in [0, 1])")
    ax.set_ylabel("certified accuracy")
    ax.set_ylim(0.0, 1.02)
    ax.set_xlim(0.0, radii[-1])
    ax.grid(alpha=0.3)
    ax.set_title(wrap_label(title, 60))
    if labels:
        fig.legend(loc="outside lower center", fontsize="x-small", ncols=1, frameon=False)
    return fig


def plot_certified_accuracy(curves: Sequence[tuple[str, Sequence[CertifyRecord]]], path: Path,
                            title: str = "Certified accuracy", caps: Sequence[tuple[float, str]] = (),
                            points: Sequence[tuple[str, float, float]] = ()) -> Path:
    """:func:`certified_accuracy_figure`, written to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = certified_accuracy_figure(curves, title, caps, points)
    png = figure_png(fig)
    plt.close(fig)
    write_bytes(path, png)
    return path


def curves_and_points(runs: Sequence[tuple[str, dict[str, Any], Sequence[CertifyRecord]]]):
    """(label, summary, records) per run -> the figure's curves, and one point per decide run (its one radius)."""
    curves, points = [], []
    for label, summary, records in runs:
        if "decide" in summary:
            points.append((label, summary["decide"]["radius"], summary["decide"]["certified_correct"]))
        else:
            curves.append((label, records))
    return curves, points
