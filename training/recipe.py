"""A tuned DP training recipe at a fixed epsilon (issue 14, item 4): parameter averaging, no batch statistics,
and batch sizes planned for a target epsilon.

- :class:`ParameterAverage`: an exponential moving average (EMA) of the weights after every optimiser step
  (De et al. 2022 use it for DP-SGD). It is computed from the released-by-construction noisy iterates only,
  so it is post-processing: it costs no privacy. With ``warmup`` the decay of update t (t = 0, 1, ...) is
  ``min(decay, (1 + t) / (10 + t))``, so early averages are not dominated by the random initialisation.
- :func:`refuse_batch_norm`: BatchNorm normalises each example by statistics of the whole batch, so one
  example's gradient depends on the others and per-example clipping no longer bounds any example's
  influence; its running statistics are moreover an un-noised function of the private batches. The DP arms
  refuse such a model; the denoisers offer GroupNorm (per example, no running statistics) instead, and
  :func:`batch_norm_to_group_norm` converts a model.
- :func:`plan_batch_sizes` / :func:`choose_batch_size`: for a target epsilon and an epoch budget, the noise
  multiplier of each candidate batch size by the accountant, and the noise it leaves on the *mean* clipped
  gradient (multiplier / B, in units of C). Sander et al. (2023, "TAN without a burn") observe that at a
  fixed number of steps T, runs with the same multiplier / B train alike; at a fixed epoch budget that
  quantity falls like 1/sqrt(B), so the largest batch that still leaves ``min_steps`` steps is chosen.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
from torch import nn

from transdenoiser.errors import UserError

EMA_WARMUP_OFFSET = 10  # warm-up decay of update t: min(decay, (1 + t) / (EMA_WARMUP_OFFSET + t))
LIVE_PREFIX = "live."  # the optimiser's own (not averaged) weights in the private training state
EMA_UPDATES_KEY = "ema.updates"


def ema_decay_at(decay: float, updates_done: int, warmup: bool = True) -> float:
    """The decay used by update number ``updates_done`` (0-based)."""
    if not warmup:
        return decay
    return min(decay, (1 + updates_done) / (EMA_WARMUP_OFFSET + updates_done))


class ParameterAverage:
    """An exponential moving average of a model's parameters, held in a copy of the model (``self.model``).

    ``update(model)`` after each optimiser step: avg <- d avg + (1 - d) w, with d = :func:`ema_decay_at`.
    Buffers (none in the denoisers) are copied from the live model. The averaged copy is what a training
    run evaluates and releases; the live weights continue the optimisation.
    """

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True):
        if not 0 < decay < 1:
            raise UserError(f"EMA decay must lie in (0, 1), got {decay}")
        self.decay = float(decay)
        self.warmup = warmup
        self.updates = 0
        self.model = copy.deepcopy(model)
        for p in self.model.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        d = ema_decay_at(self.decay, self.updates, self.warmup)
        live = dict(model.named_parameters())
        for name, avg in self.model.named_parameters():
            avg.mul_(d).add_(live[name].detach(), alpha=1 - d)
        live_buffers = dict(model.named_buffers())
        for name, buf in self.model.named_buffers():
            buf.copy_(live_buffers[name])
        self.updates += 1

    def state_tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """What a resume needs beyond the released (averaged) weights: the live weights and the update count."""
        out = {f"{LIVE_PREFIX}{k}": v.detach().clone() for k, v in model.state_dict().items()}
        out[EMA_UPDATES_KEY] = torch.tensor(self.updates, dtype=torch.int64)
        return out

    def restore(self, model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """Resume: ``model`` holds the saved (averaged) weights on entry; afterwards the average holds them and
        ``model`` the live weights from ``tensors``."""
        if EMA_UPDATES_KEY not in tensors:
            raise UserError("--resume: the saved run has no parameter-average state (was it trained without --ema?)")
        self.model.load_state_dict(model.state_dict())
        live = {k[len(LIVE_PREFIX):]: v for k, v in tensors.items() if k.startswith(LIVE_PREFIX)}
        model.load_state_dict(live)
        self.updates = int(tensors[EMA_UPDATES_KEY])


def refuse_batch_norm(model: nn.Module, arm: str) -> None:
    """The DP arms need every per-example gradient to depend on its example alone: refuse BatchNorm."""
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise UserError(f"arm {arm}: the denoiser has BatchNorm ({name or 'the model'}: "
                            f"{type(module).__name__}), which mixes the examples of a batch and voids per-example "
                            "clipping (and its running statistics are un-noised); use GroupNorm (--norm group) or "
                            "no normalisation (--norm none)")


def batch_norm_to_group_norm(model: nn.Module, groups: int = 8) -> nn.Module:
    """Replace every BatchNorm layer of ``model`` (in place) by GroupNorm over the same channels (Opacus's
    fix): ``min(groups, channels)`` groups, reduced until it divides the channel count."""
    for name, module in list(model.named_children()):
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            channels = module.num_features
            g = min(groups, channels)
            while channels % g:
                g -= 1
            setattr(model, name, nn.GroupNorm(g, channels, affine=module.affine))
        else:
            batch_norm_to_group_norm(module, groups)
    return model


# ------------------------------------------------------------------------------------------------ planner

@dataclass(frozen=True)
class BatchPlan:
    batch_size: int
    sample_rate: float  # q = B / N
    steps: int  # T for the epoch budget (the training loop's rule)
    noise_multiplier: float  # calibrated to the target epsilon by the accountant
    mean_noise: float  # noise std on the mean clipped gradient, in units of C: noise_multiplier / B
    epsilon: float  # the accountant's epsilon at these settings (<= the target)

    def as_dict(self) -> dict:
        return asdict(self)


def candidate_batch_sizes(num_examples: int, smallest: int = 64) -> list[int]:
    """Powers of two from ``smallest`` up to N."""
    out, b = [], smallest
    while b <= num_examples:
        out.append(b)
        b *= 2
    return out or [num_examples]


def plan_batch_sizes(target_epsilon: float, delta: float, num_examples: int, epochs: int, *,
                     batch_sizes: list[int] | None = None, accountant: str = "rdp") -> list[BatchPlan]:
    """For each candidate batch size: steps, the calibrated noise multiplier and its epsilon (same accountant)."""
    from training.privacy.accounting import epsilon_for_accountant, noise_multiplier_for_epsilon, steps_for_epochs

    if num_examples < 1:
        raise UserError("the private training set is empty")
    plans = []
    for b in batch_sizes or candidate_batch_sizes(num_examples):
        if not 1 <= b <= num_examples:
            raise UserError(f"batch size {b} lies outside [1, N = {num_examples}]")
        q = b / num_examples
        steps = steps_for_epochs(epochs, q)
        z = noise_multiplier_for_epsilon(target_epsilon, q, steps, delta, accountant=accountant)
        plans.append(BatchPlan(b, q, steps, z, z / b, epsilon_for_accountant(accountant, q, z, steps, delta)))
    return plans


def choose_batch_size(plans: list[BatchPlan], min_steps: int) -> BatchPlan:
    """The largest batch that leaves at least ``min_steps`` steps (the smallest candidate if none does)."""
    if not plans:
        raise UserError("no batch size to choose from")
    enough = [p for p in plans if p.steps >= min_steps]
    return max(enough, key=lambda p: p.batch_size) if enough else min(plans, key=lambda p: p.batch_size)


def format_plan(plans: list[BatchPlan], chosen: BatchPlan, target_epsilon: float, delta: float, accountant: str,
                epochs: int, min_steps: int) -> str:
    lines = [f"batch sizes for target epsilon {target_epsilon:g} at delta {delta:g} ({accountant} accountant), "
             f"{epochs} epochs, at least {min_steps} steps:",
             f"{'B':>7} {'q':>9} {'steps':>7} {'xi':>8} {'xi/B':>10} {'epsilon':>8}"]
    for p in plans:
        mark = "  <- chosen" if p == chosen else ""
        lines.append(f"{p.batch_size:>7} {p.sample_rate:>9.5f} {p.steps:>7} {p.noise_multiplier:>8.3f} "
                     f"{p.mean_noise:>10.3e} {p.epsilon:>8.4f}{mark}")
    lines.append("xi/B: noise std on the mean clipped gradient in units of C (Sander et al. 2023: at fixed steps, "
                 "equal xi/B trains alike); the largest batch with enough steps is chosen")
    return "\n".join(lines)

