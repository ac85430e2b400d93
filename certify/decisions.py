"""The pure decisions of randomized smoothing (Cohen, Rosenfeld and Kolter, 2019): from vote counts to answers.

No torch, no model: counts in, a class, a bound and a radius out. :class:`certify.core.Smooth` draws the counts;
the server, the runner and the tests call these same functions.

- :func:`certificate_from_counts`: Cohen's CERTIFY: the class from the selection counts, a one-sided (1 - alpha)
  Clopper-Pearson lower bound pA on its probability from the estimation counts (statsmodels' ``method="beta"``
  bound, bit for bit), radius sigma * Phi^-1(pA), ABSTAIN when pA < 1/2.
- :func:`prediction_from_counts`: Cohen's PREDICT: the top class unless a two-sided binomial test between the two
  top counts cannot reject a tie at level alpha (scipy's ``binomtest``).

The Clopper-Pearson bound itself is :func:`transdenoiser.stats.clopper_pearson_lower` (shared with the baselines).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri
from scipy.stats import binomtest

from transdenoiser.errors import UserError
from transdenoiser.stats import clopper_pearson_lower

ABSTAIN = -1


@dataclass(frozen=True)
class Certificate:
    """Result of :meth:`Smooth.certify` for one image; ``radius`` is an L2 radius in [0,1]-pixel units."""

    prediction: int  # class index, or ABSTAIN
    radius: float  # 0.0 when abstaining
    p_lower: float  # one-sided Clopper-Pearson lower bound on P[f(D(x+e)) = prediction]
    count: int  # estimation samples that voted for the selected class
    n0: int
    n: int

    @property
    def abstained(self) -> bool:
        return self.prediction == ABSTAIN


def radius_from_p_lower(p_lower: float, sigma: float) -> float:
    """Certified L2 radius sigma * Phi^-1(pA) (Cohen et al., Theorem 1 with pB = 1 - pA)."""
    return float(sigma * ndtri(p_lower))  # norm.ppf's values, without its per-call overhead


def max_certifiable_radius(sigma: float, n: int, alpha: float) -> float:
    """The largest radius ``certify`` can return with n estimation samples: every sample votes for the class."""
    return radius_from_p_lower(clopper_pearson_lower(n, n, alpha), sigma)


def validate_sampling(n0: int | None, n: int, alpha: float) -> None:
    if n0 is not None and n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    if n < 1:
        raise UserError(f"n must be >= 1, got {n}")
    if not 0 < alpha < 1:
        raise UserError(f"alpha must lie strictly between 0 and 1, got {alpha}")


def image_seed(seed: int, idx: int) -> int:
    """Seed of the generator for image ``idx`` of a run seeded with ``seed`` (NumPy's SeedSequence mixing).

    Every image gets its own independent noise stream, so a result depends on (seed, idx) only,
    never on which process, shard or pack the image was certified in.
    """
    if idx < 0:
        raise UserError(f"image index must be >= 0, got {idx}")
    words = np.random.SeedSequence([seed % 2**64, idx]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31) ^ int(words[1])  # < 2**63: a valid torch seed


def certificate_from_counts(selection: np.ndarray, estimation: np.ndarray, alpha: float,
                            sigma: float) -> Certificate:
    """Cohen's CERTIFY decision: the class comes from ``selection`` counts, its bound from ``estimation`` counts."""
    n0, n = int(selection.sum()), int(estimation.sum())
    top = int(selection.argmax())
    count = int(estimation[top])
    p_lower = clopper_pearson_lower(count, n, alpha)
    if p_lower < 0.5:
        return Certificate(ABSTAIN, 0.0, p_lower, count, n0, n)
    return Certificate(top, radius_from_p_lower(p_lower, sigma), p_lower, count, n0, n)


def prediction_from_counts(counts: np.ndarray, alpha: float) -> int:
    """Cohen's PREDICT decision: the top class unless a two-sided binomial test cannot tell it from the runner-up."""
    top2 = counts.argsort()[::-1][:2]
    count_a, count_b = int(counts[top2[0]]), int(counts[top2[1]])
    if binomtest(count_a, count_a + count_b, p=0.5).pvalue > alpha:
        return ABSTAIN
    return int(top2[0])
