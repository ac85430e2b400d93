"""Canaries for one-run audits: gradient canaries (white-box) and image canaries (black-box).

Each of m canaries is included independently with probability 1/2, drawn from ``numpy.random.default_rng``
of the audit seed (reproducible: the same seed, the same canaries and the same inclusion).

White-box (:class:`GradientCanaries`): canary j is a per-example gradient equal to C u_j for a unit direction
u_j (a coordinate of the flattened parameter vector, distinct per canary, when the model has at least m
parameters; else a random Gaussian direction). In every step each included canary joins the step's batch
independently with the run's Poisson rate q, drawn from the run's own generator, and its gradient C u_j is
added to the step's summed clipped gradient BEFORE the arm adds its noise: the product's own noise code
(:class:`training.privacy.dp.GaussianNoise` via the arm) noises it. :func:`audited_arm_class` makes the arm subclass
that does this, by wrapping the arm's noise object; nothing in the training code changes.

Scores (higher = more likely included), summed over steps:

- ``update``: <noisy summed gradient of the step, u_j>: what an adversary who sees every update observes.
- ``known_others`` (default): <noisy summed gradient - the clipped sum of the real examples, u_j>, i.e. the
  canary's own contribution plus the noise's projection. This is the DP adversary that knows every other
  example's contribution: given the real examples' batches and input noise (independent of which canaries are
  included), each canary still meets exactly the subsampled Gaussian mechanism the accountant analyses, so the
  claimed epsilon must hold against this score too.
- ``likelihood_ratio``: the same per-step observation y_t = <noise + canary, u_j> / C, scored by the
  Neyman-Pearson statistic of one Poisson-subsampled Gaussian step, sum_t log(1 - q + q exp((y_t - 1/2) / xi^2)),
  with xi the run's planned noise multiplier (public). The sum of projections weighs every step alike; this
  weighs a step by how strongly it points at an insertion, which matters when q is small. Any score computed
  without the inclusion is a valid audit; this one is the most powerful per-step test of the claimed mechanism.

For the transdenoiser arm the canaries ride with the step's full-noise (xi_up) noise call; a step that has
none (every example of the batch credited with input noise) drops its sampled canaries (a dropped canary
leaks less, so the audit can only be weaker, never wrongly fail). For nodp (no noise) the canary sum divided
by B is added to the step's mean gradient.

Black-box (:class:`ImageCanaries`): m out-of-distribution images (random binary 7x7 block patterns scaled
to the image size), each added to the private split with probability 1/2; score = minus the trained
denoiser's reconstruction loss on the canary (mean over fixed input-noise draws).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

WHITEBOX_SCORES = ("known_others", "update", "likelihood_ratio")
PATTERN_CELLS = 7


def _inclusion(m: int, rng: np.random.Generator) -> np.ndarray:
    return rng.random(m) < 0.5


class GradientCanaries:
    """m gradient canaries for a model, their inclusion, and the per-canary scores accumulated in training."""

    def __init__(self, model: nn.Module, num_canaries: int, audit_seed: int, clip_norm: float,
                 sample_rate: float, score: str = "known_others", noise_multiplier: float | None = None):
        if num_canaries < 1:
            raise ValueError("need at least one canary")
        if score not in WHITEBOX_SCORES:
            raise ValueError(f"score must be one of {WHITEBOX_SCORES}, got {score!r}")
        if score == "likelihood_ratio" and not (noise_multiplier and noise_multiplier > 0):
            raise ValueError("the likelihood_ratio score needs the run's (positive) noise multiplier")
        self.noise_multiplier = noise_multiplier
        rng = np.random.default_rng([audit_seed, 1])
        self.names = [k for k, p in model.named_parameters() if p.requires_grad]
        self.shapes = {k: p.shape for k, p in model.named_parameters() if p.requires_grad}
        self.num_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.m, self.clip_norm, self.sample_rate, self.score_kind = num_canaries, clip_norm, sample_rate, score
        self.included = _inclusion(num_canaries, rng)
        device = next(model.parameters()).device
        if self.num_parameters >= num_canaries:
            self.kind = "coordinate"
            self.coordinates = torch.as_tensor(rng.choice(self.num_parameters, num_canaries, replace=False),
                                               device=device)
            self.directions = None
        else:
            self.kind = "gaussian"
            dirs = torch.as_tensor(rng.standard_normal((num_canaries, self.num_parameters)), dtype=torch.float32)
            self.directions = (dirs / dirs.norm(dim=1, keepdim=True)).to(device)
            self.coordinates = None
        self._included_t = torch.as_tensor(self.included, device=device)
        self.update_score = torch.zeros(num_canaries, dtype=torch.float64, device=device)
        self.known_score = torch.zeros(num_canaries, dtype=torch.float64, device=device)
        self.ratio_score = torch.zeros(num_canaries, dtype=torch.float64, device=device)
        self.times_inserted = torch.zeros(num_canaries, dtype=torch.int64, device=device)
        self.steps = 0
        self.dropped_steps = 0
        self.full_noise_steps = 0  # steps with a full-noise (xi_up) call: the steps that can carry canaries
        self._full_noise = False
        self._pending: torch.Tensor | None = None  # canaries sampled this step and not yet delivered

    # -------------------------------------------------------------- vectors
    def flatten(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([tensors[k].reshape(-1) for k in self.names])

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        out, start = {}, 0
        for k in self.names:
            n = int(np.prod(self.shapes[k])) if len(self.shapes[k]) else 1
            out[k] = flat[start:start + n].reshape(self.shapes[k])
            start += n
        return out

    def project(self, flat: torch.Tensor) -> torch.Tensor:
        """<flat, u_j> for every canary j (float64)."""
        if self.coordinates is not None:
            return flat[self.coordinates].to(torch.float64)
        return (self.directions @ flat.to(self.directions.dtype)).to(torch.float64)

    def canary_sum(self, active: torch.Tensor) -> torch.Tensor:
        """C * sum_{j active} u_j as a flat vector."""
        weights = active.to(torch.float32) * self.clip_norm
        if self.coordinates is not None:
            flat = torch.zeros(self.num_parameters, device=weights.device)
            flat[self.coordinates] = weights
            return flat
        return weights @ self.directions

    # -------------------------------------------------------------- one step
    def begin_step(self, generator: torch.Generator) -> None:
        """Poisson-sample the included canaries for this step from the run's generator."""
        sampled = (torch.rand(self.m, generator=generator) < self.sample_rate).to(self._included_t.device)
        self._pending = sampled & self._included_t
        self._noise_projection = torch.zeros(self.m, dtype=torch.float64, device=self._included_t.device)
        self._delivered = torch.zeros(self.m, dtype=torch.bool, device=self._included_t.device)
        self._full_noise = False
        self.steps += 1

    def deliver(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Add the pending canaries' gradients to ``tensors`` (a summed clipped gradient), once per step."""
        if self._pending is None or not bool(self._pending.any()):
            self._pending = None
            return tensors
        extra = self.unflatten(self.canary_sum(self._pending))
        self._delivered = self._pending
        self._pending = None
        return {k: tensors[k] + extra[k].to(tensors[k].dtype) for k in tensors}

    def observe_noise(self, before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> None:
        self._noise_projection += self.project(self.flatten(after) - self.flatten(before))

    def end_step(self, summed_update: dict[str, torch.Tensor]) -> None:
        """Accumulate the step's scores; ``summed_update``: the noisy summed gradient the arm released."""
        if self._pending is not None and bool(self._pending.any()):
            self.dropped_steps += 1  # sampled but no full-noise call this step: not delivered
        self._pending = None
        self.full_noise_steps += int(self._full_noise)
        self.update_score += self.project(self.flatten(summed_update))
        observed = self._noise_projection + self.clip_norm * self._delivered.to(torch.float64)
        self.known_score += observed
        if self.noise_multiplier:
            q = self.sample_rate
            y = observed / self.clip_norm
            self.ratio_score += torch.logaddexp(torch.full_like(y, math.log1p(-q)) if q < 1 else
                                                torch.full_like(y, -math.inf),
                                                math.log(q) + (y - 0.5) / self.noise_multiplier ** 2)
        self.times_inserted += self._delivered.to(torch.int64)

    def scores(self) -> np.ndarray:
        chosen = {"known_others": self.known_score, "update": self.update_score,
                  "likelihood_ratio": self.ratio_score}[self.score_kind]
        return chosen.cpu().numpy()

    def known_others_scores(self) -> np.ndarray:
        """The ``known_others`` score whatever the audit's score (the check against the claimed noise uses it)."""
        return self.known_score.cpu().numpy()


class _CanaryNoise:
    """Wraps an arm's GaussianNoise: the first full-noise call of a step gets the canaries added first."""

    def __init__(self, inner, canaries: GradientCanaries, arm):
        self.inner, self.canaries, self.arm = inner, canaries, arm

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def add(self, tensors, noise_multiplier, generator):
        if noise_multiplier >= self.arm.xi_up:
            self.canaries._full_noise = True
            if self.canaries._pending is not None:
                tensors = self.canaries.deliver(tensors)
        noisy = self.inner.add(tensors, noise_multiplier, generator)
        self.canaries.observe_noise(tensors, noisy)
        return noisy


def audited_arm_class(base: type, canaries: GradientCanaries) -> type:
    """A subclass of the arm class ``base`` that inserts ``canaries`` into every step and records scores."""

    class AuditedArm(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if hasattr(self, "noise"):
                self.noise = _CanaryNoise(self.noise, canaries, self)

        def gradient(self, x, generator, labels=None):
            canaries.begin_step(generator)
            grads, record = super().gradient(x, generator, labels)
            batch = float(self.expected_batch)
            if not hasattr(self, "noise"):  # nodp: no noise; the canaries join the mean gradient
                extra = canaries.deliver({k: torch.zeros_like(v) for k, v in grads.items()})
                grads = {k: grads[k] + extra[k] / batch for k in grads}
            canaries.end_step({k: v * batch for k, v in grads.items()})
            return grads, record

    AuditedArm.__name__ = AuditedArm.__qualname__ = f"Audited{base.__name__}"
    return AuditedArm


# ------------------------------------------------------------------------------------------------ black-box

class ImageCanaries:
    """m out-of-distribution canary images (uint8, the dataset's shape) and their inclusion."""

    def __init__(self, image_shape: tuple[int, int, int], num_canaries: int, audit_seed: int):
        if num_canaries < 1:
            raise ValueError("need at least one canary")
        rng = np.random.default_rng([audit_seed, 2])
        channels, height, width = image_shape
        cells = rng.random((num_canaries, channels, PATTERN_CELLS, PATTERN_CELLS)) < 0.5
        rows = np.arange(height) * PATTERN_CELLS // height
        cols = np.arange(width) * PATTERN_CELLS // width
        self.images = (cells[:, :, rows][:, :, :, cols] * 255).astype(np.uint8)
        self.included = _inclusion(num_canaries, rng)
        self.m = num_canaries


@torch.no_grad()
def reconstruction_losses(model: nn.Module, x: torch.Tensor, sigma: float, draws: int, seed: int,
                          batch: int = 500) -> np.ndarray:
    """Per-example ||g(x + N(0, sigma^2 I)) - x||^2 (summed over pixels), mean over ``draws`` fixed noise draws."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total = torch.zeros(len(x), dtype=torch.float64)
    for _ in range(draws):
        for start in range(0, len(x), batch):
            xb = x[start:start + batch]
            zb = xb + sigma * torch.randn(xb.shape, generator=generator).to(xb.device)
            total[start:start + batch] += (model(zb) - xb).pow(2).flatten(1).sum(1).double().cpu()
    model.train(was_training)
    return (total / draws).numpy()


__all__ = ["GradientCanaries", "ImageCanaries", "WHITEBOX_SCORES", "audited_arm_class", "reconstruction_losses"]
