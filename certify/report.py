"""Summaries, tables and figures of certification runs: summary.json, report.md, certified_accuracy.png.

Definitions (Cohen et al., 2019; the TransDenoiser paper's CertAcc):
- certified accuracy at radius r: the share of images whose certified prediction is correct with a
  certified L2 radius >= r (abstentions count as wrong); at r = 0 it is the smoothed clean accuracy;
- average certified radius (ACR): the mean over all images of the radius when the prediction is
  correct and 0 otherwise (abstentions and wrong predictions count 0);
- each certificate holds with probability >= 1 - alpha over the Monte Carlo sampling.
Figures are drawn by matplotlib (Agg backend: no display needed).
"""
from __future__ import annotations

import io
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from certify.core import ABSTAIN, max_certifiable_radius
from certify.runner import (
    HEARTBEAT_SECONDS,
    MODELS_FILE,
    SETTINGS_FILE,
    CertifyRecord,
    PredictRecord,
    Record,
    collect_rows,
    missing_report,
    ordered,
    read_json,
    read_rows,
    write_json,
    write_rows,
    write_text,
)
from training.checkpoint import write_bytes
from transdenoiser.errors import UserError

RADIUS_STEP = 0.25  # table radii: 0, 0.25, 0.5, ... (L2, [0,1]-pixel units)
CURVE_POINTS = 400
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOT_FILE = "certified_accuracy.png"
ACR_DEFINITION = ("mean over all images of the certified radius when the prediction is correct, 0 otherwise "
                  "(abstentions and wrong predictions count 0)")
GUARANTEE = ("each certificate is a statement about the smoothed classifier g(x) = argmax_c P[f(D(x+e)) = c], "
             "e ~ N(0, sigma^2 I), that holds with probability >= 1 - alpha over the Monte Carlo sampling")
DECIDE_NOT_CERTIFIED = ("; a 'not certified at the radius' answer says that the class chosen by the n0 selection "
                        "samples has pA < Phi(R / sigma), wrong with probability <= alpha; it says nothing of other "
                        "classes (when the selection chose another class than g's, g may be certified at R)")


# ----------------------------------------------------------------------------------------------- numbers

def radius_grid(largest: float, step: float = RADIUS_STEP) -> list[float]:
    """0, step, 2 step, ... up to ``largest`` (inclusive, with a little tolerance)."""
    return [round(k * step, 10) for k in range(int(math.floor(largest / step + 1e-9)) + 1)]


def certified_accuracy(records: Sequence[CertifyRecord] | Sequence[Mapping[str, Any]], radius: float) -> float:
    """Certified accuracy at ``radius``: the fraction (in [0, 1]) of ``records`` whose prediction is correct with a
    certified L2 radius >= ``radius`` (radii in the pixel units of images in [0, 1]). An abstention is never
    correct, so it counts as wrong. NaN when there are no records.

    ``records``: :class:`CertifyRecord` rows, or mappings with ``"radius"`` and ``"correct"`` (rows read back from
    a file). The package's one definition of certified accuracy; the baselines' tables and the reproduction
    script's figures call it.
    """
    if not records:
        return float("nan")
    return sum(1 for r in records if (r["correct"] and r["radius"] >= radius if isinstance(r, Mapping)
                                      else r.correct and r.radius >= radius)) / len(records)


def _timing(records: Sequence[Record], samples_per_image: int) -> dict[str, float | None]:
    """Speed of the rows; adaptive rows count the samples each image used, others ``samples_per_image`` each."""
    seconds = sum(r.seconds for r in records)
    samples = sum(samples_per_image if getattr(r, "samples", None) is None else r.samples for r in records)
    return {"seconds_per_image": seconds / len(records) if records else None,
            "noisy_samples_per_second": samples / seconds if seconds > 0 else None}


def adaptive_summary(records: Sequence[CertifyRecord], sigma: float, n0: int, n_max: int, alpha: float,
                     adaptive: dict[str, Any]) -> dict[str, Any]:
    """What an adaptive run adds to the summary: samples per image and the saving against fixed n = ``n_max``."""
    from certify.core import sequential_rule
    from certify.sequential import radius_of

    samples = np.array([r.samples for r in records], dtype=float)
    fixed = n0 + n_max
    mode = adaptive["mode"]
    rule = sequential_rule(mode, sigma, n_max, alpha, radius=adaptive.get("radius"),
                           tolerance=adaptive.get("tolerance"), method=adaptive.get("sequential_method"))
    if mode == "decide":
        largest_possible = float(adaptive["radius"])
        note = "decide mode certifies at the one radius asked, or not at all"
    else:
        largest_possible = float(radius_of(rule.cs.lower(np.array([n_max]), len(rule.looks) - 1), sigma)[0])
        note = (f"sigma * Phi^-1(lower bound of {n_max}/{n_max}) at the last look: no certificate with this budget "
                "and alpha can exceed it")
    return {"mode": mode, "radius": adaptive.get("radius"), "tolerance": adaptive.get("tolerance"),
            "sequential": rule.cs.describe(),
            "samples_per_image": {"mean": float(samples.mean()), "median": float(np.median(samples)),
                                  "max": int(samples.max()), "note": "noisy samples per image, n0 included"},
            "fixed_n_samples_per_image": fixed,
            "saving_vs_fixed_n": fixed / float(samples.mean()),
            "saving_note": f"(n0 + n_max) = {fixed} samples per image of Cohen's CERTIFY at n = n_max, over the mean "
                           "samples per image of this run",
            "max_certifiable_radius": largest_possible, "max_certifiable_radius_note": note}


def _outcome_rates(records: Sequence[Record]) -> dict[str, float]:
    """Shares of abstentions and of wrong (non-abstaining) predictions."""
    count = len(records)
    return {"abstention_rate": sum(r.prediction == ABSTAIN for r in records) / count,
            "wrong_rate": sum(not r.correct and r.prediction != ABSTAIN for r in records) / count}


def summarize(records: Sequence[CertifyRecord], sigma: float, n0: int, n: int, alpha: float,
              radius_step: float = RADIUS_STEP, adaptive: dict[str, Any] | None = None) -> dict[str, Any]:
    """Results of a certification: accuracies, abstention, certified accuracy per radius, ACR, timing.

    ``adaptive``: the run's ``mode`` (decide / estimate), ``radius``, ``tolerance`` and ``sequential_method``
    for an adaptive run (then ``n`` is the budget n_max); adds samples per image and the saving."""
    if not records:
        raise UserError("no certified images to summarize")
    count = len(records)
    extra = adaptive_summary(records, sigma, n0, n, alpha, adaptive) if adaptive else {}
    largest_possible = extra.get("max_certifiable_radius", max_certifiable_radius(sigma, n, alpha))
    largest = max(r.radius for r in records)
    decide = extra.get("mode") == "decide"
    # decide mode answers one question per image (certified at R or not): only the row at R is measured
    grid = [largest_possible] if decide else radius_grid(largest_possible, radius_step)
    table = [{"radius": r, "certified_accuracy": certified_accuracy(records, r)} for r in grid]
    rates = _outcome_rates(records)
    summary = {
        "task": "certify",
        "images": count,
        "smoothed_clean_accuracy": None if decide else sum(r.correct for r in records) / count,
        **rates,
        "certified_accuracy": table,
        "average_certified_radius": None if decide else sum(r.radius for r in records if r.correct) / count,
        "average_certified_radius_definition": ACR_DEFINITION,
        "largest_certified_radius": largest,
        "max_certifiable_radius": largest_possible,
        "max_certifiable_radius_note": f"sigma * Phi^-1(Clopper-Pearson lower bound of {n}/{n}) at alpha {alpha:g}: "
                                       "no certificate with these n and alpha can exceed it",
        "sigma": sigma, "n0": n0, "n": n, "alpha": alpha,
        "guarantee": GUARANTEE,
        **_timing(records, n0 + n),
    }
    if extra:
        summary.update(extra)
        summary["guarantee"] = GUARANTEE + (
            "; the bound on pA is anytime-valid (a confidence sequence), so it holds at the data-dependent "
            "stopping time" + (DECIDE_NOT_CERTIFIED if decide else ""))
    if decide:
        # each row keeps the selected class; certified at R iff its radius is R (> 0), not certified: radius 0
        certified = [r for r in records if r.radius > 0]
        summary["abstention_rate"] = summary["wrong_rate"] = None
        summary["decide"] = {
            "radius": largest_possible,
            "certified_correct": sum(r.correct for r in certified) / count,
            "certified_wrong": sum(not r.correct for r in certified) / count,
            "not_certified": (count - len(certified)) / count,
            "note": "decide mode answers one question per image, certified at the radius or not: it measures no "
                    "clean accuracy, no abstention and no certified accuracy at any other radius (hence null); "
                    "a row that is not certified keeps the class the n0 selection samples chose, with radius 0"}
    return summary


def summarize_predictions(records: Sequence[PredictRecord], sigma: float, n: int, alpha: float) -> dict[str, Any]:
    """Results of a prediction run: smoothed accuracy and abstention rate (Cohen's PREDICT), timing."""
    if not records:
        raise UserError("no predicted images to summarize")
    count = len(records)
    return {
        "task": "predict",
        "images": count,
        "smoothed_accuracy": sum(r.correct for r in records) / count,
        **_outcome_rates(records),
        "sigma": sigma, "n": n, "alpha": alpha,
        "guarantee": "a prediction that is not ABSTAIN differs from the smoothed classifier's with probability "
                     "<= alpha (two-sided binomial test between the two top counts)",
        **_timing(records, n),
    }


def decide_line(summary: dict[str, Any]) -> str:
    """A decide run's outcome in one line: certified at R (right class, wrong class), not certified."""
    d = summary["decide"]
    return (f"decide at L2 radius {d['radius']:g}: certified with the true class {d['certified_correct']:.1%}, "
            f"certified with another class {d['certified_wrong']:.1%}, not certified {d['not_certified']:.1%} "
            f"(no clean accuracy and no other radius is measured in decide mode)")


def format_certified_accuracy_table(summary: dict[str, Any]) -> str:
    """Plain-text table of a certify summary: certified accuracy per radius, then the headline numbers."""
    budget = "n_max" if summary.get("mode") else "n"
    lines = [f"certified accuracy (L2 radius, sigma {summary['sigma']:g}, n0 {summary['n0']}, {budget} {summary['n']}, "
             f"alpha {summary['alpha']:g}, {summary['images']} images)",
             "  radius  certified accuracy"]
    for row in summary["certified_accuracy"]:
        lines.append(f"  {row['radius']:6.2f}  {row['certified_accuracy']:8.1%}")
    if "decide" in summary:
        lines.append(f"  {decide_line(summary)}")
    else:
        lines.append(f"  smoothed clean accuracy {summary['smoothed_clean_accuracy']:.1%}; abstained "
                     f"{summary['abstention_rate']:.1%}; average certified radius "
                     f"{summary['average_certified_radius']:.3f}; largest radius "
                     f"{summary['largest_certified_radius']:.3f} (at most {summary['max_certifiable_radius']:.3f} "
                     f"with this {budget} and alpha)")
    if summary.get("seconds_per_image") is not None:
        lines.append(f"  {summary['seconds_per_image']:.3f} s per image, "
                     f"{summary['noisy_samples_per_second']:,.0f} noisy samples per second")
    if "samples_per_image" in summary:
        lines.append(_samples_line(summary))
    return "\n".join(lines)


def _samples_line(summary: dict[str, Any]) -> str:
    what = (f"decide at radius {summary['radius']:g}" if summary["mode"] == "decide"
            else f"estimate, tolerance {summary['tolerance']:g}")
    samples = summary["samples_per_image"]
    return (f"  adaptive ({what}, {summary['sequential']['method']}): mean {samples['mean']:,.0f}, median "
            f"{samples['median']:,.0f} noisy samples per image (n0 included) against "
            f"{summary['fixed_n_samples_per_image']:,} for fixed n = {summary['n']:,}: "
            f"{summary['saving_vs_fixed_n']:.1f}x fewer")


def format_prediction_summary(summary: dict[str, Any]) -> str:
    text = (f"smoothed accuracy {summary['smoothed_accuracy']:.1%}, abstained {summary['abstention_rate']:.1%}, "
            f"wrong {summary['wrong_rate']:.1%} ({summary['images']} images, sigma {summary['sigma']:g}, "
            f"n {summary['n']}, alpha {summary['alpha']:g})")
    if summary.get("seconds_per_image") is not None:
        text += (f"; {summary['seconds_per_image']:.3f} s per image, "
                 f"{summary['noisy_samples_per_second']:,.0f} noisy samples per second")
    return text


# ----------------------------------------------------------------------------------------------- labels

def denoiser_arm(denoiser_metadata: dict[str, Any] | None) -> str | None:
    """The training arm of a denoiser (nodp, sepdp, transdenoiser, ...) from its metadata, if it says."""
    if not isinstance(denoiser_metadata, dict):
        return None
    privacy = denoiser_metadata.get("privacy")
    for source in (privacy if isinstance(privacy, dict) else {}, denoiser_metadata,
                   denoiser_metadata.get("train") if isinstance(denoiser_metadata.get("train"), dict) else {}):
        if source.get("arm"):
            return str(source["arm"])
    return None


def run_label(summary: dict[str, Any]) -> str:
    """``transdenoiser, sigma 0.25`` / ``no denoiser, sigma 0.25``: tolerant of missing keys."""
    settings = summary.get("settings") or {}
    sigma = settings.get("sigma", summary.get("sigma"))
    sigma_text = f"sigma {sigma:g}" if isinstance(sigma, (int, float)) else "sigma ?"
    if summary.get("denoiser_metadata") is None and not settings.get("denoiser"):
        return f"no denoiser, {sigma_text}"
    arm = denoiser_arm(summary.get("denoiser_metadata"))
    return f"{arm or 'denoiser'}, {sigma_text}"


def epsilon_text(denoiser_metadata: dict[str, Any] | None) -> str | None:
    """The denoiser's privacy in a few words for a legend, each epsilon with its analysis; None if unknown."""
    privacy = (denoiser_metadata or {}).get("privacy") if isinstance(denoiser_metadata, dict) else None
    if not isinstance(privacy, dict):
        return None
    if privacy.get("arm") == "nodp":
        return "no DP"
    guarantees = [g for g in privacy.get("guarantees", []) if isinstance(g, dict)]
    delta = privacy.get("delta")
    delta_text = f", delta {delta:g}" if isinstance(delta, (int, float)) else ""

    def rdp(guarantee: dict) -> str:
        value = (guarantee.get("epsilon") or {}).get("rdp")
        return f"{value:.3g}" if isinstance(value, (int, float)) and math.isfinite(value) else "inf"

    proven = [g for g in guarantees if g.get("data_independent") and g.get("name") != "data_independent"]
    if proven:
        return f"eps {rdp(proven[0])} (RDP{delta_text})"
    mmga = [g for g in guarantees if g.get("name") == "mmga"]
    if mmga:
        return f"no data-independent eps; MMGA eps {rdp(mmga[0])} (data-dependent, unproven{delta_text})"
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
    """``text`` broken into lines of at most ``width`` characters (at spaces), for a legend entry."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width=width, break_long_words=True, break_on_hyphens=False)) or text


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
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    write_bytes(path, png.getvalue())
    return path


# ----------------------------------------------------------------------------------------------- report.md

def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a" if value is None else str(value)
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}"


def _privacy_lines(denoiser_metadata: dict[str, Any] | None) -> list[str]:
    """The denoiser's privacy as a short table (the full report stays in summary.json)."""
    if denoiser_metadata is None:
        return ["No denoiser: the smoothed classifier is the classifier itself under noise; no privacy claim."]
    privacy = denoiser_metadata.get("privacy")
    if not isinstance(privacy, dict):
        return ["The denoiser's metadata holds no privacy report: no privacy claim is made for it."]
    lines = [f"Arm {privacy.get('arm')}: {privacy.get('privacy_claim', '')}".rstrip(), "",
             f"Training: sigma {_number(privacy.get('sigma'))}, clip norm C {_number(privacy.get('clip_norm'))}, "
             f"noise multiplier xi_up {_number(privacy.get('xi_up'))}, sample rate q "
             f"{_number(privacy.get('sample_rate'))}, {privacy.get('steps_done', privacy.get('steps_planned'))} "
             f"steps, delta {_number(privacy.get('delta'))}.", ""]
    guarantees = [g for g in privacy.get("guarantees", []) if isinstance(g, dict)]
    if guarantees:
        lines += ["| guarantee | data-independent | epsilon (RDP) | epsilon (PLD) | epsilon (GDP, approximate) |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for g in guarantees:
            eps = g.get("epsilon") or {}
            lines.append(f"| {g.get('label') or g.get('name')} | {'yes' if g.get('data_independent') else 'no'} | "
                         f"{_number(eps.get('rdp'))} | {_number(eps.get('pld'))} | {_number(eps.get('gdp_epsilon'))} |")
        lines.append("")
    lines.append("The full privacy report (every analysis and setting) is in summary.json, under "
                 "`denoiser_metadata.privacy`.")
    return lines


def _settings_table(settings: dict[str, Any]) -> list[str]:
    lines = ["| setting | value |", "| --- | --- |"]
    for key, value in settings.items():
        if key == "indices" and isinstance(value, list) and len(value) > 12:
            value = f"{len(value)} indices: {value[:6]} ..."
        elif isinstance(value, float):
            value = f"{value:.6g}"
        lines.append(f"| {key} | {value} |")
    return lines


def _as_run(settings: dict[str, Any]) -> str:
    from certify.numerics import describe, numeric_settings

    numeric = numeric_settings(settings)
    return describe(numeric["precision"], numeric["compile"], str(settings.get("memory_format", "contiguous")),
                    numeric["noise"])


def format_run_report(summary: dict[str, Any]) -> str:
    settings = summary.get("settings", {})
    cm = summary.get("classifier_metadata") or {}
    lines = [f"# {'Certification' if summary['task'] == 'certify' else 'Prediction'} report", "",
             f"{summary['images']} images of {settings.get('dataset')} ({settings.get('split')} split), "
             f"sigma {summary['sigma']:g} (L2 noise std, pixels in [0,1]), alpha {summary['alpha']:g}.",
             f"Guarantee: {summary['guarantee']}.", ""]
    if summary["task"] == "certify":
        lines += ["## Results", "", "| L2 radius | certified accuracy |", "| ---: | ---: |"]
        lines += [f"| {row['radius']:.2f} | {row['certified_accuracy']:.1%} |" for row in summary["certified_accuracy"]]
        budget = "n_max" if summary.get("mode") else "n"
        if "decide" in summary:
            lines += ["", f"- {decide_line(summary)}"]
        else:
            lines += ["", f"- smoothed clean accuracy (certified accuracy at radius 0): "
                          f"{summary['smoothed_clean_accuracy']:.1%}",
                      f"- abstention rate: {summary['abstention_rate']:.1%}; "
                      f"certified but wrong: {summary['wrong_rate']:.1%}",
                      f"- average certified radius: {summary['average_certified_radius']:.4f} ({ACR_DEFINITION})",
                      f"- largest certified radius: {summary['largest_certified_radius']:.4f}; largest possible "
                      f"with {budget} = {summary['n']} and alpha = {summary['alpha']:g}: "
                      f"{summary['max_certifiable_radius']:.4f}"]
        lines += [*([f"- {_samples_line(summary).strip()}"] if "samples_per_image" in summary else []),
                  "", f"![certified accuracy against L2 radius]({PLOT_FILE})", ""]
    else:
        lines += ["## Results", "", f"- smoothed accuracy: {summary['smoothed_accuracy']:.1%}",
                  f"- abstention rate: {summary['abstention_rate']:.1%}; wrong: {summary['wrong_rate']:.1%}", ""]
    timing = summary.get("timing", {})
    lines += ["## Speed and hardware", "",
              f"- {summary['seconds_per_image']:.4f} s per image, {summary['noisy_samples_per_second']:,.0f} noisy "
              "samples per second (compute time of the rows, per process; parallel shards add up)",
              f"- wall time of the processes: {timing.get('wall_seconds', 'n/a')} s",
              *[f"- hardware: {h}" for h in summary.get("hardware", [])],
              f"- base classifier as run: {_as_run(settings)}; the certificate is about this function "
              "(docs/CERTIFY.md, \"Precision and compilation\")", "",
              "## Models", "",
              f"- classifier: `{settings.get('classifier')}` ({cm.get('architecture')}, test accuracy "
              f"{_number(cm.get('test_accuracy'))} as recorded in its metadata), sha256 "
              f"{str(settings.get('classifier_sha256'))[:16]}...",
              f"- denoiser: `{settings.get('denoiser')}`" + (
                  f" ({(summary.get('denoiser_metadata') or {}).get('architecture')}, arm "
                  f"{denoiser_arm(summary.get('denoiser_metadata'))})" if settings.get("denoiser") else ""),
              "", *_privacy_lines(summary.get("denoiser_metadata")), "",
              "## Settings", "", *_settings_table(settings), ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- run folders

def finalize_run(run_dirs: Sequence[Path], out_dir: Path | None = None) -> dict[str, Any]:
    """Merge a run's rows (one folder, or several shards' folders) and write the TSV, summary, report and figure.

    Refuses an incomplete run. Returns the summary (also written to ``out_dir/summary.json``).
    """
    run_dirs = [Path(d) for d in run_dirs]
    out_dir = Path(out_dir) if out_dir is not None else run_dirs[0]
    settings, rows, statuses = collect_rows(run_dirs)
    problems = missing_report(settings, rows)
    if problems:
        raise UserError(f"the run is not complete ({'; '.join(problems)}): finish or resume it first")
    rows = ordered(settings, rows)
    models = read_json(run_dirs[0] / MODELS_FILE, "the models' metadata")
    task = settings["task"]
    out_dir.mkdir(parents=True, exist_ok=True)
    write_rows(out_dir / f"{task}.tsv", task, rows)
    if out_dir not in run_dirs:
        write_json(out_dir / SETTINGS_FILE, settings)
        write_json(out_dir / MODELS_FILE, models)
    if task == "certify":
        adaptive = settings if settings.get("mode") else None
        summary = summarize(rows, settings["sigma"], settings["n0"], settings["n"], settings["alpha"],
                            adaptive=adaptive)
    else:
        summary = summarize_predictions(rows, settings["sigma"], settings["n"], settings["alpha"])
    sessions = [s for status in statuses for s in status.get("sessions", [])]
    summary["hardware"] = sorted({s["hardware"] for s in sessions})
    cut = sum(s.get("state") in ("running", "interrupted") for s in sessions)
    summary["timing"] = {"wall_seconds": round(sum(s.get("wall_seconds", 0.0) for s in sessions), 3),
                         "processes": len(statuses), "sessions": len(sessions),
                         "note": "wall seconds summed over processes and resumed sessions"
                         + (f"; {cut} session(s) killed before closing count up to their last record (every "
                            f"{HEARTBEAT_SECONDS:g} s), so the sum may fall short" if cut else "")}
    summary["settings"] = settings
    summary["classifier_metadata"] = models.get("classifier_metadata")
    summary["denoiser_metadata"] = models.get("denoiser_metadata")
    write_json(out_dir / SUMMARY_FILE, summary)
    write_text(out_dir / REPORT_FILE, format_run_report(summary))
    if task == "certify":
        cap = cap_note(summary)
        curves, points = _curves_and_points([(legend_label(summary), summary, rows)])
        plot_certified_accuracy(curves, out_dir / PLOT_FILE, title=f"Certified accuracy, {run_label(summary)}",
                                caps=[cap] if cap else [], points=points)
    return summary


def _curves_and_points(runs: Sequence[tuple[str, dict[str, Any], Sequence[CertifyRecord]]]):
    """(label, summary, records) per run -> the figure's curves, and one point per decide run (its one radius)."""
    curves, points = [], []
    for label, summary, records in runs:
        if "decide" in summary:
            points.append((label, summary["decide"]["radius"], summary["decide"]["certified_correct"]))
        else:
            curves.append((label, records))
    return curves, points


def read_certify_run(run_dir: Path) -> tuple[dict[str, Any], list[CertifyRecord]]:
    """summary.json and certify.tsv of a finished certify run."""
    summary = read_json(run_dir / SUMMARY_FILE, "run summary: finish or merge the run first")
    if summary.get("task") != "certify":
        raise UserError(f"{run_dir}: summary.json is for task {summary.get('task')!r}, not certify")
    return summary, read_rows(run_dir / "certify.tsv", "certify")  # type: ignore[return-value]


def overlay_runs(run_dirs: Sequence[Path], out_dir: Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """One figure and one table over several runs: certify runs (certify.tsv) and attack runs (attack.json).

    ``warn(line)`` receives a warning when the certify runs differ in dataset or sigma (also written into report.md).
    """
    run_dirs = [Path(d) for d in run_dirs]
    if any(out_dir.resolve() == d.resolve() for d in run_dirs):
        raise UserError(f"--out {out_dir} is one of the runs: the overlay would overwrite its report; choose another")
    resolved = [d.resolve() for d in run_dirs]
    if len(set(resolved)) != len(resolved):
        raise UserError("a run folder is listed twice")
    certify_dirs, attack_dirs = [], []
    for run_dir in run_dirs:
        if (run_dir / "certify.tsv").is_file() or (run_dir / SUMMARY_FILE).is_file():
            certify_dirs.append(run_dir)
        elif (run_dir / "attack.json").is_file():
            attack_dirs.append(run_dir)
        elif run_dir.is_dir():
            raise UserError(f"{run_dir} holds neither certify.tsv nor attack.json: not a certify or attack run")
        else:
            raise UserError(f"{run_dir}: no such run directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if certify_dirs:
        written += _overlay_certify_runs(certify_dirs, out_dir, warn)
    if attack_dirs:
        from certify.attacks.report import overlay_attack_runs

        written += overlay_attack_runs(attack_dirs, out_dir)
    return written


def overlay_warnings(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """Warnings for an overlay of runs that are not comparable: other datasets, other sigmas."""
    warnings = []
    for key, what in (("dataset", "datasets"), ("sigma", "sigmas")):
        values = sorted({str((s.get("settings") or {}).get(key, s.get(key))) for s in summaries})
        if len(values) > 1:
            warnings.append(f"warning: the overlaid runs are on different {what} ({', '.join(values)}): their curves "
                            "do not compare like for like (each legend names its own)")
    return warnings


def paired_to_first(labels: Sequence[str], runs: Sequence[tuple[dict[str, Any], Sequence[CertifyRecord]]],
                    radii: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Every later run minus the first, paired over the same images (certify.compare), by label. Empty when there is
    one run or the first is a decide run (one radius); a run on other images, or a decide run, gets a note."""
    from certify.compare import paired_difference

    if len(runs) < 2 or "decide" in runs[0][0]:
        return {}
    paired: dict[str, dict[str, Any]] = {}
    for label, (summary, records) in zip(labels[1:], runs[1:], strict=True):
        if "decide" in summary:
            paired[label] = {"note": "a decide run (one radius): not compared"}
            continue
        try:
            found = paired_difference(records, runs[0][1], radii)
        except UserError as exc:
            paired[label] = {"note": str(exc)}
            continue
        paired[label] = found.as_dict()
    return paired


def _overlay_certify_runs(run_dirs: list[Path], out_dir: Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    from certify.numerics import refuse_mixed_numerics

    runs = [read_certify_run(d) for d in run_dirs]
    refuse_mixed_numerics([(str(d), summary.get("settings") or {}) for d, (summary, _) in zip(run_dirs, runs,
                                                                                            strict=True)], "overlay")
    warnings = overlay_warnings([summary for summary, _ in runs])
    for line in warnings:
        if warn is not None:
            warn(line)
    plain = [legend_label(summary) for summary, _ in runs]
    labels = [f"{label} ({run_dir.name})" if plain.count(label) > 1 else label  # same label twice: add the folder
              for label, run_dir in zip(plain, run_dirs, strict=True)]
    largest = max(summary["max_certifiable_radius"] for summary, _ in runs)
    radii = sorted(set(radius_grid(largest)) | {s["decide"]["radius"] for s, _ in runs if "decide" in s})
    table = []
    for label, run_dir, (summary, records) in zip(labels, run_dirs, runs, strict=True):
        # a decide run measured one radius: the others are None (not measured), not its certified accuracy
        measured = [summary["decide"]["radius"]] if "decide" in summary else radii
        table.append({"label": label, "run": str(run_dir), "images": len(records),
                      "smoothed_clean_accuracy": summary["smoothed_clean_accuracy"],
                      "abstention_rate": summary["abstention_rate"],
                      "average_certified_radius": summary["average_certified_radius"],
                      "certified_accuracy": {f"{r:.2f}": certified_accuracy(records, r) if r in measured else None
                                             for r in radii},
                      "settings": {k: summary.get("settings", {}).get(k) for k in ("sigma", "n0", "n", "alpha",
                                                                                    "dataset", "split", "mode",
                                                                                    "radius")}})
    caps = [cap for cap in (cap_note(summary) for summary, _ in runs) if cap]
    curves, points = _curves_and_points([(label, summary, records)
                                         for label, (summary, records) in zip(labels, runs, strict=True)])
    png = plot_certified_accuracy(curves, out_dir / PLOT_FILE, title="Certified accuracy against L2 radius",
                                  caps=caps, points=points)
    header = "| run | images | " + " | ".join(f"r = {r:.2f}" for r in radii) + " | ACR | abstained |"
    lines = ["# Certified accuracy of several runs", "", *[f"**{line}**" for line in warnings],
             *([""] if warnings else []),
             "Certified accuracy at each L2 radius (pixels in [0,1]); ACR: average certified radius "
             f"({ACR_DEFINITION}).", "", header, "|" + " --- |" * (len(radii) + 4)]
    def cell(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for row in table:
        cells = " | ".join(cell(row['certified_accuracy'][f'{r:.2f}'], ".1%") for r in radii)
        lines.append(f"| {row['label']} | {row['images']} | {cells} | {cell(row['average_certified_radius'], '.3f')} | "
                     f"{cell(row['abstention_rate'], '.1%')} |")
    if any(row["settings"].get("mode") == "decide" for row in table):
        lines += ["", "A decide run answers one question per image, certified at its radius R or not: '-' marks the "
                      "radii, ACR and abstention it does not measure."]
    paired = paired_to_first(labels, runs, radii)
    if paired:
        from certify.compare import points_cells

        lines += ["", f"Each run minus **{labels[0]}** in certified accuracy (points), paired over the same images, "
                  "with a 95% paired-bootstrap interval over images (10,000 resamples; `certify.compare`). An "
                  "interval that includes 0: these images do not tell the two runs apart.", "",
                  "| run - first run | images | " + " | ".join(f"r = {r:.2f}" for r in radii) + " |",
                  "|" + " --- |" * (len(radii) + 2)]
        for label, entry in paired.items():
            if "note" in entry:
                lines.append(f"| {label} | - | {entry['note']} |" + " |" * (len(radii) - 1))
                continue
            lines.append(f"| {label} | {entry['images']} | {' | '.join(points_cells(entry))} |")
        for row in table:
            if row["label"] in paired:
                row["paired_to_first_run"] = paired[row["label"]]
    lines += ["", f"![certified accuracy against L2 radius]({PLOT_FILE})", "", "Runs:", ""]
    lines += [f"- {row['label']}: `{row['run']}` (n0 {row['settings']['n0']}, n {row['settings']['n']}, "
              f"alpha {row['settings']['alpha']})" for row in table]
    md = out_dir / REPORT_FILE
    write_text(md, "\n".join(lines) + "\n")
    overlay_json = out_dir / "overlay.json"
    write_json(overlay_json, table)
    return [png, md, overlay_json]
