"""One ``baseline-certify`` run, from a baseline checkpoint to a finished run directory, through the same run
directory, resume, lock and status code as ``certify`` (:class:`certify.rundir.RunDirectory`,
:func:`certify.runner.run_session`, :class:`transdenoiser.lock.RunLock`).

:func:`run_baseline_job` is what ``transdenoiser baseline-certify`` does without the command line: find the
checkpoint's arm, take the run lock, load the baseline and the images, open the run directory (the same settings
resume the run; other settings are refused in one line), certify the images not yet recorded (each image's noise
comes from (seed, idx) alone, so a resumed run's rows are an uninterrupted run's) and, when every image is done,
write ``baseline_certify.tsv``, ``summary.json`` (:class:`transdenoiser.records.BaselineCertificationSummary`) and
``report.md`` (:mod:`certify.baseline_report`). Library code: nothing is printed; notes go to ``warn``,
progress to ``track``. The files: :mod:`certify.baseline_rows`.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from certify.baseline_rows import ROW_SCHEMA, ROWS_FILE, SETTINGS_FILE, STATUS_FILE, STEM, TABLE_FILE, TASK
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent


def _ignore(message: str) -> None:
    return None


@dataclass
class BaselineCertifyJob:
    """What ``baseline-certify`` certifies: the checkpoint ``model`` (arm securesgd-prt, securesgd-sct or stobatch;
    ``classifier`` overrides a securesgd-prt denoiser's recorded classifier), every ``skip``-th image of
    ``dataset``'s ``split`` (at most ``max_images``, 0: all), ``n0`` selection and ``n`` estimation draws per image,
    failure probability ``alpha`` per certificate, smoothing's ``sigma`` (None: the model's training sigma; required
    for stobatch), ``batch_size`` draws per forward pass, ``seed`` of every image's draws; the run folder ``out``."""

    model: Path | str
    out: Path | str
    classifier: Path | str | None = None
    sigma: float | None = None
    dataset: str = "mnist10k"
    data_root: Path | str | None = None
    split_seed: int = 0
    split: str = "test"
    skip: int = 1
    max_images: int = 100
    n0: int = 100
    n: int = 1000
    alpha: float = 0.001
    batch_size: int = 500
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        self.model, self.out = Path(self.model), Path(self.out)
        self.classifier = Path(self.classifier) if self.classifier is not None else None
        self.data_root = Path(self.data_root) if self.data_root is not None else None


@dataclass
class BaselineOutcome:
    """How a run ended: ``complete`` (every image done; ``summary`` is then summary.json's content) or interrupted
    (Ctrl-C; the rows so far are kept). ``done_before``: rows found on disk at the start; ``kept``/``expected``: rows
    on disk at the end and images planned."""

    arm: str
    out: Path
    rows_path: Path
    status_path: Path
    table_path: Path
    complete: bool
    done_before: int
    done_now: int
    kept: int
    expected: int
    summary: dict[str, Any] | None = None


def baseline_layout() -> Any:
    """``baseline-certify``'s run directory: its settings file, JSON rows and status file; settings compared as a
    whole (paths included: the checkpoint's files are named by hash, the classifier and data folders by path), no
    new-test archive (another seed or alpha is refused like any other setting)."""
    from certify.rundir import RunLayout
    from training.checkpoint import write_json  # the settings file as baseline-certify has always written it

    return RunLayout(task=TASK, stem=STEM, rows_suffix=".rows.jsonl", settings_file=SETTINGS_FILE,
                     schema=ROW_SCHEMA, write_settings=write_json)


def run_baseline_job(job: BaselineCertifyJob, track: Track = silent,
                     warn: Callable[[str], None] = _ignore) -> BaselineOutcome:
    """Run ``job`` under the run lock (one writer per folder); on KeyboardInterrupt the rows so far are kept and the
    outcome says so."""
    from certify.baseline_models import baseline_arm
    from transdenoiser.lock import RunLock

    arm = baseline_arm(job.model)  # before the lock: a wrong checkpoint leaves no output folder behind
    with RunLock(job.out, purpose="baseline-certify"):
        return _run_locked(job, arm, track, warn)


def _run_locked(job: BaselineCertifyJob, arm: str, track: Track, warn: Callable[[str], None]) -> BaselineOutcome:
    import numpy as np

    from certify.baseline_models import Sampling, load_baseline
    from certify.core import validate_sampling
    from certify.rundir import RunDirectory
    from certify.runner import run_session
    from training.datasets import load_dataset
    from transdenoiser.checks import check_same_dataset
    from transdenoiser.records import CheckpointMetadata
    from transdenoiser.runtime import hardware_description, resolve_device, seed_everything

    validate_sampling(job.n0, job.n, job.alpha)
    device = resolve_device(job.device)
    seed_everything(job.seed)
    sampling = Sampling(job.n0, job.n, job.alpha, job.batch_size, job.seed, job.sigma)
    baseline = load_baseline(arm, job.model, job.classifier, sampling, device)
    meta = baseline.meta
    dataset = load_dataset(job.dataset, job.data_root, job.split_seed)
    check_same_dataset(dataset.name, meta, f"model {job.model}")
    split = dataset.split(job.split)
    input_shape = CheckpointMetadata.from_json(meta, f"{job.model}/metadata.json").input_shape
    if input_shape is None:
        raise UserError(f"{job.model} records no input_shape: not a checkpoint written by a baseline's training")
    if tuple(dataset.image_shape) != tuple(input_shape):
        raise UserError(f"{dataset.name} has images of shape {dataset.image_shape}, the model takes "
                        f"{list(input_shape)}")
    indices = list(range(0, len(split), job.skip))
    if job.max_images:
        indices = indices[:job.max_images]
    images, labels = split.subset(np.asarray(indices, dtype=np.int64)).tensors(device)
    smooth = baseline.smooth
    # everything a row depends on: image idx's noise comes from (seed, idx) alone, so a resumed run's rows are those
    # of an uninterrupted one (the batch size is kept too: it orders the noise layer's draws)
    recorded = meta.get("classifier")
    classifier = job.classifier or (recorded.get("path") if isinstance(recorded, dict) else None)
    settings = json.loads(json.dumps({
        "arm": arm, "model_files": meta.get("files"),
        "classifier": None if classifier is None else str(Path(classifier).resolve()), "dataset": dataset.name,
        "data_root": None if job.data_root is None else str(Path(job.data_root).resolve()),
        "split_seed": job.split_seed,
        "split": job.split, "indices": indices, "n0": job.n0, "n": job.n, "alpha": job.alpha,
        "seed": job.seed, "sigma": smooth.sigma, "batch_size": job.batch_size}))
    run = RunDirectory(job.out, settings, None, layout=baseline_layout())
    try:
        run.open()
        done = len(run.done_indices())
        if done:
            warn(f"resuming {job.out}: {done} of {len(indices)} images done")
        position = {idx: i for i, idx in enumerate(indices)}

        def engine(pending: list[list[int]]):
            for unit in pending:  # one image per unit: its own certificate's draws, then smoothing's
                rows = []
                for idx in unit:
                    x, y = images[position[idx]], int(labels[position[idx]])
                    started = time.perf_counter()
                    row = {"idx": idx, "label": y, **baseline.own(idx, x, y)}
                    cohen = smooth.certify(x, job.n0, job.n, job.alpha, smooth.image_generator(job.seed, idx))
                    row.update({"smooth_predict": cohen.prediction, "smooth_radius": cohen.radius,
                                "smooth_correct": int(cohen.prediction == y), "smooth_p_lower": cohen.p_lower,
                                "smooth_count": cohen.count, "seconds": time.perf_counter() - started})
                    rows.append(row)
                yield rows

        session = run_session(run, [[idx] for idx in indices], engine, device, hardware_description(device),
                              track=track)
    finally:
        smooth.close()
    outcome = BaselineOutcome(arm=arm, out=job.out, rows_path=run.rows_path(), status_path=run.status_path(),
                              table_path=job.out / TABLE_FILE, complete=session.complete,
                              done_before=session.done_before, done_now=session.done_now, kept=session.kept,
                              expected=len(indices))
    if session.complete:
        outcome.summary = _finalize(job, run, arm, baseline, dataset.name, indices, device,
                                    resumed=len(indices) - session.done_now)
    return outcome


def _finalize(job: BaselineCertifyJob, run, arm: str, baseline, dataset_name: str, indices: list[int], device,
              resumed: int) -> dict[str, Any]:
    """Write the table, summary.json and report.md of a run whose images are all done (``resumed`` of them by
    earlier sessions); returns the summary."""
    from certify.baseline_report import write_baseline_report
    from certify.baseline_rows import SUMMARY_FILE, certificate_summary, table_text
    from training.checkpoint import write_json, write_text
    from transdenoiser.records import BASELINE_TASK, BaselineCertificationSummary
    from transdenoiser.runtime import hardware_description

    recorded = {row["idx"]: row for row in run.rows()}
    missing = [idx for idx in indices if idx not in recorded]
    if missing:  # pragma: no cover - run_session completes only when every image is recorded
        raise UserError(f"{run.rows_path()}: {len(missing)} of {len(indices)} images missing; resume the run")
    rows = [recorded[idx] for idx in indices]
    write_text(job.out / TABLE_FILE, table_text(rows, baseline.columns))
    sigma = baseline.smooth.sigma
    summary = {
        "format_version": BaselineCertificationSummary.FORMAT_VERSION, "task": BASELINE_TASK,
        "model": str(job.model), "arm": arm, "dataset": dataset_name, "split": job.split,
        "num_images": len(rows), "indices": indices, "n0": job.n0, "n": job.n, "alpha": job.alpha,
        "seed": job.seed, "smoothing_sigma": sigma, "radius_units": "L2, pixels in [0, 1]",
        "phan": certificate_summary(rows, "phan", baseline.note),
        "smoothing": certificate_summary(rows, "smooth", f"randomized smoothing (Cohen et al.) at sigma {sigma:g} of "
                                                         "the same randomised model (its noise layer included); "
                                                         "abstentions count as wrong"),
        **baseline.summary, "privacy": baseline.meta.get("privacy"),
        "seconds": sum(r.get("seconds", 0.0) for r in rows), "images_resumed": resumed,
        "seconds_note": "wall seconds of the images' certificates, summed over this run and the runs it resumed",
        "hardware": hardware_description(device),
    }
    record = BaselineCertificationSummary.from_json(summary, str(job.out / SUMMARY_FILE))
    write_json(job.out / SUMMARY_FILE, record.to_json())
    write_baseline_report(job.out, record)
    return record.to_json()


__all__ = ["BaselineCertifyJob", "BaselineOutcome", "ROWS_FILE", "STATUS_FILE", "baseline_layout",
           "run_baseline_job"]
