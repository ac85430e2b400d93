"""Progress reporting without printing from library code.

Library functions take ``track``: a callable wrapping an iterable, ``track(iterable, desc, total)``.
The default, :func:`silent`, returns the iterable untouched; the CLI passes :func:`bar` (tqdm to stderr).
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
Track = Callable[..., Iterable]


def silent(iterable: Iterable[T], desc: str | None = None, total: int | None = None) -> Iterable[T]:
    return iterable


def bar(iterable: Iterable[T], desc: str | None = None, total: int | None = None) -> Iterable[T]:
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=None)
