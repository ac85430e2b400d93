"""Mixed second derivatives ``A_i = d^2 l / d theta d x`` and ``S_min`` of ``K = sum_i s_i^2 A_i A_i^T``.

``S_min`` decides how much explicit noise Algorithm 1 may leave out, so it must never be overestimated:
every shortcut returns 0 (no noise saved), and the computed value is the float64 smallest eigenvalue minus
a rounding-error bound, clamped at 0.

Shortcuts, in order (none computes anything):
- ``empty``: no non-negative examples, K = 0.
- ``rank_bound``: w > n * v, so K (rank <= n * v) is singular.
- ``too_large``: w > ``max_dim``, K would not be formed; treated as 0 (full explicit noise), and reported.
Then K is formed in float64 chunk by chunk (A_i never all stored); a zero diagonal entry means a zero row
(K is positive semi-definite), so ``zero_row`` gives 0; otherwise ``eigvalsh``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import grad, jacfwd, jacrev, vmap

from training.privacy.dp import functional_example_loss, model_params

EPS64 = torch.finfo(torch.float64).eps
# The rounding bound: (m + w) * eps * trace(K) covers forming K as a sum of m = n*v products (Higham's gamma_m
# bound, ||E||_F <= gamma_m trace K) and the backward-stable eigensolver (~ w * eps * ||K||_2 <= w eps trace K);
# the factor below adds room for rounding in the float64 autodiff of A_i, which has no rigorous bound here.
ROUNDING_SAFETY = 16.0
DEFAULT_MAX_DIM = 4096
DEFAULT_CHUNK_SIZE = 8
METHODS = ("empty", "rank_bound", "too_large", "zero_row", "eigvalsh")


@dataclass(frozen=True)
class SminResult:
    """``value``: a lower bound on S_min(K) (0 for every shortcut). ``method`` names how it was obtained."""

    value: float
    method: str
    num_parameters: int
    num_examples: int
    input_dim: int
    smallest_eigenvalue: float | None = None  # raw float64 eigvalsh output, before the rounding bound
    rounding_bound: float | None = None


def mixed_derivative_fn(model: nn.Module, mode: str = "auto"):
    """Return ``f(params, buffers, x_batch) -> (n, w, v)``: A_i = d/dx grad_theta l(x; target x_i) at x = x_i.

    The target stays the clean x_i while the input varies (eq. 1 with z near x). ``mode``: ``fwd`` takes v
    forward-mode passes through the gradient, ``rev`` w reverse-mode passes; ``auto`` picks the fewer.
    """
    loss = functional_example_loss(model)

    def per_example(params, buffers, x):
        names = list(params)

        def grad_theta_flat(inp):
            g = grad(loss)(params, buffers, inp, x)
            return torch.cat([g[k].reshape(-1) for k in names])

        w = sum(p.numel() for p in params.values())
        chosen = mode if mode != "auto" else ("rev" if w < x.numel() else "fwd")
        jac = (jacrev if chosen == "rev" else jacfwd)(grad_theta_flat)(x)
        return jac.reshape(w, x.numel())

    return vmap(per_example, in_dims=(None, None, 0))


def mixed_derivatives(model: nn.Module, x: torch.Tensor, mode: str = "auto") -> torch.Tensor:
    """A_i for every row of ``x`` in float64, shape (n, w, v). For tests and small models."""
    params, buffers = model_params(model, torch.float64)
    return mixed_derivative_fn(model, mode)(params, buffers, x.to(torch.float64))


def mixed_derivative_gram(model: nn.Module, x: torch.Tensor, scales: torch.Tensor,
                          chunk_size: int = DEFAULT_CHUNK_SIZE, mode: str = "auto") -> torch.Tensor:
    """K = sum_i scales_i^2 A_i A_i^T (w x w, float64), accumulated ``chunk_size`` examples at a time."""
    params, buffers = model_params(model, torch.float64)
    w = sum(p.numel() for p in params.values())
    fn = mixed_derivative_fn(model, mode)
    gram = torch.zeros((w, w), dtype=torch.float64, device=x.device)
    x64, s64 = x.to(torch.float64), scales.to(device=x.device, dtype=torch.float64)
    for start in range(0, len(x64), chunk_size):
        a = fn(params, buffers, x64[start:start + chunk_size]) * s64[start:start + chunk_size].view(-1, 1, 1)
        flat = a.permute(1, 0, 2).reshape(w, -1)  # (w, chunk * v)
        gram.addmm_(flat, flat.T)
    return gram


def smallest_eigenvalue_lower_bound(gram: torch.Tensor, inner_dim: int) -> tuple[float, float, float]:
    """(lower bound clamped at 0, raw smallest eigenvalue, rounding bound) for a float64 PSD ``gram``
    that was formed as a sum of ``inner_dim`` outer-product terms per entry."""
    w = gram.shape[0]
    eigenvalues = torch.linalg.eigvalsh(gram)
    raw = float(eigenvalues[0])
    trace = float(torch.diagonal(gram).sum())
    bound = ROUNDING_SAFETY * (inner_dim + w) * EPS64 * trace
    return max(0.0, raw - bound), raw, bound


def smin_lower_bound(model: nn.Module, x_clean: torch.Tensor, scales: torch.Tensor,
                     max_dim: int = DEFAULT_MAX_DIM, chunk_size: int = DEFAULT_CHUNK_SIZE,
                     mode: str = "auto") -> SminResult:
    """S_min of K = sum_i scales_i^2 A_i A_i^T over the rows of ``x_clean`` (the non-negative cases)."""
    w = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n = int(x_clean.shape[0])
    v = int(math.prod(x_clean.shape[1:])) if x_clean.dim() > 1 else 0
    if n == 0:
        return SminResult(0.0, "empty", w, n, v)
    if w > n * v:
        return SminResult(0.0, "rank_bound", w, n, v)
    if w > max_dim:
        return SminResult(0.0, "too_large", w, n, v)
    gram = mixed_derivative_gram(model, x_clean, scales, chunk_size, mode)
    if bool((torch.diagonal(gram) == 0).any()):
        return SminResult(0.0, "zero_row", w, n, v)
    value, raw, bound = smallest_eigenvalue_lower_bound(gram, inner_dim=n * v)
    return SminResult(value, "eigvalsh", w, n, v, raw, bound)
