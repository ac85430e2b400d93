"""Algorithm 1, line 8: the Taylor remainder of each example's loss around its clean image, in float64.

``o_i = l(z_i) - l(x_i) - (z_i - x_i)^T grad_x l(x_i)`` with ``l(.) = ||g(.) - x_i||^2`` (eq. 1). An example
counts as non-negative only if ``o_i`` exceeds :data:`REMAINDER_TOLERANCE_ULPS` ulps of the terms it is made
of, so rounding can only move examples to the full-noise side.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from training.privacy.dp import input_gradient_fn, losses_fn, model_params

EPS64 = float(np.finfo(np.float64).eps)
REMAINDER_TOLERANCE_ULPS = 64


class TaylorRemainders:
    """``(remainders, tolerances)`` of a batch for ``model``'s current weights (float64 copies)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.at_clean = input_gradient_fn(model)
        self.losses = losses_fn(model)

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        params, buffers = model_params(self.model, torch.float64)
        z64, x64 = z.to(torch.float64), x.to(torch.float64)
        grad_x, loss_x = self.at_clean(params, buffers, x64)
        loss_z = self.losses(params, buffers, z64, x64)
        linear = ((z64 - x64) * grad_x).flatten(1)
        remainder = loss_z - loss_x - linear.sum(1)
        scale = loss_z.abs() + loss_x.abs() + linear.abs().sum(1)
        return remainder, REMAINDER_TOLERANCE_ULPS * x[0].numel() * EPS64 * scale


__all__ = ["TaylorRemainders", "REMAINDER_TOLERANCE_ULPS", "EPS64"]
