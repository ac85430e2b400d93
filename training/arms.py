"""The three training arms: each turns a batch of clean images into the gradient the optimiser sees.

- ``nodp`` (:class:`NoDPArm`): input perturbation only, ordinary backpropagation, no privacy claim.
- ``sepdp`` (:class:`SepDPArm`): DP-SGD (Abadi et al. 2016): per-example clipping at C, noise N(0, (xi_up C)^2 I)
  on the summed clipped gradient.
- ``transdenoiser`` (:class:`TransDenoiserArm`): Algorithm 1 of the TransDenoiser paper, line by line, with the unit
  mapping of docs/PRIVACY.md; :func:`line16_sigma_bar` is its line 16 in noise-multiplier units.

Each arm minimises its :class:`training.objectives.Objective` (``objective``: eq. (1) by default, or a frozen
classifier's cross-entropy on the denoised image); each example's loss is its own, so clipping bounds every
example's contribution by C whatever the objective. The update is (clipped sum + noise) / B with B the expected
batch size. Every random number comes from the CPU
generator passed in (on CUDA drawn on the device by a generator it seeds, :func:`training.privacy.dp.standard_normal`),
so a resumed run continues bit-for-bit.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from training.distributed import RankGroup
from training.models import count_parameters
from training.objectives import Objective
from training.privacy.clipping import ClippedGradients, ClippedSums, device_chunk_size, plan_execution
from training.privacy.dp import (
    GaussianNoise,
    PerExampleClipper,
    PerExampleGradients,
    per_example_norms,
    standard_normal,
)
from training.privacy.report import REMAINDER_NOT_COMPUTED, uncredited_by_construction
from training.privacy.smin import METHODS, smin_lower_bound
from training.privacy.taylor import TaylorRemainders
from training.train_config import StepRecord, TrainConfig


def line16_sigma_bar(input_multiplier: float, xi_low: float, xi_up: float) -> float:
    """Algorithm 1, line 16, in noise-multiplier units."""
    if input_multiplier < xi_low:
        return xi_up
    if input_multiplier < xi_up:
        return math.sqrt(xi_up ** 2 - input_multiplier ** 2)
    return 0.0


class Arm:
    """One training arm: turns a batch of clean images into the gradient the optimiser sees."""

    name = "base"

    def __init__(self, model: nn.Module, config: TrainConfig, xi_up: float, expected_batch: float, total_steps: int,
                 group: RankGroup | None = None, objective: Objective | None = None):
        self.model = model
        self.config = config
        self.objective = objective if objective is not None else Objective()  # eq. (1) unless given
        self.xi_up = xi_up
        self.expected_batch = expected_batch
        self.total_steps = total_steps
        # torchrun: every rank sees the whole batch and draws the same noise, computes per-example gradients
        # for its own share only, and the clipped sums are added over ranks once per step (training.distributed)
        self.group = group if group is not None else RankGroup()

    def gradient(self, x: torch.Tensor, generator: torch.Generator, labels: torch.Tensor | None = None
                 ) -> tuple[dict[str, torch.Tensor], StepRecord]:
        """The update for the batch of clean images ``x`` (``labels``: theirs, read by the classification
        objective only) and the step's record."""
        raise NotImplementedError

    def noisy(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Line 7: z = x + N(0, sigma^2 I), drawn from the CPU generator (on CUDA by the device generator it seeds:
        :func:`training.privacy.dp.standard_normal`)."""
        return x + self.config.sigma * standard_normal(x.shape, generator, x.device)


class NoDPArm(Arm):
    """Input perturbation only: the mean over the minibatch of eq. (1), ordinary backpropagation."""

    name = "nodp"

    def gradient(self, x, generator, labels=None):
        z = self.noisy(x, generator)
        params = [p for p in self.model.parameters() if p.requires_grad]
        names = [k for k, p in self.model.named_parameters() if p.requires_grad]
        targets = self.objective.targets(x, labels)
        if self.group.distributed:
            return self.distributed_gradient(z, targets, params, names)
        loss = self.objective.row_loss(self.model(z), targets).mean()
        grads = torch.autograd.grad(loss, params)
        return dict(zip(names, grads, strict=True)), StepRecord(len(x), mean_loss=float(loss.detach()))

    def distributed_gradient(self, z, x, params, names):
        """This rank's share of the batch's summed loss, divided by the whole batch's size, then summed over ranks
        (one all-reduce, the loss sum riding in the same bucket)."""
        z_local, x_local = self.group.local(z), self.group.local(x)  # x: the rows' targets
        if len(x_local):
            loss_sum = self.objective.row_loss(self.model(z_local), x_local).sum()
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
                    compile_model=self.config.compile, cuda_graphs=self.config.cuda_graphs)
            self._engine = ClippedGradients(self.model, self.config.clip_norm, self.execution,
                                            compile_model=self.config.compile,
                                            row_loss=None if self.objective.loss == "mse" else self.objective.row_loss)
        return self._engine

    def clipped_sums(self, x, generator, split=None, labels=None) -> ClippedSums:
        """This rank's share of the batch: losses, clip factors and clipped sums (of the share, or of ``split``'s
        two groups); :meth:`clipped`'s noise draws and rank shares, without a per-example gradient kept. Each
        row's target is the objective's, from that example alone (``labels``: the classification objective's)."""
        draws = self.config.noise_draws
        share = self.group.share(len(x))
        repeated = x.repeat_interleave(draws, dim=0) if draws > 1 else x  # example i's draws: rows i*K .. i*K+K-1
        z = self.noisy(repeated, generator)
        targets = self.objective.targets(x, labels)
        targets = targets.repeat_interleave(draws, dim=0) if draws > 1 else targets
        if share.stop == share.start:  # a share can be empty when the batch is smaller than the world
            empty = torch.zeros(0, device=x.device)
            names = ("whole",) if split is None else ("nonneg", "negative")
            return ClippedSums(empty, empty, {name: self.zeros() for name in names},
                               None if split is None else empty.bool())
        rows = slice(share.start * draws, share.stop * draws)
        return self.engine(x.shape[1:])(z[rows], targets[rows], draws, split)

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

    def whole_batch_step(self, x, generator, multiplier: float, labels=None
                         ) -> tuple[dict[str, torch.Tensor], float | torch.Tensor]:
        """sepdp's step on a non-empty batch: the clipped sum of the whole batch (over ranks: one all-reduce with
        the loss sum), ``multiplier`` x C noise drawn once on it, divided by B; and the mean loss."""
        clipped = self.clipped_sums(x, generator, labels=labels)
        summed, losses = clipped.whole(), clipped.losses
        mean_loss = losses.mean().detach()  # a device tensor: read at the epoch's end (StepRecord.settle)
        if self.group.distributed:  # the one all-reduce of the step: every rank's clipped sum (and loss sum)
            total = self.group.sum_over_ranks({**{f"grad.{k}": v for k, v in summed.items()},
                                               "loss_sum": losses.sum()})
            summed, mean_loss = {k: total[f"grad.{k}"] for k in summed}, float(total["loss_sum"]) / len(x)
        return self.finish(self.noise.add(summed, multiplier, generator)), mean_loss  # one draw for the batch


class SepDPArm(DPArm):
    """DP-SGD: noise N(0, (xi_up C)^2) on the summed clipped gradient every step (empty batch included)."""

    name = "sepdp"
    shaper = None  # --noise shaped|optimized: set by training.privacy.shaped_noise.attach_noise_shaper

    def gradient(self, x, generator, labels=None):
        if self.shaper is not None:
            update, multiplier, mean_loss = self.shaper.gradient(self, x, generator)
            return update, StepRecord(len(x), explicit_multiplier=multiplier, mean_loss=mean_loss)
        if len(x) == 0:
            return self.finish(self.noise.add(self.zeros(), self.xi_up, generator)), StepRecord(
                0, explicit_multiplier=self.xi_up)
        update, mean_loss = self.whole_batch_step(x, generator, self.xi_up, labels)
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
        if self.objective.loss != "mse":  # the config refuses it first (TrainConfig.validate)
            raise ValueError("the transdenoiser arm's analysis (Algorithm 1's Taylor split) holds for the MSE "
                             f"objective only, got {self.objective.loss}")
        self.remainders = TaylorRemainders(self.model)  # line 8 in float64: (o_i, tolerance_i)
        self.credit_possible = not uncredited_by_construction(self.config.merge_uncredited_noise,
                                                              count_parameters(self.model), self.config.max_smin_dim)

    def gradient(self, x, generator, labels=None):  # MSE only: labels are never read
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
