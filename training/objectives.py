"""What the denoiser minimises, per example: the training objectives (``objective`` in the config, ``--objective``).

- ``mse``: ``||D(x + noise) - x||^2`` summed over pixels (eq. 1 of the TransDenoiser paper; the default);
- ``stability``: ``CE(f(D(x + noise)), argmax f(x))`` with f the frozen classifier: the target is f's prediction
  on the clean private image, no label is read (Salman et al. 2020, denoised smoothing);
- ``classification``: ``CE(f(D(x + noise)), y)`` with the private label y;
- ``stability+mse``: the reference's recipe: MSE on the public split first (a public initialisation, no privacy
  spent), then the stability loss on the private split (:data:`PHASES`).

Every loss of one example is a function of that example alone (its image, its label, its input noise) and of the
frozen classifier, which is trained on the public split and never changes: the classifier runs in eval mode (no
batch statistics, BatchNorm's running statistics untouched) and none of its parameters requires a gradient. So an
example's clipped gradient is its own and per-example clipping bounds what it adds to the clipped sum by C, with
every objective: the privacy analysis of the DP arms is unchanged (docs/PRIVACY.md). The transdenoiser arm's
analysis (Algorithm 1's Taylor split of a quadratic loss) holds for ``mse`` only; its config refuses the others.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

OBJECTIVES = ("mse", "stability", "classification", "stability+mse")
# the objective of each phase: (public phase, private phase); None: no public phase
PHASES: dict[str, tuple[str | None, str]] = {"mse": (None, "mse"), "stability": (None, "stability"),
                                             "classification": (None, "classification"),
                                             "stability+mse": ("mse", "stability")}
LOSSES = ("mse", "stability", "classification")  # what one step minimises
# objective stability+mse without --init-from: the public MSE phase the run trains first (nodp on the public split,
# the settings of the public initialisation docs/TRAINING.md measured: batch 64, Adam at 1e-3; the run's epochs)
PUBLIC_PHASE = {"arm": "nodp", "train_on": "public", "objective": "mse", "batch_size": 64, "optimizer": "adam",
                "learning_rate": 1e-3, "init_from": None, "ema_decay": 0.0}
PUBLIC_PHASE_SOURCE = "this run's MSE phase on the public split (objective stability+mse)"
TARGET_CHUNK = 1024  # rows per forward pass of the classifier when it labels a batch (stability targets)


def freeze_classifier(classifier: nn.Module) -> nn.Module:
    """``classifier`` in eval mode with no parameter requiring a gradient (changed in place; returned)."""
    classifier.eval()
    for p in classifier.parameters():
        p.requires_grad_(False)
    return classifier


def squared_error(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Eq. (1) per row: ``||D(z) - x||^2`` summed over pixels, shape (n,)."""
    return (out - target).pow(2).flatten(1).sum(1)


@dataclass
class Objective:
    """One step's loss: ``row_loss(D(z), targets(x, labels))`` per row. ``loss`` is one of :data:`LOSSES`;
    ``classifier`` (frozen by :func:`build_objective`) is read by the two cross-entropy losses only."""

    loss: str = "mse"
    classifier: nn.Module | None = None

    @property
    def needs_labels(self) -> bool:
        return self.loss == "classification"

    def _frozen(self) -> nn.Module:
        if self.classifier is None:
            raise ValueError(f"objective {self.loss} needs the frozen classifier")
        if self.classifier.training:
            raise ValueError("the frozen classifier must stay in eval mode (its batch statistics would tie the "
                             "examples' losses together)")
        return self.classifier

    def targets(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Each row's target, from that row alone: the clean image (mse), the classifier's prediction on it
        (stability), its label (classification)."""
        if self.loss == "mse":
            return x
        if self.loss == "classification":
            if labels is None:
                raise ValueError("objective classification needs the private labels")
            return labels.to(x.device)
        classifier = self._frozen()
        with torch.no_grad():
            if len(x) == 0:
                return torch.zeros(0, dtype=torch.int64, device=x.device)
            return torch.cat([classifier(part).argmax(1) for part in torch.split(x, TARGET_CHUNK)])

    def synthetic_targets(self, x: torch.Tensor) -> torch.Tensor:
        """Targets of the right kind for a synthetic batch (engine timing; no private data): the clean image, or
        the classifier's prediction on it."""
        return x if self.loss == "mse" else Objective("stability", self.classifier).targets(x)

    def row_loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss of each row, shape (n,): squared error summed over pixels, or the cross-entropy of the frozen
        classifier's logits on the denoised rows against the targets."""
        if self.loss == "mse":
            return squared_error(out, target)
        return F.cross_entropy(self._frozen()(out), target, reduction="none")


def build_objective(loss: str, classifier: nn.Module | None) -> Objective:
    """The :class:`Objective` of one phase's ``loss`` (:data:`LOSSES`); freezes ``classifier`` (eval mode, no
    gradients) when the loss reads it."""
    if loss not in LOSSES:
        raise ValueError(f"a step's loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    if loss != "mse" and classifier is not None:
        freeze_classifier(classifier)
    return Objective(loss, classifier if loss != "mse" else None)


__all__ = ["OBJECTIVES", "PHASES", "LOSSES", "PUBLIC_PHASE", "PUBLIC_PHASE_SOURCE", "Objective", "build_objective",
           "freeze_classifier", "squared_error"]
