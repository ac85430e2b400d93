"""One-sided mixture confidence sequences for a Bernoulli mean (the default of adaptive certification).

A test of H0: pA <= p against pA > p by a mixture of likelihood ratios. For one alternative q > p,

    L_t(q; p) = (q / p)^S ((1 - q) / (1 - p))^F          (S votes for cA, F others, t = S + F samples)

has E[one more factor] = pA q / p + (1 - pA)(1 - q) / (1 - p) <= 1 whenever pA <= p (linear in pA, 1 at
pA = p, increasing): it is a nonnegative supermartingale under every pA in H0, with L_0 = 1. So is any
mixture M_t(p) = sum_j w_j L_t(q_j; p) over alternatives q_j > p with sum_j w_j <= 1, and Ville's
inequality gives P[exists t: M_t(p) >= 1/alpha] <= alpha under H0: an e-process checked at every sample
count, whatever the stopping rule and whatever the budget. Nothing here depends on n_max: a larger
budget only lets the same test run longer. The mirror image (alternatives q < p, failures and
successes swapped) tests H0': pA >= p.

Two mixtures:

- **decide** (a fixed threshold p* = Phi(R / sigma)): the alternatives are spaced by the sample count
  at which each would decide. q_0 = 1 (for the test below p*: q_0 = 0), and q_j > p* with
  KL(q_j || p*) = KL(q_0 || p*) / 2^j, j = 0 .. DECIDE_COMPONENTS - 1: component j settles a stream
  whose pA is q_j after about ln(1/alpha) / KL(q_j || p*) samples, 2^j times the fewest possible
  (~301 at p* = Phi(2), alpha 1e-3). Weights proportional to 1 / min(j + 1, 3), summing to 1. The
  weights and spacing were chosen with the exact sample counts of :mod:`certify.sequential_exact`
  (docs/CERTIFY.md); the validity above holds for any choice.
- **bounds** (a lower / upper bound on pA: estimate mode): alternatives on a fixed grid, q = 1 and
  1 - q = 2^(-k/2) for k = 2 .. 40 (weight BOUND_WEIGHT_ONE on q = 1, the rest shared equally).
  For a fixed grid, M_t(p) (the q_j above p) is nonincreasing in p below S / t (each ratio is, and
  fewer q_j exceed p) and below 1/alpha above it, so {p : M_t(p) >= 1/alpha} = [0, lower_t): the bound
  is found by bisection and pA >= lower_t at every t at once with probability >= 1 - alpha. The upper
  bound is the mirror image (the q_j below p; only estimate mode's stopping rule reads it).

Arithmetic is in logarithms (scipy's logsumexp, step for step: :func:`logsumexp_last`); comparisons with the
threshold 1/alpha are made on ln M_t, and the bisections return the conservative end (the bounds to 2^-36 of
S / t). Estimate mode's stopping rule asks only whether a bound lies beyond a given p: that is one evaluation of
the mixture at p (``lower_rejects`` / ``upper_rejects``), no bisection. The bisections evaluate the bound mixture
through :class:`GridMixture` (the grid's p-free sums once per count, then one index and two logarithms per step),
which gives :func:`log_mixture`'s answer at every step, bit for bit: where the two could round to different sides of
the threshold, :func:`log_mixture` itself answers.
"""
from __future__ import annotations

import math

import numpy as np

DECIDE_COMPONENTS = 10  # alternatives q_0 .. q_9: decision times ~301 to ~154,000 samples at p* = Phi(2)
DECIDE_SPACING = 2.0  # each alternative's decision time is this many times the one before
DECIDE_WEIGHT_CAP = 3  # weights proportional to 1 / min(j + 1, 3)
BOUND_GRID_STEPS = range(2, 41)  # 1 - q = 2^(-k/2): 0.5 .. 1e-6
BOUND_WEIGHT_ONE = 0.2  # the bound mixture's weight on q = 1 (all votes for cA)
BISECTION_STEPS = 60  # the decide alternatives (computed once per threshold)
BOUND_BISECTION_STEPS = 36  # the bounds: to 2^-36 of S / t (a radius to about 1e-7), the conservative end
ROUNDING_MARGIN_ULPS = 1024.0  # GridMixture answers alone only this far from the threshold (see its docstring)
GUESS_STEPS = 8  # at most this many Newton steps for the lower bound's guess (GridMixture.crossing) ...
GUESS_TOLERANCE = 2.0 ** -44  # ... fewer once every step moves p by less than this share of it


def bernoulli_kl(q: float, p: float) -> float:
    """KL(Bernoulli(q) || Bernoulli(p)) in nats."""
    total = 0.0
    if q > 0:
        total += q * math.log(q / p)
    if q < 1:
        total += (1 - q) * math.log((1 - q) / (1 - p))
    return total


def decide_alternatives(p: float) -> tuple[np.ndarray, np.ndarray]:
    """The decide mixture's alternatives q_j > p (q_0 = 1) and their weights (summing to 1)."""
    if not 0 < p < 1:
        raise ValueError(f"the threshold must lie strictly between 0 and 1, got {p}")
    top = bernoulli_kl(1.0, p)
    qs = [1.0]
    for j in range(1, DECIDE_COMPONENTS):
        target = top / DECIDE_SPACING ** j
        low, high = p, 1.0
        for _ in range(BISECTION_STEPS):  # KL(q || p) increases with q above p
            mid = (low + high) / 2
            low, high = (low, mid) if bernoulli_kl(mid, p) > target else (mid, high)
        qs.append(low)  # KL(low || p) <= target
    weights = 1.0 / np.minimum(np.arange(1, DECIDE_COMPONENTS + 1), DECIDE_WEIGHT_CAP)
    return np.asarray(qs), weights / weights.sum()


def bound_grid() -> tuple[np.ndarray, np.ndarray]:
    """The bound mixture's alternatives near 1 (q = 1 first) and their weights (summing to 1)."""
    rest = np.array([1.0 - 2.0 ** (-k / 2) for k in BOUND_GRID_STEPS])
    qs = np.concatenate([[1.0], rest])
    weights = np.concatenate([[BOUND_WEIGHT_ONE], np.full(len(rest), (1 - BOUND_WEIGHT_ONE) / len(rest))])
    return qs, weights


def log_mixture(successes, trials, p, qs: np.ndarray, weights: np.ndarray, above: bool = True) -> np.ndarray:
    """ln sum_j w_j (q_j / p)^S ((1 - q_j) / (1 - p))^F over the q_j strictly above p (``above``; a test of
    pA <= p) or strictly below it (a test of pA >= p), elementwise in S, t and p (p may be an array)."""
    s = np.asarray(successes, dtype=float)[..., None]
    f = np.asarray(trials, dtype=float)[..., None] - s
    p = np.asarray(p, dtype=float)[..., None]
    q = qs.reshape((1,) * (np.ndim(s) - 1) + (-1,))
    with np.errstate(divide="ignore", invalid="ignore"):
        success_term = np.where(s > 0, s * (np.log(q) - np.log(p)), 0.0)
        failure_term = np.where(f > 0, f * (np.log1p(-q) - np.log1p(-p)), 0.0)
        terms = np.log(weights) + success_term + failure_term
    terms = np.where(q > p if above else q < p, terms, -np.inf)
    return logsumexp_last(terms)


def logsumexp_last(terms: np.ndarray) -> np.ndarray:
    """``scipy.special.logsumexp(terms, axis=-1)`` for real float64 ``terms``, the same arithmetic step for step
    (so bit for bit the same values: tested) without its per-call overhead, which was most of a bound's bisection
    time: the largest term (each of several equal ones) is kept out of the sum, ln(1 + rest / count) + ln(count) + max;
    rows with no finite result (every term -inf) are computed directly, ln(sum exp)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        largest = terms.max(axis=-1, keepdims=True)
        at_max = terms == largest
        count = at_max.sum(axis=-1, keepdims=True, dtype=terms.dtype)
        rest = np.exp(np.where(at_max, -np.inf, terms) - largest).sum(axis=-1, keepdims=True, dtype=terms.dtype)
        rest = np.where(rest == 0, rest, rest / count)
        out = (np.log1p(rest) + np.log(count) + largest)[..., 0]
        finite = np.isfinite(out)
        if not finite.all():
            out = np.where(finite, out, np.log(np.exp(terms).sum(axis=-1)))
    return out


def first_true_counts(predicate, looks: np.ndarray) -> np.ndarray:
    """Per look t, the smallest count s in [0, t] with ``predicate(s, t)`` (elementwise over arrays of looks; False
    then True as s grows), t + 1 where none holds: a bisection over the counts of every look at once."""
    looks = np.asarray(looks, dtype=np.int64)
    low, high = np.zeros(len(looks), dtype=np.int64), looks + 1
    while np.any(low < high):
        mid = (low + high) // 2
        open_ = low < high
        hit = np.asarray(predicate(np.minimum(mid, looks), looks)) & (mid <= looks)
        high, low = np.where(open_ & hit, mid, high), np.where(open_ & ~hit, mid + 1, low)
    return low


def mirror(successes, trials):
    """Failures as successes: a test of pA >= p is a test of 1 - pA <= 1 - p on the failures."""
    return np.asarray(trials) - np.asarray(successes)


class OneSidedMixtureTests:
    """The two one-sided tests at a fixed threshold p and the two bounds, at level alpha each."""

    def __init__(self, alpha: float):
        self.log_threshold = math.log(1.0 / alpha)
        self._grid = bound_grid()

    def above(self, successes, trials, p: float) -> np.ndarray:
        """H0: pA <= p rejected (pA > p shown) at this sample count."""
        qs, weights = decide_alternatives_cached(p)
        return log_mixture(successes, trials, p, qs, weights) >= self.log_threshold

    def below(self, successes, trials, p: float) -> np.ndarray:
        """H0: pA >= p rejected (pA < p shown) at this sample count."""
        qs, weights = decide_alternatives_cached(1.0 - p)
        return log_mixture(mirror(successes, trials), trials, 1.0 - p, qs, weights) >= self.log_threshold

    def lower_rejects(self, successes, trials, p) -> np.ndarray:
        """The bound mixture rejects pA <= p (so lower > p, up to the bisection's rounding), for p below S / t."""
        qs, weights = self._grid
        return log_mixture(successes, trials, p, qs, weights) >= self.log_threshold

    def upper_rejects(self, successes, trials, p) -> np.ndarray:
        """The bound mixture rejects pA >= p (so upper <= p, up to the bisection's rounding), for p above S / t."""
        qs, weights = self._grid
        return log_mixture(successes, trials, p, qs, weights, above=False) >= self.log_threshold

    def lower(self, successes, trials) -> np.ndarray:
        """The largest p with M_t(p') >= 1/alpha for every p' < p (0 when there is none)."""
        s = np.asarray(successes, dtype=float)
        t = np.broadcast_to(np.asarray(trials, dtype=float), s.shape)
        return bisect_bound(s, t, self._grid, self.log_threshold, above=True)

    def upper(self, successes, trials) -> np.ndarray:
        """The smallest p with M'_t(p') >= 1/alpha for every p' > p (1 when there is none), M' the mixture of
        the grid's alternatives below p (a test of pA >= p; nondecreasing in p above S / t)."""
        s = np.asarray(successes, dtype=float)
        t = np.broadcast_to(np.asarray(trials, dtype=float), s.shape)
        return bisect_bound(s, t, self._grid, self.log_threshold, above=False)


class GridMixture:
    """ln M_t(p) of the bound grid (:func:`bound_grid`) at fixed counts S, t, for many p: the same value as
    :func:`log_mixture`, computed another way. Each term is w_j (q_j / p)^S ((1 - q_j) / (1 - p))^F; the factor
    p^-S (1 - p)^-F is common to all of them, so

        ln M_t(p) = ln sum_{j : q_j > p} w_j q_j^S (1 - q_j)^F  -  S ln p  -  F ln(1 - p),

    and since the grid's q_j != 1 are increasing, the alternatives above p are q = 1 and a suffix of them (below
    p: a prefix). The p-free sums for every suffix (prefix) are computed once per count, so each p costs one
    index and two logarithms instead of a pass over the grid.

    The two computations round differently. Both add terms no larger in magnitude than
    scale = S max|ln q_j| + F max|ln(1 - q_j)| + max|ln w_j| + 1 + |S ln p + F ln(1 - p)|, with a few roundings per
    term and at most 40 terms, so each is within a few dozen eps * scale of the exact value (eps = 2^-52, float64's
    machine epsilon). :meth:`rejects` answers from this computation only where its value lies farther than
    ROUNDING_MARGIN_ULPS * eps * scale from the threshold, and from :func:`log_mixture` elsewhere, and where a
    partial sum fell below 2^-1000 (its subnormal terms round outside that bound): so every answer is the one
    :func:`log_mixture` gives, bit for bit (tested against it)."""

    def __init__(self, successes: np.ndarray, trials: np.ndarray, grid: tuple[np.ndarray, np.ndarray],
                 above: bool = True, margin_ulps: float | None = None):
        qs, weights = grid
        if qs[0] != 1.0 or np.any(np.diff(qs[1:]) <= 0):
            raise ValueError("the bound grid must be q = 1 followed by increasing alternatives (bound_grid())")
        self.s, self.t, self.grid, self.above = successes, trials, grid, above
        self.f = trials - successes
        self.rest = qs[1:]  # increasing; qs[0] = 1
        self.margin_ulps = ROUNDING_MARGIN_ULPS if margin_ulps is None else margin_ulps
        s, f = self.s[..., None], self.f[..., None]
        with np.errstate(divide="ignore", invalid="ignore"):
            log_q, log_not_q = np.log(qs), np.log1p(-qs)
            free = (np.log(weights) + np.where(s > 0, s * log_q, 0.0) + np.where(f > 0, f * log_not_q, 0.0))
            # Sums of exp(free - largest) over each suffix (prefix). A sum below 2^-1000 may hold subnormal terms,
            # whose rounding the margin does not cover: it becomes -inf, which rejects() leaves to log_mixture.
            largest = free.max(axis=-1, keepdims=True)
            largest = np.where(np.isfinite(largest), largest, 0.0)
            shifted = np.exp(free - largest)
            one, rest = shifted[..., :1], shifted[..., 1:]
            if above:  # q = 1 and rest[m:], m = 0 .. len(rest)
                sums = one + np.concatenate([np.cumsum(rest[..., ::-1], axis=-1)[..., ::-1], np.zeros_like(one)],
                                            axis=-1)
            else:  # rest[:m], m = 0 .. len(rest)
                sums = np.concatenate([np.zeros_like(one), np.cumsum(rest, axis=-1)], axis=-1)
            self.table = np.log(np.where(sums >= 2.0 ** -1000, sums, 0.0)) + largest
        finite = np.isfinite(log_not_q)
        self.scale = (self.s * np.abs(log_q).max() + self.f * np.abs(log_not_q[finite]).max()
                      + np.abs(np.log(weights)).max() + 1.0)
        self.some_successes, self.some_failures = self.s > 0, self.f > 0
        # for rejects(), which runs at every bisection step: what does not depend on p, once
        self._all_successes, self._all_failures = bool(self.some_successes.all()), bool(self.some_failures.all())
        self._side = "right" if above else "left"
        self._margin_per_size = self.margin_ulps * np.finfo(float).eps
        self._rows = self.table.reshape(-1, self.table.shape[-1])  # one row of partial sums per count
        self._row_index = np.arange(self._rows.shape[0])

    def rejects(self, p: np.ndarray, log_threshold: float) -> np.ndarray:
        """ln M_t(p) >= log_threshold, elementwise, exactly as ``log_mixture(...) >= log_threshold`` answers."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self._rejects(np.asarray(p, dtype=float), log_threshold)

    def _rejects(self, p: np.ndarray, log_threshold: float) -> np.ndarray:
        """:meth:`rejects` for a float array ``p`` of the counts' shape, or of that shape after a leading axis (several
        points per count, each answered as alone), under the caller's ``np.errstate``."""
        value, common = self._value(p)
        margin = self._margin_per_size * (self.scale - common)  # common <= 0, so -common is its size
        sure = np.isfinite(value) & (np.abs(value - log_threshold) > margin) & (p < 1)
        rejected = value >= log_threshold
        if not sure.all():
            unsure = ~sure
            qs, weights = self.grid
            counts = np.broadcast_to(self.s, p.shape)[unsure], np.broadcast_to(self.t, p.shape)[unsure]
            rejected[unsure] = log_mixture(*counts, p[unsure], qs, weights, above=self.above) >= log_threshold
        return rejected

    def _value(self, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ln M_t(p) from the grid's partial sums, and the common factor S ln p + F ln(1 - p) (<= 0) taken off
        them, for ``p`` as :meth:`_rejects` takes it."""
        index = self.rest.searchsorted(p, side=self._side)
        lead = index.shape[:index.ndim - self.s.ndim]  # () or (points per count,)
        kept = self._rows[self._row_index, index.reshape(lead + (self._row_index.size,))].reshape(index.shape)
        successes_term = self.s * np.log(p)
        if not self._all_successes:
            successes_term = np.where(self.some_successes, successes_term, 0.0)
        failures_term = self.f * np.log1p(-p)
        if not self._all_failures:
            failures_term = np.where(self.some_failures, failures_term, 0.0)
        common = successes_term + failures_term
        return kept - common, common

    def crossing(self, low: np.ndarray, high: np.ndarray, log_threshold: float) -> np.ndarray:
        """Where the lower bound's test changes answer, near enough for :func:`bisect_bound` to predict its steps:
        Newton's method on ln M_t(p) = ln(1/alpha) from the normal approximation S/t - sqrt(2 ln(1/alpha) S/t
        (1 - S/t) / t) (or the middle of [``low``, ``high``] where that is not inside), at most GUESS_STEPS steps,
        fewer once none moves p by more than GUESS_TOLERANCE of it. Within a piece of the grid ln M_t(p) = kept - S
        ln p - F ln(1 - p), whose derivative in p is F / (1 - p) - S / p; the bracket [``low``, ``high``] narrows
        with each step's answer, and a step that would leave it (or is not a number) halves it instead. Any value
        is safe: only the bisection's speed depends on it."""
        estimate = np.where(self.t > 0, self.s / np.maximum(self.t, 1), 0.0)
        p = estimate - np.sqrt(2 * log_threshold * estimate * (1 - estimate) / np.maximum(self.t, 1))
        p = np.where((p > low) & (p < high), p, (low + high) / 2)  # no votes, or all: the middle
        for _ in range(GUESS_STEPS):
            excess = self._value(p)[0] - log_threshold
            rejected = excess >= 0
            low, high = np.where(rejected, p, low), np.where(rejected, high, p)
            newton = p - excess / (self.f / (1 - p) - self.s / p)
            step = np.where((newton >= low) & (newton <= high), newton, (low + high) / 2)  # NaN, or outside: halve
            if np.all(np.abs(step - p) <= GUESS_TOLERANCE * p):
                return step
            p = step
        return p


def bisect_bound(s: np.ndarray, t: np.ndarray, grid: tuple[np.ndarray, np.ndarray], log_threshold: float,
                 above: bool = True, margin_ulps: float | None = None) -> np.ndarray:
    """The lower bound (``above``: the largest p with the mixture of the q_j above p' rejecting every p' < p, 0
    when there is none) or the upper bound (the smallest p with the mixture of the q_j below p' rejecting every
    p' > p, 1 when there is none), by BOUND_BISECTION_STEPS bisection steps from S / t, returning the conservative
    end. Each step's test is :meth:`GridMixture.rejects`: the answers of :func:`log_mixture` at every step.

    The lower bound's steps (estimate mode bisects one at every look) are taken together: a guess of where the test
    changes answer (:meth:`GridMixture.crossing`) predicts each step's answer, the bisection's path under those
    answers is followed, and the test is evaluated at every point of that path in one call. Up to the first step
    whose test answers otherwise than predicted, that path is the bisection's; from there the steps are taken one
    by one. Every step's answer is its test's either way, so the bound is the step-by-step bisection's, bit for bit
    (tested); the guess decides only how many steps are left to take one by one."""
    mixture = GridMixture(s, t, grid, above, margin_ulps)
    estimate = np.where(t > 0, s / np.maximum(t, 1), 0.0 if above else 1.0)
    low, high = (np.zeros_like(s), estimate) if above else (estimate, np.ones_like(s))
    with np.errstate(divide="ignore", invalid="ignore"):
        if not above or not low.size:
            return _bisect_steps(mixture, low, high, log_threshold, above)
        guess = mixture.crossing(low, high, log_threshold)
        path, followed_low = _predicted_path(low, high, guess)
        answers = mixture._rejects(path, log_threshold)
        wrong = answers != (path < guess)
        redo = wrong.any(axis=0) & (low < high)  # low == high (no votes): every path ends there
        if redo.any():  # from each count's first wrong prediction, step by step
            first = wrong[:, redo].argmax(axis=0)
            followed_low[redo] = _bisect_steps(GridMixture(s[redo], t[redo], grid, above, margin_ulps), low[redo],
                                               high[redo], log_threshold, above, answers[:, redo], first)
    return followed_low


def _predicted_path(low: np.ndarray, high: np.ndarray, guess: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lower bound's bisection if every step's test rejected exactly below ``guess``: the midpoint of each step
    (computed as the steps compute it, (low + high) / 2 in float64) and the low end it ends with."""
    path = np.empty((BOUND_BISECTION_STEPS,) + low.shape)
    followed_low, followed_high = low.copy(), high.copy()
    for mid in path:
        np.add(followed_low, followed_high, out=mid)
        np.divide(mid, 2, out=mid)
        below = mid < guess
        np.copyto(followed_low, mid, where=below)
        np.copyto(followed_high, mid, where=~below)
    return path, followed_low


def _bisect_steps(mixture: GridMixture, low: np.ndarray, high: np.ndarray, log_threshold: float, above: bool,
                  known: np.ndarray | None = None, known_until: np.ndarray | None = None) -> np.ndarray:
    """:func:`bisect_bound`'s bisection step by step, under the caller's ``np.errstate``. ``known[k]`` holds the
    answer of step k for the steps k <= ``known_until`` (each count's own), whose tests were evaluated already."""
    for step in range(BOUND_BISECTION_STEPS):
        mid = (low + high) / 2
        if known is not None and step <= known_until.min():
            rejected = known[step]
        elif known is not None:
            rejected = np.where(step <= known_until, known[step], mixture._rejects(mid, log_threshold))
        else:
            rejected = mixture._rejects(mid, log_threshold)
        if above:
            low, high = np.where(rejected, mid, low), np.where(rejected, high, mid)
        else:
            low, high = np.where(rejected, low, mid), np.where(rejected, mid, high)
    return low if above else high  # rejected (or 0 / 1): conservative


_DECIDE_CACHE: dict[float, tuple[np.ndarray, np.ndarray]] = {}


def decide_alternatives_cached(p: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`decide_alternatives` above p, computed once per threshold."""
    key = float(p)
    if key not in _DECIDE_CACHE:
        _DECIDE_CACHE[key] = decide_alternatives(key)
    return _DECIDE_CACHE[key]
