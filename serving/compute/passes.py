"""A pass on the scheduler's compute thread (``serving.compute.scheduler``): counted at once (``timed``), or, for a
pipelined counter, launched and collected one step apart (``advance``), and the record of a pass handed to the
thread (``InFlight``)."""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from serving.compute.engine import NoiseJob


@dataclass(eq=False)
class InFlight:
    """A pass handed to the counter: its jobs (with their tickets and keys), the counter's future (its results and
    its own seconds, ``timed``), when the pass began."""

    batch: list  # (ticket, key, job) of each job
    future: Awaitable[tuple[list, float]]  # awaited once
    started: float

    async def counts(self) -> tuple[list, list, float, float]:
        """(the jobs, one result per job, seconds from ``started`` until the counts were in, the counter's own
        seconds); a counter that fails as a whole fails every job of the pass."""
        try:
            results, counter_seconds = await self.future
        except Exception as exc:  # noqa: BLE001 - a counter that fails as a whole fails this pass's requests
            results, counter_seconds = [exc] * len(self.batch), 0.0
        return self.batch, results, time.perf_counter() - self.started, counter_seconds


def timed(counter: Callable[[Sequence[NoiseJob]], list], jobs: list[NoiseJob]) -> tuple[list, float]:
    """``counter(jobs)`` and its wall time, in the thread that runs it."""
    started = time.perf_counter()
    results = counter(jobs)
    return results, time.perf_counter() - started


def advance(counter, jobs: list[NoiseJob], previous: Any) -> tuple[Any, list | Exception | None, float]:
    """A pipelined counter's step, in the thread that runs it: launch ``jobs`` (if any), then collect the pass
    launched before (``previous``, if any): (the new pass's handle, or the exception that stopped its launch; the
    previous pass's results, one per job, or the exception that failed it as a whole; the step's wall time)."""
    started = time.perf_counter()
    launched: Any = None
    if jobs:
        try:
            launched = counter.launch(jobs)
        except Exception as exc:  # noqa: BLE001 - a launch that fails as a whole fails that pass's requests
            launched = exc
    results: list | Exception | None = None
    if isinstance(previous, Exception):
        results = previous
    elif previous is not None:
        try:
            results = counter.collect(previous)
        except Exception as exc:  # noqa: BLE001 - a pass that fails as a whole fails its requests
            results = exc
    return launched, results, time.perf_counter() - started
