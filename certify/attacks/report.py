"""Files of an attack run (attack.json, attack.tsv, attack.png) and the overlay of several runs.

The figure has the form of the TransDenoiser paper's Figures 3 and 7: accuracy (y) against the
attack's epsilon (x), the clean value plotted at epsilon 0. Matplotlib draws it (Agg backend, no display).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training.checkpoint import write_bytes, write_text
from transdenoiser.errors import UserError
from transdenoiser.pngs import figure_png

ATTACK_JSON = "attack.json"
ATTACK_TSV = "attack.tsv"
ATTACK_PNG = "attack.png"
OVERLAY_PNG = "attacks_overlay.png"
OVERLAY_MD = "attacks_overlay.md"
TSV_COLUMNS = ("eps", "smoothed_accuracy", "smoothed_abstain_rate", "noisy_accuracy", "base_accuracy", "mean_norm",
               "max_norm", "step_size", "seconds")
CURVES = (("smoothed_accuracy", "smoothed prediction", "-"), ("noisy_accuracy", "single noisy pass", "--"))


def run_label(record: dict[str, Any]) -> str:
    """``attack norm, threat threat, arm`` from an attack.json record; tolerant of missing keys."""
    settings = record.get("settings") or {}
    denoiser = record.get("denoiser_metadata")
    if isinstance(denoiser, dict):
        arm = (denoiser.get("privacy") or {}).get("arm") if isinstance(denoiser.get("privacy"), dict) else None
        arm_text = f"arm {arm}" if arm else "denoiser"
    else:
        arm_text = "no denoiser"
    attack = str(settings.get("attack", "?")).upper()
    return f"{attack} {settings.get('norm', '?')}, threat {settings.get('threat', '?')}, {arm_text}"


def curve_points(record: dict[str, Any], key: str) -> tuple[list[float], list[float]]:
    """(eps, value) with the clean reference at eps 0 first."""
    xs, ys = [], []
    clean = record.get("clean") or {}
    if key in clean:
        xs.append(0.0)
        ys.append(float(clean[key]))
    for row in record.get("results") or []:
        if key in row:
            xs.append(float(row["eps"]))
            ys.append(float(row[key]))
    return xs, ys


def write_attack_tsv(record: dict[str, Any], path: Path) -> Path:
    """One line for the clean reference (eps 0) and one per epsilon."""
    def cell(value):
        if value is None:
            return ""
        return f"{value:.6g}" if isinstance(value, float) else str(value)

    lines = ["\t".join(("row",) + TSV_COLUMNS)]
    clean = {"eps": 0.0, **(record.get("clean") or {})}
    lines.append("\t".join(["clean"] + [cell(clean.get(c)) for c in TSV_COLUMNS]))
    for row in record.get("results") or []:
        lines.append("\t".join(["attack"] + [cell(row.get(c)) for c in TSV_COLUMNS]))
    write_text(path, "\n".join(lines) + "\n")
    return path


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    return plt, fig, ax


def _finish(plt, fig, ax, title: str, norm: str, path: Path) -> Path:
    ax.set_xlabel(f"attack epsilon ({norm} norm, pixels in [0,1]; 0 = clean)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    write_bytes(path, figure_png(fig))
    plt.close(fig)
    return path


def plot_attack_run(record: dict[str, Any], path: Path) -> Path:
    """Accuracy against epsilon for one run: smoothed prediction and single noisy pass."""
    plt, fig, ax = _figure()
    for key, name, style in CURVES:
        xs, ys = curve_points(record, key)
        ax.plot(xs, ys, style, marker="o", label=name)
    settings = record.get("settings") or {}
    eot = "no noise in the attack" if settings.get("threat") == "classifier" else f"EOT m={settings.get('eot')}"
    steps = "one step" if settings.get("attack") == "fgsm" else f"steps={settings.get('steps')}"
    title = (f"{run_label(record)}\nsigma={settings.get('sigma')}, {record.get('num_images')} images, "
             f"{steps}, {eot}, predict n={settings.get('n')}")
    return _finish(plt, fig, ax, title, str(settings.get("norm", "?")), path)


def write_attack_outputs(record: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write attack.json, attack.tsv and attack.png into ``out_dir``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / ATTACK_JSON
    write_text(json_path, json.dumps(record, indent=2, sort_keys=False) + "\n")
    return [json_path, write_attack_tsv(record, out_dir / ATTACK_TSV), plot_attack_run(record, out_dir / ATTACK_PNG)]


def read_attack_run(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / ATTACK_JSON
    if not path.is_file():
        raise UserError(f"{run_dir}: no {ATTACK_JSON} (not an attack run)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None


def overlay_attack_runs(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    """Overlay several attack runs (arms, threats, attacks) in one PNG and one markdown table; return the files.

    Solid lines: smoothed prediction; dashed: single noisy pass; one colour per run.
    """
    records = [(Path(d), read_attack_run(d)) for d in run_dirs]
    if not records:
        raise UserError("no attack runs to overlay")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plt, fig, ax = _figure()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    norms = sorted({str((r.get("settings") or {}).get("norm", "?")) for _, r in records})
    for i, (_, record) in enumerate(records):
        colour = colours[i % len(colours)]
        for key, name, style in CURVES:
            xs, ys = curve_points(record, key)
            ax.plot(xs, ys, style, marker="o", markersize=3, color=colour, label=f"{run_label(record)} ({name})")
    png = _finish(plt, fig, ax, "accuracy under attack (smoothed: solid, single noisy pass: dashed)",
                  "/".join(norms), out_dir / OVERLAY_PNG)

    eps_values = sorted({float(row["eps"]) for _, r in records for row in r.get("results") or []})
    header = ["run", "measure", "clean"] + [f"eps {e:g}" for e in eps_values]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for directory, record in records:
        by_eps = {float(row["eps"]): row for row in record.get("results") or []}
        for key, name, _ in CURVES:
            clean = (record.get("clean") or {}).get(key)
            cells = [f"{run_label(record)} (`{directory}`)", name, "" if clean is None else f"{clean:.3f}"]
            cells += [f"{by_eps[e][key]:.3f}" if e in by_eps and key in by_eps[e] else "" for e in eps_values]
            lines.append("| " + " | ".join(cells) + " |")
    md = out_dir / OVERLAY_MD
    write_text(md, "\n".join(lines) + "\n")
    return [png, md]
