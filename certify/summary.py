"""The numbers of a certification run: certified accuracy at each radius, the run's summary (summary.json).

Definitions (Cohen et al., 2019; the TransDenoiser paper's CertAcc):
- certified accuracy at radius r: the share of images whose certified prediction is correct with a
  certified L2 radius >= r (abstentions count as wrong); at r = 0 it is the smoothed clean accuracy;
- average certified radius (ACR): the mean over all images of the radius when the prediction is
  correct and 0 otherwise (abstentions and wrong predictions count 0);
- each certificate holds with probability >= 1 - alpha over the Monte Carlo sampling.
Their text (tables, report.md) is in :mod:`certify.report`, their figures in :mod:`certify.figures`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from certify.core import ABSTAIN, max_certifiable_radius
from certify.rundir import CertifyRecord, PredictRecord, Record
from transdenoiser.errors import UserError

RADIUS_STEP = 0.25  # table radii: 0, 0.25, 0.5, ... (L2, [0,1]-pixel units)
ACR_DEFINITION = ("mean over all images of the certified radius when the prediction is correct, 0 otherwise "
                  "(abstentions and wrong predictions count 0)")
GUARANTEE = ("each certificate is a statement about the smoothed classifier g(x) = argmax_c P[f(D(x+e)) = c], "
             "e ~ N(0, sigma^2 I), that holds with probability >= 1 - alpha over the Monte Carlo sampling")
DECIDE_NOT_CERTIFIED = ("; a 'not certified at the radius' answer says that the class chosen by the n0 selection "
                        "samples has pA < Phi(R / sigma), wrong with probability <= alpha; it says nothing of other "
                        "classes (when the selection chose another class than g's, g may be certified at R)")


# ----------------------------------------------------------------------------------------------- numbers

def radius_grid(largest: float, step: float = RADIUS_STEP) -> list[float]:
    """0, step, 2 step, ... up to ``largest`` (inclusive, with a little tolerance)."""
    return [round(k * step, 10) for k in range(int(math.floor(largest / step + 1e-9)) + 1)]


def certified_accuracy(records: Sequence[CertifyRecord] | Sequence[Mapping[str, Any]], radius: float) -> float:
    """Certified accuracy at ``radius``: the fraction (in [0, 1]) of ``records`` whose prediction is correct with a
    certified L2 radius >= ``radius`` (radii in the pixel units of images in [0, 1]). An abstention is never
    correct, so it counts as wrong. NaN when there are no records.

    ``records``: :class:`CertifyRecord` rows, or mappings with ``"radius"`` and ``"correct"`` (rows read back from
    a file). The package's one definition of certified accuracy; the baselines' tables and the reproduction
    script's figures call it.
    """
    if not records:
        return float("nan")
    return sum(1 for r in records if (r["correct"] and r["radius"] >= radius if isinstance(r, Mapping)
                                      else r.correct and r.radius >= radius)) / len(records)


def _timing(records: Sequence[Record], samples_per_image: int) -> dict[str, float | None]:
    """Speed of the rows; adaptive rows count the samples each image used, others ``samples_per_image`` each."""
    seconds = sum(r.seconds for r in records)
    samples = sum(samples_per_image if getattr(r, "samples", None) is None else r.samples for r in records)
    return {"seconds_per_image": seconds / len(records) if records else None,
            "noisy_samples_per_second": samples / seconds if seconds > 0 else None}


def adaptive_summary(records: Sequence[CertifyRecord], sigma: float, n0: int, n_max: int, alpha: float,
                     adaptive: dict[str, Any]) -> dict[str, Any]:
    """What an adaptive run adds to the summary: samples per image and the saving against fixed n = ``n_max``."""
    from certify.core import sequential_rule
    from certify.sequential import radius_of

    samples = np.array([r.samples for r in records], dtype=float)
    fixed = n0 + n_max
    mode = adaptive["mode"]
    rule = sequential_rule(mode, sigma, n_max, alpha, radius=adaptive.get("radius"),
                           tolerance=adaptive.get("tolerance"), method=adaptive.get("sequential_method"))
    if mode == "decide":
        largest_possible = float(adaptive["radius"])
        note = "decide mode certifies at the one radius asked, or not at all"
    else:
        largest_possible = float(radius_of(rule.cs.lower(np.array([n_max]), len(rule.looks) - 1), sigma)[0])
        note = (f"sigma * Phi^-1(lower bound of {n_max}/{n_max}) at the last look: no certificate with this budget "
                "and alpha can exceed it")
    return {"mode": mode, "radius": adaptive.get("radius"), "tolerance": adaptive.get("tolerance"),
            "sequential": rule.cs.describe(),
            "samples_per_image": {"mean": float(samples.mean()), "median": float(np.median(samples)),
                                  "max": int(samples.max()), "note": "noisy samples per image, n0 included"},
            "fixed_n_samples_per_image": fixed,
            "saving_vs_fixed_n": fixed / float(samples.mean()),
            "saving_note": f"(n0 + n_max) = {fixed} samples per image of Cohen's CERTIFY at n = n_max, over the mean "
                           "samples per image of this run",
            "max_certifiable_radius": largest_possible, "max_certifiable_radius_note": note}


def _outcome_rates(records: Sequence[Record]) -> dict[str, float]:
    """Shares of abstentions and of wrong (non-abstaining) predictions."""
    count = len(records)
    return {"abstention_rate": sum(r.prediction == ABSTAIN for r in records) / count,
            "wrong_rate": sum(not r.correct and r.prediction != ABSTAIN for r in records) / count}


def summarize(records: Sequence[CertifyRecord], sigma: float, n0: int, n: int, alpha: float,
              radius_step: float = RADIUS_STEP, adaptive: dict[str, Any] | None = None) -> dict[str, Any]:
    """Results of a certification: accuracies, abstention, certified accuracy per radius, ACR, timing.

    ``adaptive``: the run's ``mode`` (decide / estimate), ``radius``, ``tolerance`` and ``sequential_method``
    for an adaptive run (then ``n`` is the budget n_max); adds samples per image and the saving."""
    if not records:
        raise UserError("no certified images to summarize")
    count = len(records)
    extra = adaptive_summary(records, sigma, n0, n, alpha, adaptive) if adaptive else {}
    largest_possible = extra.get("max_certifiable_radius", max_certifiable_radius(sigma, n, alpha))
    largest = max(r.radius for r in records)
    decide = extra.get("mode") == "decide"
    # decide mode answers one question per image (certified at R or not): only the row at R is measured
    grid = [largest_possible] if decide else radius_grid(largest_possible, radius_step)
    table = [{"radius": r, "certified_accuracy": certified_accuracy(records, r)} for r in grid]
    rates = _outcome_rates(records)
    summary = {
        "task": "certify",
        "images": count,
        "smoothed_clean_accuracy": None if decide else sum(r.correct for r in records) / count,
        **rates,
        "certified_accuracy": table,
        "average_certified_radius": None if decide else sum(r.radius for r in records if r.correct) / count,
        "average_certified_radius_definition": ACR_DEFINITION,
        "largest_certified_radius": largest,
        "max_certifiable_radius": largest_possible,
        "max_certifiable_radius_note": f"sigma * Phi^-1(Clopper-Pearson lower bound of {n}/{n}) at alpha {alpha:g}: "
                                       "no certificate with these n and alpha can exceed it",
        "sigma": sigma, "n0": n0, "n": n, "alpha": alpha,
        "guarantee": GUARANTEE,
        **_timing(records, n0 + n),
    }
    if extra:
        summary.update(extra)
        summary["guarantee"] = GUARANTEE + (
            "; the bound on pA is anytime-valid (a confidence sequence), so it holds at the data-dependent "
            "stopping time" + (DECIDE_NOT_CERTIFIED if decide else ""))
    if decide:
        # each row keeps the selected class; certified at R iff its radius is R (> 0), not certified: radius 0
        certified = [r for r in records if r.radius > 0]
        summary["abstention_rate"] = summary["wrong_rate"] = None
        summary["decide"] = {
            "radius": largest_possible,
            "certified_correct": sum(r.correct for r in certified) / count,
            "certified_wrong": sum(not r.correct for r in certified) / count,
            "not_certified": (count - len(certified)) / count,
            "note": "decide mode answers one question per image, certified at the radius or not: it measures no "
                    "clean accuracy, no abstention and no certified accuracy at any other radius (hence null); "
                    "a row that is not certified keeps the class the n0 selection samples chose, with radius 0"}
    return summary


def summarize_predictions(records: Sequence[PredictRecord], sigma: float, n: int, alpha: float) -> dict[str, Any]:
    """Results of a prediction run: smoothed accuracy and abstention rate (Cohen's PREDICT), timing."""
    if not records:
        raise UserError("no predicted images to summarize")
    count = len(records)
    return {
        "task": "predict",
        "images": count,
        "smoothed_accuracy": sum(r.correct for r in records) / count,
        **_outcome_rates(records),
        "sigma": sigma, "n": n, "alpha": alpha,
        "guarantee": "a prediction that is not ABSTAIN differs from the smoothed classifier's with probability "
                     "<= alpha (two-sided binomial test between the two top counts)",
        **_timing(records, n),
    }
