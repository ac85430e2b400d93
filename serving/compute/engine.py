"""Certification for the server: the work of a request, split into noise jobs that a scheduler computes pass by pass.

``SequentialWork`` answers every request kind the server takes (``certify``, a fixed n; ``decide`` at a radius;
``estimate`` the largest radius under a budget) from each image's one stream (docs/SERVING.md, "One image, one
test"): selection samples, then estimation samples block by block of the offline rule (``certify.streams``), each
image's noise drawn exactly as ``Smooth.decide`` / ``Smooth.certify_adaptive`` draw it from a generator seeded with
the image's noise seed, so an answer depends on that seed only, never on how the jobs were grouped into forward
passes or which other requests shared them (``serving.compute.counter.VoteCounter`` evaluates any list of jobs in
shared forward passes; a job that fails yields its own exception and never another job's).

``CertifyWork`` is Cohen's CERTIFY as scheduler work (independent per-chunk seeds derived from the image's seed,
``certify.core.certificate_from_counts``): the simplest work of the scheduler's protocol, which its tests and
benchmarks drive; the server no longer answers requests with it.
"""
from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from certify import sound_noise
from certify.adaptive import rule_mode
from certify.confidence import DEFAULT_FIRST_LOOK, DEFAULT_LOOK_RATIO, DEFAULT_LOOK_STEP, geometric_looks
from certify.core import NOISE_PIECE_ELEMENTS, Certificate, Smooth, adaptive_certificate, certificate_from_counts
from certify.ladder import RadiusLadder, ladder
from certify.streams import BlockPlan, SequentialTest
from serving.compute.noise import MAX_SEED

SELECTION, ESTIMATION = 0, 1


@dataclass(frozen=True)
class NoiseJob:
    """``num_samples`` draws of f(D(image + e)), e ~ N(0, sigma^2 I) from a generator seeded with ``seed``."""

    image: torch.Tensor  # (C, H, W), float32 in [0, 1], validated
    num_samples: int
    seed: int


def noisy_copies(smooth: Smooth, image: torch.Tensor, num_samples: int, generator: torch.Generator) -> torch.Tensor:
    """``num_samples`` noisy copies of ``image`` (on the smoother's device), drawn as ``Smooth.sample_counts_many``
    draws one piece: float32 ``image + sigma * randn``, or with ``noise="sound"`` exact integer grid noise
    (:mod:`certify.sound_noise`; the image must be on the 8-bit grid, checked when the request is validated)."""
    if smooth.noise == "sound":
        levels = sound_noise.grid_levels(image)
        return sound_noise.sampler(smooth.sigma).noisy(levels, num_samples, generator, image.dtype)
    noise = torch.randn((num_samples, *image.shape), generator=generator, device=smooth.device, dtype=image.dtype)
    return noise.mul_(smooth.sigma).add_(image)


def host_image(job: NoiseJob | StreamJob) -> torch.Tensor:
    """The image whose noise ``job`` draws, as the request gave it (a ``StreamJob``'s is its piece's)."""
    return job.piece.image if isinstance(job, StreamJob) else job.image


def job_seed(image_seed: int, phase: int, chunk_index: int) -> int:
    """A seed for one job, independent across (phase, chunk) for one image seed (NumPy's SeedSequence hashing)."""
    state = np.random.SeedSequence([image_seed, phase, chunk_index]).generate_state(2, np.uint32)
    return (int(state[0]) << 32 | int(state[1])) & MAX_SEED


def plan_chunks(count: int, n0: int, n: int, chunk_samples: int) -> list[tuple[int, int, int, int]]:
    """(image index, phase, chunk index, samples) for every chunk of ``count`` images' selection and estimation
    samples, in the order they are computed: cheap (no seed is derived), so a request costs little before it is
    admitted."""
    return [(index, phase, chunk, min(chunk_samples, total - start))
            for index in range(count) for phase, total in ((SELECTION, n0), (ESTIMATION, n))
            for chunk, start in enumerate(range(0, total, chunk_samples))]


def plan_jobs(images: torch.Tensor, image_seeds: Sequence[int], n0: int, n: int, chunk_samples: int,
              ) -> list[tuple[int, int, NoiseJob]]:
    """(image index, phase, job) for every chunk of every image's selection and estimation samples."""
    return [(index, phase, NoiseJob(images[index], size, job_seed(image_seeds[index], phase, chunk)))
            for index, phase, chunk, size in plan_chunks(len(images), n0, n, chunk_samples)]


class CertifyWork:
    """Cohen's CERTIFY as scheduler work (the scheduler's tests and benchmarks; the server answers a fixed n from
    the image's stream, ``SequentialWork``): every image's selection and estimation jobs, in image order;
    ``result()`` gives one certificate per image once every job's counts are in. A job's seed is derived when the
    job is taken (the jobs of ``plan_jobs``, in its order), not when the request arrives: deriving the 1,616 seeds
    of a 16-image request at n = 10,000 costs about 19 ms (on 2 CPU cores; benchmarks/bench_work_build.py), on the
    event loop, before admission may refuse it."""

    kind = "certify"

    def __init__(self, images: torch.Tensor, image_seeds: Sequence[int], n0: int, n: int, alpha: float,
                 sigma: float, num_classes: int, chunk_samples: int):
        if len(image_seeds) != len(images):
            raise ValueError(f"{len(images)} images but {len(image_seeds)} image seeds")
        self.alpha, self.sigma = alpha, sigma
        self.images = images
        self.image_seeds = list(image_seeds)
        self._pending: deque[tuple[int, int, int, int]] = deque(plan_chunks(len(images), n0, n, chunk_samples))
        self._totals = np.zeros((len(images), 2, num_classes), dtype=np.int64)
        self._outstanding = 0  # jobs handed out whose counts are not in yet
        self.planned_samples = len(images) * (n0 + n)
        self.samples_left = self.planned_samples  # not yet handed out

    def take(self, max_samples: int) -> list[tuple[tuple[int, int], NoiseJob]]:
        """The next jobs, at most ``max_samples`` samples in all (always at least one job while any is left)."""
        taken, total = [], 0
        while self._pending and (not taken or total + self._pending[0][3] <= max_samples):
            index, phase, chunk, size = self._pending.popleft()
            taken.append(((index, phase), NoiseJob(self.images[index], size,
                                                   job_seed(self.image_seeds[index], phase, chunk))))
            total += size
        self._outstanding += len(taken)
        self.samples_left -= total
        return taken

    @property
    def samples_taken(self) -> int:
        """Noisy samples handed out so far."""
        return self.planned_samples - self.samples_left

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


# ----------------------------------------------------------------------------------------------- sequential kinds

def prepare_ladder(sigma: float, alpha: float, max_n: int, n_step: int) -> RadiusLadder:
    """The ladder of (alpha, sigma) (``certify.ladder``) with its count boundaries computed at every sample count a
    request can read: the looks of the default schedule up to ``max_n`` and every budget on the grid of ``n_step``."""
    shared = ladder(alpha, sigma)
    looks = geometric_looks(max_n, DEFAULT_FIRST_LOOK, DEFAULT_LOOK_RATIO, DEFAULT_LOOK_STEP)
    for count in sorted(set(looks.tolist()) | set(range(n_step, max_n + 1, n_step))):
        shared.column(count)
    return shared


class NoisePiece:
    """One call's worth of an image's noise stream: ``num_samples`` noisy copies of ``image`` drawn in one
    ``torch.randn`` call from the image's generator, exactly as ``Smooth.sample_counts_many`` draws a piece.

    Drawn the first time one of its jobs is evaluated (in the counter's thread); a sequential work hands out
    an image's pieces in stream order and the scheduler evaluates passes one after another, so the generator is
    consumed in the same order as offline. Jobs hold the piece; it is freed once its last job is gone."""

    def __init__(self, image: torch.Tensor, num_samples: int, generator: torch.Generator):
        self.image = image
        self.num_samples = num_samples
        self.generator = generator
        self._samples: torch.Tensor | None = None

    @property
    def drawn(self) -> bool:
        return self._samples is not None

    def samples(self, smooth: Smooth, image: torch.Tensor | None = None) -> torch.Tensor:
        """The piece's noisy copies, drawn at the first call; ``image``: this piece's image on ``smooth``'s device,
        where the caller has copied it there already."""
        if self._samples is None:
            image = self.image.to(smooth.device) if image is None else image
            self._samples = noisy_copies(smooth, image, self.num_samples, self.generator)
        return self._samples


@dataclass(frozen=True, eq=False)
class StreamJob:
    """``num_samples`` consecutive noisy samples of ``piece``, from sample ``start`` on."""

    piece: NoisePiece
    start: int
    num_samples: int


def stream_pieces(total: int, piece_samples: int) -> list[int]:
    """The sizes in which ``Smooth.sample_counts_many`` draws ``total`` samples of one image in one phase."""
    return [min(piece_samples, total - start) for start in range(0, total, piece_samples)]


class SequentialWork:
    """The work of one request read from each image's stream (``kind`` ``decide``, ``estimate`` or ``certify``, a
    fixed n: ``rule`` a ``certify.sequential.FixedRule``) for the scheduler.

    Per image: ``n0`` selection samples choose the class, then fresh estimation samples are drawn block by block
    (``certify.streams.SequentialTest.next_block``: each block spans several looks of ``rule``, the rule of
    ``certify.core.sequential_rule``), their counts taken per look. The jobs of an image's next block are handed
    out once the counts of its previous block are in (or, with ``draw_ahead``, once that block is handed out), and
    the test reads the blocks in order, each block's looks in order up to its first outcome, so an image stops at
    the very look the offline mode stops at. Each image's noise is one stream from a generator seeded with its
    noise seed, drawn in the pieces ``Smooth.decide`` / ``Smooth.certify_adaptive`` draw (selection first), so a
    certificate equals the offline one for that seed, however the jobs were grouped into passes. ``device``: where
    the samples are evaluated (the block plan is the device's, as offline). ``planned_samples`` is the worst case,
    images x (n0 + n_max).

    ``draw_ahead`` (the server's ``overlap``): an image's next block is handed out as soon as its current one has
    been, before the current one's counts are in (as offline ``run_blocks`` draws a launch ahead), so a pass sent
    while the host hands out the last one has work. The blocks are drawn in the same order with the same sizes and
    read in order, so every answer is the same; an image that stops leaves its block drawn ahead unread (its jobs
    not yet taken are dropped; the samples taken count in the certificate's samples evaluated)."""

    def __init__(self, kind: str, images: torch.Tensor, image_seeds: Sequence[int], n0: int, rule, sigma: float,
                 num_classes: int, chunk_samples: int, generator_for, device: torch.device | str | None = None,
                 draw_ahead: bool = False):
        if kind not in ("decide", "estimate", "certify"):
            raise ValueError(f"a sequential kind is 'decide', 'estimate' or 'certify' (fixed n), got {kind!r}")
        self.kind, self.rule, self.n0, self.sigma = kind, rule, n0, sigma
        self.images = images
        self.image_seeds = list(image_seeds)
        self.chunk_samples = chunk_samples
        self.draw_ahead = draw_ahead
        self.piece_samples = max(1, NOISE_PIECE_ELEMENTS // images[0].numel())
        self.n_max = int(rule.cs.n_max)
        self._generators = [generator_for(seed) for seed in self.image_seeds]
        self._image_views = list(images.unbind(0))  # each image's view, made once, not at every block
        plan = BlockPlan.for_device(images.device.type if device is None else torch.device(device).type)
        self._tests = SequentialTest.many(rule, plan, len(images))
        self._selection = np.zeros((len(images), num_classes), dtype=np.int64)
        self._top = np.full(len(images), -1, dtype=np.int64)
        self._selecting = np.zeros(len(images), dtype=np.int64)  # selection jobs not yet counted
        self._flight: list[deque[_Block]] = [deque() for _ in range(len(images))]  # blocks handed out, not yet read
        self._unread_evaluated = [0] * len(images)  # samples of blocks drawn ahead, never read
        self._taken = np.zeros(len(images), dtype=np.int64)  # samples handed out, per image
        self._ready: deque[tuple[tuple, StreamJob]] = deque()
        self._counted: list[int] = []  # images whose next block is counted and not yet read (``_settled``)
        self.planned_samples = len(images) * (n0 + self.n_max)
        self._samples_left: int | None = None  # ``samples_left``, until a take or a reading changes it
        for index in range(len(images)):
            self._emit(index, None, n0, [n0])  # selection

    def _emit(self, index: int, block: _Block | None, total: int, segments: list[int]) -> None:
        """Queue the jobs of the first ``sum(segments)`` of ``total`` fresh samples of image ``index``: pieces in
        stream order (pieces past the segments are not drawn), cut at segment ends and in chunks; a job's key is
        (index, segment number, its block) for an estimation block, (index, -1, None) for the selection."""
        jobs, offset = 0, 0
        ends = list(accumulate(segments))  # plain Python: a block has a few segments, numpy's per-call cost dominates
        evaluated = ends[-1]
        image = self._image_views[index]
        for size in stream_pieces(total, self.piece_samples):
            if offset >= evaluated:
                break
            piece = NoisePiece(image, size, self._generators[index])
            position = offset
            while position < min(offset + size, evaluated):
                segment = bisect_right(ends, position)
                stop = min(offset + size, ends[segment], position + self.chunk_samples)
                key = (index, -1, None) if block is None else (index, segment, block)
                self._ready.append((key, StreamJob(piece, position - offset, stop - position)))
                jobs += 1
                position = stop
            offset += size
        if block is None:
            self._selecting[index] = jobs
        else:
            block.waiting = block.untaken = jobs
            self._flight[index].append(block)

    def _emit_block(self, index: int) -> None:
        """Queue image ``index``'s next block: the one its test reads next, or, with a block in flight, the one
        after it (drawn ahead)."""
        test, flight = self._tests[index], self._flight[index]
        size, segments = test.block_after(flight[0].size) if flight else test.next_block()
        if size:
            self._emit(index, _Block(size, np.zeros(len(segments), dtype=np.int64)), size, segments)

    @property
    def samples_left(self) -> int:
        """Samples not yet handed out, at most: nothing for a stopped image, up to n0 + n_max for the others. Summed
        again only after a take or a reading of blocks (the scheduler asks for it several times per pass)."""
        tests = self._settled()
        if self._samples_left is None:
            budget = self.n0 + self.n_max
            self._samples_left = sum(budget - taken for taken, test in zip(self._taken.tolist(), tests, strict=True)
                                     if not test.done)
        return self._samples_left

    @property
    def samples_taken(self) -> int:
        """Noisy samples handed out so far (an image that stopped early takes no more)."""
        return int(self._taken.sum())

    def take(self, max_samples: int) -> list[tuple[tuple, StreamJob]]:
        """The next ready jobs, at most ``max_samples`` samples (at least one job while any is ready); none while
        every active image waits for the counts of its current look. With ``draw_ahead``, an image whose block has
        just been handed out whole gets its next block queued (one block ahead at most)."""
        self._settled()
        taken, total = [], 0
        while self._ready and (not taken or total + self._ready[0][1].num_samples <= max_samples):
            key, job = self._ready.popleft()
            index, _, block = key
            if block is not None:
                block.untaken -= 1
                if block.dropped:  # drawn ahead for an image that has stopped since: not computed
                    continue
                block.taken += job.num_samples
            taken.append((key, job))
            total += job.num_samples
            self._taken[index] += job.num_samples
            if self.draw_ahead and block is not None and block.untaken == 0 and len(self._flight[index]) == 1:
                self._emit_block(index)
        if taken:
            self._samples_left = None
        return taken

    def add(self, key: tuple, counts: np.ndarray) -> None:
        index, segment, block = key
        if block is None:
            self._selection[index] += counts
            self._selecting[index] -= 1
            if self._selecting[index] == 0:  # selection done: the class is chosen; the estimation stream starts
                self._top[index] = int(self._selection[index].argmax())
                self._emit_block(index)
            return
        if block.dropped:
            return
        block.votes[segment] += int(counts[self._top[index]])
        block.waiting -= 1
        if block.waiting == 0 and block is self._flight[index][0]:
            self._counted.append(index)  # read with the other images' blocks (``_settled``)

    def _read(self, index: int) -> None:
        """After image ``index``'s first block in flight was read: drop it; if the test stopped, drop the block drawn
        ahead too (its samples taken count as evaluated); else queue the next read or the next block."""
        flight, test = self._flight[index], self._tests[index]
        flight.popleft()
        self._samples_left = None  # a test that stops here frees its image's budget
        if test.done:
            for block in flight:
                block.dropped = True
                self._unread_evaluated[index] += block.taken
            flight.clear()
        elif flight:
            if flight[0].waiting == 0:  # the block drawn ahead is counted already: read at the next reading
                self._counted.append(index)
            elif self.draw_ahead and flight[0].untaken == 0:
                self._emit_block(index)
        else:
            self._emit_block(index)

    def _settled(self) -> list:
        """The images' tests, after reading the looks of every block counted since the last read
        (:func:`read_counted_blocks` for this work alone). Called before anything reads the work's state, so the
        state is always as if each block had been read the moment it was counted."""
        if self._counted:
            read_counted_blocks([self])
        return self._tests

    @property
    def finished(self) -> bool:
        return all(test.done for test in self._settled())

    def result(self) -> list:
        """One ``certify.core.AdaptiveCertificate`` per image (samples evaluated: those of the blocks read, and of
        any block drawn ahead and left unread)."""
        tests = self._settled()
        mode = rule_mode(self.rule)
        return [adaptive_certificate(self.rule, mode, int(top), test.outcome, test.successes, test.samples,
                                     test.p_lower, self.n0, self.sigma, test.computed + unread)
                for top, test, unread in zip(self._top, tests, self._unread_evaluated, strict=True)]


@dataclass(eq=False)
class _Block:
    """One block of an image's estimation stream, queued or handed out and not yet read: its draw size, the votes
    for the selected class in each look segment, its jobs not yet counted and not yet taken, the samples taken."""

    size: int
    votes: np.ndarray
    waiting: int = 0
    untaken: int = 0
    taken: int = 0
    dropped: bool = False  # its image stopped before it was read


def read_counted_blocks(works: Sequence[object]) -> None:
    """Read the blocks counted since the last read in every adaptive work of ``works`` (the scheduler: those of one
    pass) together, across images and requests (``SequentialTest.observe_blocks``: one evaluation of each rule per
    reading, or per block where the rule cannot read each image at its own looks; each image's answer unchanged),
    then queue the next block of each image that goes on. A block drawn ahead that is counted already is read in a
    further reading, in order. Works of other kinds are left alone."""
    while True:
        pending = [(work, index) for work in works if isinstance(work, SequentialWork) for index in work._counted]
        if not pending:
            return
        for work, _ in pending:
            work._counted = []
        SequentialTest.observe_blocks([work._tests[index] for work, index in pending],
                                      [work._flight[index][0].votes for work, index in pending])
        for work, index in pending:
            work._read(index)
