"""``transdenoiser train --arm securesgd-prt|securesgd-sct|stobatch``: the baselines' flags -> their config, one
training call, text out (called by training.train_cli, under its run lock).

The baselines themselves (training/baselines/securesgd.py, stobatch.py) are library code: they take a config and
a dataset, never read flags, never print.
"""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from training.baselines.securesgd import REPORT_FILE as SECURESGD_REPORT_FILE
from training.baselines.securesgd import SecureSGDConfig, format_training_summary, train_securesgd
from training.baselines.stobatch import REPORT_FILE as STOBATCH_REPORT_FILE
from training.baselines.stobatch import StoBatchConfig, format_privacy_report, save_stobatch, train_stobatch
from transdenoiser.errors import UserError

# ------------------------------------------------------------------------------------------------ SecureSGD

SECURESGD_FIELDS = ("sigma", "clip_norm", "target_epsilon", "calibration_accountant", "delta", "batch_size",
                    "epochs", "optimizer", "learning_rate", "momentum", "seed", "reproducible_noise", "train_examples",
                    "eval_examples")


def securesgd_config_from_args(args) -> SecureSGDConfig:
    """A SecureSGDConfig from ``transdenoiser train``'s flags (and ``--config``); settings of the product's arms
    that have no meaning here are refused rather than ignored."""
    from training.train_flags import config_from_args

    if getattr(args, "resume", False):
        raise UserError("--resume is not available for the SecureSGD arms; train again into a new --out")
    train_config, given = config_from_args(args)
    meaningless = sorted(set(given) - set(SECURESGD_FIELDS) - {"arm", "xi_up", "seed"})
    if meaningless:
        raise UserError(f"{args.arm} does not use: {', '.join(meaningless)}")
    values = {name: getattr(train_config, name) for name in SECURESGD_FIELDS}
    if "xi_up" in given:
        values["noise_multiplier"] = given["xi_up"]
    return SecureSGDConfig(arm=args.arm, **values)


def cmd_train_securesgd(args, print_fn: Callable[..., None] = print) -> int:
    """``transdenoiser train --arm securesgd-prt|securesgd-sct``: called by training.train_cli."""
    from training.checkpoint import load_checkpoint
    from training.cli import load_dataset_from_args
    from transdenoiser.runtime import hardware_description, resolve_device, seed_everything

    if "WORLD_SIZE" in os.environ:
        raise UserError("the SecureSGD arms run in one process (torchrun is not supported for them)")
    device = resolve_device(args.device)
    config = securesgd_config_from_args(args)
    seed_everything(config.seed)
    dataset = load_dataset_from_args(args)
    classifier = None
    if args.classifier is not None:
        classifier = load_checkpoint(args.classifier, kind="classifier", map_location=device)
    print_fn(f"train {config.arm}: on {dataset.name} private split, sigma {config.sigma}, device "
             f"{hardware_description(device)}", file=sys.stderr)
    if config.reproducible_noise:
        print_fn(f"WARNING: --reproducible-noise: the DP noise is drawn from seed {config.seed}, which is recorded; "
                 "the epsilon does not hold against anyone who has it", file=sys.stderr)

    def on_epoch(row: dict) -> None:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k not in ("epoch", "seconds"))
        print_fn(f"epoch {row['epoch']:>3}  {shown}  ({row['seconds']:.0f} s)", file=sys.stderr, flush=True)

    from transdenoiser.progress import bar

    _, meta = train_securesgd(config, dataset, device, classifier, bar, checkpoint_dir=args.out, on_epoch=on_epoch)
    if args.json:
        print_fn(json.dumps(meta, indent=2))
        return 0
    print_fn(format_training_summary(meta))
    print_fn(f"checkpoint: {args.out}  (privacy report also in {args.out}/{SECURESGD_REPORT_FILE})")
    return 0


# ------------------------------------------------------------------------------------------------- StoBatch

# train flags -> StoBatchConfig fields (the others of `transdenoiser train` are refused for this arm)
STOBATCH_FLAGS = {"target_epsilon": "target_epsilon", "xi_up": "noise_multiplier", "delta": "delta",
                  "batch_size": "batch_size", "epochs": "epochs", "clip_norm": "clip_norm", "lr": "learning_rate",
                  "optimizer": "optimizer", "momentum": "momentum",
                  "calibration_accountant": "calibration_accountant", "train_examples": "train_examples",
                  "eval_examples": "eval_examples", "reproducible_noise": "reproducible_noise"}
STOBATCH_REFUSED_FLAGS = ("sigma", "xi_low", "denoiser", "activation", "denoiser_width", "dncnn_depth",
                          "merge_uncredited_noise", "noise_draws", "train_on", "init_from", "max_smin_dim",
                          "noise", "shape_examples", "ema", "min_steps", "norm", "i_understand_unsound")


def stobatch_config_from_args(args) -> StoBatchConfig:
    """StoBatchConfig from its defaults, then ``--config`` (TOML, StoBatchConfig's field names), then the flags."""
    from transdenoiser.toml import read_toml

    given = [f"--{name.replace('_', '-')}" for name in STOBATCH_REFUSED_FLAGS
             if getattr(args, name, None) not in (None, False)]
    if given:
        raise UserError(f"--arm stobatch does not take {', '.join(given)} (a classifier trained from scratch with "
                        "its own noise layer; its settings: docs/BASELINES.md)")
    if getattr(args, "resume", False):
        raise UserError("--arm stobatch cannot --resume (its per-batch noise is never stored); train again")
    values: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        values.update(read_toml(args.config, "--config"))
    for flag, name in STOBATCH_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            values[name] = value
    if getattr(args, "batch_size", None) == "auto":
        raise UserError("--arm stobatch needs a number for --batch-size (the disjoint batches' size m)")
    if "noise_multiplier" in values and "target_epsilon" not in values:
        values["target_epsilon"] = None  # --xi-up alone: a fixed noise multiplier, no calibration
    values["seed"] = getattr(args, "seed", 0)
    return StoBatchConfig.from_dict(values, source=str(getattr(args, "config", None) or "flags"))


def cmd_train_stobatch(args, print_fn: Callable[..., None] = print) -> int:
    """``transdenoiser train --arm stobatch``: called by training.train_cli (under its run lock)."""
    from training.cli import load_dataset_from_args
    from transdenoiser.progress import bar
    from transdenoiser.runtime import hardware_description, resolve_device, seed_everything

    if "WORLD_SIZE" in os.environ:
        raise UserError("the stobatch arm runs in one process (torchrun is not supported for it)")
    device = resolve_device(args.device)
    config = stobatch_config_from_args(args)
    seed_everything(config.seed)
    dataset = load_dataset_from_args(args)
    if getattr(args, "classifier", None) is not None:  # only checked: the arm trains its own classifier
        from training.checkpoint import read_metadata

        shape = read_metadata(args.classifier).get("input_shape")
        if shape is not None and tuple(shape) != tuple(dataset.image_shape):
            raise UserError(f"--classifier {args.classifier} takes images of shape {shape}, {dataset.name} has "
                            f"{dataset.image_shape}")
    print_fn(f"train stobatch: cnn28 from scratch on {dataset.name} private split, device "
             f"{hardware_description(device)}", file=sys.stderr)
    if config.reproducible_noise:
        print_fn(f"WARNING: --reproducible-noise: the DP noise is drawn from seed {config.seed}, which is recorded; "
                 "the epsilon does not hold against anyone who has it", file=sys.stderr)

    def on_epoch(row: dict) -> None:
        print_fn(f"epoch {row['epoch']:>3}  test accuracy {row['test_accuracy']:.4f}  ({row['seconds']:.0f} s)",
                 file=sys.stderr, flush=True)

    try:
        model, meta = train_stobatch(config, dataset, device, bar, on_epoch)
    except KeyboardInterrupt:
        print_fn(f"transdenoiser train: interrupted: nothing was saved in {args.out} (the stobatch arm saves once, "
                 "at the end)", file=sys.stderr)
        return 130
    save_stobatch(args.out, model, meta)
    if args.json:
        print_fn(json.dumps(meta, indent=2))
        return 0
    print_fn(f"classifier cnn28 trained by StoBatch: test accuracy {meta['test_accuracy']:.4f} "
             f"({len(meta['metrics'])} epochs)")
    print_fn(format_privacy_report(meta["privacy"]))
    print_fn(f"checkpoint: {args.out}  (privacy report also in {args.out}/{STOBATCH_REPORT_FILE}); certify it with "
             f"`transdenoiser certify --classifier {args.out}`, attack it with `transdenoiser attack --classifier "
             f"{args.out}`; its own certificate beside smoothing: `transdenoiser baseline-certify --model {args.out} "
             "--sigma 0.25 --out DIR`")
    return 0
