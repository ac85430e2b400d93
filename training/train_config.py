"""The settings of one training run of the three arms, and the per-step record each training step produces.

:class:`TrainConfig` is everything that decides a run (saved in the checkpoint; ``resume`` requires it unchanged);
:class:`StepRecord` is one step's batch size, Algorithm 1's quantities and the explicit noise multiplier, kept in
the private training record (``HISTORY_FIELDS``, in this order) and read by the privacy report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.denoisers import ACTIVATIONS, DENOISERS
from training.objectives import OBJECTIVES
from training.privacy.clipping import CLIPPING_MODES, CUDA_GRAPH_MODES
from training.privacy.smin import DEFAULT_CHUNK_SIZE, DEFAULT_MAX_DIM
from transdenoiser.errors import UserError
from transdenoiser.toml import dataclass_from_dict

ARMS = ("nodp", "sepdp", "transdenoiser")
OPTIMIZERS = ("sgd", "adam")
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
    # CUDA graphs of the ghost engine's clipped sums (training/privacy/graphed.py): "auto" on CUDA where the model
    # allows it (no batch-statistics layer), "off" never; results are the eager ones to float rounding
    cuda_graphs: str = "auto"
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
    # what each example's loss is (training/objectives.py): "mse" (eq. 1), "stability" (the frozen classifier's
    # cross-entropy against its own prediction on the clean image), "classification" (against the private label),
    # "stability+mse" (MSE on the public split first, then stability on the private split). A checkpoint written
    # before this setting existed trained with "mse"
    objective: str = "mse"

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
            (self.cuda_graphs in CUDA_GRAPH_MODES,
             f"cuda_graphs must be one of {', '.join(CUDA_GRAPH_MODES)}, got {self.cuda_graphs!r}"),
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
            (self.objective in OBJECTIVES,
             f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}"),
            (self.objective == "mse" or self.arm != "transdenoiser",
             f"objective {self.objective} is refused by the transdenoiser arm: its privacy analysis (Algorithm 1's "
             "Taylor split of line 8) holds for the quadratic MSE loss only; use --arm sepdp or recipe"),
            (self.objective == "mse" or self.noise == "isotropic",
             f"objective {self.objective} needs --noise isotropic (shaped noise forms per-example gradients of "
             "the MSE loss only)"),
            (self.objective != "stability+mse" or self.train_on == "private",
             "objective stability+mse trains MSE on the public split, then stability on the private split: "
             "train_on must be private (for a public run give one objective, e.g. mse)"),
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
            raise UserError(f"batch size {self.batch_size} exceeds the {num_examples} private training examples "
                            f"(sample rate q = B/N = {q:.4g} outside (0, 1]): pass --batch-size {num_examples} or "
                            f"less (batch_size in a --config file), or more private data")
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
    # a float; during an epoch it may be the device's 0-dim tensor (reading it would wait for the device in every
    # step): the training loop calls settle() at the epoch's end, before anything reads or saves it
    mean_loss: float = math.nan

    def settle(self) -> StepRecord:
        """Make ``mean_loss`` a float (a device tensor is read once, here)."""
        self.mean_loss = float(self.mean_loss)
        return self
