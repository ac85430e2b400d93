"""Drivers of the sequential rules of :mod:`certify.sequential`: many streams at once, or one stream fed from outside.

- :func:`run_streams` evaluates a rule look by look, drawing each look's fresh samples from a callback: the
  reference driver, used by the validity simulations.
- :func:`run_blocks` draws each stream's samples in **blocks** that span many looks and evaluates the rule at
  every look inside a block at once (:meth:`certify.sequential.Rule.step_looks`); a stream's answer is its first
  outcome, at the very look and with the very counts :func:`run_streams` gives for the same sample stream
  (tested). Fewer, larger draws keep a device busy and cost one vectorised rule evaluation per block instead of
  one per look; the samples of a block after a stream's stopping look are computed and not used (at most
  DRAW_BLOCK_RATIO - 1 of the samples used, or the plan's least block).
- :class:`SequentialTest` is the rule for one image fed counts from outside (the server's scheduler), look by
  look or block by block.

The block ends (:func:`draw_block_ends`) are a subsequence of the unbounded look schedule, each the last look at
most DRAW_BLOCK_RATIO times the previous end or a :class:`BlockPlan`'s least block after it (8 samples on CPU, 64
on GPUs): they depend on the look schedule and the plan alone, not on n_max (beyond where it truncates the last
block), the batch size or which streams share a pass. An image's noise is drawn
block by block, each block in full, so the noise an image sees at any sample count is the same whatever its
budget: a larger n_max only extends the same stream (the basis of validity across re-runs).
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from certify.confidence import ConfidenceSequence, geometric_looks
from certify.sequential import CONTINUE, Rule

DRAW_BLOCK_RATIO = 1.125  # each block of noise ends at the last look at most this many times the previous end ...
MIN_BLOCK_SAMPLES = {"cpu": 8}  # ... or at most this many samples after it, per device type (others: the default)
AHEAD_EXPECTED_USE = 0.75  # draw a launch ahead when at least this share of its streams are expected to use it
DEFAULT_MIN_BLOCK_SAMPLES = 64  # a GPU pass costs about as much for 8 or 64 samples per image


@dataclass(frozen=True)
class BlockPlan:
    """How a stream's samples are cut into blocks: each block ends at the last look at most ``ratio`` times the
    previous end or ``min_samples`` after it, whichever is further (at least one look). A run setting: the same
    plan, the same noise stream; the default is chosen per device (small blocks where samples cost time in
    proportion, on CPU; larger where a pass costs the same for a few more samples, on GPUs)."""

    ratio: float = DRAW_BLOCK_RATIO
    min_samples: int = MIN_BLOCK_SAMPLES["cpu"]

    def __post_init__(self):
        if not (self.ratio >= 1 and self.min_samples >= 1):
            raise ValueError(f"a block plan needs ratio >= 1 and min_samples >= 1, got {self}")

    @classmethod
    def for_device(cls, device_type: str) -> BlockPlan:
        return cls(DRAW_BLOCK_RATIO, MIN_BLOCK_SAMPLES.get(device_type, DEFAULT_MIN_BLOCK_SAMPLES))

    def describe(self) -> dict:
        return {"block_ratio": self.ratio, "block_min_samples": self.min_samples}


@dataclass
class StreamResults:
    """Per stream: final outcome, votes for cA and estimation samples used at the stop, lower bound on pA."""

    outcome: np.ndarray
    successes: np.ndarray
    samples: np.ndarray
    p_lower: np.ndarray
    stop_look: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    computed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # samples evaluated


Draw = Callable[[np.ndarray, int], np.ndarray]
BlockDraw = Callable[[np.ndarray, "list[tuple[int, np.ndarray]]"], "np.ndarray | Callable[[], np.ndarray]"]


def draw_block_ends(cs: ConfidenceSequence, plan: BlockPlan = BlockPlan()) -> np.ndarray:
    """Sample counts at which the noise blocks of a stream end, the last one at or beyond n_max.

    With a look schedule that does not depend on n_max (``cs.schedule``) the ends are taken from the unbounded
    schedule; otherwise (``union-cp``, whose looks are placed by n_max) every look ends a block."""
    if cs.schedule is None:
        return cs.looks.copy()
    first, look_ratio, step = cs.schedule
    unbounded = geometric_looks(2 * cs.n_max + 2 * first + 2 * step, first, look_ratio, step)[:-1]
    ends, end = [], 0
    while end < cs.n_max:
        candidates = unbounded[unbounded > end]
        within = candidates[candidates <= max(end * plan.ratio, end + plan.min_samples)]
        end = int(within[-1] if within.size else candidates[0])
        ends.append(end)
    return np.asarray(ends, dtype=np.int64)


_BLOCKS_KEPT = 64


@dataclass(frozen=True, eq=False)
class _Blocks:
    """The blocks of one confidence-sequence object under one plan, shared read-only by every stream and test of it:
    their ends, and each block as (first sample, end, look indices, look segments), with its index by its first
    sample (a server runs a test per adaptive image, with a few rule objects shared by every request)."""

    cs: ConfidenceSequence
    ends: np.ndarray
    blocks: tuple[tuple[int, int, np.ndarray, np.ndarray], ...]
    by_start: dict[int, int]


_blocks_kept: dict[tuple[int, BlockPlan], _Blocks] = {}


def _shared_blocks(cs: ConfidenceSequence, plan: BlockPlan) -> _Blocks:
    """The blocks of ``cs`` under ``plan`` (:func:`draw_block_ends`, then each block's looks), computed once per
    confidence-sequence object and plan."""
    key = (id(cs), plan)
    kept = _blocks_kept.get(key)
    if kept is None or kept.cs is not cs:  # the object is held while it is kept: its id is not reused meanwhile
        if len(_blocks_kept) >= _BLOCKS_KEPT:
            _blocks_kept.clear()
        ends, blocks, start = draw_block_ends(cs, plan), [], 0
        for end in ends:
            looks = block_looks(cs, start, int(end))
            segments = np.diff(np.concatenate([[start], cs.looks[looks]]))
            ends.flags.writeable = looks.flags.writeable = segments.flags.writeable = False
            blocks.append((start, int(end), looks, segments))
            start = int(end)
        kept = _blocks_kept[key] = _Blocks(cs, ends, tuple(blocks), {block[0]: k for k, block in enumerate(blocks)})
    return kept


def shared_block_ends(cs: ConfidenceSequence, plan: BlockPlan) -> np.ndarray:
    """:func:`draw_block_ends` of ``cs`` and ``plan``, computed once per confidence-sequence object and plan and
    shared read-only."""
    return _shared_blocks(cs, plan).ends


def block_looks(cs: ConfidenceSequence, start: int, end: int) -> np.ndarray:
    """Indices of the looks of ``cs`` in (start, end]."""
    return np.flatnonzero((cs.looks > start) & (cs.looks <= end))


def first_outcomes(rule: Rule, looks: np.ndarray, successes: np.ndarray, votes: np.ndarray, best_lower: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Evaluate ``rule`` at the consecutive ``looks`` (m indices; where ``rule.row_looks``, also (streams, m): each
    stream's own) of streams holding ``successes`` votes before them and ``votes`` (streams, m) in each look's
    segment, and read each stream at its first outcome (its last look if none): (the look's position in its looks,
    cumulative votes, outcome, best lower bound, whether it stopped)."""
    cumulative = np.asarray(successes)[:, None] + np.cumsum(votes, axis=1)
    results, lowers = rule.step_looks(looks, cumulative, best_lower)
    stopped = results != CONTINUE
    any_stop = stopped.any(axis=1)
    first = np.where(any_stop, stopped.argmax(axis=1), np.shape(looks)[-1] - 1)
    rows = np.arange(len(first))
    return first, cumulative[rows, first], results[rows, first], lowers[rows, first], any_stop


def run_streams(rule: Rule, draw: Draw, count: int) -> StreamResults:
    """Run ``rule`` over ``count`` streams: at each look, ``draw(active, m)`` returns the votes for cA among
    m fresh samples of each active stream (indices ``active``); stopped streams draw nothing more."""
    successes = np.zeros(count, dtype=np.int64)
    samples = np.zeros(count, dtype=np.int64)
    outcome = np.full(count, CONTINUE, dtype=np.int8)
    p_lower = np.zeros(count)
    stop_look = np.full(count, -1, dtype=np.int64)
    previous = 0
    for look, t in enumerate(rule.looks):
        active = np.flatnonzero(outcome == CONTINUE)
        if active.size == 0:
            break
        increment = int(t) - previous
        votes = np.asarray(draw(active, increment), dtype=np.int64)
        if votes.shape != active.shape or np.any(votes < 0) or np.any(votes > increment):
            raise ValueError(f"draw returned {votes!r} for {active.size} streams of {increment} samples")
        successes[active] += votes
        samples[active] = t
        result, p_lower[active] = rule.step(look, successes[active], p_lower[active])
        outcome[active] = result
        stop_look[active[result != CONTINUE]] = look
        previous = int(t)
    return StreamResults(outcome, successes, samples, p_lower, stop_look, samples.copy())


def run_blocks(rule: Rule, draw: BlockDraw, count: int, plan: BlockPlan = BlockPlan(),
               lookahead: bool = False, fill: int = 0, expected: np.ndarray | None = None) -> StreamResults:
    """Run ``rule`` over ``count`` streams block by block (module docstring). For each launch,
    ``draw(active, blocks)`` draws, for each active stream, the consecutive ``blocks`` [(block_samples, segments),
    ...] in order: each block's ``block_samples`` fresh samples in full (so the stream does not depend on n_max), of
    which the first ``segments.sum()`` are evaluated; it returns the votes for cA in each consecutive segment (one
    segment per look) of all the blocks, shape (active, total segments), or a callable returning them (the draw
    queued, its votes read when called).

    ``fill``: a launch takes as many consecutive blocks of each running stream as it needs to evaluate at least
    ``fill`` samples in all (1 block when ``fill`` is 0, or while many streams run): when few streams are left,
    one launch fills a device's pass instead of one small pass per block, and the rule is evaluated at all the
    launch's looks at once. ``lookahead``: each running stream's next launch is asked for before the votes of its
    current one are read, so a device computes it while the host evaluates the rule. With ``expected`` (each
    stream's expected share of votes for cA, e.g. its selection samples' share) a launch is drawn ahead only when at
    least AHEAD_EXPECTED_USE of its streams are expected to use it: were a stream's votes to come at its rate so far
    (at ``expected`` before its first), would the rule still continue at the last look of the launch being read?
    Otherwise the next launch waits for the votes: when most streams are about to stop, drawing ahead would compute
    a launch mostly for nothing (decide's first launch at a small radius, estimate's launches where most images
    reach their tolerance together).

    None of these changes an answer: every stream's blocks are drawn in the same order with the same sizes, and the
    rule reads nothing past the stopping look. A stream that stops evaluates the rest of its launch (and if drawn
    ahead, the next launch) without using it; ``computed`` counts those samples."""
    if fill < 0:
        raise ValueError(f"fill must be >= 0, got {fill}")
    if expected is not None:
        expected = np.asarray(expected, dtype=float)
        if expected.shape != (count,) or not np.all((expected >= 0) & (expected <= 1)):
            raise ValueError(f"expected must hold one share in [0, 1] for each of the {count} streams")
    cs = rule.cs
    successes = np.zeros(count, dtype=np.int64)
    samples = np.zeros(count, dtype=np.int64)
    computed = np.zeros(count, dtype=np.int64)
    outcome = np.full(count, CONTINUE, dtype=np.int8)
    p_lower = np.zeros(count)
    stop_look = np.full(count, -1, dtype=np.int64)
    blocks = _shared_blocks(cs, plan).blocks  # (first sample, end, look indices, look segments)

    def launch(b: int, streams: np.ndarray):
        e, evaluated = b + 1, streams.size * int(blocks[b][3].sum())
        while e < len(blocks) and evaluated < fill:
            evaluated += streams.size * int(blocks[e][3].sum())
            e += 1
        group = blocks[b:e]
        computed[streams] = group[-1][0] + int(group[-1][3].sum())  # evaluated, whether used or not
        result = draw(streams, [(last - first, segments) for first, last, _, segments in group])
        return result, streams, b, e

    def expected_to_run(streams: np.ndarray, looks: np.ndarray, segments: np.ndarray) -> np.ndarray:
        """Which ``streams`` the rule would not stop by the launch's last look, their votes at their rate so far."""
        drawn = samples[streams]
        rate = np.where(drawn > 0, successes[streams] / np.maximum(drawn, 1), expected[streams])
        votes = np.floor(successes[streams] + np.clip(rate, 0.0, 1.0) * segments.sum())
        result, _ = rule.step_looks(looks[-1:], votes[:, None], p_lower[streams])
        return result[:, 0] == CONTINUE

    pending = launch(0, np.arange(count)) if blocks and count else None
    while pending is not None:
        result, launched, b, e = pending
        looks = np.concatenate([blocks[k][2] for k in range(b, e)])
        segments = np.concatenate([blocks[k][3] for k in range(b, e)])
        ahead = None
        if lookahead and e < len(blocks):  # every stream still running before this launch's votes are read
            running = launched[outcome[launched] == CONTINUE]
            if running.size and (expected is None
                                 or expected_to_run(running, looks, segments).mean() >= AHEAD_EXPECTED_USE):
                ahead = launch(e, running)
        votes = np.asarray(result() if callable(result) else result, dtype=np.int64)
        if votes.shape != (launched.size, segments.size) or np.any(votes < 0) or np.any(votes > segments):
            raise ValueError(f"draw returned votes of shape {votes.shape} for {launched.size} streams and "
                             f"{segments.size} looks")
        keep = outcome[launched] == CONTINUE  # with lookahead, streams that stopped at the last launch drew this one
        active, votes = launched[keep], votes[keep]
        if active.size:
            first, successes[active], outcome[active], p_lower[active], stopped = first_outcomes(
                rule, looks, successes[active], votes, p_lower[active])
            samples[active] = cs.looks[looks][first]
            stop_look[active[stopped]] = looks[first[stopped]]
        if ahead is not None:
            pending = ahead
        else:  # not drawn ahead (no lookahead, or most streams were about to stop): the next launch after the votes
            running = active[outcome[active] == CONTINUE]
            pending = launch(e, running) if e < len(blocks) and running.size else None
    return StreamResults(outcome, successes, samples, p_lower, stop_look, computed)


class SequentialTest:
    """One image's sequential test, fed counts from outside: ask ``samples_needed``, evaluate that many fresh
    noisy samples, ``observe`` the votes for the selected class; repeat until ``done``. Or block by block, as
    :func:`run_blocks` draws: ``next_block`` says how many samples to draw and in which look segments to count
    the first of them, ``observe_block`` takes those counts.

    The same rule and the same looks as :func:`run_streams` / :func:`run_blocks` (and so as ``Smooth.decide`` /
    ``Smooth.certify_adaptive``); a caller may evaluate the samples in any batches it likes."""

    def __init__(self, rule: Rule, plan: BlockPlan = BlockPlan()):
        self.rule = rule
        self.look = 0
        self.successes = 0
        self.samples = 0
        self.outcome = CONTINUE
        self.p_lower = 0.0
        self.computed = 0  # estimation samples evaluated (a block is evaluated whole, up to n_max)
        self._plan = plan
        self._blocks = _shared_blocks(rule.cs, plan)  # a function of rule.cs and plan alone (read only)
        self._drawn = 0  # samples of the stream drawn so far (block by block)

    @classmethod
    def many(cls, rule: Rule, plan: BlockPlan, count: int) -> list[SequentialTest]:
        """``count`` tests of one rule and plan (one per image of a request), the block ends computed once and
        shared (read only): the same tests as ``count`` calls of the constructor, for a fraction of the time."""
        first = cls(rule, plan)  # a fresh test holds numbers and the block ends only: a shallow copy is a new test
        return [first, *(copy.copy(first) for _ in range(count - 1))] if count else []

    @property
    def done(self) -> bool:
        return self.outcome != CONTINUE

    @property
    def samples_needed(self) -> int:
        """Fresh estimation samples to evaluate before the next look (0 once done)."""
        return 0 if self.done else int(self.rule.looks[self.look]) - self.samples

    def observe(self, votes: int, samples: int) -> int:
        """Record ``votes`` for the selected class among ``samples`` (= ``samples_needed``) fresh samples."""
        if self.done:
            raise ValueError("the test has already stopped")
        if samples != self.samples_needed or not 0 <= votes <= samples:
            raise ValueError(f"expected the votes among {self.samples_needed} samples, got {votes} of {samples}")
        self.successes += int(votes)
        self.samples += int(samples)
        self.computed = max(self.computed, self.samples)
        result, lower = self.rule.step(self.look, np.array([self.successes]), np.array([self.p_lower]))
        self.outcome, self.p_lower = int(result[0]), float(lower[0])
        self.look += 1
        return self.outcome

    def next_block(self) -> tuple[int, list[int]]:
        """(samples to draw, look segments to count among the first of them) for the next block; (0, []) once
        done. Block by block only: ``samples`` must be at the end of the previous block."""
        size, segments, _ = self._next()
        return size, [int(m) for m in segments]

    def block_after(self, size: int) -> tuple[int, list[int]]:
        """(samples to draw, look segments) of the block after the next one, whose ``size`` samples are drawn but
        not yet read: for a caller that draws one block ahead, as :func:`run_blocks` with ``lookahead`` does;
        (0, []) once done or where the next block is the stream's last. Reading stays block by block, in order."""
        if self.done:
            return 0, []
        first_size, _, _ = self._next()
        if size != first_size:
            raise ValueError(f"the next block has {first_size} samples, not {size}")
        index = self._blocks.by_start.get(self._drawn + size)
        if index is None:
            return 0, []
        start, end, _, segments = self._blocks.blocks[index]
        return end - start, [int(m) for m in segments]

    def _next(self) -> tuple[int, np.ndarray, np.ndarray]:
        """(samples to draw, look segments, the looks' indices) of the next block; (0, [], []) once done: the block
        of the rule's confidence sequence and the plan that starts where this test's samples end (computed once for
        every test and stream that share them)."""
        if self.done:
            return 0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self.samples != self._drawn:
            raise ValueError("blocks and single looks cannot be mixed in one test")
        start, end, looks, segments = self._blocks.blocks[self._blocks.by_start[self._drawn]]
        return end - start, segments, looks

    def observe_block(self, votes: list[int] | np.ndarray) -> int:
        """Record the votes in each look segment of :meth:`next_block`, up to the first outcome: the rule evaluated at
        all the block's looks at once (:meth:`certify.sequential.Rule.step_looks`, as :func:`run_blocks` does), which
        gives the outcome, counts and bound that :meth:`observe` one look at a time gives (tested)."""
        SequentialTest.observe_blocks([self], [votes])
        return self.outcome

    @staticmethod
    def observe_blocks(tests: Sequence[SequentialTest], votes: Sequence[list[int] | np.ndarray]) -> None:
        """:meth:`observe_block` for many tests, ``votes[i]`` for ``tests[i]``: the tests of one rule object share one
        evaluation of it, one row each, as :func:`run_blocks` evaluates its streams. Those at the same block (equal
        block plans, the same samples drawn) share its looks; where the rule takes each row's own looks
        (``rule.row_looks``, the default one-sided mixture) tests at different blocks share the evaluation too,
        each row's looks and votes padded to the longest block by repeating its last look with no more votes (the
        same counts at the same look: the same answer as that look's). Each test ends as :meth:`observe_block`
        alone leaves it (tested); the rule's cost is paid once per reading, not once per image. Every test's votes
        are checked before any test changes."""
        if len({id(test) for test in tests}) != len(tests):
            raise ValueError("a test can record one block at a time: the same test appears twice")
        groups: dict[tuple, list[tuple[SequentialTest, np.ndarray, np.ndarray, int, int]]] = {}
        for test, block_votes in zip(tests, votes, strict=True):
            size, segments, looks = test._next()
            if len(block_votes) != len(segments):
                raise ValueError(f"expected the votes of {len(segments)} looks, got {len(block_votes)}")
            if not len(segments):  # done: nothing to record
                continue
            block_votes = np.asarray(block_votes, dtype=np.int64)
            bad = np.flatnonzero((block_votes < 0) | (block_votes > segments))
            if bad.size:
                raise ValueError(f"look {bad[0]} of the block: {block_votes[bad[0]]} votes among {segments[bad[0]]} "
                                 f"samples, expected 0 to {segments[bad[0]]}")
            block = None if test.rule.row_looks else (test._plan, test._drawn)
            groups.setdefault((id(test.rule), block), []).append(
                (test, block_votes, looks, size, int(segments.sum())))
        for group in groups.values():
            looks = [row_looks for _, _, row_looks, *_ in group]
            width = max(len(row) for row in looks)
            if all(len(row) == width and np.array_equal(row, looks[0]) for row in looks):
                looks_read, votes_read = looks[0], np.stack([block_votes for _, block_votes, *_ in group])
            else:  # each row its own looks, padded to the longest block: its last look again, with no more votes
                looks_read = np.empty((len(group), width), dtype=np.int64)
                votes_read = np.zeros((len(group), width), dtype=np.int64)
                for row, (row_looks, (_, block_votes, *_)) in enumerate(zip(looks, group, strict=True)):
                    looks_read[row, :len(row_looks)] = row_looks
                    looks_read[row, len(row_looks):] = row_looks[-1]
                    votes_read[row, :len(block_votes)] = block_votes
            first, successes, outcome, lower, _ = first_outcomes(
                group[0][0].rule, looks_read, np.array([test.successes for test, *_ in group], dtype=np.int64),
                votes_read, np.array([test.p_lower for test, *_ in group], dtype=float))
            for row, (test, _, _, size, evaluated) in enumerate(group):
                look = int(looks[row][min(int(first[row]), len(looks[row]) - 1)])
                test.successes, test.samples = int(successes[row]), int(test.rule.looks[look])
                test.outcome, test.p_lower = int(outcome[row]), float(lower[row])
                test.look = look + 1
                test.computed = test._drawn + evaluated
                test._drawn += size
