"""Confidence bounds on a binomial proportion, for every layer that turns vote counts into a guarantee.

The bound is statsmodels' Clopper-Pearson interval (``proportion_confint(method="beta")``); what is ours is the
one-sided reading of it and the zero-success case.
"""
from __future__ import annotations


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 - alpha) lower confidence bound on a binomial proportion (Clopper-Pearson)."""
    from statsmodels.stats.proportion import proportion_confint

    if successes == 0:
        return 0.0
    return float(proportion_confint(successes, trials, alpha=2 * alpha, method="beta")[0])
