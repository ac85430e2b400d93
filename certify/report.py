"""Text of certification runs: the tables the CLI prints, report.md, and the run folder's finalisation (merge the
rows, write the TSV, summary.json, report.md and certified_accuracy.png).

The numbers and their definitions are in :mod:`certify.summary`, the figures in :mod:`certify.figures`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from certify.figures import cap_note, curves_and_points, legend_label, plot_certified_accuracy, run_label
from certify.rundir import (
    HEARTBEAT_SECONDS,
    MODELS_FILE,
    SETTINGS_FILE,
    TEST_FILE,
    CertifyRecord,
    collect_rows,
    missing_report,
    ordered,
    read_json,
    read_rows,
    write_json,
    write_rows,
    write_text,
)
from certify.summary import ACR_DEFINITION, summarize, summarize_predictions
from transdenoiser.errors import UserError
from transdenoiser.records import CertificationSummary, Epsilon, PrivacyReport

SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOT_FILE = "certified_accuracy.png"


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
        lines.append(f"  {speed_text(summary)}")
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
        text += f"; {speed_text(summary)}"
    return text


def speed_text(summary: dict[str, Any], digits: int = 3) -> str:
    """Seconds per image and noisy samples per second; a run whose rows recorded 0 s in all (each row's seconds
    are written to 4 decimals) has no rate, and says so."""
    rate = summary.get("noisy_samples_per_second")
    per_second = (f"{rate:,.0f} noisy samples per second" if rate is not None
                  else "no samples-per-second figure (the rows recorded 0 s in all)")
    return f"{summary['seconds_per_image']:.{digits}f} s per image, {per_second}"


# ----------------------------------------------------------------------------------------------- report.md

def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a" if value is None else str(value)
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}"


def certified_accuracy_lines(table: Iterable[tuple[float, float]]) -> list[str]:
    """One certificate's certified accuracy at each L2 radius, as a markdown table; ``table``: (radius, certified
    accuracy in [0, 1]) pairs."""
    return ["| L2 radius | certified accuracy |", "| ---: | ---: |",
            *[f"| {radius:.2f} | {accuracy:.1%} |" for radius, accuracy in table]]


def hardware_lines(hardware: Iterable[str]) -> list[str]:
    """One list item per machine a run ran on."""
    return [f"- hardware: {h}" for h in hardware]


def privacy_lines(denoiser_metadata: dict[str, Any] | None,
                  where: str = "summary.json, under `denoiser_metadata.privacy`") -> list[str]:
    """The privacy of ``denoiser_metadata``'s model (its ``privacy`` report) as a short table; ``where``: where the
    full report is kept."""
    if denoiser_metadata is None:
        return ["No denoiser: the smoothed classifier is the classifier itself under noise; no privacy claim."]
    privacy = denoiser_metadata.get("privacy")
    if not isinstance(privacy, dict):
        return ["The denoiser's metadata holds no privacy report: no privacy claim is made for it."]
    report = PrivacyReport.from_json(privacy, f"the privacy report in {where}")
    steps = report.steps_done if report.steps_done is not None else report.steps_planned
    lines = [f"Arm {report.arm}: {report.privacy_claim or ''}".rstrip(), "",
             f"Training: sigma {_number(report.sigma)}, clip norm C {_number(report.clip_norm)}, "
             f"noise multiplier xi_up {_number(report.xi_up)}, sample rate q "
             f"{_number(report.sample_rate)}, {steps} steps, delta {_number(report.delta)}.", ""]
    if report.guarantees:
        lines += ["| guarantee | data-independent | epsilon (RDP) | epsilon (PLD) | epsilon (GDP, approximate) |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for g in report.guarantees:
            eps = g.epsilon or Epsilon()
            lines.append(f"| {g.label or g.name} | {'yes' if g.data_independent else 'no'} | "
                         f"{_number(eps.rdp)} | {_number(eps.pld)} | {_number(eps.gdp_epsilon)} |")
        lines.append("")
    lines.append(f"The full privacy report (every analysis and setting) is in {where}.")
    return lines


def settings_table(settings: dict[str, Any]) -> list[str]:
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
    record = CertificationSummary.from_json(summary, "summary.json")
    lines = [f"# {'Certification' if summary['task'] == 'certify' else 'Prediction'} report", "",
             f"{summary['images']} images of {settings.get('dataset')} ({settings.get('split')} split), "
             f"sigma {summary['sigma']:g} (L2 noise std, pixels in [0,1]), alpha {summary['alpha']:g}.",
             f"Guarantee: {summary['guarantee']}.", ""]
    if summary["task"] == "certify":
        lines += ["## Results", "", *certified_accuracy_lines((row["radius"], row["certified_accuracy"])
                                                              for row in summary["certified_accuracy"])]
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
              f"- {speed_text(summary, 4)} (compute time of the rows, per process; parallel shards add up)",
              f"- wall time of the processes: {timing.get('wall_seconds', 'n/a')} s",
              *hardware_lines(summary.get("hardware", [])),
              f"- base classifier as run: {_as_run(settings)}; the certificate is about this function "
              "(docs/CERTIFY.md, \"Precision and compilation\")", "",
              "## Models", "",
              f"- classifier: `{settings.get('classifier')}` ({cm.get('architecture')}, test accuracy "
              f"{_number(cm.get('test_accuracy'))} as recorded in its metadata), sha256 "
              f"{str(settings.get('classifier_sha256'))[:16]}...",
              f"- denoiser: `{settings.get('denoiser')}`" + (
                  f" ({(record.denoiser_metadata or {}).get('architecture')}, arm {record.arm})"
                  if settings.get("denoiser") else ""),
              "", *privacy_lines(summary.get("denoiser_metadata")), "",
              "## Settings", "", *settings_table(settings), ""]
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
    if (run_dirs[0] / TEST_FILE).exists():  # certify runs since the ledger (certify.ledger): which test, of how many
        summary["test"] = read_json(run_dirs[0] / TEST_FILE, "the run's test")
    summary["classifier_metadata"] = models.get("classifier_metadata")
    summary["denoiser_metadata"] = models.get("denoiser_metadata")
    write_json(out_dir / SUMMARY_FILE, summary)
    write_text(out_dir / REPORT_FILE, format_run_report(summary))
    if task == "certify":
        cap = cap_note(summary)
        curves, points = curves_and_points([(legend_label(summary), summary, rows)])
        plot_certified_accuracy(curves, out_dir / PLOT_FILE, title=f"Certified accuracy, {run_label(summary)}",
                                caps=[cap] if cap else [], points=points)
    return summary


def read_certify_run(run_dir: Path) -> tuple[dict[str, Any], list[CertifyRecord]]:
    """summary.json and certify.tsv of a finished certify run."""
    summary = read_json(run_dir / SUMMARY_FILE, "run summary: finish or merge the run first")
    record = read_certify_summary(run_dir, summary)
    return record.to_json(), read_rows(run_dir / "certify.tsv", "certify")  # type: ignore[return-value]


def read_certify_summary(run_dir: Path, summary: dict[str, Any] | None = None) -> CertificationSummary:
    """A finished certify run's summary.json as a record (refused with one line if it is not a certify summary)."""
    if summary is None:
        summary = read_json(run_dir / SUMMARY_FILE, "run summary: finish or merge the run first")
    if isinstance(summary, dict) and summary.get("task") not in (None, "certify"):
        raise UserError(f"{run_dir}: summary.json is for task {summary.get('task')!r}, not certify")
    record = CertificationSummary.from_json(summary, f"{run_dir}/{SUMMARY_FILE}")
    if record.task != "certify":  # pragma: no cover - the check above
        raise UserError(f"{run_dir}: summary.json is for task {record.task!r}, not certify")
    return record
