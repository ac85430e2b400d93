"""Anytime-valid confidence bounds on pA: the confidence sequences the sequential rules read.

Randomized smoothing certifies class cA at x with radius sigma * Phi^-1(pA) whenever pA is a lower
bound on P[f(D(x + e)) = cA]. Cohen et al. draw a fixed number n of estimation samples and use one
Clopper-Pearson bound. Here the estimation samples come in rounds and the procedure may stop after
any round, on what it has seen so far. A bound computed at a data-dependent stopping time is only
valid if it holds at every look at once, so the constructions below are *confidence sequences*:

    P[ for every look k:  lower_k <= pA ] >= 1 - alpha,   P[ for every look k:  upper_k >= pA ] >= 1 - alpha

(each side on its own; both at once: >= 1 - 2 alpha for ``union-cp``, >= 1 - alpha for the mixture's
interval) whatever pA is, so a certificate read off at any stopping time, however the time was chosen
from the data, is wrong with probability at most alpha: every answer uses one side only.

- :class:`UnionClopperPearson`: the looks are a schedule t_1 < t_2 < ... < t_K = n_max fixed in
  advance; look k uses a one-sided Clopper-Pearson bound at level alpha_k with sum_k alpha_k = alpha.
  Each bound fails with probability <= alpha_k, so some bound fails with probability <= alpha (the
  union bound). Weights: ``uniform`` (alpha / K each) or ``quadratic`` (proportional to 1 / k^2).
- :class:`BetaBinomialMixture`: Robbins' mixture martingale. For a candidate p, with S successes
  and F failures after t samples, M_t(p) = B(a + S, b + F) / B(a, b) / (p^S (1 - p)^F) is the
  likelihood ratio of a Beta(a, b) mixture of Bernoulli laws against Bernoulli(p); under pA = p it is
  a nonnegative martingale with M_0 = 1, so by Ville's inequality P[exists t: M_t(pA) >= 1/alpha] <= alpha.
  The set {p : M_t(p) < 1/alpha} is an interval (p -> S ln p + F ln(1-p) is concave) that contains pA
  at every t simultaneously with probability >= 1 - alpha. It is valid at every t, not only at looks.
- :class:`OneSidedMixture` (the default): one-sided mixture e-processes, each answer a one-sided test
  (:mod:`certify.one_sided`); valid at every sample count, whatever n_max.

The stopping rules built on them are in :mod:`certify.sequential`.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import betainc, betaincc, betaincinv, betaln

from transdenoiser.errors import UserError

METHODS = ("one-sided-mixture", "beta-mixture", "union-cp")
DEFAULT_METHOD = "one-sided-mixture"  # fewest samples, valid across re-runs (docs/CERTIFY.md)
DEFAULT_FIRST_LOOK = 16  # estimation samples before the first look
DEFAULT_LOOK_RATIO = 1.01  # each look at about this many times the samples of the one before ...
DEFAULT_LOOK_STEP = 8  # ... and at least this many samples after it
UNION_CP_FIRST_LOOK, UNION_CP_LOOK_RATIO = 64, 1.5  # union-cp's own looks (its alpha split depends on n_max)
DEFAULT_SPENDING = "uniform"
DEFAULT_PRIOR = (1.0, 0.1)  # Beta(a, b) of the mixture: mass near 1, where the votes of most images lie
BISECTION_STEPS = 60
DECIDE_BOUNDARIES_KEPT = 16  # decide thresholds whose count boundaries one confidence sequence keeps
LOWER_BOUNDS_KEPT = 1 << 16  # (sample count, votes) pairs whose lower bound one confidence sequence keeps


def geometric_looks(n_max: int, first: int = DEFAULT_FIRST_LOOK, ratio: float = DEFAULT_LOOK_RATIO,
                    step: int = DEFAULT_LOOK_STEP) -> np.ndarray:
    """Sample counts t_1 < ... < t_K = n_max at which the bounds are evaluated: first, then each look at
    max(previous + step, ceil(previous * ratio)), then n_max. The looks below n_max do not depend on n_max:
    a larger budget only adds looks at the end."""
    if n_max < 1:
        raise UserError(f"the sample budget must be >= 1, got {n_max}")
    if first < 1:
        raise UserError(f"the first look must be >= 1 sample, got {first}")
    if not ratio > 1:
        raise UserError(f"the look ratio must be > 1, got {ratio}")
    if step < 1:
        raise UserError(f"the look step must be >= 1 sample, got {step}")
    looks, t = [], first
    while t < n_max:
        looks.append(t)
        t = max(t + step, math.ceil(t * ratio))
    looks.append(n_max)
    return np.asarray(looks, dtype=np.int64)


class ConfidenceSequence:
    """Bounds on a Bernoulli mean at the looks ``looks``; both sides hold at every look with prob >= 1 - alpha."""

    name = "abstract"
    row_looks = False  # whether the ``*_looks`` methods also take looks of shape (streams, m): one row per stream

    def __init__(self, looks: np.ndarray, alpha: float):
        if not 0 < alpha < 1:
            raise UserError(f"alpha must lie strictly between 0 and 1, got {alpha}")
        looks = np.asarray(looks, dtype=np.int64)
        if looks.ndim != 1 or len(looks) == 0 or looks[0] < 1 or np.any(np.diff(looks) <= 0):
            raise ValueError("looks must be increasing sample counts >= 1")
        self.looks = looks
        self.alpha = float(alpha)
        self.schedule: tuple[int, float, int] | None = None  # (first, ratio, step) of ``geometric_looks``, if any

    @property
    def n_max(self) -> int:
        return int(self.looks[-1])

    def lower(self, successes: np.ndarray, look: int) -> np.ndarray:
        raise NotImplementedError

    def upper(self, successes: np.ndarray, look: int) -> np.ndarray:
        raise NotImplementedError

    def lower_at_least(self, successes: np.ndarray, look: int, p: float) -> np.ndarray:
        """lower(successes, look) >= p, decided without rounding error where the construction allows."""
        return self.lower(successes, look) >= p

    def upper_below(self, successes: np.ndarray, look: int, p: float) -> np.ndarray:
        return self.upper(successes, look) < p

    def describe(self) -> dict:
        return {"method": self.name, "alpha": self.alpha, "looks": [int(t) for t in self.looks]}

    def upper_at_most_looks(self, successes: np.ndarray, looks: np.ndarray, p: np.ndarray) -> np.ndarray:
        """upper <= p elementwise (``successes``, ``p``: (streams, m)) at the looks ``looks``."""
        return self.upper_looks(successes, looks) <= p

    def lower_at_most_looks(self, successes: np.ndarray, looks: np.ndarray, p: np.ndarray) -> np.ndarray:
        """lower <= p elementwise at the looks ``looks``."""
        return self.lower_looks(successes, looks) <= p

    # Several looks at once: ``successes`` (streams, m) cumulative votes at the looks ``looks`` (m indices; with
    # ``row_looks``, also (streams, m): each stream its own looks). These defaults evaluate one look (column) at a
    # time; a construction may override them with one vectorised evaluation that gives the same numbers
    # elementwise.

    def lower_looks(self, successes: np.ndarray, looks: np.ndarray) -> np.ndarray:
        return _by_column(lambda s, k: self.lower(s, k), successes, looks)

    def upper_looks(self, successes: np.ndarray, looks: np.ndarray) -> np.ndarray:
        return _by_column(lambda s, k: self.upper(s, k), successes, looks)

    def lower_at_least_looks(self, successes: np.ndarray, looks: np.ndarray, p: float) -> np.ndarray:
        return _by_column(lambda s, k: self.lower_at_least(s, k, p), successes, looks)

    def upper_below_looks(self, successes: np.ndarray, looks: np.ndarray, p: float) -> np.ndarray:
        return _by_column(lambda s, k: self.upper_below(s, k, p), successes, looks)


def _by_column(evaluate, successes: np.ndarray, looks: np.ndarray) -> np.ndarray:
    successes = np.asarray(successes)
    return np.stack([np.asarray(evaluate(successes[:, i], int(k))) for i, k in enumerate(looks)], axis=1)


class UnionClopperPearson(ConfidenceSequence):
    """One-sided Clopper-Pearson bounds at level alpha_k at look k, with sum_k alpha_k = alpha (union bound)."""

    name = "union-cp"
    SPENDINGS = ("uniform", "quadratic")

    def __init__(self, looks: np.ndarray, alpha: float, spending: str = DEFAULT_SPENDING):
        super().__init__(looks, alpha)
        if spending not in self.SPENDINGS:
            raise UserError(f"spending must be one of {', '.join(self.SPENDINGS)}, got {spending!r}")
        k = np.arange(1, len(self.looks) + 1, dtype=float)
        weights = np.ones_like(k) if spending == "uniform" else 1.0 / k ** 2
        self.spending = spending
        self.alphas = self.alpha * weights / weights.sum()
        self._criticals: dict[tuple[int, float, str], int] = {}

    def lower(self, successes: np.ndarray, look: int) -> np.ndarray:
        s = np.asarray(successes, dtype=float)
        t = float(self.looks[look])
        bound = betaincinv(np.maximum(s, 1.0), t - s + 1.0, self.alphas[look])  # Beta quantile
        return np.where(s > 0, bound, 0.0)

    def upper(self, successes: np.ndarray, look: int) -> np.ndarray:
        s = np.asarray(successes, dtype=float)
        t = float(self.looks[look])
        bound = betaincinv(s + 1.0, np.maximum(t - s, 1.0), 1.0 - self.alphas[look])
        return np.where(s < t, bound, 1.0)

    def _critical(self, look: int, p: float, side: str) -> int:
        """Lower side: the fewest successes whose bound is >= p, i.e. P[Binomial(t, p) >= S] = I_p(S, t - S + 1)
        <= alpha_k. Upper side: the most successes whose upper bound is < p, i.e. P[Binomial(t, p) <= S] =
        1 - I_p(S + 1, t - S) < alpha_k. Both tails are monotone in S: found by bisection, cached."""
        key = (look, float(p), side)
        if key not in self._criticals:
            t, a = int(self.looks[look]), self.alphas[look]
            if side == "lower":  # smallest S in [1, t + 1] with I_p(S, t - S + 1) <= a (t + 1: none)
                low, high = 1, t + 1
                while low < high:
                    mid = (low + high) // 2
                    if betainc(mid, t - mid + 1, p) <= a:
                        high = mid
                    else:
                        low = mid + 1
                self._criticals[key] = low
            else:  # largest S in [-1, t - 1] with 1 - I_p(S + 1, t - S) < a (-1: none)
                low, high = -1, t - 1
                while low < high:
                    mid = (low + high + 1) // 2
                    if betaincc(mid + 1, t - mid, p) < a:
                        low = mid
                    else:
                        high = mid - 1
                self._criticals[key] = low
        return self._criticals[key]

    def lower_at_least(self, successes: np.ndarray, look: int, p: float) -> np.ndarray:
        return np.asarray(successes) >= self._critical(look, p, "lower")

    def upper_below(self, successes: np.ndarray, look: int, p: float) -> np.ndarray:
        return np.asarray(successes) <= self._critical(look, p, "upper")

    def describe(self) -> dict:
        return {**super().describe(), "spending": self.spending, "alpha_per_look": [float(a) for a in self.alphas]}


class BetaBinomialMixture(ConfidenceSequence):
    """Robbins' Beta(a, b) mixture confidence sequence (Ville's inequality); valid at every sample count."""

    name = "beta-mixture"

    def __init__(self, looks: np.ndarray, alpha: float, prior: tuple[float, float] = DEFAULT_PRIOR):
        super().__init__(looks, alpha)
        a, b = prior
        if not (a > 0 and b > 0):
            raise UserError(f"the Beta prior's parameters must be > 0, got {prior}")
        self.prior = (float(a), float(b))
        self.log_threshold = math.log(1.0 / self.alpha)

    def log_martingale(self, successes: np.ndarray, trials: np.ndarray | int, p: np.ndarray | float) -> np.ndarray:
        """ln M_t(p) = ln B(a + S, b + F) - ln B(a, b) - S ln p - F ln(1 - p)."""
        a, b = self.prior
        s = np.asarray(successes, dtype=float)
        f = np.asarray(trials, dtype=float) - s
        p = np.asarray(p, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_likelihood = np.where(s > 0, s * np.log(p), 0.0) + np.where(f > 0, f * np.log1p(-p), 0.0)
        return betaln(a + s, b + f) - betaln(a, b) - log_likelihood

    def _bisect(self, s: np.ndarray, t: float, low: np.ndarray, high: np.ndarray, rising: bool) -> np.ndarray:
        """The end of {p : ln M < ln 1/alpha} in [low, high], returned on the rejected (conservative) side."""
        for _ in range(BISECTION_STEPS):
            mid = (low + high) / 2
            rejected = self.log_martingale(s, t, mid) >= self.log_threshold
            if rising:  # rejected above the end: keep ``high`` rejected
                high = np.where(rejected, mid, high)
                low = np.where(rejected, low, mid)
            else:  # rejected below the end: keep ``low`` rejected
                low = np.where(rejected, mid, low)
                high = np.where(rejected, high, mid)
        return high if rising else low

    def lower(self, successes: np.ndarray, look: int) -> np.ndarray:
        s = np.asarray(successes, dtype=float)
        t = float(self.looks[look])
        mle = s / t
        bound = self._bisect(s, t, np.zeros_like(s), mle, rising=False)
        return np.where(s > 0, bound, 0.0)

    def upper(self, successes: np.ndarray, look: int) -> np.ndarray:
        s = np.asarray(successes, dtype=float)
        t = float(self.looks[look])
        mle = s / t
        bound = self._bisect(s, t, mle, np.ones_like(s), rising=True)
        return np.where(s < t, bound, 1.0)

    def lower_at_least(self, successes: np.ndarray, look: int, p: float) -> np.ndarray:
        # The confidence set is an interval around S/t: its lower end is >= p iff p <= S/t and p is rejected.
        s = np.asarray(successes, dtype=float)
        t = float(self.looks[look])
        return (s >= p * t) & (self.log_martingale(s, t, p) >= self.log_threshold)

    def upper_below(self, successes: np.ndarray, look: int, p: float) -> np.ndarray:
        s = np.asarray(successes, dtype=float)
        t = float(self.looks[look])
        return (s < p * t) & (self.log_martingale(s, t, p) >= self.log_threshold)

    def describe(self) -> dict:
        return {**super().describe(), "prior": list(self.prior)}


class OneSidedMixture(ConfidenceSequence):
    """One-sided mixture e-processes (:mod:`certify.one_sided`): decide's threshold tests use alternatives spaced
    by decision time around the threshold; the bounds (estimate mode) a fixed grid. Valid at every sample count,
    whatever n_max: each side fails with probability <= alpha."""

    name = "one-sided-mixture"
    row_looks = True

    def __init__(self, looks: np.ndarray, alpha: float):
        from certify.one_sided import OneSidedMixtureTests

        super().__init__(looks, alpha)
        self.tests = OneSidedMixtureTests(self.alpha)
        self._decide_boundaries: dict[float, tuple[np.ndarray, np.ndarray]] = {}  # threshold -> (certify_at, reject_at)
        self._lower_bounds: dict[int, float] = {}  # t * (n_max + 1) + votes -> the lower bound (``lower_looks``)

    def decide_boundaries(self, p: float) -> tuple[np.ndarray, np.ndarray]:
        """Decide's two tests at threshold ``p`` as count boundaries, per look: the fewest votes for cA with which
        the test above p shows pA > p (t + 1: none at that look), and the most with which the test below p shows
        pA < p (-1: none). At a fixed sample count each test's mixture is monotone in the votes (every term is, by
        at least 0.06 in ln M per vote at p = Phi(2), where rounding moves ln M by about 1e-13), so comparing a
        count with its look's boundary answers exactly as evaluating the test does (tested at every count of many
        looks). The boundaries are found once per threshold, by bisection over the counts with the tests
        themselves (about 4 ms for the 348 looks of a budget of 10,000, on 2 CPU cores); a reading of a block is
        then two comparisons per look and stream instead of two mixtures of ten alternatives."""
        from certify.one_sided import first_true_counts

        key = float(p)
        found = self._decide_boundaries.get(key)
        if found is None:
            tests = self.tests
            certify_at = first_true_counts(lambda s, t: tests.above(s, t, key), self.looks)
            reject_at = first_true_counts(lambda s, t: ~tests.below(s, t, key), self.looks) - 1
            if len(self._decide_boundaries) >= DECIDE_BOUNDARIES_KEPT:
                self._decide_boundaries.pop(next(iter(self._decide_boundaries)), None)  # the oldest threshold
            found = self._decide_boundaries[key] = (certify_at, reject_at)
        return found

    def lower(self, successes: np.ndarray, look: int) -> np.ndarray:
        return self.tests.lower(successes, int(self.looks[look]))

    def upper(self, successes: np.ndarray, look: int) -> np.ndarray:
        return self.tests.upper(successes, int(self.looks[look]))

    def lower_at_least(self, successes: np.ndarray, look: int, p: float) -> np.ndarray:
        """pA >= p shown by decide's test at threshold p (its own mixture, not the bounds': see the module), read
        off its count boundary (:meth:`decide_boundaries`)."""
        return np.asarray(successes) >= self.decide_boundaries(p)[0][int(look)]

    def upper_below(self, successes: np.ndarray, look: int, p: float) -> np.ndarray:
        return np.asarray(successes) <= self.decide_boundaries(p)[1][int(look)]

    # Several looks in one vectorised evaluation (the same elementwise arithmetic as one look at a time).

    def lower_looks(self, successes: np.ndarray, looks: np.ndarray) -> np.ndarray:
        """The lower bounds, each (sample count, votes) pair bisected once and then kept (up to LOWER_BOUNDS_KEPT
        pairs, then forgotten together): a bound is a function of the pair alone, computed elementwise, so a kept
        value is the one a new bisection would return, bit for bit. Estimate mode reads a bound at every look of
        every stream, and streams of similar pA meet the same pairs."""
        votes = np.asarray(successes, dtype=np.int64)
        trials = np.asarray(self._trials(successes, looks), dtype=np.int64)
        keys = (trials * (self.n_max + 1) + votes).ravel().tolist()
        kept = self._lower_bounds
        bounds = np.fromiter((kept.get(key, -1.0) for key in keys), dtype=float, count=len(keys))
        missing = np.flatnonzero(bounds < 0)  # a bound lies in [0, 1]
        if missing.size:
            found = self.tests.lower(votes.ravel()[missing], trials.ravel()[missing])
            bounds[missing] = found
            if len(kept) + missing.size > LOWER_BOUNDS_KEPT:
                kept.clear()
            kept.update(zip([keys[i] for i in missing.tolist()], found.tolist(), strict=True))
        return bounds.reshape(votes.shape)

    def upper_looks(self, successes: np.ndarray, looks: np.ndarray) -> np.ndarray:
        return self.tests.upper(successes, self._trials(successes, looks))

    def lower_at_least_looks(self, successes: np.ndarray, looks: np.ndarray, p: float) -> np.ndarray:
        return np.asarray(successes) >= self.decide_boundaries(p)[0][np.asarray(looks)]

    def upper_below_looks(self, successes: np.ndarray, looks: np.ndarray, p: float) -> np.ndarray:
        return np.asarray(successes) <= self.decide_boundaries(p)[1][np.asarray(looks)]

    def upper_at_most_looks(self, successes: np.ndarray, looks: np.ndarray, p: np.ndarray) -> np.ndarray:
        # The rejected set of pA >= p' is [upper, 1] above S / t (module one_sided): upper <= p iff p is rejected.
        trials = self._trials(successes, looks)
        return (np.asarray(p) >= np.asarray(successes) / trials) & self.tests.upper_rejects(successes, trials, p)

    def lower_at_most_looks(self, successes: np.ndarray, looks: np.ndarray, p: np.ndarray) -> np.ndarray:
        # The rejected set of pA <= p' is [0, lower) below S / t: lower <= p iff p is at or above S / t or not rejected.
        trials = self._trials(successes, looks)
        return (np.asarray(p) >= np.asarray(successes) / trials) | ~self.tests.lower_rejects(successes, trials, p)

    def _trials(self, successes: np.ndarray, looks: np.ndarray) -> np.ndarray:
        return np.broadcast_to(np.atleast_2d(self.looks[np.asarray(looks)]), np.shape(successes))


def look_settings(method: str) -> dict:
    """The look schedule of ``method`` (run settings): first look, ratio and least step between looks."""
    if method == "union-cp":
        return {"first_look": UNION_CP_FIRST_LOOK, "look_ratio": UNION_CP_LOOK_RATIO, "look_step": 1}
    return {"first_look": DEFAULT_FIRST_LOOK, "look_ratio": DEFAULT_LOOK_RATIO, "look_step": DEFAULT_LOOK_STEP}


def confidence_sequence(method: str, n_max: int, alpha: float, first_look: int | None = None,
                        look_ratio: float | None = None) -> ConfidenceSequence:
    """The named construction over its looks up to ``n_max``. ``one-sided-mixture`` and ``beta-mixture`` look at
    the same sample counts whatever n_max (which only truncates them) and hold at every count; ``union-cp``
    places its looks and splits alpha by n_max: valid for one call, not across calls with other budgets."""
    if method == "union-cp":
        looks = geometric_looks(n_max, first_look or UNION_CP_FIRST_LOOK, look_ratio or UNION_CP_LOOK_RATIO)
        return UnionClopperPearson(looks, alpha)
    schedule = (first_look or DEFAULT_FIRST_LOOK, look_ratio or DEFAULT_LOOK_RATIO, DEFAULT_LOOK_STEP)
    looks = geometric_looks(n_max, *schedule)
    if method == "one-sided-mixture":
        cs: ConfidenceSequence = OneSidedMixture(looks, alpha)
    elif method == "beta-mixture":
        cs = BetaBinomialMixture(looks, alpha)
    else:
        raise UserError(f"sequential method must be one of {', '.join(METHODS)}, got {method!r}")
    cs.schedule = schedule  # its looks below n_max are those of the unbounded schedule
    return cs
