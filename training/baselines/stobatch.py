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

import secrets
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# the certificate: re-exported under the name every stobatch checkpoint records (metadata "certificate")
from training.baselines.stobatch_certify import certified_robustness
from training.baselines.stobatch_config import StoBatchConfig
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

ARCHITECTURE = "cnn28"  # the product's classifier: loadable by training.checkpoint.load_checkpoint as is
REPORT_FILE = "privacy_report.txt"


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
    from training.evaluation import subset
    from training.models import build_model
    from transdenoiser.runtime import hardware_description

    device = torch.device(device)
    train_split = subset(dataset.private, config.train_examples)
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
    test = subset(dataset.test, config.eval_examples)
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
