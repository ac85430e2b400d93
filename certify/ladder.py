"""One image, one test: every certificate about an image read from one family of tests on one stream of votes.

An image's estimation samples are one stream (:mod:`certify.streams`); the votes for the selected class cA after t
samples are S_t. Decide's one-sided mixture test at threshold p (:mod:`certify.one_sided`) certifies at count t when
S_t >= c_t(p), its count boundary. Each of these tests is a nonnegative supermartingale under pA <= p, so each is
wrong with probability <= alpha on its own; but a client that asks about one image at many radii collects many
tests, and a union of k tests may be wrong with probability up to k alpha.

The **ladder** makes them one test. Its rungs are the radii k * RADIUS_GRID (k = 1, 2, ...), with thresholds
p_k = Phi(r_k / sigma), increasing in k; rung k certifies at count t when S_t >= h_t(k), where

    h_t(k) = max over j <= k of c_t(p_j)          (the boundaries' running maximum up the ladder, per count t)

is nondecreasing in k. Every certificate the product gives about the image is "rung k certified at some count t":
decide at radius r_k (:class:`certify.sequential.DecideRule` with a ladder), estimate's radius (the highest rung
certified so far, :meth:`RadiusLadder.lower`) and a fixed-n answer of the server (the highest rung certified at
count n). Such a certificate is wrong only when pA < p_k. Then let j <= k be the lowest rung with p_j >= pA: since
h_t(k) >= c_t(p_j), the wrong certificate implies that the single test at p_j reached 1/alpha at some count, and
under pA <= p_j that happens with probability <= alpha (Ville's inequality, at every count at once). So all the
certificates about one image, at any radii, budgets, counts and request kinds, are wrong together with probability
<= alpha: one event, whatever is asked. Nothing in this argument needs the boundaries to be monotone in p; where
they are (checked numerically: :func:`monotone_violations`), h equals c and decide's answers are those of the
plain threshold test, bit for bit.

Rungs above the first one that cannot certify at count t even with every vote for cA (K_t) never certify at t:
their h_t is t + 1. The columns h_t are computed once per (alpha, sigma, t) and kept (a column of K_t counts; about
0.4 s for all 348 looks of a budget of 10,000 at sigma 0.25, alpha 0.001, on 2 CPU cores).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import ndtr

from certify.one_sided import decide_alternatives_cached, logsumexp_last
from transdenoiser.errors import UserError

RADIUS_GRID = 1e-3  # the ladder's rungs: radii k * RADIUS_GRID ([0,1]-pixel units); the server's request grid
SNAP = 1e-9  # a radius within this of a grid point is that grid point
MAX_Z = 8.0  # rungs up to radius MAX_Z * sigma: Phi(8) = 1 - 6e-16 is still below 1 in float64


def grid_radius(k: int) -> float:
    """The radius of rung ``k``: k * RADIUS_GRID as the float every part of the product uses."""
    return round(k * RADIUS_GRID, 12)


def rung_of(radius: float) -> int:
    """The rung at or above ``radius`` (radii within SNAP of a grid point snap to it); rounding up keeps a
    "certified" answer a claim at least as strong as the question asked."""
    if not (math.isfinite(radius) and radius > 0):
        raise UserError(f"the radius must be a finite number > 0, got {radius}")
    steps = radius / RADIUS_GRID
    nearest = round(steps)
    return max(1, nearest if abs(steps - nearest) <= SNAP / RADIUS_GRID else math.ceil(steps))


def radius_on_grid(radius: float) -> float:
    """``radius`` rounded up to the ladder's grid (:func:`rung_of`)."""
    return grid_radius(rung_of(radius))


def log_mixture_rows(successes: np.ndarray, trials: float, p: np.ndarray, qs: np.ndarray,
                     weights: np.ndarray) -> np.ndarray:
    """:func:`certify.one_sided.log_mixture` (alternatives above p) with each row its own threshold ``p[i]`` and
    alternatives ``qs[i]``: the same elementwise arithmetic, so each row's value is log_mixture's, bit for bit."""
    s = np.asarray(successes, dtype=float)[..., None]
    f = float(trials) - s
    p = np.asarray(p, dtype=float)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        success_term = np.where(s > 0, s * (np.log(qs) - np.log(p)), 0.0)
        failure_term = np.where(f > 0, f * (np.log1p(-qs) - np.log1p(-p)), 0.0)
        terms = np.log(weights) + success_term + failure_term
    terms = np.where(qs > p, terms, -np.inf)
    return logsumexp_last(terms)


class RadiusLadder:
    """Decide's tests at every rung of the radius grid for one (alpha, sigma), as hull boundaries (module doc)."""

    def __init__(self, alpha: float, sigma: float):
        if not 0 < alpha < 1:
            raise UserError(f"alpha must lie strictly between 0 and 1, got {alpha}")
        if not (math.isfinite(sigma) and sigma > 0):
            raise UserError(f"sigma must be a finite number > 0, got {sigma}")
        self.alpha, self.sigma = float(alpha), float(sigma)
        self.log_threshold = math.log(1.0 / self.alpha)
        top = int(math.floor(MAX_Z * self.sigma / RADIUS_GRID))
        self.radii = np.array([grid_radius(k) for k in range(1, top + 1)])
        self.thresholds = ndtr(self.radii / self.sigma)  # p_k, rung k at index k - 1
        self._alternatives: list[np.ndarray] = []  # qs of the rungs whose alternatives are known, in order
        self._weights: np.ndarray | None = None
        self._columns: dict[int, np.ndarray] = {}  # t -> h_t(1 .. K_t), nondecreasing

    @property
    def rungs(self) -> int:
        return len(self.radii)

    def _qs(self, count: int) -> np.ndarray:
        """The decide alternatives of rungs 1 .. ``count`` as rows (computed once per rung, in order)."""
        while len(self._alternatives) < count:
            qs, weights = decide_alternatives_cached(float(self.thresholds[len(self._alternatives)]))
            self._alternatives.append(qs)
            self._weights = weights
        return np.stack(self._alternatives[:count]) if count else np.zeros((0, 1))

    def _certifiable(self, t: int) -> int:
        """K_t - 1: how many rungs (from the first) can certify at count t with every vote for cA (the test's value
        at S = t rises with t and falls with p, but the count is found by testing, rung after rung, in blocks)."""
        found, block = 0, 64
        while found < self.rungs:
            end = min(self.rungs, found + block)
            qs = self._qs(end)[found:end]
            ok = log_mixture_rows(np.full(end - found, float(t)), t, self.thresholds[found:end], qs,
                                  self._weights) >= self.log_threshold
            if not ok.all():
                return found + int(np.argmin(ok))
            found, block = end, block * 2
        return found

    def column(self, t: int) -> np.ndarray:
        """h_t(k) for the rungs k = 1 .. K_t - 1 that can certify at count t (nondecreasing in k); every higher
        rung's is t + 1 (never). Computed once per count t and kept (read only)."""
        t = int(t)
        kept = self._columns.get(t)
        if kept is not None:
            return kept
        if t < 1:
            raise ValueError(f"a sample count must be >= 1, got {t}")
        count = self._certifiable(t)
        low = self._boundaries(t, count)
        hull = np.maximum.accumulate(low) if count else low
        hull.flags.writeable = False
        self._columns[t] = hull
        return hull

    def raw_column(self, t: int) -> np.ndarray:
        """c_t(p_k) for the rungs of :meth:`column` (before the running maximum): for the monotonicity check."""
        return self._boundaries(int(t), len(self.column(t)))

    def _boundaries(self, t: int, count: int) -> np.ndarray:
        """c_t(p_k) for rungs 1 .. ``count``: the fewest votes with which each rung's test certifies at count t
        (bisection over the votes, all rungs at once; S = t certifies every rung up to ``count``)."""
        qs, p = self._qs(count), self.thresholds[:count]
        low, high = np.zeros(count, dtype=np.int64), np.full(count, t, dtype=np.int64)
        while np.any(low < high):
            mid = (low + high) // 2
            hit = log_mixture_rows(mid, t, p, qs, self._weights) >= self.log_threshold
            high, low = np.where(hit, mid, high), np.where(hit, low, mid + 1)
        return low

    def certify_counts(self, counts: np.ndarray, rung: int) -> np.ndarray:
        """h_t(rung) at each sample count t of ``counts``: the fewest votes for cA with which ``rung`` is certified
        there (t + 1: never)."""
        if rung < 1:
            raise ValueError(f"rungs start at 1, got {rung}")
        out = np.empty(len(counts), dtype=np.int64)
        for i, t in enumerate(np.asarray(counts, dtype=np.int64).tolist()):
            column = self.column(t)
            out[i] = column[rung - 1] if rung <= len(column) else t + 1
        return out

    def highest_rungs(self, successes: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The highest rung certified by ``successes`` votes at sample counts ``counts`` (elementwise; 0: none)."""
        successes = np.asarray(successes, dtype=np.int64)
        counts = np.broadcast_to(np.asarray(counts, dtype=np.int64), successes.shape)
        out = np.zeros(successes.shape, dtype=np.int64)
        flat_s, flat_t, flat_out = successes.ravel(), counts.ravel(), out.reshape(-1)
        for t in np.unique(flat_t).tolist():
            where = np.flatnonzero(flat_t == t)
            flat_out[where] = np.searchsorted(self.column(t), flat_s[where], side="right")
        return out

    def lower(self, successes: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The threshold p_k of the highest rung certified (0 where none): a lower bound on pA that holds at every
        count at once, jointly with every other certificate of the ladder about the same stream."""
        rungs = self.highest_rungs(successes, counts)
        return np.where(rungs > 0, self.thresholds[np.maximum(rungs, 1) - 1], 0.0)

    def radius_of_threshold(self, p_lower: np.ndarray | float) -> np.ndarray:
        """The rung radius whose threshold is ``p_lower`` (0 for a bound below every rung): the grid radius itself,
        not sigma * Phi^-1 of it (which may round a hair below it)."""
        p = np.asarray(p_lower, dtype=float)
        index = np.searchsorted(self.thresholds, p, side="right")  # rungs with p_k <= p
        return np.where(index > 0, self.radii[np.maximum(index, 1) - 1], 0.0)


@functools.lru_cache(maxsize=16)
def ladder(alpha: float, sigma: float) -> RadiusLadder:
    """The ladder of (alpha, sigma), one object per setting in a process (its columns are kept)."""
    return RadiusLadder(alpha, sigma)


def monotone_violations(ladder_: RadiusLadder, counts: np.ndarray) -> int:
    """How many (count, rung) pairs have c_t(p_k) < c_t(p_{k-1}): where the plain threshold tests are not monotone
    in the radius and the ladder's hull answers more conservatively than a test alone would."""
    return int(sum(np.sum(np.diff(ladder_.raw_column(int(t))) < 0) for t in np.unique(counts)))

