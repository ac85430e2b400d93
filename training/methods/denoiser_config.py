"""Each denoiser arm's own settings: one config type per arm, with exactly the fields the arm reads.

- :class:`DenoiserConfig`: what every arm reads (input noise, batches, optimiser, the denoiser, evaluation, seed,
  public split and initialisation, parameter averaging, how the noise generator is seeded);
- :class:`DPConfig`: beside it, what the two DP arms read (clipping norm, gradient noise multiplier or target
  epsilon and its accountant, delta, how clipped sums are computed, the recipe's ``min_steps``);
- :class:`ClippedSumConfig` (DPConfig less the noise multiplier) and :class:`SepDPNoiseConfig` (sepdp's input-noise
  draws and noise shape), the parts they are built from;
- :class:`NoDPConfig` (``nodp``) is :class:`DenoiserConfig`; :class:`SepDPConfig` (``sepdp``) adds the input-noise
  draws and the noise shape; :class:`TransDenoiserConfig` (``transdenoiser``) adds Algorithm 1's line-16 threshold
  and the S_min settings;
- :class:`RecipeConfig` (the ``recipe`` method, training/methods/recipe.py): sepdp's settings with the tuned
  recipe's defaults, less ``xi_up`` (calibrated from the required ``target_epsilon``).

A setting an arm does not read is not a field of its type, so :func:`~training.methods.base.refuse_unknown` refuses
it. The run itself is the full :class:`~training.train_config.TrainConfig` of :meth:`DenoiserConfig.train_config`
(what checkpoints record): the fields the arm's type lacks take their defaults, or a resumed run's saved values
(``inherited``). The defaults are TrainConfig's own.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from training.train_config import TrainConfig
from transdenoiser.errors import UserError
from transdenoiser.toml import dataclass_from_dict

DEFAULT_MIN_STEPS = 200  # batch_size "auto": the largest batch that leaves at least this many steps
AUTO = "auto"
_D = TrainConfig()  # the defaults (each field's meaning: TrainConfig)
TRAIN_FIELDS = tuple(f.name for f in fields(TrainConfig))


@dataclass
class DenoiserConfig:
    """The settings every denoiser arm reads (``arm nodp``'s whole config). ``batch_size`` may be ``"auto"`` on a
    DP arm (planned by :func:`training.methods.denoiser.plan_batch`). Reading a TrainConfig field the arm's type
    lacks gives its value in the run (:meth:`train_config`): the default, or a resumed run's saved one."""

    arm: str = "nodp"
    sigma: float = _D.sigma
    batch_size: int | str = _D.batch_size
    epochs: int = _D.epochs
    optimizer: str = _D.optimizer
    learning_rate: float = _D.learning_rate
    momentum: float = _D.momentum
    denoiser: str = _D.denoiser
    activation: str = _D.activation
    denoiser_kwargs: dict = field(default_factory=dict)
    train_examples: int = _D.train_examples
    eval_examples: int = _D.eval_examples
    eval_noise_seed: int = _D.eval_noise_seed
    seed: int = _D.seed
    reproducible_noise: bool = _D.reproducible_noise  # nodp too: its input noise and batch order
    train_on: str = _D.train_on
    init_from: str | None = _D.init_from
    ema_decay: float = _D.ema_decay
    objective: str = _D.objective  # every arm reads it; the transdenoiser arm's config refuses all but mse

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> DenoiserConfig:
        return dataclass_from_dict(cls, values, source)

    def _run_values(self) -> dict[str, Any]:
        inherited = self.__dict__.get("inherited") or {}
        return {**{name: getattr(_D, name) for name in TRAIN_FIELDS}, **inherited,
                **{f.name: getattr(self, f.name) for f in fields(self) if f.name in TRAIN_FIELDS}}

    def __getattr__(self, name: str) -> Any:
        # only called for a name that is not a field: a TrainConfig field this arm does not read
        if name in TRAIN_FIELDS:
            inherited = self.__dict__.get("inherited") or {}
            return inherited[name] if name in inherited else getattr(_D, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def train_config(self) -> TrainConfig:
        """The full TrainConfig the run trains with and checkpoints record (batch size planned already)."""
        if self.batch_size == AUTO:
            raise UserError("batch size auto is planned from the number of private examples: plan it first "
                            "(training.methods.denoiser.plan_batch)")
        values = self._run_values()
        values["denoiser_kwargs"] = dict(values["denoiser_kwargs"])
        return TrainConfig(**values)

    def validate(self, num_examples: int) -> None:
        """:meth:`TrainConfig.validate` of the run's config."""
        self.train_config().validate(num_examples)


@dataclass
class ClippedSumConfig(DenoiserConfig):
    """What every DP-SGD method here reads beside :class:`DenoiserConfig`, the noise multiplier aside: per-example
    clipping at ``clip_norm``, ``target_epsilon`` calibrated with ``calibration_accountant``, ``delta``, how
    clipped sums are computed (training/privacy/clipping.py), and the recipe's ``min_steps`` (batch size
    ``"auto"``)."""

    clip_norm: float = _D.clip_norm
    target_epsilon: float | None = _D.target_epsilon
    calibration_accountant: str = _D.calibration_accountant
    delta: float = _D.delta
    clipping: str = _D.clipping
    grad_chunk_size: int = _D.grad_chunk_size
    physical_batch_size: int = _D.physical_batch_size
    compile: bool = _D.compile
    min_steps: int = DEFAULT_MIN_STEPS


@dataclass
class DPConfig(ClippedSumConfig):
    """What the two DP arms read: :class:`ClippedSumConfig` and the noise multiplier ``xi_up`` (used when no
    ``target_epsilon`` calibrates it)."""

    xi_up: float = _D.xi_up


@dataclass
class SepDPNoiseConfig:
    """sepdp's own settings: ``noise_draws`` input-noise draws per example, the gradient noise's shape (``noise``,
    ``shape_examples``, ``acknowledge_unsound``: training/privacy/shaped_noise.py)."""

    noise_draws: int = _D.noise_draws
    noise: str = _D.noise
    shape_examples: int = _D.shape_examples
    acknowledge_unsound: bool = _D.acknowledge_unsound


@dataclass
class NoDPConfig(DenoiserConfig):
    """``nodp``: input perturbation only, ordinary backpropagation: no clipping, no gradient noise."""


@dataclass
class SepDPConfig(SepDPNoiseConfig, DPConfig):
    """``sepdp``: DP-SGD (:class:`DPConfig`) with :class:`SepDPNoiseConfig`."""

    arm: str = "sepdp"


@dataclass
class TransDenoiserConfig(DPConfig):
    """``transdenoiser``: Algorithm 1; line 16's threshold ``xi_low``, ``merge_uncredited_noise``, and how S_min
    is computed (``max_smin_dim``, ``smin_chunk_size``)."""

    arm: str = "transdenoiser"
    xi_low: float = _D.xi_low
    merge_uncredited_noise: bool = _D.merge_uncredited_noise
    max_smin_dim: int = _D.max_smin_dim
    smin_chunk_size: int = _D.smin_chunk_size


RECIPE_LEARNING_RATE = 3e-3  # DP-Adam's step size of the committed configs/recipe_*.toml
# the objective that certified most at equal epsilon (docs/RESULTS.md section 12, "Training objectives at the same
# epsilon": Fashion-MNIST, sigma 0.5, epsilon 1, 500 images): MSE on the public split, then stability
RECIPE_OBJECTIVE = "stability+mse"


@dataclass
class RecipeConfig(SepDPNoiseConfig, ClippedSumConfig):
    """``recipe``: the tuned recipe (docs/TRAINING.md), DP-SGD as the ``sepdp`` arm trains it (``arm`` is the
    algorithm, whose privacy analysis applies) with the recipe's defaults: batch size ``"auto"`` (the largest
    power of two leaving ``min_steps`` steps at ``target_epsilon``), DP-Adam at learning rate 3e-3, no parameter
    averaging, objective ``stability+mse`` (what configs/recipe_*.toml choose). ``target_epsilon`` is required and
    calibrates the noise multiplier, so ``xi_up`` is not a setting: sepdp's settings are :class:`DPConfig`'s less
    ``xi_up`` (:class:`ClippedSumConfig`) and :class:`SepDPNoiseConfig`."""

    arm: str = "sepdp"
    batch_size: int | str = AUTO
    optimizer: str = "adam"
    learning_rate: float = RECIPE_LEARNING_RATE
    ema_decay: float = 0.0
    target_epsilon: float | None = None
    objective: str = RECIPE_OBJECTIVE


ARM_CONFIGS: dict[str, type[DenoiserConfig]] = {"nodp": NoDPConfig, "sepdp": SepDPConfig,
                                                "transdenoiser": TransDenoiserConfig}
# every setting some denoiser arm reads (a key of a shared --config file outside it is refused)
FAMILY_FIELDS = frozenset(name for config in ARM_CONFIGS.values() for name in (f.name for f in fields(config)))


def field_names(config_type: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(config_type))


def arms_reading(setting: str) -> tuple[str, ...]:
    """The arms whose config type has ``setting``."""
    return tuple(arm for arm, config in ARM_CONFIGS.items() if setting in field_names(config))


def other_arms_settings(config_type: type, names: Iterable[str]) -> list[str]:
    """Those of ``names`` that a denoiser arm reads and ``config_type`` does not have (in the order given)."""
    own = field_names(config_type)
    return [name for name in names if name not in own and name in FAMILY_FIELDS]


def unused_note(arm: str, names: Iterable[str]) -> str:
    """``arm nodp does not use clip_norm, xi_up (sepdp's and transdenoiser's settings), xi_low (transdenoiser's
    setting)``: the settings of other arms, each group named by the arms that read it."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name in sorted(names):
        groups.setdefault(arms_reading(name), []).append(name)
    parts = [f"{', '.join(keys)} ({' and '.join(a + chr(39) + 's' for a in owners)} "
             f"setting{'s' if len(keys) > 1 else ''})" for owners, keys in groups.items()]
    return f"arm {arm} does not use {', '.join(parts)}"


def inherited_settings(config_type: type, base: Mapping[str, Any] | None) -> dict[str, Any]:
    """The TrainConfig fields of a saved run's config (``base``) that ``config_type`` does not have: kept for the
    run (a resumed run trains with, and records, the settings it was saved with)."""
    own = field_names(config_type)
    return {k: v for k, v in (base or {}).items() if k in TRAIN_FIELDS and k not in own}
