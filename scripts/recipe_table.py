"""The ablation table of scripts/measure_recipe.sh's runs (markdown), from each arm's released metadata and its
certification summary: accuracy of the frozen classifier on g(x + noise), the epsilon and what it rests on,
certified accuracy at radii 0-1, average certified radius, and the share of the sepdp-to-nodp gap closed at 0.5.

    python scripts/recipe_table.py runs/recipe/fashion_s050_e1
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

RADII = (0.0, 0.25, 0.5, 0.75, 1.0)
LABELS = {
    "nodp": "nodp (Adam 1e-3)", "sepdp": "sepdp, paper setting", "transdenoiser": "transdenoiser, paper setting",
    "sepdp_init": "sepdp + public initialisation (item 1)", "sepdp_draws": "sepdp + noise draws K = 4 (item 2)",
    "td_merged": "transdenoiser + merged uncredited noise (item 3)", "sepdp_recipe": "sepdp + tuned recipe (item 4)",
    "recipe_full": "new recipe: public initialisation + tuned recipe (items 1, 4)",
}
ORDER = list(LABELS)


def epsilon_text(privacy: dict) -> str:
    guarantees = {g["name"]: g for g in privacy.get("guarantees", [])}
    names = (("sepdp", "DP-SGD"), ("sepdp_equivalent", "sepdp-equivalent"), ("mmga", "MMGA, data-dependent"))
    for name, label in names:
        if name in guarantees:
            return f"{guarantees[name]['epsilon']['rdp']:.3f} ({label})"
    return "none"


def row(directory: Path, arm: str) -> dict | None:
    summary_path, meta_path = directory / "cert" / arm / "summary.json", directory / "train" / arm / "metadata.json"
    if not summary_path.is_file() or not meta_path.is_file():
        return None
    summary, meta = json.loads(summary_path.read_text()), json.loads(meta_path.read_text())
    table = {round(r["radius"], 2): r["certified_accuracy"] for r in summary["certified_accuracy"]}
    return {"arm": arm, "accuracy": meta["metrics"][-1]["accuracy_denoised"], "epsilon": epsilon_text(meta["privacy"]),
            "certified": [table.get(r, 0.0) for r in RADII], "acr": summary["average_certified_radius"],
            "images": summary["images"], "n": summary["n"], "config": meta["config"]}


def main(directory: str) -> int:
    directory = Path(directory)
    rows = [r for r in (row(directory, arm) for arm in ORDER) if r is not None]
    by_arm = {r["arm"]: r for r in rows}
    header = ("| arm | acc. on g(x+noise), test | epsilon (RDP, delta 1e-5) | "
              + " | ".join(f"cert. acc. r={r:g}" for r in RADII) + " | ACR | gap closed at 0.5 |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    low, high = by_arm.get("sepdp"), by_arm.get("nodp")
    for r in rows:
        closed = ""
        if low and high and r["arm"] not in ("nodp", "sepdp"):
            gap = high["certified"][2] - low["certified"][2]
            closed = f"{(r['certified'][2] - low['certified'][2]) / gap:.0%}" if gap > 0 else "n/a (no gap)"
        print(f"| {LABELS[r['arm']]} | {r['accuracy']:.2%} | {r['epsilon']} | "
              + " | ".join(f"{c:.1%}" for c in r["certified"]) + f" | {r['acr']:.3f} | {closed} |")
    if rows:
        print(f"\n{rows[0]['images']} test images, n = {rows[0]['n']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
