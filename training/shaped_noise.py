"""Xiang et al.'s optimized additive noise (their Algorithm 1), as written, and the closest sound variant.

Paper (``PaperOptimizedNoise``): at every step t, w = (1/n) dC(X, Y)/dtheta on the WHOLE private training set;
per-coordinate sigma_1..sigma_d from Eqn. (8)/(11) (minimise sum |w_i| sigma_i subject to
sum Delta_i^2 / sigma_i^2 <= tau for all ||Delta|| <= alpha, tau = 2 eps_t + (2/lambda) ln delta_t); a Poisson batch,
per-example L2 clipping at alpha, the batch average plus N(0, diag(sigma^2)); (eps_t, delta_t) from Eqn. (12).
Kept only to report what the paper claims next to what holds; docs/PRIVACY.md ("Optimized additive noise")
explains why the claim does not hold: the noise shape is a function of the private data that is released
(through the update) and accounted nowhere, and with L2 clipping the privacy of an anisotropic Gaussian is that of
an isotropic one with its SMALLEST sigma_i, which the paper's approximate solver pushes below its own bound.

Sound variant (``ShapedNoiseDPSGD``): groups g (one per parameter tensor: per layer weight and bias); from PUBLIC
data only (the public split) and the current parameters: group sensitivities s_g = sum_{i in g} |w_i| (w the public
gradient) and clip budgets C_g proportional to the groups' median public per-example gradient norms, scaled so
sum_g C_g^2 = C^2. Each example's gradient is clipped PER GROUP to C_g, and the summed group g gets
N(0, sigma_g^2 I). Whitening group g by 1/sigma_g is invertible post-processing and turns the release into one
Gaussian mechanism with unit noise and L2 sensitivity sqrt(sum_g C_g^2 / sigma_g^2); so it is exactly DP-SGD with
noise multiplier z, 1/z^2 = sum_g (C_g / sigma_g)^2, and our accountant applies unchanged. Given z, the sigma_g
minimising Xiang et al.'s objective sum_g s_g sigma_g subject to that constraint are
sigma_g = kappa (C_g^2 / s_g)^(1/3), kappa = z sqrt(sum_g (C_g s_g)^(2/3)) (Lagrange conditions).
With one group this is plain DP-SGD.
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

from training.accounting import epsilon_report, gaussian_mechanism_delta
from training.dp import PerExampleClipper, PoissonSampler
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent

Params = dict[str, torch.Tensor]


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


# ------------------------------------------------------------------------------------------- the paper's pieces

def paper_per_step_budget(epsilon: float, delta: float, sample_rate: float, iterations: int) -> tuple[float, float]:
    """Xiang et al. Eqn. (12): eps_t = eps / sqrt(16 q^2 k log(e + eps/delta)), delta_t = delta / (2k)."""
    eps_t = epsilon / math.sqrt(16 * sample_rate ** 2 * iterations * math.log(math.e + epsilon / delta))
    return eps_t, delta / (2 * iterations)


def paper_tau(epsilon: float, delta: float, moment_order: float) -> float:
    """tau(eps, delta) = 2 eps + (2 / lambda) ln delta (Eqn. 10b; lambda a positive integer moment order)."""
    return 2 * epsilon + 2 / moment_order * math.log(delta)


def default_moment_order(epsilon: float, delta: float) -> int:
    """The paper leaves lambda free ("any positive integer"); this one gives tau = 1.5 eps."""
    return math.ceil(4 * math.log(1 / delta) / epsilon)


def exact_eqn10_sigmas(w: np.ndarray, alpha: float, tau: float) -> np.ndarray:
    """The exact solution of Eqn. (10): max_{||Delta|| <= alpha} sum Delta_i^2/sigma_i^2 = alpha^2 / min_i sigma_i^2,
    so the constraint is sigma_i >= alpha / sqrt(tau) for EVERY i, and sum |w_i| sigma_i is smallest at equality:
    the optimum is isotropic, whatever w is."""
    if not tau > 0:
        raise UserError(f"tau must be > 0 (raise the moment order lambda), got {tau}")
    return np.full(len(w), alpha / math.sqrt(tau))


def paper_eqn11_sigmas(w: np.ndarray, alpha: float, tau: float, iterations: int = 50, steepness: float = 20.0,
                       penalty: float = 1.0, penalty_growth: float = 1.2, learning_rate: float = 0.05,
                       seed: int = 0) -> np.ndarray:
    """The paper's solver of Eqn. (11) as described in its Sec. IV-C/V-A: the step function replaced by a
    sigmoid, Delta (projected onto ||Delta|| = alpha) and sigma updated alternately by projected gradient
    ascent/descent for about 50 iterations while the penalty weight mu grows. Starts from the feasible
    isotropic point alpha/sqrt(tau). Returns sigma (>= 1e-6 alpha). Not an exact solver: see
    :func:`exact_eqn10_sigmas`."""
    rng = np.random.default_rng(seed)
    weights = np.abs(np.asarray(w, dtype=np.float64))
    scale = weights.mean() if weights.mean() > 0 else 1.0
    weights = weights / scale
    sigma = np.full(len(weights), alpha / math.sqrt(tau))
    delta = rng.normal(size=len(weights))
    delta *= alpha / np.linalg.norm(delta)
    mu = penalty
    for _ in range(iterations):
        ratio = np.sum(delta ** 2 / sigma ** 2) - tau
        s = 1 / (1 + math.exp(-max(min(steepness * ratio, 50.0), -50.0)))
        ds = steepness * s * (1 - s)
        # ascent in Delta, projected back onto the sphere ||Delta|| = alpha
        delta = delta + learning_rate * mu * ds * 2 * delta / sigma ** 2
        delta *= alpha / np.linalg.norm(delta)
        ratio = np.sum(delta ** 2 / sigma ** 2) - tau
        s = 1 / (1 + math.exp(-max(min(steepness * ratio, 50.0), -50.0)))
        ds = steepness * s * (1 - s)
        # descent in sigma, projected onto sigma > 0
        gradient = weights - mu * ds * 2 * delta ** 2 / sigma ** 3
        sigma = np.maximum(sigma - learning_rate * gradient * sigma, 1e-6 * alpha)
        mu *= penalty_growth
    return sigma


def worst_case_delta(epsilon: float, sigmas: np.ndarray, alpha: float) -> float:
    """Exact delta(eps) of z ~ N(0, diag(sigma^2)) for the worst difference of L2 norm alpha: the Gaussian mechanism
    with std min_i sigma_i (the difference along that coordinate maximises ||diag(1/sigma) Delta||)."""
    return gaussian_mechanism_delta(epsilon, float(np.min(sigmas)), alpha)


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


def group_clip_budgets(group_norms: dict[str, float], clip_norm: float) -> dict[str, float]:
    """C_g proportional to ``group_norms`` (public), scaled so that sum_g C_g^2 = C^2."""
    values = {k: max(v, 1e-12) for k, v in group_norms.items()}
    scale = clip_norm / math.sqrt(sum(v * v for v in values.values()))
    return {k: v * scale for k, v in values.items()}


def group_noise_stds(budgets: dict[str, float], sensitivities: dict[str, float],
                     noise_multiplier: float) -> dict[str, float]:
    """sigma_g minimising sum_g s_g sigma_g subject to sum_g (C_g / sigma_g)^2 = 1 / z^2."""
    s = {k: max(sensitivities[k], 1e-12) for k in budgets}
    kappa = noise_multiplier * math.sqrt(sum((budgets[k] * s[k]) ** (2 / 3) for k in budgets))
    return {k: kappa * (budgets[k] ** 2 / s[k]) ** (1 / 3) for k in budgets}


def effective_noise_multiplier(budgets: dict[str, float], stds: dict[str, float]) -> float:
    """z with 1/z^2 = sum_g (C_g / sigma_g)^2: the noise multiplier of the equivalent single Gaussian mechanism."""
    return 1 / math.sqrt(sum((budgets[k] / stds[k]) ** 2 for k in budgets))


def clip_per_group(grads: Params, budgets: dict[str, float]) -> Params:
    """Each example's group-g gradient scaled to L2 norm <= C_g."""
    out = {}
    for name, g in grads.items():
        norms = g.reshape(len(g), -1).norm(dim=1)
        factors = (budgets[name] / (norms + 1e-12)).clamp(max=1.0)
        out[name] = g * factors.view(-1, *([1] * (g.dim() - 1)))
    return out


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
