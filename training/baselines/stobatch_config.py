"""The settings of a StoBatch run (:mod:`training.baselines.stobatch`), saved in its checkpoint."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from transdenoiser.errors import UserError
from transdenoiser.toml import dataclass_from_dict


@dataclass
class StoBatchConfig:
    """Everything that decides a StoBatch run (saved in the checkpoint)."""

    target_epsilon: float | None = 1.0  # total epsilon; the DP-SGD noise multiplier is calibrated to it
    noise_multiplier: float | None = None  # z; only when target_epsilon is None
    delta: float = 1e-5
    batch_size: int = 300  # m: the disjoint batches hold m examples on average (K = round(N / m))
    epochs: int = 4  # E: each batch is visited once per epoch
    clip_norm: float = 1.0  # C
    optimizer: str = "sgd"  # sgd (with momentum) or adam, on the privatised gradient (post-processing)
    learning_rate: float = 0.1
    momentum: float = 0.9  # sgd only
    paper_epsilon: float | None = None  # the paper's total budget eps1 + ... + eps2 for the Laplace noise
    output_share: float = 0.5  # eps2 / paper_epsilon (the output layer's share of the paper's budget)
    adversarial_weight: float = 1.0  # alpha
    adv_eps: float = 0.3  # L-infinity budget of the DP adversarial examples (pixels in [0, 1]), drawn in (0, adv_eps]
    adv_steps: int = 3  # iterations of I-FGSM / MIM / PGD
    output_perturbation: bool = True  # the paper's Laplace noise on the output layer's label coefficients
    # parameters (name prefixes) kept at their seeded random initialisation, not trained (no privacy cost): cnn28's
    # 3136 x 128 layer holds 401,536 of its 467,818 parameters, and DP-SGD's noise grows with the trained ones
    frozen: tuple = ("head.1.",)
    calibration_accountant: str = "rdp"
    train_examples: int = 0
    eval_examples: int = 0
    grad_chunk_size: int = 32
    seed: int = 0
    reproducible_noise: bool = False

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> StoBatchConfig:
        return dataclass_from_dict(cls, values, source, kind="StoBatch ")

    def validate(self, num_examples: int) -> None:
        """Refuse bad settings before any training (one line naming the problem)."""
        def positive(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                and value > 0

        checks = [
            (num_examples >= 1, "the private training set is empty"),
            (self.target_epsilon is None or positive(self.target_epsilon),
             f"target epsilon must be > 0, got {self.target_epsilon}"),
            (self.target_epsilon is not None or (self.noise_multiplier is not None
                                                 and positive(self.noise_multiplier)),
             "give a target epsilon or a noise multiplier > 0"),
            (self.target_epsilon is None or self.noise_multiplier is None,
             "give a target epsilon or a noise multiplier, not both"),
            (isinstance(self.delta, float) and 0 < self.delta < 1 / num_examples,
             f"delta must lie in (0, 1/N) = (0, {1 / max(num_examples, 1):.3g}), got {self.delta}"),
            (isinstance(self.batch_size, int) and 1 <= self.batch_size <= num_examples,
             f"batch size must be an integer in [1, N = {num_examples}], got {self.batch_size}"),
            (isinstance(self.epochs, int) and self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (positive(self.clip_norm), f"clip norm C must be > 0, got {self.clip_norm}"),
            (positive(self.learning_rate), f"learning rate must be > 0, got {self.learning_rate}"),
            (self.optimizer in ("sgd", "adam"), f"optimizer must be sgd or adam, got {self.optimizer!r}"),
            (isinstance(self.momentum, (int, float)) and self.momentum >= 0,
             f"momentum must be >= 0, got {self.momentum}"),
            (self.paper_epsilon is None or positive(self.paper_epsilon),
             f"paper_epsilon must be > 0, got {self.paper_epsilon}"),
            (isinstance(self.output_share, (int, float)) and 0 < self.output_share < 1,
             f"output_share must lie in (0, 1), got {self.output_share}"),
            (isinstance(self.adversarial_weight, (int, float)) and self.adversarial_weight >= 0,
             f"adversarial_weight must be >= 0, got {self.adversarial_weight}"),
            (isinstance(self.adv_eps, (int, float)) and 0 <= self.adv_eps <= 1,
             f"adv_eps must lie in [0, 1] (pixels), got {self.adv_eps}"),
            (isinstance(self.adv_steps, int) and self.adv_steps >= 1, f"adv_steps must be >= 1, got {self.adv_steps}"),
            (self.calibration_accountant in ("rdp", "pld"),
             f"calibration accountant must be rdp or pld, got {self.calibration_accountant!r}"),
            (isinstance(self.train_examples, int) and self.train_examples >= 0,
             f"train_examples must be >= 0, got {self.train_examples}"),
            (isinstance(self.eval_examples, int) and self.eval_examples >= 0,
             f"eval_examples must be >= 0, got {self.eval_examples}"),
            (isinstance(self.grad_chunk_size, int) and self.grad_chunk_size >= 1,
             f"grad_chunk_size must be >= 1, got {self.grad_chunk_size}"),
            (isinstance(self.output_perturbation, bool), "output_perturbation must be true or false"),
            (isinstance(self.frozen, (tuple, list)) and all(isinstance(f, str) and f for f in self.frozen)
             and not any("features.0.".startswith(f) or f.startswith("features.0.") for f in self.frozen)
             and not any(f.startswith("head.4") or "head.4.".startswith(f) for f in self.frozen),
             f"frozen must list parameter name prefixes other than the first and the output layer, got "
             f"{self.frozen!r}"),
            (isinstance(self.reproducible_noise, bool), "reproducible_noise must be true or false"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    @property
    def budget_for_paper(self) -> float:
        """The paper's total budget for the Laplace noise: ``paper_epsilon``, else the target epsilon."""
        if self.paper_epsilon is not None:
            return float(self.paper_epsilon)
        if self.target_epsilon is not None:
            return float(self.target_epsilon)
        raise UserError("paper_epsilon is needed when no target epsilon is given (the Laplace noise scales "
                        "follow the paper's budget)")
