"""What the scheduler answers a request it stops or refuses: an exception carrying its HTTP status, a one-line
message and headers (``serving.compute.scheduler``; the service turns it into the response)."""
from __future__ import annotations


class SchedulerRefusal(Exception):
    """A request the scheduler stops or refuses: HTTP ``status``, a one-line ``message``, extra ``headers``."""

    status = 503

    def __init__(self, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.headers = headers or {}


class QueueFull(SchedulerRefusal):
    status = 503


class DeadlineExceeded(SchedulerRefusal):
    status = 504


class BudgetExceeded(SchedulerRefusal):
    status = 400


class NeverInTime(SchedulerRefusal):
    status = 400  # retrying the same request cannot help: it must be smaller


class ClientDisconnected(SchedulerRefusal):
    status = 499  # nginx's "client closed request": nobody reads the answer
