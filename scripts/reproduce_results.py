"""scripts/reproduce.py's results: certified accuracy and accuracy under attack read back from the run folders,
per seed and paired to sepdp (results.json)."""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path

from reproduce_common import DP_ARMS, FIGURE4_BOUND, OWN_CERTIFICATE, PAPER_EPSILON, Settings, read_json

# ---------------------------------------------------------------------------------------------------- results


def read_certify_rows(tsv: Path, *prefixes: str) -> list[list[dict]]:
    """Each image's radius and correctness from a certificate TSV, once per column prefix: ``""`` for certify.tsv's
    ``radius``/``correct``, ``"phan_"`` and ``"smooth_"`` for baseline_certify.tsv's two certificates."""
    lines = tsv.read_text().splitlines()
    header = lines[0].split("\t")
    values = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
    return [[{"radius": float(v[f"{prefix}radius"]), "correct": int(v[f"{prefix}correct"])} for v in values]
            for prefix in prefixes or ("",)]


def accuracy_by_radius(rows_per_seed: list[list[dict]], radii: list[float]) -> dict:
    """Certified accuracy at each radius: mean and range over the seeds' rows."""
    from certify.summary import certified_accuracy  # torch: imported only when results are read

    return {f"{r:g}": mean_and_range([certified_accuracy(rows, r) for rows in rows_per_seed]) for r in radii}


def mean_and_range(values: list[float]) -> dict:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return {"mean": None, "low": None, "high": None, "seeds": 0}
    return {"mean": sum(values) / len(values), "low": min(values), "high": max(values), "seeds": len(values)}


def attack_row(record: dict, eps: float) -> dict | None:
    """The row of an attack.json at L2 bound ``eps`` (0: the clean prediction), or None when it has no such bound."""
    if eps == 0:
        return record["clean"]
    return next((row for row in record["results"] if abs(row["eps"] - eps) < 1e-9), None)


def attack_accuracy(record: dict, eps: float) -> float | None:
    row = attack_row(record, eps)
    return None if row is None else row["smoothed_accuracy"]


def epsilons_of(meta: dict) -> dict:
    """Every epsilon the checkpoint's privacy report names (RDP upper bound), by guarantee name."""
    privacy = meta.get("privacy") or {}
    found = {}
    for guarantee in privacy.get("guarantees", []) or []:
        epsilon = guarantee.get("epsilon") or {}
        if isinstance(epsilon, dict) and epsilon.get("rdp") is not None:
            found[guarantee.get("name", "?")] = epsilon["rdp"]
    return found


def seed_folders(parent: Path, run: str) -> dict[int, Path]:
    """Training seed -> folder, for the folders RUN_sSEED under ``parent``."""
    found = {}
    for folder in parent.glob(f"{run}_s*"):
        match = re.fullmatch(rf"{re.escape(run)}_s(\d+)", folder.name)
        if match:
            found[int(match.group(1))] = folder
    return found


def paired_to_sepdp(root: Path, runs: list[str], radii: list[float]) -> dict:
    """Each run's certified accuracy minus sepdp's, paired over the same images at each training seed both have
    certified (the certify seed is the training seed, so each image's noise draws are shared too), with a 95%
    paired-bootstrap interval over images (certify.compare). A run's entry is its first common seed's, with
    ``per_seed`` (every common seed's) and, from two seeds on, ``between_seeds``: the mean of the seeds'
    differences and their min and max. A run on other images gets a note instead."""
    from certify.compare import paired_difference
    from certify.rundir import read_rows
    from transdenoiser.errors import UserError

    def seeds(run: str) -> dict[int, Path]:
        return {seed: folder for seed, folder in seed_folders(root / "certify", run).items()
                if (folder / "summary.json").exists()}

    @functools.cache
    def rows(folder: Path) -> list:  # sepdp's rows are read once per seed, not once per run
        return read_rows(folder / "certify.tsv", "certify")

    base = seeds("sepdp")
    paired: dict = {}
    for run in runs:
        mine = seeds(run) if run != "sepdp" else {}
        per_seed = []
        for seed in sorted(set(mine) & set(base)):
            try:
                difference = paired_difference(rows(mine[seed]), rows(base[seed]), radii)
            except UserError as exc:
                per_seed.append({"seed": seed, "note": str(exc)})
                continue
            per_seed.append({"seed": seed, **difference.as_dict()})
        if not per_seed:
            continue
        paired[run] = {**per_seed[0], "per_seed": per_seed}
        measured = [entry for entry in per_seed if "note" not in entry]
        if len(measured) > 1:
            columns = [mean_and_range(list(column))
                       for column in zip(*(entry["difference"] for entry in measured), strict=True)]
            paired[run]["between_seeds"] = {
                "seeds": [entry["seed"] for entry in measured], "radii": list(radii),
                **{key: [column[key] for column in columns] for key in ("mean", "low", "high")}}
    return paired


def attack_paired_to_sepdp(root: Path, runs: list[str], attacks: tuple[str, ...]) -> dict:
    """Each run's smoothed accuracy under each attack minus sepdp's, at every bound (0: clean), paired over the same
    images at the first training seed both have attacked, with a 95% paired-bootstrap interval over images. Only
    runs whose attack.json has each image's outcome (``smoothed_correct``) on sepdp's images take part."""
    from certify.compare import paired_outcomes

    def outcomes(run: str, name: str) -> dict[int, dict]:
        found = {}
        for seed, folder in seed_folders(root / "attack", run).items():
            record = read_json(folder / name / "attack.json")
            rows = [record["clean"], *record["results"]] if record else []
            if rows and all("smoothed_correct" in row for row in rows):
                found[seed] = {"indices": record["image_indices"], "bounds": [0.0] + [
                    row["eps"] for row in record["results"]], "correct": [row["smoothed_correct"] for row in rows]}
        return found

    paired: dict = {}
    for name in attacks:
        base = outcomes("sepdp", name)
        for run in runs:
            mine = outcomes(run, name) if run != "sepdp" else {}
            common = sorted(seed for seed in set(mine) & set(base) if mine[seed]["indices"] == base[seed]["indices"]
                            and mine[seed]["bounds"] == base[seed]["bounds"])
            if not common:
                continue
            seed = common[0]
            ours, theirs = (list(zip(*entry[seed]["correct"], strict=True)) for entry in (mine, base))
            entry = paired_outcomes(ours, theirs, mine[seed]["bounds"]).as_dict()
            entry["bounds"] = entry.pop("radii")  # the attack's L2 bounds (0: clean)
            paired.setdefault(run, {})[name] = {"seed": seed, **entry}
    return paired


def collect(root: Path, settings: Settings) -> dict:
    """Everything the figures and tables show, read back from the runs' files."""
    result: dict = {"dataset": root.name, "certify": {}, "attack": {}, "figure4": {}, "training": {}}
    radii = [0.0, 0.25, 0.5, 0.75, 1.0]
    for run in ("none", *settings.runs):
        per_seed = sorted((root / "certify").glob(f"{run}_s*")) if (root / "certify").exists() else []
        per_seed = [p for p in per_seed if re.fullmatch(rf"{re.escape(run)}_s\d+", p.name)
                    and (p / "summary.json").exists()]
        if not per_seed:
            continue
        rows = [read_certify_rows(p / "certify.tsv")[0] for p in per_seed]
        summaries = [read_json(p / "summary.json") or {} for p in per_seed]
        result["certify"][run] = {
            "images": [len(r) for r in rows],
            "sigma": summaries[0].get("sigma"),
            "certified_accuracy": accuracy_by_radius(rows, radii),
            "acr": mean_and_range([s.get("average_certified_radius") for s in summaries]),
            "abstention": mean_and_range([s.get("abstention_rate") for s in summaries]),
            "runs": [str(p) for p in per_seed], "rows": rows,
        }
        train_dirs = [root / "train" / p.name for p in per_seed]
        metas = [read_json(d / "metadata.json") or {} for d in train_dirs if (d / "metadata.json").exists()]
        if metas:
            accuracies = [(m.get("metrics") or [{}])[-1].get("accuracy_denoised") for m in metas]
            result["training"][run] = {"accuracy_denoised": mean_and_range(accuracies),
                                       "epsilons": [epsilons_of(m) for m in metas]}
    result["paired"] = paired_to_sepdp(root, [run for run in ("none", *settings.runs) if run in result["certify"]],
                                       radii)
    for run in settings.runs:
        per_seed = sorted((root / "baseline_certify").glob(f"{run}_s*")) if (root / "baseline_certify").exists() else []
        # per seed: the baseline's own certificate, randomized smoothing of the same randomised model
        both = [read_certify_rows(folder / "baseline_certify.tsv", "phan_", "smooth_") for folder in per_seed
                if (folder / "baseline_certify.tsv").exists()]
        if both:
            rows, smoothed = [own for own, _ in both], [smooth for _, smooth in both]
            result.setdefault("baseline_certify", {})[run] = {
                "images": [len(r) for r in rows], "rows": rows, "certificate": OWN_CERTIFICATE.get(run, ""),
                "certified_accuracy": accuracy_by_radius(rows, radii),
                "smoothing_certified_accuracy": accuracy_by_radius(smoothed, radii)}
    for run in ("none", *settings.runs):
        base = root / "attack"
        if not base.exists():
            continue
        for name in settings.attacks:
            records = [read_json(p / name / "attack.json") for p in sorted(base.glob(f"{run}_s*"))
                       if re.fullmatch(rf"{re.escape(run)}_s\d+", p.name)]
            records = [r for r in records if r]
            if not records:
                continue
            eps = [0.0, *sorted({row["eps"] for r in records for row in r["results"]})]
            result["attack"].setdefault(run, {})[name] = {
                f"{e:g}": mean_and_range([attack_accuracy(r, e) for r in records]) for e in eps}
            result["attack"][run][name]["images"] = records[0]["num_images"]
    if (root / "attack").exists():
        result["attack_paired"] = attack_paired_to_sepdp(root, ["none", *settings.runs], settings.attacks)
    figure4_point = functools.lru_cache(maxsize=None)(functools.partial(figure4_record, root))  # read once each
    for arm in (*DP_ARMS, "nodp"):
        if arm not in settings.runs or (arm != "nodp" and arm not in settings.figure4_arms):
            continue
        for name in settings.figure4_attacks:
            points = {}
            for epsilon in settings.epsilons if arm != "nodp" else (None,):
                records = [figure4_point(arm, epsilon, seed, name) for seed in range(settings.seeds)]
                values = [attack_accuracy(record, FIGURE4_BOUND) for record in records if record]
                if values:
                    points["none" if epsilon is None else f"{epsilon:g}"] = mean_and_range(values)
            if points:
                result["figure4"].setdefault(arm, {})[name] = points
    if result["figure4"]:
        result["figure4_paired"] = figure4_paired_to_sepdp(root, settings, figure4_point)
    return result


def figure4_record(root: Path, arm: str, epsilon: float | None, seed: int, name: str) -> dict | None:
    """The attack.json behind one point of Figure 4 (``arm`` at ``epsilon``, training seed ``seed``, attack
    ``name``), or None: at the paper's epsilon (and for nodp, ``epsilon`` None) the paper-setting run's attack,
    else the run trained with ``--target-epsilon epsilon``; only a record that has the bound FIGURE4_BOUND."""
    if epsilon is None or epsilon == PAPER_EPSILON:
        candidates = [root / "attack" / f"{arm}_s{seed}" / name, root / "eps" / f"{arm}_eps1_s{seed}_attack_{name}",
                      root / "eps" / f"{arm}_s{seed}_attack_{name}"]
    else:
        candidates = [root / "eps" / f"{arm}_eps{epsilon:g}_s{seed}" / f"attack_{name}"]
    for candidate in candidates:
        record = read_json(candidate / "attack.json")
        if record and attack_accuracy(record, FIGURE4_BOUND) is not None:
            return record
    return None


def figure4_paired_to_sepdp(root: Path, settings: Settings, point=None) -> dict:
    """Figure 4's error bars: each DP arm's accuracy at bound FIGURE4_BOUND minus sepdp's at the same epsilon,
    paired over the same images at one training seed (the first at which both have a point), with a 95%
    paired-bootstrap interval over images; one column per epsilon both have. Only points whose attack.json records
    each image's outcome (``smoothed_correct``) take part. ``point(arm, epsilon, seed, attack)`` finds a point's
    attack.json (default: ``figure4_record`` under ``root``; ``collect`` passes the lookup it has read them with)."""
    from certify.compare import paired_outcomes

    point = point or functools.partial(figure4_record, root)

    def outcome(arm: str, epsilon: float, seed: int, name: str) -> tuple[list, list] | None:
        record = point(arm, epsilon, seed, name)
        row = attack_row(record, FIGURE4_BOUND) if record else None
        if row is None or "smoothed_correct" not in row:
            return None
        return list(record["image_indices"]), list(row["smoothed_correct"])

    def pair(arm: str, name: str, seed: int) -> dict | None:
        """``arm`` minus sepdp at every epsilon where both ran on the same images as the first epsilon taken."""
        columns, ours, theirs, images = [], [], [], None
        for epsilon in settings.epsilons:
            mine, base = outcome(arm, epsilon, seed, name), outcome("sepdp", epsilon, seed, name)
            if mine and base and mine[0] == base[0] and (not columns or mine[0] == images):
                images = mine[0]  # every column pairs the same images, so the bootstrap resamples them
                columns.append(epsilon)
                ours.append(mine[1])
                theirs.append(base[1])
        if not columns:
            return None
        entry = paired_outcomes(list(zip(*ours, strict=True)), list(zip(*theirs, strict=True)), columns).as_dict()
        entry["epsilons"] = entry.pop("radii")
        return {"seed": seed, **entry}

    paired: dict = {}
    for arm in DP_ARMS:
        if arm == "sepdp" or arm not in settings.runs or arm not in settings.figure4_arms:
            continue
        for name in settings.figure4_attacks:
            entry = next(filter(None, (pair(arm, name, seed) for seed in range(settings.seeds))), None)
            if entry:
                paired.setdefault(arm, {})[name] = entry
    return paired
