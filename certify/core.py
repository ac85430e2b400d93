"""Randomized smoothing (Cohen, Rosenfeld and Kolter, 2019) over an optional denoiser and a frozen classifier.

The smoothed classifier is g(x) = argmax_c P[f(D(x + e)) = c], e ~ N(0, sigma^2 I), where
D is the denoiser (identity when absent), f the base classifier, and pixels are in [0, 1]:
the noise is added before any normalisation (the classifier normalises inside).

- ``predict``: the top class by n noisy samples, or ABSTAIN unless a two-sided binomial test
  between the two top counts rejects a tie at level alpha (Cohen's PREDICT; the test is scipy's).
- ``certify``: select the top class with n0 samples, then estimate with n fresh samples a
  one-sided (1 - alpha) Clopper-Pearson lower bound pA (statsmodels, ``method="beta"``);
  certified L2 radius sigma * Phi^-1(pA), or ABSTAIN when pA < 1/2 (Cohen's CERTIFY).
The selection and estimation samples are never shared.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import binomtest, norm
from statsmodels.stats.proportion import proportion_confint
from torch import nn

from transdenoiser.errors import UserError

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


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 - alpha) lower confidence bound on a binomial proportion (Clopper-Pearson)."""
    if successes == 0:
        return 0.0
    return float(proportion_confint(successes, trials, alpha=2 * alpha, method="beta")[0])


def radius_from_p_lower(p_lower: float, sigma: float) -> float:
    """Certified L2 radius sigma * Phi^-1(pA) (Cohen et al., Theorem 1 with pB = 1 - pA)."""
    return float(sigma * norm.ppf(p_lower))


def validate_sampling(n0: int | None, n: int, alpha: float) -> None:
    if n0 is not None and n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    if n < 1:
        raise UserError(f"n must be >= 1, got {n}")
    if not 0 < alpha < 1:
        raise UserError(f"alpha must lie strictly between 0 and 1, got {alpha}")


class Smooth:
    """A smoothed classifier over ``classifier`` with ``denoiser`` in front (both frozen, eval mode).

    ``sigma``: standard deviation of the Gaussian noise, in [0,1]-pixel units.
    ``batch_size``: noisy samples evaluated per forward pass.
    """

    def __init__(self, classifier: nn.Module, num_classes: int, sigma: float, denoiser: nn.Module | None = None,
                 batch_size: int = 1000, device: torch.device | str | None = None):
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
            raise UserError(f"sigma must be > 0, got {sigma}")
        if num_classes < 2:
            raise UserError(f"num_classes must be >= 2, got {num_classes}")
        if batch_size < 1:
            raise UserError(f"batch size must be >= 1, got {batch_size}")
        self.device = torch.device(device) if device is not None else next(classifier.parameters()).device
        self.classifier = classifier.to(self.device).eval()
        self.denoiser = denoiser.to(self.device).eval() if denoiser is not None else None
        self.num_classes = num_classes
        self.sigma = float(sigma)
        self.batch_size = batch_size

    def generator(self, seed: int) -> torch.Generator:
        """A generator on this smoother's device: same seed, same noise, same result."""
        return torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def base_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the base pipeline f(D(x)) for a batch ``x`` (no noise added here)."""
        if self.denoiser is not None:
            x = self.denoiser(x)
        return self.classifier(x)

    @torch.inference_mode()
    def sample_counts(self, x: torch.Tensor, num: int, generator: torch.Generator | None = None) -> np.ndarray:
        """Class counts of f(D(x + e)) over ``num`` noise draws for one image ``x`` (C, H, W)."""
        x = x.to(self.device)
        counts = torch.zeros(self.num_classes, dtype=torch.long, device=self.device)
        remaining = num
        while remaining > 0:
            size = min(self.batch_size, remaining)
            batch = x.unsqueeze(0).expand(size, *x.shape)
            noise = torch.randn(batch.shape, generator=generator, device=self.device, dtype=x.dtype)
            predictions = self.base_logits(batch + noise * self.sigma).argmax(dim=1)
            counts += torch.bincount(predictions, minlength=self.num_classes)
            remaining -= size
        return counts.cpu().numpy()

    def predict(self, x: torch.Tensor, n: int, alpha: float, generator: torch.Generator | None = None) -> int:
        """Top class of the smoothed classifier at ``x``, or ABSTAIN; wrong with probability at most alpha."""
        validate_sampling(None, n, alpha)
        counts = self.sample_counts(x, n, generator)
        top2 = counts.argsort()[::-1][:2]
        count_a, count_b = int(counts[top2[0]]), int(counts[top2[1]])
        if binomtest(count_a, count_a + count_b, p=0.5).pvalue > alpha:
            return ABSTAIN
        return int(top2[0])

    def certify(self, x: torch.Tensor, n0: int, n: int, alpha: float,
                generator: torch.Generator | None = None) -> Certificate:
        """Certify ``x``: a class with an L2 radius that holds with probability >= 1 - alpha, or ABSTAIN."""
        validate_sampling(n0, n, alpha)
        selection = self.sample_counts(x, n0, generator)
        top = int(selection.argmax())
        estimation = self.sample_counts(x, n, generator)  # fresh draws: never the selection samples
        count = int(estimation[top])
        p_lower = clopper_pearson_lower(count, n, alpha)
        if p_lower < 0.5:
            return Certificate(ABSTAIN, 0.0, p_lower, count, n0, n)
        return Certificate(top, radius_from_p_lower(p_lower, self.sigma), p_lower, count, n0, n)
