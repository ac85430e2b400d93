"""SecureSGD (Phan et al., IJCAI 2019) as training methods: ``securesgd-prt`` (a denoiser with the noise layer, in
front of the frozen classifier) and ``securesgd-sct`` (a classifier from scratch); config
:class:`~training.baselines.securesgd.SecureSGDConfig`, training :func:`~training.baselines.securesgd.train_securesgd`,
own certificate :func:`~training.baselines.securesgd_certify.phan_certificate` (run by ``baseline-certify``)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.baselines.securesgd import SecureSGDConfig, plan, train_securesgd
from training.baselines.securesgd_certify import load_securesgd, phan_certificate
from training.methods.base import Hooks, SettingsSource, TrainResult, refuse_unknown, renamed
from training.methods.registry import register
from transdenoiser.errors import UserError

RENAMES = {"xi_up": "noise_multiplier"}  # the product's name of the gradient noise multiplier -> this config's


class SecureSGDMethod:
    config_type = SecureSGDConfig
    certificate = staticmethod(phan_certificate)
    resumable = False

    def __init__(self, name: str):
        self.name = name

    def config_from_settings(self, settings: Mapping[str, Any], source: SettingsSource,
                             base: Mapping[str, Any] | None = None) -> SecureSGDConfig:
        values = renamed(settings, RENAMES, source)
        refuse_unknown(self.name, SecureSGDConfig, values, source)
        if values.get("batch_size") == "auto":
            raise UserError(f"--arm {self.name} needs a number for --batch-size (the expected Poisson batch B)")
        return SecureSGDConfig.from_dict({**(base or {}), **values, "arm": self.name}, source=source.label)

    def check_run(self, *, resume: bool = False, distributed: bool = False) -> None:
        if resume:
            raise UserError("--resume is not available for the SecureSGD arms; train again into a new --out")
        if distributed:
            raise UserError("the SecureSGD arms run in one process (torchrun is not supported for them)")

    def plan(self, config: SecureSGDConfig, num_examples: int) -> dict[str, Any]:
        return plan(config, num_examples)

    def train(self, config: SecureSGDConfig, data, classifier, device, hooks: Hooks = Hooks(), *,
              out: Path | None = None, resume: bool = False, group=None) -> TrainResult:
        """``classifier``: the frozen classifier's Checkpoint (securesgd-prt; securesgd-sct only checks it fits).
        With ``out``, the checkpoint (weights, the noise layer's r, privacy report) is written after every epoch."""
        self.check_run(resume=resume, distributed=group is not None and getattr(group, "distributed", True))
        model, meta = train_securesgd(config, data, device, classifier, hooks.track, checkpoint_dir=out,
                                      on_epoch=hooks.on_epoch)
        return TrainResult(model, meta, Path(out) if out is not None else None)

    def save(self, config: SecureSGDConfig, result: TrainResult, out: Path) -> Path:
        if result.checkpoint is not None and Path(result.checkpoint).resolve() == Path(out).resolve():
            return Path(out)
        raise UserError("a SecureSGD checkpoint holds its noise layer's redistribution vector, which is written only "
                        "while training: give train an out directory")

    def load(self, out: Path, device="cpu"):
        return load_securesgd(out, device)


for _arm in ("securesgd-prt", "securesgd-sct"):
    register(SecureSGDMethod(_arm))
