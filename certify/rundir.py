"""A certification run's directory: its settings, rows, statuses and merge.

Run directory (``--out DIR``):
- ``settings.json``: what the run certifies and how; a second invocation with other settings is refused;
  another ``seed`` or ``alpha`` is a new test of the same images and is refused without ``--new-test``
  (each test spends its alpha); with it, the earlier test's files move to ``tests/K/`` and ``tests.json``
  lists the earlier tests (seed, alpha);
- ``test.json`` (certify): the run's test and how many tests of its images and seed the ledger of
  certification tests held when it started (:mod:`certify.ledger`), copied into the summary as ``test``;
- ``certify.tsv`` (or ``certify.shard-I-of-K.tsv`` per shard): one row per image, flushed as it is done;
- ``certify.status.json`` (or ``certify.shard-I-of-K.status.json``): hardware, device, wall time, completeness;
- after the run (or after the merge of all shards): ``summary.json``, ``report.md``, ``certified_accuracy.png``.
``predict`` runs use ``predict.tsv`` the same way.

Adaptive runs (``mode`` decide or estimate in the settings, :mod:`certify.sequential`) write the same
files; their rows add a last column ``samples``: the noisy samples the image used (n0 + estimation).
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from certify.core import AdaptiveCertificate, Certificate
from certify.rowfile import RowSchema, RowWriter, read_row_file  # noqa: F401 - RowWriter: the run files' writer, here since rundir had it
from certify.units import Shard, plan_units, select_indices
from training.checkpoint import write_text  # the package's one atomic writer (fsyncs); report.py imports it here
from transdenoiser.errors import UserError

TASKS = ("certify", "predict")
COLUMNS = {"certify": ("idx", "label", "predict", "radius", "correct", "time"),
           "predict": ("idx", "label", "predict", "correct", "time")}
ADAPTIVE_COLUMNS = COLUMNS["certify"] + ("samples",)  # adaptive certify runs: + noisy samples used (n0 included)
MODES = ("decide", "estimate")  # adaptive certification (certify.sequential)
SETTINGS_FILE = "settings.json"
MODELS_FILE = "models.json"  # both models' full metadata (the denoiser's includes its privacy report)
# Settings that change what a run computes; paths are left out (a checkpoint or data folder may move).
PATH_SETTINGS = ("classifier", "denoiser", "data_root")
# A second certification of the same images with another of these is a new test (``--new-test``): it spends
# its alpha again, so a run directory refuses it unless asked, and keeps the earlier test in tests/K/.
TEST_SETTINGS = ("seed", "alpha")
TESTS_FOLDER, TESTS_FILE = "tests", "tests.json"
TEST_FILE = "test.json"  # this run's test and the ledger's count of tests of its images (certify.ledger)


# ----------------------------------------------------------------------------------------------- records

@dataclass(frozen=True)
class CertifyRecord:
    """One row of certify.tsv: ``prediction`` is ABSTAIN (-1) or a class; ``radius`` in [0,1]-pixel L2 units."""

    idx: int
    label: int
    prediction: int
    radius: float
    correct: bool
    seconds: float  # wall time of the image's n0 + n samples (a pack's time is split evenly over its images)
    p_lower: float = math.nan  # not in the TSV (Cohen's columns); kept for library callers
    count: int = -1
    samples: int | None = None  # adaptive runs only: noisy samples used, n0 included (the TSV's last column)

    @classmethod
    def from_certificate(cls, idx: int, label: int, cert: Certificate | AdaptiveCertificate,
                         seconds: float) -> CertifyRecord:
        samples = cert.samples if isinstance(cert, AdaptiveCertificate) else None
        return cls(idx, label, cert.prediction, cert.radius, cert.prediction == label, seconds, cert.p_lower,
                   cert.count, samples)

    def row(self) -> list[str]:
        fields = [str(self.idx), str(self.label), str(self.prediction), f"{self.radius:.6f}", str(int(self.correct)),
                  f"{self.seconds:.4f}"]
        return fields if self.samples is None else fields + [str(self.samples)]


@dataclass(frozen=True)
class PredictRecord:
    """One row of predict.tsv (Cohen's predict.py columns)."""

    idx: int
    label: int
    prediction: int
    correct: bool
    seconds: float

    def row(self) -> list[str]:
        return [str(self.idx), str(self.label), str(self.prediction), str(int(self.correct)), f"{self.seconds:.4f}"]


Record = CertifyRecord | PredictRecord


def parse_row(task: str, fields: list[str]) -> Record:
    if task == "certify":
        idx, label, prediction, radius, correct, seconds, *samples = fields
        if len(samples) > 1:
            raise ValueError(f"{len(fields)} fields")
        return CertifyRecord(int(idx), int(label), int(prediction), float(radius), correct == "1", float(seconds),
                             samples=int(samples[0]) if samples else None)
    idx, label, prediction, correct, seconds = fields
    return PredictRecord(int(idx), int(label), int(prediction), correct == "1", float(seconds))


# ----------------------------------------------------------------------------------------------- run files

def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: missing ({what})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None


def _tsv_parser(task: str):
    def parse(line: str, header: str | None) -> Record:
        fields = line.split("\t")
        if header is not None and len(fields) != len(header.split("\t")):
            raise ValueError(f"{len(fields)} fields")
        return parse_row(task, fields)

    return parse


# Cohen's rows as a schema of the shared rows file (certify.rowfile); a certify file may have the adaptive header
SCHEMAS = {task: RowSchema(name=task, header="\t".join(COLUMNS[task]), parse=_tsv_parser(task),
                           format=lambda record: "\t".join(record.row()), key=lambda record: record.idx,
                           other_headers=("\t".join(ADAPTIVE_COLUMNS),) if task == "certify" else ())
           for task in TASKS}


def read_rows(path: Path, task: str, repair: bool = False) -> list[Record]:
    """Rows of a run TSV. A last line cut short by an interrupted run is dropped (and cut off when ``repair``)."""
    return read_row_file(path, SCHEMAS[task], repair=repair)


@dataclass
class RunSettings:
    """Everything that decides a run's rows (paths are recorded but not compared: files may move)."""

    task: str
    classifier: str
    classifier_sha256: str
    denoiser: str | None
    denoiser_sha256: str | None
    dataset: str
    data_root: str | None
    split_seed: int
    split: str
    split_fingerprint: str
    split_size: int
    sigma: float
    n0: int | None  # None for predict
    n: int
    alpha: float
    batch: int
    skip: int
    max: int | None
    indices: list[int] | None
    seed: int
    shards: int
    pack: int  # images per unit (from n0 + n and batch)
    noise_device: str  # cpu or cuda: the two draw different noise from the same seed
    memory_format: str
    precision: str = "float32"  # the forward pass's arithmetic: float32, or bfloat16 / float16 autocast
    compile: bool = False  # the pipeline ran through torch.compile
    noise: str = "gaussian"  # gaussian (float32 randn) or sound (exact grid noise, certify.sound_noise)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(data.pop("extra"))
        return data


# Settings added later, with the value every run written before them had.
LEGACY_DEFAULTS = {"precision": "float32", "compile": False, "noise": "gaussian"}


@dataclass(frozen=True)
class RunLayout:
    """What one kind of run keeps in its run directory, and how its settings are compared.

    ``task``: the rows' task (progress label, messages); files: ``{stem}{rows_suffix}`` (per shard
    ``{stem}.shard-I-of-K{rows_suffix}``), ``{stem}.status.json`` and ``settings_file``; ``schema``: the rows.
    Settings comparison: ``path_settings`` are recorded but not compared (files may move), ``test_settings`` differ
    only in a new test (``--new-test``), ``legacy_defaults`` fill settings that older runs did not record.
    """

    task: str
    stem: str
    rows_suffix: str
    settings_file: str
    schema: RowSchema
    path_settings: tuple[str, ...] = ()
    test_settings: tuple[str, ...] = ()
    legacy_defaults: tuple[tuple[str, Any], ...] = ()
    write_settings: Callable[[Path, Any], Any] | None = None  # default: write_json below (indented, in order)


def certify_layout(task: str) -> RunLayout:
    """``certify``'s and ``predict``'s run directory: settings.json, TASK.tsv (Cohen's columns), TASK.status.json."""
    return RunLayout(task=task, stem=task, rows_suffix=".tsv", settings_file=SETTINGS_FILE, schema=SCHEMAS[task],
                     path_settings=PATH_SETTINGS, test_settings=TEST_SETTINGS,
                     legacy_defaults=tuple(LEGACY_DEFAULTS.items()))


def _short(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def _differences(old: dict[str, Any], new: dict[str, Any], layout: RunLayout | None = None) -> list[str]:
    layout = layout or certify_layout("certify")
    legacy, paths = dict(layout.legacy_defaults), layout.path_settings
    old, new = {**legacy, **old}, {**legacy, **new}
    keys = [k for k in new if k not in paths] + [k for k in old if k not in new and k not in paths]
    return [f"{k} {_short(old.get(k))} there, {_short(new.get(k))} now" for k in keys if old.get(k) != new.get(k)]


HEARTBEAT_SECONDS = 30.0  # how often a running session's wall time is written to its status file


class RunDirectory:
    """One run's folder: settings check, rows done so far, this process's rows file and status.

    ``settings``: a :class:`RunSettings` (certify, predict) or any mapping of JSON values (another kind of run,
    with its ``layout``). ``layout``: the files and rows of the run (default: the certify/predict layout of
    ``settings.task``). What every layout gets alike: one settings file, compared as a whole when the run is
    opened again (other settings are refused in one line; another seed or alpha is a new test where the layout
    says so); rows appended and flushed as done, a cut last row dropped on resume (:mod:`certify.rowfile`); a
    status file with each session's hardware and wall time, kept current while it runs.
    """

    def __init__(self, root: Path, settings: RunSettings | dict[str, Any], shard: Shard | None,
                 new_test: bool = False, layout: RunLayout | None = None):
        self.root = Path(root)
        self.settings = settings
        self.shard = shard
        self.layout = layout or certify_layout(settings.task)  # type: ignore[union-attr]
        self.task = self.layout.task
        self.new_test = new_test

    def settings_dict(self) -> dict[str, Any]:
        return self.settings.to_dict() if isinstance(self.settings, RunSettings) else dict(self.settings)

    # file names
    def rows_path(self, shard: Shard | None = None) -> Path:
        layout = self.layout
        return self.root / (f"{layout.stem}{layout.rows_suffix}" if shard is None
                            else f"{layout.stem}.{shard.stem}{layout.rows_suffix}")

    def header(self) -> str | None:
        """The rows file's header: the schema's (Cohen's columns), plus ``samples`` for adaptive certify runs."""
        if self.layout.schema is SCHEMAS["certify"] and self.settings_dict().get("mode") in MODES:
            return "\t".join(ADAPTIVE_COLUMNS)
        return self.layout.schema.header

    def status_path(self, shard: Shard | None = None) -> Path:
        stem = self.layout.stem
        return self.root / (f"{stem}.status.json" if shard is None else f"{stem}.{shard.stem}.status.json")

    def open(self) -> None:
        """Create the folder or check that it holds a run with the same settings (never mix two runs)."""
        if self.root.exists() and not self.root.is_dir():
            raise UserError(f"--out {self.root} exists and is not a directory")
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / self.layout.settings_file
        new = self.settings_dict()
        what = "run" if self.layout.settings_file == SETTINGS_FILE else f"{self.task} run"
        if path.exists():
            old = read_json(path, "run settings")
            if not isinstance(old, dict):
                raise UserError(f"{path}: not a settings object; give another --out")
            diffs = _differences(old, new, self.layout)
            retest = [f"{key} {new.get(key)!r} (was {old.get(key)!r})" for key in self.layout.test_settings
                      if old.get(key) != new.get(key)]
            if retest and not self.new_test:
                raise UserError(f"--out {self.root} holds a test of these images; certifying them again with "
                                f"{' and '.join(retest)} is a new test that spends its alpha again "
                                f"(docs/CERTIFY.md): pass --new-test to start it (the earlier test moves to "
                                f"{self.root / TESTS_FOLDER}/), or use another --out")
            if diffs and not retest:
                raise UserError(f"--out {self.root} holds a {what} with different settings "
                                f"({'; '.join(diffs[:3])}): use another --out")
            if diffs:
                self._archive(old)
                self._write_settings(path, new)
        else:
            rows = self.rows_path(self.shard)
            if rows.exists() and rows.stat().st_size > 0:  # rows of unknown origin: never resume them
                raise UserError(f"--out {self.root} holds {rows.name} but no {self.layout.settings_file} (rows of "
                                "an unknown run): use another --out")
            self._write_settings(path, new)

    def _write_settings(self, path: Path, settings: dict[str, Any]) -> None:
        (self.layout.write_settings or write_json)(path, settings)

    def _archive(self, old: dict[str, Any]) -> None:
        """Move the earlier test's files into tests/K/ and add it to tests.json (what each test spent)."""
        folder = self.root / TESTS_FOLDER
        folder.mkdir(exist_ok=True)
        number = 1 + sum(1 for entry in folder.iterdir() if entry.is_dir())
        target = folder / str(number)
        target.mkdir()
        for entry in self.root.iterdir():
            if entry.name not in (TESTS_FOLDER, TESTS_FILE):
                os.replace(entry, target / entry.name)
        log_path = self.root / TESTS_FILE
        log = read_json(log_path, "earlier tests") if log_path.exists() else []
        log.append({"folder": f"{TESTS_FOLDER}/{number}", "seed": old.get("seed"), "alpha": old.get("alpha"),
                    "task": old.get("task")})
        write_json(log_path, log)

    def write_models(self, classifier_metadata: dict[str, Any], denoiser_metadata: dict[str, Any] | None) -> None:
        write_json(self.root / MODELS_FILE, {"classifier_metadata": classifier_metadata,
                                             "denoiser_metadata": denoiser_metadata})

    def rows(self, repair: bool = False) -> list[Any]:
        """This process's rows on disk, in file order (a cut last row dropped; cut off the file when ``repair``)."""
        return read_row_file(self.rows_path(self.shard), self.layout.schema, repair=repair)

    def done_indices(self) -> set[int]:
        return {self.layout.schema.key(r) for r in self.rows(repair=True)}

    def start_session(self, device: torch.device, hardware: str) -> None:
        """Record this process's session in the status file now and keep its wall time current while it runs
        (``heartbeat``): a process killed outright (SIGKILL, a lost machine) never reaches ``update_status``, yet
        its session keeps its time up to the last heartbeat, and the next session marks it ``interrupted``."""
        path = self.status_path(self.shard)
        old = read_json(path, "status") if path.exists() else {}
        sessions = old.get("sessions", [])
        for session in sessions:
            if session.get("state") == "running":  # its process did not come back to close it
                session["state"] = "interrupted"
        self._session = {"device": str(device), "hardware": hardware, "wall_seconds": 0.0, "state": "running",
                         "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        sessions.append(self._session)
        self._status = {"shard": None if self.shard is None else str(self.shard), "rows": old.get("rows", 0),
                        "complete": False, "sessions": sessions}
        self._started = self._last_beat = time.perf_counter()
        write_json(path, self._status)

    def heartbeat(self, rows: int) -> None:
        """Bring the running session's wall time and row count up to date, at most every HEARTBEAT_SECONDS."""
        now = time.perf_counter()
        if getattr(self, "_session", None) is None or now - self._last_beat < HEARTBEAT_SECONDS:
            return
        self._last_beat = now
        self._session["wall_seconds"] = round(now - self._started, 3)
        self._status["rows"] = rows
        write_json(self.status_path(self.shard), self._status)

    def update_status(self, device: torch.device, hardware: str, wall_seconds: float, rows: int,
                      complete: bool) -> None:
        """Close this process's session (opened by ``start_session``, else added now) with its wall time."""
        path = self.status_path(self.shard)
        session = getattr(self, "_session", None)
        if session is None:
            old = read_json(path, "status") if path.exists() else {}
            sessions = old.get("sessions", [])
            session = {"device": str(device), "hardware": hardware}
            sessions.append(session)
        else:
            sessions = self._status["sessions"]
        session.update({"wall_seconds": round(wall_seconds, 3), "state": "finished",
                        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        self._session = None
        write_json(path, {"shard": None if self.shard is None else str(self.shard), "rows": rows,
                          "complete": complete, "sessions": sessions})


def expected_indices(units: list[list[int]], shard: Shard | None) -> list[int]:
    mine = shard.take(units) if shard is not None else units
    return [i for unit in mine for i in unit]


def collect_rows(run_dirs: Sequence[Path], task: str | None = None) -> tuple[dict[str, Any], list[Record], list[dict]]:
    """Settings, all rows and statuses of a whole run, from one folder or several shards' folders (any order).

    Refuses folders whose settings differ, duplicated rows, and missing shards or images.
    """
    settings: dict[str, Any] | None = None
    rows: dict[int, Record] = {}
    statuses: list[dict] = []
    shard_files: dict[int, Path] = {}
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise UserError(f"{run_dir}: no such run directory")
        current = read_json(run_dir / SETTINGS_FILE, "run settings: is this a certify or predict --out folder?")
        if settings is None:
            settings = current
        else:
            from certify.numerics import refuse_mixed_numerics

            refuse_mixed_numerics([(str(run_dirs[0]), settings), (str(run_dir), current)], "merge")
        if _differences(settings, current):
            raise UserError(f"{run_dir} holds a run with other settings than {run_dirs[0]} "
                            f"({'; '.join(_differences(settings, current)[:3])}): refusing to merge")
        run_task = current.get("task")
        if run_task not in TASKS or (task is not None and run_task != task):
            raise UserError(f"{run_dir}: settings.json is for task {run_task!r}, expected {task or 'certify/predict'}")
        count = current["shards"]
        names = ([f"{run_task}.tsv"] if count == 1 else [f"{run_task}.shard-{i}-of-{count}.tsv" for i in range(count)])
        for number, name in enumerate(names):
            path = run_dir / name
            if not path.exists():
                continue
            if number in shard_files and count > 1:
                raise UserError(f"shard {number}/{count} appears twice ({shard_files[number]} and {path})")
            shard_files[number] = path
            for record in read_rows(path, run_task):
                if record.idx in rows:
                    raise UserError(f"{path}: image {record.idx} appears twice in the run")
                rows[record.idx] = record
            status_path = path.with_suffix(".status.json")
            if status_path.exists():
                statuses.append(read_json(status_path, "status"))
    assert settings is not None
    return settings, list(rows.values()), statuses


def work_list(settings: dict[str, Any]) -> list[int]:
    return select_indices(settings["split_size"], settings["skip"], settings["max"], settings["indices"])


def missing_report(settings: dict[str, Any], rows: Sequence[Record]) -> list[str]:
    """What is still missing for the whole run, per shard: empty when the run is complete."""
    units = plan_units(work_list(settings), settings["pack"])
    have = {r.idx for r in rows}
    count = settings["shards"]
    problems = []
    for index in range(count):
        shard = Shard(index, count) if count > 1 else None
        expected = expected_indices(units, shard)
        missing = [i for i in expected if i not in have]
        if missing:
            where = f"shard {shard}" if shard else "the run"
            problems.append(f"{where} has {len(expected) - len(missing)} of {len(expected)} images done")
    return problems


def ordered(settings: dict[str, Any], rows: Sequence[Record]) -> list[Record]:
    """Rows in work-list order (the order of an unsharded run)."""
    position = {idx: p for p, idx in enumerate(work_list(settings))}
    return sorted(rows, key=lambda r: position.get(r.idx, len(position) + r.idx))


def write_rows(path: Path, task: str, rows: Sequence[Record]) -> None:
    adaptive = any(getattr(r, "samples", None) is not None for r in rows)
    lines = ["\t".join(ADAPTIVE_COLUMNS if adaptive else COLUMNS[task])] + ["\t".join(r.row()) for r in rows]
    write_text(path, "\n".join(lines) + "\n")
