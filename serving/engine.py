"""Certification for the server: Cohen's CERTIFY split into noise jobs that concurrent requests can share.

Each image of a request becomes *noise jobs* of at most ``chunk_samples`` noisy samples: selection
jobs (``n0`` samples in total) and estimation jobs (``n`` samples), never sharing a draw. Every job
carries its own seed, derived from the request seed, the image index, the phase and the chunk index,
so a request's certificates depend on its seed only, never on which other requests shared its forward
passes. ``VoteCounter`` evaluates any list of jobs in shared forward passes; a job that fails yields its
own exception and never another job's. The certificate is ``certify.core.certificate_from_counts``
(Clopper-Pearson lower bound pA, radius sigma * Phi^-1(pA), abstain when pA < 1/2).
"""
from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio
import numpy as np
import torch

from certify.core import Certificate, Smooth, certificate_from_counts

SELECTION, ESTIMATION = 0, 1
MAX_SEED = 2**63 - 1  # torch generators take seeds in [0, 2^64); JSON clients handle 63 bits safely


@dataclass(frozen=True)
class NoiseJob:
    """``num_samples`` draws of f(D(image + e)), e ~ N(0, sigma^2 I) from a generator seeded with ``seed``."""

    image: torch.Tensor  # (C, H, W), float32 in [0, 1], validated
    num_samples: int
    seed: int


def job_seed(request_seed: int, image_index: int, phase: int, chunk_index: int) -> int:
    """A seed for one job, independent across (image, phase, chunk) (NumPy's SeedSequence hashing)."""
    state = np.random.SeedSequence([request_seed, image_index, phase, chunk_index]).generate_state(2, np.uint32)
    return (int(state[0]) << 32 | int(state[1])) & MAX_SEED


def fresh_seed() -> int:
    """A request seed from the operating system's CSPRNG: noise no client can predict or choose."""
    return secrets.randbelow(MAX_SEED + 1)


class VoteCounter:
    """Class counts for a list of noise jobs, evaluated together (forward passes of ``smooth.batch_size``)."""

    def __init__(self, smooth: Smooth):
        self.smooth = smooth

    def noisy_samples(self, job: NoiseJob) -> torch.Tensor:
        """Same draw as ``Smooth.sample_counts(job.image, job.num_samples, smooth.generator(job.seed))``."""
        device = self.smooth.device
        image = job.image.to(device)
        generator = self.smooth.generator(job.seed)
        batch = image.unsqueeze(0).expand(job.num_samples, *image.shape)
        noise = torch.randn(batch.shape, generator=generator, device=device, dtype=image.dtype)
        return batch + noise * self.smooth.sigma

    def counts(self, predictions: torch.Tensor) -> np.ndarray:
        return torch.bincount(predictions, minlength=self.smooth.num_classes).cpu().numpy()

    def __call__(self, jobs: Sequence[NoiseJob]) -> list[np.ndarray | Exception]:
        results: list[np.ndarray | Exception | None] = [None] * len(jobs)
        samples: dict[int, torch.Tensor] = {}
        for i, job in enumerate(jobs):
            try:
                samples[i] = self.noisy_samples(job)
            except Exception as exc:  # noqa: BLE001 - the failure belongs to this job only
                results[i] = exc
        if samples:
            order = list(samples)
            try:
                predicted = self.smooth.classify(torch.cat([samples[i] for i in order]))
                for i, part in zip(order, predicted.split([jobs[i].num_samples for i in order]), strict=True):
                    results[i] = self.counts(part)
            except Exception:  # noqa: BLE001 - isolate: evaluate job by job, so a failure stays with its job
                for i in order:
                    try:
                        results[i] = self.counts(self.smooth.classify(samples[i]))
                    except Exception as exc:  # noqa: BLE001
                        results[i] = exc
        return results  # type: ignore[return-value]


def plan_jobs(images: torch.Tensor, n0: int, n: int, chunk_samples: int, request_seed: int,
              ) -> list[tuple[int, int, NoiseJob]]:
    """(image index, phase, job) for every chunk of every image's selection and estimation samples."""
    plan = []
    for index, image in enumerate(images):
        for phase, total in ((SELECTION, n0), (ESTIMATION, n)):
            for chunk, start in enumerate(range(0, total, chunk_samples)):
                size = min(chunk_samples, total - start)
                plan.append((index, phase, NoiseJob(image, size, job_seed(request_seed, index, phase, chunk))))
    return plan


JobRunner = Callable[[NoiseJob], Awaitable[np.ndarray]]


class ServingCertifier:
    """Certifies the images of one request, with jobs run by an adaptive batcher or one request at a time."""

    def __init__(self, smooth: Smooth, n0: int, alpha: float, chunk_samples: int,
                 job_runner: JobRunner | None = None, pass_samples: int | None = None):
        self.smooth = smooth
        self.pass_samples = pass_samples or smooth.batch_size  # samples counted together, one request at a time
        self.n0 = n0
        self.alpha = alpha
        self.chunk_samples = chunk_samples
        self.counter = VoteCounter(smooth)
        self.job_runner = job_runner  # None: the request's jobs run together, one request at a time
        self._one_at_a_time: anyio.CapacityLimiter | None = None  # made on the server's event loop

    def _count_pass_by_pass(self, jobs: list[NoiseJob]) -> list[np.ndarray | Exception]:
        """Jobs counted one forward pass's worth at a time: a large request never holds all its noisy samples
        in memory at once (16 images at n = 10,000 would be 161,600 samples). Same jobs, same seeds, same counts."""
        per_pass = max(1, self.pass_samples // self.chunk_samples)
        results: list[np.ndarray | Exception] = []
        for start in range(0, len(jobs), per_pass):
            results.extend(self.counter(jobs[start:start + per_pass]))
        return results

    async def _counts(self, jobs: list[NoiseJob]) -> list[np.ndarray]:
        if self.job_runner is not None:
            return list(await asyncio.gather(*(self.job_runner(job) for job in jobs)))
        if self._one_at_a_time is None:
            self._one_at_a_time = anyio.CapacityLimiter(1)
        results = await anyio.to_thread.run_sync(self._count_pass_by_pass, jobs, limiter=self._one_at_a_time)
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    async def certify(self, images: torch.Tensor, n: int, request_seed: int) -> list[Certificate]:
        """One certificate per image of ``images`` (K, C, H, W), from fresh samples seeded by ``request_seed``."""
        plan = plan_jobs(images, self.n0, n, self.chunk_samples, request_seed)
        counts = await self._counts([job for _, _, job in plan])
        totals = np.zeros((len(images), 2, self.smooth.num_classes), dtype=np.int64)
        for (index, phase, _), job_counts in zip(plan, counts, strict=True):
            totals[index, phase] += job_counts
        return [certificate_from_counts(totals[i, SELECTION], totals[i, ESTIMATION], self.alpha, self.smooth.sigma)
                for i in range(len(images))]
