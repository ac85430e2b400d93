"""Exact operating characteristics of a decide rule: probabilities and mean samples by dynamic programming.

A decide rule (:class:`certify.sequential.DecideRule`) stops at look k with "certified" when the votes for
cA reach ``certify_at[k]`` and with "not certified" when they are at most ``reject_at[k]``; both are
monotone in the votes, so the rule is two boundaries. Given pA, the distribution of the votes of the
streams still running is carried from look to look (a binomial convolution for the samples in between)
and the mass beyond each boundary is the probability of stopping there: the chance of a false
certificate at pA = Phi(R / sigma) and the mean samples to a decision come out exactly, with no
simulation error (mass below PRUNE is dropped, so probabilities may be low by at most that much per
look; the tests leave room for it).

The same computation gives the worst re-run adversary of a rule whose boundary depends on n_max: one
who runs decide on the same noise (same seed) with every budget of a list and keeps the first
"certified" is certified as soon as any of the budgets' boundaries is crossed (:func:`union_boundary`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

PRUNE = 1e-15  # probability mass per look left out of the computation (far below the boundaries)


@dataclass(frozen=True)
class Boundaries:
    """At each look (sample count ``looks[k]``): certified when votes >= certify_at[k] (> looks[k]: never),
    not certified when votes <= reject_at[k] (< 0: never)."""

    looks: np.ndarray
    certify_at: np.ndarray
    reject_at: np.ndarray


@dataclass(frozen=True)
class Operating:
    """Exact probabilities of each answer and the mean estimation samples used (budget-spent streams: n_max)."""

    certified: float
    not_certified: float
    budget_spent: float
    mean_samples: float


def _first_true(predicate, low: int, high: int) -> int:
    """Smallest s in [low, high] with predicate(s) (predicate monotone: False ... True); high + 1 when none."""
    if not predicate(high):
        return high + 1
    while low < high:
        mid = (low + high) // 2
        if predicate(mid):
            high = mid
        else:
            low = mid + 1
    return low


def boundaries(rule) -> Boundaries:
    """The two boundaries of a :class:`certify.sequential.DecideRule`, read off its own threshold tests."""
    cs, p = rule.cs, rule.threshold
    looks = np.asarray(cs.looks, dtype=np.int64)
    if hasattr(cs, "decide_boundaries"):  # the one-sided mixture decides by these boundaries itself
        certify_at, reject_at = cs.decide_boundaries(p)
    else:
        certify_at = np.empty(len(looks), dtype=np.int64)
        reject_at = np.empty(len(looks), dtype=np.int64)
        for k, t in enumerate(looks.tolist()):
            certify_at[k] = _first_true(lambda s, k=k: bool(cs.lower_at_least(np.array([s]), k, p)[0]), 0, t)
            # the largest s that rejects: one below the smallest s that does not (rejection is monotone)
            reject_at[k] = _first_true(lambda s, k=k: not bool(cs.upper_below(np.array([s]), k, p)[0]), 0, t) - 1
    return Boundaries(looks, certify_at, np.minimum(reject_at, certify_at - 1))


def union_boundary(parts: Sequence[Boundaries]) -> Boundaries:
    """The boundary of "certified under any of these rules" run on one stream (never "not certified")."""
    looks = np.unique(np.concatenate([b.looks for b in parts]))
    certify_at = np.full(len(looks), np.iinfo(np.int64).max // 2)
    for b in parts:
        where = np.searchsorted(looks, b.looks)
        certify_at[where] = np.minimum(certify_at[where], b.certify_at)
    return Boundaries(looks, np.minimum(certify_at, looks + 1), np.full(len(looks), -1))


def operating(bounds: Boundaries, p: float) -> Operating:
    """Exact answer probabilities and mean samples of the rule with these boundaries when pA = p."""
    if not 0 <= p <= 1:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    low, mass = 0, np.array([1.0])  # mass[i] = P[running, votes = low + i]
    certified = rejected = weighted = 0.0
    previous = 0
    for t, top, bottom in zip(bounds.looks.tolist(), bounds.certify_at.tolist(), bounds.reject_at.tolist(),
                              strict=True):
        increment = t - previous
        previous = t
        kernel = binom.pmf(np.arange(increment + 1), increment, p)
        keep = np.flatnonzero(kernel > PRUNE * 1e-3)
        kernel_low = int(keep[0]) if keep.size else 0
        kernel = kernel[kernel_low:int(keep[-1]) + 1] if keep.size else kernel
        mass = np.convolve(mass, kernel)
        low += kernel_low
        high = low + len(mass) - 1
        if top <= high:
            cut = max(top - low, 0)
            share = float(mass[cut:].sum())
            certified += share
            weighted += share * t
            mass = mass[:cut]
        if bottom >= low and len(mass):
            cut = min(bottom - low + 1, len(mass))
            share = float(mass[:cut].sum())
            rejected += share
            weighted += share * t
            mass = mass[cut:]
            low += cut
        if len(mass):  # drop negligible mass at the ends
            cumulative = np.cumsum(mass)
            start = int(np.searchsorted(cumulative, PRUNE))
            end = len(mass) - int(np.searchsorted(np.cumsum(mass[::-1]), PRUNE))
            mass, low = mass[start:max(end, start)], low + start
        if not len(mass) or mass.sum() < PRUNE:
            break
    spent = float(mass.sum()) if len(mass) else 0.0
    weighted += spent * int(bounds.looks[-1])
    return Operating(certified, rejected, spent, weighted)
