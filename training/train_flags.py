"""``transdenoiser train``'s flags as a :class:`training.train_config.TrainConfig`: one flag, one config field.

Shared by the ``train`` command and the baselines' own command handlers (training/baselines/train_cli.py).
"""
from __future__ import annotations

from dataclasses import fields

from transdenoiser.errors import UserError
from transdenoiser.toml import read_toml

# flag destination -> TrainConfig field
FLAG_FIELDS = {"arm": "arm", "sigma": "sigma", "clip_norm": "clip_norm", "xi_up": "xi_up", "xi_low": "xi_low",
               "target_epsilon": "target_epsilon", "delta": "delta", "batch_size": "batch_size", "epochs": "epochs",
               "optimizer": "optimizer", "lr": "learning_rate", "momentum": "momentum", "denoiser": "denoiser",
               "activation": "activation", "train_examples": "train_examples", "eval_examples": "eval_examples",
               "max_smin_dim": "max_smin_dim", "calibration_accountant": "calibration_accountant",
               "reproducible_noise": "reproducible_noise", "merge_uncredited_noise": "merge_uncredited_noise",
               "noise_draws": "noise_draws", "train_on": "train_on", "init_from": "init_from",
               "noise": "noise", "shape_examples": "shape_examples", "i_understand_unsound": "acknowledge_unsound"}
FLAG_FIELDS["ema"] = "ema_decay"  # the tuned recipe (training/recipe.py)
FLAG_FIELDS.update({"clipping": "clipping", "grad_chunk_size": "grad_chunk_size",  # training/privacy/clipping.py
                    "physical_batch_size": "physical_batch_size", "compile": "compile"})


def config_from_args(args, base: dict | None = None):
    """TrainConfig from defaults (or ``base``), then ``--config``, then the flags given."""
    from training.train_config import TrainConfig

    values = dict(base) if base is not None else {}
    given: dict = {}
    if args.config is not None:
        given.update(read_toml(args.config, "--config"))
        known = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise UserError(f"--config {args.config}: unknown setting(s) {', '.join(unknown)}")
    for flag, name in FLAG_FIELDS.items():
        value = getattr(args, flag, None)
        if value is not None:
            given[name] = value
    extra = dict(given.get("denoiser_kwargs", values.get("denoiser_kwargs", {})))
    if args.denoiser_width is not None:
        extra["width"] = args.denoiser_width
    if args.dncnn_depth is not None:
        extra["depth"] = args.dncnn_depth
    if getattr(args, "norm", None) is not None:
        extra["norm"] = args.norm
    if given.get("batch_size") == "auto":  # resolved by resolve_auto_batch once the data set's size is known
        del given["batch_size"]
    if extra:
        given["denoiser_kwargs"] = extra
    if base is None or args.seed != 0:
        given["seed"] = args.seed
    values.update(given)
    return TrainConfig.from_dict(values, source=str(args.config or "flags")), given
