"""``transdenoiser report`` over certify runs: one figure, one table (report.md, overlay.json) of several runs, with
each later run's paired difference to the first over the same images (:mod:`certify.compare`)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from certify.figures import cap_note, curves_and_points, legend_label, plot_certified_accuracy
from certify.report import PLOT_FILE, REPORT_FILE, read_certify_run
from certify.rundir import CertifyRecord, write_json, write_text
from certify.summary import ACR_DEFINITION, certified_accuracy, radius_grid
from transdenoiser.errors import UserError
from transdenoiser.records import CertificationSummary, thaw


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


def overlay_certify_runs(run_dirs: list[Path], out_dir: Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """certified_accuracy.png, report.md and overlay.json in ``out_dir`` over the certify runs ``run_dirs``; ``warn``
    receives each warning of :func:`overlay_warnings` (also written into report.md). Returns the files written."""
    from certify.numerics import refuse_mixed_numerics

    runs = [read_certify_run(d) for d in run_dirs]
    summaries = [CertificationSummary.from_json(summary) for summary, _ in runs]
    refuse_mixed_numerics([(str(d), thaw(s.settings) or {}) for d, s in zip(run_dirs, summaries, strict=True)],
                          "overlay")
    warnings = overlay_warnings([summary for summary, _ in runs])
    for line in warnings:
        if warn is not None:
            warn(line)
    plain = [legend_label(summary) for summary, _ in runs]
    labels = [f"{label} ({run_dir.name})" if plain.count(label) > 1 else label  # same label twice: add the folder
              for label, run_dir in zip(plain, run_dirs, strict=True)]
    largest = max(s.max_certifiable_radius for s in summaries)
    radii = sorted(set(radius_grid(largest)) | {s.decide["radius"] for s in summaries if s.decide is not None})
    table = []
    for label, run_dir, s, (_, records) in zip(labels, run_dirs, summaries, runs, strict=True):
        # a decide run measured one radius: the others are None (not measured), not its certified accuracy
        measured = [s.decide["radius"]] if s.decide is not None else radii
        table.append({"label": label, "run": str(run_dir), "images": len(records),
                      "smoothed_clean_accuracy": s.smoothed_clean_accuracy,
                      "abstention_rate": s.abstention_rate,
                      "average_certified_radius": s.average_certified_radius,
                      "certified_accuracy": {f"{r:.2f}": certified_accuracy(records, r) if r in measured else None
                                             for r in radii},
                      "settings": {k: thaw((s.settings or {}).get(k)) for k in ("sigma", "n0", "n", "alpha",
                                                                               "dataset", "split", "mode", "radius")}})
    caps = [cap for cap in (cap_note(summary) for summary, _ in runs) if cap]
    curves, points = curves_and_points([(label, summary, records)
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
