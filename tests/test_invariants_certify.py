"""Certificate and prediction rules against closed forms and exact binomial tails (never against certify.core).

- Clopper-Pearson one-sided (1 - alpha) lower bound: k = n gives alpha^(1/n), k = 1 gives 1 - (1 - alpha)^(1/n),
  k = 0 gives 0, and by symmetry the upper bound at k = 0 is 1 - alpha^(1/n); any k solves P[Bin(n, p) >= k] = alpha.
- CERTIFY at the boundary: the smallest count whose bound reaches 1/2, found from the exact Bin(n, 1/2) tail.
- PREDICT at the boundary: the exact two-sided binomial p-value of the two top counts, just below and just above
  alpha, on fixed count vectors and end to end through ``Smooth`` with a base model whose votes are scripted.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.stats import binom, norm
from torch import nn

from certify.core import ABSTAIN, Smooth, certificate_from_counts, clopper_pearson_lower, prediction_from_counts

CASES = [(1, 0.05), (10, 0.001), (100, 0.01), (1000, 0.001), (100_000, 0.001)]


def upper_tail_counts(n: int) -> list[int]:
    """[2^n P[Bin(n, 1/2) >= k] for k = 0..n+1], exact integers (binomial coefficients summed from the top)."""
    tails, running, coefficient = [0] * (n + 2), 0, 1  # coefficient = comb(n, j), j from n down
    for j in range(n, -1, -1):
        running += coefficient
        tails[j] = running
        coefficient = coefficient * j // (n - j + 1)
    return tails


def at_most(count: int, n: int, alpha: float) -> bool:
    """Exactly: count / 2^n <= alpha."""
    level = Fraction(alpha)
    return count * level.denominator <= level.numerator * 2 ** n


def two_sided_p_value(count_a: int, count_b: int) -> Fraction:
    """Exact two-sided binomial test of a tie (p = 1/2) between two counts: min(1, 2 P[X >= max])."""
    n, top = count_a + count_b, max(count_a, count_b)
    if 2 * top == n:
        return Fraction(1)
    return min(Fraction(1), Fraction(2 * upper_tail_counts(n)[top], 2 ** n))


def smallest_certifying_count(n: int, alpha: float) -> int:
    """The least k with P[Bin(n, 1/2) >= k] <= alpha: the bound on pA reaches 1/2 exactly from there on."""
    tails = upper_tail_counts(n)
    return next(k for k in range(n + 1) if at_most(tails[k], n, alpha))


# ------------------------------------------------------------------------------------------ Clopper-Pearson

@pytest.mark.parametrize(("n", "alpha"), CASES)
def test_clopper_pearson_all_successes_is_alpha_to_the_one_over_n(n, alpha):
    assert clopper_pearson_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-9)
    # the two-sided interval at the same alpha would give (alpha / 2)^(1/n): strictly lower
    assert clopper_pearson_lower(n, n, alpha) > (alpha / 2) ** (1 / n) * (1 + 1e-12)


@pytest.mark.parametrize(("n", "alpha"), CASES)
def test_clopper_pearson_one_and_zero_successes(n, alpha):
    assert clopper_pearson_lower(0, n, alpha) == 0.0
    # by symmetry (count failures), the upper bound at k = 0 is 1 minus the lower bound at k = n
    assert 1 - clopper_pearson_lower(n, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-6, abs=1e-12)
    if n > 1:
        # k = 1: P[Bin(n, p) >= 1] = 1 - (1 - p)^n = alpha
        assert clopper_pearson_lower(1, n, alpha) == pytest.approx(1 - (1 - alpha) ** (1 / n), rel=1e-7)


@pytest.mark.parametrize(("k", "n", "alpha"), [(7, 20, 0.05), (990, 1000, 0.001), (5123, 10_000, 0.01),
                                                (99_500, 100_000, 0.001)])
def test_clopper_pearson_bound_solves_the_binomial_tail_equation(k, n, alpha):
    p_lower = clopper_pearson_lower(k, n, alpha)
    assert binom.sf(k - 1, n, p_lower) == pytest.approx(alpha, rel=1e-6)  # P[Bin(n, pL) >= k] = alpha


def test_clopper_pearson_is_statsmodels_bound_bit_for_bit():
    """The bound is statsmodels' proportion_confint(method="beta") lower end at 2 alpha, to the last bit, over
    every count at small n and a spread of counts up to n = 10^6 (SciPy's betaincinv without the overhead)."""
    from statsmodels.stats.proportion import proportion_confint

    rng = np.random.default_rng(0)
    checked = 0
    for n in (1, 2, 5, 10, 64, 100, 1000, 1100, 10_000, 100_000, 1_000_000):
        counts = np.unique(np.concatenate([np.arange(1, min(n, 200) + 1), rng.integers(1, n + 1, size=200), [n]]))
        for alpha in (1e-5, 1e-3, 0.01, 0.05, 0.25):
            reference = proportion_confint(counts, n, alpha=2 * alpha, method="beta")[0]
            ours = np.array([clopper_pearson_lower(int(k), n, alpha) for k in counts])
            assert np.array_equal(ours, reference), (n, alpha)
            checked += len(counts)
    assert checked > 10_000


def test_radius_is_sigma_times_scipys_normal_quantile_bit_for_bit():
    from scipy.stats import norm

    from certify.decisions import radius_from_p_lower

    p = np.concatenate([np.linspace(0.5, 1.0, 20_001), 1 - np.logspace(-15, -1, 2_001)])
    assert [radius_from_p_lower(x, 0.25) for x in p] == [float(0.25 * norm.ppf(x)) for x in p]


# ------------------------------------------------------------------------------------------ CERTIFY boundary

@pytest.mark.parametrize(("n", "alpha"), [(100, 0.001), (1000, 0.001), (1000, 0.05), (10_000, 0.001)])
def test_certify_abstains_just_below_the_count_whose_bound_reaches_one_half(n, alpha):
    k = smallest_certifying_count(n, alpha)
    sigma, n0 = 0.25, 100
    selection = np.array([0, n0, 0])
    just = certificate_from_counts(selection, np.array([n - k, k, 0]), alpha, sigma)
    below = certificate_from_counts(selection, np.array([n - k + 1, k - 1, 0]), alpha, sigma)
    assert below.prediction == ABSTAIN and below.radius == 0.0
    assert just.prediction == 1 and (just.count, just.n0, just.n) == (k, n0, n)
    assert just.p_lower >= 0.5 and binom.sf(k - 1, n, just.p_lower) == pytest.approx(alpha, rel=1e-6)
    assert just.radius == pytest.approx(sigma * norm.ppf(just.p_lower), abs=1e-12)
    # every estimation vote for the class: radius sigma * Phi^-1(alpha^(1/n))
    full = certificate_from_counts(selection, np.array([0, n, 0]), alpha, sigma)
    assert full.radius == pytest.approx(sigma * norm.ppf(alpha ** (1 / n)), rel=1e-7)


# ------------------------------------------------------------------------------------------ PREDICT boundary

def predict_boundary(n_pair: int, alpha: float) -> int:
    """The least top count a (of a + b = n_pair) whose two-sided p-value is <= alpha."""
    tails = upper_tail_counts(n_pair)
    return next(a for a in range(n_pair // 2 + 1, n_pair + 1) if at_most(2 * tails[a], n_pair, alpha))


@pytest.mark.parametrize(("n_pair", "alpha"), [(50, 0.05), (400, 0.001), (1000, 0.01)])
def test_predict_at_the_test_level(n_pair, alpha):
    a = predict_boundary(n_pair, alpha)
    third = 3  # a third class below the runner-up must not enter the test
    assert prediction_from_counts(np.array([n_pair - a, a, third]), alpha) == 1
    assert prediction_from_counts(np.array([n_pair - a + 1, a - 1, third]), alpha) == ABSTAIN
    # exactly at the level: p-value = alpha rejects, a level just below it does not
    p = float(two_sided_p_value(a, n_pair - a))
    assert prediction_from_counts(np.array([third, n_pair - a, a]), p * (1 + 1e-9)) == 2
    assert prediction_from_counts(np.array([third, n_pair - a, a]), p * (1 - 1e-9)) == ABSTAIN


def test_predict_tests_the_two_top_counts_only():
    # 300 vs 240 is a tie at alpha 0.001 (p ~ 0.011), whatever the small classes hold
    assert float(two_sided_p_value(300, 240)) > 0.001
    assert prediction_from_counts(np.array([10, 240, 300, 50]), 0.001) == ABSTAIN
    # 300 vs 200: p ~ 9e-6 < 0.001, even though 300 is not a majority of all 1000 votes
    assert float(two_sided_p_value(300, 200)) < 0.001
    assert prediction_from_counts(np.array([250, 200, 300, 250]), 0.001) == ABSTAIN  # 300 vs 250: a tie
    assert prediction_from_counts(np.array([150, 200, 300, 150]), 0.001) == 2


# ------------------------------------------------------------------------------------------ end to end

class ScriptedVotes(nn.Module):
    """Votes for ``script[i]`` on the i-th sample it ever sees (one worker, so passes arrive in order)."""

    def __init__(self, script: list[int], num_classes: int):
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.script = torch.tensor(script)
        self.num_classes = num_classes
        self.seen = 0

    def forward(self, x):
        votes = self.script[self.seen:self.seen + x.shape[0]]
        assert len(votes) == x.shape[0], "more samples evaluated than scripted"
        self.seen += x.shape[0]
        return nn.functional.one_hot(votes, self.num_classes).float()


def scripted_smooth(script: list[int], num_classes: int = 3) -> Smooth:
    return Smooth(ScriptedVotes(script, num_classes), num_classes=num_classes, sigma=0.5, batch_size=64,
                  device="cpu", workers=1, memory_format="contiguous")


@pytest.mark.parametrize(("n", "alpha"), [(200, 0.001), (1000, 0.01)])
def test_smooth_certify_end_to_end_at_the_boundary(n, alpha):
    n0, k = 20, smallest_certifying_count(n, alpha)
    for count, certifies in ((k, True), (k - 1, False)):
        script = [2] * n0 + [2] * count + [0] * (n - count)
        cert = scripted_smooth(script).certify(torch.zeros(1, 2, 2), n0, n, alpha, torch.Generator().manual_seed(0))
        assert (cert.n0, cert.n, cert.count) == (n0, n, count)
        if certifies:
            assert cert.prediction == 2 and cert.radius == pytest.approx(0.5 * norm.ppf(cert.p_lower), abs=1e-12)
            assert binom.sf(count - 1, n, cert.p_lower) == pytest.approx(alpha, rel=1e-6)
        else:
            assert cert.prediction == ABSTAIN and cert.radius == 0.0


@pytest.mark.parametrize(("n_pair", "alpha"), [(400, 0.001), (1000, 0.05)])
def test_smooth_predict_end_to_end_at_the_boundary(n_pair, alpha):
    a = predict_boundary(n_pair, alpha)
    for top, expected in ((a, 1), (a - 1, ABSTAIN)):
        script = [1] * top + [0] * (n_pair - top) + [2] * 5
        got = scripted_smooth(script).predict(torch.zeros(1, 2, 2), n_pair + 5, alpha,
                                              torch.Generator().manual_seed(0))
        assert got == expected, (top, n_pair, alpha)
