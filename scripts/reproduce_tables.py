"""scripts/reproduce.py's outputs: tables.md, the figures (2, 3, 4 and 7) and the commits that made them."""
from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from reproduce_common import (
    ABLATION_RUNS,
    ATTACK_NAMES,
    BASELINE_RUNS,
    FIGURE4_BOUND,
    LABELS,
    REPO,
    Settings,
    flag_value,
    number,
    step_lines,
)
from reproduce_results import collect


def percent(entry: dict | None) -> str:
    if not entry or entry.get("mean") is None:
        return "-"
    text = f"{100 * entry['mean']:.1f}"
    if entry["seeds"] > 1:
        text += f" ({100 * entry['low']:.1f}-{100 * entry['high']:.1f})"
    return text


def write_tables(result: dict, path: Path, settings: Settings, header: str) -> None:
    from certify.compare import points_cell, points_cells

    lines = [f"# Reproduction of the TransDenoiser paper's Section 3.2 on {result['dataset']}", "", header, ""]
    most = max([len(entry["images"]) for entry in result["certify"].values()] + [settings.seeds])
    seeds_note = (f"Each cell is the mean over the training seeds that have run, up to {most} (min-max in "
                  "brackets when more than one)."
                  if most > 1 else "One training seed per arm.")
    lines += ["## Figure 2: certified accuracy (%) against L2 radius", "", seeds_note, "",
              "| run | images | r = 0 | 0.25 | 0.5 | 0.75 | 1.0 | ACR | abstained |",
              "|---|---|---|---|---|---|---|---|---|"]
    for run, entry in result["certify"].items():
        acc = entry["certified_accuracy"]
        acr = entry["acr"]["mean"]
        lines.append(f"| {LABELS.get(run, run)} (sigma {entry['sigma']:g}) | {entry['images'][0]} | "
                     + " | ".join(percent(acc[k]) for k in ("0", "0.25", "0.5", "0.75", "1"))
                     + f" | {acr:.3f} | {percent(entry['abstention'])} |")
    if result.get("paired"):
        lines += ["", "Each run minus sepdp in certified accuracy (points), paired over the same images at each "
                  "training seed both have certified (each image's noise draws shared), with a 95% paired-bootstrap "
                  "interval over images (10,000 resamples): an interval that includes 0 means these images do not "
                  "tell the two apart. It says nothing of the variation between training seeds.", "",
                  "| run - sepdp | seed | images | r = 0 | 0.25 | 0.5 | 0.75 | 1.0 |",
                  "|---|---|---|---|---|---|---|---|"]
        for run, first in result["paired"].items():
            for entry in first["per_seed"]:
                if "note" in entry:
                    lines.append(f"| {LABELS.get(run, run)} | {entry['seed']} | - | {entry['note']} | | | | |")
                    continue
                lines.append(f"| {LABELS.get(run, run)} | {entry['seed']} | {entry['images']} | "
                             + " | ".join(points_cells(entry)) + " |")
        between = {run: entry["between_seeds"] for run, entry in result["paired"].items() if "between_seeds" in entry}
        if between:
            lines += ["", "Between training seeds: the mean of the paired differences above over the seeds, [min, "
                      "max] over the seeds (points). The spread is that of the training seeds together with each "
                      "seed's certification noise; with a few seeds it is a range, not a confidence interval.", "",
                      "| run - sepdp | seeds | r = 0 | 0.25 | 0.5 | 0.75 | 1.0 |", "|---|---|---|---|---|---|---|"]
            for run, entry in between.items():
                cells = [points_cell(*cell) for cell in zip(entry["mean"], entry["low"], entry["high"], strict=True)]
                lines.append(f"| {LABELS.get(run, run)} | {', '.join(map(str, entry['seeds']))} | "
                             + " | ".join(cells) + " |")
    if result.get("baseline_certify"):
        lines += ["", "The baselines' own certificates (`transdenoiser baseline-certify`, same images: Phan et al. "
                  "2019's bound for SecureSGD, StoBatch's own for StoBatch), each beside randomized smoothing of the "
                  "same randomised model (abstentions count as wrong):",
                  "", "| run | images | r = 0 | 0.25 | 0.5 | 0.75 | 1.0 |", "|---|---|---|---|---|---|---|"]
        for run, entry in result["baseline_certify"].items():
            for name, acc in ((entry["certificate"], entry["certified_accuracy"]),
                              ("randomized smoothing of the randomised model",
                               entry["smoothing_certified_accuracy"])):
                lines.append(f"| {LABELS.get(run, run)}, {name} | {entry['images'][0]} | "
                             + " | ".join(percent(acc[k]) for k in ("0", "0.25", "0.5", "0.75", "1")) + " |")
    if result["training"]:
        lines += ["", "## The trained arms", "",
                  "| run | classifier accuracy on g(x + noise) (%) | epsilon at delta 1e-5 (RDP), per analysis "
                  "named in the report |",
                  "|---|---|---|"]
        for run, entry in result["training"].items():
            eps = "; ".join(", ".join(f"{k} {number(v)}" for k, v in e.items()) for e in entry["epsilons"][:1])
            lines.append(f"| {LABELS.get(run, run)} | {percent(entry['accuracy_denoised'])} | {eps or 'none'} |")
    for figure, names in (("7", ("fgsm", "ifgsm")), ("3", ("mim", "pgd"))):
        present = [n for n in names if any(n in a for a in result["attack"].values())]
        if not present:
            continue
        lines += ["", f"## Figure {figure}: accuracy (%) of the smoothed prediction under attack, by L2 bound", "",
                  f"Threat `{settings.threat}`; abstain = wrong; bound 0 = clean examples.", ""]
        for name in present:
            eps_keys = sorted({k for a in result["attack"].values() if name in a for k in a[name] if k != "images"},
                              key=float)
            lines += [f"**{ATTACK_NAMES[name]}**", "", "| run | images | " + " | ".join(eps_keys) + " |",
                      "|---|---|" + "---|" * len(eps_keys)]
            for run, per_attack in result["attack"].items():
                if name in per_attack:
                    lines.append(f"| {LABELS.get(run, run)} | {per_attack[name]['images']} | "
                                 + " | ".join(percent(per_attack[name].get(k)) for k in eps_keys) + " |")
            lines.append("")
            paired = {run: entry[name] for run, entry in (result.get("attack_paired") or {}).items() if name in entry}
            if paired:
                bounds = next(iter(paired.values()))["bounds"]
                lines += [f"{ATTACK_NAMES[name]}, each run minus sepdp (points; paired over the same images at one "
                          "training seed, 95% paired-bootstrap interval over images):", "",
                          "| run - sepdp | seed | images | " + " | ".join(f"{b:g}" for b in bounds) + " |",
                          "|---|---|---|" + "---|" * len(bounds)]
                for run, entry in paired.items():
                    lines.append(f"| {LABELS.get(run, run)} | {entry['seed']} | {entry['images']} | "
                                 + " | ".join(points_cells(entry)) + " |")
                lines.append("")
    if result["figure4"]:
        lines += ["", f"## Figure 4: accuracy (%) under attack at L2 bound {FIGURE4_BOUND:g} against epsilon", "",
                  "Each DP arm trained with `--target-epsilon E` (delta 1e-5); nodp has no epsilon.", ""]
        for name in settings.figure4_attacks:
            keys = [f"{e:g}" for e in settings.epsilons]
            lines += [f"**{ATTACK_NAMES[name]}**", "", "| arm | " + " | ".join(f"eps {k}" for k in keys) + " |",
                      "|---|" + "---|" * len(keys)]
            for arm, per_attack in result["figure4"].items():
                if name in per_attack:
                    points = per_attack[name]
                    cells = [percent(points.get("none")) for _ in keys] if arm == "nodp" else \
                        [percent(points.get(k)) for k in keys]
                    lines.append(f"| {LABELS.get(arm, arm)} | " + " | ".join(cells) + " |")
            lines.append("")
            paired = {arm: entry[name] for arm, entry in (result.get("figure4_paired") or {}).items()
                      if name in entry}
            if paired:
                lines += [f"{ATTACK_NAMES[name]} at bound {FIGURE4_BOUND:g}, each arm minus sepdp at the same epsilon "
                          "(points; paired over the same images at one training seed, 95% paired-bootstrap interval "
                          "over images):", "", "| arm - sepdp | seed | images | "
                          + " | ".join(f"eps {k}" for k in keys) + " |", "|---|---|---|" + "---|" * len(keys)]
                for arm, entry in paired.items():
                    by_epsilon = dict(zip((f"{e:g}" for e in entry["epsilons"]), points_cells(entry), strict=True))
                    lines.append(f"| {LABELS.get(arm, arm)} | {entry['seed']} | {entry['images']} | "
                                 + " | ".join(by_epsilon.get(k, "-") for k in keys) + " |")
                lines.append("")
    path.write_text("\n".join(lines) + "\n")


def plot_figures(result: dict, folder: Path, settings: Settings) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from certify.summary import certified_accuracy
    from transdenoiser.pngs import save_png

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    dataset = result["dataset"]
    if result["certify"]:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        top = max((r["radius"] for e in result["certify"].values() for rows in e["rows"] for r in rows), default=1.0)
        grid = [top * 1.05 * i / 200 for i in range(201)]
        for ax, group, title in ((axes[0], BASELINE_RUNS, "(a) TransDenoiser and baselines"),
                                 (axes[1], ("none", *ABLATION_RUNS), "(b) ablations")):
            for run in group:
                entry = result["certify"].get(run)
                if not entry:
                    continue
                curves = [[certified_accuracy(rows, r) for r in grid] for rows in entry["rows"]]
                mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(grid))]
                line, = ax.plot(grid, mean, label=f"{LABELS.get(run, run)} (sigma {entry['sigma']:g})",
                                linestyle="--" if run == "none" else "-")
                own = result.get("baseline_certify", {}).get(run)
                if own and group is BASELINE_RUNS:
                    own_curves = [[certified_accuracy(rows, r) for r in grid] for rows in own["rows"]]
                    ax.plot(grid, [sum(c[i] for c in own_curves) / len(own_curves) for i in range(len(grid))],
                            color=line.get_color(), linestyle=":",
                            label=f"{LABELS.get(run, run)}: {own['certificate']}")
                if len(curves) > 1:
                    ax.fill_between(grid, [min(c[i] for c in curves) for i in range(len(grid))],
                                    [max(c[i] for c in curves) for i in range(len(grid))],
                                    color=line.get_color(), alpha=0.2)
            ax.set_title(title)
            ax.set_xlabel("L2 radius")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        axes[0].set_ylabel("certified accuracy")
        fig.suptitle(f"Figure 2 ({dataset}): certified accuracy against L2 radius")
        fig.tight_layout()
        written.append(folder / "figure2.png")
        save_png(fig, written[-1], dpi=110)
        plt.close(fig)
    for figure, names in (("7", ("fgsm", "ifgsm")), ("3", ("mim", "pgd"))):
        names = [n for n in names if any(n in a for a in result["attack"].values())]
        if not names:
            continue
        fig, axes = plt.subplots(len(names), 2, figsize=(11, 3.6 * len(names)), sharey=True, squeeze=False)
        for row, name in enumerate(names):
            for col, (group, title) in enumerate(((BASELINE_RUNS, "baselines"), (ABLATION_RUNS, "ablations"))):
                ax = axes[row][col]
                clean = None
                for run in group:
                    entry = result["attack"].get(run, {}).get(name)
                    if not entry:
                        continue
                    keys = sorted((k for k in entry if k not in ("images", "0")), key=float)
                    xs = [float(k) for k in keys]
                    means = [entry[k]["mean"] for k in keys]
                    line, = ax.plot(xs, means, marker="o", label=LABELS.get(run, run))
                    if entry[keys[0]]["seeds"] > 1:
                        ax.fill_between(xs, [entry[k]["low"] for k in keys], [entry[k]["high"] for k in keys],
                                        color=line.get_color(), alpha=0.2)
                    if run == "transdenoiser":
                        clean = (xs, entry["0"]["mean"])
                if clean:
                    ax.plot(clean[0], [clean[1]] * len(clean[0]), color="black", linestyle=":",
                            label="Clean examples (TransDenoiser)")
                ax.set_title(f"{ATTACK_NAMES[name]}: {title}")
                ax.set_xlabel("attack L2 bound")
                ax.grid(alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=8)
            axes[row][0].set_ylabel("accuracy (smoothed)")
        fig.suptitle(f"Figure {figure} ({dataset}): accuracy under attack (threat {settings.threat})")
        fig.tight_layout()
        written.append(folder / f"figure{figure}.png")
        save_png(fig, written[-1], dpi=110)
        plt.close(fig)
    if result["figure4"]:
        names = [n for n in settings.figure4_attacks if any(n in a for a in result["figure4"].values())]
        fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), sharey=True, squeeze=False)
        for ax, name in zip(axes[0], names, strict=False):
            for arm, per_attack in result["figure4"].items():
                points = per_attack.get(name)
                if not points:
                    continue
                if arm == "nodp":
                    value = points["none"]["mean"]
                    ax.axhline(value, color="grey", linestyle="--", label=LABELS["nodp"])
                    continue
                keys = sorted(points, key=float)
                xs = [float(k) for k in keys]
                line, = ax.plot(xs, [points[k]["mean"] for k in keys], marker="o", label=LABELS.get(arm, arm))
                if any(points[k]["seeds"] > 1 for k in keys):
                    ax.fill_between(xs, [points[k]["low"] for k in keys], [points[k]["high"] for k in keys],
                                    color=line.get_color(), alpha=0.2)
            ax.set_xscale("log")
            ax.set_title(f"{ATTACK_NAMES[name]}, L2 bound {FIGURE4_BOUND:g}")
            ax.set_xlabel("epsilon (delta 1e-5)")
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        axes[0][0].set_ylabel("accuracy (smoothed)")
        fig.suptitle(f"Figure 4 ({dataset}):\naccuracy under attack against epsilon")
        fig.tight_layout()
        written.append(folder / "figure4.png")
        save_png(fig, written[-1], dpi=110)
        plt.close(fig)
    return written


def step_commits(steps: Path, dataset: str, field: str = "commit", having: str | None = None) -> list[str]:
    """The commits (in first-run order) that the successful steps of ``dataset`` recorded in ``steps`` (or in its
    gzip copy ``steps.jsonl.gz``: :func:`step_lines`); with ``field="hardware"``, the hardware they ran on
    (``field="name"``: the steps; ``having``: only steps that recorded that field)."""
    try:
        lines = step_lines(steps)
    except OSError:
        return []
    commits: list[str] = []
    for line in lines:
        try:
            step = json.loads(line)
        except ValueError:
            continue
        commit = step.get(field)
        if having and not step.get(having):
            continue
        if commit and step.get("exit") == 0 and str(step.get("name", "")).startswith(f"{dataset}:") \
                and commit not in commits:
            commits.append(commit)
    return commits


def default_datasets(quick: bool) -> str:
    """The data sets a mode runs when --datasets is not given."""
    return "mnist10k" if quick else "mnist10k,fashion-mnist"


def command_datasets(line: str) -> list[str]:
    """The data sets a ``scripts/reproduce.sh`` command line of commands.txt ran (lines argparse accepted): its
    ``--datasets``, else its mode's default. A figure's header names only the commands that ran its data set's
    steps."""
    try:
        words = shlex.split(line)
    except ValueError:
        return []
    given = next((word.split("=", 1)[1] for word in words if word.startswith("--datasets=")),
                 flag_value(words, "--datasets"))
    return (given or default_datasets("--quick" in words)).split(",")


def write_results(root: Path, settings: Settings, command: str) -> list[Path]:
    import torch

    from transdenoiser.runtime import hardware_description

    result = collect(root, settings)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    ran_at = step_commits(root.parent / "steps.jsonl", root.name)
    ran_on = step_commits(root.parent / "steps.jsonl", root.name, "hardware")
    unrecorded = (len(step_commits(root.parent / "steps.jsonl", root.name, "name"))
                  - len(step_commits(root.parent / "steps.jsonl", root.name, "name", having="hardware")))
    hardware = ("; ".join(ran_on) if ran_on  # else the steps predate the record: say whose hardware this is
                else f"{hardware_description(torch.device('cpu'))} (of this drawing; the steps did not record theirs)")
    if ran_on and unrecorded:
        hardware += f" ({unrecorded} earlier steps did not record theirs)"
    shown = command if command.startswith("`") else f"`{command}`"  # --figures-only: the commands that ran
    header = (f"{'Commands' if '`; `' in shown else 'Command'}: {shown} ({settings.mode} mode). Hardware: {hardware}. "
              f"Commit: {commit}" + (f" (steps run at {', '.join(ran_at)})" if ran_at else "")
              + f". Certification: {settings.images} images requested, n0 {settings.n0}, "
              + (f"n {settings.n}" if settings.n else f"adaptive, n_max {settings.n_max}")
              + f", alpha {settings.alpha:g}. Attacks: {settings.attack_images} images requested, "
              f"{settings.attack_steps}"
              f" steps, smoothed prediction n {settings.attack_n}.")
    figures = plot_figures(result, root / "figures", settings)
    write_tables(result, root / "tables.md", settings, header)
    slim = json.loads(json.dumps(result, default=str))
    for entry in (*slim["certify"].values(), *slim.get("baseline_certify", {}).values()):
        entry.pop("rows", None)
    (root / "results.json").write_text(json.dumps({"header": header, "commit": commit, **slim}, indent=1) + "\n")
    return [*figures, root / "tables.md", root / "results.json"]
