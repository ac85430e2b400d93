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

Here: the maths of both, and both inside the denoiser trainer (``train --arm sepdp --noise shaped|optimized``); the
stand-alone loops that compare them on a small classifier are in :mod:`training.privacy.shaped_noise_study`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from training.privacy.accounting import epsilon_report, gaussian_mechanism_delta
from transdenoiser.errors import UserError

Params = dict[str, torch.Tensor]


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


# ------------------------------------------------------------------------------------------- noise groups

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


# ------------------------------------------------------------------------------------------- in the denoiser trainer

NOISE_MODES = ("isotropic", "shaped", "optimized")
SHAPED_LABEL = ("DP-SGD with per-layer clipping budgets C_g (sum C_g^2 = C^2) and per-layer noise N(0, sigma_g^2 I) "
                "shaped from the PUBLIC split (--noise shaped): exactly the Poisson-subsampled Gaussian mechanism with "
                "noise multiplier z = xi_up, 1/z^2 = sum_g (C_g/sigma_g)^2 (docs/PRIVACY.md); data-independent")
OPTIMIZED_CLAIM = (
    "NO PRIVACY GUARANTEE. --noise optimized runs Xiang et al.'s Algorithm 1 as written, which claims "
    "({epsilon}, {delta})-DP by its Theorem 1 with Eqn. (12). The claim does NOT hold (docs/PRIVACY.md, "
    "'Optimized additive noise'): the per-coordinate noise shape is computed every step from the whole private "
    "split's unclipped gradient and revealed by the updates without being accounted for, and with L2 clipping "
    "the noise protects only as much as its smallest sigma_i, which the paper's solver drives below its own "
    "bound. No data-independent epsilon exists for this run; xi_up and xi_low are not used by it.")
OPTIMIZED_NONE_LABEL = ("data-independent guarantee: none (Xiang et al. Algorithm 1 as written; its claimed epsilon "
                        "does not hold)")
OPTIMIZED_IF_PUBLIC_LABEL = (
    "NOT a guarantee: the epsilon this run's noise would give if each step's noise shape had been fixed in advance "
    "from public data, with per-step multiplier B * min_i sigma_i / C (the worst direction, B the expected batch "
    "size); the shape was computed from the private split, so this figure only shows how far below the claim "
    "even that reading falls")


def check_noise_settings(config: Any, distributed: bool = False) -> None:
    """Refuse unsupported combinations of ``TrainConfig.noise`` with other settings (one line each)."""
    noise = getattr(config, "noise", "isotropic")
    if noise not in NOISE_MODES:
        raise UserError(f"noise must be one of {', '.join(NOISE_MODES)}, got {noise!r}")
    if not (isinstance(config.shape_examples, int) and not isinstance(config.shape_examples, bool)
            and config.shape_examples >= 2):
        raise UserError(f"shape_examples must be an integer >= 2, got {config.shape_examples!r}")
    if not isinstance(config.acknowledge_unsound, bool):
        raise UserError(f"acknowledge_unsound must be true or false, got {config.acknowledge_unsound!r}")
    if noise == "isotropic":
        return
    if config.arm != "sepdp":
        raise UserError(f"--noise {noise} is available for the sepdp arm only (it replaces DP-SGD's isotropic noise), "
                        f"got arm {config.arm!r}")
    if distributed:
        raise UserError(f"--noise {noise} runs in one process only; train it without torchrun")
    if noise == "optimized":
        if not config.acknowledge_unsound:
            raise UserError("--noise optimized is Xiang et al.'s Algorithm 1 as written, whose privacy claim does not "
                            "hold (docs/PRIVACY.md); it is refused unless --i-understand-unsound "
                            "(acknowledge_unsound = true) is given, and its model must not be released as private")
        if config.target_epsilon is None:
            raise UserError("--noise optimized needs --target-epsilon: the paper's Algorithm 1 derives its noise from "
                            "the claimed epsilon")


def public_shape_generator(seed: int, step: int) -> torch.Generator:
    """The generator that picks step ``step``'s public examples and their input noise: a function of the recorded
    seed and the step index only (public by design: it never touches the private data or the secret generator)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step) % (2 ** 63))


@dataclass
class GroupShape:
    """One step's per-group clip budgets C_g and noise stds sigma_g (units of the SUMMED gradient)."""

    budgets: dict[str, float]
    stds: dict[str, float]

    @property
    def noise_multiplier(self) -> float:
        return effective_noise_multiplier(self.budgets, self.stds)


def denoiser_group_shape(per_example: Any, x_public: torch.Tensor, input_sigma: float, clip_norm: float,
                         noise_multiplier: float, generator: torch.Generator) -> GroupShape:
    """C_g and sigma_g from PUBLIC images only: per-example gradients of the denoiser loss ||g(x + b) - x||^2
    (b ~ N(0, input_sigma^2 I) drawn on ``generator``) through ``per_example``
    (a ``training.privacy.dp.PerExampleGradients``);
    C_g proportional to group g's median per-example norm with sum C_g^2 = C^2 (:func:`group_clip_budgets`);
    s_g = sum_{i in g} |w_i| with w the public mean gradient; sigma_g by :func:`group_noise_stds` for multiplier z.
    The result satisfies sum_g (C_g / sigma_g)^2 <= 1/z^2 (rounding is pushed to the side of more noise)."""
    noise = torch.randn(x_public.shape, generator=generator, dtype=torch.float32).to(x_public.device)
    grads, _ = per_example(x_public + input_sigma * noise, x_public)
    norms = {k: float(g.detach().reshape(len(g), -1).norm(dim=1).median()) for k, g in grads.items()}
    budgets = group_clip_budgets(norms, clip_norm)
    sensitivities = {k: float(g.detach().mean(0).abs().sum()) for k, g in grads.items()}
    stds = group_noise_stds(budgets, sensitivities, noise_multiplier)
    excess = noise_multiplier / effective_noise_multiplier(budgets, stds)
    if excess > 1:  # float rounding only; never let the effective multiplier fall below z
        stds = {k: v * excess * (1 + 1e-12) for k, v in stds.items()}
    return GroupShape(budgets, stds)


class ShapedNoise:
    """--noise shaped: the sepdp arm's step with per-group clipping and public-shaped noise.

    Mechanism (one step, add-or-remove-one neighbours): every example's gradient is clipped per group g (one group
    per parameter tensor) to ||g_{i,g}|| <= C_g, the clipped gradients are summed, and group g of the sum gets
    N(0, sigma_g^2 I). (C_g, sigma_g) are a function of the public split, a recorded seed, the step index and the
    current parameters only (:func:`denoiser_group_shape`), never of the private batch.

    Claim: this step is the Gaussian mechanism with noise multiplier z, 1/z^2 = sum_g (C_g / sigma_g)^2, i.e. the
    sepdp step with multiplier z = xi_up, and its privacy is the accountant's for z.
    Proof: let W = diag(1/sigma_g on group g), fixed before the batch is read (adaptive composition lets it depend
    on the previous iterates, which are outputs of the earlier steps, and on public data). W is invertible, so
    releasing S + N or W(S + N) is the same up to post-processing in both directions and the two have the same
    privacy profile. W(S + N) = sum_i W g_i + N(0, I): each example adds v_i = W g_i, with
    ||v_i||^2 = sum_g ||g_{i,g}||^2 / sigma_g^2 <= sum_g C_g^2 / sigma_g^2 = 1/z^2, and adding or removing one
    example moves the sum by exactly one v_i. That is the Gaussian mechanism with L2 sensitivity 1/z and unit noise,
    whose privacy loss distribution (for every Poisson-subsampled step, since the subsampled-Gaussian analysis only
    uses the bound on a single example's contribution) is the one of sensitivity 1 and noise std z: multiplier z.
    Composition over the steps is then DP-SGD's, and the RDP/PLD accountant for (q, z, T) applies unchanged.
    With sum_g C_g^2 = C^2 each example's whole clipped gradient still has norm <= C.
    """

    def __init__(self, x_public: torch.Tensor, seed: int, start_step: int, shape_examples: int):
        if len(x_public) < 2:
            raise UserError("--noise shaped needs at least 2 public images to shape the noise")
        self.x_public = x_public
        self.seed = seed
        self.step = start_step
        self.shape_examples = min(shape_examples, len(x_public))
        self.last_shape: GroupShape | None = None

    def shape(self, arm: Any) -> GroupShape:
        generator = public_shape_generator(self.seed, self.step)
        pick = torch.randperm(len(self.x_public), generator=generator)[:self.shape_examples]
        return denoiser_group_shape(arm.per_example, self.x_public[pick.to(self.x_public.device)], arm.config.sigma,
                                    arm.config.clip_norm, arm.xi_up, generator)

    def gradient(self, arm: Any, x: torch.Tensor, generator: torch.Generator
                 ) -> tuple[dict[str, torch.Tensor], float, float]:
        """(update = (group-clipped sum + shaped noise) / B, effective multiplier z of the step, mean loss)."""
        shape = self.shape(arm)
        self.step += 1
        self.last_shape = shape
        if len(x):
            _, grads, losses, _ = arm.clipped(x, generator)
            summed = {k: g.sum(0) for k, g in clip_per_group(grads, shape.budgets).items()}
            mean_loss = float(losses.mean())
        else:
            summed, mean_loss = arm.zeros(), math.nan
        noisy = {k: v + shape.stds[k] * torch.randn(v.shape, generator=generator, dtype=torch.float32).to(v.device,
                                                                                                          v.dtype)
                 for k, v in summed.items()}
        return arm.finish(noisy), shape.noise_multiplier, mean_loss


class OptimizedNoise:
    """--noise optimized: Xiang et al.'s Algorithm 1 as written (lines 3-12) inside the sepdp arm. For the report
    of what the paper claims only: its claimed epsilon does not hold (see :data:`OPTIMIZED_CLAIM`).

    Line 3: w = (1/N) grad of the denoiser loss over the WHOLE private split (input noise drawn on the secret
    generator); line 4: sigma_1..sigma_d by the paper's Eqn. (11) solver (:func:`paper_eqn11_sigmas`) for
    tau(eps_t, delta_t) of Eqn. (12) at the claimed epsilon; lines 7-10: L2 clipping at C = alpha; lines 11-12: the
    average plus N(0, diag sigma^2), i.e. the clipped sum plus B sigma_i-std noise divided by the expected batch
    size B (the trainer's convention for every arm)."""

    def __init__(self, x_private: torch.Tensor, epsilon: float, delta: float, sample_rate: float, steps: int,
                 clip_norm: float, start_step: int):
        self.x_private = x_private
        self.eps_t, self.delta_t = paper_per_step_budget(epsilon, delta, sample_rate, steps)
        self.order = default_moment_order(self.eps_t, self.delta_t)
        self.tau = paper_tau(self.eps_t, self.delta_t, self.order)
        self.bound = clip_norm / math.sqrt(self.tau)
        self.step = start_step

    def private_mean_gradient(self, arm: Any, generator: torch.Generator) -> torch.Tensor:
        params = [p for p in arm.model.parameters() if p.requires_grad]
        total = [torch.zeros_like(p) for p in params]
        for start in range(0, len(self.x_private), 500):
            x = self.x_private[start:start + 500]
            loss = (arm.model(arm.noisy(x, generator)) - x).pow(2).flatten(1).sum(1).sum() / len(self.x_private)
            for t, g in zip(total, torch.autograd.grad(loss, params), strict=True):
                t += g
        return torch.cat([t.reshape(-1) for t in total])

    def gradient(self, arm: Any, x: torch.Tensor, generator: torch.Generator
                 ) -> tuple[dict[str, torch.Tensor], float, float]:
        """(update, per-step worst-direction multiplier B min_i sigma_i / C, mean loss)."""
        w = self.private_mean_gradient(arm, generator).double().cpu().numpy()      # line 3: PRIVATE data
        sigmas = paper_eqn11_sigmas(w, arm.config.clip_norm, self.tau, seed=self.step)  # line 4
        self.step += 1
        if len(x):
            _, grads, losses, factors = arm.clipped(x, generator)
            summed = arm.clipper.weighted_sum(grads, factors)
            mean_loss = float(losses.mean())
        else:
            summed, mean_loss = arm.zeros(), math.nan
        std = torch.from_numpy(sigmas * arm.expected_batch).float()
        noise = std * torch.randn(len(std), generator=generator, dtype=torch.float32)
        out, offset = {}, 0
        for k, v in summed.items():
            out[k] = v + noise[offset:offset + v.numel()].view_as(v).to(v.device, v.dtype)
            offset += v.numel()
        return arm.finish(out), float(arm.expected_batch * sigmas.min() / arm.config.clip_norm), mean_loss


def attach_noise_shaper(arm: Any, config: Any, dataset: Any, x_private: torch.Tensor, start_step: int) -> None:
    """Give the sepdp ``arm`` its ``shaper`` for ``config.noise`` (nothing for isotropic noise)."""
    noise = getattr(config, "noise", "isotropic")
    if noise == "isotropic":
        return
    check_noise_settings(config, distributed=arm.group.distributed)
    from training.privacy.dp import GaussianNoise

    if type(getattr(arm, "noise", None)) is not GaussianNoise:
        # e.g. the white-box privacy audit's canaries ride on the arm's isotropic noise, which the shaper bypasses
        raise UserError(f"--noise {noise} draws its own noise: it cannot run with a replaced noise component "
                        f"({type(getattr(arm, 'noise', None)).__name__}); audit it with --mode blackbox")
    if noise == "shaped":
        # the public split; data without one (the Python API's in-memory data) shape from the test split, which is
        # public too (released metrics are computed on it)
        source = dataset.public if len(dataset.public) >= 2 else dataset.test
        x_public, _ = source.tensors(x_private.device)
        arm.shaper = ShapedNoise(x_public, config.seed, start_step, config.shape_examples)
    else:
        arm.shaper = OptimizedNoise(x_private, config.target_epsilon, config.delta,
                                    config.batch_size / len(x_private), arm.total_steps, config.clip_norm, start_step)


def noise_report(report: dict[str, Any], config: Any, multipliers: list[float]) -> dict[str, Any]:
    """The full privacy report of a run with ``config.noise`` shaped or optimized, from the sepdp report
    ``report`` and the per-step multipliers recorded (shaped: effective z; optimized: B min_i sigma_i / C)."""
    noise = getattr(config, "noise", "isotropic")
    if noise == "isotropic" or config.arm != "sepdp" or not report.get("guarantees"):
        return report
    report = dict(report)
    report["gradient_noise"] = noise
    if noise == "shaped":
        guarantees = []
        for g in report["guarantees"]:
            if g.get("name") == "sepdp":
                lowest = min(multipliers) if multipliers else math.inf
                if lowest < g["noise_multiplier"] * (1 - 1e-9):  # cannot happen: the shape is rescaled to >= z
                    raise RuntimeError(f"a shaped step's effective multiplier {lowest} fell below z "
                                       f"{g['noise_multiplier']}")
                g = {**g, "label": SHAPED_LABEL, "gradient_noise": "shaped",
                     "equivalence": "1/z^2 = sum_g (C_g/sigma_g)^2 in every step (whitening by 1/sigma_g)",
                     "shape_from": ("public split (the test split for data without one, e.g. the Python API's "
                                    "in-memory data), recorded seed, step index and the current parameters")}
            guarantees.append(g)
        report["guarantees"] = guarantees
        report["privacy_claim"] = ("a data-independent (epsilon, delta)-DP guarantee for the released denoiser "
                                   "(per-layer clipping, noise shaped from public data):")
        return report
    report["privacy_claim"] = OPTIMIZED_CLAIM.format(epsilon=config.target_epsilon, delta=config.delta)
    report["guarantees"] = [
        {"name": "data_independent", "label": OPTIMIZED_NONE_LABEL, "data_independent": True,
         "epsilon": {"rdp": "inf", "pld": "inf", "gdp_mu": "inf", "gdp_epsilon": "inf", "delta": config.delta,
                     "analyses": {}}},
        {"name": "optimized_if_shape_were_public", "label": OPTIMIZED_IF_PUBLIC_LABEL, "data_independent": False,
         "epsilon": epsilon_report(report["sample_rate"], list(multipliers), len(multipliers), config.delta)},
    ]
    report["claimed_epsilon"] = config.target_epsilon
    return report


def released_noise_report(released: dict[str, Any], full: dict[str, Any], config: Any) -> dict[str, Any]:
    """The released report of a shaped / optimized run: the sepdp filter of
    ``training.privacy.report.released_privacy_report`` keeps the shaped guarantee; for an optimized run it
    would drop everything, so the explicit "none" entry and the claimed epsilon are put back."""
    noise = getattr(config, "noise", "isotropic")
    if noise == "isotropic" or config.arm != "sepdp":
        return released
    released = {**released, "gradient_noise": noise}
    if noise == "optimized":
        released["guarantees"] = [g for g in full.get("guarantees", []) if g.get("name") == "data_independent"]
        released["claimed_epsilon"] = full.get("claimed_epsilon")
    return released
