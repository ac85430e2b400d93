"""Paired comparison of two certification runs on the same test images.

Two runs certified on the same images (``--skip``/``--indices``, ideally the same ``--seed``, so each image's noise
draws are shared too) differ in certified accuracy at radius r by the mean over images of
1[certified correctly at r by ours] - 1[... by theirs]. Its 95% interval comes from a paired bootstrap over
images: resample the images with replacement, recompute the mean difference, take the 2.5% and 97.5% quantiles.
Pairing removes the between-image variance both runs share, so the interval is much narrower than two separate
binomial intervals. The interval is about the test images drawn (a different 500 images would give a
different number); it says nothing of training variance (seeds) and assumes each certificate is as run.

"Certified correctly at r": the prediction is correct (not an abstention) and the certified radius is >= r; at
r = 0 every correct prediction counts (the smoothed clean accuracy), as in ``certify.report``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from certify.rundir import CertifyRecord
from transdenoiser.errors import UserError

BOOTSTRAP_RESAMPLES = 10_000


@dataclass(frozen=True)
class PairedDifference:
    """``ours - theirs`` in certified accuracy (a share of images, not points) at each radius (or, from
    :func:`paired_outcomes`, at each column: ``radii`` then names the columns), with a paired-bootstrap interval at
    ``confidence``."""

    radii: tuple[float, ...]
    images: int
    difference: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    confidence: float
    resamples: int

    def as_dict(self) -> dict:
        """JSON-ready: every field, tuples as lists."""
        return {"images": self.images, "radii": list(self.radii), "difference": list(self.difference),
                "low": list(self.low), "high": list(self.high), "confidence": self.confidence,
                "resamples": self.resamples}


def certified_matrix(records: Sequence[CertifyRecord], radii: Sequence[float],
                     indices: Sequence[int] | None = None) -> np.ndarray:
    """(images, radii) array of 0/1: image certified correctly at each radius, images in ``indices`` order
    (default: the records' own order)."""
    by_index = {r.idx: r for r in records}
    order = [r.idx for r in records] if indices is None else list(indices)
    return np.array([[record.correct and (radius == 0 or record.radius >= radius) for radius in radii]
                     for record in (by_index[i] for i in order)], dtype=float).reshape(len(order), len(radii))


def bootstrap_picks(images: int, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples, images) indices drawn with replacement: one set shared by every comparison on these images, so
    statistics built from several arms (e.g. a gap between two others) are resampled jointly."""
    if images < 1:
        raise UserError("a paired comparison needs at least one image")
    return np.random.default_rng(seed).integers(0, images, size=(resamples, images))


def paired_difference(ours: Sequence[CertifyRecord], theirs: Sequence[CertifyRecord], radii: Sequence[float],
                      resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                      confidence: float = 0.95) -> PairedDifference:
    """Certified accuracy of ``ours`` minus ``theirs`` at each radius, paired over their common images.

    Both runs must hold the same images (by test-set index); otherwise the pairing is undefined and this refuses.
    """
    mine, other = {r.idx for r in ours}, {r.idx for r in theirs}
    if mine != other:
        raise UserError(f"a paired comparison needs the same images in both runs: {len(mine - other)} only in one, "
                        f"{len(other - mine)} only in the other")
    indices = sorted(mine)
    return paired_outcomes(certified_matrix(ours, radii, indices), certified_matrix(theirs, radii, indices), radii,
                           resamples, seed, confidence)


def paired_outcomes(ours: np.ndarray, theirs: np.ndarray, columns: Sequence[float],
                    resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                    confidence: float = 0.95) -> PairedDifference:
    """The same for any per-image outcomes: (images, columns) arrays of 0/1 (e.g. correct under attack at each
    bound), rows the same images in the same order. ``columns`` names the columns (radii, bounds)."""
    ours, theirs = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    if ours.shape != theirs.shape or ours.ndim != 2 or ours.shape[1] != len(columns):
        raise UserError(f"paired outcomes need two (images, {len(columns)}) arrays of the same shape, got "
                        f"{ours.shape} and {theirs.shape}")
    if not 0 < confidence < 1:
        raise UserError(f"confidence must lie in (0, 1), got {confidence}")
    picks = bootstrap_picks(len(ours), resamples, seed)
    resampled = (ours[picks] - theirs[picks]).mean(axis=1)  # (resamples, columns)
    tail = (1 - confidence) / 2
    low, high = np.quantile(resampled, [tail, 1 - tail], axis=0)
    return PairedDifference(radii=tuple(float(c) for c in columns), images=len(ours),
                            difference=tuple(float(d) for d in (ours - theirs).mean(axis=0)),
                            low=tuple(float(x) for x in low), high=tuple(float(x) for x in high),
                            confidence=confidence, resamples=resamples)


def points_cell(difference: float, low: float, high: float) -> str:
    """A difference of shares and its interval as one table cell in points: '+3.6 [+1.6, +5.8]'."""
    return f"{100 * difference:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def points_cells(entry: PairedDifference | dict) -> list[str]:
    """Every column's cell, from a PairedDifference or its ``as_dict()``."""
    values = entry if isinstance(entry, dict) else entry.as_dict()
    return [points_cell(*cell) for cell in zip(values["difference"], values["low"], values["high"], strict=True)]


def format_points(difference: PairedDifference, column: int) -> str:
    """One column's cell in points: '+3.6 [+1.6, +5.8]'."""
    return points_cell(difference.difference[column], difference.low[column], difference.high[column])
