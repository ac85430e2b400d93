"""StoBatch's mechanisms (Phan et al., ICML 2020; the overview in :mod:`training.baselines.stobatch`): the Laplace
noise and the sensitivities it is scaled by, the disjoint batches, the model's noisy pieces (perturbed first layer,
the auto-encoder's reconstruction, the Taylor-expanded logistic loss), the DP adversarial examples and the
block-wise clipped, noised per-example gradients (torch.func)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F

from transdenoiser.errors import UserError

ADVERSARIAL_ATTACKS = ("ifgsm", "mim", "pgd")  # the paper's ensemble: I-FGSM, MIM, MadryEtAl (each example draws one)


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


def attack_draws(count: int, shape: tuple[int, ...], eps: float, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each example's own randomness for its adversarial version, drawn independently per example and
    independently of the data: which attack (0: I-FGSM, 1: MIM, 2: PGD, uniformly; about a third of the batch
    each) and PGD's random start in [-eps, eps]. Per-example draws, not the example's row in the batch: a row
    number depends on which other examples are present, and an attack chosen by it would let removing one example
    change the others' clipped gradients (a sensitivity above C)."""
    kind = torch.randint(0, len(ADVERSARIAL_ATTACKS), (count,), generator=generator)
    start = (torch.rand((count, *shape), generator=generator) * 2 - 1) * eps
    return kind, start


def dp_adversarial_examples(model: nn.Module, x_bar: torch.Tensor, hidden_noise: torch.Tensor, eps: float,
                            steps: int, generator: torch.Generator) -> torch.Tensor:
    """Adversarial versions of the PERTURBED inputs x_bar (post-processing of x_bar and the current weights):
    L-infinity budget ``eps``, each example by I-FGSM, MIM or PGD (random start) as :func:`attack_draws` draws
    for it, each ascending the cross-entropy at the model's own prediction on x_bar (no label is read)."""
    if eps <= 0 or len(x_bar) == 0:
        return x_bar.clone()
    kind, start = attack_draws(len(x_bar), tuple(x_bar.shape[1:]), eps, generator)
    return adversarial_examples(model, x_bar, hidden_noise, eps, steps, kind.to(x_bar.device),
                                start.to(x_bar.device))


def adversarial_examples(model: nn.Module, x_bar: torch.Tensor, hidden_noise: torch.Tensor, eps: float, steps: int,
                         kind: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """:func:`dp_adversarial_examples` with each example's draws given: row i reads only x_bar[i], kind[i] and
    start[i] (and the shared, data-independent weights and hidden noise)."""
    with torch.no_grad():
        target = noisy_logits(model, x_bar, hidden_noise).argmax(1)
    step = 2.5 * eps / steps
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
