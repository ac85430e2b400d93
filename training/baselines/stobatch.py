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

Library code: no printing, a ``track`` hook, :class:`~transdenoiser.errors.UserError` for bad input.
"""
from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F

from training.baselines.common import format_guarantee_lines
from training.privacy.report import format_number as _number
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent
from transdenoiser.toml import dataclass_from_dict

ARM = "stobatch"
ARCHITECTURE = "cnn28"  # the product's classifier: loadable by training.checkpoint.load_checkpoint as is
ABSTAIN = -1
ADVERSARIAL_ATTACKS = ("ifgsm", "mim", "pgd")  # the paper's ensemble: I-FGSM, MIM, MadryEtAl (one third each)
REPORT_FILE = "privacy_report.txt"
PAPER_ANALYSIS_LABEL = (
    "the paper's analysis (Phan et al. 2020): eps1 + eps1/gamma_x + eps1/gamma + eps2, objective perturbation with "
    "Laplace noise drawn once per disjoint batch; NOT a guarantee for this model: the perturbed coefficients depend "
    "on the parameters being trained (h = W1 x, the hidden features under the output layer), so one fixed noise "
    "draw is reused at every parameter value the training visits, and ||W1|| is taken at initialisation while W1 "
    "is trained (docs/BASELINES.md, StoBatch)")
OURS_LABEL = (
    "DP-SGD over disjoint batches: every per-example gradient clipped to L2 norm C, Gaussian noise N(0, (z C)^2 I) "
    "on the sum; each example is in one step per epoch, so E epochs compose E Gaussian mechanisms (no "
    "amplification by sampling claimed); noise fixed in advance: data-independent")


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


# ------------------------------------------------------------------------------------------------ noise

def laplace_noise(shape: Sequence[int], scale: float, generator: torch.Generator) -> torch.Tensor:
    """I.i.d. Laplace(0, ``scale``) of ``shape``, float32 on the CPU, by inversion of one uniform draw each."""
    if not (math.isfinite(scale) and scale >= 0):
        raise UserError(f"Laplace scale must be finite and >= 0, got {scale}")
    u = torch.rand(tuple(shape), generator=generator, dtype=torch.float64).sub_(0.5)
    # u in [-1/2, 1/2): -b sgn(u) ln(1 - 2|u|) is Laplace(b); 1 - 2|u| > 0 except at u = -1/2 exactly. Computed in
    # place (one float64 buffer, not six): the certificate draws 25,088 of these per forward pass, and this is 2.6x
    # faster than the out-of-place form at the same bits (tests/test_baselines_stobatch.py holds them equal).
    sign = torch.sign(u)
    return u.abs_().clamp_(max=0.5 - 1e-17).mul_(-2).log1p_().neg_().mul_(scale).mul_(sign).to(torch.float32)


def first_layer(model: nn.Module) -> nn.Conv2d:
    """The classifier's first affine layer W1 (the auto-encoder's encoder)."""
    features = getattr(model, "features", None)
    if not isinstance(features, nn.Sequential) or not len(features) or not isinstance(features[0], nn.Conv2d):
        raise UserError("StoBatch needs a classifier whose `features` start with a Conv2d (the cnn28 layout)")
    return features[0]


def output_layer_name(model: nn.Module) -> str:
    """The parameter name of the output layer's weight (the last Linear of ``model.head``)."""
    linears = [name for name, m in model.head.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise UserError("StoBatch needs a classifier whose `head` ends with a Linear layer")
    return f"head.{linears[-1]}.weight"


def reconstruction_sensitivity(conv: nn.Conv2d, image_shape: Sequence[int]) -> float:
    """The paper's Delta_R = d (beta + 2) for the convolutional auto-encoder, read as the public code does:
    d = in_channels x kernel area (inputs per hidden unit), beta = hidden positions per channel."""
    _, height, width = image_shape
    kh, kw = conv.kernel_size
    sh, sw = conv.stride
    ph, pw = conv.padding if isinstance(conv.padding, tuple) else (0, 0)
    out_h = (height + 2 * ph - kh) // sh + 1
    out_w = (width + 2 * pw - kw) // sw + 1
    return float(conv.in_channels * kh * kw * (out_h * out_w + 2))


def largest_singular_value(weight: torch.Tensor) -> float:
    """||W1||: the largest singular value of the weight reshaped to (out_channels, in x kh x kw)."""
    matrix = weight.detach().to(torch.float64).reshape(weight.shape[0], -1)
    return float(torch.linalg.matrix_norm(matrix, ord=2))


def l1_operator_norm(conv: nn.Conv2d, pixel_std: Sequence[float]) -> float:
    """An upper bound S on ||W1 (delta / std)||_1 / ||delta||_1: the first layer's L1 -> L1 operator norm after the
    model's per-channel normalisation. Each input pixel of channel c meets each (output channel, kernel offset) at
    most once, so the matrix column of that pixel sums to at most sum_{o,kh,kw} |W[o, c, kh, kw]| / std_c."""
    weight = conv.weight.detach().to(torch.float64).abs()
    per_channel = weight.sum(dim=(0, 2, 3))
    std = torch.as_tensor(list(pixel_std), dtype=torch.float64).reshape(-1)
    if std.numel() == 1:
        std = std.expand_as(per_channel)
    return float((per_channel / std).max())


@dataclass(frozen=True)
class PaperBudget:
    """The paper's privacy budget split and the Laplace noise scales it sets (pixels in [0, 1])."""

    paper_epsilon: float  # eps1 + eps1/gamma_x + eps1/gamma + eps2
    eps1: float
    eps2: float
    gamma_x: float
    gamma: float
    reconstruction_sensitivity: float  # Delta_R
    output_sensitivity: float  # Delta_3 = 2 x (hidden units under the output layer)
    first_layer_norm_at_init: float  # ||W1|| at initialisation
    batch_size: float  # m
    input_scale: float  # Laplace scale of the input noise: Delta_R / (m eps1)
    hidden_scale: float  # Laplace scale of the first-layer noise: 2 Delta_R / (m eps1)
    output_scale: float  # Laplace scale of the output-layer coefficient noise: Delta_3 / (m eps2)


def paper_budget(total_epsilon: float, output_share: float, reconstruction_sens: float, output_sens: float,
                 w1_norm: float, batch_size: float) -> PaperBudget:
    """Split the paper's total budget: eps2 = share x total; eps1 chosen so that eps1 (1 + 1/gamma_x + 1/gamma)
    is the rest (the public code's epsilon2_update)."""
    eps2 = output_share * total_epsilon
    gamma_x = reconstruction_sens / batch_size
    gamma = 2 * reconstruction_sens / (batch_size * w1_norm)
    eps1 = (total_epsilon - eps2) / (1 + 1 / gamma_x + 1 / gamma)
    return PaperBudget(
        paper_epsilon=eps1 * (1 + 1 / gamma_x + 1 / gamma) + eps2, eps1=eps1, eps2=eps2, gamma_x=gamma_x,
        gamma=gamma, reconstruction_sensitivity=reconstruction_sens, output_sensitivity=output_sens,
        first_layer_norm_at_init=w1_norm, batch_size=batch_size,
        input_scale=reconstruction_sens / (batch_size * eps1),
        hidden_scale=2 * reconstruction_sens / (batch_size * eps1),
        output_scale=output_sens / (batch_size * eps2))


def disjoint_batches(num_examples: int, num_batches: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Each example falls in one of ``num_batches`` batches, uniformly and independently (so adding or removing
    an example changes one batch only). Returns the index tensors (some may be empty)."""
    if num_batches < 1:
        raise UserError(f"need at least one batch, got {num_batches}")
    assignment = torch.randint(0, num_batches, (num_examples,), generator=generator)
    return [(assignment == b).nonzero().flatten() for b in range(num_batches)]


# ------------------------------------------------------------------------------------------------ the model pieces

def noisy_logits(model: nn.Module, x: torch.Tensor, hidden_noise: torch.Tensor | float = 0.0) -> torch.Tensor:
    """The classifier with the paper's perturbed first layer: head(features[1:](W1 normalise(x) + b1 + noise))."""
    h = first_layer(model)(model.normalize(x)) + hidden_noise
    return model.head(model.features[1:](h))


def reconstruction_logits(model: nn.Module, x: torch.Tensor, hidden_noise: torch.Tensor | float = 0.0
                          ) -> torch.Tensor:
    """The auto-encoder with tied weights: W1^T relu(W1 normalise(x) + b1 + noise), back in pixel layout."""
    conv = first_layer(model)
    h = F.relu(conv(model.normalize(x)) + hidden_noise)
    return F.conv_transpose2d(h, conv.weight, stride=conv.stride, padding=conv.padding)


def taylor_logistic(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The paper's second-order Taylor expansion of the logistic loss log(1 + e^z) - t z around z = 0:
    sum over coordinates of log 2 + z/2 + z^2/8 - t z (per example: all but the first dimension summed)."""
    terms = math.log(2.0) + logits / 2 + logits.pow(2) / 8 - target * logits
    return terms.flatten(1).sum(1)


def _example_loss(model: nn.Module, w1_name: str, alpha: float) -> Callable:
    """One example's loss for torch.func: the reconstruction loss (gradient to W1 and b1 only) plus the
    classification loss on x_bar and x_adv (gradient to the other parameters only; W1, b1 detached there)."""
    first_names = {w1_name, w1_name.replace(".weight", ".bias")}

    def loss(params, buffers, x_bar, x_adv, onehot, hidden_noise):
        frozen_first = {k: (v.detach() if k in first_names else v) for k, v in params.items()}
        others_fixed = {k: (v if k in first_names else v.detach()) for k, v in params.items()}
        r = _call(model, others_fixed, buffers, reconstruction_logits, x_bar.unsqueeze(0), hidden_noise)
        rec = taylor_logistic(r, x_bar.unsqueeze(0)).sum()
        both = torch.stack([x_bar, x_adv])
        z = _call(model, frozen_first, buffers, noisy_logits, both, hidden_noise)
        cls = taylor_logistic(z, onehot.unsqueeze(0).expand(2, -1))
        return rec + (cls[0] + alpha * cls[1]) / (1 + alpha)

    return loss


class _Apply(nn.Module):
    """Runs ``fn(model, *args)`` so that torch.func.functional_call can swap the model's parameters."""

    def __init__(self, model: nn.Module, fn: Callable):
        super().__init__()
        self.model = model
        self.fn = fn

    def forward(self, *args):
        return self.fn(self.model, *args)


def _call(model, params, buffers, fn, *args):
    wrapper = _Apply(model, fn)
    prefixed = {f"model.{k}": v for k, v in params.items()}
    prefixed.update({f"model.{k}": v for k, v in buffers.items()})
    return functional_call(wrapper, prefixed, args)


def dp_adversarial_examples(model: nn.Module, x_bar: torch.Tensor, hidden_noise: torch.Tensor, eps: float,
                            steps: int, generator: torch.Generator) -> torch.Tensor:
    """Adversarial versions of the PERTURBED inputs x_bar (post-processing of x_bar and the current weights):
    L-infinity budget ``eps``, the examples split in three for I-FGSM, MIM and PGD (random start), each
    ascending the cross-entropy at the model's own prediction on x_bar (no label is read)."""
    if eps <= 0 or len(x_bar) == 0:
        return x_bar.clone()
    with torch.no_grad():
        target = noisy_logits(model, x_bar, hidden_noise).argmax(1)
    kind = torch.arange(len(x_bar), device=x_bar.device) % len(ADVERSARIAL_ATTACKS)
    step = 2.5 * eps / steps
    start = (torch.rand(x_bar.shape, generator=generator) * 2 - 1).to(x_bar.device) * eps
    adv = torch.where((kind == 2).view(-1, 1, 1, 1), x_bar + start, x_bar).detach()
    momentum = torch.zeros_like(x_bar)
    for _ in range(steps):
        adv.requires_grad_(True)
        loss = F.cross_entropy(noisy_logits(model, adv, hidden_noise), target, reduction="sum")
        (grad,) = torch.autograd.grad(loss, adv)
        l1 = grad.flatten(1).abs().sum(1).clamp_min(1e-12).view(-1, 1, 1, 1)
        momentum = momentum + grad / l1
        direction = torch.where((kind == 1).view(-1, 1, 1, 1), momentum, grad).sign()
        adv = (x_bar + (adv.detach() + step * direction - x_bar).clamp(-eps, eps)).detach()
    return adv


def clipped_gradient_sum(model: nn.Module, per_example: Callable, blocks: Sequence[Sequence[str]],
                         x_bar: torch.Tensor, x_adv: torch.Tensor, onehot: torch.Tensor, hidden_noise: torch.Tensor,
                         clip_norm: float, chunk_size: int = 32) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Sum over the batch of the per-example gradients, each block of parameters clipped to C / sqrt(#blocks) per
    example (so each example's whole gradient has L2 norm <= C); also the per-example norms after clipping."""
    params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    summed = {k: torch.zeros_like(v) for k, v in params.items()}
    block_clip = clip_norm / math.sqrt(len(blocks))
    clipped_sq = []
    if len(x_bar):
        pieces = math.ceil(len(x_bar) / chunk_size)
        for xb, xa, oh in zip(torch.tensor_split(x_bar, pieces), torch.tensor_split(x_adv, pieces),
                              torch.tensor_split(onehot, pieces), strict=True):
            grads, _ = per_example(params, buffers, xb, xa, oh, hidden_noise)
            total = torch.zeros(len(xb), dtype=torch.float64, device=xb.device)
            for block in blocks:
                norms = torch.stack([grads[k].flatten(1).pow(2).sum(1) for k in block]).sum(0).sqrt()
                factors = (block_clip / (norms + 1e-12)).clamp(max=1.0)
                total += (factors * norms).double().pow(2)
                for k in block:
                    summed[k] += torch.einsum("n,n...->...", factors, grads[k])
            clipped_sq.append(total)
    norms_after = torch.cat(clipped_sq).sqrt() if clipped_sq else torch.zeros(0, dtype=torch.float64)
    return summed, norms_after


def privatised_gradient(model: nn.Module, per_example: Callable, blocks: Sequence[Sequence[str]],
                        x_bar: torch.Tensor, x_adv: torch.Tensor, onehot: torch.Tensor, hidden_noise: torch.Tensor,
                        clip_norm: float, noise_multiplier: float, expected_batch_size: float, chunk_size: int,
                        generator: torch.Generator) -> dict[str, torch.Tensor]:
    """(clipped sum + N(0, (z C)^2 I)) / m: one DP-SGD gradient (an empty batch still gets its noise)."""
    summed, _ = clipped_gradient_sum(model, per_example, blocks, x_bar, x_adv, onehot, hidden_noise, clip_norm,
                                     chunk_size)
    out = {}
    for k, total in summed.items():
        noise = torch.randn(total.shape, generator=generator, dtype=torch.float32).to(total.device)
        out[k] = (total + noise_multiplier * clip_norm * noise) / expected_batch_size
    return out


def example_gradients(model: nn.Module, alpha: float = 1.0) -> tuple[Callable, list[list[str]]]:
    """The vmapped per-example gradient function and the two parameter blocks (auto-encoder, classifier)."""
    conv = first_layer(model)
    w1_name = next(k for k, p in model.named_parameters() if p is conv.weight)
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    first = [k for k in names if k in (w1_name, w1_name.replace(".weight", ".bias"))]
    per_example = vmap(grad_and_value(_example_loss(model, w1_name, alpha)), in_dims=(None, None, 0, 0, 0, None))
    return per_example, [first, [k for k in names if k not in first]]


# ------------------------------------------------------------------------------------------------ training

def _noise_generator(config: StoBatchConfig) -> torch.Generator:
    seed = config.seed if config.reproducible_noise else secrets.randbits(63)
    return torch.Generator().manual_seed(seed)


def noise_description(config: StoBatchConfig) -> dict[str, Any]:
    if config.reproducible_noise:
        return {"mode": "reproducible", "seed": config.seed,
                "warning": ("REPRODUCIBLE NOISE: the DP noise, the batches and the Laplace noise can be recomputed "
                            f"from the recorded seed ({config.seed}); no epsilon in this report holds against anyone "
                            "who has the seed. For research only.")}
    return {"mode": "secret", "seed": None,
            "source": "a generator seeded from the operating system's CSPRNG; the seed is not recorded anywhere"}


def plan(config: StoBatchConfig, num_examples: int) -> dict[str, Any]:
    """Batches K, expected batch size N/K, and the DP-SGD noise multiplier z (calibrated if a target is set)."""
    from training.privacy.accounting import noise_multiplier_for_epsilon

    num_batches = max(1, round(num_examples / config.batch_size))
    if config.target_epsilon is not None:
        z = noise_multiplier_for_epsilon(config.target_epsilon, 1.0, config.epochs, config.delta,
                                         accountant=config.calibration_accountant)
    else:
        z = float(config.noise_multiplier)
    return {"num_batches": num_batches, "expected_batch_size": float(config.batch_size),
            "steps_per_epoch": num_batches, "total_steps": num_batches * config.epochs,
            "noise_multiplier": float(z), "compositions": config.epochs}


def privacy_report(config: StoBatchConfig, schedule: dict[str, Any], budget: PaperBudget, num_examples: int,
                   epochs_done: int) -> dict[str, Any]:
    """The released privacy report: ours (data-independent, dp-accounting) and the paper's analysis (labelled)."""
    from training.privacy.accounting import epsilon_report
    from training.privacy.report import json_safe

    noise = noise_description(config)
    claim = ("a data-independent (epsilon, delta)-DP guarantee for the released classifier (DP-SGD over disjoint "
             "batches); the paper's own epsilon is shown beside it, labelled, and is not a guarantee")
    if noise["mode"] == "reproducible":
        claim = f"{noise['warning']} {claim}"
    report: dict[str, Any] = {
        "arm": ARM, "clip_norm": config.clip_norm, "xi_up": schedule["noise_multiplier"],
        "noise_multiplier": schedule["noise_multiplier"], "delta": config.delta, "num_examples": num_examples,
        "sampling": "disjoint batches, each visited once per epoch (stochastic batching); no Poisson sampling",
        "num_batches": schedule["num_batches"], "expected_batch_size": schedule["expected_batch_size"],
        "epochs_planned": config.epochs, "epochs_done": epochs_done, "complete": epochs_done == config.epochs,
        "steps_planned": schedule["total_steps"], "steps_done": epochs_done * schedule["num_batches"],
        "units": "noise multiplier = std of Gaussian noise on the SUMMED clipped gradient / C; pixels in [0,1]",
        "target_epsilon": config.target_epsilon,
        "calibration_accountant": config.calibration_accountant if config.target_epsilon is not None else None,
        "noise": noise, "initialisation": {"kind": "random", "seed": config.seed},
        "privacy_claim": claim, "guarantees": [],
    }
    if epochs_done > 0:
        report["guarantees"].append({
            "name": "dp_sgd_disjoint_batches", "label": OURS_LABEL, "data_independent": True,
            "noise_multiplier": schedule["noise_multiplier"], "gaussian_compositions": epochs_done,
            "epsilon": epsilon_report(1.0, schedule["noise_multiplier"], epochs_done, config.delta)})
    report["paper_analysis"] = {
        "label": PAPER_ANALYSIS_LABEL, "data_independent": False, "epsilon": budget.paper_epsilon,
        "delta": 0.0, "eps1": budget.eps1, "eps2": budget.eps2, "gamma_x": budget.gamma_x, "gamma": budget.gamma,
        "Delta_R": budget.reconstruction_sensitivity, "Delta_3": budget.output_sensitivity,
        "W1_norm_at_init": budget.first_layer_norm_at_init}
    report["noise_layer"] = {
        "label": "the Laplace noise of the paper's mechanism, drawn once per disjoint batch (pixels in [0,1])",
        "input_scale": budget.input_scale, "hidden_scale": budget.hidden_scale,
        "output_scale": budget.output_scale if config.output_perturbation else 0.0}
    return json_safe(report)


def format_privacy_report(report: dict[str, Any]) -> str:
    """Readable text of :func:`privacy_report`'s dict."""
    lines = [f"Privacy report: arm {report['arm']}" + ("" if report.get("complete", True) else
                                                      f"  (INCOMPLETE: {report['epochs_done']} of "
                                                      f"{report['epochs_planned']} epochs)"),
             f"  clip norm C {report['clip_norm']}; noise multiplier z {report['noise_multiplier']:.4g} (std / C on "
             "the summed clipped gradient); delta " + f"{report['delta']:g}",
             f"  {report['sampling']}: K {report['num_batches']} batches of {report['expected_batch_size']:g} "
             f"examples on average (N {report['num_examples']}), {report['epochs_done']} of "
             f"{report['epochs_planned']} epochs, {report['steps_done']} steps"]
    if report.get("target_epsilon") is not None:
        lines.append(f"  z calibrated for target epsilon {report['target_epsilon']} with the "
                     f"{report['calibration_accountant']} accountant")
    lines.append(f"  {report['privacy_claim']}")
    lines += format_guarantee_lines(report.get("guarantees", []))
    paper = report["paper_analysis"]
    lines.append(f"  [paper_analysis] {paper['label']}")
    lines.append(f"     epsilon {_number(paper['epsilon'])} (delta 0): eps1 {_number(paper['eps1'])}, eps2 "
                 f"{_number(paper['eps2'])}, gamma_x {_number(paper['gamma_x'])}, gamma {_number(paper['gamma'])}, "
                 f"Delta_R {_number(paper['Delta_R'])}, Delta_3 {_number(paper['Delta_3'])}")
    layer = report["noise_layer"]
    lines.append(f"  [noise_layer] {layer['label']}: input {_number(layer['input_scale'])}, first layer "
                 f"{_number(layer['hidden_scale'])}, output coefficients {_number(layer['output_scale'])}")
    return "\n".join(lines)


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


# ------------------------------------------------------------------------------------------------ command line

# train flags -> StoBatchConfig fields (the others of `transdenoiser train` are refused for this arm)
TRAIN_FLAGS = {"target_epsilon": "target_epsilon", "xi_up": "noise_multiplier", "delta": "delta",
               "batch_size": "batch_size", "epochs": "epochs", "clip_norm": "clip_norm", "lr": "learning_rate",
               "optimizer": "optimizer", "momentum": "momentum",
               "calibration_accountant": "calibration_accountant", "train_examples": "train_examples",
               "eval_examples": "eval_examples", "reproducible_noise": "reproducible_noise"}
REFUSED_FLAGS = ("sigma", "xi_low", "denoiser", "activation", "denoiser_width", "dncnn_depth",
                 "merge_uncredited_noise", "noise_draws", "train_on", "init_from", "max_smin_dim",
                 "noise", "shape_examples", "ema", "min_steps", "norm", "i_understand_unsound")


def config_from_train_args(args) -> StoBatchConfig:
    """StoBatchConfig from its defaults, then ``--config`` (TOML, StoBatchConfig's field names), then the flags."""
    from transdenoiser.toml import read_toml

    given = [f"--{name.replace('_', '-')}" for name in REFUSED_FLAGS if getattr(args, name, None) not in (None, False)]
    if given:
        raise UserError(f"--arm stobatch does not take {', '.join(given)} (a classifier trained from scratch with "
                        "its own noise layer; its settings: docs/BASELINES.md)")
    if getattr(args, "resume", False):
        raise UserError("--arm stobatch cannot --resume (its per-batch noise is never stored); train again")
    values: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        values.update(read_toml(args.config, "--config"))
    for flag, name in TRAIN_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            values[name] = value
    if getattr(args, "batch_size", None) == "auto":
        raise UserError("--arm stobatch needs a number for --batch-size (the disjoint batches' size m)")
    if "noise_multiplier" in values and "target_epsilon" not in values:
        values["target_epsilon"] = None  # --xi-up alone: a fixed noise multiplier, no calibration
    values["seed"] = getattr(args, "seed", 0)
    return StoBatchConfig.from_dict(values, source=str(getattr(args, "config", None) or "flags"))


def cmd_train_stobatch(args, print_fn: Callable[..., None] = print) -> int:
    """``transdenoiser train --arm stobatch``: called by training.train_cli (under its run lock)."""
    import json
    import os
    import sys

    from training.cli import load_dataset_from_args
    from transdenoiser.progress import bar
    from transdenoiser.runtime import hardware_description, resolve_device, seed_everything

    if "WORLD_SIZE" in os.environ:
        raise UserError("the stobatch arm runs in one process (torchrun is not supported for it)")
    device = resolve_device(args.device)
    config = config_from_train_args(args)
    seed_everything(config.seed)
    dataset = load_dataset_from_args(args)
    if getattr(args, "classifier", None) is not None:  # only checked: the arm trains its own classifier
        from training.checkpoint import read_metadata

        shape = read_metadata(args.classifier).get("input_shape")
        if shape is not None and tuple(shape) != tuple(dataset.image_shape):
            raise UserError(f"--classifier {args.classifier} takes images of shape {shape}, {dataset.name} has "
                            f"{dataset.image_shape}")
    print_fn(f"train stobatch: cnn28 from scratch on {dataset.name} private split, device "
             f"{hardware_description(device)}", file=sys.stderr)
    if config.reproducible_noise:
        print_fn(f"WARNING: --reproducible-noise: the DP noise is drawn from seed {config.seed}, which is recorded; "
                 "the epsilon does not hold against anyone who has it", file=sys.stderr)

    def on_epoch(row: dict) -> None:
        print_fn(f"epoch {row['epoch']:>3}  test accuracy {row['test_accuracy']:.4f}  ({row['seconds']:.0f} s)",
                 file=sys.stderr, flush=True)

    try:
        model, meta = train_stobatch(config, dataset, device, bar, on_epoch)
    except KeyboardInterrupt:
        print_fn(f"transdenoiser train: interrupted: nothing was saved in {args.out} (the stobatch arm saves once, "
                 "at the end)", file=sys.stderr)
        return 130
    save_stobatch(args.out, model, meta)
    if args.json:
        print_fn(json.dumps(meta, indent=2))
        return 0
    print_fn(f"classifier cnn28 trained by StoBatch: test accuracy {meta['test_accuracy']:.4f} "
             f"({len(meta['metrics'])} epochs)")
    print_fn(format_privacy_report(meta["privacy"]))
    print_fn(f"checkpoint: {args.out}  (privacy report also in {args.out}/{REPORT_FILE}); certify it with "
             f"`transdenoiser certify --classifier {args.out}`, attack it with `transdenoiser attack --classifier "
             f"{args.out}`; its own certificate beside smoothing: `transdenoiser baseline-certify --model {args.out} "
             "--sigma 0.25 --out DIR`")
    return 0


# ------------------------------------------------------------------------------------------------ certificate

@dataclass(frozen=True)
class StoBatchCertificate:
    """One image's certificate: ``prediction`` (or ABSTAIN), the lower confidence bound ``p_lower`` of the top
    class under the noise layer, ``epsilon_r`` = ln(p_lower / (1 - p_lower)) / 2, and the certified radii: every
    perturbation with L1 norm below ``radius_l1`` (L2 below ``radius_l2``, L-infinity below ``radius_linf``) leaves
    the prediction unchanged, with probability >= 1 - alpha over the sampling."""

    prediction: int
    count: int
    n: int
    p_lower: float
    epsilon_r: float
    radius_l1: float
    radius_l2: float
    radius_linf: float
    paper_bound_l1: float  # the paper's composition kappa + phi (NOT a valid certificate: see docs/BASELINES.md)


def radius_from_p_lower(p_lower: float, input_scale: float, hidden_scale: float, first_layer_l1_norm: float
                        ) -> tuple[float, float, float]:
    """(epsilon_r, certified L1 radius, the paper's kappa + phi) for a top-class lower bound ``p_lower``.

    Lecuyer et al.'s condition for a pure epsilon-DP noise layer, with the runner-up bounded by 1 - p_lower:
    robust while p_lower > e^(2 eps) (1 - p_lower), i.e. eps < epsilon_r = ln(p_lower / (1 - p_lower)) / 2.
    A perturbation delta costs ||delta||_1 / b_x through the input noise (Laplace scale b_x) and at most
    S ||delta||_1 / b_h through the first-layer noise (b_h, S = the layer's L1 operator norm); either noise alone
    makes the network that DP, so the cost is the smaller one and the radius is epsilon_r max(b_x, b_h / S).
    The paper adds the two (kappa + phi = epsilon_r (b_x + b_h / S)), which a single perturbation does not
    allow (docs/BASELINES.md)."""
    if not p_lower > 0.5:
        return 0.0, 0.0, 0.0
    eps_r = 0.5 * math.log(p_lower / (1 - p_lower))
    hidden_part = hidden_scale / first_layer_l1_norm if first_layer_l1_norm > 0 else math.inf
    return eps_r, eps_r * max(input_scale, hidden_part), eps_r * (input_scale + hidden_part)


class NoisyStoBatch(nn.Module):
    """StoBatch's randomised classifier, the model its certificate is about: every call adds fresh Laplace noise at
    the input (scale ``input_scale``, pixels in [0, 1]) and at the first layer (``hidden_scale``), then runs
    :func:`noisy_logits`. The noise comes from ``generator`` (a CPU generator), or torch's global CPU generator when
    None (so that randomized smoothing can copy the module), and is moved to the input's device."""

    def __init__(self, model: nn.Module, input_scale: float, hidden_scale: float, hidden_shape: Sequence[int],
                 generator: torch.Generator | None = None):
        super().__init__()
        self.model = model
        self.input_scale, self.hidden_scale = float(input_scale), float(hidden_scale)
        self.hidden_shape = tuple(int(s) for s in hidden_shape)
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generator = self.generator if self.generator is not None else torch.default_generator
        x = x + laplace_noise(tuple(x.shape), self.input_scale, generator).to(device=x.device, dtype=x.dtype)
        hidden_noise = laplace_noise((len(x), *self.hidden_shape), self.hidden_scale, generator)
        return noisy_logits(self.model, x, hidden_noise.to(device=x.device, dtype=x.dtype))


@dataclass
class StoBatchModel:
    """A loaded ``stobatch`` checkpoint with its noise layer: the classifier (frozen, eval mode), its metadata, the
    Laplace scales b_x and b_h, and S, the first layer's L1 -> L1 operator norm (:func:`l1_operator_norm`)."""

    model: nn.Module
    metadata: dict[str, Any]
    input_scale: float
    hidden_scale: float
    first_layer_l1_norm: float
    hidden_shape: tuple[int, ...]

    @property
    def num_classes(self) -> int:
        return int(self.metadata["num_classes"])

    @property
    def pixels(self) -> int:
        """d: the number of input coordinates (channels x height x width)."""
        return int(np.prod(self.metadata["input_shape"]))

    def noisy(self, generator: torch.Generator | None = None) -> NoisyStoBatch:
        """The randomised classifier, its noise drawn from ``generator`` (None: torch's global CPU generator)."""
        return NoisyStoBatch(self.model, self.input_scale, self.hidden_scale, self.hidden_shape, generator)

    def certify(self, image: torch.Tensor, n0: int, n: int, alpha: float, batch_size: int,
                generator: torch.Generator) -> StoBatchCertificate:
        """One image's certificate: ``n0`` draws of the randomised classifier select the top class, ``n`` fresh
        draws give its one-sided Clopper-Pearson lower bound at level 1 - ``alpha``; ABSTAIN unless it exceeds 1/2;
        else :func:`radius_from_p_lower`'s L1 radius, with L2 = L1 / sqrt(d) and L-infinity = L1 / d."""
        from certify.core import clopper_pearson_lower
        from training.baselines.securesgd import argmax_counts

        noisy = self.noisy(generator)
        selection = argmax_counts(noisy, image, n0, self.num_classes, batch_size)
        top = int(selection.argmax())
        count = int(argmax_counts(noisy, image, n, self.num_classes, batch_size)[top])
        p_lower = clopper_pearson_lower(count, n, alpha)
        if not p_lower > 0.5:
            return StoBatchCertificate(ABSTAIN, count, n, p_lower, 0.0, 0.0, 0.0, 0.0, 0.0)
        eps_r, r1, paper = radius_from_p_lower(p_lower, self.input_scale, self.hidden_scale, self.first_layer_l1_norm)
        d = self.pixels
        return StoBatchCertificate(top, count, n, p_lower, eps_r, r1, r1 / math.sqrt(d), r1 / d, paper)


def load_stobatch(model_dir: str | Path, device: torch.device | str = "cpu") -> StoBatchModel:
    """Load a checkpoint written by the ``stobatch`` arm (hash-checked) with its noise layer's scales."""
    from training.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(model_dir, kind="classifier", map_location=device)
    meta = checkpoint.metadata
    settings = meta.get("stobatch")
    if meta.get("arm") != ARM or not isinstance(settings, dict):
        raise UserError(f"{model_dir} was not trained by the stobatch arm (no StoBatch noise layer in its metadata)")
    model = checkpoint.model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    conv = first_layer(model)
    with torch.no_grad():
        probe = torch.zeros((1, *meta["input_shape"]), device=conv.weight.device)
        hidden_shape = tuple(conv(model.normalize(probe)).shape[1:])
    return StoBatchModel(model, meta, float(settings["input_laplace_scale"]), float(settings["hidden_laplace_scale"]),
                         l1_operator_norm(conv, model.normalize.std.flatten().tolist()), hidden_shape)


def certificate_generator(seed: int, idx: int) -> torch.Generator:
    """The CPU generator of image ``idx``'s noise in a certificate run seeded with ``seed``: a stream of its own
    (:func:`training.baselines.common.certificate_seed`), so an image's certificate depends on (seed, idx) only."""
    from training.baselines.common import certificate_seed

    return torch.Generator().manual_seed(certificate_seed(seed, idx))


def certified_robustness(model_dir: str | Path, images: torch.Tensor | np.ndarray, *, n0: int = 100,
                         n: int = 1000, alpha: float = 0.001, batch_size: int = 500, seed: int = 0,
                         indices: Sequence[int] | None = None, device: torch.device | str = "cpu",
                         track: Track = silent) -> list[StoBatchCertificate]:
    """StoBatch's robustness certificate (the paper's PixelDP-style bound, made sound) for ``images``.

    ``model_dir``: a checkpoint written by the ``stobatch`` arm; ``images``: (N, C, H, W), pixels in [0, 1].
    For each image, :meth:`StoBatchModel.certify`: ``n0`` noisy forward passes (fresh Laplace noise at the input,
    scale b_x, and at the first layer, scale b_h, both from the checkpoint's metadata) select the top class; ``n``
    further passes give its one-sided Clopper-Pearson lower bound p_lower at level 1 - alpha (statsmodels); ABSTAIN
    unless p_lower > 1/2. The radius is :func:`radius_from_p_lower`'s; L2 and L-infinity radii follow from
    ||delta||_1 <= sqrt(d) ||delta||_2 <= d ||delta||_inf (d pixels). Image i's noise comes from
    :func:`certificate_generator` (``seed``, ``indices[i]``), ``indices`` defaulting to 0, 1, ...: repeatable, and
    the same as ``transdenoiser baseline-certify --seed SEED`` gives the split's image ``indices[i]``.
    """
    for name, value in (("n0", n0), ("n", n), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be an integer >= 1, got {value!r}")
    if not (isinstance(alpha, float) and 0 < alpha < 1):
        raise UserError(f"alpha must lie in (0, 1), got {alpha!r}")
    loaded = load_stobatch(model_dir, device)
    images = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images)
    expected = tuple(loaded.metadata["input_shape"])
    if images.dim() != 4 or tuple(images.shape[1:]) != expected:
        raise UserError(f"images must have shape (N, {', '.join(map(str, expected))}), got {tuple(images.shape)}")
    images = images.to(torch.float32)
    if images.numel() and (not bool(torch.isfinite(images).all()) or float(images.min()) < 0
                           or float(images.max()) > 1):
        raise UserError("images must be finite with pixels in [0, 1]")
    indices = list(range(len(images))) if indices is None else [int(i) for i in indices]
    if len(indices) != len(images) or any(i < 0 for i in indices):
        raise UserError(f"indices must be {len(images)} integers >= 0, one per image")
    return [loaded.certify(images[i].to(device), n0, n, alpha, batch_size, certificate_generator(seed, indices[i]))
            for i in track(range(len(images)), desc="stobatch certify", total=len(images))]


__all__ = ["ABSTAIN", "ARM", "StoBatchConfig", "cmd_train_stobatch", "config_from_train_args", "StoBatchCertificate",
           "PaperBudget", "train_stobatch", "save_stobatch", "certified_robustness", "radius_from_p_lower",
           "laplace_noise", "paper_budget", "disjoint_batches", "reconstruction_sensitivity",
           "largest_singular_value", "l1_operator_norm", "privacy_report", "format_privacy_report",
           "dp_adversarial_examples", "taylor_logistic", "plan", "clipped_gradient_sum", "privatised_gradient",
           "example_gradients", "noisy_logits", "reconstruction_logits", "first_layer", "NoisyStoBatch",
           "StoBatchModel", "load_stobatch", "certificate_generator"]
