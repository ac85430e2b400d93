"""The power of a one-run audit: the largest lower bound its canaries, guesses and confidence can reach.

A one-run audit with m canaries, guess counts r_1..r_K (tested at level beta / K each, Bonferroni) and
confidence 1 - beta cannot report a lower bound above the one it reports when every guess of the best count is
right (v = r): both analyses of :mod:`training.privacy.bounds` grow with v at fixed (m, r). So a claimed epsilon
above :func:`attainable_bounds`'s figure cannot be refuted by that audit whatever the run does: the audit is
INCONCLUSIVE about it (not a PASS). :func:`canaries_needed` finds the smallest m (same guess fractions,
confidence and delta) whose attainable bound reaches a claim.

The attainable figure is an upper bound on what the audit can show (all guesses right is not always possible:
symmetric counts need as many canaries in as out), which is the safe side for a statement "cannot refute".
"""
from __future__ import annotations

import functools
import math

from training.privacy.bounds import (
    DEFAULT_BETA,
    DEFAULT_GUESS_FRACTIONS,
    POSITIVE_ONLY_FRACTIONS,
    fdp_mu_lower_bound,
    gdp_epsilon_lower,
    guess_counts,
    steinke_epsilon_lower_bound,
)

ANALYSES = ("steinke", "fdp")
MAX_CANARIES = 100_000  # canaries_needed gives up above this


def _level_and_sizes(m: int, beta: float, fractions, positive_only) -> tuple[float, list[int]]:
    if m < 1:
        raise ValueError(f"need at least one canary, got {m}")
    if not 0 < beta < 1:
        raise ValueError(f"beta must lie in (0, 1), got {beta}")
    counts = guess_counts(m, fractions, positive_only)
    return beta / len(counts), sorted({kp + km for kp, km in counts})


@functools.lru_cache(maxsize=4096)
def attainable_bound(m: int, delta: float, beta: float = DEFAULT_BETA, analysis: str = "steinke",
                     fractions=DEFAULT_GUESS_FRACTIONS, positive_only=POSITIVE_ONLY_FRACTIONS) -> float:
    """The largest epsilon lower bound of ``analysis`` with every guess right, over the guess counts, each at
    the Bonferroni level beta / K (the counts and level of :func:`training.privacy.bounds.one_run_lower_bounds`).
    Memoised (a pure function of hashable arguments: pass the fractions as tuples)."""
    if analysis not in ANALYSES:
        raise ValueError(f"analysis must be one of {ANALYSES}, got {analysis!r}")
    level, sizes = _level_and_sizes(m, beta, tuple(fractions), tuple(positive_only))
    if analysis == "steinke":
        return max(steinke_epsilon_lower_bound(m, r, r, delta, level) for r in sizes)
    return gdp_epsilon_lower(max(fdp_mu_lower_bound(m, r, r, level) for r in sizes), delta)


def attainable_bounds(m: int, delta: float, beta: float = DEFAULT_BETA,
                      fractions=DEFAULT_GUESS_FRACTIONS, positive_only=POSITIVE_ONLY_FRACTIONS) -> dict:
    """Both analyses' :func:`attainable_bound`: ``{"steinke", "fdp", "guess_counts": K, "level": beta / K}``."""
    level, _ = _level_and_sizes(m, beta, fractions, positive_only)
    return {**{a: attainable_bound(m, delta, beta, a, tuple(fractions), tuple(positive_only)) for a in ANALYSES},
            "guess_counts": len(guess_counts(m, fractions, positive_only)), "level": level}


def canaries_needed(claim: float, delta: float, beta: float = DEFAULT_BETA, analysis: str = "steinke",
                    fractions=DEFAULT_GUESS_FRACTIONS, positive_only=POSITIVE_ONLY_FRACTIONS,
                    start: int = 2) -> int | None:
    """The smallest m (from ``start``, to within 1%) whose attainable ``analysis`` bound exceeds ``claim``;
    None if even :data:`MAX_CANARIES` do not (or the claim is infinite).

    Found by doubling, then bisection on m (the attainable bound grows with m in practice; the returned m is
    checked to reach the claim, so it never understates the canaries needed by more than the 1% tolerance
    of the bisection, and never overstates what that m can show)."""
    if analysis not in ANALYSES:
        raise ValueError(f"analysis must be one of {ANALYSES}, got {analysis!r}")
    if not math.isfinite(claim):
        return None

    def reaches(m: int) -> bool:
        return attainable_bound(m, delta, beta, analysis, tuple(fractions), tuple(positive_only)) > claim

    low = max(2, start)
    if reaches(low):
        return low
    if analysis == "steinke" and not reaches(MAX_CANARIES):  # its delta term 2 m delta caps it as m grows
        return None
    high = low * 2
    while not reaches(high):
        if high >= MAX_CANARIES:
            return None
        low, high = high, min(2 * high, MAX_CANARIES)
    while high - low > max(1, high // 100):
        mid = (low + high) // 2
        if reaches(mid):
            high = mid
        else:
            low = mid
    return high


def audit_power(m: int, delta: float, claims: list[dict], beta: float = DEFAULT_BETA,
                fractions=DEFAULT_GUESS_FRACTIONS, positive_only=POSITIVE_ONLY_FRACTIONS) -> dict:
    """The audit's attainable bounds, and for each claim (``{"name", "epsilon"}``) whether some analysis can
    exceed it (``refutable``) and, for each analysis that cannot, the canaries it would need (None: not with
    up to :data:`MAX_CANARIES`). Infinite claims are listed as not refutable, with no canary count."""
    attainable = attainable_bounds(m, delta, beta, fractions, positive_only)
    rows = []
    for claim in claims:
        epsilon = float(claim["epsilon"])
        needed = {a: (m if attainable[a] > epsilon else canaries_needed(epsilon, delta, beta, a, fractions,
                                                                          positive_only, start=m))
                  for a in ANALYSES} if math.isfinite(epsilon) else {a: None for a in ANALYSES}
        rows.append({"name": claim["name"], "epsilon": epsilon,
                     "refutable": any(attainable[a] > epsilon for a in ANALYSES), "canaries_needed": needed})
    return {"canaries": m, "confidence": 1 - beta, "delta": delta, "attainable": attainable, "claims": rows,
            "meaning": "the largest lower bound this audit can report (every guess right); a claim above it "
                       "cannot be refuted by this audit, whatever the run does"}


__all__ = ["ANALYSES", "audit_power", "MAX_CANARIES", "attainable_bound", "attainable_bounds", "canaries_needed"]
