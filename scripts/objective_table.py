"""The equal-epsilon table of the training objectives (issue 66) from scripts/measure_recipe.sh's runs (markdown).

Rows: the two references (``none``: the frozen classifier alone under the smoothing noise; ``retrain``: the same
architecture trained with Gaussian noise augmentation at the same sigma on the public split, non-privately), the
recipe with each objective (``recipe_full`` is the MSE recipe), and the nodp arm with MSE and with other
objectives. Columns: certified accuracy at radii 0-1 and the average certified radius; the paired difference to
the MSE recipe at each radius with a 95% paired-bootstrap interval (10,000 resamples over images, seed 0; every
row is certified on the same images with the same per-image seeds); and at radius 0.5 the share of the gap from
the MSE recipe to the retrain reference that each trained row closes.

    python scripts/objective_table.py runs/objectives/fashion_s050_e1
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from certify.rundir import CertifyRecord, read_rows

RADII = (0.0, 0.25, 0.5, 0.75, 1.0)
BASELINE = "recipe_full"
LABELS = {
    "none": "reference: no denoiser (classifier alone)",
    "retrain": "reference: retrained with noise augmentation (non-private, public split)",
    "recipe_full": "recipe, mse (public MSE initialisation)",
    "recipe_stability": "recipe, stability",
    "recipe_classification": "recipe, classification",
    "recipe_stability_mse": "recipe, stability+mse (public MSE, then stability)",
    "nodp": "nodp, mse",
    "nodp_stability": "nodp, stability",
    "nodp_classification": "nodp, classification",
    "nodp_stability_mse": "nodp, stability+mse",
}


def epsilon_text(meta: dict | None) -> str:
    if meta is None:
        return "no private data"
    guarantees = {g["name"]: g for g in meta["privacy"].get("guarantees", [])}
    for name, label in (("sepdp", "DP-SGD, RDP"), ("sepdp_equivalent", "sepdp-equivalent, RDP")):
        if name in guarantees:
            return f"{guarantees[name]['epsilon']['rdp']:.3f} ({label})"
    return "none (nodp)"


def read_run(directory: Path, arm: str) -> dict | None:
    run = directory / "cert" / arm
    if not (run / "summary.json").is_file():
        return None
    summary = json.loads((run / "summary.json").read_text())
    meta_path = directory / "train" / arm / "metadata.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else None
    rows: dict[int, CertifyRecord] = {record.idx: record for record in read_rows(run / "certify.tsv", "certify")}
    used = summary.get("samples_per_image", {}).get("mean")
    return {"arm": arm, "epsilon": epsilon_text(meta), "acr": summary["average_certified_radius"],
            "images": summary["images"], "rows": rows, "samples": used, "n": summary["n"],
            "mode": summary.get("mode"), "cap": summary.get("max_certifiable_radius")}


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from certify.compare import BOOTSTRAP_RESAMPLES, bootstrap_picks, certified_matrix, paired_outcomes, points_cell

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="scripts/measure_recipe.sh's OUTDIR (train/ARM and cert/ARM)")
    args = parser.parse_args(argv)
    runs = {arm: r for arm in LABELS if (r := read_run(args.directory, arm)) is not None}
    if BASELINE not in runs:
        parser.error(f"{args.directory / 'cert' / BASELINE} has no summary.json: the MSE recipe is the baseline")
    base = runs[BASELINE]
    indices = sorted(base["rows"])
    for arm, r in runs.items():
        if sorted(r["rows"]) != indices:
            parser.error(f"{arm} is not certified on the MSE recipe's {len(indices)} images")
    matrix = {arm: certified_matrix(list(r["rows"].values()), RADII, indices) for arm, r in runs.items()}
    picks = bootstrap_picks(len(indices), BOOTSTRAP_RESAMPLES, seed=0)
    half = RADII.index(0.5)
    differences = {arm: paired_outcomes(matrix[arm], matrix[BASELINE], RADII, BOOTSTRAP_RESAMPLES, seed=0)
                   for arm in runs}
    print("| row | epsilon (delta 1e-5) | " + " | ".join(f"r={r:g}" for r in RADII) + " | ACR | "
          + "minus MSE recipe at r=0.5, points [95%] | share of the MSE-recipe-to-retrain gap closed at 0.5 [95%] |")
    print("|" + "---|" * (len(RADII) + 5))
    for arm, r in runs.items():
        diff = differences[arm]
        cell = "-" if arm == BASELINE else points_cell(diff.difference[half], diff.low[half], diff.high[half])
        share = ""
        if "retrain" in matrix and arm not in (BASELINE, "retrain", "none"):  # the objectives' rows
            ours = (matrix[arm][picks, half] - matrix[BASELINE][picks, half]).mean(axis=1)
            gap = (matrix["retrain"][picks, half] - matrix[BASELINE][picks, half]).mean(axis=1)
            point_gap = matrix["retrain"][:, half].mean() - matrix[BASELINE][:, half].mean()
            point = (matrix[arm][:, half].mean() - matrix[BASELINE][:, half].mean()) / point_gap if point_gap > 0 else 0
            if point_gap > 0 and (gap > 0).all():
                low, high = np.quantile(ours / gap, [0.025, 0.975])
                share = f"{point:.0%} [{low:.0%}, {high:.0%}]"
            elif point_gap > 0:  # a ratio over resampled gaps that reach 0 has no bounded interval
                share = f"{point:.0%} (no interval: the gap's own resamples reach 0)"
            else:
                share = "n/a (the retrain reference is not above the MSE recipe)"
        certified = matrix[arm].mean(axis=0)  # certified accuracy at each radius, from the same rows as the rest
        print(f"| {LABELS[arm]} | {r['epsilon']} | " + " | ".join(f"{c:.1%}" for c in certified)
              + f" | {r['acr']:.3f} | {cell} | {share} |")
    print(f"\n{base['images']} test images; paired differences at every radius (points, 95% paired bootstrap):\n")
    print("| row - MSE recipe | " + " | ".join(f"r={r:g}" for r in RADII) + " |")
    print("|" + "---|" * (len(RADII) + 1))
    for arm in runs:
        if arm == BASELINE:
            continue
        diff = differences[arm]
        print(f"| {LABELS[arm]} | " + " | ".join(points_cell(d, lo, hi) for d, lo, hi
                                                  in zip(diff.difference, diff.low, diff.high, strict=True)) + " |")
    print()
    for arm, r in runs.items():
        sampling = (f"adaptive estimate, n_max {r['n']:,}, mean {r['samples']:,.0f} samples per image"
                    if r["mode"] == "estimate" and r["samples"] is not None else f"n = {r['n']:,}")
        if isinstance(r["cap"], (int, float)):  # no image can certify beyond it: the columns past it read 0
            sampling += f", largest certifiable radius {r['cap']:.3f}"
        print(f"- {LABELS[arm]}: {sampling}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
