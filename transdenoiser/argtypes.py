"""argparse value checkers: a bad flag stops at parse time with a one-line reason."""
from __future__ import annotations

import argparse
import math


def _number(kind, text: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(float, text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    value = _number(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def open_unit_interval(text: str) -> float:
    value = _number(float, text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {value}")
    return value


def float_list(text: str) -> list[float]:
    """Comma-separated numbers, e.g. ``0.5,1,1.5``."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("expected a comma-separated list of numbers")
    return [_number(float, p.strip()) for p in parts]


class DeprecatedSpelling(argparse.Action):
    """An old flag name that still works: stores into the new flag's ``dest`` and prints a one-line note."""

    def __init__(self, option_strings, dest, new_flag: str, **kwargs):
        self.new_flag = new_flag
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        import sys

        print(f"note: {option_string} is now spelled {self.new_flag} (the old spelling still works for now)",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_spelling(group, old_flag: str, new_flag: str, dest: str, **kwargs) -> None:
    """Accept ``old_flag`` as a hidden alias of ``new_flag`` (same ``dest``, same ``type``), with a note when used."""
    group.add_argument(old_flag, dest=dest, action=DeprecatedSpelling, new_flag=new_flag, default=argparse.SUPPRESS,
                       **kwargs)
