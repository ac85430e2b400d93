"""StoBatch (Phan et al., ICML 2020, "Scalable Differential Privacy with Certified Robustness in Adversarial
Learning"): a classifier trained from scratch on the private split, arm ``stobatch``. Written from the paper and
its public TensorFlow code (haiphanNJIT/StoBatch), read, not copied.

The mechanisms, as the paper describes them:

- **Stochastic batching.** The private set is split once into K = round(N / m) disjoint batches (each example
  falls in one batch, drawn uniformly and independently of the others); every epoch visits each batch once, in a
  random order. Each batch gets its own noise, drawn once and reused every epoch.
- **DP auto-encoder.** The first layer W1 (the classifier's first convolution) is the encoder of an auto-encoder
  with tied weights; its data-reconstruction function (the logistic reconstruction loss, Taylor-expanded to second
  order) is computed on the perturbed input x_bar = x + (1/m) Lap(Delta_R / eps1) and the perturbed hidden layer
  h_bar = W1 x_bar + (2/m) Lap(Delta_R / eps1) (one noise draw per batch, shared by its examples, as in the
  paper's functional-mechanism analysis), Delta_R = d (beta + 2).
- **Perturbed first layer.** The classifier runs on h_bar: the Laplace noise at the input and at the first
  affine layer is what the robustness certificate (:func:`certified_robustness`) rests on.
- **Adversarial training with DP adversarial examples.** Each example's adversarial version is crafted from its
  perturbed input x_bar (never from x), by I-FGSM, MIM or PGD (one third each) under an L-infinity budget drawn
  uniformly in (0, adv_eps], towards the model's own prediction (no label used); the loss is
  (L(x_bar) + alpha L(x_adv)) / (1 + alpha) with the paper's second-order Taylor expansion of the logistic loss
  at the output layer, whose label coefficients carry the paper's Laplace noise Lap(Delta_3 / (m eps2)).
- **Clipped per-example gradients.** Every parameter update is a DP-SGD step: each example's gradient (of its
  reconstruction loss for W1, of its classification loss for the rest) is clipped to L2 norm C as one vector,
  the clipped gradients of the batch are summed and N(0, (z C)^2 I) is added.

Privacy. Two analyses, never confused (docs/BASELINES.md, "StoBatch"):

- *ours* (data-independent): the released weights are a post-processing of the DP-SGD steps. With disjoint
  batches each example is in exactly one step per epoch, so an epoch is one Gaussian mechanism of L2
  sensitivity C and noise z C (parallel composition), and E epochs are E adaptively composed Gaussian
  mechanisms: epsilon by :func:`training.privacy.accounting.epsilon_report` with sample rate 1 and E steps. No
  amplification by sampling is claimed.
- *the paper's analysis*: eps = eps1 + eps1/gamma_x + eps1/gamma + eps2 with gamma_x = Delta_R / m and
  gamma = 2 Delta_R / (m ||W1||), ||W1|| the largest singular value of W1 at initialisation (as the public code
  computes it). It is reported, labelled, and is not a guarantee here (see docs/BASELINES.md).

Modules: the settings and the training loop here; the mechanisms (noise, sensitivities, losses, DP adversarial
examples, clipped gradients) in :mod:`training.baselines.stobatch_mechanisms`; the budget split and the privacy
report in :mod:`training.baselines.stobatch_privacy`; the certificate in :mod:`training.baselines.stobatch_certify`.

Library code: no printing, a ``track`` hook, :class:`~transdenoiser.errors.UserError` for bad input.
"""
from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# the certificate: re-exported under the name every stobatch checkpoint records (metadata "certificate")
from training.baselines.stobatch_certify import certified_robustness
from training.baselines.stobatch_mechanisms import (
    disjoint_batches,
    dp_adversarial_examples,
    example_gradients,
    first_layer,
    laplace_noise,
    largest_singular_value,
    output_layer_name,
    privatised_gradient,
    reconstruction_sensitivity,
)
from training.baselines.stobatch_privacy import ARM, format_privacy_report, paper_budget, plan, privacy_report
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent
from transdenoiser.toml import dataclass_from_dict

ARCHITECTURE = "cnn28"  # the product's classifier: loadable by training.checkpoint.load_checkpoint as is
REPORT_FILE = "privacy_report.txt"


# ------------------------------------------------------------------------------------------------ settings

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


# ------------------------------------------------------------------------------------------------ training

def _noise_generator(config: StoBatchConfig) -> torch.Generator:
    seed = config.seed if config.reproducible_noise else secrets.randbits(63)
    return torch.Generator().manual_seed(seed)


@torch.inference_mode()
def test_accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 1000) -> float:
    """Top-1 accuracy of the deterministic classifier (no noise) on ``images``."""
    model.eval()
    correct = sum(int((model(images[i:i + batch]).argmax(1) == labels[i:i + batch]).sum())
                  for i in range(0, len(images), batch))
    return correct / max(1, len(images))


def train_stobatch(config: StoBatchConfig, dataset, device: torch.device | str = "cpu", track: Track = silent,
                   on_epoch: Callable[[dict], None] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Train a StoBatch classifier from scratch on ``dataset.private``; return it (eval mode) and its released
    metadata (a classifier checkpoint's, with the privacy report). Nothing private is returned."""
    from training.models import build_model
    from training.private_train import _subset
    from transdenoiser.runtime import hardware_description

    device = torch.device(device)
    train_split = _subset(dataset.private, config.train_examples)
    num_examples = len(train_split)
    config.validate(num_examples)
    if tuple(dataset.image_shape[1:]) != (28, 28):
        raise UserError(f"the stobatch arm trains the cnn28 classifier, for 28x28 images; {dataset.name} has "
                        f"{dataset.image_shape}")
    torch.manual_seed(config.seed)
    public_x, _ = dataset.public.tensors("cpu")  # public statistics for the normalisation: no privacy spent
    mean = public_x.mean(dim=(0, 2, 3)).tolist() if len(public_x) else [0.5] * dataset.image_shape[0]
    std = public_x.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist() if len(public_x) else [0.5] * dataset.image_shape[0]
    kwargs = {"in_channels": dataset.image_shape[0], "num_classes": dataset.num_classes, "mean": mean, "std": std}
    model = build_model(ARCHITECTURE, **kwargs).to(device)
    model.eval()  # dropout off: one deterministic function per example (per-example gradients)
    frozen = tuple(config.frozen)
    for name, p in model.named_parameters():
        if name.startswith(frozen):
            p.requires_grad_(False)
    conv = first_layer(model)
    w1_name = next(k for k, p in model.named_parameters() if p is conv.weight)
    out_name = output_layer_name(model)
    hidden_units = dict(model.named_parameters())[out_name].shape[1]
    schedule = plan(config, num_examples)
    budget = paper_budget(config.budget_for_paper, config.output_share,
                          reconstruction_sensitivity(conv, dataset.image_shape), 2.0 * hidden_units,
                          largest_singular_value(conv.weight), float(config.batch_size))
    generator = _noise_generator(config)
    batches = disjoint_batches(num_examples, schedule["num_batches"], generator)
    with torch.no_grad():
        hidden_shape = conv(model.normalize(torch.zeros((1, *dataset.image_shape), device=device))).shape[1:]
    # one Laplace draw per batch, shared by its examples and reused every epoch (the paper's stochastic batching)
    input_noise = [laplace_noise((1, *dataset.image_shape), budget.input_scale, generator) for _ in batches]
    hidden_noise = [laplace_noise((1, *hidden_shape), budget.hidden_scale, generator) for _ in batches]
    out_shape = dict(model.named_parameters())[out_name].shape
    output_noise = [laplace_noise(out_shape, budget.output_scale, generator) if config.output_perturbation
                    else torch.zeros(out_shape) for _ in batches]

    x_all, y_all = train_split.tensors(device)
    test = _subset(dataset.test, config.eval_examples)
    x_test, y_test = test.tensors(device)
    params = [p for p in model.parameters() if p.requires_grad]
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    # SGD by default: Adam scales every coordinate to a step of about lr, so where the DP noise outweighs the
    # gradient (most coordinates of a 0.4M-parameter model) it turns the noise into full-size random steps
    optimizer = (torch.optim.SGD(params, lr=config.learning_rate, momentum=config.momentum)
                 if config.optimizer == "sgd" else torch.optim.Adam(params, lr=config.learning_rate))
    # two blocks, clipped separately to C / sqrt(2) each (so each example's whole gradient has norm <= C): the
    # auto-encoder's (W1, b1, trained by the reconstruction loss) and the rest (trained by the classification loss)
    per_example, blocks = example_gradients(model, float(config.adversarial_weight))
    z, clip, m = schedule["noise_multiplier"], config.clip_norm, schedule["expected_batch_size"]
    metrics: list[dict[str, Any]] = []
    started = time.perf_counter()
    for epoch in range(config.epochs):
        epoch_started = time.perf_counter()
        order = torch.randperm(len(batches), generator=generator).tolist()
        for b in track(order, desc=f"stobatch epoch {epoch + 1}/{config.epochs}", total=len(order)):
            index = batches[b].to(device)
            x_bar = x_all[index] + input_noise[b].to(device)
            n_h = hidden_noise[b].to(device)
            eps = float(torch.rand((), generator=generator)) * config.adv_eps
            x_adv = dp_adversarial_examples(model, x_bar, n_h, eps, config.adv_steps, generator)
            onehot = F.one_hot(y_all[index], dataset.num_classes).to(x_bar.dtype)
            grads = privatised_gradient(model, per_example, blocks, x_bar, x_adv, onehot, n_h, clip, z, m,
                                        config.grad_chunk_size, generator)
            for k, p in zip(names, params, strict=True):
                p.grad = grads[k]
                if k == out_name:  # the paper's functional-mechanism term -<n_out, W_out> (data-independent)
                    p.grad = p.grad - output_noise[b].to(device)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        row = {"epoch": epoch + 1, "test_accuracy": test_accuracy(model, x_test, y_test),
               "seconds": time.perf_counter() - epoch_started}
        metrics.append(row)
        if on_epoch is not None:
            on_epoch(row)
    model.eval()
    report = privacy_report(config, schedule, budget, num_examples, len(metrics))
    meta = {
        "kind": "classifier", "architecture": ARCHITECTURE, "arch_kwargs": kwargs,
        "input_shape": list(dataset.image_shape), "num_classes": dataset.num_classes,
        "class_names": list(dataset.classes),
        "normalization": {"mean": mean, "std": std, "note": "public-split statistics, applied inside the model"},
        "dataset": {"name": dataset.name, "split_seed": dataset.split_seed, "trained_on": "private",
                    "train_examples": num_examples, "fingerprints": dataset.released_fingerprints(),
                    "source": dataset.source},
        "test_accuracy": metrics[-1]["test_accuracy"],
        "arm": ARM, "baseline": "StoBatch (Phan et al., ICML 2020)",
        "stobatch": {"config": asdict(config), "schedule": schedule,
                     "input_laplace_scale": budget.input_scale, "hidden_laplace_scale": budget.hidden_scale,
                     "first_layer": w1_name,
                     "certificate": "training.baselines.stobatch.certified_robustness"},
        "metrics": [{"epoch": r["epoch"], "test_accuracy": r["test_accuracy"]} for r in metrics],
        "privacy": report, "seconds": time.perf_counter() - started,
        "device": str(device), "hardware": hardware_description(device),
    }
    return model, meta


def save_stobatch(directory: str | Path, model: nn.Module, metadata: dict[str, Any]) -> Path:
    """Write the classifier checkpoint (crash-safe) with ``privacy_report.txt`` beside it."""
    from training.checkpoint import replace_directory, save_checkpoint, write_text

    def write(staging: Path) -> None:
        save_checkpoint(staging, model, metadata)
        write_text(staging / REPORT_FILE, format_privacy_report(metadata["privacy"]) + "\n")

    return replace_directory(directory, write)


__all__ = ["ARM", "ARCHITECTURE", "REPORT_FILE", "StoBatchConfig", "train_stobatch", "save_stobatch", "test_accuracy",
           "certified_robustness"]
