"""What the attacker differentiates: the three threat models as per-example losses of the pixels.

Each threat is a callable ``threat(x, labels, generator) -> loss`` with ``loss`` of shape (N,), to be
used by the attacks of certify/attacks/gradient.py. Models are frozen (put in eval mode; gradients flow to
the pixels only) and pixels are in [0, 1]; the Gaussian noise, of standard deviation ``sigma`` in
pixel units, is added before the denoiser, as in certify/core.py.

- ``classifier``: cross-entropy of the pretrained classifier alone (no denoiser, no noise), the
  transfer setting of the TransDenoiser paper; its adversarial examples are then evaluated
  through the defended pipeline.
- ``pipeline``: expectation over transformation (EOT, Athalye et al. 2018): the mean over ``m``
  Gaussian noise draws of the cross-entropy of denoiser + classifier at x + noise. Its gradient is
  a Monte-Carlo estimate of the gradient of the expected loss under the defence's own noise.
- ``smoothed``: SmoothAdv (Salman et al., 2019): the smoothed *soft* classifier
  G(x) = E[softmax(f(D(x + noise)))], estimated by the mean over ``m`` draws, attacked through
  the loss -log G(x)_y.

Fresh noise is drawn on every call (every attack step) from ``generator``: seeded, repeatable.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from certify.attacks.names import THREATS  # noqa: E402
from transdenoiser.errors import UserError


def _frozen(module: nn.Module) -> nn.Module:
    """Eval mode (dropout off, batch-norm statistics fixed); the attacks differentiate the pixels only."""
    return module.eval()


class ClassifierThreat:
    """Cross-entropy of the classifier alone: white-box on the model the defence was built around."""

    name = "classifier"

    def __init__(self, classifier: nn.Module):
        self.classifier = _frozen(classifier)

    def __call__(self, x: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return F.cross_entropy(self.classifier(x), labels, reduction="none")


class _NoisyThreat:
    """Shared part of the noisy threats: the base pipeline f(D(.)) evaluated at ``m`` noisy copies of x."""

    def __init__(self, classifier: nn.Module, sigma: float, denoiser: nn.Module | None = None, m: int = 8):
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
            raise UserError(f"{self.name} threat: sigma must be > 0, got {sigma}")
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise UserError(f"{self.name} threat: the number of noise draws (EOT) must be an integer >= 1, got {m}")
        self.classifier = _frozen(classifier)
        self.denoiser = _frozen(denoiser) if denoiser is not None else None
        self.sigma = float(sigma)
        self.m = m

    def noisy_logits(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Logits of f(D(x + e_j)) for j = 1..m, shape (m, N, num_classes); differentiable in x."""
        copies = x.unsqueeze(0).expand(self.m, *x.shape)
        noise = torch.randn(copies.shape, generator=generator, device=x.device, dtype=x.dtype)
        batch = (copies + self.sigma * noise).reshape(self.m * len(x), *x.shape[1:])
        if self.denoiser is not None:
            batch = self.denoiser(batch)
        return self.classifier(batch).reshape(self.m, len(x), -1)


class PipelineThreat(_NoisyThreat):
    """EOT: mean over m noise draws of the cross-entropy of denoiser + classifier."""

    name = "pipeline"

    def __call__(self, x: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        logits = self.noisy_logits(x, generator)
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.repeat(self.m), reduction="none")
        return losses.reshape(self.m, len(x)).mean(dim=0)


class SmoothedThreat(_NoisyThreat):
    """SmoothAdv: -log of the softmax averaged over m noise draws, at the label."""

    name = "smoothed"

    def __call__(self, x: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        log_probabilities = self.noisy_logits(x, generator).log_softmax(dim=-1)  # (m, N, C)
        log_mean = torch.logsumexp(log_probabilities, dim=0) - math.log(self.m)  # log G(x), computed stably
        return -log_mean.gather(1, labels.view(-1, 1)).squeeze(1)


def build_threat(name: str, classifier: nn.Module, denoiser: nn.Module | None = None, sigma: float = 0.25,
                 m: int = 8) -> ClassifierThreat | PipelineThreat | SmoothedThreat:
    """The threat called ``name``; ``classifier`` ignores the denoiser, sigma and m by definition."""
    if name == "classifier":
        return ClassifierThreat(classifier)
    if name == "pipeline":
        return PipelineThreat(classifier, sigma, denoiser, m)
    if name == "smoothed":
        return SmoothedThreat(classifier, sigma, denoiser, m)
    raise UserError(f"unknown threat model {name!r}; expected one of {', '.join(THREATS)}")
