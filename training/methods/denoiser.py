"""The product's arms as training methods: ``nodp``, ``sepdp`` and ``transdenoiser`` train a denoiser in front of
the frozen classifier (:func:`training.private_train.train_denoiser`); each arm's config type has the fields that
arm reads (training/methods/denoiser_config.py), and the run is the full TrainConfig it makes.

A ``--config`` file is often shared by the three arms: its keys that another arm reads and this one does not are
not used by it, recorded in the run's TrainConfig as given (:meth:`DenoiserMethod.unused_settings`; the CLI notes
them); the same settings given as flags or as
keyword arguments are refused.

``batch_size = "auto"`` (with ``target_epsilon``, on a DP arm) plans the batch size for the target epsilon, the
largest power of two that leaves ``min_steps`` steps (:func:`plan_batch`, the tuned recipe's planner,
training/recipe.py), once the number of private examples is known; the run trains at the chosen batch size. The
tuned recipe is also a method of its own, ``recipe`` (training/methods/recipe.py): this class with the recipe's
config type, training as the ``sepdp`` arm.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.methods.base import Hooks, SettingsSource, TrainResult, refuse_unknown
from training.methods.denoiser_config import (
    ARM_CONFIGS,
    AUTO,
    DEFAULT_MIN_STEPS,
    DenoiserConfig,
    inherited_settings,
    other_arms_settings,
)
from training.methods.registry import register
from training.private_train import plan as plan_schedule
from training.private_train import train_denoiser
from transdenoiser.errors import UserError

REPORT_FILE = "privacy_report.txt"  # beside the weights, as train_denoiser writes it


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
    """One of the product's arms (``name`` is the arm; ``config_type`` its own settings). ``arm``: the arm the
    runs train with and record (``name``'s own, unless a method over an arm, such as ``recipe``, says otherwise)."""

    certificate = None  # randomized smoothing of the denoised classifier (``certify``) is the only certificate
    resumable = True

    def __init__(self, name: str, config_type: type[DenoiserConfig] | None = None, arm: str | None = None):
        self.name = name
        self.arm = arm or name
        self.config_type = config_type or ARM_CONFIGS[name]

    def unused_settings(self, settings: Mapping[str, Any], source: SettingsSource) -> list[str]:
        """The keys of a ``--config`` file (``source.file_keys``) that another denoiser arm reads and this one
        does not: a file shared by the arms; they are left out of this arm's config (the CLI notes them)."""
        return other_arms_settings(self.config_type, [name for name in settings if name in source.file_keys])

    def config_from_settings(self, settings: Mapping[str, Any], source: SettingsSource,
                             base: Mapping[str, Any] | None = None) -> DenoiserConfig:
        """The arm's config: a setting its type lacks is refused, except another arm's key of a ``--config`` file
        (not used by this arm, recorded as given). ``base``, a saved run's full TrainConfig, keeps the fields the
        type lacks for the run."""
        unused = set(self.unused_settings(settings, source))
        from_file = {name: value for name, value in settings.items() if name in unused}
        settings = {name: value for name, value in settings.items() if name not in unused}
        refuse_unknown(self.name, self.config_type, settings, source)
        # the file's values of other arms' settings are recorded in the run's TrainConfig as before (unused by
        # this arm), so that the checkpoint and its privacy report are the same bytes as without the split
        inherited = {**inherited_settings(self.config_type, base), **from_file}
        values = {**{k: v for k, v in (base or {}).items() if k not in inherited}, **settings, "arm": self.arm}
        config = self.config_type.from_dict(values, source=source.label)
        config.inherited = inherited
        return config

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
