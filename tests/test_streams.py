"""The drivers of the sequential rules (``certify.streams``), without a model: blocks of many looks, launches of
several blocks, drawing ahead, and one image's test fed from outside (the server's path) each give every stream
the answer the look-by-look driver gives the same votes, to the bit."""
from __future__ import annotations

import numpy as np
import pytest

from certify.confidence import DEFAULT_METHOD, METHODS, confidence_sequence
from certify.sequential import CONTINUE, DecideRule, EstimateRule
from certify.streams import BlockPlan, SequentialTest, draw_block_ends, run_blocks, run_streams, shared_block_ends

SIGMA = 0.25


def one_block_draw(votes: np.ndarray, deferred: bool = False):
    """A ``run_blocks`` draw of one block a launch (fill 0) from fixed vote streams, each stream's blocks read in
    order: a stream drawn out of order would get other votes. ``deferred``: the votes come back as a callable (a
    queued launch). ``draw.calls``: streams in each launch; ``draw.events``: "draw" and (deferred) "read" in order."""
    position = np.zeros(len(votes), dtype=int)
    calls, events = [], []

    def draw(active, blocks):
        (size, segments), = blocks
        edges = np.concatenate([[0], np.cumsum(segments)])
        out = np.array([np.add.reduceat(votes[i, position[i]:position[i] + edges[-1]], edges[:-1]) for i in active])
        position[active] += size
        calls.append(len(active))
        events.append("draw")
        return (lambda: events.append("read") or out) if deferred else out
    draw.calls, draw.events = calls, events
    return draw


def replay(votes: np.ndarray):
    """A draw for one stream that hands out ``votes`` in order: the votes among the next m samples."""
    position = [0]

    def draw(active, m):
        start = position[0]
        position[0] += m
        return np.array([votes[start:start + m].sum()])

    return draw


def test_counts_fed_one_look_at_a_time_give_the_driver_s_answer():
    cs = confidence_sequence("union-cp", 10_000, 0.001)
    for rule in (DecideRule(cs, 0.5, SIGMA), EstimateRule(cs, SIGMA, 0.05)):
        votes = np.random.default_rng(11).binomial(1, 0.985, size=10_000)
        batch = run_streams(rule, replay(votes), 1)
        test = SequentialTest(rule)
        while not test.done:
            need = test.samples_needed
            test.observe(int(votes[test.samples:test.samples + need].sum()), need)
        assert (test.outcome, test.samples, test.successes) == (batch.outcome[0], batch.samples[0],
                                                                 batch.successes[0])
        assert test.p_lower == pytest.approx(batch.p_lower[0]) and test.samples_needed == 0
        assert test.outcome != CONTINUE
        with pytest.raises(ValueError):
            test.observe(0, 1)


@pytest.mark.parametrize("method", METHODS)
def test_blocks_stop_at_the_same_look_with_the_same_counts_as_look_by_look(method):
    """``run_blocks`` (blocks of many looks, the rule evaluated at all of a block's looks at once) gives every stream
    the outcome, counts, samples and bound that ``run_streams`` (look by look) gives the same sample stream; the
    samples it evaluates past the stop stay within the block ratio."""
    from certify.streams import DRAW_BLOCK_RATIO

    p_values = np.array([0.6, 0.97, 0.985, 0.99, 0.999, 1.0])
    votes = np.random.default_rng(21).binomial(1, np.repeat(p_values, 3)[:, None], size=(18, 20_000))

    def look_draw():
        position = np.zeros(len(votes), dtype=int)

        def draw(active, m):
            out = np.array([votes[i, position[i]:position[i] + m].sum() for i in active])
            position[active] += m
            return out
        return draw

    for rule in (DecideRule(confidence_sequence(method, 20_000, 0.001), 0.5, SIGMA),
                 EstimateRule(confidence_sequence(method, 20_000, 0.001), SIGMA, 0.05)):
        looked = run_streams(rule, look_draw(), len(votes))
        blocked = run_blocks(rule, one_block_draw(votes), len(votes))
        for name in ("outcome", "successes", "samples", "p_lower", "stop_look"):
            np.testing.assert_array_equal(getattr(blocked, name), getattr(looked, name), err_msg=name)
        assert np.all(blocked.computed >= blocked.samples)
        assert np.all(blocked.computed <= np.maximum(DRAW_BLOCK_RATIO * blocked.samples, blocked.samples + 8))


@pytest.mark.parametrize("method", METHODS)
def test_drawing_a_block_ahead_changes_no_answer(method):
    """With ``lookahead`` each running stream's next block is queued before the current block's votes are read (the
    draw returns a callable): every stream's outcome, counts, samples, bound and stopping look are those of the plain
    block driver; a stream evaluates at most one block more than it did there, and its blocks are drawn in order."""
    votes = np.random.default_rng(5).binomial(1, np.repeat([0.6, 0.97, 0.99, 0.999, 1.0], 3)[:, None],
                                              size=(15, 20_000))

    for rule in (DecideRule(confidence_sequence(method, 20_000, 0.001), 0.5, SIGMA),
                 EstimateRule(confidence_sequence(method, 20_000, 0.001), SIGMA, 0.05)):
        plain = run_blocks(rule, one_block_draw(votes), len(votes))
        ahead = run_blocks(rule, one_block_draw(votes, deferred=True), len(votes), lookahead=True)
        for name in ("outcome", "successes", "samples", "p_lower", "stop_look"):
            np.testing.assert_array_equal(getattr(ahead, name), getattr(plain, name), err_msg=name)
        assert np.all(ahead.computed >= plain.computed)
        assert np.any(ahead.computed > plain.computed)  # the block drawn ahead for streams that then stopped
        ends = np.minimum(draw_block_ends(rule.cs), rule.cs.n_max)  # at most the block after the plain stop's
        following = [ends[min(np.searchsorted(ends, c, side="right"), len(ends) - 1)] for c in plain.computed]
        assert np.all((ahead.computed == plain.computed) | (ahead.computed == following))
        assert run_blocks(rule, one_block_draw(votes, deferred=True), len(votes)).computed.tolist() == \
            plain.computed.tolist()


@pytest.mark.parametrize("method", METHODS)
def test_drawing_ahead_only_when_most_streams_go_on_changes_no_answer(method):
    """With ``expected`` a launch is drawn ahead only when at least AHEAD_EXPECTED_USE of its streams are expected to
    run past the launch being read: every answer is the plain driver's; no stream evaluates more than with every
    launch drawn ahead, and the streams about to stop (pA = 1 at a small radius: the first look that can decide
    does) are not drawn a launch they would not use."""
    votes = np.random.default_rng(6).binomial(1, np.repeat([0.6, 0.97, 1.0, 1.0, 1.0], 3)[:, None],
                                              size=(15, 20_000))
    expected = np.repeat([0.6, 0.97, 1.0, 1.0, 1.0], 3)

    for rule in (DecideRule(confidence_sequence(method, 20_000, 0.001), 0.05, SIGMA),
                 EstimateRule(confidence_sequence(method, 20_000, 0.001), SIGMA, 0.05)):
        plain = run_blocks(rule, one_block_draw(votes, deferred=True), len(votes))
        every = run_blocks(rule, one_block_draw(votes, deferred=True), len(votes), lookahead=True)
        chosen_draw = one_block_draw(votes, deferred=True)
        chosen = run_blocks(rule, chosen_draw, len(votes), lookahead=True, expected=expected)
        for name in ("outcome", "successes", "samples", "p_lower", "stop_look"):
            np.testing.assert_array_equal(getattr(chosen, name), getattr(plain, name), err_msg=name)
        assert np.all(plain.computed <= chosen.computed) and np.all(chosen.computed <= every.computed)
        if isinstance(rule, DecideRule):  # 9 of 15 streams stop in the first launch: it is not drawn ahead of
            assert chosen_draw.events[:3] == ["draw", "read", "draw"]
            assert chosen.computed.sum() < every.computed.sum()
            stopped_first = chosen.samples <= draw_block_ends(rule.cs, BlockPlan())[0]
            assert stopped_first.sum() >= 9
            np.testing.assert_array_equal(chosen.computed[stopped_first], plain.computed[stopped_first])
    with pytest.raises(ValueError, match="expected"):
        run_blocks(rule, one_block_draw(votes, deferred=True), len(votes), lookahead=True, expected=expected[:3])
    with pytest.raises(ValueError, match="expected"):
        run_blocks(rule, one_block_draw(votes, deferred=True), len(votes), lookahead=True, expected=expected + 1)


@pytest.mark.parametrize("method", METHODS)
def test_launches_of_several_blocks_change_no_answer(method):
    """With ``fill`` a launch takes consecutive blocks of each running stream until it evaluates ``fill`` samples in
    all: every outcome, count, bound and stopping look is the plain driver's; each stream is drawn the same blocks in
    the same order (a prefix of one longer run's); fewer launches when few streams run; what a stream evaluates
    past its stop stays within its last launch."""
    votes = np.random.default_rng(8).binomial(1, np.repeat([0.6, 0.97, 0.99, 0.999, 1.0], 3)[:, None],
                                              size=(15, 20_000))

    def block_draw(deferred=False):
        position = np.zeros(len(votes), dtype=int)
        sizes = [[] for _ in votes]
        calls = []

        def draw(active, blocks):
            segments = np.concatenate([segs for _, segs in blocks])
            edges = np.concatenate([[0], np.cumsum(segments)])
            out = np.array([np.add.reduceat(votes[i, position[i]:position[i] + edges[-1]], edges[:-1])
                            for i in active])
            for i in active:
                sizes[i].extend(size for size, _ in blocks)
            position[active] += sum(size for size, _ in blocks)
            calls.append((len(active), [int(segs.sum()) for _, segs in blocks]))
            return (lambda: out) if deferred else out
        draw.sizes, draw.calls = sizes, calls
        return draw

    for rule in (DecideRule(confidence_sequence(method, 20_000, 0.001), 0.5, SIGMA),
                 EstimateRule(confidence_sequence(method, 20_000, 0.001), SIGMA, 0.05)):
        plain_draw = block_draw()
        plain = run_blocks(rule, plain_draw, len(votes))
        for lookahead in (False, True) if method == DEFAULT_METHOD else (True,):
            filled_draw = block_draw(lookahead)
            filled = run_blocks(rule, filled_draw, len(votes), lookahead=lookahead, fill=3000)
            for name in ("outcome", "successes", "samples", "p_lower", "stop_look"):
                np.testing.assert_array_equal(getattr(filled, name), getattr(plain, name), err_msg=name)
            assert np.all(filled.computed >= plain.computed)
            for mine, theirs in zip(filled_draw.sizes, plain_draw.sizes, strict=True):  # the same blocks in order
                longer, shorter = (mine, theirs) if len(mine) >= len(theirs) else (theirs, mine)
                assert longer[:len(shorter)] == shorter
            assert len(filled_draw.calls) < len(plain_draw.calls)
            assert any(len(evaluated) > 1 for _, evaluated in filled_draw.calls)
            assert all(streams * sum(evaluated[:-1]) < 3000 for streams, evaluated in filled_draw.calls)  # no more
    with pytest.raises(ValueError, match="fill"):
        run_blocks(rule, block_draw(), len(votes), fill=-1)


def test_sequential_test_fed_by_blocks_matches_the_block_driver():
    rule = EstimateRule(confidence_sequence(DEFAULT_METHOD, 10_000, 0.001), SIGMA, 0.05)
    votes = np.random.default_rng(11).binomial(1, 0.985, size=10_000)

    def draw(active, blocks):
        (size, segments), = blocks
        start = draw.position
        draw.position += size
        edges = start + np.concatenate([[0], np.cumsum(segments)])
        return np.add.reduceat(votes[start:edges[-1]], edges[:-1] - start)[None, :]
    draw.position = 0
    blocked = run_blocks(rule, draw, 1)
    test = SequentialTest(rule)
    while not test.done:
        size, segments = test.next_block()
        edges = test.computed + np.concatenate([[0], np.cumsum(segments)])
        test.observe_block(np.add.reduceat(votes[edges[0]:edges[-1]], edges[:-1] - edges[0]))
    assert (test.outcome, test.samples, test.successes, test.computed) == (
        blocked.outcome[0], blocked.samples[0], blocked.successes[0], blocked.computed[0])
    assert test.p_lower == blocked.p_lower[0]


@pytest.mark.parametrize("method", METHODS)
def test_sequential_test_by_blocks_answers_as_look_by_look(method):
    """``observe_block`` evaluates the rule at a block's looks at once: the same outcome, counts, look and bound, to
    the bit, as ``observe`` one look at a time on the same votes (decide and estimate, streams that certify, fail
    and run to the budget); votes that do not fit the block are refused."""
    for rule in (DecideRule(confidence_sequence(method, 20_000, 0.001), 0.5, SIGMA),
                 EstimateRule(confidence_sequence(method, 20_000, 0.001), SIGMA, 0.05)):
        for p_success in (0.6, 0.97, 0.977, 0.99, 1.0):
            votes = np.random.default_rng(int(p_success * 1000)).binomial(1, p_success, size=25_000)
            by_block, by_look = SequentialTest(rule), SequentialTest(rule)
            while not by_block.done:
                _, segments = by_block.next_block()
                edges = by_block.samples + np.concatenate([[0], np.cumsum(segments)])
                by_block.observe_block(np.add.reduceat(votes[edges[0]:edges[-1]], edges[:-1] - edges[0]))
            while not by_look.done:
                needed = by_look.samples_needed
                by_look.observe(int(votes[by_look.samples:by_look.samples + needed].sum()), needed)
            assert (by_block.outcome, by_block.samples, by_block.successes, by_block.look) == (
                by_look.outcome, by_look.samples, by_look.successes, by_look.look)
            assert by_block.p_lower == by_look.p_lower
            assert by_block.observe_block([]) == by_block.outcome  # done: nothing more to record
    fresh = SequentialTest(rule)
    _, segments = fresh.next_block()
    with pytest.raises(ValueError, match="look 0 of the block"):
        fresh.observe_block([segments[0] + 1, *segments[1:]])
    with pytest.raises(ValueError, match="looks"):
        fresh.observe_block([0] * (len(segments) + 1))


def _block_votes(test: SequentialTest, votes: np.ndarray) -> np.ndarray:
    _, segments = test.next_block()
    edges = test.computed + np.concatenate([[0], np.cumsum(segments)])
    return np.add.reduceat(votes[edges[0]:edges[-1]], edges[:-1] - edges[0])


@pytest.mark.parametrize("method", METHODS)
def test_observe_blocks_answers_as_each_test_alone(method, monkeypatch):
    """``observe_blocks`` (the server's path: the blocks counted in one pass read together) leaves every test as
    ``observe_block`` alone does, to the bit, whichever tests are fed together and at whatever block each stands;
    the tests at the same block share one evaluation of the rule, and with the one-sided mixture (each row its own
    looks) every reading is one evaluation, blocks of different lengths padded."""
    import certify.streams as streams

    calls = []
    original = streams.first_outcomes
    monkeypatch.setattr(streams, "first_outcomes",
                        lambda *args: calls.append((len(args[2]), np.ndim(args[1]))) or original(*args))
    rng = np.random.default_rng(7)
    for rule in (DecideRule(confidence_sequence(method, 10_000, 0.001), 0.5, SIGMA),
                 EstimateRule(confidence_sequence(method, 10_000, 0.001), SIGMA, 0.05)):
        p_success = np.array([0.5, 0.9, 0.97, 0.977, 0.99, 0.999, 1.0, 0.0, 0.995, 0.98])
        p_success = p_success[::2] if method == "beta-mixture" else p_success  # its bounds cost 25 ms a block
        votes = rng.binomial(1, p_success[:, None], size=(len(p_success), 12_000))
        together = SequentialTest.many(rule, BlockPlan.for_device("cuda"), len(votes))
        alone = [SequentialTest(rule, BlockPlan.for_device("cuda")) for _ in votes]
        calls.clear()
        readings = 0
        while not all(test.done for test in together):
            running = [i for i, test in enumerate(together) if not test.done]
            fed = [i for i in running if rng.random() < 0.7] or running[:1]  # some wait a round: mixed blocks
            SequentialTest.observe_blocks([together[i] for i in fed],
                                          [_block_votes(together[i], votes[i]) for i in fed])
            readings += 1
        rounds = len(calls)
        for test, stream in zip(alone, votes, strict=True):
            while not test.done:
                test.observe_block(_block_votes(test, stream))
        for a, b in zip(together, alone, strict=True):
            assert (a.outcome, a.samples, a.successes, a.look, a.computed, a.p_lower) == (
                b.outcome, b.samples, b.successes, b.look, b.computed, b.p_lower)
        assert rounds < len(calls) - rounds and max(rows for rows, _ in calls[:rounds]) > 1  # shared, not per test
        if rule.row_looks:  # one evaluation per reading; some readings held blocks of different looks
            assert rounds == readings and any(ndim == 2 for _, ndim in calls[:rounds])
        else:
            assert rounds > readings and all(ndim == 1 for _, ndim in calls)
    fresh = SequentialTest.many(rule, BlockPlan(), 2)
    _, segments = fresh[0].next_block()
    with pytest.raises(ValueError, match="look 0 of the block"):  # the second test's votes are bad: neither moves
        SequentialTest.observe_blocks(fresh, [[0] * len(segments), [segments[0] + 1, *segments[1:]]])
    assert fresh[0].samples == fresh[0].computed == 0
    with pytest.raises(ValueError, match="appears twice"):
        SequentialTest.observe_blocks([fresh[0], fresh[0]], [[0] * len(segments)] * 2)


def test_many_sequential_tests_share_block_ends_but_no_state():
    """SequentialTest.many: each test answers as one built alone, and feeding one leaves the others untouched."""
    rule = DecideRule(confidence_sequence(DEFAULT_METHOD, 10_000, 0.001), 0.5, SIGMA)
    tests = SequentialTest.many(rule, BlockPlan(), 3)
    assert SequentialTest.many(rule, BlockPlan(), 0) == [] and len({id(test) for test in tests}) == 3
    for p_success, test in zip((0.999, 0.9, 0.6), tests, strict=True):
        alone = SequentialTest(rule, BlockPlan())
        votes = np.random.default_rng(int(p_success * 1000)).binomial(1, p_success, size=10_000)
        for fed in (test, alone):
            while not fed.done:
                size, segments = fed.next_block()
                edges = fed.computed + np.concatenate([[0], np.cumsum(segments)])
                fed.observe_block(np.add.reduceat(votes[edges[0]:edges[-1]], edges[:-1] - edges[0]))
        assert (test.outcome, test.samples, test.successes, test.computed, test.p_lower) == (
            alone.outcome, alone.samples, alone.successes, alone.computed, alone.p_lower)
    assert len({(test.outcome, test.samples) for test in tests}) == 3  # three different answers: nothing shared


def test_block_ends_are_computed_once_per_confidence_sequence_and_plan():
    cs = confidence_sequence(DEFAULT_METHOD, 10_000, 0.001)
    plan = BlockPlan.for_device("cuda")
    ends = shared_block_ends(cs, plan)
    np.testing.assert_array_equal(ends, draw_block_ends(cs, plan))
    assert shared_block_ends(cs, plan) is ends and not ends.flags.writeable  # shared, read only
    assert shared_block_ends(cs, BlockPlan.for_device("cpu")) is not ends
    other = confidence_sequence(DEFAULT_METHOD, 10_000, 0.001)  # an equal sequence, another object
    np.testing.assert_array_equal(shared_block_ends(other, plan), ends)
