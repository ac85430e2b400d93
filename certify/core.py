"""Randomized smoothing (Cohen, Rosenfeld and Kolter, 2019) over an optional denoiser and a frozen classifier.

The smoothed classifier is g(x) = argmax_c P[f(D(x + e)) = c], e ~ N(0, sigma^2 I), where D is the denoiser
(identity when absent), f the base classifier, and pixels are in [0, 1]: noise is added before any normalisation.

- ``predict``: the top class by n noisy samples, or ABSTAIN unless a two-sided binomial test
  between the two top counts rejects a tie at level alpha (Cohen's PREDICT; the test is scipy's).
- ``certify``: select the top class with n0 samples, then estimate with n fresh samples a
  one-sided (1 - alpha) Clopper-Pearson lower bound pA (statsmodels' ``method="beta"`` bound);
  certified L2 radius sigma * Phi^-1(pA), or ABSTAIN when pA < 1/2 (Cohen's CERTIFY).
The selection and estimation samples are never shared.

Speed without changing the statistics: noisy samples of several images share forward passes (``sample_counts_many``),
noise is drawn on the device under ``torch.inference_mode``, convolutional models run channels-last on CPU, and on a
multi-core CPU passes run in worker threads of one torch thread each. Counts are sums: they do not depend on the order
in which passes finish. Each image's noise comes from its own generator in pieces whose size depends only on the image
shape, so it does not depend on the batch size, the images packed with it, or sharding. Noise and counts are float32
/ int64 (``noise="sound"``: exact integer grid noise, :mod:`certify.sound_noise`); the forward pass runs at
``precision`` (float32, or bfloat16 / float16 autocast), optionally ``torch.compile``d: a slightly different base
classifier, certified exactly as validly (:mod:`certify.numerics`, docs/CERTIFY.md).
"""
from __future__ import annotations

import copy
import math
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from certify import numerics, sound_noise
from certify.adaptive import AdaptiveCertificate, adaptive_certificate, adaptive_many, sequential_rule
from certify.decisions import (
    ABSTAIN,
    Certificate,
    certificate_from_counts,
    clopper_pearson_lower,
    image_seed,
    max_certifiable_radius,
    prediction_from_counts,
    radius_from_p_lower,
    validate_sampling,
)
from transdenoiser.errors import UserError

__all__ = ["ABSTAIN", "AdaptiveCertificate", "Certificate", "Smooth", "adaptive_certificate", "adaptive_many",
           "certificate_from_counts", "clopper_pearson_lower", "image_seed", "max_certifiable_radius",
           "prediction_from_counts", "radius_from_p_lower", "sequential_rule", "validate_sampling"]

PASS_SIZE_STEPS = 16  # eager CUDA passes are padded to a multiple of batch_size / 16 (padded_pass_size)
NOISE_PIECE_ELEMENTS = 1 << 20  # noise is drawn per image in pieces of about this many numbers (4 MiB of float32)
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")
MAX_AUTO_WORKERS = 8  # ``workers="auto"`` on CPU: one worker per torch thread, at most this many


def _has_conv2d(*models: nn.Module | None) -> bool:
    return any(isinstance(m, nn.modules.conv._ConvNd) and m.weight.dim() == 4
               for model in models if model is not None for m in model.modules())


def padded_pass_size(size: int, batch_size: int, compiled: bool, device_type: str) -> int:
    """Rows a forward pass of ``size`` <= ``batch_size`` samples is run with (zero rows added, their logits dropped).

    Compiled: ``batch_size``, so one static-shape graph computes every sample (no recompilation per tail size, and
    never torch's eager fallback past its recompile limit, which would make the base classifier a mix of two
    functions). Eager on CUDA: rounded up to one of a few sizes (powers of two up to ``batch_size /``
    :data:`PASS_SIZE_STEPS`, then its multiples), because cuDNN sets up each new input shape (a plan per
    convolution) and the adaptive modes make passes of ever new sizes. Elsewhere (CPU): ``size``, since a CPU pass
    costs in proportion to its rows."""
    if compiled:
        return batch_size
    if device_type != "cuda" or size >= batch_size:
        return size
    step = max(1, batch_size // PASS_SIZE_STEPS)
    if size > step:
        return min(batch_size, -(-size // step) * step)
    return min(step, 1 << max(0, size - 1).bit_length())


def _to_host_later(t: torch.Tensor) -> Callable[[], np.ndarray]:
    """A callable returning ``t`` as a numpy array. On CUDA the copy to the host is queued now (into pinned memory,
    behind the work that computes ``t``) and the callable waits for it alone; elsewhere ``t`` is ready."""
    if t.device.type != "cuda":
        array = t.cpu().numpy()
        return lambda: array
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def wait() -> np.ndarray:
        done.synchronize()
        return host.numpy()
    return wait


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without waiting for the device: on CUDA a copy from pinned memory, queued
    behind the work already sent (a copy from pageable memory waits for that work to finish first)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class _BasePipeline(nn.Module):
    """f(D(x)): the denoiser (if any) then the classifier, as one module (what ``torch.compile`` compiles)."""

    def __init__(self, classifier: nn.Module, denoiser: nn.Module | None):
        super().__init__()
        self.classifier = classifier
        self.denoiser = denoiser

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.denoiser(x) if self.denoiser is not None else x)


def _start_worker(threads: int, nice: int) -> None:
    """A forward-pass worker thread's set-up: its torch CPU threads, and its niceness raised by ``nice`` (Linux:
    per thread; the OpenMP threads it starts inherit it)."""
    torch.set_num_threads(threads)
    if nice and sys.platform == "linux":
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + nice))


class Smooth:
    """A smoothed classifier over ``classifier`` with ``denoiser`` in front (both frozen, eval mode).

    ``sigma``: standard deviation of the Gaussian noise, in [0,1]-pixel units.
    ``batch_size``: noisy samples evaluated per forward pass (several images' samples share a pass).
    ``memory_format``: ``auto`` runs convolutional models in channels-last format on CPU (about 2x
    faster there), and on CUDA only when compiled (:func:`certify.numerics.default_memory_format`);
    the models are then copied, never changed in place.
    ``workers``: forward passes run side by side in this many threads, the torch CPU threads shared
    out among them; ``auto`` is one per torch thread (at most 8) on CPU and 1 on other devices.
    ``precision``: ``fp32`` (default), ``bf16`` or ``fp16``: the forward pass runs under autocast to that
    dtype (refused, one line, where this torch cannot do it on the device). ``compile``: run the pipeline
    through ``torch.compile``. Both make the base classifier a (slightly) different function: certificates
    are about the pipeline as run (docs/CERTIFY.md, "Precision and compilation"). ``noise``: ``gaussian``
    (float32 ``x + sigma * randn``) or ``sound`` (8-bit grid inputs, exact integer noise: :mod:`certify.sound_noise`).
    ``worker_nice``: with worker threads (CPU), raise each one's niceness by this much (0-19; Linux, where
    niceness is per thread; elsewhere ignored), so that the process's other threads, e.g. a server's event loop,
    get the cores first while passes run. Values are unchanged; only the scheduling.
    """

    def __init__(self, classifier: nn.Module, num_classes: int, sigma: float, denoiser: nn.Module | None = None,
                 batch_size: int = 1000, device: torch.device | str | None = None, memory_format: str = "auto",
                 workers: int | str = "auto", precision: str = "fp32", compile: bool = False, noise: str = "gaussian",
                 worker_nice: int = 0):
        if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
            raise UserError(f"sigma must be > 0, got {sigma}")
        if num_classes < 2:
            raise UserError(f"num_classes must be >= 2, got {num_classes}")
        if batch_size < 1:
            raise UserError(f"batch size must be >= 1, got {batch_size}")
        if memory_format not in MEMORY_FORMATS:
            raise UserError(f"memory format must be one of {', '.join(MEMORY_FORMATS)}, got {memory_format!r}")
        if workers != "auto" and not (isinstance(workers, int) and workers >= 1):
            raise UserError(f"workers must be 'auto' or an integer >= 1, got {workers!r}")
        if not isinstance(compile, bool):
            raise UserError(f"compile must be true or false, got {compile!r}")
        if not (isinstance(worker_nice, int) and not isinstance(worker_nice, bool) and 0 <= worker_nice <= 19):
            raise UserError(f"worker_nice must be an integer from 0 to 19, got {worker_nice!r}")
        self.worker_nice = worker_nice
        self.device = torch.device(device) if device is not None else next(classifier.parameters()).device
        self.precision = numerics.check_precision_supported(self.device, precision)
        self.compile = compile
        self.noise = sound_noise.check_noise_kind(noise)
        self._grid_noise = sound_noise.sampler(float(sigma)) if noise == "sound" else None
        classifier = classifier.to(self.device).eval()
        denoiser = denoiser.to(self.device).eval() if denoiser is not None else None
        if memory_format == "auto":
            memory_format = numerics.default_memory_format(self.device, compile, _has_conv2d(classifier, denoiser))
        if memory_format == "channels_last":
            classifier = copy.deepcopy(classifier).to(memory_format=torch.channels_last)
            if denoiser is not None:
                denoiser = copy.deepcopy(denoiser).to(memory_format=torch.channels_last)
        self.classifier = classifier
        self.denoiser = denoiser
        self.memory_format = memory_format
        self.base_pipeline = _BasePipeline(classifier, denoiser).eval()  # eager, whatever ``compile`` says
        self._forward = numerics.compile_module(self.base_pipeline) if compile else self.base_pipeline
        self.num_classes = num_classes
        self.sigma = float(sigma)
        self.batch_size = batch_size
        if workers == "auto":
            workers = min(torch.get_num_threads(), MAX_AUTO_WORKERS) if self.device.type == "cpu" else 1
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            threads_each = max(1, torch.get_num_threads() // self.workers)
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="smooth-forward",
                                            initializer=_start_worker, initargs=(threads_each, self.worker_nice))
        return self._pool

    @contextmanager
    def _serial_caller(self) -> Iterator[None]:
        """While forward passes run in CPU worker threads, the calling thread's own torch ops (noise, counting) run on
        one thread: the workers hold the cores, and an intra-op team there would wait for a descheduled thread and
        spin on cores the workers need. Exact: those ops give the same values on any number of threads (tested).
        torch's CPU thread count is per thread (OpenMP), so the workers and other threads are unaffected."""
        if self.workers == 1 or self.device.type != "cpu":
            yield
            return
        self._executor()  # sized from this thread's count before it drops
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def close(self) -> None:
        """Stop the worker threads (they are started again if needed)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _predict_classes(self, batch: torch.Tensor) -> torch.Tensor:
        return self.base_logits(batch).argmax(dim=1)

    def _pass_size(self, total: int) -> int:
        """Samples per forward pass for ``total`` samples: at most ``batch_size``, and as even a split as that allows
        into a number of passes that is a multiple of ``workers``, so that the workers finish together (200 samples at
        a batch of 64 on 2 workers: 4 passes of 50, not 64, 64, 64 and 8, where one worker computes 128 samples while
        the other waits after 72). Results do not depend on the split (tested)."""
        if self.workers == 1 or self.compile:  # compiled passes are padded to batch_size anyway
            return self.batch_size
        passes = max(1, math.ceil(math.ceil(total / self.batch_size) / self.workers)) * self.workers
        return max(1, math.ceil(total / passes))

    def classify(self, samples: torch.Tensor) -> torch.Tensor:
        """The base pipeline's class for each of ``samples`` (N, C, H, W), in forward passes of at most
        ``batch_size`` samples spread over the workers; returned in the order of ``samples``."""
        parts = samples.split(self._pass_size(len(samples)))
        if self.workers > 1 and len(parts) > 1:
            return torch.cat(list(self._executor().map(self._predict_classes, parts)))
        return torch.cat([self._predict_classes(part) for part in parts])

    def generator(self, seed: int) -> torch.Generator:
        """A generator on this smoother's device: same seed, same noise, same result."""
        return torch.Generator(device=self.device).manual_seed(seed)

    def image_generator(self, seed: int, idx: int) -> torch.Generator:
        """The generator of image ``idx`` in a run seeded with ``seed`` (see :func:`image_seed`)."""
        return self.generator(image_seed(seed, idx))

    def describe(self) -> str:
        """How the base classifier is run, in one line (precision, compilation, memory format)."""
        return numerics.describe(self.precision, self.compile, self.memory_format, self.noise)

    @torch.inference_mode()
    def base_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the base pipeline f(D(x)) for a batch ``x`` (no noise added here), as run: at ``precision``
        (returned as float32) and compiled if asked. A pass is run at the size :func:`padded_pass_size` gives,
        zero rows added and their logits dropped."""
        if not self.compile and (self.device.type != "cuda" or len(x) >= self.batch_size):
            return self._run(x)
        logits = []
        for part in x.split(self.batch_size):
            size = part.shape[0]
            rows = padded_pass_size(size, self.batch_size, self.compile, self.device.type)
            if size < rows:
                part = torch.cat([part, part.new_zeros((rows - size, *part.shape[1:]))])
            logits.append(self._run(part)[:size])
        return torch.cat(logits)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        if self.memory_format == "channels_last" and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with numerics.autocast(self.device, self.precision):
            logits = self._forward(x)
        return logits.float()

    @torch.inference_mode()
    def sample_counts(self, x: torch.Tensor, num: int, generator: torch.Generator | None = None) -> np.ndarray:
        """Class counts of f(D(x + e)) over ``num`` noise draws for one image ``x`` (C, H, W)."""
        return self.sample_counts_many(x.unsqueeze(0), [num], [generator])[0, 0]

    @torch.inference_mode()
    def sample_counts_many(self, images: torch.Tensor, phases: Sequence[int],
                           generators: Sequence[torch.Generator | None]) -> np.ndarray:
        """Class counts for several images and several sampling phases, packed into shared forward passes.

        ``images`` (B, C, H, W); ``phases`` the number of noise draws in each phase (e.g. ``[n0, n]``);
        ``generators`` one per image. Returns int64 counts of shape (B, len(phases), num_classes).
        Each image draws its phases in order from its own generator, fresh draws each time: phase
        samples are never shared. The noise depends on the generator alone (pieces of a fixed
        size per image shape), not on ``batch_size`` or on the other images.
        """
        draws = [(int(num), [int(num)]) for num in phases]
        return self._count(images, draws, generators).reshape(images.shape[0], len(phases), self.num_classes)

    @torch.inference_mode()
    def sample_counts_segments(self, images: torch.Tensor, draw: int, segments: Sequence[int],
                               generators: Sequence[torch.Generator | None]) -> np.ndarray:
        """Each image draws ``draw`` noise samples (one phase, as :meth:`sample_counts_many` draws it), evaluates the
        first ``sum(segments)`` and counts them per consecutive segment: int64 counts (B, len(segments), classes).
        The draw is cut into the same pieces whatever the segments; a piece holding an evaluated sample is drawn in
        full, the pieces after the last one are not drawn (nothing is drawn from the generator after them: this is
        a stream's last block)."""
        return self.queue_counts_segments(images, draw, segments, generators)()

    @torch.inference_mode()
    def queue_counts_segments(self, images: torch.Tensor, draw: int, segments: Sequence[int],
                              generators: Sequence[torch.Generator | None]) -> Callable[[], np.ndarray]:
        """:meth:`sample_counts_segments` with its work queued: returns a callable that waits for it and returns the
        counts. On CUDA nothing here waits for the device (the noise, the passes and the counting are queued, and the
        counts come back by an asynchronous copy), so the caller can queue more before reading these."""
        return self.queue_counts_blocks(images, [(draw, segments)], generators)

    @torch.inference_mode()
    def queue_counts_blocks(self, images: torch.Tensor, blocks: Sequence[tuple[int, Sequence[int]]],
                            generators: Sequence[torch.Generator | None]) -> Callable[[], np.ndarray]:
        """:meth:`queue_counts_segments` for several consecutive draws of each image, [(draw, segments), ...], made in
        order exactly as that many calls would make them (same pieces, same noise) but packed into shared forward
        passes; counts (B, total segments, classes). Only the last draw may leave samples unevaluated."""
        draws = []
        for k, (draw, segments) in enumerate(blocks):
            segments = [int(m) for m in segments]
            if any(m < 1 for m in segments) or sum(segments) > draw or (k + 1 < len(blocks) and sum(segments) < draw):
                raise ValueError(f"segments {segments} do not fit in draw {k} of {draw} samples")
            draws.append((int(draw), segments))
        counts = self._queue_count(images, draws, generators)
        shape = (images.shape[0], sum(len(segments) for _, segments in draws), self.num_classes)
        return lambda: counts().reshape(shape)

    def take_rows(self, images: torch.Tensor, rows: Sequence[int] | np.ndarray) -> torch.Tensor:
        """``images[rows]`` moved to this smoother's device, the row indices sent without waiting for the device."""
        images = images.to(self.device)
        return images[_to_device(torch.as_tensor(np.asarray(rows), dtype=torch.long), self.device)]

    def _count(self, images: torch.Tensor, draws: Sequence[tuple[int, Sequence[int]]],
               generators: Sequence[torch.Generator | None]) -> np.ndarray:
        """Counts per (image, segment) for ``draws`` [(samples drawn, [segment sizes counted]), ...] made by every
        image in order, packed into shared forward passes; int64 (B, total segments, num_classes)."""
        return self._queue_count(images, draws, generators)()

    def _queue_count(self, images: torch.Tensor, draws: Sequence[tuple[int, Sequence[int]]],
                     generators: Sequence[torch.Generator | None]) -> Callable[[], np.ndarray]:
        """:meth:`_count` with its work queued (:meth:`queue_counts_segments`)."""
        if images.dim() != 4:
            raise UserError(f"expected a batch of images (B, C, H, W), got shape {tuple(images.shape)}")
        if len(generators) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(generators)} generators")
        images = images.to(self.device)
        levels = sound_noise.grid_levels(images) if self._grid_noise is not None else None  # refuses off-grid input
        with self._serial_caller():
            return _to_host_later(self._count_packed(images, levels, draws, generators))

    def _count_packed(self, images: torch.Tensor, levels: torch.Tensor | None,
                      draws: Sequence[tuple[int, Sequence[int]]],
                      generators: Sequence[torch.Generator | None]) -> torch.Tensor:
        per_image = sum(len(segments) for _, segments in draws)
        counts = torch.zeros(images.shape[0] * per_image * self.num_classes, dtype=torch.long, device=self.device)
        piece = max(1, NOISE_PIECE_ELEMENTS // images[0].numel())
        pass_size = self._pass_size(images.shape[0] * sum(sum(segments) for _, segments in draws))
        pending: list[torch.Tensor] = []  # noisy samples waiting for a forward pass
        pending_slots: deque[tuple[int, int]] = deque()  # (slot, number of samples), in the order of ``pending``
        in_flight: deque[tuple[Future | torch.Tensor, torch.Tensor]] = deque()  # (predictions, slot of each)

        def collect(limit: int) -> None:
            # index_add_, not bincount: on CUDA bincount reads its input's maximum back to the host, a wait for the
            # pass that keeps the host from queueing the next one (integer adds: the same counts in any order)
            while len(in_flight) > limit:
                predictions, slot_ids = in_flight.popleft()
                if isinstance(predictions, Future):
                    predictions = predictions.result()
                votes = slot_ids * self.num_classes + predictions
                counts.index_add_(0, votes, torch.ones_like(votes))

        def forward(take: int) -> None:
            batch = pending[0] if len(pending) == 1 else torch.cat(pending)
            slots, sizes, left = [], [], take
            while left > 0:
                slot, size = pending_slots[0]
                used = min(size, left)
                slots.append(slot)
                sizes.append(used)
                left -= used
                if used == size:
                    pending_slots.popleft()
                else:
                    pending_slots[0] = (slot, size - used)
            slot_ids = _to_device(torch.repeat_interleave(torch.tensor(slots), torch.tensor(sizes)), self.device)
            if self.workers > 1:
                collect(self.workers)  # at most workers + 1 passes in flight: bounded memory
                in_flight.append((self._executor().submit(self._predict_classes, batch[:take]), slot_ids))
            else:
                in_flight.append((self._predict_classes(batch[:take]), slot_ids))
                collect(0)
            pending.clear()
            if take < batch.shape[0]:
                pending.append(batch[take:])

        queued = 0
        for j in range(images.shape[0]):
            slot = j * per_image
            for drawn, segments in draws:
                to_count = deque((slot + k, int(m)) for k, m in enumerate(segments))
                slot += len(segments)
                remaining, evaluated = int(drawn), sum(segments)
                while remaining > 0 and evaluated > 0:  # pieces past the evaluated samples are not drawn
                    size = min(piece, remaining)
                    if levels is not None:  # exact: integer levels plus integer noise, then one division
                        noisy = self._grid_noise.noisy(levels[j], size, generators[j], images.dtype)
                    else:
                        noisy = torch.randn((size, *images.shape[1:]), generator=generators[j], device=self.device,
                                            dtype=images.dtype)
                    remaining -= size
                    take = min(size, evaluated)
                    evaluated -= take
                    if take < size:
                        noisy = noisy[:take]
                    pending.append(noisy if levels is not None else noisy.mul_(self.sigma).add_(images[j]))
                    left = take
                    while left > 0:
                        target, wanted = to_count[0]
                        used = min(wanted, left)
                        pending_slots.append((target, used))
                        left -= used
                        if used == wanted:
                            to_count.popleft()
                        else:
                            to_count[0] = (target, wanted - used)
                    queued += take
                    while queued >= pass_size:
                        forward(pass_size)
                        queued -= pass_size
        if queued > 0:
            forward(queued)
        collect(0)
        return counts.view(images.shape[0], per_image, self.num_classes)

    def predict(self, x: torch.Tensor, n: int, alpha: float, generator: torch.Generator | None = None) -> int:
        """Top class of the smoothed classifier at ``x``, or ABSTAIN; wrong with probability at most alpha."""
        return self.predict_many(x.unsqueeze(0), n, alpha, [generator])[0]

    def predict_many(self, images: torch.Tensor, n: int, alpha: float,
                     generators: Sequence[torch.Generator | None]) -> list[int]:
        """:meth:`predict` for a batch of images (B, C, H, W), their noisy samples packed together."""
        validate_sampling(None, n, alpha)
        counts = self.sample_counts_many(images, [n], generators)
        return [prediction_from_counts(c[0], alpha) for c in counts]

    def certify(self, x: torch.Tensor, n0: int, n: int, alpha: float,
                generator: torch.Generator | None = None) -> Certificate:
        """Certify ``x``: a class with an L2 radius that holds with probability >= 1 - alpha, or ABSTAIN."""
        return self.certify_many(x.unsqueeze(0), n0, n, alpha, [generator])[0]

    def certify_many(self, images: torch.Tensor, n0: int, n: int, alpha: float,
                     generators: Sequence[torch.Generator | None]) -> list[Certificate]:
        """:meth:`certify` for a batch of images (B, C, H, W), their noisy samples packed together.

        Per image, n0 selection draws come first, then n fresh estimation draws (counts kept apart).
        """
        validate_sampling(n0, n, alpha)
        counts = self.sample_counts_many(images, [n0, n], generators)
        return [certificate_from_counts(c[0], c[1], alpha, self.sigma) for c in counts]

    def decide(self, x: torch.Tensor, radius: float, n0: int, n_max: int, alpha: float,
               generator: torch.Generator | None = None, method: str | None = None) -> AdaptiveCertificate:
        """Is the smoothed prediction at ``x`` certified at L2 ``radius``? Select a class with n0 samples, then draw
        fresh estimation samples in rounds until an anytime-valid lower bound on pA reaches Phi(radius / sigma)
        (certified), an anytime-valid upper bound falls below it (not certified), or ``n_max`` are spent.
        The answer is wrong with probability at most ``alpha`` (docs/CERTIFY.md, "Adaptive certification");
        "not certified" is a statement about the selected class only."""
        return self.decide_many(x.unsqueeze(0), radius, n0, n_max, alpha, [generator], method)[0]

    def decide_many(self, images: torch.Tensor, radius: float, n0: int, n_max: int, alpha: float,
                    generators: Sequence[torch.Generator | None], method: str | None = None
                    ) -> list[AdaptiveCertificate]:
        """:meth:`decide` for a batch of images (B, C, H, W); the images' rounds share forward passes."""
        rule = sequential_rule("decide", self.sigma, n_max, alpha, radius=radius, method=method)
        return adaptive_many(self, images, n0, rule, generators)

    def certify_adaptive(self, x: torch.Tensor, n0: int, n_max: int, alpha: float,
                         generator: torch.Generator | None = None, tolerance: float | None = None,
                         method: str | None = None) -> AdaptiveCertificate:
        """Cohen's CERTIFY with at most ``n_max`` estimation samples, drawn in rounds: stop once more samples
        cannot raise the certified radius by more than ``tolerance`` (default
        :data:`certify.sequential.DEFAULT_TOLERANCE`). The radius comes from an anytime-valid lower bound on
        pA and holds with probability >= 1 - alpha wherever the procedure stopped."""
        return self.certify_adaptive_many(x.unsqueeze(0), n0, n_max, alpha, [generator], tolerance, method)[0]

    def certify_adaptive_many(self, images: torch.Tensor, n0: int, n_max: int, alpha: float,
                              generators: Sequence[torch.Generator | None], tolerance: float | None = None,
                              method: str | None = None) -> list[AdaptiveCertificate]:
        """:meth:`certify_adaptive` for a batch of images (B, C, H, W)."""
        rule = sequential_rule("estimate", self.sigma, n_max, alpha, tolerance=tolerance, method=method)
        return adaptive_many(self, images, n0, rule, generators)
