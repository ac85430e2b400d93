"""Convex losses of a linear head ``W`` (d x K) on features ``x`` with ``||x||_2 <= 1``, in float64 numpy.

Each loss is the DATA term l(W; x, y) of the objective F(W) = (1/n) sum_i l(W; x_i, y_i) + (lambda/2) ||W||_F^2
and carries two constants valid for every W and every example with ``||x|| <= 1``:

- ``lipschitz`` L: a bound on ||grad_W l(W; x, y)||_F (so two examples' gradients differ by at most 2L);
- ``smoothness`` beta: a bound on the largest eigenvalue of the Hessian of l (the objective F is then
  (beta + lambda)-smooth and lambda-strongly convex).

The regulariser's gradient lambda W is the same on neighbouring datasets, so only the data term's L enters
any sensitivity. Labels are class indices 0..K-1; for one-vs-rest losses column k gets +1 for class k and -1
otherwise; ``num_classes == 2`` with ``binary=True`` uses a single column (+1 for class 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from transdenoiser.errors import UserError

LOSSES = ("logistic", "softmax", "huber-svm")
DEFAULT_HUBER_H = 0.5  # the paper's h


@dataclass(frozen=True)
class ConvexLoss:
    """One of :data:`LOSSES` for ``num_classes`` classes (``columns`` output columns)."""

    name: str
    num_classes: int
    binary: bool = False
    huber_h: float = DEFAULT_HUBER_H

    def __post_init__(self):
        if self.name not in LOSSES:
            raise UserError(f"unknown loss {self.name!r}; expected one of {', '.join(LOSSES)}")
        if self.num_classes < 2:
            raise UserError(f"a classifier needs at least 2 classes, got {self.num_classes}")
        if self.binary and (self.num_classes != 2 or self.name == "softmax"):
            raise UserError("binary=True needs 2 classes and a one-vs-rest loss (logistic or huber-svm)")
        if not self.huber_h > 0:
            raise UserError(f"Huber width h must be > 0, got {self.huber_h}")

    @property
    def columns(self) -> int:
        return 1 if self.binary else self.num_classes

    @property
    def lipschitz(self) -> float:
        """sup ||grad_W l||_F for ||x|| <= 1. One-vs-rest: each column's |l'| <= 1, so sqrt(K) jointly.
        Softmax: ||p - e_y|| <= sqrt(2) (since sum_{k != y} p_k^2 <= (1 - p_y)^2)."""
        if self.name == "softmax":
            return math.sqrt(2.0)
        return math.sqrt(self.columns)

    @property
    def smoothness(self) -> float:
        """Largest Hessian eigenvalue for ||x|| <= 1: logistic 1/4 per column (block diagonal), Huber 1/(2h),
        softmax 1/2 (the largest eigenvalue of diag(p) - p p^T)."""
        return {"logistic": 0.25, "softmax": 0.5, "huber-svm": 1.0 / (2.0 * self.huber_h)}[self.name]

    def signs(self, labels: np.ndarray) -> np.ndarray:
        """+-1 targets, shape (n, columns), for the one-vs-rest losses."""
        labels = np.asarray(labels)
        if self.binary:
            return np.where(labels == 1, 1.0, -1.0)[:, None]
        return np.where(labels[:, None] == np.arange(self.num_classes)[None, :], 1.0, -1.0)

    def zero_loss(self) -> float:
        """l(0; x, y), the same for every example: log 2 per column, log K for softmax, H(0) = 1 per column."""
        if self.name == "softmax":
            return math.log(self.num_classes)
        per_column = math.log(2.0) if self.name == "logistic" else self._huber(np.zeros(1))[0]
        return float(per_column) * self.columns

    # -- values and derivatives ---------------------------------------------------------------------------------

    def _huber(self, u: np.ndarray) -> np.ndarray:
        h, v = self.huber_h, 1.0 - u
        return np.where(v > h, v, np.where(v < -h, 0.0, v * v / (4 * h) + v / 2 + h / 4))

    def _huber_derivative(self, u: np.ndarray) -> np.ndarray:
        h, v = self.huber_h, 1.0 - u
        return np.where(v > h, -1.0, np.where(v < -h, 0.0, -(v / (2 * h) + 0.5)))

    def coefficients(self, W: np.ndarray, X: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-example losses (n,) and G (n, columns) with grad_W l(W; x_i, y_i) = outer(x_i, G_i).

        ``targets``: :meth:`signs` for one-vs-rest losses, integer labels for softmax.
        """
        scores = X @ W
        if self.name == "softmax":
            logp = scores - special.logsumexp(scores, axis=1, keepdims=True)
            n = len(targets)
            losses = -logp[np.arange(n), targets]
            G = np.exp(logp)
            G[np.arange(n), targets] -= 1.0
            return losses, G
        margins = scores * targets
        if self.name == "logistic":
            losses = np.logaddexp(0.0, -margins).sum(1)
            G = -special.expit(-margins) * targets
        else:
            losses = self._huber(margins).sum(1)
            G = self._huber_derivative(margins) * targets
        return losses, G

    def targets(self, labels: np.ndarray) -> np.ndarray:
        return np.asarray(labels, dtype=np.int64) if self.name == "softmax" else self.signs(labels)

    def objective(self, W: np.ndarray, X: np.ndarray, targets: np.ndarray, reg: float) -> tuple[float, np.ndarray]:
        """F(W) and its gradient (d, columns)."""
        losses, G = self.coefficients(W, X, targets)
        n = len(X)
        return float(losses.mean() + 0.5 * reg * np.sum(W * W)), X.T @ G / n + reg * W

    def predict(self, W: np.ndarray, X: np.ndarray) -> np.ndarray:
        scores = X @ W
        if self.binary:
            return (scores[:, 0] > 0).astype(np.int64)
        return scores.argmax(1)
