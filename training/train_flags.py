"""``transdenoiser train``'s flags as settings of a training method (training/methods): one flag, one config field.

The settings are a dict of what was given, in rising precedence ``--config FILE`` (TOML, keys are the method's
config fields) then the flags, each flag under the name of the config field it sets (:data:`FLAG_FIELDS`). The
method named by ``--arm`` (or the file's ``arm``) builds its config from them and refuses any setting its config
type has no field for (:meth:`training.methods.base.Method.config_from_settings`); a denoiser arm leaves out, and
the CLI notes, a shared file's keys that only other denoiser arms read (training/methods/denoiser.py).
"""
from __future__ import annotations

from typing import Any

from training.methods.base import SettingsSource
from transdenoiser.errors import UserError
from transdenoiser.toml import read_toml

DEFAULT_ARM = "transdenoiser"

# flag destination -> config field (the denoiser arms' TrainConfig names; a baseline's config may call one of them
# by its own name: training/methods/securesgd.py, stobatch.py)
FLAG_FIELDS = {"arm": "arm", "sigma": "sigma", "clip_norm": "clip_norm", "xi_up": "xi_up", "xi_low": "xi_low",
               "target_epsilon": "target_epsilon", "delta": "delta", "batch_size": "batch_size", "epochs": "epochs",
               "optimizer": "optimizer", "lr": "learning_rate", "momentum": "momentum", "denoiser": "denoiser",
               "activation": "activation", "train_examples": "train_examples", "eval_examples": "eval_examples",
               "max_smin_dim": "max_smin_dim", "calibration_accountant": "calibration_accountant",
               "reproducible_noise": "reproducible_noise", "merge_uncredited_noise": "merge_uncredited_noise",
               "noise_draws": "noise_draws", "train_on": "train_on", "init_from": "init_from",
               "noise": "noise", "shape_examples": "shape_examples", "i_understand_unsound": "acknowledge_unsound"}
FLAG_FIELDS["ema"] = "ema_decay"  # the tuned recipe (training/recipe.py)
FLAG_FIELDS["objective"] = "objective"  # each example's loss (training/objectives.py)
FLAG_FIELDS["min_steps"] = "min_steps"  # the recipe's batch plan (training/methods/denoiser_config.py)
FLAG_FIELDS.update({"clipping": "clipping", "grad_chunk_size": "grad_chunk_size",  # training/privacy/clipping.py
                    "physical_batch_size": "physical_batch_size", "compile": "compile",
                    "cuda_graphs": "cuda_graphs"})
# flags that set one entry of the denoiser_kwargs field
DENOISER_KWARG_FLAGS = {"denoiser_width": "width", "dncnn_depth": "depth", "norm": "norm"}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def settings_from_args(args, base: dict | None = None) -> tuple[dict[str, Any], SettingsSource]:
    """(settings, where each came from): ``--config``'s keys, then the flags given; ``arm`` included when given.
    ``base``: a saved run's config (``--resume``), onto whose ``denoiser_kwargs`` the flags' entries go."""
    settings: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    if getattr(args, "config", None) is not None:
        settings.update(read_toml(args.config, "--config"))
        spelled.update({key: f"{key} (in --config {args.config})" for key in settings})
    for flag, name in FLAG_FIELDS.items():
        value = getattr(args, flag, None)
        if value is not None:
            settings[name] = value
            spelled[name] = _flag(flag)
    extra = {}
    kwarg_flags = []
    for flag, key in DENOISER_KWARG_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            extra[key] = value
            kwarg_flags.append(_flag(flag))
    if extra:
        settings["denoiser_kwargs"] = {**settings.get("denoiser_kwargs", (base or {}).get("denoiser_kwargs", {})),
                                       **extra}
        spelled["denoiser_kwargs"] = ", ".join(kwarg_flags)
    if base is None or getattr(args, "seed", 0) != 0:
        settings["seed"] = getattr(args, "seed", 0)
        spelled["seed"] = "--seed"
    file_keys = frozenset(name for name, how in spelled.items() if not how.startswith("--"))
    path = str(args.config) if getattr(args, "config", None) is not None else None
    return settings, SettingsSource(path or "flags", spelled, file_keys, path)


def method_and_settings(args, base: dict | None = None, *, arms: tuple[str, ...] | None = None,
                        command: str = "train"):
    """(the training method, its settings without ``arm``, their source): the method named by ``--arm``, else by
    the ``--config`` file's ``arm``, else by ``base``'s (a saved run's), else the default arm. ``arms``: the
    methods ``command`` runs (another is refused in one line before any method is imported); None: any."""
    from training.methods import get_method

    settings, source = settings_from_args(args, base)
    name = settings.pop("arm", None) or (base or {}).get("arm") or DEFAULT_ARM
    if arms is not None and name not in arms:
        where = f"--config {source.path} says arm = {name!r}" if "arm" in source.file_keys else f"arm {name!r}"
        raise UserError(f"{command} takes --arm {'|'.join(arms)}; {where}")
    return get_method(name), settings, source


def config_from_args(args, base: dict | None = None):
    """(the config of the method ``args`` name, the settings given): defaults (or ``base``), ``--config``, flags."""
    method, settings, source = method_and_settings(args, base)
    return method.config_from_settings(settings, source, base), settings
