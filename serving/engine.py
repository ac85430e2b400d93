"""Certification for the server: Cohen's CERTIFY split into noise jobs that a scheduler computes pass by pass.

Each image of a request becomes *noise jobs* of at most ``chunk_samples`` noisy samples: selection
jobs (``n0`` samples in total) and estimation jobs (``n`` samples), never sharing a draw. Every job
carries its own seed, derived from the image's noise seed (``serving.noise``), the phase and the chunk
index, so a certificate depends on the image's seed only, never on how the jobs were grouped into forward
passes or which other requests shared them. ``VoteCounter`` evaluates any list of jobs in shared forward
passes; a job that fails yields its own exception and never another job's. ``CertifyWork`` is the work of
one certify request for ``serving.scheduler.FairScheduler``; its certificate is
``certify.core.certificate_from_counts`` (Clopper-Pearson lower bound pA, radius sigma * Phi^-1(pA),
abstain when pA < 1/2), the same rule as ``certify.core.Smooth.certify``.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from certify.core import Certificate, Smooth, certificate_from_counts
from serving.noise import MAX_SEED

SELECTION, ESTIMATION = 0, 1


@dataclass(frozen=True)
class NoiseJob:
    """``num_samples`` draws of f(D(image + e)), e ~ N(0, sigma^2 I) from a generator seeded with ``seed``."""

    image: torch.Tensor  # (C, H, W), float32 in [0, 1], validated
    num_samples: int
    seed: int


def job_seed(image_seed: int, phase: int, chunk_index: int) -> int:
    """A seed for one job, independent across (phase, chunk) for one image seed (NumPy's SeedSequence hashing)."""
    state = np.random.SeedSequence([image_seed, phase, chunk_index]).generate_state(2, np.uint32)
    return (int(state[0]) << 32 | int(state[1])) & MAX_SEED


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


def plan_jobs(images: torch.Tensor, image_seeds: Sequence[int], n0: int, n: int, chunk_samples: int,
              ) -> list[tuple[int, int, NoiseJob]]:
    """(image index, phase, job) for every chunk of every image's selection and estimation samples."""
    plan = []
    for index, (image, seed) in enumerate(zip(images, image_seeds, strict=True)):
        for phase, total in ((SELECTION, n0), (ESTIMATION, n)):
            for chunk, start in enumerate(range(0, total, chunk_samples)):
                size = min(chunk_samples, total - start)
                plan.append((index, phase, NoiseJob(image, size, job_seed(seed, phase, chunk))))
    return plan


class CertifyWork:
    """The work of one certify request for the scheduler: every image's selection and estimation jobs, in
    image order; ``result()`` gives one certificate per image once every job's counts are in."""

    kind = "certify"

    def __init__(self, images: torch.Tensor, image_seeds: Sequence[int], n0: int, n: int, alpha: float,
                 sigma: float, num_classes: int, chunk_samples: int):
        self.alpha, self.sigma = alpha, sigma
        self.image_seeds = list(image_seeds)
        self._pending: deque[tuple[tuple[int, int], NoiseJob]] = deque(
            ((index, phase), job) for index, phase, job in plan_jobs(images, image_seeds, n0, n, chunk_samples))
        self._totals = np.zeros((len(images), 2, num_classes), dtype=np.int64)
        self._outstanding = 0  # jobs handed out whose counts are not in yet
        self.planned_samples = len(images) * (n0 + n)
        self.samples_left = self.planned_samples  # not yet handed out

    def take(self, max_samples: int) -> list[tuple[tuple[int, int], NoiseJob]]:
        """The next jobs, at most ``max_samples`` samples in all (always at least one job while any is left)."""
        taken, total = [], 0
        while self._pending and (not taken or total + self._pending[0][1].num_samples <= max_samples):
            key, job = self._pending.popleft()
            taken.append((key, job))
            total += job.num_samples
        self._outstanding += len(taken)
        self.samples_left -= total
        return taken

    def add(self, key: tuple[int, int], counts: np.ndarray) -> None:
        index, phase = key
        self._totals[index, phase] += counts
        self._outstanding -= 1

    @property
    def finished(self) -> bool:
        return not self._pending and self._outstanding == 0

    def result(self) -> list[Certificate]:
        return [certificate_from_counts(totals[SELECTION], totals[ESTIMATION], self.alpha, self.sigma)
                for totals in self._totals]
