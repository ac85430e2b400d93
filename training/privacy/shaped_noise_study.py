"""Two stand-alone DP-SGD loops on a small classifier that compare noise shapes (``scripts/shaped_noise_compare.py``):
Xiang et al.'s Algorithm 1 as written (:func:`paper_optimized_noise`, kept to report what the paper claims next to
what holds) and the sound per-group shaped-noise DP-SGD (:func:`shaped_noise_dpsgd`).

The maths of both (the paper's Eqn. (10)-(12), the groups' clip budgets and noise stds) and the shaped noise inside
the denoiser trainer are in :mod:`training.privacy.shaped_noise`, whose docstring states the analyses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from training.privacy.accounting import epsilon_report
from training.privacy.dp import PerExampleClipper, PoissonSampler
from training.privacy.shaped_noise import (
    Params,
    clip_per_group,
    default_moment_order,
    effective_noise_multiplier,
    group_clip_budgets,
    group_noise_stds,
    paper_eqn11_sigmas,
    paper_per_step_budget,
    paper_tau,
    worst_case_delta,
)
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent

# ------------------------------------------------------------------------------------------- gradients

def _params(model: nn.Module) -> Params:
    return {k: v.detach() for k, v in model.named_parameters()}


def per_example_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Params:
    """Cross-entropy gradient of every example, {name: (n, *shape)} (torch.func vmap over grad)."""
    def loss(params, xi, yi):
        return F.cross_entropy(functional_call(model, params, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    return vmap(grad(loss), in_dims=(None, 0, 0))(_params(model), x, y)


def mean_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Params:
    """(1/n) dC/dtheta over all of ``x`` (the paper's "model sensitivity" w when x is the private set)."""
    params = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    loss = F.cross_entropy(functional_call(model, params, (x,)), y)
    grads = torch.autograd.grad(loss, list(params.values()))
    return {k: g.detach() for k, g in zip(params, grads, strict=True)}


def flatten(tensors: Params) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors.values()])


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).double().mean())


# ------------------------------------------------------------------------------------------- training loops

@dataclass
class NoiseRun:
    """A finished run: test accuracy, the privacy report and per-step traces."""

    test_accuracy: float
    privacy: dict[str, Any]
    trace: dict[str, list] = field(default_factory=dict)


def _check_common(sample_rate: float, steps: int, clip_norm: float) -> None:
    if not 0 < sample_rate <= 1:
        raise UserError(f"sample rate must lie in (0, 1], got {sample_rate}")
    if steps < 1:
        raise UserError(f"steps must be >= 1, got {steps}")
    if not clip_norm > 0:
        raise UserError(f"clip norm must be > 0, got {clip_norm}")


def paper_optimized_noise(model: nn.Module, x_private: torch.Tensor, y_private: torch.Tensor, x_test: torch.Tensor,
                          y_test: torch.Tensor, *, epsilon: float, delta: float, sample_rate: float, steps: int,
                          clip_norm: float, learning_rate: float, seed: int = 0, moment_order: int | None = None,
                          track: Track = silent) -> NoiseRun:
    """Xiang et al. Algorithm 1, literally (lines 1-15), on ``model`` with cross-entropy. For the report only."""
    _check_common(sample_rate, steps, clip_norm)
    n = len(x_private)
    eps_t, delta_t = paper_per_step_budget(epsilon, delta, sample_rate, steps)
    order = moment_order or default_moment_order(eps_t, delta_t)
    tau = paper_tau(eps_t, delta_t, order)
    bound = clip_norm / math.sqrt(tau)
    generator = torch.Generator().manual_seed(seed)
    sampler = PoissonSampler(n, sample_rate)
    clipper = PerExampleClipper(clip_norm)
    trace: dict[str, list] = {"min_sigma": [], "mean_sigma": [], "batch_size": []}
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    for _ in track(range(steps), desc="Xiang et al. Algorithm 1", total=steps):
        w = flatten(mean_gradient(model, x_private, y_private)).double().numpy()  # line 3: PRIVATE data, all of it
        sigmas = paper_eqn11_sigmas(w, clip_norm, tau)                            # line 4
        noise = torch.from_numpy(sigmas).float() * torch.randn(len(sigmas), generator=generator)  # line 5
        batch = sampler.sample(generator)                                         # line 6
        if len(batch) == 0:
            continue
        grads = per_example_gradients(model, x_private[batch], y_private[batch])  # lines 7-10
        norms = torch.stack([g.reshape(len(batch), -1).pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()
        summed = flatten(clipper.weighted_sum(grads, clipper.factors(norms)))
        update = summed / len(batch) + noise                                      # lines 11-12
        optimizer.zero_grad(set_to_none=True)
        offset = 0
        for p in model.parameters():
            p.grad = update[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        optimizer.step()                                                          # line 13
        trace["min_sigma"].append(float(sigmas.min()))
        trace["mean_sigma"].append(float(sigmas.mean()))
        trace["batch_size"].append(len(batch))
    expected_batch = sample_rate * n
    multipliers = [expected_batch * s / clip_norm for s in trace["min_sigma"]] or [math.inf]
    public_shape = epsilon_report(sample_rate, multipliers, len(multipliers), delta)
    min_sigma = min(trace["min_sigma"]) if trace["min_sigma"] else math.inf
    privacy = {
        "mechanism": "Xiang et al. Algorithm 1 (optimized additive noise), as written",
        "claimed_epsilon": epsilon, "delta": delta,
        "claim": "Theorem 1 with Eqn. (12); does NOT hold (docs/PRIVACY.md)",
        "data_independent_epsilon": None,
        "data_independent_note": ("none: sigma_1..sigma_d are computed from the full private gradient (line 3) and "
                                  "the update reveals them; no analysis accounts for that release"),
        "per_step_epsilon": eps_t, "per_step_delta": delta_t, "moment_order": order, "tau": tau,
        "eqn10_bound_on_every_sigma": bound, "smallest_sigma": min_sigma,
        "smallest_sigma_over_bound": min_sigma / bound,
        "per_step_delta_at_eps_t_worst_direction": worst_case_delta(eps_t, np.array([min_sigma]), clip_norm),
        "per_step_delta_at_eps_t_worst_direction_note": (
            "exact Gaussian delta of the per-step release for a batch-average difference of norm alpha (the paper's "
            "sensitivity) along the smallest sigma"),
        "epsilon_if_shape_were_public": {
            "rdp": public_shape["rdp"], "pld": public_shape["pld"],
            "note": ("NOT a guarantee: ignores the private data in the noise shape and replaces each realised batch "
                     "size by its expectation qn; per-step multiplier qn min_i sigma_i / alpha")},
    }
    return NoiseRun(accuracy(model, x_test, y_test), privacy, trace)


def shaped_noise_dpsgd(model: nn.Module, x_private: torch.Tensor, y_private: torch.Tensor, x_public: torch.Tensor,
                       y_public: torch.Tensor, x_test: torch.Tensor, y_test: torch.Tensor, *, noise_multiplier: float,
                       sample_rate: float, steps: int, clip_norm: float, learning_rate: float, delta: float,
                       shaped: bool = True, public_sample: int = 512, seed: int = 0,
                       track: Track = silent) -> NoiseRun:
    """DP-SGD with per-group clipping and noise shaped from PUBLIC data (``shaped=False``: plain DP-SGD, one group,
    clipping C and noise z C). The epsilon is the accountant's for ``noise_multiplier`` z either way."""
    _check_common(sample_rate, steps, clip_norm)
    n = len(x_private)
    generator = torch.Generator().manual_seed(seed)
    sampler = PoissonSampler(n, sample_rate)
    expected_batch = sample_rate * n
    names = [k for k, _ in model.named_parameters()]
    trace: dict[str, list] = {"effective_multiplier": [], "budgets": [], "stds": []}
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    for _ in track(range(steps), desc="shaped DP-SGD" if shaped else "DP-SGD", total=steps):
        if shaped:
            pick = torch.randperm(len(x_public), generator=generator)[:public_sample]
            public_grads = per_example_gradients(model, x_public[pick], y_public[pick])
            group_norms = {k: float(g.reshape(len(g), -1).norm(dim=1).median()) for k, g in public_grads.items()}
            budgets = group_clip_budgets(group_norms, clip_norm)
            sensitivities = {k: float(g.mean(0).abs().sum()) for k, g in public_grads.items()}
            stds = group_noise_stds(budgets, sensitivities, noise_multiplier)
        batch = sampler.sample(generator)
        update: Params = {}
        if len(batch):
            grads = per_example_gradients(model, x_private[batch], y_private[batch])
            if shaped:
                clipped = clip_per_group(grads, budgets)
                summed = {k: g.sum(0) for k, g in clipped.items()}
            else:
                norms = torch.stack([g.reshape(len(batch), -1).pow(2).sum(1) for g in grads.values()]).sum(0).sqrt()
                clipper = PerExampleClipper(clip_norm)
                summed = clipper.weighted_sum(grads, clipper.factors(norms))
        else:
            summed = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
        for name in names:
            std = stds[name] if shaped else noise_multiplier * clip_norm
            noise = std * torch.randn(summed[name].shape, generator=generator)
            update[name] = (summed[name] + noise) / expected_batch
        optimizer.zero_grad(set_to_none=True)
        for name, p in model.named_parameters():
            p.grad = update[name]
        optimizer.step()
        if shaped:
            trace["effective_multiplier"].append(effective_noise_multiplier(budgets, stds))
            trace["budgets"].append(budgets)
            trace["stds"].append(stds)
    report = epsilon_report(sample_rate, noise_multiplier, steps, delta)
    privacy = {
        "mechanism": ("DP-SGD with per-group clipping and noise shaped from public data" if shaped
                      else "DP-SGD (one group)"),
        "epsilon": {"rdp": report["rdp"], "pld": report["pld"]}, "delta": delta, "data_independent": True,
        "neighbouring": "add-or-remove-one", "noise_multiplier": noise_multiplier, "sample_rate": sample_rate,
        "steps": steps, "clip_norm": clip_norm, "analyses": {k: report["analyses"][k] for k in ("rdp", "pld")},
        "equivalence": ("per-group clipping C_g with noise sigma_g is the Gaussian mechanism with multiplier z, "
                        "1/z^2 = sum_g (C_g/sigma_g)^2 (whitening each group is invertible post-processing)"),
        "shape_from": "public split and the current (already released) parameters" if shaped else None,
    }
    return NoiseRun(accuracy(model, x_test, y_test), privacy, trace)
