"""The sequential certification rules: when to stop, and what to answer, from the counts seen so far.

They read anytime-valid confidence sequences on pA (:mod:`certify.confidence`): a bound that holds at every
look at once stays valid at a stopping time chosen from the data.

Rules (pure functions of the count stream, shared by ``Smooth`` and the validity simulations):
- :class:`DecideRule`: is the prediction certified at L2 radius R? Stop with CERTIFIED as soon as
  lower >= Phi(R / sigma), with NOT_CERTIFIED as soon as upper < Phi(R / sigma), with BUDGET_SPENT at
  the last look. pA is the probability of the class cA chosen by the n0 selection samples. "Certified"
  is wrong only when lower > pA; "not certified" (a statement about cA: pA < Phi(R / sigma)) only when
  upper < pA; for a given image at most one of the two can be wrong (pA is on one side of the
  threshold), so the answer is wrong with probability <= alpha. "Not certified" says nothing of other
  classes: if the selection picked a class other than g's top class, g itself may be certified at R.
- :class:`EstimateRule`: the largest certifiable radius: the running maximum of the lower bounds
  (valid: all lower bounds hold at once), stopping once the radius cannot grow by more than
  ``tolerance`` up to n_max: neither with every remaining sample voting for cA, nor past the radius of
  the current upper bound on pA. The stopping rule only spends samples; it never touches validity.

The drivers are in :mod:`certify.streams`: ``run_streams`` look by look (the validity simulations),
``run_blocks`` block by block (``Smooth.decide`` / ``Smooth.certify_adaptive``), ``SequentialTest`` for one image
fed counts from outside (the server). Each rule's ``step_looks`` evaluates several looks at once with the same
elementwise arithmetic as ``step`` one look at a time.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri
from scipy.stats import norm

from certify.confidence import ConfidenceSequence
from certify.ladder import RADIUS_GRID, RadiusLadder, grid_radius, rung_of
from transdenoiser.errors import UserError

# Outcomes of one stream.
CONTINUE = 0
CERTIFIED = 1  # decide: lower bound >= Phi(R / sigma)
NOT_CERTIFIED = 2  # decide: upper bound < Phi(R / sigma)
BUDGET_SPENT = 3  # decide: n_max spent without an answer (reported as not certified, no claim)
ESTIMATED = 4  # estimate: stopped; the radius comes from the lower bound
OUTCOME_NAMES = {CONTINUE: "continue", CERTIFIED: "certified", NOT_CERTIFIED: "not_certified",
                 BUDGET_SPENT: "budget_spent", ESTIMATED: "estimated"}
DEFAULT_TOLERANCE = 0.05  # estimate mode: stop when the radius cannot grow by more than this (L2, [0,1] pixels)


def radius_of(p_lower: np.ndarray | float, sigma: float) -> np.ndarray:
    """sigma * Phi^-1(p) where p >= 1/2, else 0 (no certificate)."""
    p = np.asarray(p_lower, dtype=float)
    return np.where(p >= 0.5, sigma * ndtri(np.clip(p, 0.5, 1.0)), 0.0)  # norm.ppf's values, without its overhead


@functools.lru_cache(maxsize=64)  # asked by every decide request the server reads; a pure function of two floats
def max_decidable_radius(sigma: float, step: float = RADIUS_GRID) -> float:
    """The largest multiple of ``step`` (a ``step`` / 10^j where no multiple of ``step`` qualifies) whose decide
    threshold Phi(R / sigma), computed as :class:`DecideRule` does in float64, is below 1: R / sigma at most about
    8.29, beyond which Phi rounds to 1 and no count can certify or refute R. Every radius up to it has a threshold
    < 1 (Phi is monotone); the next multiple of ``step`` has threshold 1. Multiples are ``round(k * step, 12)``, the
    floats that a radius typed as a decimal (or rounded to the server's grid) is."""
    if not (math.isfinite(sigma) and sigma > 0 and math.isfinite(step) and step > 0):
        raise UserError(f"sigma and the radius step must be finite and > 0, got sigma {sigma}, step {step}")

    def multiple(k: int) -> float:
        return round(k * step, 12)

    def decidable(k: int) -> bool:
        return float(norm.cdf(multiple(k) / sigma)) < 1.0

    while not decidable(1):  # sigma so small that even one step is beyond float64's Phi: a finer step
        step /= 10
    low, high = 1, math.ceil(9.0 * sigma / step) + 1  # decidable(low); Phi(9) is 1 in float64: not decidable(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if decidable(middle) else (low, middle)
    return multiple(low)


# ----------------------------------------------------------------------------------------------- rules

class Rule:
    """A stopping rule over the looks of ``cs``: ``step`` maps counts at look k to outcomes (CONTINUE or final)."""

    cs: ConfidenceSequence

    @property
    def looks(self) -> np.ndarray:
        return self.cs.looks

    def step(self, look: int, successes: np.ndarray, best_lower: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    @property
    def row_looks(self) -> bool:
        """Whether :meth:`step_looks` takes looks of shape (streams, m), each stream at its own looks."""
        return False

    def step_looks(self, looks: np.ndarray, successes: np.ndarray, best_lower: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """``step`` at the consecutive looks ``looks`` (m indices) for cumulative counts ``successes`` (streams, m),
        as if each stream ran on past any outcome: outcome and best lower bound per (stream, look). A stream's
        answer is its first outcome other than CONTINUE, exactly what ``step`` one look at a time gives. Where
        :attr:`row_looks`, ``looks`` may also be (streams, m): row i the looks of stream i."""
        outcomes, lowers = [], []
        for i, look in enumerate(looks):
            outcome, best_lower = self.step(int(look), successes[:, i], best_lower)
            outcomes.append(outcome)
            lowers.append(best_lower)
        return np.stack(outcomes, axis=1), np.stack(lowers, axis=1)


@dataclass(frozen=True)
class DecideRule(Rule):
    """Certified at L2 radius ``radius``? (threshold Phi(radius / sigma) on pA). With a ``ladder``
    (:mod:`certify.ladder`; ``radius`` then on its grid) "certified" is the ladder's rung at ``radius``, so every
    certificate about one stream, at any radius, is one test; "not certified" is this radius's own test."""

    cs: ConfidenceSequence
    radius: float
    sigma: float
    ladder: RadiusLadder | None = None

    def __post_init__(self):
        if not (math.isfinite(self.radius) and self.radius > 0):
            raise UserError(f"the radius to decide must be > 0, got {self.radius}")
        largest = max_decidable_radius(self.sigma)
        if self.radius > largest:
            raise UserError(f"the radius {self.radius} cannot be decided at sigma {self.sigma:g}: float64's "
                            f"Phi(R / sigma) is 1 beyond R / sigma = 8.29; the largest radius that can be decided is "
                            f"{largest}")
        if self.ladder is not None:
            if self.ladder.alpha != self.cs.alpha or self.ladder.sigma != self.sigma:
                raise ValueError("the ladder's alpha and sigma must be the rule's")
            if grid_radius(rung_of(self.radius)) != self.radius:
                raise ValueError(f"a ladder decides radii on its grid only, got {self.radius}")

    @property
    def row_looks(self) -> bool:
        return self.cs.row_looks

    @functools.cached_property
    def threshold(self) -> float:
        """Phi(radius / sigma), computed once per rule (every reading of a block compares against it)."""
        return float(norm.cdf(self.radius / self.sigma))

    @functools.cached_property
    def _certify_at(self) -> np.ndarray | None:
        """The ladder's count boundary of this radius at each look (None without a ladder)."""
        if self.ladder is None:
            return None
        return self.ladder.certify_counts(self.looks, rung_of(self.radius))

    def _certified(self, successes: np.ndarray, looks: np.ndarray) -> np.ndarray:
        if self._certify_at is None:
            return self.cs.lower_at_least_looks(successes, looks, self.threshold)
        return np.asarray(successes) >= self._certify_at[np.asarray(looks)]

    def step(self, look: int, successes: np.ndarray, best_lower: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._certify_at is None:
            certified = self.cs.lower_at_least(successes, look, self.threshold)
        else:
            certified = np.asarray(successes) >= self._certify_at[int(look)]
        rejected = self.cs.upper_below(successes, look, self.threshold) & ~certified
        last = look == len(self.looks) - 1
        outcome = np.where(certified, CERTIFIED, np.where(rejected, NOT_CERTIFIED,
                                                          BUDGET_SPENT if last else CONTINUE))
        return outcome.astype(np.int8), np.where(certified, np.maximum(best_lower, self.threshold), best_lower)

    def step_looks(self, looks: np.ndarray, successes: np.ndarray, best_lower: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        looks = np.asarray(looks)
        certified = self._certified(successes, looks)
        rejected = self.cs.upper_below_looks(successes, looks, self.threshold) & ~certified
        last = np.atleast_2d(looks == len(self.looks) - 1)
        outcome = np.where(certified, CERTIFIED, np.where(rejected, NOT_CERTIFIED,
                                                          np.where(last, BUDGET_SPENT, CONTINUE)))
        best = np.asarray(best_lower)[:, None]  # unchanged until the stream's first outcome
        return outcome.astype(np.int8), np.where(certified, np.maximum(best, self.threshold), best)


@dataclass(frozen=True)
class EstimateRule(Rule):
    """The largest certifiable radius under the budget; stop when it cannot grow by more than ``tolerance``. With a
    ``ladder`` (:mod:`certify.ladder`) the bound is the highest rung certified so far (a radius on its grid), one
    test with every other certificate about the same stream."""

    cs: ConfidenceSequence
    sigma: float
    tolerance: float = DEFAULT_TOLERANCE
    ladder: RadiusLadder | None = None

    def __post_init__(self):
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise UserError(f"the radius tolerance must be >= 0, got {self.tolerance}")
        if self.ladder is not None and (self.ladder.alpha != self.cs.alpha or self.ladder.sigma != self.sigma):
            raise ValueError("the ladder's alpha and sigma must be the rule's")

    @property
    def row_looks(self) -> bool:
        return self.cs.row_looks

    def radius(self, p_lower: np.ndarray | float) -> np.ndarray:
        """The radius certified by the lower bound ``p_lower`` (with a ladder: its rung's radius, exactly)."""
        return radius_of(p_lower, self.sigma) if self.ladder is None else self.ladder.radius_of_threshold(p_lower)

    def _lowers(self, successes: np.ndarray, looks: np.ndarray) -> np.ndarray:
        if self.ladder is None:
            return self.cs.lower_looks(successes, looks)
        return self.ladder.lower(successes, np.broadcast_to(np.atleast_2d(self.looks[looks]), np.shape(successes)))

    def step(self, look: int, successes: np.ndarray, best_lower: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        outcome, lower = self.step_looks(np.array([look]), np.asarray(successes)[:, None], best_lower)
        return outcome[:, 0], lower[:, 0]

    def step_looks(self, looks: np.ndarray, successes: np.ndarray, best_lower: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Stop once the radius cannot grow by more than ``tolerance``: neither the upper bound on pA nor the lower
        bound with every remaining sample voting for cA lies above p_stop = Phi((radius(lower) + tolerance) /
        sigma), asked as "is the bound at most p_stop" (for the mixture one evaluation, no bisection)."""
        looks = np.asarray(looks)
        successes = np.asarray(successes)
        bounds = np.concatenate([np.asarray(best_lower, dtype=float)[:, None],
                                 self._lowers(successes, looks)], axis=1)
        lower = np.maximum.accumulate(bounds, axis=1)[:, 1:]  # the running maximum, look by look
        last = len(self.looks) - 1
        p_stop = ndtr((self.radius(lower) + self.tolerance) / self.sigma)  # norm.cdf's values
        remaining = self.cs.n_max - np.atleast_2d(self.looks[looks])
        if self.ladder is None:
            reachable = self.cs.lower_at_most_looks(successes + remaining, np.full(looks.shape, last), p_stop)
        else:
            reachable = self.ladder.lower(successes + remaining, self.cs.n_max) <= p_stop
        done = self.cs.upper_at_most_looks(successes, looks, p_stop) | reachable
        return np.where(done | np.atleast_2d(looks == last), ESTIMATED, CONTINUE).astype(np.int8), lower


@dataclass(frozen=True)
class FixedRule(Rule):
    """The server's fixed-n answer from the image's one test: the highest rung of ``ladder`` certified by the votes
    among the first n_max estimation samples of the stream (the rule reads only the last look; the samples are
    drawn as every other kind draws them, so they are the same votes)."""

    cs: ConfidenceSequence
    sigma: float
    ladder: RadiusLadder

    def __post_init__(self):
        if self.ladder.alpha != self.cs.alpha or self.ladder.sigma != self.sigma:
            raise ValueError("the ladder's alpha and sigma must be the rule's")

    @property
    def row_looks(self) -> bool:
        return self.cs.row_looks

    def radius(self, p_lower: np.ndarray | float) -> np.ndarray:
        return self.ladder.radius_of_threshold(p_lower)

    def step(self, look: int, successes: np.ndarray, best_lower: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        outcome, lower = self.step_looks(np.array([look]), np.asarray(successes)[:, None], best_lower)
        return outcome[:, 0], lower[:, 0]

    def step_looks(self, looks: np.ndarray, successes: np.ndarray, best_lower: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        looks = np.broadcast_to(np.asarray(looks), np.shape(successes))
        last = looks == len(self.looks) - 1
        lower = np.where(last, self.ladder.lower(np.where(last, successes, 0), self.cs.n_max),
                         np.asarray(best_lower, dtype=float)[:, None])
        return np.where(last, ESTIMATED, CONTINUE).astype(np.int8), lower
