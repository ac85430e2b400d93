"""Empirical epsilon lower bounds from one training run: the abstaining guess and two analyses of it.

Setting (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1) Training Run", NeurIPS): m canaries,
each included in the training input independently with probability 1/2 (S_i = +1 included, -1 excluded).
After training the auditor scores each canary (higher score = more likely included) and guesses
T_i = +1 for the k+ highest scores, T_i = -1 for the k- lowest, and abstains (T_i = 0) on the rest.
With r = k+ + k- guesses of which v are correct:

- :func:`steinke_p_value` is their Theorem 5.2 (approximate DP): if the training run is (epsilon, delta)-DP,
  P[W >= v] <= f(v) + 2 m delta max_{i=1..v} (f(v - i) - f(v)) / i, with
  f(u) = P[Binomial(r, e^eps / (e^eps + 1)) >= u]. (At delta = 0 this is their Theorem 3.1; at epsilon = 0
  too it is the one-sided binomial test of v successes in r fair trials.)
  :func:`steinke_epsilon_lower_bound` is the largest epsilon whose p-value is still below beta, so the run
  is not (epsilon, delta)-DP at confidence 1 - beta.
- :func:`fdp_rejects` is the recursion of Mahloujifar, Melis & Chaudhuri 2025 ("Auditing f-Differential
  Privacy in One Run", ICML; Algorithm 3 with k = 2 choices per canary: in or out): under the f-DP
  hypothesis with blow-up function fbar(x) = 1 - f(x), it lower-bounds the probability mass that v correct
  guesses out of r would need; more mass than r / m is impossible, so the hypothesis is rejected at level
  beta. For mu-GDP, fbar^{-1}(y) = Phi(Phi^{-1}(y) - mu). :func:`fdp_mu_lower_bound` is the largest mu
  rejected; its epsilon at the run's delta (:func:`gdp_epsilon_lower`) is the f-DP analysis's epsilon lower
  bound. It presumes the mechanism's trade-off curve is of the Gaussian family (true of the Gaussian
  mechanism; for subsampled Gaussian steps it is the curve the audit tests, as in their paper).

Both lower bounds err toward SMALLER epsilon: root finders stop on the side where the hypothesis is still
rejected. Several guess counts may be tried with a Bonferroni split of beta (:func:`one_run_lower_bounds`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, special, stats

DEFAULT_BETA = 0.05  # 1 - confidence
# guess counts r = k+ + k- tried, as fractions of m (k+ = k- = r / 2), each at level beta / len (Bonferroni);
# plus positive-only guesses (k+ = r, k- = 0) at POSITIVE_ONLY_FRACTIONS (useful when an included canary
# can look exactly like an excluded one, e.g. one never sampled into a batch)
DEFAULT_GUESS_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
POSITIVE_ONLY_FRACTIONS = (0.05, 0.1, 0.25)
MAX_EPSILON = 100.0  # searched range of the lower bounds
MAX_MU = 100.0


def _check_counts(m: int, r: int, v: int) -> None:
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got m={m}, r={r}, v={v}")


def steinke_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Upper bound on P[>= v correct of r guesses] for an (epsilon, delta)-DP run (Steinke et al., Thm 5.2)."""
    _check_counts(m, r, v)
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    if v == 0:
        return 1.0
    q = float(special.expit(epsilon))  # e^eps / (1 + e^eps): accuracy of eps-DP randomized response
    tail = float(stats.binom.sf(v - 1, r, q))  # f(v) = P[Binomial(r, q) >= v]
    if delta == 0:
        return min(1.0, tail)
    # f(v - i) - f(v) = P[v - i <= Binomial < v] = sum_{j=1..i} pmf(v - j), for i = 1..v
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))
    alpha = float(np.max(below / np.arange(1, v + 1)))
    return min(1.0, tail + 2 * m * delta * alpha)


def steinke_epsilon_lower_bound(m: int, r: int, v: int, delta: float, beta: float = DEFAULT_BETA) -> float:
    """The largest epsilon with :func:`steinke_p_value` < beta (0 if even epsilon = 0 is not rejected)."""
    _check_counts(m, r, v)

    def gap(eps: float) -> float:
        return steinke_p_value(m, r, v, eps, delta) - beta

    if gap(0.0) >= 0:
        return 0.0
    high = 1.0
    while gap(high) < 0:
        if high >= MAX_EPSILON:
            return MAX_EPSILON
        high = min(2 * high, MAX_EPSILON)
    eps = optimize.brentq(gap, 0.0, high, xtol=1e-10)
    while eps > 0 and gap(eps) >= 0:  # stay on the rejected side: a lower bound may only err low
        eps = max(0.0, eps - 1e-9 * max(1.0, eps))
    return eps


def gaussian_blowup_inverse(mu: float):
    """fbar^{-1} for mu-GDP: y -> Phi(Phi^{-1}(y) - mu) (fbar(x) = 1 - f(x), f the Gaussian trade-off)."""

    def inverse(y: float) -> float:
        y = min(max(y, 0.0), 1.0)
        return float(special.ndtr(special.ndtri(y) - mu))

    return inverse


def fdp_required_mass(inverse_blowup, m: int, r: int, v: int, beta: float) -> float:
    """Mahloujifar et al.'s recursion (k = 2): the mass that >= v correct of r guesses with probability beta
    requires under the f-DP hypothesis given by ``inverse_blowup``; above r / m the hypothesis is refuted."""
    _check_counts(m, r, v)
    h = beta * (r - v) / m  # h[v]
    mass = beta * v / m  # r[v]
    for i in range(v - 1, -1, -1):
        h_next = max(h, inverse_blowup(mass))
        mass = mass + i / (r - i) * (h_next - h)
        h = h_next
    return mass + h


def fdp_rejects(m: int, r: int, v: int, mu: float, beta: float = DEFAULT_BETA) -> bool:
    """True if v correct of r guesses refute mu-GDP at level beta (Mahloujifar et al., Gaussian curve)."""
    if r == 0:
        return False
    return fdp_required_mass(gaussian_blowup_inverse(mu), m, r, v, beta) > r / m


def fdp_mu_lower_bound(m: int, r: int, v: int, beta: float = DEFAULT_BETA) -> float:
    """The largest mu such that mu-GDP is refuted at level beta (0 if none is)."""
    _check_counts(m, r, v)
    if r == 0:
        return 0.0

    def gap(mu: float) -> float:
        return fdp_required_mass(gaussian_blowup_inverse(mu), m, r, v, beta) - r / m

    if gap(0.0) <= 0:
        return 0.0
    high = 1.0
    while gap(high) > 0:
        if high >= MAX_MU:
            return MAX_MU
        high = min(2 * high, MAX_MU)
    mu = optimize.brentq(gap, 0.0, high, xtol=1e-10)
    while mu > 0 and gap(mu) <= 0:  # stay on the refuted side
        mu = max(0.0, mu - 1e-9 * max(1.0, mu))
    return mu


def gdp_epsilon_lower(mu: float, delta: float) -> float:
    """Epsilon of mu-GDP at delta, rounded DOWN (a lower bound may only err low): the largest epsilon with
    delta_mu(epsilon) >= delta, delta_mu(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    from training.privacy.accounting import gdp_delta

    if mu <= 0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    high = max(1.0, mu * mu)
    while gdp_delta(high, mu) > delta:
        high *= 2
    eps = optimize.brentq(lambda e: math.log(max(gdp_delta(e, mu), 1e-300)) - math.log(delta), 0.0, high, xtol=1e-12)
    while eps > 0 and gdp_delta(eps, mu) < delta:
        eps = max(0.0, eps - 1e-9 * max(1.0, eps))
    return eps


# ------------------------------------------------------------------------------------------------ guesses

ABSTAIN = 0


def abstaining_guesses(scores: np.ndarray, k_plus: int, k_minus: int) -> np.ndarray:
    """+1 for the k+ highest scores, -1 for the k- lowest, ABSTAIN (0) elsewhere (ties broken by index)."""
    scores = np.asarray(scores, dtype=np.float64)
    m = len(scores)
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError(f"need k+, k- >= 0 and k+ + k- <= m = {m}, got {k_plus}, {k_minus}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("canary scores must be finite")
    order = np.argsort(-scores, kind="stable")
    guesses = np.zeros(m, dtype=np.int64)
    guesses[order[:k_plus]] = 1
    if k_minus:
        guesses[order[m - k_minus:]] = -1
    return guesses


@dataclass
class GuessOutcome:
    k_plus: int
    k_minus: int
    guesses: int  # r
    correct: int  # v
    beta: float  # the level this guess count was tested at (Bonferroni share)
    steinke_epsilon: float
    fdp_mu: float
    fdp_epsilon: float


def guess_counts(m: int, fractions=DEFAULT_GUESS_FRACTIONS,
                 positive_only=POSITIVE_ONLY_FRACTIONS) -> list[tuple[int, int]]:
    """(k+, k-) pairs: r = round(fraction m) split evenly for ``fractions``, all positive for
    ``positive_only``; at least one guess each; duplicates dropped."""
    pairs = []
    for fraction in fractions:
        r = min(m, max(1, round(fraction * m)))
        pairs.append((r - r // 2, r // 2))
    for fraction in positive_only:
        pairs.append((min(m, max(1, round(fraction * m))), 0))
    return list(dict.fromkeys(pairs))


def one_run_lower_bounds(scores: np.ndarray, included: np.ndarray, delta: float, beta: float = DEFAULT_BETA,
                         counts: list[tuple[int, int]] | None = None) -> dict:
    """Both analyses for each (k+, k-) in ``counts`` at level beta / len(counts) (Bonferroni), and the best.

    ``included``: the canaries' true membership (bool). Returns a JSON-safe dict with ``epsilon_steinke``,
    ``epsilon_fdp`` and ``mu_fdp`` (each the maximum over the guess counts, valid at confidence 1 - beta
    jointly), and ``per_count``: every guess count's outcome.
    """
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    m = len(scores)
    if len(included) != m or m == 0:
        raise ValueError("scores and included must have the same, positive length")
    counts = counts if counts is not None else guess_counts(m)
    level = beta / len(counts)
    truth = np.where(included, 1, -1)
    outcomes = []
    for k_plus, k_minus in counts:
        guesses = abstaining_guesses(scores, k_plus, k_minus)
        r = int((guesses != ABSTAIN).sum())
        v = int((guesses == truth).sum())
        mu = fdp_mu_lower_bound(m, r, v, level)
        outcomes.append(GuessOutcome(k_plus, k_minus, r, v, level,
                                     steinke_epsilon_lower_bound(m, r, v, delta, level),
                                     mu, gdp_epsilon_lower(mu, delta)))
    best_steinke = max(outcomes, key=lambda o: o.steinke_epsilon)
    best_fdp = max(outcomes, key=lambda o: o.fdp_mu)
    return {"canaries": m, "included": int(included.sum()), "delta": delta, "confidence": 1 - beta,
            "bonferroni_counts": len(counts),
            "epsilon_steinke": best_steinke.steinke_epsilon, "epsilon_fdp": best_fdp.fdp_epsilon,
            "mu_fdp": best_fdp.fdp_mu,
            "best_steinke": asdict(best_steinke), "best_fdp": asdict(best_fdp),
            "per_count": [asdict(o) for o in outcomes]}


__all__ = ["ABSTAIN", "DEFAULT_BETA", "DEFAULT_GUESS_FRACTIONS", "POSITIVE_ONLY_FRACTIONS", "GuessOutcome",
           "abstaining_guesses",
           "fdp_mu_lower_bound", "fdp_rejects", "fdp_required_mass", "gaussian_blowup_inverse", "gdp_epsilon_lower",
           "guess_counts", "one_run_lower_bounds", "steinke_epsilon_lower_bound", "steinke_p_value"]
