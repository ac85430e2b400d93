"""Certification (and prediction) over a dataset: packing, per-image seeds, shards, resume and merge.

Reproducibility: image ``idx`` draws its noise from a generator seeded by (seed, idx)
(:func:`certify.core.image_seed`), and images are packed into fixed *units* of consecutive
positions of the work list (the unit plan depends only on the work list, n0 + n and the batch
size). A shard takes every k-th unit, so each image sees the same noise and the same
forward-pass companions whether the run is whole or sharded: merging the shards gives the same
rows as one run (the ``time`` column aside). A resumed run re-packs only the images it still
needs, which can change float32 rounding in the base model, never the statistics.

The run directory's files: :mod:`certify.rundir`; units and shards: :mod:`certify.units`. :func:`run_work` and
:func:`run_session` take any :class:`certify.rundir.RunDirectory` and an engine that yields its rows unit by unit:
``certify``/``predict`` (:mod:`certify.job`) and ``baseline-certify`` (:mod:`certify.baseline_job`) run through them.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from certify.core import Smooth, sequential_rule, validate_sampling
from certify.rowfile import RowWriter
from certify.rundir import CertifyRecord, PredictRecord, Record, RunDirectory
from certify.units import pack_size, plan_units
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent


def rank_device(device: torch.device, environ: dict[str, str] | None = None) -> torch.device:
    """Under torchrun, a bare ``cuda`` device becomes this rank's ``cuda:LOCAL_RANK``."""
    env = os.environ if environ is None else environ
    if device.type == "cuda" and device.index is None and "LOCAL_RANK" in env:
        return torch.device("cuda", int(env["LOCAL_RANK"]))
    return device


# ----------------------------------------------------------------------------------------------- engines

def _check_indices(images: torch.Tensor, indices: Sequence[int]) -> None:
    size = images.shape[0]
    for i in indices:
        if not 0 <= i < size:
            raise UserError(f"index {i} is past the end of the data ({size} images: 0..{size - 1})")


def iter_certify(smooth: Smooth, images: torch.Tensor, labels: torch.Tensor, units: Sequence[Sequence[int]],
                 n0: int, n: int, alpha: float, seed: int) -> Iterator[list[CertifyRecord]]:
    """Certify unit by unit (each unit's samples packed together); yield each unit's records when it is done."""
    validate_sampling(n0, n, alpha)
    for unit in units:
        _check_indices(images, unit)
        start = time.perf_counter()
        certificates = smooth.certify_many(images[list(unit)], n0, n, alpha,
                                           [smooth.image_generator(seed, i) for i in unit])
        seconds = (time.perf_counter() - start) / len(unit)
        yield [CertifyRecord.from_certificate(i, int(labels[i]), c, seconds)
               for i, c in zip(unit, certificates, strict=True)]


def iter_certify_adaptive(smooth: Smooth, images: torch.Tensor, labels: torch.Tensor,
                          units: Sequence[Sequence[int]], n0: int, n_max: int, alpha: float, seed: int, mode: str,
                          radius: float | None = None, tolerance: float | None = None,
                          method: str | None = None) -> Iterator[list[CertifyRecord]]:
    """:func:`iter_certify` for adaptive certification: ``mode`` decide (at ``radius``) or estimate.

    Each record's ``samples`` is n0 + the estimation samples the image used; a unit's time is split
    over its images in proportion to their samples."""
    validate_sampling(n0, n_max, alpha)
    rule = sequential_rule(mode, smooth.sigma, n_max, alpha, radius=radius, tolerance=tolerance, method=method)
    from certify.core import adaptive_many

    for unit in units:
        _check_indices(images, unit)
        start = time.perf_counter()
        certificates = adaptive_many(smooth, images[list(unit)], n0, rule,
                                     [smooth.image_generator(seed, i) for i in unit])
        elapsed = time.perf_counter() - start
        total = sum(c.samples for c in certificates)
        yield [CertifyRecord.from_certificate(i, int(labels[i]), c, elapsed * c.samples / total)
               for i, c in zip(unit, certificates, strict=True)]


def adaptive_pack_size(n0: int, batch: int) -> int:
    """Images per unit of an adaptive run: sized by the selection and the first look (most images stop early)."""
    from certify.confidence import DEFAULT_FIRST_LOOK

    return pack_size(n0 + DEFAULT_FIRST_LOOK, batch)


def iter_predict(smooth: Smooth, images: torch.Tensor, labels: torch.Tensor, units: Sequence[Sequence[int]],
                 n: int, alpha: float, seed: int) -> Iterator[list[PredictRecord]]:
    """:func:`iter_certify` for Cohen's PREDICT."""
    validate_sampling(None, n, alpha)
    for unit in units:
        _check_indices(images, unit)
        start = time.perf_counter()
        generators = [smooth.image_generator(seed, i) for i in unit]
        predictions = smooth.predict_many(images[list(unit)], n, alpha, generators)
        seconds = (time.perf_counter() - start) / len(unit)
        yield [PredictRecord(i, int(labels[i]), p, p == int(labels[i]), seconds)
               for i, p in zip(unit, predictions, strict=True)]


def _flatten(units_of_records: Iterator[list[Record]]) -> Iterator[Record]:
    for records in units_of_records:
        yield from records


def certify_dataset(smooth: Smooth, images: torch.Tensor, labels: torch.Tensor, indices: Sequence[int], n0: int,
                    n: int, alpha: float, seed: int, *, track: Track = silent) -> list[CertifyRecord]:
    """Certify ``images[indices]`` (float32 pixels in [0,1], (N, C, H, W); ``labels`` (N,)) with per-image seeds.

    Same arguments, same records (``seconds`` aside), however the call is split up: image ``idx``
    draws from the generator of (seed, idx). Units of images share forward passes.
    """
    _check_indices(images, indices)
    units = plan_units(indices, pack_size(n0 + n, smooth.batch_size))
    return list(track(_flatten(iter_certify(smooth, images, labels, units, n0, n, alpha, seed)),
                      desc="certify", total=len(indices)))


def run_work(directory: RunDirectory, units: list[list[int]], engine: Callable[[list[list[int]]], Iterator[list]],
             track: Track = silent) -> tuple[int, int]:
    """Run ``engine`` over this process's units minus the rows already done; returns (done before, done now)."""
    mine = directory.shard.take(units) if directory.shard is not None else units
    done = directory.done_indices()
    pending = [[i for i in unit if i not in done] for unit in mine]
    pending = [unit for unit in pending if unit]
    todo = sum(len(u) for u in pending)
    writer = RowWriter(directory.rows_path(directory.shard), directory.layout.schema, directory.header())
    written = 0
    try:
        for record in track(_flatten(engine(pending)), desc=directory.task, total=todo):
            writer.write(record)
            written += 1
            directory.heartbeat(len(done) + written)
    finally:
        writer.close()
    return len(done), written


@dataclass(frozen=True)
class Session:
    """One process's session over a run directory: rows found on disk at its start (``done_before``), rows it
    wrote (``done_now``), rows on disk at its end (``kept``), whether all its units were done (``complete``; False
    after Ctrl-C), its wall time and hardware (also recorded in the run's status file)."""

    done_before: int
    done_now: int
    kept: int
    complete: bool
    wall_seconds: float
    hardware: str


def run_session(directory: RunDirectory, units: list[list[int]],
                engine: Callable[[list[list[int]]], Iterator[list]], device: torch.device, hardware: str,
                track: Track = silent) -> Session:
    """:func:`run_work` as one recorded session: the status file opens it (and keeps its wall time current while it
    runs) and closes it with the rows on disk, however the work stopped. KeyboardInterrupt ends the session with
    ``complete`` False and the rows so far kept; any other error is raised after the status is written."""
    start = time.perf_counter()
    before = now = 0
    complete = False
    directory.start_session(device, hardware)
    try:
        before, now = run_work(directory, units, engine, track=track)
        complete = True
    except KeyboardInterrupt:
        pass
    finally:  # the status counts the rows on disk, whatever stopped the run
        kept = len(directory.done_indices())
        wall = time.perf_counter() - start
        directory.update_status(device, hardware, wall, kept, complete)
    return Session(before, now, kept, complete, wall, hardware)
