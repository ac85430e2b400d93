"""``baseline-certify``'s report: report.md of a finished run, one section per certificate, drawn with
:mod:`certify.report`'s renderers (the certified-accuracy table, the hardware lines, the privacy table, the settings
table), and read back from a run directory for ``transdenoiser report``.

The two certificates of the same randomised model: the baseline's own (``phan``: SecureSGD's PixelDP-style bound of
Phan et al. 2019, or StoBatch's Laplace bound of Phan et al. 2020) and randomized smoothing (``smoothing``, Cohen et
al. 2019). Every radius is an L2 radius in [0,1]-pixel units; StoBatch's comes from an L1 bound as L1 / sqrt(d).

report.md depends only on the run's summary (its rows' numbers), settings and the machines its sessions ran on, so
a resumed or re-run complete run writes the same bytes.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from certify.baseline_rows import SETTINGS_FILE, STATUS_FILE, SUMMARY_FILE
from certify.report import REPORT_FILE, certified_accuracy_lines, hardware_lines, privacy_lines, settings_table
from certify.rundir import read_json, write_text
from transdenoiser.errors import UserError
from transdenoiser.records import BaselineCertificate, BaselineCertificationSummary, is_baseline_summary, thaw

# The baseline's own certificate, by arm: its paper and what its radius is.
OWN_CERTIFICATES = {
    "securesgd-prt": ("SecureSGD's own certificate (Phan et al. 2019, a PixelDP-style bound of the Gaussian noise "
                      "layer)", "Its radius is an L2 radius in [0,1]-pixel units."),
    "securesgd-sct": ("SecureSGD's own certificate (Phan et al. 2019, a PixelDP-style bound of the Gaussian noise "
                      "layer)", "Its radius is an L2 radius in [0,1]-pixel units."),
    "stobatch": ("StoBatch's own certificate (Phan et al. 2020, the Laplace noise layer's bound)",
                 "Its radius is an L2 radius in [0,1]-pixel units derived from the certificate's L1 bound: "
                 "L2 = L1 / sqrt(d), d = {pixels} pixels (the L2 ball of that radius lies inside the certified L1 "
                 "ball)."),
}


def _share(rate: float | None, images: int) -> str:
    """``k of N images (p%)`` for a share ``rate`` = k / N of the run's images."""
    if rate is None or (isinstance(rate, float) and math.isnan(rate)):
        return "n/a"
    return f"{round(rate * images)} of {images} images ({rate:.1%})"


def _radius(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _certificate_lines(certificate: BaselineCertificate, images: int, own: bool) -> list[str]:
    """One certificate's table at the run's radii, then its counts."""
    table = certificate.table()
    at_zero = dict(table).get(0.0)
    lines = [*certified_accuracy_lines(table), ""]
    if own:
        lines.append("- correct (`phan_correct`, as the note below defines it): "
                     f"{_share(certificate.accuracy, images)}")
    lines += [f"- certified correct at radius 0: {_share(at_zero, images)}",
              f"- abstained (counted wrong): {_share(certificate.abstain_rate, images)}",
              f"- median certified radius: {_radius(certificate.median_radius)}"]
    if certificate.note:
        lines += ["", f"Note: {certificate.note}."]
    return lines


def format_baseline_report(summary: BaselineCertificationSummary, settings: dict[str, Any],
                           hardware: Sequence[str]) -> str:
    """report.md of a finished ``baseline-certify`` run: ``summary`` (summary.json), ``settings`` (the run's settings
    file) and ``hardware`` (the machines its sessions ran on)."""
    images = summary.num_images
    title, units = OWN_CERTIFICATES.get(summary.arm, (f"the {summary.arm} baseline's own certificate",
                                                      "Its radius is an L2 radius in [0,1]-pixel units."))
    pixels = (summary.noise_layer or {}).get("pixels", "the image's")
    lines = ["# Baseline certification report", "",
             f"{images} images of {summary.dataset} ({summary.split} split), checkpoint `{summary.model}` (arm "
             f"{summary.arm}). Each image gets two certificates of the same randomised model, each from its own n0 = "
             f"{summary.n0} selection and n = {summary.n} estimation draws and each failing with probability at most "
             f"alpha = {summary.alpha:g}. Radii are L2 distances in [0,1]-pixel units; certified accuracy at radius r: "
             "the share of images certified with the true class at a radius >= r (abstentions count as wrong).", "",
             f"## Own certificate: {title}", "", units.format(pixels=pixels), "",
             *_certificate_lines(summary.phan, images, own=True), "",
             "## Randomized smoothing of the same randomised model", "",
             f"Cohen et al. 2019 at sigma {summary.smoothing_sigma:g} (L2 noise std, pixels in [0,1]), on top of the "
             "model's own noise layer; its radius sigma * Phi^-1(p_lower) is an L2 radius in [0,1]-pixel units.", "",
             *_certificate_lines(summary.smoothing, images, own=False), ""]
    seconds = summary.seconds
    lines += ["## Speed and hardware", "",
              f"- {seconds / images:.4f} s per image for both certificates (wall seconds of the images' "
              "certificates, summed over the sessions that certified them)" if seconds is not None and images
              else "- seconds per image: not recorded",
              *hardware_lines(hardware), "",
              "## Model", "", f"- checkpoint: `{summary.model}` (arm {summary.arm})"]
    for key, value in sorted(thaw(summary.noise_layer or {}).items()):  # summary.json's order (keys sorted)
        lines.append(f"- noise layer {key}: {f'{value:.6g}' if isinstance(value, float) else value}")
    privacy = (privacy_lines({"privacy": thaw(summary.privacy)}, where="summary.json, under `privacy`")
               if summary.privacy is not None else
               ["The checkpoint's metadata holds no privacy report: no privacy claim is made for it."])
    lines += ["", *privacy,
              "", "## Settings", "", *settings_table(settings), ""]
    return "\n".join(lines)


def session_hardware(status: dict[str, Any] | None, fallback: str | None) -> list[str]:
    """The machines a run's sessions ran on (sorted, each once), from its status file; ``fallback`` (summary.json's
    ``hardware``) when there is no status file."""
    sessions = (status or {}).get("sessions") or []
    found = sorted({str(s["hardware"]) for s in sessions if isinstance(s, dict) and s.get("hardware")})
    return found or ([fallback] if fallback else [])


def write_baseline_report(run_dir: Path, summary: BaselineCertificationSummary, out_dir: Path | None = None) -> Path:
    """Write report.md of the finished run in ``run_dir`` (to ``out_dir``, by default the run's folder)."""
    run_dir = Path(run_dir)
    settings = read_json(run_dir / SETTINGS_FILE, "the run's settings")
    if not isinstance(settings, dict):
        raise UserError(f"{run_dir / SETTINGS_FILE}: not a settings object")
    status_path = run_dir / STATUS_FILE
    status = read_json(status_path, "the run's status") if status_path.is_file() else None
    hardware = session_hardware(status if isinstance(status, dict) else None, summary.hardware)
    path = Path(out_dir or run_dir) / REPORT_FILE
    write_text(path, format_baseline_report(summary, settings, hardware) + "\n")
    return path


def is_baseline_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` is a ``baseline-certify`` run directory (its settings file, or a baseline summary)."""
    run_dir = Path(run_dir)
    if (run_dir / SETTINGS_FILE).is_file():
        return True
    summary_path = run_dir / SUMMARY_FILE
    if not summary_path.is_file():
        return False
    try:
        return is_baseline_summary(read_json(summary_path, "run summary"))
    except UserError:
        return False


def read_baseline_summary(run_dir: Path) -> BaselineCertificationSummary:
    """A finished ``baseline-certify`` run's summary.json as a record (one line naming the problem otherwise)."""
    path = Path(run_dir) / SUMMARY_FILE
    data = read_json(path, "baseline-certify summary: the run is not complete; run the same baseline-certify "
                           "command again to finish it")
    return BaselineCertificationSummary.from_json(data, str(path))


def render_baseline_run(run_dir: Path, out_dir: Path) -> Path:
    """``transdenoiser report`` of one ``baseline-certify`` run: its report.md rendered again into ``out_dir``
    (the run's folder itself included: the same bytes the run wrote, for the same rows)."""
    return write_baseline_report(run_dir, read_baseline_summary(run_dir), out_dir)


__all__ = ["OWN_CERTIFICATES", "format_baseline_report", "is_baseline_run", "read_baseline_summary",
           "render_baseline_run", "session_hardware", "write_baseline_report"]
