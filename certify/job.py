"""One certify (or predict) run over a dataset split, from checkpoint directories to a finished run directory.

:func:`run_job` is what ``transdenoiser certify`` and ``transdenoiser predict`` do, without the command
line: load the models and data, check that they fit (dataset, input shape, sigma), take the run lock,
resume an existing run with the same settings, certify the missing images and, when the run is complete,
write summary.json, report.md and the figure. The command line only turns flags into a
:class:`CertifyJob` and prints the :class:`JobOutcome`; the Python API exposes both
(``transdenoiser.api.CertifyJob``, ``transdenoiser.api.run_certify_job``).

    from transdenoiser.api import CertifyJob, run_certify_job
    outcome = run_certify_job(CertifyJob(classifier="runs/demo/classifier", denoiser="runs/demo/denoiser",
                                         sigma=0.25, n=1000, skip=100, out="runs/my_certify"))
    outcome.summary["certified_accuracy"]

Library code: nothing is printed. Notes for the user (a sigma mismatch allowed by ``allow_sigma_mismatch``,
models evaluated on their own training split) go to the ``warn`` hook; progress goes to ``track``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent

TASKS = ("certify", "predict")
DEFAULT_BATCH = {"cpu": 64, "cuda": 4096}  # noisy samples per forward pass (measured: docs/RESULTS.md)


def _ignore(message: str) -> None:
    return None


@dataclass
class CertifyJob:
    """What to certify (``task="certify"``, Cohen's CERTIFY or the adaptive modes) or predict, and where.

    Models: ``classifier`` and optional ``denoiser`` checkpoint directories. Smoothing: ``sigma`` (noise std,
    [0,1] pixels), ``n0`` selection and ``n`` estimation samples per image, ``alpha`` the failure
    probability of each certificate. Adaptive certification (certify only): ``radius`` (decide at this L2
    radius) or ``adaptive=True`` (estimate), with ``n_max`` estimation samples at most (default ``n``) and
    ``tolerance`` (estimate mode). Images: ``dataset``'s ``split``, every ``skip``-th image below index
    ``max_index``, or exactly ``indices``. ``seed``: image ``idx`` draws its noise from (seed, idx).
    ``shard``: a :class:`certify.units.Shard` (or None for the whole run). How the base classifier is run:
    ``precision`` (``fp32``, ``bf16``, ``fp16`` autocast) and ``compile`` (``torch.compile``), both recorded in the
    run and part of what it certifies; ``noise``: ``gaussian`` (float32 randn) or ``sound`` (images on the 8-bit
    grid, exact integer noise: :mod:`certify.sound_noise`), recorded likewise; ``batch_size`` None: 64 on CPU,
    on CUDA the largest pass that fits in half the free memory (at most 4096).
    """

    classifier: Path | str
    sigma: float
    out: Path | str
    denoiser: Path | str | None = None
    task: str = "certify"
    n0: int = 100
    n: int = 100_000
    alpha: float = 0.001
    radius: float | None = None
    adaptive: bool = False
    n_max: int | None = None
    tolerance: float | None = None
    sequential: str = "one-sided-mixture"
    dataset: str = "mnist10k"
    data_root: Path | str | None = None
    split_seed: int = 0
    split: str = "test"
    skip: int = 1
    max_index: int | None = None
    indices: Sequence[int] | None = None
    seed: int = 0
    batch_size: int | None = None
    workers: int | str = "auto"
    memory_format: str = "auto"
    precision: str = "fp32"
    compile: bool = False
    noise: str = "gaussian"
    device: str = "cpu"
    shard: Any = None
    allow_sigma_mismatch: bool = False
    new_test: bool = False

    def __post_init__(self) -> None:
        self.classifier = Path(self.classifier)
        self.denoiser = Path(self.denoiser) if self.denoiser is not None else None
        self.out = Path(self.out)
        self.data_root = Path(self.data_root) if self.data_root is not None else None
        if self.task not in TASKS:
            raise UserError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        from certify.numerics import canonical_precision

        canonical_precision(self.precision)  # a bad name is refused before anything is loaded
        from certify.sound_noise import check_noise_kind

        check_noise_kind(self.noise)

    @property
    def mode(self) -> str | None:
        """``decide``, ``estimate`` or None (Cohen's fixed n); checks the adaptive settings."""
        if self.task != "certify":
            if self.radius is not None or self.adaptive:
                raise UserError("adaptive certification (--radius/--adaptive) is for certify, not predict")
            return None
        if self.radius is not None and self.adaptive:
            raise UserError("--radius (decide) and --adaptive (estimate) are two modes: pass one")
        mode = "decide" if self.radius is not None else "estimate" if self.adaptive else None
        if mode is None and (self.n_max is not None or self.tolerance is not None):
            raise UserError("--n-max and --tolerance are for adaptive certification: add --radius R or --adaptive")
        if mode == "decide" and self.tolerance is not None:
            raise UserError("--tolerance is for --adaptive (estimate mode), not for --radius")
        if mode == "decide":
            from certify.sequential import max_decidable_radius

            largest = max_decidable_radius(self.sigma)
            if self.radius > largest:
                raise UserError(f"--radius {self.radius} cannot be decided at --sigma {self.sigma:g}: float64's "
                                f"Phi(R / sigma) is 1 beyond R / sigma = 8.29; the largest radius that can be decided "
                                f"at this sigma is {largest}")
        return mode


@dataclass
class JobOutcome:
    """How a job ended. ``complete``: this process's images are all done (``interrupted`` otherwise).

    ``done_before`` / ``done_now``: images found on disk at the start / certified by this call; ``kept`` and
    ``expected``: this process's rows on disk and images planned at the end. ``summary`` (the run's
    summary.json) is set once the whole run is finalised; a shard whose siblings are not done yet has
    ``waiting_for`` instead (what is missing).
    """

    task: str
    out: Path
    rows_path: Path
    status_path: Path
    device: str
    hardware: str
    complete: bool
    done_before: int = 0
    done_now: int = 0
    kept: int = 0
    expected: int = 0
    shard: str | None = None
    summary: dict[str, Any] | None = None
    waiting_for: list[str] = field(default_factory=list)


def check_models_and_data(job: CertifyJob, pipeline, data_name: str, warn: Callable[[str], None]) -> None:
    """Refuse a sigma other than the denoiser's training sigma (unless allowed) and models of another dataset;
    warn of a denoiser that training measured worse than no denoiser (its recorded figures: certifying the
    classifier alone as well would double the run)."""
    from transdenoiser.checks import check_same_dataset, check_sigma, worse_than_classifier
    from transdenoiser.checks import worse_than_classifier_warning as worse_warning

    warning = check_sigma(job.sigma, pipeline.denoiser_record, allow_mismatch=job.allow_sigma_mismatch,
                          denoiser=f"denoiser {job.denoiser}")
    if warning:
        warn(warning)
    worse = worse_than_classifier(pipeline.denoiser_record)
    if worse is not None:
        warn(worse_warning(worse, f"denoiser {job.denoiser}"))
    check_same_dataset(data_name, pipeline.classifier_record, f"classifier {job.classifier}")
    if pipeline.denoiser_record is not None:
        check_same_dataset(data_name, pipeline.denoiser_record, f"denoiser {job.denoiser}")


def run_job(job: CertifyJob, track: Track = silent, warn: Callable[[str], None] = _ignore) -> JobOutcome:
    """Run ``job`` under the run lock; on KeyboardInterrupt the rows so far are kept and the outcome says so."""
    from certify.units import Shard
    from transdenoiser.lock import RunLock

    mode = job.mode  # checks the adaptive settings before anything is loaded
    shard = job.shard if job.shard is not None else Shard.from_environment()
    if shard is not None and shard.count == 1:
        shard = None  # shard 0/1 is the whole run
    lock = RunLock(job.out, part=shard.stem if shard else None).acquire()  # one writer per run (or shard), at once
    try:
        return _run_locked(job, mode, shard, track, warn)
    finally:
        lock.release()


def _run_locked(job: CertifyJob, mode: str | None, shard, track: Track, warn: Callable[[str], None]) -> JobOutcome:
    from certify.core import Smooth
    from certify.pipeline import check_dataset_fits, load_pipeline
    from certify.rundir import RunDirectory, RunSettings
    from certify.runner import adaptive_pack_size, rank_device
    from certify.units import pack_size, select_indices
    from training.datasets import load_dataset
    from transdenoiser.runtime import resolve_device

    task = job.task
    device = rank_device(resolve_device(job.device))
    pipeline = load_pipeline(job.classifier, job.denoiser, device)
    dataset = load_dataset(job.dataset, job.data_root, job.split_seed)
    split = dataset.split(job.split)
    what = f"{dataset.name}'s {job.split} split"
    check_dataset_fits(pipeline, dataset.image_shape, dataset.num_classes, what)
    check_models_and_data(job, pipeline, dataset.name, warn)
    if job.indices is not None and (job.skip != 1 or job.max_index is not None):
        raise UserError("--indices names the images itself: leave out --skip and --max-index")
    indices = select_indices(len(split), job.skip, job.max_index, job.indices, what=what)
    n0 = job.n0 if task == "certify" else None
    n = job.n_max if mode and job.n_max is not None else job.n
    fingerprint = split.fingerprint()
    entry = ledger_entry(job, mode, pipeline, dataset.name, fingerprint, indices, n, device.type)
    from certify.rundir import SETTINGS_FILE

    if entry is not None and not (job.out / SETTINGS_FILE).exists():
        # a new run, before any forward pass: another test of these images on this stream is refused (in an existing
        # --out, its settings are compared first, then the ledger's record checks again)
        from certify import ledger

        ledger.check(entry, job.new_test)
    batch = job.batch_size or DEFAULT_BATCH.get(device.type, DEFAULT_BATCH["cpu"])
    smooth = Smooth(pipeline.classifier, pipeline.num_classes, job.sigma, pipeline.denoiser, batch, device,
                    job.memory_format, job.workers, precision=job.precision, compile=job.compile, noise=job.noise)
    if job.batch_size is None and device.type == "cuda":
        from certify.batching import cuda_forward_batch

        batch = smooth.batch_size = cuda_forward_batch(smooth.base_pipeline, pipeline.input_shape, device,
                                                       smooth.precision, cap=DEFAULT_BATCH["cuda"])
    try:
        pack = adaptive_pack_size(n0, batch) if mode else pack_size((n0 or 0) + n, batch)
        extra: dict[str, Any] = {}
        if mode:
            from certify.confidence import look_settings
            from certify.sequential import DEFAULT_TOLERANCE
            from certify.streams import BlockPlan

            extra = {"mode": mode, "radius": job.radius, "sequential_method": job.sequential,
                     **BlockPlan.for_device(device.type).describe(),
                     "tolerance": (job.tolerance if job.tolerance is not None else DEFAULT_TOLERANCE)
                     if mode == "estimate" else None,
                     **look_settings(job.sequential)}
        trained = pipeline.classifier_record.dataset
        if trained is not None and trained.fingerprint(trained.trained_on) == fingerprint:
            warn(f"note: the classifier was trained on this very split ({what}): the figures are not test figures")
        settings = RunSettings(
            task=task, classifier=str(job.classifier.resolve()),
            classifier_sha256=pipeline.classifier_record.weights_sha256 or "",
            denoiser=str(job.denoiser.resolve()) if job.denoiser else None,
            denoiser_sha256=pipeline.denoiser_record.weights_sha256 if pipeline.denoiser_record else None,
            dataset=dataset.name, data_root=str(job.data_root.resolve()) if job.data_root else None,
            split_seed=job.split_seed, split=job.split, split_fingerprint=fingerprint, split_size=len(split),
            sigma=job.sigma, n0=n0, n=n, alpha=job.alpha, batch=batch, skip=job.skip, max=job.max_index,
            indices=list(job.indices) if job.indices is not None else None, seed=job.seed,
            shards=shard.count if shard else 1, pack=pack, noise_device=device.type,
            memory_format=smooth.memory_format, precision=smooth.precision, compile=smooth.compile,
            noise=smooth.noise, extra=extra)
        run = RunDirectory(job.out, settings, shard, new_test=job.new_test)
        return _work(job, run, split, smooth, pipeline, indices, pack, mode, n, extra, device, shard, track, entry)
    finally:
        smooth.close()


def ledger_entry(job: CertifyJob, mode: str | None, pipeline, dataset: str, fingerprint: str, indices: Sequence[int],
                 n: int, device_type: str):
    """The :class:`certify.ledger.LedgerEntry` of a certify run (None for predict): its stream (the settings that
    fix each image's votes) and its test (:func:`certify.ledger.identify_test`)."""
    if job.task != "certify":
        return None
    from certify.ledger import identify_test, new_entry, weights_identity
    from certify.numerics import canonical_precision

    denoiser = pipeline.denoiser_record
    # the stream: what fixes the question (the smoothed classifier of the models as run: sigma, noise, precision,
    # compile, device) and each image's random draws (models, images, seed); n0 and alpha, which change the test of
    # that question but not the question, are part of the test: another of them on the same stream is another test
    stream = {"classifier_sha256": weights_identity(pipeline.classifier_record.weights_sha256, job.classifier),
              "denoiser_sha256": weights_identity(denoiser.weights_sha256 if denoiser else None, job.denoiser),
              "dataset": dataset, "split": job.split, "split_fingerprint": fingerprint, "seed": job.seed,
              "sigma": job.sigma, "noise": job.noise, "precision": canonical_precision(job.precision),
              "compile": bool(job.compile), "noise_device": device_type}
    test = f"{identify_test(mode, n, job.radius, job.sequential)} | n0={job.n0} alpha={job.alpha:g}"
    return new_entry(stream, indices, test, job.out)


def _record_test(run, entry, new_test: bool) -> None:
    """Add the run to the ledger (checked again under its lock) and write its test and the ledger's count of tests
    of these images and stream to the run's test.json (the summary's ``test``)."""
    from certify import ledger
    from certify.rundir import TEST_FILE, write_json

    verdict = ledger.record(entry, new_test)
    write_json(run.root / TEST_FILE, {
        "format_version": ledger.FORMAT_VERSION, "test": entry.test, "stream_key": entry.stream_key,
        "tests_of_these_images": verdict.tests, "ledger": str(ledger.ledger_path()),
        "note": f"the ledger held {verdict.tests} test(s) of these images on this stream (seed {entry.stream['seed']}) "
                "when this run started, this one included: their answers hold together with probability >= "
                "1 - tests * alpha; answers of one test hold together at alpha"})


def _work(job, run, split, smooth, pipeline, indices, pack, mode, n, extra, device, shard, track,
          entry=None) -> JobOutcome:
    from certify.report import finalize_run
    from certify.rundir import collect_rows, expected_indices, missing_report
    from certify.runner import iter_certify, iter_certify_adaptive, iter_predict, run_session
    from certify.units import plan_units
    from transdenoiser.runtime import hardware_description

    task = job.task
    run.open()
    if entry is not None:
        _record_test(run, entry, job.new_test)
    run.write_models(pipeline.classifier_metadata, pipeline.denoiser_metadata)
    images, labels = split.tensors("cpu")
    units = plan_units(indices, pack)

    def engine(pending):
        if mode:
            return iter_certify_adaptive(smooth, images, labels, pending, job.n0, n, job.alpha, job.seed, mode,
                                         job.radius, extra["tolerance"], job.sequential)
        if task == "certify":
            return iter_certify(smooth, images, labels, pending, job.n0, job.n, job.alpha, job.seed)
        return iter_predict(smooth, images, labels, pending, job.n, job.alpha, job.seed)

    hardware = hardware_description(device)
    session = run_session(run, units, engine, device, hardware, track=track)
    complete, before, now, kept = session.complete, session.done_before, session.done_now, session.kept
    outcome = JobOutcome(task=task, out=job.out, rows_path=run.rows_path(shard), status_path=run.status_path(shard),
                         device=str(device), hardware=hardware, complete=complete, done_before=before, done_now=now,
                         kept=kept, expected=len(expected_indices(units, shard)),
                         shard=str(shard) if shard is not None else None)
    if not complete:
        return outcome
    if shard is not None:
        _, rows, _ = collect_rows([job.out], task)
        outcome.waiting_for = missing_report(run.settings_dict(), rows)
        if outcome.waiting_for:
            return outcome
    outcome.summary = finalize_run([job.out])
    return outcome
