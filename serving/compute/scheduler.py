"""Fair scheduling of the server's compute: requests share it in rounds of forward passes.

Every request in flight holds a *ticket* on one ``FairScheduler``. A single compute loop takes the tickets
in turn (round robin) and gives each a *round*: its next noise jobs, at most ``round_samples`` noisy
samples, or everything it has left when that is at most ``FINISHING_ROUNDS`` rounds (a *finishing round*: a
small request ends in its first round instead of waiting for another request's round between its halves).
With ``share_passes`` off (the CPU default) a forward pass is one ticket's round; with it on (the GPU default) one
pass gathers rounds of the tickets in turn, up to ``pass_samples`` samples, and (``overlap``, an option) the host
hands out a pass's counts while the next pass computes. Either way a small request waits for at most one round of
each request ahead of it, never for a large request's whole work. Between passes the loop drops the tickets whose
deadline has passed (``DeadlineExceeded``), whose client has disconnected (``ClientDisconnected``) or whose caller
stopped waiting; so a dropped request costs at most the passes already taken (one, or two with ``overlap``). New
tickets beyond ``max_queued`` are refused at once with
``QueueFull`` (a 503 with Retry-After), and a ticket whose work would exceed ``max_samples`` noisy samples
is refused with ``BudgetExceeded``. Admission is by deadline at a planning rate the server can count on (a margin
below the lowest rate measured over the last minute; ``serving.compute.admission``): a request is admitted only if
it, behind all the admitted work ahead of it, and every admitted request can still finish before their planned
finish; otherwise ``QueueFull`` at once, with a Retry-After bounded by the admitted deadlines, or ``NeverInTime``
when it could not finish within its deadline even alone. While an admitted request's slack is short (the rate fell
below the plan) the passes are taken in deadline order instead of round robin (``behind``).

The scheduler changes when samples are computed, never which: every job carries its own seed, so a
ticket's result is the same whatever it shared passes with (``serving.compute.engine``).

A *work* is any object with ``kind``, ``planned_samples``, ``samples_left``, ``samples_taken``, ``take(max_samples)`` ->
[(key, NoiseJob)], ``add(key, counts)``, ``finished`` and ``result()`` (``serving.compute.engine.CertifyWork``).
A sequential kind (look at the counts, then decide whether to draw more) fits the same protocol: ``take``
returns no job while it waits for counts, and ``finished`` turns true when it stops. After each pass the
adaptive works' counted blocks are read together (``serving.compute.engine.read_counted_blocks``): one evaluation
of a stopping rule covers every image of every request at the same block of the same rule.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from serving.compute.admission import Admitted, RateMeter, admission, doomed, fits_alone, needs_deadline_order
from serving.compute.engine import NoiseJob, read_counted_blocks
from serving.compute.passes import InFlight, advance, timed
from serving.compute.refusals import (
    BudgetExceeded,
    ClientDisconnected,
    DeadlineExceeded,
    NeverInTime,
    QueueFull,
    SchedulerRefusal,
)

Disconnected = Callable[[], Awaitable[bool]]
FINISHING_ROUNDS = 2  # a request with at most this many rounds' samples left computes them in one round


class Work(Protocol):
    kind: str
    planned_samples: int  # at most (a sequential kind may stop early)
    samples_left: int  # at most, not yet handed out
    samples_taken: int  # handed out so far

    def take(self, max_samples: int) -> list[tuple[Any, NoiseJob]]: ...

    def add(self, key: Any, counts: np.ndarray) -> None: ...

    @property
    def finished(self) -> bool: ...

    def result(self) -> Any: ...


async def _gone(disconnected: Disconnected) -> bool:
    try:
        return bool(await disconnected())
    except Exception:  # noqa: BLE001 - a probe that fails cannot tell; keep computing
        return False


@dataclass(eq=False)
class _Ticket:
    work: Work
    future: asyncio.Future
    deadline: float  # time.monotonic() value
    deadline_s: float
    disconnected: Disconnected | None
    max_samples: int
    samples_taken: int = 0


@dataclass
class SchedulerStats:
    """What the scheduler has done (read by the metrics and the tests)."""

    samples: int = 0  # noisy samples computed
    passes: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> requests dropped before finishing
    refused: dict[str, int] = field(default_factory=dict)  # reason -> requests refused at admission
    finished_samples: int = 0  # noisy samples of requests that finished (goodput's numerator)
    pass_sizes: list[int] = field(default_factory=list)  # tickets served in each of the last passes
    deadline_order_passes: int = 0  # passes taken in deadline order (an admitted request's slack was short)
    counter_seconds: float = 0.0  # the counter's own time on the passes (its thread's wall time): the rest of a
    # pass's time is the host's (the event loop taking jobs and handing out counts)


class FairScheduler:
    """Round-robin compute for concurrent requests; ``await scheduler.run(work, ...)`` -> ``work.result()``.

    ``counter``: evaluates a list of noise jobs, one result (counts or exception) per job (``VoteCounter``).
    ``on_pass``: optional hook called after each pass, and whenever the queue changes, with (kind -> samples
    computed, queue depth, samples still queued); ``on_counted``: optional hook called once per pass with the
    seconds the counter took on it; ``on_drop``: optional hook called with the reason of each
    request dropped unfinished; ``on_refuse``: with the reason of each request refused at admission (``queue``:
    ``max_queued`` in flight, ``busy``: it would not finish in time next to the admitted work, ``never``: not
    even alone).
    """

    def __init__(self, counter: Callable[[Sequence[NoiseJob]], list], round_samples: int, pass_samples: int,
                 share_passes: bool, max_queued: int, on_pass: Callable[[dict[str, int], int, int], None] | None = None,
                 on_drop: Callable[[str], None] | None = None, on_refuse: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, overlap: bool = False,
                 on_counted: Callable[[float], None] | None = None):
        self.counter = counter
        self.round_samples = round_samples
        self.pass_samples = pass_samples
        self.share_passes = share_passes
        self.max_queued = max_queued
        self.on_pass = on_pass
        self.on_counted = on_counted
        self.on_drop = on_drop
        self.on_refuse = on_refuse
        self.clock = clock
        self.stats = SchedulerStats()
        self._tickets: deque[_Ticket] = deque()
        self.rate_meter = RateMeter()  # noisy samples per second of busy compute; its plan: admission, Retry-After
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._last_served: _Ticket | None = None  # the ticket whose round ended the last pass
        self.overlap = overlap
        self._executor: ThreadPoolExecutor | None = None  # the compute thread: one pass at a time

    @property
    def depth(self) -> int:
        """Requests holding a ticket (computing or waiting for their next round)."""
        return len(self._tickets)

    @property
    def queued_samples(self) -> int:
        return sum(ticket.work.samples_left for ticket in self._tickets)

    @property
    def rate(self) -> float:
        """Measured noisy samples per second, a moving average (0 until the first pass)."""
        return self.rate_meter.rate

    @property
    def plan_rate(self) -> float:
        """The rate admission plans with (``RateMeter.plan``; 0 until the first pass)."""
        return self.rate_meter.plan

    def retry_after_s(self) -> int:
        """Seconds until the queued work would be done at the planning rate, at least 1 and at most the time
        to the last admitted deadline (by then every admitted request has finished or been stopped)."""
        if self.plan_rate <= 0 or not self._tickets:
            return 1
        horizon = max(ticket.deadline for ticket in self._tickets) - self.clock()
        return max(1, min(math.ceil(self.queued_samples / self.plan_rate), math.ceil(horizon)))

    def _admitted(self) -> list[Admitted]:
        """The tickets as admission sees them, in their order."""
        now = self.clock()
        return [Admitted(ticket.work.samples_left, ticket.deadline - now, ticket.deadline_s)
                for ticket in self._tickets]

    def _refuse(self, reason: str, error: SchedulerRefusal) -> SchedulerRefusal:
        self.stats.refused[reason] = self.stats.refused.get(reason, 0) + 1
        if self.on_refuse is not None:
            self.on_refuse(reason)
        return error

    def _admit(self, work: Work, deadline_s: float) -> None:
        """Refuse ``work`` unless it and every admitted request can finish in time (``admission``)."""
        rate = self.plan_rate
        decision = admission(work.samples_left, deadline_s, self._admitted(), rate)
        if decision.reason == "never":
            fits = fits_alone(rate, deadline_s)
            raise self._refuse("never", NeverInTime(
                f"the request needs {work.samples_left} noisy samples (images x (n0 + n)), about "
                f"{decision.alone_s:.0f} s at the {rate:.0f} samples/s this server plans with (a margin below "
                f"its lowest measured rate), more than its deadline of {deadline_s:g} s (max_latency_ms) allows; "
                f"lower the number of images or n (about {fits} noisy samples fit), or raise max_latency_ms"))
        if not decision.admit:
            retry = decision.retry_after_s
            raise self._refuse("busy", QueueFull(
                f"the server is busy: this request would not finish within its deadline of {deadline_s:g} s "
                f"(max_latency_ms) next to the {len(self._tickets)} requests already admitted without delaying "
                f"them, at the {rate:.0f} samples/s it plans with; retry in {retry} s (no place is held)",
                {"Retry-After": str(retry)}))

    async def run(self, work: Work, deadline_s: float, max_samples: int,
                  disconnected: Disconnected | None = None) -> Any:
        """Compute ``work`` in fair rounds; its result, or a ``SchedulerRefusal``."""
        if work.planned_samples > max_samples:
            raise BudgetExceeded(f"the request needs {work.planned_samples} noisy samples (images x (n0 + n)); "
                                 f"this server computes at most {max_samples} per request (max_request_samples)")
        if len(self._tickets) >= self.max_queued:
            retry = self.retry_after_s()
            raise self._refuse("queue", QueueFull(
                f"the server is busy ({len(self._tickets)} requests in flight, the most it queues: "
                f"max_queued_requests); retry in {retry} s", {"Retry-After": str(retry)}))
        self._admit(work, deadline_s)
        self._start()
        ticket = _Ticket(work, self._loop.create_future(), self.clock() + deadline_s, deadline_s, disconnected,
                         max_samples)
        if self._tickets and self._tickets[-1] is self._last_served:
            self._tickets.insert(len(self._tickets) - 1, ticket)  # next in turn, before the one just served
        else:
            self._tickets.append(ticket)
        self._report({})
        self._wake.set()
        return await ticket.future  # cancelling the caller cancels the future: the loop then drops the ticket

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._tickets.clear()  # tickets of a loop that has ended cannot be answered
            self._loop = loop
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._compute_loop(), name="fair-scheduler")

    async def shutdown(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False)  # a pass being computed finishes on its own; nothing waits for it
            self._executor = None
        for ticket in self._tickets:
            if not ticket.future.done():
                ticket.future.set_exception(QueueFull("the server is shutting down", {"Retry-After": "1"}))
        self._tickets.clear()

    def _drop(self, ticket: _Ticket, error: SchedulerRefusal | None, reason: str) -> None:
        self._tickets.remove(ticket)
        self.stats.dropped[reason] = self.stats.dropped.get(reason, 0) + 1
        if self.on_drop is not None:
            self.on_drop(reason)
        if error is not None and not ticket.future.done():
            ticket.future.set_exception(error)

    def _report(self, samples_by_kind: dict[str, int]) -> None:
        if self.on_pass is not None:
            self.on_pass(samples_by_kind, len(self._tickets), self.queued_samples)

    async def _prune(self) -> None:
        """Drop the tickets no one waits for, whose deadline has passed, or whose client has gone."""
        depth = len(self._tickets)
        await self._prune_tickets()
        if len(self._tickets) != depth:
            self._report({})

    async def _prune_tickets(self) -> None:
        now = self.clock()
        for ticket in list(self._tickets):
            if ticket.future.done():
                self._drop(ticket, None, "abandoned")
            elif now > ticket.deadline or doomed(ticket.work.samples_left, ticket.deadline - now,
                                                 self.rate_meter.best):
                work = ticket.work
                when = "passed" if now > ticket.deadline else "could no longer meet"
                self._drop(ticket, DeadlineExceeded(
                    f"the request {when} its deadline of {ticket.deadline_s:g} s (max_latency_ms) after "
                    f"{work.samples_taken} noisy samples (at most {work.planned_samples}); its computation was "
                    "stopped; retry later or with fewer images or a smaller n"), "deadline")
            elif ticket.disconnected is not None and await _gone(ticket.disconnected):
                self._drop(ticket, ClientDisconnected("the client disconnected; its computation was stopped"),
                           "disconnected")

    def behind(self) -> list[_Ticket] | None:
        """The tickets in deadline order while some admitted request's slack at the planning rate is below its
        fallback (``serving.compute.admission.needs_deadline_order``: the rate fell below the plan), else None.

        Computing in deadline order lowers no request's slack (each second at a rate >= the plan removes at least a
        second of work from every request's work ahead), where round robin lowers the slack of every request ahead
        of the one it serves; admission refuses every newcomer meanwhile."""
        if len(self._tickets) < 2 or not needs_deadline_order(self._admitted(), self.plan_rate):
            return None
        return sorted(self._tickets, key=lambda ticket: ticket.deadline)

    def _room(self, ticket: _Ticket, total: int) -> int:
        """Noisy samples ``ticket``'s round may take in a pass that already holds ``total``: ``round_samples``, or
        all it has left when that is at most ``FINISHING_ROUNDS`` rounds; with shared passes, at most what the pass
        has room for. A finishing round costs a request waiting behind it at most one more round of waiting, and
        saves the finishing request a whole turn of the queue."""
        room = self.round_samples
        if ticket.work.samples_left <= FINISHING_ROUNDS * room:
            room = ticket.work.samples_left
        return room if not self.share_passes else min(room, self.pass_samples - total)

    def _round(self, ticket: _Ticket, room: int) -> list[tuple[Any, NoiseJob]] | None:
        """``ticket``'s next jobs (at most ``room`` samples), or None when it was dropped for its budget."""
        jobs = ticket.work.take(room)
        size = sum(job.num_samples for _, job in jobs)
        if ticket.samples_taken + size > ticket.max_samples:
            self._drop(ticket, BudgetExceeded(f"the request asked for more than {ticket.max_samples} noisy "
                                              f"samples (max_request_samples); its computation was stopped"),
                       "budget")
            return None
        ticket.samples_taken += size
        return jobs

    def _next_pass(self) -> list[tuple[_Ticket, Any, NoiseJob]]:
        """One pass: the next ticket's round, or (sharing passes) rounds of the next tickets in turn, round after
        round while the pass has room (up to ``pass_samples``) and some ticket has jobs ready: a lone request fills
        the device's batch as several requests do, and a request arriving waits for the passes already taken
        either way.

        While an admitted request is ``behind`` its plan, the pass takes its rounds in deadline order instead (the
        earliest deadline with jobs ready first): admitted work finishes by its planned finish whatever arrived
        after it, as long as the real rate comes back to the plan."""
        batch: list[tuple[_Ticket, Any, NoiseJob]] = []
        total = 0
        behind = self.behind()
        if behind is not None:
            for ticket in behind:
                jobs = self._round(ticket, self._room(ticket, total))
                if not jobs:
                    continue
                batch.extend((ticket, key, job) for key, job in jobs)
                total += sum(job.num_samples for _, job in jobs)
                if not self.share_passes or total >= self.pass_samples:
                    break
            if batch:
                self.stats.deadline_order_passes += 1
                return batch
        while True:  # sharing passes: further sweeps while the pass has room and some request has jobs ready
            took = False
            for _ in range(len(self._tickets)):
                ticket = self._tickets[0]
                self._tickets.rotate(-1)
                jobs = self._round(ticket, self._room(ticket, total))
                if jobs is None:
                    continue
                self._last_served = ticket
                batch.extend((ticket, key, job) for key, job in jobs)
                total += sum(job.num_samples for _, job in jobs)
                took = took or bool(jobs)
                if jobs and (not self.share_passes or total >= self.pass_samples):
                    return batch
            if not (self.share_passes and took and self._tickets):
                return batch

    def _finish(self, ticket: _Ticket) -> None:
        if ticket.future.done() or not ticket.work.finished:
            return
        try:
            ticket.future.set_result(ticket.work.result())
            self.stats.finished_samples += ticket.samples_taken
        except Exception as exc:  # noqa: BLE001 - the failure belongs to this request only
            ticket.future.set_exception(exc)
        if ticket in self._tickets:
            self._tickets.remove(ticket)

    async def _compute_loop(self) -> None:
        try:
            await self._compute_forever()
        except Exception as exc:  # a bug here must not leave requests waiting for ever: fail them, and
            for ticket in self._tickets:  # the next request starts a new loop (``_start``)
                if not ticket.future.done():
                    ticket.future.set_exception(exc)
            self._tickets.clear()
            raise

    async def _compute_forever(self) -> None:
        """Pass after pass. With ``overlap``, the next pass goes to the counter as soon as the last one's counts are
        in, and the host hands those counts to the requests (reading the adaptive requests' rules, finishing
        requests) while the counter computes it. That pass holds the jobs ready before the hand-out: an adaptive work
        made for ``overlap`` hands out each image's next block before its current one is read
        (``SequentialWork(draw_ahead=True)``), so it has work; one pass is computed at a time either way, in the
        order taken."""
        if self.pipelined:
            return await self._compute_pipelined()
        in_flight: InFlight | None = None
        while True:
            busy_from = time.perf_counter()  # the loop's own time counts in the measured rate, waiting does not
            batch = await self._take_pass(pending=in_flight is not None)
            if batch is None:
                continue
            if not self.overlap:
                self._hand_out(*await self._count(batch, busy_from))
                continue
            computed = await in_flight.counts() if in_flight is not None else None
            launched = self._launch(batch, busy_from if computed is None else time.perf_counter()) if batch else None
            if computed is not None:
                self._hand_out(*computed)
            in_flight = launched

    async def _take_pass(self, pending: bool) -> list[tuple[_Ticket, Any, NoiseJob]] | None:
        """After dropping the tickets no one waits for, the next pass's jobs (empty: none ready, while a pass is
        ``pending``), or None when there is nothing to compute now: it waited for a request, or finished the works
        with nothing left to draw; the loop then goes round again."""
        await self._prune()
        if not self._tickets and not pending:
            self._wake.clear()
            await self._wake.wait()
            return None
        batch = self._next_pass() if self._tickets else []
        if not batch and not pending:
            for ticket in list(self._tickets):
                self._finish(ticket)  # works with nothing left to draw
            await asyncio.sleep(0)
            return None
        return batch

    @property
    def pipelined(self) -> bool:
        """Whether each pass is queued on the device before the last one is collected: with ``overlap``, for a
        counter that can (``VoteCounter`` on CUDA: ``launch`` returns before the device has computed)."""
        return self.overlap and bool(getattr(self.counter, "pipelined", False))

    async def _compute_pipelined(self) -> None:
        """``overlap`` with a pipelined counter: each step on the compute thread launches the next pass, then
        collects the one launched before it, so the device finds the next pass's work queued when it finishes the
        last; the host hands those counts out while the device computes the pass just launched. A step's wall
        time (launching one pass, waiting for the other) is the measured rate's time for the pass it collects."""
        in_flight: tuple[list[tuple[_Ticket, Any, NoiseJob]], Any] | None = None  # launched, not collected
        while True:
            batch = await self._take_pass(pending=in_flight is not None)
            if batch is None:
                continue
            launched, results, seconds = await self._submit(
                advance, self.counter, [job for _, _, job in batch], in_flight[1] if in_flight else None)
            if in_flight is not None:
                collected = in_flight[0]
                if isinstance(results, Exception):
                    results = [results] * len(collected)
                self._hand_out(collected, results, seconds, seconds)
            in_flight = (batch, launched) if batch else None

    def _submit(self, function, *args) -> Awaitable:
        """Run ``function(*args)`` on the scheduler's compute thread (at once: it starts before the event loop next
        yields)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="transdenoiser-passes")
        future = self._loop.run_in_executor(self._executor, function, *args)
        time.sleep(0)  # release the GIL: the compute thread starts the pass now, not at the next forced switch (5 ms)
        return future

    async def _count(self, batch: list[tuple[_Ticket, Any, NoiseJob]], started: float
                     ) -> tuple[list[tuple[_Ticket, Any, NoiseJob]], list, float, float]:
        """Without ``overlap``: the pass's counts from the compute thread, awaited at once."""
        return await self._launch(batch, started).counts()

    def _launch(self, batch: list[tuple[_Ticket, Any, NoiseJob]], started: float) -> InFlight:
        """Hand ``batch`` to the counter on the scheduler's compute thread (at once: the counter starts before the
        event loop next yields)."""
        return InFlight(batch, self._submit(timed, self.counter, [job for _, _, job in batch]), started)

    def _hand_out(self, batch: list[tuple[_Ticket, Any, NoiseJob]], results: list, seconds: float,
                  counter_seconds: float) -> None:
        """Give each job's counts (or error) to its request, read the adaptive requests' counted blocks, finish the
        requests that are done, and account for the pass."""
        samples = sum(job.num_samples for _, _, job in batch)
        self.rate_meter.add(samples, seconds)
        by_kind: dict[str, int] = {}
        served = []
        for (ticket, key, job), result in zip(batch, results, strict=True):
            by_kind[ticket.work.kind] = by_kind.get(ticket.work.kind, 0) + job.num_samples
            if ticket.future.done():
                continue
            if isinstance(result, Exception):
                ticket.future.set_exception(result)
                continue
            ticket.work.add(key, result)
            if ticket not in served:
                served.append(ticket)
        read_counted_blocks([ticket.work for ticket in served])  # adaptive requests: one rule reading a block
        self.stats.samples += samples
        self.stats.passes += 1
        self.stats.counter_seconds += counter_seconds
        if self.on_counted is not None:
            self.on_counted(counter_seconds)
        self.stats.pass_sizes = [*self.stats.pass_sizes[-999:], len(served)]
        for ticket in served:
            self._finish(ticket)
        self._report(by_kind)
