"""dp-accounting's "failed to converge" warnings, counted and summarised once instead of printed one per RDP order.

dp-accounting logs one absl warning per Renyi order whose series does not converge (large sample rates do this),
dozens per epsilon; the orders are dropped and epsilon is the minimum over the rest, still an upper bound. The
command line prints :data:`CONVERGENCE_NOTE` once on stderr; the Python API issues it once as a Python warning.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

CONVERGENCE_NOTE = ("note: dp-accounting left out {count} RDP order(s) whose series did not converge (large sample "
                    "rates do this); epsilon is the minimum over the remaining orders, still an upper bound")


class ConvergenceWarnings(logging.Filter):
    """Counts dp-accounting's "failed to converge" warnings (one per dropped RDP order) instead of printing each."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "failed to converge" in record.getMessage():
            self.count += 1
            return False
        return True


@contextmanager
def summarised_convergence_warnings(report: Callable[[str], None]) -> Iterator[ConvergenceWarnings]:
    """Inside: absl's convergence warnings are counted, not shown; on leaving, ``report(note)`` once if any."""
    counter = ConvergenceWarnings()
    absl = logging.getLogger("absl")
    absl.addFilter(counter)
    try:
        yield counter
    finally:
        absl.removeFilter(counter)
        if counter.count:
            report(CONVERGENCE_NOTE.format(count=counter.count))
