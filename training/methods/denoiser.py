"""The product's arms as training methods: ``nodp``, ``sepdp`` and ``transdenoiser`` train a denoiser in front of
the frozen classifier (:func:`training.private_train.train_denoiser`); one config type for the three.

The tuned recipe (training/recipe.py) is a mode of these methods, not a method of its own: ``batch_size = "auto"``
(with ``target_epsilon``, on a DP arm) plans the batch size for the target epsilon, the largest power of two that
leaves ``min_steps`` steps; ``ema_decay`` (parameter averaging) is an ordinary setting. The plan is made once the
number of private examples is known (:func:`plan_batch`), and the run trains at the chosen batch size.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from training.methods.base import Hooks, SettingsSource, TrainResult, refuse_unknown
from training.methods.registry import register
from training.private_train import plan as plan_schedule
from training.private_train import train_denoiser
from training.train_config import TrainConfig
from transdenoiser.errors import UserError

DEFAULT_MIN_STEPS = 200  # batch_size "auto": the largest batch that leaves at least this many steps
REPORT_FILE = "privacy_report.txt"  # beside the weights, as train_denoiser writes it
AUTO = "auto"


@dataclass
class DenoiserConfig(TrainConfig):
    """:class:`~training.train_config.TrainConfig` and the recipe's batch plan: ``batch_size`` may be ``"auto"``
    (planned for ``target_epsilon`` by :func:`plan_batch`), leaving at least ``min_steps`` steps. The run itself
    is the TrainConfig of :meth:`train_config` (what checkpoints record)."""

    min_steps: int = DEFAULT_MIN_STEPS

    def train_config(self) -> TrainConfig:
        """The plain TrainConfig (batch size planned already: see :func:`plan_batch`)."""
        if self.batch_size == AUTO:
            raise UserError("batch size auto is planned from the number of private examples: plan it first "
                            "(training.methods.denoiser.plan_batch)")
        return TrainConfig(**{f.name: getattr(self, f.name) for f in fields(TrainConfig)})


def training_examples(config, dataset) -> int:
    """N: the examples the run trains on (its split, or the fixed subset of ``train_examples``); a config without
    ``train_on`` (a baseline's) trains on the private split."""
    size = len(dataset.split(getattr(config, "train_on", "private")))
    return min(config.train_examples, size) if config.train_examples else size


def plan_batch(config, num_examples: int):
    """The recipe's batch plan (:func:`training.recipe.plan_batch_sizes`) for ``config``'s target epsilon:
    (every candidate's plan, the chosen one, the plan as text). ``config``: a DenoiserConfig, or any config of
    Poisson-sampled DP-SGD with ``arm``, ``target_epsilon``, ``delta``, ``epochs`` and ``calibration_accountant``
    (``train --plan --arm securesgd-*``), planned for at least ``min_steps`` (default 200) steps."""
    from training.recipe import choose_batch_size, format_plan, plan_batch_sizes

    if config.target_epsilon is None or config.arm == "nodp":
        raise UserError("--batch-size auto and --plan need --target-epsilon and a DP arm (sepdp or transdenoiser)")
    plans = plan_batch_sizes(config.target_epsilon, config.delta, num_examples, config.epochs,
                             accountant=config.calibration_accountant)
    min_steps = getattr(config, "min_steps", DEFAULT_MIN_STEPS)
    chosen = choose_batch_size(plans, min_steps)
    text = format_plan(plans, chosen, config.target_epsilon, config.delta, config.calibration_accountant,
                       config.epochs, min_steps)
    return plans, chosen, text


class DenoiserMethod:
    """One of the product's arms (``name`` is the arm)."""

    config_type = DenoiserConfig
    certificate = None  # randomized smoothing of the denoised classifier (``certify``) is the only certificate
    resumable = True

    def __init__(self, name: str):
        self.name = name

    def config_from_settings(self, settings: Mapping[str, Any], source: SettingsSource,
                             base: Mapping[str, Any] | None = None) -> DenoiserConfig:
        refuse_unknown(self.name, DenoiserConfig, settings, source)
        values = {**(base or {}), **settings, "arm": self.name}
        return DenoiserConfig.from_dict(values, source=source.label)

    def check_run(self, *, resume: bool = False, distributed: bool = False) -> None:
        """Every run is possible: resumed from its last epoch, or shared out among torchrun's processes."""

    def plan(self, config: DenoiserConfig, num_examples: int) -> dict[str, Any]:
        if config.batch_size == AUTO:
            _, chosen, _ = plan_batch(config, num_examples)
            config.batch_size = chosen.batch_size
        return plan_schedule(config.train_config(), num_examples)

    def train(self, config: DenoiserConfig, data, classifier, device, hooks: Hooks = Hooks(), *,
              out: Path | None = None, resume: bool = False, group=None) -> TrainResult:
        """``classifier``: the frozen classifier's :class:`~training.checkpoint.Checkpoint`. With ``out``, a
        checkpoint (and the private training record) is written after every epoch; ``resume`` continues it."""
        if config.batch_size == AUTO:
            _, chosen, _ = plan_batch(config, training_examples(config, data))
            config.batch_size = chosen.batch_size
        model, meta = train_denoiser(config.train_config(), data, classifier, device, track=hooks.track,
                                     checkpoint_dir=out, resume=resume, on_epoch=hooks.on_epoch, group=group,
                                     on_plan=hooks.on_plan)
        return TrainResult(model, meta, Path(out) if out is not None else None)

    def save(self, config: DenoiserConfig, result: TrainResult, out: Path) -> Path:
        """The released files (weights, metadata.json, privacy_report.txt); the private training record, needed
        to resume, exists only where ``train`` checkpointed the run itself."""
        from training.checkpoint import replace_directory, save_checkpoint, write_text
        from training.privacy.report import format_privacy_report

        out = Path(out)
        if result.checkpoint is not None and result.checkpoint.resolve() == out.resolve():
            return out

        def write(staging: Path) -> None:
            save_checkpoint(staging, result.model, result.metadata)
            write_text(staging / REPORT_FILE, format_privacy_report(result.metadata["privacy"]) + "\n")

        return replace_directory(out, write)

    def load(self, out: Path, device="cpu"):
        from training.checkpoint import load_checkpoint

        return load_checkpoint(out, kind="denoiser", map_location=device)


for _arm in ("nodp", "sepdp", "transdenoiser"):
    register(DenoiserMethod(_arm))
