"""The server's forward passes: class counts for a list of noise jobs (``serving.compute.engine``), evaluated
together in shared passes, counted at once or launched and collected apart (``VoteCounter``)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from certify.core import Smooth
from serving.compute.engine import NoiseJob, StreamJob, host_image, noisy_copies


@dataclass(eq=False)
class LaunchedPass:
    """A pass whose forward passes are queued (``VoteCounter.launch``) and whose counts are not read yet: each
    job's counts or exception where known, and the predictions still to count (``collect``)."""

    results: list  # one per job: counts, an exception, or None (counted from ``predictions``)
    order: list[int]  # the jobs whose samples ``predictions`` holds, in order
    sizes: list[int]
    predictions: torch.Tensor | None  # on the host (being copied there on CUDA), or None
    ready: object | None = None  # a CUDA event recorded after the copy; None where nothing is pending


class VoteCounter:
    """Class counts for a list of noise jobs, evaluated together (forward passes of ``smooth.batch_size``).

    Called, it counts a list of jobs. Split in two (``launch``, then ``collect``), it queues a pass's work on the
    device and reads its counts later: on CUDA the scheduler (with ``overlap``) queues the next pass before it
    reads the last one's counts, so the device has the next pass's kernels when it finishes the last
    (``pipelined``: true on CUDA, where a launch returns before the device has computed)."""

    def __init__(self, smooth: Smooth, pipelined: bool | None = None):
        self.smooth = smooth
        self.pipelined = smooth.device.type == "cuda" if pipelined is None else pipelined

    def noisy_samples(self, job: NoiseJob | StreamJob, image: torch.Tensor | None = None) -> torch.Tensor:
        """Same draw as ``Smooth.sample_counts(job.image, job.num_samples, smooth.generator(job.seed))``; for a
        ``StreamJob``, its slice of its piece of the image's noise stream. ``image``: the job's image already on
        the smoother's device (``on_device``), if it was copied there."""
        if isinstance(job, StreamJob):
            return job.piece.samples(self.smooth, image)[job.start:job.start + job.num_samples]
        image = job.image.to(self.smooth.device) if image is None else image
        return noisy_copies(self.smooth, image, job.num_samples, self.smooth.generator(job.seed))

    def on_device(self, jobs: Sequence[NoiseJob | StreamJob]) -> dict[int, torch.Tensor]:
        """The images whose noise these jobs still draw, copied to the smoother's device together: one copy per
        pass instead of one per image, by ``id`` of the host image. On CUDA the copy is from pinned memory and
        queued, so launching a pass never waits for the passes queued before it (torch waits for the device after
        a copy from pageable memory). The same pixels either way; empty where the images are on the device
        already."""
        host: dict[int, torch.Tensor] = {}
        for job in jobs:
            if isinstance(job, StreamJob) and job.piece.drawn:
                continue
            image = host_image(job)
            if image.device != self.smooth.device:
                host.setdefault(id(image), image)
        if not host or len({image.shape for image in host.values()}) > 1:
            return {}
        stacked = torch.stack(list(host.values()))
        if self.smooth.device.type == "cuda":  # from pinned memory, queued: a copy from pageable memory would first
            stacked = stacked.pin_memory().to(self.smooth.device, non_blocking=True)  # wait for the queued passes
        else:
            stacked = stacked.to(self.smooth.device)
        return dict(zip(host, stacked.unbind(0), strict=True))

    def counts(self, predictions: torch.Tensor) -> np.ndarray:
        return torch.bincount(predictions, minlength=self.smooth.num_classes).cpu().numpy()

    def counts_per_job(self, predictions: torch.Tensor, sizes: list[int]) -> np.ndarray:
        """Class counts of consecutive runs of ``sizes`` predictions, one row per run: the predictions copied to the
        host once for the whole pass (on a GPU, one synchronisation instead of one per job) and counted there."""
        classes = self.smooth.num_classes
        owner = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        table = np.bincount(owner * classes + predictions.cpu().numpy(), minlength=len(sizes) * classes)
        return table.reshape(len(sizes), classes)

    def __call__(self, jobs: Sequence[NoiseJob | StreamJob]) -> list[np.ndarray | Exception]:
        return self.collect(self.launch(jobs))

    def launch(self, jobs: Sequence[NoiseJob | StreamJob]) -> LaunchedPass:
        """Draw the jobs' noise and run the forward passes; on CUDA the predictions' copy to pinned host memory is
        queued behind them and nothing waits for the device. A job that fails yields its own exception; if the
        shared pass fails, the jobs are evaluated one by one here (a failure stays with its job)."""
        results: list[np.ndarray | Exception | None] = [None] * len(jobs)
        samples: dict[int, torch.Tensor] = {}
        try:
            images = self.on_device(jobs)
        except Exception:  # noqa: BLE001 - copied job by job below, so a failure stays with its job
            images = {}
        for i, job in enumerate(jobs):
            try:
                samples[i] = self.noisy_samples(job, images.get(id(host_image(job))))
            except Exception as exc:  # noqa: BLE001 - the failure belongs to this job only
                results[i] = exc
        order = list(samples)
        if not order:
            return LaunchedPass(results, [], [], None)
        try:
            predicted = self.smooth.classify(torch.cat([samples[i] for i in order]))
            ready = None
            if predicted.device.type == "cuda":  # queued: the host reads it at ``collect``
                host = torch.empty(predicted.shape, dtype=predicted.dtype, pin_memory=True)
                host.copy_(predicted, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record()
                predicted = host
            return LaunchedPass(results, order, [jobs[i].num_samples for i in order], predicted, ready)
        except Exception:  # noqa: BLE001 - isolate: evaluate job by job, so a failure stays with its job
            for i in order:
                try:
                    results[i] = self.counts(self.smooth.classify(samples[i]))
                except Exception as exc:  # noqa: BLE001
                    results[i] = exc
            return LaunchedPass(results, [], [], None)

    def collect(self, launched: LaunchedPass) -> list[np.ndarray | Exception]:
        """The launched pass's counts (or exceptions), one per job: waits for the device where it is still
        computing; a failure that surfaces only now (an asynchronous CUDA error) fails the jobs counted here."""
        results = launched.results
        if launched.predictions is not None:
            try:
                if launched.ready is not None:
                    launched.ready.synchronize()
                for i, counts in zip(launched.order, self.counts_per_job(launched.predictions, launched.sizes),
                                     strict=True):
                    results[i] = counts
            except Exception as exc:  # noqa: BLE001 - the pass's failure belongs to the jobs it counted
                for i in launched.order:
                    results[i] = exc
        return results  # type: ignore[return-value]
