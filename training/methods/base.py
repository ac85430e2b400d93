"""The training-method interface: a :class:`Method` protocol, its :class:`Hooks` and :class:`TrainResult`,
and where a method's settings came from (:class:`SettingsSource`); the registry by name is
:mod:`training.methods.registry`.

A method is one way to train a model on the private split: its settings are one dataclass (``config_type``) and
every setting a user gives is a field of it, by name. A setting the config type does not have is refused with one
line naming how the user gave it (the flag, or the key of a ``--config`` file) and the method: no method keeps a
list of the settings it ignores.

Library code: nothing here prints; errors are :class:`~transdenoiser.errors.UserError` (a ``ValueError``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent


@dataclass(frozen=True)
class Hooks:
    """What a method calls while it trains (library code never prints): ``track(iterable, desc=, total=)`` wraps
    each epoch's steps (a progress bar or :func:`~transdenoiser.progress.silent`); ``on_epoch(row)`` after every
    epoch with its figures; ``on_plan(text)`` once with how the method will compute its steps (when it says)."""

    track: Track = silent
    on_epoch: Callable[[dict], None] | None = None
    on_plan: Callable[[str], None] | None = None


@dataclass(frozen=True)
class TrainResult:
    """A finished training: the model (eval mode), its released metadata, and the checkpoint directory the method
    wrote while training (None when it was given no ``out``)."""

    model: Any
    metadata: dict[str, Any]
    checkpoint: Path | None = None


@dataclass(frozen=True)
class SettingsSource:
    """Where a method's settings came from, to name them in error messages: ``spelled`` maps a setting to how the
    user wrote it (``--xi-low``; ``xi_low in --config run.toml``); a setting not in it is named as is.
    ``file_keys``: the settings whose value is a ``--config`` file's key (no flag overrode it); ``path``: that
    file."""

    label: str = "settings"
    spelled: Mapping[str, str] = field(default_factory=dict)
    file_keys: frozenset[str] = frozenset()
    path: str | None = None

    def name(self, setting: str) -> str:
        return self.spelled.get(setting, setting)


@runtime_checkable
class Method(Protocol):
    """One way to train. ``name`` is what ``transdenoiser train --arm`` calls it."""

    name: str
    config_type: type
    # the method's own robustness certificate, beside randomized smoothing (``baseline-certify``); None: smoothing only
    certificate: Callable[..., Any] | None

    def config_from_settings(self, settings: Mapping[str, Any], source: SettingsSource,
                             base: Mapping[str, Any] | None = None) -> Any:
        """The config from its defaults (or ``base``, a saved run's), then ``settings``; a setting that is not a
        field of ``config_type`` is refused (:func:`refuse_unknown`)."""

    def plan(self, config: Any, num_examples: int) -> dict[str, Any]:
        """The schedule for ``num_examples`` private examples: sample rate, steps, the noise multiplier."""

    def train(self, config: Any, data: Any, classifier: Any, device: Any, hooks: Hooks = Hooks(), *,
              out: Path | None = None, resume: bool = False, group: Any = None) -> TrainResult:
        """Train on ``data`` (a :class:`training.datasets.Dataset`); with ``out``, the checkpoint is in ``out`` when
        it returns (written after every epoch, or once at the end, as the method does)."""

    def save(self, config: Any, result: TrainResult, out: Path) -> Path:
        """Write ``result``'s released checkpoint into ``out`` (nothing when ``train`` already wrote it there)."""

    def load(self, out: Path, device: Any = "cpu") -> Any:
        """A checkpoint this method wrote, loaded (hash-checked)."""


def refuse_unknown(method: str, config_type: type, settings: Mapping[str, Any], source: SettingsSource,
                   note: str = "", subject: str | None = None) -> None:
    """One line naming every setting in ``settings`` that ``config_type`` has no field for, and the method
    (``subject``: how to name it; default ``--arm METHOD``)."""
    known = {f.name for f in fields(config_type)}
    unknown = [name for name in settings if name not in known]
    if unknown:
        spelled = sorted({source.name(name) for name in unknown})
        raise UserError(f"{subject or '--arm ' + method} does not take {', '.join(spelled)}"
                        + (f" ({note})" if note else ""))


def renamed(settings: Mapping[str, Any], renames: Mapping[str, str], source: SettingsSource) -> dict[str, Any]:
    """``settings`` with the product's names of some settings turned into a config type's own (``xi_up`` ->
    ``noise_multiplier``). Given under both names, a flag wins over a ``--config`` key (flags override the file);
    two keys of the file are refused."""
    out = dict(settings)
    for old, new in renames.items():
        if old not in out:
            continue
        value = out.pop(old)
        if new in out:
            old_flag, new_flag = source.name(old).startswith("--"), source.name(new).startswith("--")
            if old_flag == new_flag:
                raise UserError(f"{source.name(old)} and {source.name(new)} set the same thing: give one")
            if new_flag:
                continue
        out[new] = value
    return out
