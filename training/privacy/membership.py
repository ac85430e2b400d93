"""Membership inference on a trained denoiser: members (private training examples) vs non-members (test split).

Two attacks, each one class with a ``scores`` method (higher score = more likely a member):

- :class:`LossThresholdAttack` (Yeom et al. 2018): score = minus the reconstruction loss.
- :class:`CalibratedAttack` (per-example difficulty; LiRA offline, Carlini et al. 2022, with the
  difficulty calibration of Watson et al. 2022): K reference denoisers trained the same way on public data
  (for which every candidate is a non-member) give each example's "out" loss distribution; score =
  -(log L_target - mean_k log L_ref_k) / std, with a per-example std when K >= 4, else one pooled std (a
  common scale: the ranking is then that of the difference).

Metrics: ROC AUC (Mann-Whitney, ties counted 1/2) and the TPR at a fixed FPR (0.1% by default), with the
threshold chosen on the non-members so that at most floor(FPR n_non) of them score strictly above it.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

DEFAULT_FPR = 1e-3
MIN_STD = 1e-12
PER_EXAMPLE_STD_REFERENCES = 4


def roc_auc(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> float:
    """P[member score > non-member score] + P[tie] / 2, from the ranks of the pooled scores."""
    members = np.asarray(member_scores, dtype=np.float64)
    non = np.asarray(nonmember_scores, dtype=np.float64)
    if members.size == 0 or non.size == 0:
        raise ValueError("need at least one member and one non-member")
    ranks = stats.rankdata(np.concatenate([members, non]))
    u = ranks[:members.size].sum() - members.size * (members.size + 1) / 2
    return float(u / (members.size * non.size))


def tpr_at_fpr(member_scores: np.ndarray, nonmember_scores: np.ndarray, fpr: float = DEFAULT_FPR) -> float:
    """Share of members scoring strictly above the threshold that at most floor(fpr n_non) non-members exceed."""
    members = np.asarray(member_scores, dtype=np.float64)
    non = np.sort(np.asarray(nonmember_scores, dtype=np.float64))[::-1]
    allowed = int(math.floor(fpr * non.size))
    threshold = non[allowed] if allowed < non.size else -np.inf
    return float((members > threshold).mean())


def attack_metrics(member_scores: np.ndarray, nonmember_scores: np.ndarray, fpr: float = DEFAULT_FPR) -> dict:
    return {"auc": roc_auc(member_scores, nonmember_scores),
            "tpr_at_fpr": tpr_at_fpr(member_scores, nonmember_scores, fpr), "fpr": fpr,
            "members": int(np.size(member_scores)), "nonmembers": int(np.size(nonmember_scores)),
            "fpr_resolution": 1.0 / max(1, int(np.size(nonmember_scores)))}


class LossThresholdAttack:
    name = "loss_threshold"

    def scores(self, target_losses: np.ndarray) -> np.ndarray:
        return -np.asarray(target_losses, dtype=np.float64)


class CalibratedAttack:
    """Offline LiRA / difficulty calibration against ``reference_losses`` of shape (K, n)."""

    name = "calibrated"

    def __init__(self, reference_losses: np.ndarray):
        refs = np.log(np.maximum(np.asarray(reference_losses, dtype=np.float64), MIN_STD))
        if refs.ndim != 2 or refs.shape[0] < 1:
            raise ValueError("reference_losses must have shape (K >= 1, n)")
        self.mean = refs.mean(0)
        if refs.shape[0] >= PER_EXAMPLE_STD_REFERENCES:
            self.std = np.maximum(refs.std(0, ddof=1), MIN_STD)
        elif refs.shape[0] >= 2:
            self.std = np.full(refs.shape[1], max(float((refs - self.mean).std(ddof=1)), MIN_STD))
        else:
            self.std = np.ones(refs.shape[1])

    def scores(self, target_losses: np.ndarray) -> np.ndarray:
        target = np.log(np.maximum(np.asarray(target_losses, dtype=np.float64), MIN_STD))
        return -(target - self.mean) / self.std


__all__ = ["CalibratedAttack", "DEFAULT_FPR", "LossThresholdAttack", "attack_metrics", "roc_auc", "tpr_at_fpr"]
