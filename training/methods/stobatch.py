"""StoBatch (Phan et al., ICML 2020) as a training method, ``stobatch``: a cnn28 classifier trained from scratch
with its own noise layer; config :class:`~training.baselines.stobatch_config.StoBatchConfig`, training
:func:`~training.baselines.stobatch.train_stobatch` (saved once, at the end), own certificate
:func:`~training.baselines.stobatch_certify.certified_robustness` (run by ``baseline-certify``)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.baselines.stobatch import save_stobatch, train_stobatch
from training.baselines.stobatch_certify import certified_robustness, load_stobatch
from training.baselines.stobatch_config import StoBatchConfig
from training.baselines.stobatch_privacy import ARM, plan
from training.methods.base import Hooks, SettingsSource, TrainResult, refuse_unknown, renamed
from training.methods.registry import register
from transdenoiser.errors import UserError

RENAMES = {"xi_up": "noise_multiplier"}  # the product's name of the DP-SGD noise multiplier z -> this config's
NOTE = "a classifier trained from scratch with its own noise layer; its settings: docs/BASELINES.md"


def check_classifier_shape(classifier_metadata: Mapping[str, Any] | None, dataset, where: str = "--classifier"
                           ) -> None:
    """The arm trains its own classifier: a classifier given beside it is only checked to take the data's images."""
    shape = (classifier_metadata or {}).get("input_shape")
    if shape is not None and tuple(shape) != tuple(dataset.image_shape):
        raise UserError(f"{where} takes images of shape {shape}, {dataset.name} has {dataset.image_shape}")


class StoBatchMethod:
    name = ARM
    config_type = StoBatchConfig
    certificate = staticmethod(certified_robustness)
    resumable = False

    def config_from_settings(self, settings: Mapping[str, Any], source: SettingsSource,
                             base: Mapping[str, Any] | None = None) -> StoBatchConfig:
        values = renamed(settings, RENAMES, source)
        refuse_unknown(self.name, StoBatchConfig, values, source, NOTE)
        if values.get("batch_size") == "auto":
            raise UserError("--arm stobatch needs a number for --batch-size (the disjoint batches' size m)")
        values = {**(base or {}), **values}
        if "noise_multiplier" in values and "target_epsilon" not in values:
            values["target_epsilon"] = None  # a noise multiplier alone: fixed, no calibration
        return StoBatchConfig.from_dict(values, source=source.label)

    def check_run(self, *, resume: bool = False, distributed: bool = False) -> None:
        if resume:
            raise UserError("--arm stobatch cannot --resume (its per-batch noise is never stored); train again")
        if distributed:
            raise UserError("the stobatch arm runs in one process (torchrun is not supported for it)")

    def plan(self, config: StoBatchConfig, num_examples: int) -> dict[str, Any]:
        return plan(config, num_examples)

    def train(self, config: StoBatchConfig, data, classifier, device, hooks: Hooks = Hooks(), *,
              out: Path | None = None, resume: bool = False, group=None) -> TrainResult:
        """``classifier``: None, or a classifier's metadata (only its input shape is checked). With ``out``, the
        checkpoint is written once, when training ends (an interrupted run leaves nothing)."""
        self.check_run(resume=resume, distributed=group is not None and getattr(group, "distributed", True))
        check_classifier_shape(classifier, data)
        model, meta = train_stobatch(config, data, device, hooks.track, hooks.on_epoch)
        result = TrainResult(model, meta)
        return TrainResult(model, meta, self.save(config, result, out)) if out is not None else result

    def save(self, config: StoBatchConfig, result: TrainResult, out: Path) -> Path:
        if result.checkpoint is not None and Path(result.checkpoint).resolve() == Path(out).resolve():
            return Path(out)
        return Path(save_stobatch(out, result.model, result.metadata))

    def load(self, out: Path, device="cpu"):
        return load_stobatch(out, device)


register(StoBatchMethod())
