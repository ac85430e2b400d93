"""scripts/reproduce.py's exports: the files its figures and tables rest on (``--export``) and the summaries the
docs keep (``--summaries``); and its wall-time estimate (``--estimate-from``)."""
from __future__ import annotations

import re
from pathlib import Path

from reproduce_common import flag_value, read_json

# ---------------------------------------------------------------------------------------------------- export

# The files a run's figures and tables are drawn from, and the record of how they were made: released metadata and
# privacy reports, certification rows, attack outcomes, settings, the steps' log. Never weights (the nodp arm's
# would reveal its private data) and never a checkpoint's private/ record.
EXPORTED_NAMES = frozenset({
    "metadata.json", "privacy_report.txt", "certify.tsv", "summary.json", "settings.json", "models.json",
    "report.md", "baseline_certify.tsv", "baseline_certify.settings.json", "attack.json", "attack.tsv",
    "tables.md", "results.json", "steps.jsonl", "commands.txt"})
EXPORTED_SUFFIXES = (".png",)
NEVER_EXPORTED_FOLDERS = frozenset({"private"})
# The summaries the docs keep (docs/results/reproduce_full): per data set its tables and figures, and the run's logs.
SUMMARY_FILES = ("tables.md", "results.json")
SUMMARY_STEPS = "steps.jsonl.gz"


def export_results(out: Path, dest: Path) -> list[Path]:
    """Copy what the figures and tables of the run under ``out`` rest on into ``dest``, in the same layout, so
    that ``--figures-only --out DEST`` redraws them and an auditor can recount every number; return the files
    copied. ``dest`` must not be inside ``out`` nor hold a run of its own."""
    import shutil

    out, dest = out.resolve(), dest.resolve()
    if dest == out or out in dest.parents:
        raise ValueError(f"--export {dest}: must not be the run's folder {out} or inside it")
    if any((dest / name).exists() for name in ("steps.jsonl", SUMMARY_STEPS)) and not (dest / ".exported").exists():
        raise ValueError(f"--export {dest}: holds a run of its own or its summaries (steps.jsonl); choose another "
                         "folder")
    copied = []
    for path in sorted(out.rglob("*")):
        relative = path.relative_to(out)
        if not path.is_file() or path.is_symlink() or NEVER_EXPORTED_FOLDERS & set(relative.parts[:-1]):
            continue
        if path.name not in EXPORTED_NAMES and not path.name.endswith(EXPORTED_SUFFIXES):
            continue
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        copied.append(target)
    (dest / ".exported").write_text(f"exported from {out} by scripts/reproduce.sh --export\n")
    return copied


def export_summaries(out: Path, dest: Path) -> list[Path]:
    """Write the summaries the docs keep of the run under ``out`` into ``dest`` (the layout of
    docs/results/reproduce_full) and return them: per data set ``D/tables.md``, ``D/results.json`` and
    ``D/figures/*.png`` (as palette PNGs), the run's ``commands.txt``, and its ``steps.jsonl`` as
    ``steps.jsonl.gz`` (gzip, no timestamp: the same log gives the same bytes; every reader of the log reads
    either). Not the per-run files (``--export``): ``--figures-only`` cannot redraw from ``dest``."""
    import gzip

    from transdenoiser.pngs import palette_png

    out, dest = out.resolve(), dest.resolve()
    if dest == out or out in dest.parents:
        raise ValueError(f"--summaries {dest}: must not be the run's folder {out} or inside it")
    if (dest / "steps.jsonl").exists():
        raise ValueError(f"--summaries {dest}: holds a run or an export of its own (steps.jsonl); choose another "
                         "folder")
    written: list[Path] = []

    def write(relative: Path, data: bytes) -> None:
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append(target)

    for tables in sorted(out.glob(f"*/{SUMMARY_FILES[0]}")):
        folder = tables.parent
        for name in SUMMARY_FILES:
            if (folder / name).is_file():
                write(Path(folder.name, name), (folder / name).read_bytes())
        for png in sorted((folder / "figures").glob("*.png")):
            write(Path(folder.name, "figures", png.name), palette_png(png.read_bytes()))
    if (out / "commands.txt").is_file():
        write(Path("commands.txt"), (out / "commands.txt").read_bytes())
    write(Path(SUMMARY_STEPS), gzip.compress((out / "steps.jsonl").read_bytes(), compresslevel=9, mtime=0))
    return written


# ---------------------------------------------------------------------------------------------------- estimate


def estimate(plan: list[dict], *measured: list[dict]) -> dict:
    """Wall time of the steps of ``plan`` (dry-run steps) not yet done, from the per-unit rates of ``measured`` steps
    (the lines of one or more steps.jsonl files). A kind of step takes its median rate from the first file that
    measured it, so a run's own rates come before those of another scale or machine load. A step that resumed an
    interrupted one logs only its own part of the time: a certification that recorded how many images it found
    done (``images_before``) gives the rate of the images it did, any other resumed step gives none."""
    def units(work: dict) -> float:
        kind = work.get("kind")
        if kind == "pretrain":
            return work["images"] * work["epochs"]
        if kind == "train":
            return work["examples"] * work["epochs"]
        if kind in ("certify", "baseline-certify"):
            return work["images"] * work["samples_per_image"]
        if kind == "attack":  # each bound, and the clean smoothed prediction every attack run makes first
            return work["images"] * (work["eps"] + 1)
        return 1.0

    def key(work: dict) -> tuple:
        kind = work.get("kind")
        if kind == "train":
            return (kind, work["arm"])
        if kind == "attack":
            return (kind, work["attack"], work["threat"], work["denoiser"])
        if kind == "certify":  # the adaptive mode stops early: its rate per budgeted sample is its own
            return (kind, bool(work.get("adaptive")))
        if kind == "baseline-certify":  # each baseline's own certificate runs its own model (StoBatch's is slower)
            return (kind, work.get("arm"))
        return (kind,)

    rates: dict[tuple, list[float]] = {}
    for steps in measured:
        found: dict[tuple, list[float]] = {}
        for step in steps:
            done_here = units(step["work"]) if step.get("exit") == 0 else 0.0
            if step.get("resumed"):
                images, before = step["work"].get("images"), step.get("images_before")
                done_here = done_here * (images - before) / images if images and before is not None else 0.0
            if step["seconds"] > 0 and done_here > 0:
                found.setdefault(key(step["work"]), []).append(step["seconds"] / done_here)
        for kind, per_unit in found.items():
            rates.setdefault(kind, per_unit)
    total, missing, by_kind = 0.0, [], {}
    for step in plan:
        if step["done"]:
            continue
        per_unit = rates.get(key(step["work"]))
        if not per_unit and step["work"].get("kind") == "certify":  # the other sampling's rate: better than none
            per_unit = next((v for k, v in rates.items() if k[0] == "certify"), None)
        if not per_unit:
            missing.append(step["name"])
            continue
        seconds = sorted(per_unit)[len(per_unit) // 2] * units(step["work"])
        total += seconds
        by_kind[step["work"]["kind"]] = by_kind.get(step["work"]["kind"], 0.0) + seconds
    return {"seconds": total, "by_kind": by_kind, "steps": len(plan),
            "to_do": sum(not step["done"] for step in plan), "not_estimated": missing}


def recorded_seconds(step: dict, steps_file: Path) -> float | None:
    """The wall seconds a finished certification step's own files record for all its images, summed over the runs
    it resumed (``certify.tsv``'s ``time`` column; ``baseline-certify``'s ``summary.json``), or None if they are not
    found or do not cover every image. Its folder is looked for beside ``steps_file`` (an export, or the run's own
    folder: the part of the step's ``--out`` from its data set's folder on), then at the ``--out`` it ran with.
    Unlike the step's logged seconds, this counts the images an interrupted run had done before it resumed (and
    leaves out the seconds of loading the models)."""
    work, out = step.get("work", {}), flag_value(step.get("argv", []), "--out")
    kind, dataset, images = work.get("kind"), work.get("dataset"), work.get("images")
    if kind not in ("certify", "baseline-certify") or out is None or not images:
        return None
    from certify.rundir import read_rows
    from transdenoiser.errors import UserError

    parts = Path(out).parts
    candidates = [Path(out)]
    if dataset in parts:
        at = len(parts) - 1 - parts[::-1].index(dataset)
        candidates.insert(0, steps_file.parent.joinpath(*parts[at:]))
    for folder in candidates:
        if kind == "baseline-certify":
            summary = read_json(folder / "summary.json")
            if summary and summary.get("num_images") == images and isinstance(summary.get("seconds"), (int, float)):
                return float(summary["seconds"])
            continue
        try:
            records = read_rows(folder / "certify.tsv", "certify")  # [] where there is no such file
        except UserError:  # a damaged rows file gives no rate; the step's own log still does
            continue
        if len(records) == images:
            return sum(record.seconds for record in records)
    return None


def with_recorded_seconds(steps: list[dict], steps_file: Path) -> list[dict]:
    """``steps`` (one steps.jsonl's lines) with every finished certification that :func:`recorded_seconds` finds
    timed by its own files, as one whole run: a resumed certification (whose log has only its last part) then
    gives a rate too. A baseline-certify step logged before its work named the arm takes it from the step's name."""
    timed = []
    for step in steps:
        work = step.get("work", {})
        named = re.search(r": baseline-certify (\S+) seed \d+$", step.get("name", ""))
        if work.get("kind") == "baseline-certify" and "arm" not in work and named:  # logged before work named it
            step = {**step, "work": {**work, "arm": named.group(1)}}
        seconds = recorded_seconds(step, steps_file) if step.get("exit") == 0 else None
        if seconds is not None and seconds > 0:
            step = {**step, "seconds": seconds, "resumed": False}
            step.pop("images_before", None)
        timed.append(step)
    return timed
