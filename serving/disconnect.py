"""Whether a request's client has gone, read without giving up the event loop (``DisconnectWatch``).

The scheduler looks at every request in flight before every pass (``FairScheduler.run``'s ``disconnected``), so
that a client that has gone costs no pass after the one it was seen in. Starlette's ``Request.is_disconnected``
answers by awaiting the connection's next ASGI message under a cancelled scope: every look takes a turn of the
event loop (about 20 us on 2 CPU cores, other tasks going first), 16 looks per pass with 16 requests in flight:
3.86 ms of host time per decide image against 2.65 ms with this watch, on 2 CPU cores
(``python -m benchmarks.bench_scheduler_host --mode decide --requests 16 --client-probe starlette|watch``;
docs/results/gpu.md). Here one task per request waits for that message for as long as the request computes, and
a look reads what it saw.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]

MAX_OTHER_MESSAGES = 8  # messages other than http.disconnect read before the watch gives up (says "not gone")


class DisconnectWatch:
    """The disconnection probe of one request: ``await watch()`` is True once its client has gone.

    The first look starts a task that awaits the connection's next ASGI message (``receive``): once the body has been
    read, that is ``http.disconnect``, when the client goes or (uvicorn) when the response is complete. Each look
    reads the flag that task sets: no turn of the event loop. ``close()``, when the request's computation ends, stops
    the task. A ``receive`` that fails, or that keeps giving other messages, never reads as gone (the request keeps
    computing, within its deadline), as a probe that cannot tell should."""

    def __init__(self, receive: Receive):
        self._receive = receive
        self._task: asyncio.Task | None = None
        self.gone = False

    async def __call__(self) -> bool:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="transdenoiser-disconnect-watch")
        return self.gone

    async def _watch(self) -> None:
        try:
            for _ in range(MAX_OTHER_MESSAGES):
                if (await self._receive()).get("type") == "http.disconnect":
                    self.gone = True
                    return
        except Exception:  # noqa: BLE001 - a receive that fails cannot tell: keep computing
            return

    def close(self) -> None:
        """Stop watching (the request's computation has ended; its response is about to be sent)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
