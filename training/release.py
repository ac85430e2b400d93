"""What a training run releases and what it keeps private.

The released metadata (:func:`released_metadata`, ``metadata.json``) holds public settings, the privacy report's
data-independent figures and test-split metrics; the private training record (``private/record.json``,
:func:`load_private_record`) holds the statistics of the private data computed without noise and the state that
would let anyone recompute the DP noise. :class:`RunFacts` builds both from one run.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.objectives import PUBLIC_PHASE, PUBLIC_PHASE_SOURCE
from training.privacy.report import NOT_RELEASED, build_privacy_report, json_safe, released_privacy_report
from training.train_config import HISTORY_FIELDS, StepRecord, TrainConfig
from transdenoiser.errors import UserError
from transdenoiser.runtime import hardware_description

REPORT_FILE = "privacy_report.txt"
PRIVATE_DIR = "private"  # the private training record, beside the released files; never copied by bundle/serve
RECORD_FILE = "record.json"
RECORD_FORMAT = "transdenoiser-private-training-record"
RELEASED_METRICS = ("epoch", "mse", "psnr", "accuracy_denoised")  # test split, computed from the released model
PRIVATE_RECORD_NOTE = ("PRIVATE: statistics of the private training data computed without noise, and the state "
                       "that would let anyone recompute the DP noise. Never release this directory; the released "
                       "files (weights.safetensors, metadata.json, privacy_report.txt) do not depend on it.")


class RunFacts:
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
            initialisation=self.initialisation(),
            target_epsilon=config.target_epsilon if config.arm != "nodp" else None,
            calibration_accountant=config.calibration_accountant
            if config.target_epsilon is not None and config.arm != "nodp" else None)
        from training.privacy.shaped_noise import noise_report

        report = noise_report(report, config, [r.explicit_multiplier for r in records])
        self._report = (len(records), report)
        return report

    def initialisation(self) -> dict[str, Any]:
        """Where the weights the private phase starts from came from: ``--init-from``'s checkpoint, this run's own
        MSE phase on the public split (objective stability+mse), or the seed."""
        config = self.config
        if config.init_from:
            return {"kind": "public", "checkpoint": config.init_from, "weights_sha256": self.init_weights_sha256,
                    "note": "weights of a denoiser trained without noise on the public split, as that "
                            "checkpoint's own metadata.json says (a check against mistakes: an edited "
                            "metadata file is not detected; the trainer answers for the weights' origin)"}
        if config.objective == "stability+mse":
            return {"kind": "public", "checkpoint": PUBLIC_PHASE_SOURCE, "weights_sha256": self.init_weights_sha256,
                    "phase": {**PUBLIC_PHASE, "epochs": config.epochs, "sigma": config.sigma},
                    "note": "weights trained by this run without noise, with MSE, on the public split before the "
                            "private phase: the public split is not private, so no privacy is spent on them"}
        return {"kind": "random", "seed": config.seed}

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


def released_metadata(run: RunFacts, records: list[StepRecord], metrics: list[dict],
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
        "classifier": run.classifier.summary(),
        "dataset": {"name": dataset.name, "split_seed": dataset.split_seed, "trained_on": config.train_on,
                    "train_examples": run.num_examples,
                    "fingerprints": dataset.released_fingerprints(),
                    "source": dataset.source},
        "sigma": config.sigma,
        "objective": config.objective,
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


def _released_report(run: RunFacts, records: list[StepRecord]) -> dict[str, Any]:
    from training.privacy.shaped_noise import released_noise_report

    full = run.full_report(records)
    return released_noise_report(released_privacy_report(full), full, run.config)


def load_private_record(directory: str | Path) -> dict[str, Any]:
    """The private training record of a run saved by :func:`training.private_train.train_denoiser` (not part of any
    release)."""
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


def _history_arrays(records: list[StepRecord]) -> dict[str, np.ndarray]:
    return {name: np.array([getattr(r, name) for r in records]) for name in HISTORY_FIELDS if name != "smin_method"}
