"""Progress reporting without printing from library code.

Library functions take ``track``: a callable wrapping an iterable, ``track(iterable, desc, total)``.
The default, :func:`silent`, returns the iterable untouched; the CLI passes :func:`bar`: a tqdm bar
on a terminal, and one plain line every :data:`LOG_INTERVAL_SECONDS` (count, rate, ETA) when stderr
is a log file or a pipe. Library code may call ``set_postfix(name=value, refresh=False)`` on what
``track`` returned when it has that method (both of ``bar``'s kinds do), e.g. to show a running loss.
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
Track = Callable[..., Iterable]

LOG_INTERVAL_SECONDS = 5.0  # one progress line at most this often when stderr is not a terminal


def silent(iterable: Iterable[T], desc: str | None = None, total: int | None = None) -> Iterable[T]:
    return iterable


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class LogProgress:
    """Progress for logs and pipes: a line per ``interval`` seconds, and one when the loop ends."""

    def __init__(self, iterable: Iterable[T], desc: str | None = None, total: int | None = None,
                 stream=None, interval: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.iterable = iterable
        self.desc = desc or "progress"
        if total is None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.interval = LOG_INTERVAL_SECONDS if interval is None else interval
        self.clock = clock
        self.postfix: dict[str, object] = {}
        self.done = 0

    def set_postfix(self, refresh: bool = False, **values) -> None:
        self.postfix = values

    def line(self, elapsed: float, final: bool = False) -> str:
        rate = self.done / elapsed if elapsed > 0 else math.inf
        count = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        if self.total:
            count += f" ({100 * self.done / self.total:.0f}%)"
        rate_text = f"{rate:.3g} it/s" if math.isfinite(rate) else "? it/s"
        if final:
            timing = f"done in {_duration(elapsed)}"
        elif self.total is not None and rate > 0 and math.isfinite(rate):
            timing = f"{_duration(elapsed)} elapsed, ETA {_duration((self.total - self.done) / rate)}"
        else:
            timing = f"{_duration(elapsed)} elapsed"
        extra = "".join(f", {key} {value}" for key, value in self.postfix.items())
        return f"{self.desc}: {count}, {rate_text}, {timing}{extra}"

    def __iter__(self) -> Iterator[T]:
        started = last = self.clock()
        try:
            for item in self.iterable:
                yield item
                self.done += 1
                now = self.clock()
                if now - last >= self.interval:
                    last = now
                    print(self.line(now - started), file=self.stream, flush=True)
        finally:
            if self.done and (self.total is None or self.done >= self.total):
                print(self.line(self.clock() - started, final=True), file=self.stream, flush=True)


def bar(iterable: Iterable[T], desc: str | None = None, total: int | None = None) -> Iterable[T]:
    """A tqdm bar on a terminal; :class:`LogProgress` lines when stderr is a file or a pipe."""
    isatty = getattr(sys.stderr, "isatty", None)
    if not (isatty and isatty()):
        return LogProgress(iterable, desc=desc, total=total)
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, leave=False, dynamic_ncols=True)
