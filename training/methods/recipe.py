"""The tuned recipe as a training method, ``recipe``: DP-SGD as the ``sepdp`` arm trains it, with the recipe's
settings (docs/TRAINING.md): the batch size planned for the target epsilon (the largest power of two that leaves
``min_steps`` steps, :func:`training.methods.denoiser.plan_batch`), DP-Adam at learning rate 3e-3, no parameter
averaging.

Its config type is :class:`~training.methods.denoiser_config.RecipeConfig` (sepdp's settings with the recipe's
defaults, less ``xi_up``: the noise multiplier is calibrated from ``target_epsilon``, which is required). Planning,
training, saving and loading are the sepdp arm's (:class:`~training.methods.denoiser.DenoiserMethod`); the run's
TrainConfig says ``arm = "sepdp"``, the algorithm whose privacy analysis its report gives, so a recipe run's
checkpoint is the same bytes as the sepdp run with the same settings.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.methods.base import SettingsSource
from training.methods.denoiser import DenoiserMethod
from training.methods.denoiser_config import RecipeConfig
from training.methods.registry import register
from transdenoiser.errors import UserError

NAME = "recipe"
ARM = "sepdp"  # the arm a recipe run trains as (and records)


class RecipeMethod(DenoiserMethod):
    """``recipe``: the sepdp arm with :class:`RecipeConfig`."""

    def __init__(self) -> None:
        super().__init__(NAME, RecipeConfig, ARM)

    def config_from_settings(self, settings: Mapping[str, Any], source: SettingsSource,
                             base: Mapping[str, Any] | None = None) -> RecipeConfig:
        """sepdp's config from the recipe's defaults; a missing ``target_epsilon`` is refused in one line."""
        config = super().config_from_settings(settings, source, base)
        if config.target_epsilon is None:
            raise UserError(f"--arm {NAME} needs --target-epsilon: the recipe plans its batch size and calibrates "
                            "its noise for a target epsilon")
        return config

    def describe(self, config: RecipeConfig, planned: bool) -> str:
        """One line: what the recipe chose (``planned``: the batch size was planned for the target epsilon)."""
        batch = (f"batch {config.batch_size} planned for epsilon {config.target_epsilon:g}" if planned
                 else f"batch {config.batch_size} at epsilon {config.target_epsilon:g}")
        averaging = f"EMA decay {config.ema_decay:g}" if config.ema_decay else "no parameter averaging"
        return (f"{NAME}: {ARM}, {batch} ({config.calibration_accountant} accountant, delta {config.delta:g}), "
                f"{config.optimizer} lr {config.learning_rate:g}, {averaging}, objective {config.objective}")


register(RecipeMethod())
