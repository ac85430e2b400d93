"""The bound mixture's fast evaluation (``certify.one_sided.GridMixture``) against the reference ``log_mixture``.

Estimate mode computes an anytime lower bound at every look of every image by bisection. ``GridMixture`` computes each
bisection step's test from the grid's p-free sums; where its value lies within a rounding margin of the threshold,
``log_mixture`` answers. These tests hold it to its promise: the bounds are those of a bisection whose every step is
answered by ``log_mixture`` (``margin_ulps=inf``), bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from certify.one_sided import (
    BOUND_BISECTION_STEPS,
    GridMixture,
    OneSidedMixtureTests,
    bisect_bound,
    bound_grid,
    log_mixture,
)

GRID = bound_grid()


def reference_bisection(s, t, log_threshold, above):
    """The bounds' bisection written out with ``log_mixture`` at every step, independently of ``bisect_bound``."""
    qs, weights = GRID
    estimate = np.where(t > 0, s / np.maximum(t, 1), 0.0 if above else 1.0)
    low, high = (np.zeros_like(s), estimate) if above else (estimate, np.ones_like(s))
    for _ in range(BOUND_BISECTION_STEPS):
        mid = (low + high) / 2
        rejected = log_mixture(s, t, mid, qs, weights, above=above) >= log_threshold
        if above:
            low, high = np.where(rejected, mid, low), np.where(rejected, high, mid)
        else:
            low, high = np.where(rejected, low, mid), np.where(rejected, mid, high)
    return low if above else high


def random_counts(rng, n):
    """Trials from 1 to 2e7 (log-uniform), pA anywhere and at the edges: no votes, all votes, one short."""
    t = np.exp(rng.uniform(0, np.log(2e7), n)).round().clip(1)
    p = rng.choice([0.0, 0.5, 0.9, 0.99, 0.999, 0.99999, 1.0], n)
    p = np.where(rng.random(n) < 0.3, rng.random(n), p)
    s = rng.binomial(t.astype(np.int64), p).astype(float)
    s = np.where(rng.random(n) < 0.05, np.maximum(t - 1, 0), s)
    return s, t


@pytest.mark.parametrize("alpha", [0.05, 1e-3, 1e-10])
@pytest.mark.parametrize("above", [True, False], ids=["lower", "upper"])
def test_bounds_equal_the_reference_bisection_bit_for_bit(alpha, above):
    rng = np.random.default_rng(int(-np.log10(alpha)) + 7 * above)
    s, t = random_counts(rng, 20_000)
    threshold = float(np.log(1 / alpha))
    fast = bisect_bound(s, t, GRID, threshold, above)
    np.testing.assert_array_equal(fast, reference_bisection(s, t, threshold, above))
    # margin_ulps = inf leaves every step to log_mixture: the same bisection again, through bisect_bound's own loop
    np.testing.assert_array_equal(fast, bisect_bound(s, t, GRID, threshold, above, margin_ulps=np.inf))


def test_the_tests_class_and_the_confidence_sequence_use_it():
    rng = np.random.default_rng(3)
    s, t = random_counts(rng, 2_000)
    tests = OneSidedMixtureTests(1e-3)
    np.testing.assert_array_equal(tests.lower(s, t), reference_bisection(s, t, np.log(1e3), True))
    np.testing.assert_array_equal(tests.upper(s, t), reference_bisection(s, t, np.log(1e3), False))


@pytest.mark.parametrize("above, share", [(True, 0.01), (False, 0.1)], ids=["above", "below"])
def test_the_fast_value_is_the_mixture_and_rarely_needs_the_reference(above, share, monkeypatch):
    """With no margin (the fast value alone) the answers equal log_mixture's away from the threshold's rounding;
    with the default margin, the reference answers only a small share of a real bisection's steps (the lower bound,
    estimate mode's: under 1%; the upper bound bisects 1 - S / t, a hundred times finer at pA = 0.99, so its last
    steps come within the margin more often)."""
    import certify.one_sided as one_sided

    rng = np.random.default_rng(5)
    s, t = random_counts(rng, 20_000)
    p = np.clip(np.where(above, s / t, 1 - (1 - s / t)) * rng.uniform(0.9, 1.1, s.size), 1e-9, 1 - 1e-9)
    threshold = float(np.log(1e3))
    reference = log_mixture(s, t, p, *GRID, above=above)
    far = np.abs(reference - threshold) > 1e-6
    bare = GridMixture(s, t, GRID, above, margin_ulps=0.0).rejects(p, threshold)
    np.testing.assert_array_equal(bare[far], (reference >= threshold)[far])

    calls = []
    original = one_sided.log_mixture

    def counted(successes, *args, **kwargs):
        calls.append(np.size(successes))
        return original(successes, *args, **kwargs)

    monkeypatch.setattr(one_sided, "log_mixture", counted)
    steady = rng.binomial(5_000, 0.99, size=(200, 50)).astype(float)
    bisect_bound(steady, np.full_like(steady, 5_000.0), GRID, threshold, above)
    assert sum(calls) < share * steady.size * BOUND_BISECTION_STEPS


def test_sums_that_underflow_are_left_to_the_reference():
    """A suffix whose terms lie far below the largest term (exp underflows, or is subnormal) is not trusted: its
    table entry is -inf and log_mixture answers, so the bound is still the reference's."""
    s, t = np.array([6.0e6, 3.0]), np.array([1.0e7, 3.0])  # S / t = 0.6: terms near q = 1 are e^-(millions) below
    mixture = GridMixture(s, t, GRID, above=True)
    assert np.isneginf(mixture.table[0, -1]) and np.isfinite(mixture.table[1]).all()
    p = np.array([0.9999, 0.5])
    np.testing.assert_array_equal(mixture.rejects(p, np.log(1e3)), log_mixture(s, t, p, *GRID) >= np.log(1e3))
    np.testing.assert_array_equal(bisect_bound(s, t, GRID, np.log(1e3)), reference_bisection(s, t, np.log(1e3), True))


def test_a_grid_out_of_order_is_refused():
    qs, weights = GRID
    with pytest.raises(ValueError, match="grid"):
        GridMixture(np.array([1.0]), np.array([2.0]), (qs[::-1].copy(), weights))


@pytest.mark.parametrize("guess", ["zero", "one", "nan", "random", "off by a little"])
def test_the_lower_bound_is_the_bisections_whatever_the_guess(guess, monkeypatch):
    """The guess only predicts the bisection's steps: every prediction is checked against the step's own test, and
    from the first wrong one the steps are taken one by one, so even a useless guess gives the same bound."""
    rng = np.random.default_rng(11)
    s, t = random_counts(rng, 5_000)
    threshold = float(np.log(1e3))
    right = GridMixture.crossing

    def wrong(self, low, high, log_threshold):
        shape = np.shape(low)
        return {"zero": lambda: np.zeros(shape), "one": lambda: np.ones(shape), "nan": lambda: np.full(shape, np.nan),
                "random": lambda: rng.random(shape),
                "off by a little": lambda: right(self, low, high, log_threshold) * (1 + 1e-9)}[guess]()

    monkeypatch.setattr(GridMixture, "crossing", wrong)
    np.testing.assert_array_equal(bisect_bound(s, t, GRID, threshold, True), reference_bisection(s, t, threshold, True))


def test_the_guess_predicts_every_step_in_estimate_modes_range(monkeypatch):
    """Speed, not correctness: for counts as estimate mode meets them (up to 10,000 samples, pA from 0.9), the guess
    predicts every bisection step, so no count is bisected step by step (the bounds are the reference's still)."""
    import certify.one_sided as one_sided

    redone = []
    original = one_sided._bisect_steps

    def counted(mixture, low, *args, **kwargs):
        redone.append(low.size)
        return original(mixture, low, *args, **kwargs)

    monkeypatch.setattr(one_sided, "_bisect_steps", counted)
    rng = np.random.default_rng(12)
    t = np.exp(rng.uniform(np.log(10), np.log(10_000), 20_000)).round()
    s = rng.binomial(t.astype(np.int64), rng.uniform(0.9, 1.0, t.size)).astype(float)
    threshold = float(np.log(1e3))
    bounds = bisect_bound(s, t, GRID, threshold, True)
    assert sum(redone) <= 0.001 * s.size
    np.testing.assert_array_equal(bounds, reference_bisection(s, t, threshold, True))
