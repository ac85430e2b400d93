"""certify.compare: paired differences of two certification runs on the same images."""
from __future__ import annotations

import math

import numpy as np
import pytest

from certify.compare import certified_matrix, format_points, paired_difference
from certify.rundir import CertifyRecord
from transdenoiser.errors import UserError

RADII = (0.0, 0.25, 0.5)


def records(radii_by_image: dict[int, float | None]) -> list[CertifyRecord]:
    """None: a wrong prediction; otherwise a correct one certified at that radius."""
    return [CertifyRecord(idx=i, label=0, prediction=0 if r is not None else 1, radius=r or 0.0,
                          correct=r is not None, seconds=0.0) for i, r in radii_by_image.items()]


def test_matrix_counts_correct_predictions_at_radius_zero_and_radius_at_least_r():
    rows = records({3: 0.0, 1: 0.3, 2: None, 0: 0.5})
    matrix = certified_matrix(rows, RADII, indices=[0, 1, 2, 3])
    assert matrix.tolist() == [[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0]]


def test_difference_is_exact_and_its_interval_matches_the_binomial_width():
    """theirs certifies images 0..99 of 200 at 0.5, ours the same plus 100..139: +20 points exactly. Each image's
    difference is 0 or 1 with mean 0.2, so the bootstrap's standard error is sqrt(0.2 * 0.8 / 200) = 2.83 points
    and the 95% interval about +20 -+ 5.5 points."""
    theirs = records({i: 0.6 if i < 100 else None for i in range(200)})
    ours = records({i: 0.6 if i < 140 else None for i in range(200)})
    result = paired_difference(ours, theirs, RADII, resamples=20_000, seed=1)
    assert result.images == 200 and result.difference == pytest.approx((0.2, 0.2, 0.2))
    half_width = 1.96 * math.sqrt(0.2 * 0.8 / 200)
    assert result.low[2] == pytest.approx(0.2 - half_width, abs=0.006)
    assert result.high[2] == pytest.approx(0.2 + half_width, abs=0.006)
    assert format_points(result, 2).startswith("+20.0 [+14.")


def test_pairing_narrows_the_interval_against_unpaired_intervals():
    """Two runs that agree on every image but one: the paired interval is a few points wide at most, where two
    separate binomial intervals at 50% on 200 images would each be +-7 points."""
    theirs = records({i: 0.6 if i % 2 else None for i in range(200)})
    ours = records({i: 0.6 if i % 2 or i == 0 else None for i in range(200)})
    result = paired_difference(ours, theirs, RADII)
    assert result.difference[2] == pytest.approx(0.005)
    assert result.low[2] >= 0 and result.high[2] <= 0.015


def test_identical_runs_differ_by_exactly_zero():
    rows = records({i: float(i % 3) / 4 for i in range(50)})
    result = paired_difference(rows, list(reversed(rows)), RADII)
    assert result.difference == (0.0, 0.0, 0.0) and result.low == (0.0, 0.0, 0.0) and result.high == (0.0, 0.0, 0.0)


def test_other_images_and_bad_confidence_are_refused():
    with pytest.raises(UserError, match="same images in both runs: 1 only in one, 1 only in the other"):
        paired_difference(records({0: 0.1, 1: 0.2}), records({0: 0.1, 2: 0.2}), RADII)
    with pytest.raises(UserError, match="confidence"):
        paired_difference(records({0: 0.1}), records({0: 0.1}), RADII, confidence=1.0)


def test_the_same_seed_gives_the_same_interval():
    rng = np.random.default_rng(0)
    ours = records({i: (float(rng.random()) if rng.random() < 0.7 else None) for i in range(100)})
    theirs = records({i: (float(rng.random()) if rng.random() < 0.6 else None) for i in range(100)})
    assert paired_difference(ours, theirs, RADII, seed=3) == paired_difference(ours, theirs, RADII, seed=3)


def test_paired_outcomes_compare_any_per_image_results_and_refuse_other_shapes():
    """Per-image outcomes under attack (one column per bound): the difference of the column means."""
    from certify.compare import paired_outcomes

    ours = np.array([[1, 1], [1, 0], [1, 1], [0, 0]])
    theirs = np.array([[1, 0], [1, 0], [0, 0], [0, 0]])
    result = paired_outcomes(ours, theirs, (0.5, 2.0))
    assert result.difference == (0.25, 0.5) and result.radii == (0.5, 2.0) and result.images == 4
    assert all(lo <= d <= hi for d, lo, hi in zip(result.difference, result.low, result.high, strict=True))
    with pytest.raises(UserError, match="same shape"):
        paired_outcomes(ours, theirs[:3], (0.5, 2.0))
