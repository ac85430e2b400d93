"""Train the denoiser g in front of the frozen classifier h on the ``private`` split: the training loop.

:func:`train_denoiser` builds the denoiser (random or public initialisation), draws the Poisson batches, asks the
arm (:mod:`training.arms`: ``nodp``, ``sepdp``, ``transdenoiser``) for each step's gradient and feeds it to SGD or
Adam (DP-Adam: Adam on the privatised gradient is post-processing), evaluates on the test split after every epoch
(:mod:`training.evaluation`) and writes a checkpoint (:mod:`training.train_state`): the released files and the
private training record (:mod:`training.release`). ``resume`` continues bit-for-bit (weights, optimiser state, the
CPU generator that draws every random number, and the per-step privacy history), so an interruption never loses
or double-counts privacy spending. :func:`plan` gives the sample rate, steps and the noise multiplier.
"""
from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from training.arms import ARM_CLASSES, DPArm
from training.checkpoint import WEIGHTS, Checkpoint, load_checkpoint, recover_interrupted_save
from training.datasets import Dataset
from training.denoisers import check_denoiser_fits, denoiser_kwargs
from training.distributed import RankGroup
from training.evaluation import FrozenClassifier, check_classifier_fits, classifier_baselines, evaluate, subset
from training.models import build_model, count_parameters
from training.objectives import PHASES, PUBLIC_PHASE, build_objective
from training.privacy.clipping import plan_for_arm
from training.privacy.dp import PoissonSampler
from training.recipe import ParameterAverage, refuse_batch_norm
from training.release import RunFacts, load_private_record
from training.train_config import StepRecord, TrainConfig
from training.train_state import build_optimizer, resume_training_state, save_epoch_checkpoint
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent


def plan(config: TrainConfig, num_examples: int) -> dict[str, Any]:
    """Sample rate, steps and the noise multiplier xi_up (calibrated if a target epsilon is set)."""
    if config.arm == "nodp":
        steps_per_epoch = math.ceil(num_examples / config.batch_size)
        return {"sample_rate": None, "steps_per_epoch": steps_per_epoch, "total_steps": steps_per_epoch * config.epochs,
                "xi_up": None, "xi_low": None}
    from training.privacy.accounting import steps_for_epochs
    from training.privacy.accounting import steps_per_epoch as epoch_steps

    q = config.batch_size / num_examples
    steps_per_epoch = epoch_steps(q)
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


def public_phase_config(config: TrainConfig) -> TrainConfig:
    """The nodp MSE run on the public split that objective ``stability+mse`` trains before its private phase."""
    from dataclasses import replace

    return replace(config, **PUBLIC_PHASE, denoiser_kwargs=dict(config.denoiser_kwargs))


def train_public_phase(model: nn.Module, config: TrainConfig, dataset: Dataset, classifier: FrozenClassifier,
                       device: torch.device, track: Track, group: RankGroup) -> str:
    """Objective stability+mse: train ``model``'s weights with MSE on the public split (no privacy: the public
    split is not private), copy them into ``model``; return their SHA-256 (recorded as a public initialisation)."""
    if len(dataset.public) == 0:
        raise UserError(f"objective stability+mse trains MSE on the public split first, and {dataset.name} has no "
                        "public split: give --init-from DIR (a denoiser trained with MSE on public data) or use "
                        "objective stability")
    public_model, _ = train_denoiser(public_phase_config(config), dataset, classifier, device, track, group=group)
    model.load_state_dict(public_model.state_dict())
    return _weights_digest(model)


def train_denoiser(config: TrainConfig, dataset: Dataset, classifier: Checkpoint | FrozenClassifier,
                   device: torch.device,
                   track: Track = silent, *, checkpoint_dir: str | Path | None = None, resume: bool = False,
                   on_epoch: Callable[[dict], None] | None = None,
                   stop_after_epochs: int | None = None,
                   group: RankGroup | None = None,
                   on_plan: Callable[[str], None] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Train a denoiser on ``dataset.private`` in front of the frozen ``classifier``; return (model, metadata).

    ``classifier``: a classifier checkpoint, or a :class:`training.evaluation.FrozenClassifier` (any module with
    its description: the Python API's way in).

    ``metadata`` is what a release may carry (see :func:`training.release.released_metadata`): public settings,
    the privacy report's data-independent figures, and evaluation on the test split. ``checkpoint_dir``: written
    after every epoch, crash-safely: the released files (``weights.safetensors``, ``metadata.json``,
    ``privacy_report.txt``) and the private training record in ``private/`` (optimiser and generator state,
    per-step history, losses: never released; :func:`training.release.load_private_record` reads it).
    ``resume``: continue the run saved there (its config must equal ``config``). ``on_epoch(row)``: called after
    each epoch with the epoch's test metrics plus its private ``train_loss`` and ``seconds`` (for the trainer's
    console).
    ``stop_after_epochs``: stop (with a checkpoint) after that many epochs in total, as if interrupted.
    ``group``: this process's place under torchrun (:func:`training.distributed.rank_group_from_environment`):
    each step's Poisson batch is shared out among the ranks, the clipped sums are added by one all-reduce and
    the same noise is added on every rank; rank 0 writes the checkpoints; every rank returns the same model
    and metadata. Default: one process. ``on_plan(text)``: called once with how the clipped sums are computed
    (engine, chunk, physical pieces and why; :func:`training.privacy.clipping.plan_for_arm`), for the trainer's console.
    """
    group = group if group is not None else RankGroup(device=torch.device(device))
    train_split = subset(dataset.split(config.train_on), config.train_examples)
    config.validate(len(train_split))
    classifier = FrozenClassifier.of(classifier)
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
    public_phase = PHASES[config.objective][0] is not None and config.init_from is None
    if public_phase and not resume:  # stability+mse: MSE on the public split first (a resumed run has its weights)
        init_weights_sha256 = train_public_phase(model, config, dataset, classifier, device, track, group)
    elif public_phase:
        init_weights_sha256 = _recorded_initialisation(checkpoint_dir)
    average = ParameterAverage(model, config.ema_decay) if config.ema_decay else None  # released: the average
    released_model = average.model if average is not None else model
    optimizer = build_optimizer(config, model)
    generator = noise_generator(config, group)
    records: list[StepRecord] = []
    metrics: list[dict[str, Any]] = []  # per epoch: test metrics + the private train_loss and seconds
    epochs_done, seconds_before = 0, 0.0
    if resume:
        epochs_done, records, metrics, seconds_before = resume_training_state(
            checkpoint_dir, config, dataset, classifier, model, optimizer, generator, device, group.world_size,
            average=average)

    classifier_model = classifier.model.to(device).eval()
    for p in classifier_model.parameters():
        p.requires_grad_(False)
    x_train, y_train = train_split.tensors(device)
    objective = build_objective(PHASES[config.objective][1], classifier_model)  # the private phase's loss
    test = subset(dataset.test, config.eval_examples)
    x_test, y_test = test.tensors(device)
    baselines = classifier_baselines(classifier_model, x_test, y_test, config.sigma, config.eval_noise_seed)

    arm = ARM_CLASSES[config.arm](model, config, schedule["xi_up"] or 0.0, float(config.batch_size),
                                  schedule["total_steps"], group=group, objective=objective)
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
    run = RunFacts(config, dataset, classifier, schedule, baselines, kwargs, device, count_parameters(model),
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
            index = (batches[step] if batches is not None else sampler.sample(generator)).to(device)
            labels = {"labels": y_train[index]} if objective.needs_labels else {}  # read by classification only
            grads, record = arm.gradient(x_train[index], generator, **labels)
            for name, p in model.named_parameters():
                if p.requires_grad:
                    p.grad = grads[name].detach()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if average is not None:
                average.update(model)
            records.append(record)
        losses = [r.settle().mean_loss for r in records[-schedule["steps_per_epoch"]:]]
        losses = [loss for loss in losses if not math.isnan(loss)]
        row = {"epoch": epoch + 1,
               **evaluate(released_model, classifier_model, x_test, y_test, config.sigma, config.eval_noise_seed),
               "train_loss": float(np.mean(losses)) if losses else math.nan,
               "seconds": time.perf_counter() - epoch_started}
        metrics.append(row)
        epochs_done = epoch + 1
        if group.distributed:  # every rank applied the same summed update and noise: refuse silent drift
            group.check_same(_weights_digest(model), f"the weights after epoch {epoch + 1}")
        if checkpoint_dir is not None and group.is_writer:
            save_epoch_checkpoint(checkpoint_dir, released_model, optimizer, generator, records,
                                  run.released(records, metrics, epochs_done),
                                  run.private(records, metrics, epochs_done,
                                              seconds_before + time.perf_counter() - started),
                                  extra_state=average.state_tensors(model) if average is not None else None)
        if on_epoch is not None:
            on_epoch(row)
    if not metrics:
        raise UserError("no epoch was trained")
    group.barrier()  # the last checkpoint is written before any rank returns
    released_model.eval()
    return released_model, run.released(records, metrics, epochs_done)


def _recorded_initialisation(checkpoint_dir: Path) -> str | None:
    """The SHA-256 of the public-phase weights a saved run's released report records (``--resume``)."""
    meta = json.loads((checkpoint_dir / "metadata.json").read_text())
    return ((meta.get("privacy") or {}).get("initialisation") or {}).get("weights_sha256")


def _weights_digest(model: nn.Module) -> str:
    """SHA-256 of the model's parameters and buffers (bytes, in state-dict order)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
