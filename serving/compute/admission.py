"""Admission by deadline: admit a request only if it, and every request already admitted, will finish in time at a
rate the server can count on.

**The planning rate.** ``RateMeter`` measures the noisy samples per second the compute loop achieves while busy
(its passes and the loop's own time between them, so the event loop's other work under load is counted), in
windows of ``WINDOW_S`` seconds of busy time, and keeps the last ``WINDOWS`` of them (about a minute of busy
compute). Admission plans with ``RATE_MARGIN`` of the *lowest* of those window rates and of the current moving
average (``RateMeter.plan``): a rate the last minute of this machine, under its current load, has kept, less a
margin for what the next minute may take away. A shared machine's rate moves by tens of per cent from one minute
to the next; planning with the moving average alone admitted work the next minute could not finish (issue 68:
admitted requests ending in 504 under a retry storm on 2 shared cores).

**Deadline order.** Every request gets the same deadline once it is parsed (``max_latency_ms``), so deadline order
is arrival order. An admitted request ``i`` with ``r_i`` samples left is planned to finish ``RESERVE`` of its
deadline before the deadline: ``allowance_i = remaining_i - RESERVE * deadline_i``. At the planning rate ``rate``
its finish under the scheduler is at most ``bound_i = (C_i + sum_{j after i} min(r_j, r_i)) / rate``
(``round_robin_finishes``): ``C_i`` sums the samples left of every request whose deadline is not later than its
own, computed whole at worst, and round robin gives every request after it the same rounds, so at most as much as
``i`` still has. Its *slack* is ``allowance_i - bound_i``. The scheduler (``serving.compute.scheduler``) computes
round robin while every slack is at least ``FALLBACK`` of its deadline, and in deadline order otherwise (the rate
fell below the plan): in deadline order no slack falls (each second at a rate >= ``rate`` removes at least a
second's work from every ``C_i`` and adds none behind), so an admitted request finishes by its planned finish as
long as the real rate keeps the planning rate.

**Admission** of a request of ``c`` samples (for the adaptive kinds its worst case) with deadline ``D``:

- ``never`` (400): ``c / rate > NEW_MARGIN * D``, it would not finish in time even alone;
- admitted (``ok``) only if both hold:

  - it finishes in time behind **all the admitted work ahead of it**: ``(C + c) / rate <= NEW_MARGIN * D``, ``C``
    summing every admitted request's samples left (all have earlier deadlines);
  - it **pushes no admitted request** past its planned finish: with the newcomer behind it, every admitted
    request's ``bound_i`` stays within ``allowance_i - FALLBACK * deadline_i`` (its slack at least the fallback).
    An admitted request already beyond that (the rate fell) refuses every newcomer until it is back within it:
    the scheduler computes in deadline order meanwhile, and a newcomer admitted then would wait instead of being
    computed in turn;

- otherwise ``busy`` (503) at once, with ``retry_after_s``: the work that must drain first at the planning rate, at
  least 1 s, never beyond the last admitted deadline. Waiting it holds no place: the retry is a new request, judged
  against whatever is admitted when it arrives.

``NEW_MARGIN`` < ``1 - RESERVE`` leaves a newcomer a slack (``1 - RESERVE - NEW_MARGIN`` of its deadline, less the
fallback) in which the requests admitted after it, small ones included, are computed in turn beside it.

No admitted request is timed out while the real rate keeps the planning rate; below it, ``RESERVE`` of the
deadline is left before a 504. ``doomed`` stops a request at once only when it could not finish before its
deadline even at the best rate measured over the last minute (``RateMeter.best``).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NEW_MARGIN = 0.75  # a new request must be planned to finish within 75 % of its deadline, behind all admitted work
RESERVE = 0.1  # every admitted request is planned to finish 10 % of its deadline before that deadline
RATE_MARGIN = 0.75  # admission plans at 75 % of the lowest rate measured over the last minute of busy compute
FALLBACK = 0.02  # below this slack (x its deadline) the scheduler computes in deadline order; a newcomer keeps it
WINDOW_S = 2.0  # busy seconds in one rate window
WINDOWS = 30  # windows kept: about a minute of busy compute


@dataclass(frozen=True)
class Admitted:
    samples_left: int  # at most (a sequential work may stop early)
    remaining_s: float  # time left before its deadline
    deadline_s: float  # its whole deadline (its reserve is RESERVE x this)

    @property
    def allowance_s(self) -> float:
        """Time left before its planned finish (``RESERVE`` of its deadline before the deadline)."""
        return self.remaining_s - RESERVE * self.deadline_s

    @property
    def fallback_s(self) -> float:
        """The slack below which the scheduler computes in deadline order (``FALLBACK`` of its deadline)."""
        return FALLBACK * self.deadline_s


@dataclass(frozen=True)
class Decision:
    admit: bool
    reason: str  # "ok", "busy" or "never"
    finish_s: float  # the new request's planned finish behind all the admitted work ahead of it
    alone_s: float  # its time to finish on an idle server
    retry_after_s: int  # for "busy": when to retry (at least 1, at most the admitted deadline horizon)


def deadline_order(admitted: Sequence[Admitted]) -> list[int]:
    """Indices of ``admitted`` by deadline (ties: in the given order, the order of arrival)."""
    return sorted(range(len(admitted)), key=lambda i: admitted[i].remaining_s)


def overruns(admitted: Sequence[Admitted], rate: float) -> list[float]:
    """How far (seconds) each admitted request's bound at ``rate`` runs past its allowance less its fallback: its
    fallback less its slack (<= 0: in time). In the given order."""
    order = deadline_order(admitted)
    finishes = round_robin_finishes([admitted[i].samples_left for i in order], rate)
    result = [0.0] * len(admitted)
    for position, i in enumerate(order):
        result[i] = finishes[position] - (admitted[i].allowance_s - admitted[i].fallback_s)
    return result


def needs_deadline_order(admitted: Sequence[Admitted], rate: float) -> bool:
    """Whether some admitted request's slack at ``rate`` is below its fallback: the scheduler then computes in
    deadline order until none is. ``rate`` <= 0: never."""
    return rate > 0 and any(over > 0 for over in overruns(admitted, rate))


def round_robin_finishes(samples_left: Sequence[int], rate: float) -> list[float]:
    """For requests in deadline order with ``samples_left``, a bound on each one's finish (seconds) at ``rate`` under
    the scheduler: every request before it computed whole, every one after it at most as much as it still has
    (round robin gives each the same rounds; in deadline order those after it get none)."""
    left = np.asarray(samples_left, dtype=np.float64)
    if left.size == 0:
        return []
    behind = np.triu(np.minimum(left[None, :], left[:, None]), k=1).sum(axis=1)  # sum_{j > i} min(r_j, r_i)
    return list((np.cumsum(left) + behind) / rate)


def fits_alone(rate: float, deadline_s: float, new_margin: float = NEW_MARGIN) -> int:
    """The most noisy samples a request may need and still be admitted (``admission``'s ``never`` bound)."""
    return int(new_margin * rate * deadline_s)


def admission(samples: int, deadline_s: float, admitted: Sequence[Admitted], rate: float,
              new_margin: float = NEW_MARGIN) -> Decision:
    """Whether a request of ``samples`` noisy samples with deadline ``deadline_s`` can be admitted next to
    ``admitted`` at the planning rate ``rate`` samples/s (see the module docstring). ``rate`` <= 0 (not measured
    yet): admit."""
    if rate <= 0:
        return Decision(True, "ok", 0.0, 0.0, 0)
    alone_s = samples / rate
    if alone_s > new_margin * deadline_s:
        return Decision(False, "never", math.inf, alone_s, 0)
    newcomer = Admitted(samples, deadline_s, deadline_s)
    ahead = sum(a.samples_left for a in admitted if a.remaining_s <= deadline_s)  # deadline order, ties: arrival
    finish_s = (ahead + samples) / rate  # behind all the admitted work ahead of it
    # the admitted requests it would push past their planned finish (less the scheduler's fallback), and how far
    pushed = [over for over in overruns([*admitted, newcomer], rate)[:-1] if over > 0]
    if finish_s <= new_margin * deadline_s and not pushed:
        return Decision(True, "ok", finish_s, alone_s, 0)
    # Work that must drain first (at the planning rate): the excess of its own finish over its allowance, and for
    # each admitted request it would push, the excess of that request's bound over its allowance.
    excess = max([finish_s - new_margin * deadline_s, *pushed])
    horizon = max((a.remaining_s for a in admitted), default=1.0)
    retry = min(max(1, math.ceil(excess)), max(1, math.ceil(horizon)))
    return Decision(False, "busy", finish_s, alone_s, retry)


def doomed(samples_left: int, remaining_s: float, best_rate: float) -> bool:
    """Whether a request cannot finish before its deadline even with all the compute at ``best_rate`` (the best
    rate measured over the last minute): ``samples_left / best_rate`` over its remaining time. ``best_rate`` <= 0:
    never."""
    return best_rate > 0 and samples_left / best_rate > max(remaining_s, 0.0)


class RateMeter:
    """Noisy samples per second of busy compute: ``rate``, a moving average over about ``window_s`` seconds of busy
    time; ``plan``, the rate admission plans with (``margin`` of the lowest of the last ``windows`` window rates
    and ``rate``); ``best``, the highest of them (``doomed``)."""

    def __init__(self, window_s: float = WINDOW_S, windows: int = WINDOWS, margin: float = RATE_MARGIN):
        self.window_s = window_s
        self.margin = margin
        self.rate = 0.0  # 0: not measured yet
        self._window_rates: deque[float] = deque(maxlen=windows)
        self._window = [0, 0.0]  # samples and busy seconds of the window being measured

    def add(self, samples: int, seconds: float) -> None:
        if samples <= 0 or seconds <= 0:
            return
        measured = samples / seconds
        if self.rate == 0:
            self.rate = measured
        else:
            weight = min(1.0, seconds / self.window_s)
            self.rate = (1 - weight) * self.rate + weight * measured
        self._window[0] += samples
        self._window[1] += seconds
        if self._window[1] >= self.window_s:
            self._window_rates.append(self._window[0] / self._window[1])
            self._window = [0, 0.0]

    @property
    def plan(self) -> float:
        """The planning rate: ``margin`` x the lowest of the kept window rates and the moving average (0 until
        measured)."""
        return self.margin * min([self.rate, *self._window_rates]) if self.rate > 0 else 0.0

    @property
    def best(self) -> float:
        """The highest of the kept window rates and the moving average (0 until measured)."""
        return max([self.rate, *self._window_rates])
