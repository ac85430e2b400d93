"""Adaptive certification: Cohen's selection, then a sequential test of the selected class on fresh samples.

:func:`adaptive_many` selects each image's class with n0 samples, then runs a stopping rule of
:mod:`certify.sequential` (decide at a radius, or estimate the largest radius) on the image's estimation
stream, drawn block by block (:func:`certify.streams.run_blocks`, the device's :class:`certify.streams.BlockPlan`):
every active image's next block shares the
forward passes, and the rule is evaluated at every look of a block at once. Each image draws from its own
generator, selection first, then its blocks in order, so an answer depends on the image's generator and its own
votes only: never on the batch size, the device's pass size or the other images.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from certify.confidence import DEFAULT_METHOD, confidence_sequence
from certify.decisions import ABSTAIN, validate_sampling
from certify.ladder import ladder, radius_on_grid
from certify.sequential import CERTIFIED, DEFAULT_TOLERANCE, OUTCOME_NAMES, DecideRule, EstimateRule, FixedRule
from certify.streams import BlockPlan, run_blocks
from transdenoiser.errors import UserError

LADDER_METHOD = "one-sided-mixture"  # the confidence sequence whose decide tests form the ladder


@dataclass(frozen=True)
class AdaptiveCertificate:
    """Result of :meth:`Smooth.decide` or :meth:`Smooth.certify_adaptive` for one image.

    ``mode``: ``decide`` (certified at ``radius``?), ``estimate`` (largest radius under the budget) or ``fixed``
    (the server's fixed-n answer: the highest rung of the ladder certified at n, :mod:`certify.ladder`).
    ``outcome``: certified / not_certified / budget_spent (decide), estimated (estimate).
    ``n``: estimation samples used (at most ``n_max``); ``samples`` = n0 + n, all noisy samples used.
    ``computed``: estimation samples evaluated: ``n`` plus the rest of the block the test stopped in (and any block
    drawn ahead of it and left unread: offline lookahead, the server's ``overlap``).
    ``p_lower``: the anytime-valid lower bound on pA at the stop (decide: Phi(R / sigma) when certified).
    A decide answer keeps the class the n0 selection samples chose, certified or not: ``certified`` says which.
    """

    prediction: int  # class index, or ABSTAIN (estimate: pA < 1/2; decide: always the selected class)
    radius: float  # certified L2 radius ([0,1]-pixel units); 0.0 when abstaining or not certified at R
    p_lower: float
    count: int  # estimation samples that voted for the selected class
    n0: int
    n: int
    n_max: int
    mode: str
    outcome: str
    computed: int = -1  # estimation samples evaluated (-1: not recorded)

    @property
    def abstained(self) -> bool:
        return self.prediction == ABSTAIN

    @property
    def samples(self) -> int:
        return self.n0 + self.n

    @property
    def certified(self) -> bool | None:
        """Decide: True (certified at the radius), False (not certified), None (budget spent, no claim either way);
        estimate: whether a positive radius was certified."""
        if self.mode == "decide":
            return {"certified": True, "not_certified": False}.get(self.outcome)
        return not self.abstained and self.radius > 0


def sequential_rule(mode: str, sigma: float, n_max: int, alpha: float, radius: float | None = None,
                    tolerance: float | None = None, method: str | None = None):
    """The stopping rule of :meth:`Smooth.decide` (``mode="decide"``, needs ``radius``) or
    :meth:`Smooth.certify_adaptive` (``mode="estimate"``), or the server's fixed-n answer (``mode="fixed"``, n_max
    the request's n): feed it to :class:`certify.streams.SequentialTest` to drive it from counts computed elsewhere.

    With the default confidence sequence (one-sided-mixture) every rule reads the ladder of (alpha, sigma)
    (:mod:`certify.ladder`): decide's radius is rounded up to its grid, estimate's radius is a rung, and every
    certificate about one image's stream, whatever the mode, budget or radius, is one test at level alpha. The other
    methods answer each call at alpha on its own."""
    validate_sampling(None, n_max, alpha)
    method = method or DEFAULT_METHOD
    cs = confidence_sequence(method, n_max, alpha)
    joint = ladder(alpha, sigma) if method == LADDER_METHOD else None
    if mode == "decide":
        if radius is None:
            raise UserError("deciding needs the radius to decide at")
        return DecideRule(cs, radius_on_grid(float(radius)) if joint else float(radius), sigma, joint)
    if mode == "estimate":
        return EstimateRule(cs, sigma, DEFAULT_TOLERANCE if tolerance is None else float(tolerance), joint)
    if mode == "fixed":
        if joint is None:
            raise UserError(f"a fixed-n answer from the stream needs the {LADDER_METHOD} method, got {method!r}")
        return FixedRule(cs, sigma, joint)
    raise UserError(f"mode must be 'decide', 'estimate' or 'fixed', got {mode!r}")


def rule_mode(rule) -> str:
    """The mode of a rule of :func:`sequential_rule`."""
    return "decide" if isinstance(rule, DecideRule) else "fixed" if isinstance(rule, FixedRule) else "estimate"


def adaptive_certificate(rule, mode: str, top: int, outcome: int, count: int, n: int, p_lower: float,
                         n0: int, sigma: float, computed: int = -1) -> AdaptiveCertificate:
    """The certificate of one finished sequential test on the class ``top`` chosen by n0 selection samples."""
    if mode == "decide":
        certified = outcome == CERTIFIED
        return AdaptiveCertificate(top, float(rule.radius) if certified else 0.0,  # the class, certified or not
                                   p_lower, count, n0, n, rule.cs.n_max, mode, OUTCOME_NAMES[outcome], computed)
    radius = float(rule.radius(p_lower))
    return AdaptiveCertificate(top if p_lower >= 0.5 else ABSTAIN, radius, p_lower, count, n0, n, rule.cs.n_max,
                               mode, OUTCOME_NAMES[outcome], computed)


def adaptive_many(smooth, images: torch.Tensor, n0: int, rule,
                  generators: Sequence[torch.Generator | None], lookahead: bool | None = None,
                  fill: int | None = None, plan: BlockPlan | None = None) -> list[AdaptiveCertificate]:
    """Select each image's class with n0 samples, then run ``rule`` on fresh estimation samples of that class,
    block by block, the active images' blocks packed into shared forward passes (module docstring). ``smooth``
    is a :class:`certify.core.Smooth`. Two ways to keep a GPU busy, both on CUDA only by default (on CPU a sample
    evaluated past a stop costs its full compute), neither changing an answer (:func:`certify.streams.run_blocks`):
    ``lookahead`` queues each image's next launch before its current votes are read, unless more than a quarter of
    the images in it are expected to stop first (at their vote rate so far, or their selection samples' before
    it); ``fill`` (default: the batch size) makes a launch take several consecutive blocks of each running image
    until it fills a pass, so the last few images left do not run one small pass per block. Samples evaluated past
    a stop are counted in ``computed``. ``plan``: how each image's samples are cut into blocks (default: the
    device's :meth:`certify.streams.BlockPlan.for_device`; a run setting: another plan draws other noise)."""
    if n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    selection = smooth.sample_counts_many(images, [n0], generators)[:, 0]
    top = selection.argmax(axis=1)

    on_device = images.to(smooth.device)

    def draw(active: np.ndarray, blocks: list[tuple[int, np.ndarray]]):
        counts = smooth.queue_counts_blocks(smooth.take_rows(on_device, active), blocks,
                                            [generators[i] for i in active])
        return lambda: counts()[np.arange(len(active)), :, top[active]]

    mode = rule_mode(rule)
    on_gpu = smooth.device.type == "cuda"
    if lookahead is None:
        lookahead = on_gpu
    if fill is None:
        fill = smooth.batch_size if on_gpu else 0
    if plan is None:
        plan = BlockPlan.for_device(smooth.device.type)
    expected = selection[np.arange(len(top)), top] / n0  # the selected class's share: who is about to stop
    results = run_blocks(rule, draw, images.shape[0], plan, lookahead, fill, expected)
    return [adaptive_certificate(rule, mode, int(top[j]), int(results.outcome[j]), int(results.successes[j]),
                                 int(results.samples[j]), float(results.p_lower[j]), n0, smooth.sigma,
                                 int(results.computed[j]))
            for j in range(images.shape[0])]
