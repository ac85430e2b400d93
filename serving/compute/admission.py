"""Admission by deadline: admit a request only if it, and every request already admitted, can still finish in time.

The scheduler (``serving.compute.scheduler``) serves its tickets round robin, so while ``k`` requests hold
tickets each gets about ``1/k`` of the compute: processor sharing. Under processor sharing at ``rate`` noisy
samples per second, a request with ``r_i`` samples left finishes after ``sum_j min(r_j, r_i) / rate`` seconds
(every other request ``j`` computes ``min(r_j, r_i)`` samples before ``i`` is done). A new request of ``c``
samples delays each admitted request ``i`` by ``min(c, r_i) / rate``.

``admission`` checks, at the measured rate:

- the request alone, at the share of the rate the scheduler guarantees an admitted request (``RESCUE_SHARE``,
  below): ``c / (RESCUE_SHARE * rate)`` within ``new_margin`` of its deadline; otherwise it is refused at once
  (``never``). A request that fits only at the full rate would finish only if no other request arrived while it
  computes: admitted on an idle server, a steady stream of small requests then leaves it behind and it ends in 504
  (measured: ``benchmarks/bench_stream_large.py``), and next to any admitted work it would be refused every time,
  whatever its Retry-After said;
- the request among the admitted ones: its projected finish within ``new_margin`` of its deadline;
- a *large* request (more than ``LARGE_FRACTION`` of what the server computes within the deadline) next to
  admitted work: it and all the admitted work within ``new_margin`` of its deadline at ``RESCUE_SHARE`` of the
  rate (with nothing admitted this is the check above). Processor sharing over the admitted requests does not
  see the requests admitted later: a steady stream of small ones keeps taking a share, and a large request
  admitted on the projection alone can drift behind
  (measured: heavy requests ending in 504 in a mixed soak). The scheduler gives a request that falls behind
  extra rounds (about half the compute, earliest deadline first), so this bound keeps it in time;
- every admitted request that was on time stays on time (within ``admitted_margin`` of its remaining time).
  One already projected beyond it (the rate fell) does not block admission: protecting it would refuse every
  newcomer, small ones included, while it lasts (measured: most small requests refused under a mixed soak).
  One that cannot finish even alone (``doomed``) is stopped by the scheduler at once instead of being computed
  to its deadline.

Otherwise the request is refused (``busy``) with ``retry_after_s``: the time for the admitted work to drain
enough that the request would fit, never beyond the last admitted deadline (by then every admitted request has
finished or been stopped). ``new_margin`` < ``admitted_margin`` leaves a slack that small requests use:
next to large requests admitted up to ``new_margin``, a small one still fits.

``RateMeter``: the noisy samples per second the compute loop achieves while busy (its passes and the loop's own
time between them), a moving average over about ``window_s`` seconds of busy time.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

NEW_MARGIN = 0.75  # a new request must be projected to finish within 75 % of its deadline
ADMITTED_MARGIN = 0.9  # and no admitted request may be pushed beyond 90 % of its remaining time
RESCUE_SHARE = 0.5  # the compute a request that falls behind is sure of (the scheduler's extra rounds)
LARGE_FRACTION = 0.1  # a request of more than 10 % of what the server computes within a deadline is large


@dataclass(frozen=True)
class Admitted:
    samples_left: int  # at most (a sequential work may stop early)
    remaining_s: float  # time left before its deadline


@dataclass(frozen=True)
class Decision:
    admit: bool
    reason: str  # "ok", "busy" or "never"
    finish_s: float  # the new request's projected time to finish among the admitted ones
    alone_s: float  # its time to finish on an idle server
    retry_after_s: int  # for "busy": when to retry (at least 1, at most the admitted deadline horizon)


def finish_times(samples_left: Sequence[int], rate: float) -> list[float]:
    """Each request's projected time to finish under processor sharing at ``rate`` samples/s."""
    ordered = sorted(samples_left)
    # sum_j min(r_j, r_i) = (sum of the r_j <= r_i) + r_i * (number of r_j > r_i); one pass over the sorted values
    prefix, sums = 0, {}
    for position, value in enumerate(ordered):
        prefix += value
        sums[value] = prefix + value * (len(ordered) - position - 1)  # the last of equal values sees them all
    return [sums[value] / rate for value in samples_left]


def fits_alone(rate: float, deadline_s: float, new_margin: float = NEW_MARGIN) -> int:
    """The most noisy samples a request may need and still be admitted (``admission``'s ``never`` bound)."""
    return int(RESCUE_SHARE * new_margin * rate * deadline_s)


def admission(samples: int, deadline_s: float, admitted: Sequence[Admitted], rate: float,
              new_margin: float = NEW_MARGIN, admitted_margin: float = ADMITTED_MARGIN) -> Decision:
    """Whether a request of ``samples`` noisy samples with deadline ``deadline_s`` can be admitted next to
    ``admitted`` at ``rate`` samples/s (see the module docstring). ``rate`` <= 0 (not measured yet): admit."""
    if rate <= 0:
        return Decision(True, "ok", 0.0, 0.0, 0)
    alone_s = samples / rate
    if alone_s > RESCUE_SHARE * new_margin * deadline_s:
        return Decision(False, "never", math.inf, alone_s, 0)
    before = finish_times([a.samples_left for a in admitted], rate)
    after = finish_times([a.samples_left for a in admitted] + [samples], rate)
    finish_s = after[-1]
    late = [i for i, a in enumerate(admitted)
            if before[i] <= admitted_margin * a.remaining_s < after[i]]
    # A large request next to admitted work must also fit behind all of it at the rescue share of the rate: the
    # share it is sure of if later requests (a steady stream) or a falling rate leave it behind.
    queued = sum(a.samples_left for a in admitted)
    lane_s = (queued + samples) / (RESCUE_SHARE * rate) if admitted and samples > LARGE_FRACTION * rate * deadline_s \
        else 0.0
    if finish_s <= new_margin * deadline_s and not late and lane_s <= new_margin * deadline_s:
        return Decision(True, "ok", finish_s, alone_s, 0)
    # Work that must drain first: the excess of the new request's own finish over its allowance, the admitted
    # work beyond what fits in its rescue allowance (drained at the full rate), and for each admitted request it
    # would make late, the delay it would add beyond that request's slack.
    excess = max(0.0, finish_s - new_margin * deadline_s,
                 (lane_s - new_margin * deadline_s) * RESCUE_SHARE if lane_s else 0.0)
    for i in late:
        excess = max(excess, after[i] - admitted_margin * admitted[i].remaining_s)
    horizon = max((a.remaining_s for a in admitted), default=1.0)
    retry = min(max(1, math.ceil(excess)), max(1, math.ceil(horizon)))
    return Decision(False, "busy", finish_s, alone_s, retry)


def doomed(samples_left: int, remaining_s: float, rate: float, slack: float = 1.25) -> bool:
    """Whether a request cannot finish before its deadline even with all the compute: ``samples_left / rate`` over
    ``slack`` times its remaining time (the slack allows for the rate rising again). ``rate`` <= 0: never."""
    return rate > 0 and samples_left / rate > slack * max(remaining_s, 0.0)


class RateMeter:
    """Noisy samples per second of busy compute, averaged over about ``window_s`` seconds of busy time."""

    def __init__(self, window_s: float = 2.0):
        self.window_s = window_s
        self.rate = 0.0  # 0: not measured yet

    def add(self, samples: int, seconds: float) -> None:
        if samples <= 0 or seconds <= 0:
            return
        measured = samples / seconds
        if self.rate == 0:
            self.rate = measured
            return
        weight = min(1.0, seconds / self.window_s)
        self.rate = (1 - weight) * self.rate + weight * measured
