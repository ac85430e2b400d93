"""Train the denoiser g in front of the frozen classifier h on the ``private`` split: three arms.

- ``nodp``: input perturbation only (z = x + N(0, sigma^2 I)), ordinary shuffled minibatches, no privacy claim.
- ``sepdp``: DP-SGD (Abadi et al. 2016): Poisson sampling at q = B/N, per-example clipping at C, noise
  N(0, (xi_up C)^2 I) on the summed clipped gradient.
- ``transdenoiser``: Algorithm 1 of the TransDenoiser paper, line by line, with the unit mapping of
  docs/PRIVACY.md: K_t = sum_{non-negative} s_i^2 A_i A_i^T, m_t = sigma sqrt(T S_min(K_t)) / C, sigma_bar by
  line 16 in noise-multiplier units.

The update is (clipped sum + noise) / B with B = q N the expected batch size, fed to SGD or Adam (DP-Adam:
Adam on the privatised gradient is post-processing). A checkpoint is written every epoch; ``resume``
continues bit-for-bit (weights, optimiser state, the CPU generator that draws every random number, and the
per-step privacy history), so an interruption never loses or double-counts privacy spending.
"""
from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from training.checkpoint import (
    WEIGHTS,
    Checkpoint,
    load_checkpoint,
    load_tensors,
    read_metadata,
    recover_interrupted_save,
    replace_directory,
    save_checkpoint,
    save_tensors,
    write_json,
    write_text,
)
from training.datasets import Dataset
from training.denoisers import ACTIVATIONS, DENOISERS, check_denoiser_fits, denoiser_kwargs
from training.distributed import RankGroup
from training.models import build_model, count_parameters
from training.privacy.clipping import (
    CLIPPING_MODES,
    ClippedGradients,
    ClippedSums,
    device_chunk_size,
    plan_execution,
    plan_for_arm,
)
from training.privacy.dp import (
    GaussianNoise,
    PerExampleClipper,
    PerExampleGradients,
    PoissonSampler,
    per_example_norms,
)
from training.privacy.report import (
    NOT_RELEASED,
    REMAINDER_NOT_COMPUTED,
    build_privacy_report,
    format_privacy_report,
    json_safe,
    released_privacy_report,
    uncredited_by_construction,
)
from training.privacy.smin import DEFAULT_CHUNK_SIZE, DEFAULT_MAX_DIM, METHODS, smin_lower_bound
from training.privacy.taylor import TaylorRemainders
from training.recipe import ParameterAverage, refuse_batch_norm
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent
from transdenoiser.runtime import hardware_description
from transdenoiser.toml import dataclass_from_dict

ARMS = ("nodp", "sepdp", "transdenoiser")
OPTIMIZERS = ("sgd", "adam")
EVAL_BATCH = 500
STATE_FILE = "training_state"
SUBSET_SEED = 0  # train_examples / eval_examples take a fixed random subset (the splits are sorted by class)
REPORT_FILE = "privacy_report.txt"
HISTORY_FIELDS = ("batch_size", "num_nonnegative", "smin", "smin_method", "input_multiplier", "sigma_bar",
                  "explicit_multiplier", "mean_loss")


@dataclass
class TrainConfig:
    """Everything that decides a training run (saved in the checkpoint; ``resume`` requires it unchanged)."""

    arm: str = "transdenoiser"
    sigma: float = 0.25  # input noise std, pixels in [0, 1]; also the smoothing sigma at certification
    clip_norm: float = 1.0  # C: per-example gradient L2 clipping norm
    xi_up: float = 2.0  # noise multiplier (std / C on the summed clipped gradient)
    xi_low: float = 0.5  # line 16: input-noise multipliers below this are ignored
    target_epsilon: float | None = None  # if set, xi_up is calibrated to it (``calibration_accountant``)
    calibration_accountant: str = "rdp"
    delta: float = 1e-5
    batch_size: int = 64  # expected batch size B; Poisson rate q = B / N
    epochs: int = 10
    optimizer: str = "sgd"
    learning_rate: float = 0.1
    momentum: float = 0.9  # sgd only
    denoiser: str = "autoencoder"
    activation: str = "relu"
    denoiser_kwargs: dict = field(default_factory=dict)  # e.g. {"widths": [32, 64]}, {"width": 8}, {"depth": 17}
    train_examples: int = 0  # 0: the whole private split; else a fixed random subset of n examples
    eval_examples: int = 0  # 0: the whole test split; else a fixed random subset of n examples
    eval_noise_seed: int = 12345  # fixed noise for the per-epoch evaluation
    max_smin_dim: int = DEFAULT_MAX_DIM
    smin_chunk_size: int = DEFAULT_CHUNK_SIZE
    # how clipped sums are computed (training/privacy/clipping.py; values change speed and memory only, never the
    # result beyond float rounding): "auto" times ghost clipping and vmap per-example gradients and keeps the
    # faster; vmap chunks of at most grad_chunk_size (-1: sized for the device, 0: one call); physical pieces of
    # physical_batch_size examples (-1: sized for the device, 0: the whole batch); compile: torch.compile vmap's
    # per-example gradient function
    clipping: str = "auto"
    grad_chunk_size: int = -1
    physical_batch_size: int = -1
    compile: bool = False
    seed: int = 0  # initial weights; also the DP noise and Poisson sampling, but only with reproducible_noise
    # False (default): DP noise and Poisson sampling draw from a generator seeded from the OS CSPRNG, a seed that
    # is never written anywhere. True: they draw from ``seed`` (research only: anyone with the seed can subtract
    # the noise, so no epsilon holds against them; every report says so).
    reproducible_noise: bool = False
    # Algorithm 1 without wasted noise: in a step where the non-negative group gets no input-noise credit
    # (sigma_bar = xi_up), noise the whole clipped sum once with xi_up (the sepdp step) instead of each group
    # separately (sqrt(2) xi_up in all). False reproduces the paper's Algorithm 1 (configs/mnist_sigma*.toml).
    merge_uncredited_noise: bool = True
    # sepdp: each example's gradient is the mean over this many input-noise draws, clipped once (De et al. 2022's
    # augmentation multiplicity); the privacy cost is unchanged (one clipped contribution per example and step).
    noise_draws: int = 1
    # "public": train on the public split without privacy (arm nodp only), e.g. to initialise a DP run
    train_on: str = "private"
    # a denoiser checkpoint trained on the public split whose weights start this run (public initialisation)
    init_from: str | None = None
    # sepdp's gradient noise (training/privacy/shaped_noise.py, docs/PRIVACY.md): "isotropic" (DP-SGD), "shaped"
    # (per-layer clip budgets and noise shaped from shape_examples public images per step: the same epsilon for
    # xi_up), or "optimized" (Xiang et al.'s Algorithm 1 as written: NO privacy guarantee; needs
    # acknowledge_unsound)
    noise: str = "isotropic"
    shape_examples: int = 128
    acknowledge_unsound: bool = False
    # parameter averaging: 0 = off; else the EMA decay of the weights after each step (training/recipe.py). The
    # average is what is evaluated and released (post-processing of the noisy iterates: no privacy cost)
    ema_decay: float = 0.0

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        return dataclass_from_dict(cls, values, source)

    @property
    def uses_xi_low(self) -> bool:
        """xi_low is Algorithm 1's line-16 threshold: only the transdenoiser arm reads it (and needs it <= xi_up)."""
        return self.arm == "transdenoiser"

    def validate(self, num_examples: int) -> None:
        """Refuse bad settings before any training (one line naming the problem)."""
        if num_examples < 1:
            raise UserError("the private training set is empty")
        checks = [
            (self.arm in ARMS, f"arm must be one of {', '.join(ARMS)}, got {self.arm!r}"),
            (self.sigma > 0, f"sigma must be > 0, got {self.sigma}"),
            (self.clip_norm > 0, f"clip norm C must be > 0, got {self.clip_norm}"),
            (self.xi_up > 0 or self.target_epsilon is not None, f"xi_up must be > 0, got {self.xi_up}"),
            (self.xi_low >= 0, f"xi_low must be >= 0, got {self.xi_low}"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}"),
            (self.learning_rate > 0, f"learning rate must be > 0, got {self.learning_rate}"),
            (self.momentum >= 0, f"momentum must be >= 0, got {self.momentum}"),
            (self.optimizer in OPTIMIZERS, f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}"),
            (self.denoiser in DENOISERS, f"denoiser must be one of {', '.join(DENOISERS)}, got {self.denoiser!r}"),
            (self.activation in ACTIVATIONS,
             f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}"),
            (self.calibration_accountant in ("rdp", "pld"),
             f"calibration accountant must be rdp or pld, got {self.calibration_accountant!r}"),
            (self.train_examples >= 0, f"train_examples must be >= 0, got {self.train_examples}"),
            (self.eval_examples >= 0, f"eval_examples must be >= 0, got {self.eval_examples}"),
            (self.max_smin_dim >= 1, f"max_smin_dim must be >= 1, got {self.max_smin_dim}"),
            (self.smin_chunk_size >= 1, f"smin_chunk_size must be >= 1, got {self.smin_chunk_size}"),
            (isinstance(self.grad_chunk_size, int) and self.grad_chunk_size >= -1,
             f"grad_chunk_size must be -1 (auto) or >= 0, got {self.grad_chunk_size!r}"),
            (isinstance(self.physical_batch_size, int) and self.physical_batch_size >= -1,
             f"physical_batch_size must be -1 (auto) or >= 0, got {self.physical_batch_size!r}"),
            (self.clipping in CLIPPING_MODES,
             f"clipping must be one of {', '.join(CLIPPING_MODES)}, got {self.clipping!r}"),
            (isinstance(self.compile, bool), f"compile must be true or false, got {self.compile!r}"),
            (isinstance(self.denoiser_kwargs, dict), "denoiser_kwargs must be a table"),
            (isinstance(self.reproducible_noise, bool),
             f"reproducible_noise must be true or false, got {self.reproducible_noise!r}"),
            (isinstance(self.merge_uncredited_noise, bool),
             f"merge_uncredited_noise must be true or false, got {self.merge_uncredited_noise!r}"),
            (isinstance(self.noise_draws, int) and not isinstance(self.noise_draws, bool) and self.noise_draws >= 1,
             f"noise_draws must be an integer >= 1, got {self.noise_draws!r}"),
            (self.train_on in ("private", "public"), f"train_on must be private or public, got {self.train_on!r}"),
            (self.train_on == "private" or self.arm == "nodp",
             f"training on the public split needs no privacy: use arm nodp there, got arm {self.arm!r}"),
            (isinstance(self.ema_decay, (int, float)) and 0 <= self.ema_decay < 1,
             f"ema_decay must lie in [0, 1) (0: no parameter averaging), got {self.ema_decay!r}"),
            (self.noise_draws == 1 or self.arm == "sepdp",
             f"noise_draws > 1 is available for the sepdp arm only (Algorithm 1's Taylor split of line 8 is "
             f"defined for one input-noise draw per example), got arm {self.arm!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        for key in ("in_channels", "activation"):
            if key in self.denoiser_kwargs:
                raise UserError(f"denoiser_kwargs must not set {key!r} (it comes from the data / --activation)")
        from training.privacy.shaped_noise import check_noise_settings

        check_noise_settings(self)
        if self.arm == "nodp":
            return
        if self.target_epsilon is not None and not self.target_epsilon > 0:
            raise UserError(f"target epsilon must be > 0, got {self.target_epsilon}")
        q = self.batch_size / num_examples
        if not 0 < q <= 1:
            raise UserError(f"sample rate q = B/N = {self.batch_size}/{num_examples} = {q:.4g} lies outside (0, 1]; "
                            f"use a batch size of at most {num_examples}")
        if not 0 < self.delta < 1 / num_examples:
            raise UserError(f"delta must lie in (0, 1/N) = (0, {1 / num_examples:.3g}) for N = {num_examples} "
                            f"private examples, got {self.delta}")
        if self.uses_xi_low and self.target_epsilon is None and self.xi_low > self.xi_up:
            raise UserError(f"xi_low ({self.xi_low}) must not exceed xi_up ({self.xi_up})")



def load_config_file(path: str | Path, **overrides) -> TrainConfig:
    """A TrainConfig from a TOML file (keys: TrainConfig's field names), with ``overrides`` applied."""
    from transdenoiser.toml import read_toml

    return TrainConfig.from_dict({**read_toml(path, "config"), **overrides}, source=str(path))


@dataclass
class StepRecord:
    batch_size: int
    num_nonnegative: int = 0
    smin: float = math.nan
    smin_method: str = ""
    input_multiplier: float = math.nan
    sigma_bar: float = math.nan
    explicit_multiplier: float = 0.0
    mean_loss: float = math.nan


def line16_sigma_bar(input_multiplier: float, xi_low: float, xi_up: float) -> float:
    """Algorithm 1, line 16, in noise-multiplier units."""
    if input_multiplier < xi_low:
        return xi_up
    if input_multiplier < xi_up:
        return math.sqrt(xi_up ** 2 - input_multiplier ** 2)
    return 0.0


# ------------------------------------------------------------------------------------------------ arms

class Arm:
    """One training arm: turns a batch of clean images into the gradient the optimiser sees."""

    name = "base"

    def __init__(self, model: nn.Module, config: TrainConfig, xi_up: float, expected_batch: float, total_steps: int,
                 group: RankGroup | None = None):
        self.model = model
        self.config = config
        self.xi_up = xi_up
        self.expected_batch = expected_batch
        self.total_steps = total_steps
        # torchrun: every rank sees the whole batch and draws the same noise, computes per-example gradients
        # for its own share only, and the clipped sums are added over ranks once per step (training.distributed)
        self.group = group if group is not None else RankGroup()

    def gradient(self, x: torch.Tensor, generator: torch.Generator) -> tuple[dict[str, torch.Tensor], StepRecord]:
        raise NotImplementedError

    def noisy(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Line 7: z = x + N(0, sigma^2 I), drawn on the CPU generator."""
        noise = torch.randn(x.shape, generator=generator, dtype=torch.float32).to(x.device)
        return x + self.config.sigma * noise


class NoDPArm(Arm):
    """Input perturbation only: the mean over the minibatch of eq. (1), ordinary backpropagation."""

    name = "nodp"

    def gradient(self, x, generator):
        z = self.noisy(x, generator)
        params = [p for p in self.model.parameters() if p.requires_grad]
        names = [k for k, p in self.model.named_parameters() if p.requires_grad]
        if self.group.distributed:
            return self.distributed_gradient(z, x, params, names)
        loss = (self.model(z) - x).pow(2).flatten(1).sum(1).mean()
        grads = torch.autograd.grad(loss, params)
        return dict(zip(names, grads, strict=True)), StepRecord(len(x), mean_loss=float(loss.detach()))

    def distributed_gradient(self, z, x, params, names):
        """This rank's share of the batch's summed loss, divided by the whole batch's size, then summed over ranks
        (one all-reduce, the loss sum riding in the same bucket)."""
        z_local, x_local = self.group.local(z), self.group.local(x)
        if len(x_local):
            loss_sum = (self.model(z_local) - x_local).pow(2).flatten(1).sum(1).sum()
            grads = torch.autograd.grad(loss_sum / max(1, len(x)), params)
        else:
            loss_sum, grads = torch.zeros((), device=x.device), [torch.zeros_like(p) for p in params]
        local = {**{f"grad.{k}": g for k, g in zip(names, grads, strict=True)}, "loss_sum": loss_sum.detach()}
        total = self.group.sum_over_ranks(local)
        return ({k: total[f"grad.{k}"] for k in names},
                StepRecord(len(x), mean_loss=float(total["loss_sum"]) / len(x) if len(x) else math.nan))


class DPArm(Arm):
    """Shared DP-SGD machinery: per-example gradients, clipping, noise, division by the expected batch size."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        device = next(self.model.parameters()).device
        chunk, _ = device_chunk_size(self.model, device, round(self.expected_batch), self.config.grad_chunk_size)
        self.per_example = PerExampleGradients(self.model, chunk_size=chunk)  # every per-example gradient: --noise
        self.clipper = PerExampleClipper(self.config.clip_norm)
        self.noise = GaussianNoise(self.config.clip_norm)
        self.execution = None  # the ExecutionPlan (engine, chunk, pieces): train_denoiser sets it, else first batch
        self._engine: ClippedGradients | None = None

    def engine(self, example_shape) -> ClippedGradients:
        """The clipped-sum engine of :attr:`execution` (planned for this device on first use)."""
        if self._engine is None:
            if self.execution is None:
                self.execution = plan_execution(
                    self.model, tuple(example_shape), round(self.expected_batch), next(self.model.parameters()).device,
                    clipping=self.config.clipping, grad_chunk_size=self.config.grad_chunk_size,
                    physical_batch_size=self.config.physical_batch_size, rows_per_example=self.config.noise_draws,
                    compile_model=self.config.compile)
            self._engine = ClippedGradients(self.model, self.config.clip_norm, self.execution,
                                            compile_model=self.config.compile)
        return self._engine

    def clipped_sums(self, x, generator, split=None) -> ClippedSums:
        """This rank's share of the batch: losses, clip factors and clipped sums (of the share, or of ``split``'s
        two groups); :meth:`clipped`'s noise draws and rank shares, without a per-example gradient kept."""
        draws = self.config.noise_draws
        share = self.group.share(len(x))
        repeated = x.repeat_interleave(draws, dim=0) if draws > 1 else x  # example i's draws: rows i*K .. i*K+K-1
        z = self.noisy(repeated, generator)
        if share.stop == share.start:  # a share can be empty when the batch is smaller than the world
            empty = torch.zeros(0, device=x.device)
            names = ("whole",) if split is None else ("nonneg", "negative")
            return ClippedSums(empty, empty, {name: self.zeros() for name in names},
                               None if split is None else empty.bool())
        rows = slice(share.start * draws, share.stop * draws)
        return self.engine(x.shape[1:])(z[rows], repeated[rows], draws, split)

    def zeros(self) -> dict[str, torch.Tensor]:
        return {k: torch.zeros_like(p) for k, p in self.model.named_parameters() if p.requires_grad}

    def clipped(self, x, generator):
        """Noisy inputs, per-example gradients, losses and clip factors. With ``noise_draws`` K > 1 each
        example's gradient (and loss) is the mean over K input-noise draws, and that mean is what is clipped."""
        draws = self.config.noise_draws
        # Under torchrun the input noise of the WHOLE batch is drawn on every rank (the shared generator stays in
        # step), and only this rank's share of the examples (group.share) gets per-example gradients: z, grads,
        # losses and factors below are this rank's share (the whole batch in one process).
        share = self.group.share(len(x))
        if share.stop == share.start:  # a share can be empty when the batch is smaller than the world
            self.noisy(x.repeat_interleave(draws, dim=0) if draws > 1 else x, generator)
            grads = {k: torch.zeros(0, *v.shape, dtype=v.dtype, device=v.device) for k, v in self.zeros().items()}
            return x[:0], grads, torch.zeros(0, device=x.device), torch.zeros(0, device=x.device)
        if draws == 1:
            z = self.noisy(x, generator)[share]
            grads, losses = self.per_example(z, x[share])
        else:
            repeated = x.repeat_interleave(draws, dim=0)  # example i's draws are rows i*K .. i*K+K-1
            rows = slice(share.start * draws, share.stop * draws)
            z = self.noisy(repeated, generator)[rows]
            grads, losses = self.per_example(z, repeated[rows])
            size = share.stop - share.start
            grads = {k: g.reshape(size, draws, *g.shape[1:]).mean(1) for k, g in grads.items()}
            losses = losses.reshape(size, draws).mean(1)
        factors = self.clipper.factors(per_example_norms(grads).detach())
        return z, grads, losses, factors

    def finish(self, summed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v / self.expected_batch for k, v in summed.items()}

    def whole_batch_step(self, x, generator, multiplier: float) -> tuple[dict[str, torch.Tensor], float]:
        """sepdp's step on a non-empty batch: the clipped sum of the whole batch (over ranks: one all-reduce with
        the loss sum), ``multiplier`` x C noise drawn once on it, divided by B; and the mean loss."""
        clipped = self.clipped_sums(x, generator)
        summed, losses = clipped.whole(), clipped.losses
        mean_loss = float(losses.mean())
        if self.group.distributed:  # the one all-reduce of the step: every rank's clipped sum (and loss sum)
            total = self.group.sum_over_ranks({**{f"grad.{k}": v for k, v in summed.items()},
                                               "loss_sum": losses.sum()})
            summed, mean_loss = {k: total[f"grad.{k}"] for k in summed}, float(total["loss_sum"]) / len(x)
        return self.finish(self.noise.add(summed, multiplier, generator)), mean_loss  # one draw for the batch


class SepDPArm(DPArm):
    """DP-SGD: noise N(0, (xi_up C)^2) on the summed clipped gradient every step (empty batch included)."""

    name = "sepdp"
    shaper = None  # --noise shaped|optimized: set by training.privacy.shaped_noise.attach_noise_shaper

    def gradient(self, x, generator):
        if self.shaper is not None:
            update, multiplier, mean_loss = self.shaper.gradient(self, x, generator)
            return update, StepRecord(len(x), explicit_multiplier=multiplier, mean_loss=mean_loss)
        if len(x) == 0:
            return self.finish(self.noise.add(self.zeros(), self.xi_up, generator)), StepRecord(
                0, explicit_multiplier=self.xi_up)
        update, mean_loss = self.whole_batch_step(x, generator, self.xi_up)
        return update, StepRecord(len(x), explicit_multiplier=self.xi_up, mean_loss=mean_loss)


class TransDenoiserArm(DPArm):
    """Algorithm 1: the Taylor remainder (line 8) splits the batch; S_min of the non-negative group's
    mixed-derivative matrix lowers that group's explicit noise by line 16; the negative group gets xi_up.

    With ``merge_uncredited_noise`` (the default), a step in which any example is uncredited adds xi_up once to
    the whole clipped sum: that step is exactly sepdp's. Uncredited: the non-negative group gets no input-noise
    credit (sigma_bar = xi_up, or no non-negative example), or the negative group (always uncredited) is not
    empty, where Algorithm 1 would add sqrt(sigma_bar^2 + xi_up^2) >= xi_up. So the merged arm never adds more
    explicit noise than sepdp; only a step whose whole batch is credited keeps line 17's sigma_bar < xi_up.
    Without it (the paper as written), each non-empty group gets its own noise.

    When no step can be credited (merged, and S_min never computed: w > max_smin_dim), line 8's remainder
    cannot change the update or any epsilon, so it is not computed: each step is sepdp's
    (:meth:`DPArm.whole_batch_step`) and its record says the split was not computed.
    """

    name = "transdenoiser"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.remainders = TaylorRemainders(self.model)  # line 8 in float64: (o_i, tolerance_i)
        self.credit_possible = not uncredited_by_construction(self.config.merge_uncredited_noise,
                                                              count_parameters(self.model), self.config.max_smin_dim)

    def gradient(self, x, generator):
        if len(x) == 0:  # an empty Poisson batch: full noise, still a step
            return self.finish(self.noise.add(self.zeros(), self.xi_up, generator)), StepRecord(
                0, explicit_multiplier=self.xi_up)
        if not self.credit_possible:  # the remainder, the split and S_min could change nothing: sepdp's step
            update, mean_loss = self.whole_batch_step(x, generator, self.xi_up)
            return update, StepRecord(len(x), num_nonnegative=REMAINDER_NOT_COMPUTED, smin_method="too_large",
                                      explicit_multiplier=self.xi_up, mean_loss=mean_loss)
        clipped = self.clipped_sums(x, generator, split=self.nonnegative)
        losses, factors, nonneg = clipped.losses, clipped.factors, clipped.mask.to(clipped.factors.device)
        mean_loss = float(losses.mean()) if not self.group.distributed else math.nan
        sums = None  # torchrun: both groups' clipped sums over all ranks; one process: computed where needed
        batch_factors = factors  # the whole batch's clip factors (S_min needs every non-negative example's)
        if self.group.distributed:
            sums, nonneg, batch_factors, mean_loss = self.sum_over_ranks(clipped, len(x))
        num_nonneg = int(nonneg.sum())
        record = StepRecord(len(x), num_nonnegative=num_nonneg, mean_loss=mean_loss)
        if num_nonneg > 0:  # lines 12-16
            idx = nonneg.nonzero().flatten()
            record.smin, record.smin_method = self.smin(x[idx], batch_factors[idx])
            record.input_multiplier = (self.config.sigma * math.sqrt(self.total_steps * record.smin)
                                       / self.config.clip_norm)
            record.sigma_bar = line16_sigma_bar(record.input_multiplier, self.config.xi_low, self.xi_up)
        if self.config.merge_uncredited_noise and (not record.sigma_bar < self.xi_up or num_nonneg < len(x)):
            # an uncredited example in this step (no credit, or a negative group): the sepdp step, xi_up once on
            # the whole clipped sum, never more explicit noise than sepdp's
            record.explicit_multiplier = self.xi_up
            summed = clipped.whole() if sums is None else ClippedSums(losses, factors, sums).whole()
            return self.finish(self.noise.add(summed, self.xi_up, generator)), record
        total = self.zeros()
        explicit_variance = 0.0
        if num_nonneg > 0:  # lines 17-18
            group = clipped.sums["nonneg"] if sums is None else sums["nonneg"]
            group = self.noise.add(group, record.sigma_bar, generator)  # line 17
            total = {k: total[k] + group[k] for k in total}
            explicit_variance += record.sigma_bar ** 2
        if num_nonneg < len(x):  # lines 19-23
            group = clipped.sums["negative"] if sums is None else sums["negative"]
            group = self.noise.add(group, self.xi_up, generator)  # line 22
            total = {k: total[k] + group[k] for k in total}  # line 24
            explicit_variance += self.xi_up ** 2
        record.explicit_multiplier = math.sqrt(explicit_variance)
        return self.finish(total), record

    def nonnegative(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Lines 10-11: which examples' Taylor remainder is non-negative (beyond the rounding tolerance)."""
        remainder, tolerance = self.remainders(z, x)
        return remainder >= tolerance

    def sum_over_ranks(self, clipped: ClippedSums, batch_size):
        """torchrun: the step's one all-reduce. Each rank contributes both groups' clipped sums over its share,
        its loss sum, and its share's clip factors and non-negative flags placed in batch-length vectors (zeros
        elsewhere), so every rank ends with the sums of the whole batch and the flags and factors S_min needs.
        (When no step can be credited, :meth:`gradient` takes sepdp's step and its all-reduce instead.)"""
        factors, losses = clipped.factors, clipped.losses
        mask = clipped.mask.to(factors.dtype)
        parts = {"nonneg": clipped.sums["nonneg"], "negative": clipped.sums["negative"]}
        names = list(clipped.sums["nonneg"])
        local = {f"{part}.{k}": v for part, summed in parts.items() for k, v in summed.items()}
        local.update({"loss_sum": losses.sum(), "factors": self.group.place(factors, batch_size),
                      "nonneg": self.group.place(mask, batch_size)})
        total = self.group.sum_over_ranks(local)
        sums = {part: {k: total[f"{part}.{k}"] for k in names} for part in parts}
        return sums, total["nonneg"] > 0.5, total["factors"], float(total["loss_sum"]) / batch_size

    def smin(self, x_nonneg: torch.Tensor, factors_nonneg: torch.Tensor) -> tuple[float, str]:
        """S_min of the non-negative group's K_t and how it was obtained. Under torchrun, when it is actually
        computed (w <= max_smin_dim), rank 0 computes it from the whole group and broadcasts it, so every rank
        uses the same value (and hence the same sigma_bar and noise)."""
        def compute():
            return smin_lower_bound(self.model, x_nonneg, factors_nonneg, max_dim=self.config.max_smin_dim,
                                    chunk_size=self.config.smin_chunk_size)

        width = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        if not self.group.distributed or width > self.config.max_smin_dim:  # the shortcuts need no data
            result = compute()
            return result.value, result.method
        payload = torch.zeros(2, dtype=torch.float64)
        if self.group.rank == 0:
            result = compute()
            payload = torch.tensor([result.value, METHODS.index(result.method)], dtype=torch.float64)
        payload = self.group.from_rank_zero(payload)
        return float(payload[0]), METHODS[int(payload[1])]


ARM_CLASSES: dict[str, type[Arm]] = {"nodp": NoDPArm, "sepdp": SepDPArm, "transdenoiser": TransDenoiserArm}


# ------------------------------------------------------------------------------------------------ evaluation

@torch.no_grad()
def evaluate(denoiser: nn.Module, classifier: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float,
             noise_seed: int) -> dict[str, float]:
    """Reconstruction MSE (per pixel) and PSNR on x + N(0, sigma^2) with a fixed noise seed, and the frozen
    classifier's accuracy on g(x + noise)."""
    was_training = denoiser.training
    denoiser.eval()
    generator = torch.Generator().manual_seed(noise_seed)
    squared, correct = 0.0, 0
    for start in range(0, len(x), EVAL_BATCH):
        xb = x[start:start + EVAL_BATCH]
        zb = xb + sigma * torch.randn(xb.shape, generator=generator).to(xb.device)
        out = denoiser(zb)
        squared += float((out - xb).pow(2).sum())
        correct += int((classifier(out).argmax(1) == y[start:start + EVAL_BATCH]).sum())
    denoiser.train(was_training)
    mse = squared / max(1, x.numel())
    return {"mse": mse, "psnr": 10 * math.log10(1 / mse) if mse > 0 else math.inf,
            "accuracy_denoised": correct / max(1, len(x))}


@torch.no_grad()
def classifier_baselines(classifier: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float,
                         noise_seed: int) -> dict[str, float]:
    """The classifier alone on clean and on noisy test images (same noise as :func:`evaluate`)."""
    generator = torch.Generator().manual_seed(noise_seed)
    clean = noisy = 0
    for start in range(0, len(x), EVAL_BATCH):
        xb, yb = x[start:start + EVAL_BATCH], y[start:start + EVAL_BATCH]
        zb = xb + sigma * torch.randn(xb.shape, generator=generator).to(xb.device)
        clean += int((classifier(xb).argmax(1) == yb).sum())
        noisy += int((classifier(zb).argmax(1) == yb).sum())
    return {"accuracy_clean": clean / max(1, len(x)), "accuracy_noisy_no_denoiser": noisy / max(1, len(x))}


# ------------------------------------------------------------------------------------------------ state

def _optimizer(config: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.learning_rate, momentum=config.momentum)
    return torch.optim.Adam(params, lr=config.learning_rate)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list]:
    state = optimizer.state_dict()
    tensors, layout = {}, []
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value
                layout.append([index, key, "tensor"])
            else:
                layout.append([index, key, value])
    return tensors, layout


def _restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], layout: list,
                       param_groups: list, device: torch.device) -> None:
    state: dict[int, dict[str, Any]] = {}
    for index, key, value in layout:
        state.setdefault(int(index), {})[key] = tensors[f"optimizer.{index}.{key}"] if value == "tensor" else value
    for entries in state.values():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor) and key != "step":
                entries[key] = value.to(device)
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})


def _history_tensors(records: list[StepRecord]) -> dict[str, torch.Tensor]:
    out = {}
    for name in HISTORY_FIELDS:
        if name == "smin_method":
            values = [METHODS.index(r.smin_method) if r.smin_method else -1 for r in records]
            out[f"history.{name}"] = torch.tensor(values, dtype=torch.int64)
        else:
            dtype = torch.int64 if name in ("batch_size", "num_nonnegative") else torch.float64
            out[f"history.{name}"] = torch.tensor([getattr(r, name) for r in records], dtype=dtype)
    return out


def _records_from_tensors(tensors: dict[str, torch.Tensor]) -> list[StepRecord]:
    columns = {name: tensors[f"history.{name}"].tolist() for name in HISTORY_FIELDS}
    records = []
    for i in range(len(columns["batch_size"])):
        values = {name: columns[name][i] for name in HISTORY_FIELDS}
        values["smin_method"] = METHODS[values["smin_method"]] if values["smin_method"] >= 0 else ""
        records.append(StepRecord(**values))
    return records


def _history_arrays(records: list[StepRecord]) -> dict[str, np.ndarray]:
    return {name: np.array([getattr(r, name) for r in records]) for name in HISTORY_FIELDS if name != "smin_method"}


# ------------------------------------------------------------------------------------------------ training

def _subset(split, size: int):
    """The whole split (size 0) or a fixed random subset of ``size`` examples (seed 0, order kept)."""
    if not size or size >= len(split):
        return split
    return split.subset(np.sort(np.random.default_rng(SUBSET_SEED).permutation(len(split))[:size]))


def plan(config: TrainConfig, num_examples: int) -> dict[str, Any]:
    """Sample rate, steps and the noise multiplier xi_up (calibrated if a target epsilon is set)."""
    if config.arm == "nodp":
        steps_per_epoch = math.ceil(num_examples / config.batch_size)
        return {"sample_rate": None, "steps_per_epoch": steps_per_epoch, "total_steps": steps_per_epoch * config.epochs,
                "xi_up": None, "xi_low": None}
    from training.privacy.accounting import steps_for_epochs

    q = config.batch_size / num_examples
    steps_per_epoch = max(1, round(1 / q))
    total = steps_for_epochs(config.epochs, q)
    xi_up = config.xi_up
    if config.target_epsilon is not None:
        from training.privacy.accounting import noise_multiplier_for_epsilon

        xi_up = noise_multiplier_for_epsilon(config.target_epsilon, q, total, config.delta,
                                             accountant=config.calibration_accountant)
        if config.uses_xi_low and config.xi_low > xi_up:
            raise UserError(f"xi_low ({config.xi_low}) exceeds the calibrated xi_up ({xi_up:.4g}) for target epsilon "
                            f"{config.target_epsilon}; lower it with --xi-low")
    return {"sample_rate": q, "steps_per_epoch": steps_per_epoch, "total_steps": total, "xi_up": xi_up,
            "xi_low": config.xi_low}


def _classifier_summary(classifier: Checkpoint) -> dict[str, Any]:
    meta = classifier.metadata
    return {"num_classes": meta.get("num_classes"), "architecture": meta.get("architecture"),
            "input_shape": meta.get("input_shape"), "test_accuracy": meta.get("test_accuracy"),
            "path": str(classifier.path), "weights_sha256": meta.get("files", {}).get("weights.safetensors"),
            "dataset": meta.get("dataset")}


def check_classifier_fits(classifier: Checkpoint, dataset: Dataset) -> None:
    meta = classifier.metadata
    if meta.get("kind") != "classifier":
        raise UserError(f"{classifier.path} holds a {meta.get('kind')}, expected a classifier")
    if list(meta.get("input_shape", [])) != list(dataset.image_shape):
        raise UserError(f"classifier {classifier.path} takes images of shape {meta.get('input_shape')}, "
                        f"{dataset.name} has {list(dataset.image_shape)}")
    if meta.get("num_classes") != dataset.num_classes:
        raise UserError(f"classifier {classifier.path} has {meta.get('num_classes')} classes, "
                        f"{dataset.name} has {dataset.num_classes}")


def noise_generator(config: TrainConfig, group: RankGroup | None = None) -> torch.Generator:
    """The CPU generator that draws the DP noise, the input noise and the Poisson batches.

    Secret by default: seeded from the operating system's CSPRNG with a seed that is never stored (its state
    lives only in the private training record, for ``resume``). With ``reproducible_noise`` it is seeded from
    ``config.seed``, which every release then records and flags. Under torchrun (``group``) every rank gets the
    same generator: rank 0 draws the secret seed and broadcasts it over the process group (never written).
    """
    if config.reproducible_noise:
        seed = config.seed
    else:
        seed = group.shared_seed() if group is not None and group.distributed else secrets.randbits(63)
    return torch.Generator().manual_seed(seed)


def initialise_from_public(model: nn.Module, config: TrainConfig, dataset: Dataset) -> str:
    """Copy the weights of ``config.init_from``, refusing any checkpoint not trained on the public split of
    this very dataset, or of another architecture: a public initialisation costs no privacy, a private one would.
    The check reads the checkpoint's own metadata.json: it catches mistakes, not a file edited on purpose.
    Returns the SHA-256 of the weights copied (recorded in the privacy report)."""
    source = load_checkpoint(config.init_from, kind="denoiser")
    meta = source.metadata
    trained = meta.get("dataset") or {}
    if trained.get("trained_on") != "public":
        raise UserError(f"--init-from {config.init_from}: trained on {trained.get('trained_on')!r} data; only a "
                        "denoiser trained on the public split (train --train-on public --arm nodp) may initialise a "
                        "private run without spending privacy")
    if (trained.get("name"), (trained.get("fingerprints") or {}).get("public")) != (
            dataset.name, dataset.released_fingerprints()["public"]):
        raise UserError(f"--init-from {config.init_from}: trained on {trained.get('name')}'s public split, not on "
                        f"this run's ({dataset.name}, split seed {dataset.split_seed})")
    if meta.get("architecture") != config.denoiser or source.model.state_dict().keys() != model.state_dict().keys():
        raise UserError(f"--init-from {config.init_from}: a {meta.get('architecture')} denoiser with arguments "
                        f"{meta.get('arch_kwargs')}, this run builds {config.denoiser}")
    try:
        model.load_state_dict(source.model.state_dict())
    except RuntimeError as exc:
        raise UserError(f"--init-from {config.init_from}: weights do not fit this run's denoiser "
                        f"({str(exc).splitlines()[0]})") from None
    return meta["files"][WEIGHTS]


def train_denoiser(config: TrainConfig, dataset: Dataset, classifier: Checkpoint, device: torch.device,
                   track: Track = silent, *, checkpoint_dir: str | Path | None = None, resume: bool = False,
                   on_epoch: Callable[[dict], None] | None = None,
                   stop_after_epochs: int | None = None,
                   group: RankGroup | None = None,
                   on_plan: Callable[[str], None] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Train a denoiser on ``dataset.private`` in front of the frozen ``classifier``; return (model, metadata).

    ``metadata`` is what a release may carry (see :func:`released_metadata`): public settings, the privacy
    report's data-independent figures, and evaluation on the test split. ``checkpoint_dir``: written after
    every epoch, crash-safely: the released files (``weights.safetensors``, ``metadata.json``,
    ``privacy_report.txt``) and the private training record in ``private/`` (optimiser and generator state,
    per-step history, losses: never released; :func:`load_private_record` reads it). ``resume``: continue
    the run saved there (its config must equal ``config``). ``on_epoch(row)``: called after each epoch with
    the epoch's test metrics plus its private ``train_loss`` and ``seconds`` (for the trainer's console).
    ``stop_after_epochs``: stop (with a checkpoint) after that many epochs in total, as if interrupted.
    ``group``: this process's place under torchrun (:func:`training.distributed.rank_group_from_environment`):
    each step's Poisson batch is shared out among the ranks, the clipped sums are added by one all-reduce and
    the same noise is added on every rank; rank 0 writes the checkpoints; every rank returns the same model
    and metadata. Default: one process. ``on_plan(text)``: called once with how the clipped sums are computed
    (engine, chunk, physical pieces and why; :func:`training.privacy.clipping.plan_for_arm`), for the trainer's console.
    """
    group = group if group is not None else RankGroup(device=torch.device(device))
    train_split = _subset(dataset.split(config.train_on), config.train_examples)
    config.validate(len(train_split))
    check_classifier_fits(classifier, dataset)
    if len(dataset.test) == 0:
        raise UserError(f"{dataset.name}: the test split is empty")
    num_examples = len(train_split)
    schedule = plan(config, num_examples)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if resume and checkpoint_dir is None:
        raise UserError("resume needs a checkpoint directory")
    group.check_same(json.dumps([asdict(config), dataset.fingerprints(), str(checkpoint_dir), resume],
                                sort_keys=True), "the training settings, data or --out")
    if checkpoint_dir is not None:
        if group.is_writer:  # only rank 0 touches the files; the others wait, then read
            recover_interrupted_save(checkpoint_dir)
        group.barrier()
        if not resume and (checkpoint_dir / "metadata.json").exists():
            raise UserError(f"{checkpoint_dir} already holds a checkpoint; pass --resume to continue it or choose "
                            "another --out (nothing is overwritten silently)")

    torch.manual_seed(config.seed)
    kwargs = denoiser_kwargs(config.denoiser, dataset.image_shape[0], config.activation, config.denoiser_kwargs)
    model = build_model(config.denoiser, **kwargs).to(device)
    check_denoiser_fits(model, dataset.image_shape)
    if config.arm != "nodp":
        refuse_batch_norm(model, config.arm)
    init_weights_sha256 = initialise_from_public(model, config, dataset) if config.init_from is not None else None
    average = ParameterAverage(model, config.ema_decay) if config.ema_decay else None  # released: the average
    released_model = average.model if average is not None else model
    optimizer = _optimizer(config, model)
    generator = noise_generator(config, group)
    records: list[StepRecord] = []
    metrics: list[dict[str, Any]] = []  # per epoch: test metrics + the private train_loss and seconds
    epochs_done, seconds_before = 0, 0.0
    if resume:
        epochs_done, records, metrics, seconds_before = _resume(checkpoint_dir, config, dataset, classifier, model,
                                                                optimizer, generator, device, group.world_size,
                                                                average=average)

    classifier_model = classifier.model.to(device).eval()
    for p in classifier_model.parameters():
        p.requires_grad_(False)
    x_train, _ = train_split.tensors(device)
    test = _subset(dataset.test, config.eval_examples)
    x_test, y_test = test.tensors(device)
    baselines = classifier_baselines(classifier_model, x_test, y_test, config.sigma, config.eval_noise_seed)

    arm = ARM_CLASSES[config.arm](model, config, schedule["xi_up"] or 0.0, float(config.batch_size),
                                  schedule["total_steps"], group=group)
    if config.arm == "sepdp":  # --noise shaped|optimized (training/privacy/shaped_noise.py)
        from training.privacy.shaped_noise import attach_noise_shaper

        attach_noise_shaper(arm, config, dataset, x_train, start_step=len(records))
    execution = None
    if isinstance(arm, DPArm):  # how the clipped sums are computed (the engine, chunks, pieces), or kept on resume
        execution = plan_for_arm(arm, config, dataset.image_shape, device,
                                 load_private_record(checkpoint_dir) if resume else None)
    if execution is not None and on_plan is not None:
        on_plan(execution.describe())
    sampler = PoissonSampler(num_examples, schedule["sample_rate"]) if config.arm != "nodp" else None
    last_epoch = config.epochs if stop_after_epochs is None else min(config.epochs, stop_after_epochs)
    started = time.perf_counter()
    model.train()
    run = _RunFacts(config, dataset, classifier, schedule, baselines, kwargs, device, count_parameters(model),
                    world_size=group.world_size, init_weights_sha256=init_weights_sha256)
    run.execution = execution.as_dict() if execution is not None else None
    for epoch in range(epochs_done, last_epoch):
        epoch_started = time.perf_counter()
        if sampler is None:
            order = torch.randperm(num_examples, generator=generator)
            batches = [order[i:i + config.batch_size] for i in range(0, num_examples, config.batch_size)]
        else:
            batches = None
        for step in track(range(schedule["steps_per_epoch"]), desc=f"{config.arm} epoch {epoch + 1}/{config.epochs}",
                          total=schedule["steps_per_epoch"]):
            index = batches[step] if batches is not None else sampler.sample(generator)
            grads, record = arm.gradient(x_train[index.to(device)], generator)
            for name, p in model.named_parameters():
                if p.requires_grad:
                    p.grad = grads[name].detach()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if average is not None:
                average.update(model)
            records.append(record)
        losses = [r.mean_loss for r in records[-schedule["steps_per_epoch"]:] if not math.isnan(r.mean_loss)]
        row = {"epoch": epoch + 1,
               **evaluate(released_model, classifier_model, x_test, y_test, config.sigma, config.eval_noise_seed),
               "train_loss": float(np.mean(losses)) if losses else math.nan,
               "seconds": time.perf_counter() - epoch_started}
        metrics.append(row)
        epochs_done = epoch + 1
        if group.distributed:  # every rank applied the same summed update and noise: refuse silent drift
            group.check_same(_weights_digest(model), f"the weights after epoch {epoch + 1}")
        if checkpoint_dir is not None and group.is_writer:
            _save(checkpoint_dir, released_model, optimizer, generator, records,
                  run.released(records, metrics, epochs_done),
                  run.private(records, metrics, epochs_done, seconds_before + time.perf_counter() - started),
                  extra_state=average.state_tensors(model) if average is not None else None)
        if on_epoch is not None:
            on_epoch(row)
    if not metrics:
        raise UserError("no epoch was trained")
    group.barrier()  # the last checkpoint is written before any rank returns
    released_model.eval()
    return released_model, run.released(records, metrics, epochs_done)


def _weights_digest(model: nn.Module) -> str:
    """SHA-256 of the model's parameters and buffers (bytes, in state-dict order)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------ released vs private

PRIVATE_DIR = "private"  # the private training record, beside the released files; never copied by bundle/serve
RECORD_FILE = "record.json"
RECORD_FORMAT = "transdenoiser-private-training-record"
RELEASED_METRICS = ("epoch", "mse", "psnr", "accuracy_denoised")  # test split, computed from the released model
PRIVATE_RECORD_NOTE = ("PRIVATE: statistics of the private training data computed without noise, and the state "
                       "that would let anyone recompute the DP noise. Never release this directory; the released "
                       "files (weights.safetensors, metadata.json, privacy_report.txt) do not depend on it.")


class _RunFacts:
    """What a run's metadata is built from; splits it into the released metadata and the private record."""

    def __init__(self, config, dataset, classifier, schedule, baselines, kwargs, device, num_parameters,
                 world_size: int = 1, init_weights_sha256: str | None = None):
        self.config, self.dataset, self.classifier = config, dataset, classifier
        self.num_parameters = num_parameters
        self.world_size = world_size  # training processes (torchrun); --resume needs the same
        self.init_weights_sha256 = init_weights_sha256  # --init-from: the SHA-256 of the weights copied
        self.schedule, self.baselines, self.kwargs, self.device = schedule, baselines, kwargs, device
        trained_on = dataset.split(config.train_on)
        self.num_examples = len(trained_on) if not config.train_examples else min(config.train_examples,
                                                                                 len(trained_on))

    def full_report(self, records: list[StepRecord]) -> dict[str, Any]:
        """The full privacy report after ``records`` (computed once per step count: records only grow)."""
        cached = getattr(self, "_report", None)
        if cached is not None and cached[0] == len(records):
            return cached[1]
        config, schedule = self.config, self.schedule
        report = build_privacy_report(
            arm=config.arm, sigma=config.sigma, clip_norm=config.clip_norm, xi_low=config.xi_low,
            xi_up=schedule["xi_up"] if schedule["xi_up"] is not None else config.xi_up,
            sample_rate=schedule["sample_rate"] or config.batch_size / self.num_examples,
            num_examples=self.num_examples, expected_batch_size=float(config.batch_size), delta=config.delta,
            steps_planned=schedule["total_steps"], history=_history_arrays(records),
            smin_methods=[r.smin_method for r in records], max_smin_dim=config.max_smin_dim,
            num_parameters=self.num_parameters, noise=noise_description(config),
            merge_uncredited_noise=config.merge_uncredited_noise,
            initialisation=({"kind": "public", "checkpoint": config.init_from,
                             "weights_sha256": self.init_weights_sha256,
                             "note": "weights of a denoiser trained without noise on the public split, as that "
                                     "checkpoint's own metadata.json says (a check against mistakes: an edited "
                                     "metadata file is not detected; the trainer answers for the weights' origin)"}
                            if config.init_from else {"kind": "random", "seed": config.seed}),
            target_epsilon=config.target_epsilon if config.arm != "nodp" else None,
            calibration_accountant=config.calibration_accountant
            if config.target_epsilon is not None and config.arm != "nodp" else None)
        from training.privacy.shaped_noise import noise_report

        report = noise_report(report, config, [r.explicit_multiplier for r in records])
        self._report = (len(records), report)
        return report

    def released(self, records, metrics, epochs_done) -> dict[str, Any]:
        return released_metadata(self, records, metrics, epochs_done)

    def private(self, records, metrics, epochs_done, seconds) -> dict[str, Any]:
        return json_safe({
            "format": RECORD_FORMAT, "released": False, "note": PRIVATE_RECORD_NOTE,
            "noise": noise_description(self.config),
            "dataset_fingerprints": self.dataset.fingerprints(),
            "epochs": [{k: row[k] for k in ("epoch", "train_loss", "seconds")} for row in metrics],
            "epochs_done": epochs_done, "steps_done": len(records), "seconds": seconds,
            "world_size": self.world_size,
            "execution": getattr(self, "execution", None),
            "privacy": self.full_report(records),
        })


def noise_description(config: TrainConfig) -> dict[str, Any]:
    """How the DP noise was drawn, as every report states it."""
    if config.reproducible_noise:
        return {"mode": "reproducible", "seed": config.seed,
                "warning": ("REPRODUCIBLE NOISE: the DP noise and the Poisson batches can be recomputed from the "
                            f"recorded seed ({config.seed}); no epsilon in this report holds against anyone who "
                            "has the seed. For research only: train without --reproducible-noise to release.")}
    return {"mode": "secret", "seed": None,
            "source": ("a generator seeded from the operating system's CSPRNG; the seed is not recorded anywhere "
                       "and the generator state lives only in the private training record")}


def released_metadata(run: _RunFacts, records: list[StepRecord], metrics: list[dict],
                      epochs_done: int) -> dict[str, Any]:
    """The metadata a release carries: public settings, the data-independent privacy report, test-split metrics.

    Nothing here is computed from the private split without noise: no losses, batch sizes, S_min or
    per-step noise levels, no timing, no fingerprint of the private split (see docs/PRIVACY.md, "What the
    released model reveals"). The steps counted are the planned schedule's, which do not depend on the data.
    """
    config, dataset = run.config, run.dataset
    return json_safe({
        "kind": "denoiser", "architecture": config.denoiser, "arch_kwargs": run.kwargs,
        "input_shape": list(dataset.image_shape),
        "classifier": _classifier_summary(run.classifier),
        "dataset": {"name": dataset.name, "split_seed": dataset.split_seed, "trained_on": config.train_on,
                    "train_examples": run.num_examples,
                    "fingerprints": dataset.released_fingerprints(),
                    "source": dataset.source},
        "sigma": config.sigma,
        "config": asdict(config), "schedule": run.schedule, "epochs_done": epochs_done, "steps_done": len(records),
        "complete": epochs_done == config.epochs,
        "metrics": [{k: row[k] for k in RELEASED_METRICS} for row in metrics],
        "baselines": run.baselines,
        "privacy": _released_report(run, records),
        "private_record": {"path": f"{PRIVATE_DIR}/{RECORD_FILE}", "released": False,
                           "holds": list(NOT_RELEASED)},
        "device": str(run.device),
        "hardware": hardware_description(torch.device(run.device)),
    })


def _released_report(run: _RunFacts, records: list[StepRecord]) -> dict[str, Any]:
    from training.privacy.shaped_noise import released_noise_report

    full = run.full_report(records)
    return released_noise_report(released_privacy_report(full), full, run.config)


def load_private_record(directory: str | Path) -> dict[str, Any]:
    """The private training record of a run saved by :func:`train_denoiser` (not part of any release)."""
    path = Path(directory) / PRIVATE_DIR / RECORD_FILE
    if not path.is_file():
        raise UserError(f"{directory}: no private training record ({PRIVATE_DIR}/{RECORD_FILE}); a released "
                        "model directory does not carry one")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise UserError(f"{path}: not a {RECORD_FORMAT} file")
    return record


def _save(directory: Path, model, optimizer, generator, records, metadata, record, extra_state=None) -> None:
    """One epoch's checkpoint, written to a staging directory and renamed into place (crash-safe). ``model``: the
    released weights (the parameter average with ``ema_decay``; ``extra_state`` then holds the live weights)."""
    opt_tensors, layout = _optimizer_tensors(optimizer)
    state = {"rng.cpu": generator.get_state(), **opt_tensors, **_history_tensors(records), **(extra_state or {})}

    def write(staging: Path) -> None:
        save_checkpoint(staging, model, metadata)
        write_text(staging / REPORT_FILE, format_privacy_report(metadata["privacy"]) + "\n")
        sha = save_tensors(staging / PRIVATE_DIR / f"{STATE_FILE}.safetensors", state)
        write_json(staging / PRIVATE_DIR / RECORD_FILE, {
            **record, "resume_state": {"optimizer_layout": layout,
                                       "optimizer_param_groups": optimizer.state_dict()["param_groups"]},
            "files": {f"{STATE_FILE}.safetensors": sha}})

    replace_directory(directory, write)


def _resume(directory: Path, config, dataset, classifier, model, optimizer, generator, device, world_size: int = 1,
            average=None):
    meta = read_metadata(directory)
    if meta.get("kind") != "denoiser":
        raise UserError(f"{directory} holds a {meta.get('kind')}, not a denoiser training run")
    record = load_private_record(directory)
    saved_world = int(record.get("world_size", 1))
    if saved_world != world_size:
        raise UserError(f"--resume: the run in {directory} was trained by {saved_world} process(es), this resume "
                        f"has {world_size}; resume it with the same world size (torchrun's --nnodes x "
                        f"--nproc_per_node = {saved_world}{', or without torchrun' if saved_world == 1 else ''})")
    stored = TrainConfig.from_dict(meta["config"], source=f"{directory}/metadata.json")
    if asdict(stored) != asdict(config):
        diff = [f"{k}: saved {v!r}, now {asdict(config)[k]!r}" for k, v in asdict(stored).items()
                if asdict(config)[k] != v]
        raise UserError(f"--resume needs the saved configuration unchanged; differs in {'; '.join(diff)}")
    if record.get("dataset_fingerprints") != dataset.fingerprints():
        raise UserError(f"--resume: the data differs from the run saved in {directory} (split fingerprints)")
    saved_sha = meta["classifier"].get("weights_sha256")
    if saved_sha != classifier.metadata.get("files", {}).get("weights.safetensors"):
        raise UserError(f"--resume: classifier {classifier.path} is not the one the saved run used "
                        f"({meta['classifier'].get('path')})")
    saved = load_checkpoint(directory, kind="denoiser", map_location=device)
    model.load_state_dict(saved.model.state_dict())
    name = f"{STATE_FILE}.safetensors"
    tensors = load_tensors(directory / PRIVATE_DIR / name, (record.get("files") or {}).get(name))
    resume_state = record["resume_state"]
    _restore_optimizer(optimizer, tensors, resume_state["optimizer_layout"],
                       resume_state["optimizer_param_groups"], device)
    generator.set_state(tensors["rng.cpu"])
    if average is not None:  # the saved weights are the average; the live ones are in the private state
        average.restore(model, {k: v.to(device) for k, v in tensors.items()})
    records = _records_from_tensors(tensors)
    test_metrics = {row["epoch"]: row for row in meta["metrics"]}
    metrics = [{**test_metrics[row["epoch"]], **row} for row in record["epochs"]]
    return int(meta["epochs_done"]), records, metrics, float(record.get("seconds", 0.0))
