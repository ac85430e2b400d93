"""Adaptive batching of noise jobs across concurrent requests, with BentoML's own dispatcher.

BentoML 1.4 batches a ``@bentoml.api(batchable=True)`` method with its ``CorkDispatcher`` (the CORK
algorithm: wait while a bigger batch is expected to pay off, bounded by ``max_latency_ms``). A batchable
API is reachable only over HTTP: from another API it is called through the service's self-proxy, i.e.
through the whole ASGI stack (where the API-key middleware would refuse it), and it is a public route
whose one bad item fails every request sharing its batch (verified on 1.4.39, see docs/SERVING.md). So
the same dispatcher is used here directly, in process: only validated jobs are enqueued, and
``VoteCounter`` returns a per-job result, so a failing job raises in its own request only.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from bentoml._internal.marshal.dispatcher import CorkDispatcher  # bentoml is pinned >=1.4.39,<1.5
from bentoml.exceptions import ServiceUnavailable

from serving.engine import NoiseJob, VoteCounter


def _overloaded() -> np.ndarray:
    raise ServiceUnavailable("the server is overloaded (queued noise jobs exceeded max_latency_ms); retry later")


class AdaptiveBatcher:
    """``await batcher(job)`` -> the job's class counts; jobs of concurrent requests share forward passes.

    ``jobs_per_batch``: most jobs in one forward pass (``batch_size // chunk_samples``).
    """

    def __init__(self, counter: VoteCounter, jobs_per_batch: int, max_latency_ms: int):
        self.counter = counter
        self._dispatcher: CorkDispatcher = CorkDispatcher(
            max_latency_in_ms=max_latency_ms, max_batch_size=jobs_per_batch, fallback=_overloaded,
            get_batch_size=lambda job: 1)
        self._call = None  # bound on first use, on the server's event loop

    def _evaluate(self, jobs: Sequence[NoiseJob]) -> list[np.ndarray | Exception]:
        return self.counter(jobs)

    async def __call__(self, job: NoiseJob) -> np.ndarray:
        if self._call is None:
            self._call = self._dispatcher(self._evaluate)
        return await self._call(job)

    def shutdown(self) -> None:
        self._dispatcher.shutdown()
