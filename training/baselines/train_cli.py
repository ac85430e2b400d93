"""``transdenoiser train --arm securesgd-prt|securesgd-sct|stobatch``: the baselines' console text around their
training method (training/methods/securesgd.py, stobatch.py): flags -> the method's settings -> its config -> its
training -> text (called by training.train_cli, under its run lock, once the method has accepted the run).

The baselines themselves (training/baselines/securesgd.py, stobatch.py) are library code: they take a config and
a dataset, never read flags, never print.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable

from training.baselines.securesgd import REPORT_FILE as SECURESGD_REPORT_FILE
from training.baselines.securesgd import format_training_summary
from training.baselines.stobatch import REPORT_FILE as STOBATCH_REPORT_FILE
from training.baselines.stobatch import format_privacy_report


def _config_and_data(args, method):
    """The method's config from the flags (seeding torch, numpy and random from it) and the data set named."""
    from training.cli import load_dataset_from_args
    from training.train_flags import method_and_settings
    from transdenoiser.runtime import seed_everything

    _, settings, source = method_and_settings(args)
    config = method.config_from_settings(settings, source)
    seed_everything(config.seed)
    return config, load_dataset_from_args(args)


def _warn_if_reproducible(config, print_fn: Callable[..., None]) -> None:
    if config.reproducible_noise:
        print_fn(f"WARNING: --reproducible-noise: the DP noise is drawn from seed {config.seed}, which is recorded; "
                 "the epsilon does not hold against anyone who has it", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ SecureSGD


def cmd_train_securesgd(args, method, device, print_fn: Callable[..., None] = print) -> int:
    """``transdenoiser train --arm securesgd-prt|securesgd-sct``: called by training.train_cli."""
    from training.checkpoint import load_checkpoint
    from training.methods import Hooks
    from transdenoiser.progress import bar
    from transdenoiser.runtime import hardware_description

    config, dataset = _config_and_data(args, method)
    classifier = None
    if args.classifier is not None:
        classifier = load_checkpoint(args.classifier, kind="classifier", map_location=device)
    print_fn(f"train {config.arm}: on {dataset.name} private split, sigma {config.sigma}, device "
             f"{hardware_description(device)}", file=sys.stderr)
    _warn_if_reproducible(config, print_fn)

    def on_epoch(row: dict) -> None:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k not in ("epoch", "seconds"))
        print_fn(f"epoch {row['epoch']:>3}  {shown}  ({row['seconds']:.0f} s)", file=sys.stderr, flush=True)

    result = method.train(config, dataset, classifier, device, Hooks(track=bar, on_epoch=on_epoch), out=args.out)
    meta = result.metadata
    if args.json:
        print_fn(json.dumps(meta, indent=2))
        return 0
    print_fn(format_training_summary(meta))
    print_fn(f"checkpoint: {args.out}  (privacy report also in {args.out}/{SECURESGD_REPORT_FILE})")
    return 0


# ------------------------------------------------------------------------------------------------- StoBatch

def cmd_train_stobatch(args, method, device, print_fn: Callable[..., None] = print) -> int:
    """``transdenoiser train --arm stobatch``: called by training.train_cli (under its run lock)."""
    from training.methods import Hooks
    from training.methods.stobatch import check_classifier_shape
    from transdenoiser.progress import bar
    from transdenoiser.runtime import hardware_description

    config, dataset = _config_and_data(args, method)
    classifier_metadata = None
    if getattr(args, "classifier", None) is not None:  # only checked: the arm trains its own classifier
        from training.checkpoint import read_metadata

        classifier_metadata = read_metadata(args.classifier)
        check_classifier_shape(classifier_metadata, dataset, f"--classifier {args.classifier}")
    print_fn(f"train stobatch: cnn28 from scratch on {dataset.name} private split, device "
             f"{hardware_description(device)}", file=sys.stderr)
    _warn_if_reproducible(config, print_fn)

    def on_epoch(row: dict) -> None:
        print_fn(f"epoch {row['epoch']:>3}  test accuracy {row['test_accuracy']:.4f}  ({row['seconds']:.0f} s)",
                 file=sys.stderr, flush=True)

    try:
        result = method.train(config, dataset, classifier_metadata, device, Hooks(track=bar, on_epoch=on_epoch),
                              out=args.out)
    except KeyboardInterrupt:
        print_fn(f"transdenoiser train: interrupted: nothing was saved in {args.out} (the stobatch arm saves once, "
                 "at the end)", file=sys.stderr)
        return 130
    meta = result.metadata
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
