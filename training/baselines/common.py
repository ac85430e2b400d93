"""What the baseline arms share: DP-SGD steps over any per-example loss, first-layer sensitivity bounds, the
PixelDP robustness condition (Lecuyer et al. 2019, Proposition 1) and its confidence bounds, privacy reports.

Units as everywhere in the product: pixels in [0, 1], noise multipliers = std of the Gaussian noise on the SUM of
clipped per-example gradients / C, every (epsilon, delta) for add-or-remove-one neighbours.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from scipy import optimize
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from training.privacy.accounting import epsilon_report
from training.privacy.dp import GaussianNoise, PerExampleClipper, per_example_norms
from training.privacy.report import format_epsilon_line, json_safe
from transdenoiser.errors import UserError
from transdenoiser.stats import clopper_pearson_lower

Params = dict[str, torch.Tensor]
ExampleLoss = Callable[..., torch.Tensor]


# ------------------------------------------------------------------------------------------ sensitivity

def conv_patch_multiplicity(kernel_size: tuple[int, int], stride: tuple[int, int]) -> int:
    """The most output positions any input pixel feeds in a 2-D convolution (dilation 1, any zero padding)."""
    return math.ceil(kernel_size[0] / stride[0]) * math.ceil(kernel_size[1] / stride[1])


def conv_operator_norm_bound(weight: torch.Tensor, stride: tuple[int, int] = (1, 1)) -> float:
    """Upper bound on the L2 operator norm of ``x -> conv2d(x, weight, stride)`` (no bias, any zero padding).

    Each output position is ``W_mat @ patch`` with ``W_mat = weight.reshape(out, -1)``, so
    ``||conv(x)||^2 = sum_pos ||W_mat patch_pos||^2 <= ||W_mat||_2^2 sum_pos ||patch_pos||^2
    <= ||W_mat||_2^2 m ||x||^2``, m = :func:`conv_patch_multiplicity` (each pixel lies in at most m patches).
    """
    if weight.dim() != 4:
        raise ValueError(f"a conv2d weight has 4 dimensions, got shape {tuple(weight.shape)}")
    matrix = weight.detach().to(torch.float64).reshape(weight.shape[0], -1)
    spectral = float(torch.linalg.matrix_norm(matrix, ord=2))
    return math.sqrt(conv_patch_multiplicity(tuple(weight.shape[2:]), tuple(stride))) * spectral


# ------------------------------------------------------------------------------------------ DP-SGD steps

def per_example_gradients(model: nn.Module, example_loss: ExampleLoss, tensors: tuple[torch.Tensor, ...],
                          chunk_size: int = 32) -> tuple[Params, torch.Tensor]:
    """``({name: (n, *shape)}, losses (n,))``: per-example gradients of ``example_loss(params, buffers, *one
    example's tensors)`` with torch.func (``vmap(grad)``), in chunks of at most ``chunk_size`` examples."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    fn = vmap(grad_and_value(example_loss), in_dims=(None, None) + (0,) * len(tensors))
    n = len(tensors[0])
    pieces = max(1, math.ceil(n / chunk_size)) if chunk_size else 1
    parts = [fn(params, buffers, *chunk) for chunk in zip(*(torch.tensor_split(t, pieces) for t in tensors),
                                                          strict=True)]
    grads = {k: torch.cat([g[k] for g, _ in parts]) for k in parts[0][0]}
    return grads, torch.cat([loss for _, loss in parts]).detach()


def example_loss_of(model: nn.Module, loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> ExampleLoss:
    """``(params, buffers, *inputs, target) -> loss(model(*inputs), target)`` for ONE example (batch of 1)."""

    def fn(params: Params, buffers: Params, *args: torch.Tensor) -> torch.Tensor:
        *inputs, target = args
        out = functional_call(model, (params, buffers), tuple(t.unsqueeze(0) for t in inputs))
        return loss(out, target.unsqueeze(0))

    return fn


class DPSGDStep:
    """One DP-SGD gradient: per-example gradients, each clipped to norm C over ALL trainable parameters, summed,
    N(0, (noise_multiplier C)^2 I) added to the sum, divided by the expected batch size B (Abadi et al. 2016).
    An empty Poisson batch still gets the noise (the step is counted)."""

    def __init__(self, model: nn.Module, example_loss: ExampleLoss, clip_norm: float, noise_multiplier: float,
                 expected_batch_size: float, chunk_size: int = 32,
                 row_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        if not noise_multiplier > 0:
            raise UserError(f"the noise multiplier must be > 0, got {noise_multiplier}")
        self.model, self.example_loss = model, example_loss
        self.clipper = PerExampleClipper(clip_norm)
        self.noise = GaussianNoise(clip_norm)
        self.noise_multiplier = noise_multiplier
        self.expected_batch_size = expected_batch_size
        self.chunk_size = chunk_size
        # ``row_loss(out, targets)``: the same loss per row of a batch. With it the clipped sum may come from
        # ghost clipping (training/privacy/ghost_clipping.py): chosen on the first batch if it is faster than
        # vmap on a synthetic batch of the same shapes, exact either way (to float rounding)
        self.row_loss, self.engine = row_loss, None if row_loss is not None else "vmap"

    def _choose_engine(self, tensors: tuple[torch.Tensor, ...]) -> None:
        import time

        from training.privacy.ghost_clipping import GhostClipping, GhostUnsupported

        fake = tuple(torch.rand_like(t) if t.is_floating_point() else torch.zeros_like(t) for t in tensors)
        try:
            ghost = GhostClipping(self.model, self.row_loss)
            timings = {}
            for _ in range(2):  # a warm-up, then one timed call each (the second kept)
                for name in ("ghost", "vmap"):
                    started = time.perf_counter()
                    if name == "ghost":
                        ghost(fake[:-1], fake[-1])
                    else:
                        per_example_gradients(self.model, self.example_loss, fake, self.chunk_size)
                    timings[name] = time.perf_counter() - started
        except GhostUnsupported:
            self.engine = "vmap"
            return
        self.engine = min(timings, key=timings.get)
        self._ghost = ghost if self.engine == "ghost" else ghost.close()

    def clipped_sum(self, tensors: tuple[torch.Tensor, ...]) -> tuple[Params, torch.Tensor, torch.Tensor]:
        """(sum of clipped per-example gradients, per-example norms before clipping, losses)."""
        if self.engine is None:
            self._choose_engine(tensors)
        if self.engine == "ghost":
            batch = self._ghost(tensors[:-1], tensors[-1])
            return batch.weighted_sum(self.clipper.factors(batch.norms)), batch.norms, batch.losses
        grads, losses = per_example_gradients(self.model, self.example_loss, tensors, self.chunk_size)
        norms = per_example_norms(grads).detach()
        return self.clipper.weighted_sum(grads, self.clipper.factors(norms)), norms, losses

    def gradient(self, tensors: tuple[torch.Tensor, ...], generator: torch.Generator) -> tuple[Params, float]:
        """The privatised gradient (clipped sum + noise) / B, and the batch's mean loss (nan when empty)."""
        if len(tensors[0]) == 0:
            summed = {k: torch.zeros_like(p) for k, p in self.model.named_parameters() if p.requires_grad}
            mean_loss = math.nan
        else:
            summed, _, losses = self.clipped_sum(tensors)
            mean_loss = float(losses.mean())
        noisy = self.noise.add(summed, self.noise_multiplier, generator)
        return {k: v / self.expected_batch_size for k, v in noisy.items()}, mean_loss


# ------------------------------------------------------------------------------------------ robustness condition

@torch.no_grad()
def argmax_counts(predict: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor, num: int, num_classes: int,
                  batch_size: int = 500) -> np.ndarray:
    """Counts of ``predict``'s argmax over ``num`` calls on copies of ``image`` (each call draws its own noise)."""
    counts = np.zeros(num_classes, dtype=np.int64)
    remaining = num
    while remaining > 0:
        size = min(batch_size, remaining)
        labels = predict(image.unsqueeze(0).expand(size, *image.shape)).argmax(1)
        counts += np.bincount(labels.cpu().numpy(), minlength=num_classes)
        remaining -= size
    return counts


def clopper_pearson_bounds(counts: np.ndarray, top: int, alpha: float) -> tuple[float, float]:
    """(lower bound on p_top, upper bound on max_{j != top} p_j), holding together with probability >= 1 - alpha.

    One-sided Clopper-Pearson bounds: the lower one at alpha/2, each of the K-1 upper ones at alpha/(2(K-1))
    (Bonferroni). ``top`` must have been chosen from OTHER samples than ``counts``. max_j p_j <= 1 - p_top is used
    as well (valid on the same event)."""
    counts = np.asarray(counts, dtype=np.int64)
    n, k = int(counts.sum()), len(counts)
    if n < 1 or k < 2 or not 0 <= top < k:
        raise UserError(f"need at least one sample, two classes and a valid top class, got n={n}, K={k}, top={top}")
    if not 0 < alpha < 1:
        raise UserError(f"alpha must lie in (0, 1), got {alpha}")
    lower = clopper_pearson_lower(int(counts[top]), n, alpha / 2)
    a_each = alpha / (2 * (k - 1))  # upper bound on p_j: 1 - the lower bound on 1 - p_j (the other n - c_j votes)
    uppers = [1.0 - clopper_pearson_lower(n - int(counts[j]), n, a_each) for j in range(k) if j != top]
    return lower, min(max(uppers), 1.0 - lower)


def robustness_condition(p_lower: float, p_upper: float, epsilon: float, delta: float) -> bool:
    """Lecuyer et al.'s condition for an (epsilon, delta)-DP scoring mechanism (expected outputs in [0, 1]):
    ``p_lower > e^(2 epsilon) p_upper + (1 + e^epsilon) delta``."""
    return p_lower > math.exp(2 * epsilon) * p_upper + (1 + math.exp(epsilon)) * delta


def largest_robust_size(p_lower: float, p_upper: float, attack_size: Callable[[float, float], float],
                        max_delta: float, grid: int = 400) -> tuple[float, float | None, float | None]:
    """``(L, epsilon, delta)``: the largest attack size ``attack_size(epsilon, delta)`` over the pairs meeting
    :func:`robustness_condition` (``attack_size`` must increase in delta). 0 and None when no pair does.

    For each epsilon in (0, ln(p_lower / p_upper) / 2), delta is the largest value meeting the condition (shrunk
    by 1e-9 relatively, capped at ``max_delta``); the best epsilon on a log grid is refined by a bounded scalar
    search; the pair returned meets the condition (checked)."""
    if not p_lower > p_upper:
        return 0.0, None, None
    eps_max = 0.5 * (math.log(p_lower / p_upper) if p_upper > 0 else 50.0)
    eps_max = min(eps_max, 50.0)

    def delta_for(eps: float) -> float:
        return min(max_delta, (p_lower - math.exp(2 * eps) * p_upper) / (1 + math.exp(eps)) * (1 - 1e-9))

    def size(eps: float) -> float:
        delta = delta_for(eps)
        return attack_size(eps, delta) if delta > 0 else 0.0

    grid_eps = np.unique(np.concatenate([np.geomspace(eps_max * 1e-6, eps_max, grid),
                                         eps_max * (1 - np.geomspace(1e-9, 0.5, 40))]))
    sizes = np.array([size(float(e)) for e in grid_eps])
    best = int(np.argmax(sizes))
    low = float(grid_eps[max(best - 1, 0)])
    high = float(grid_eps[min(best + 1, len(grid_eps) - 1)])
    refined = optimize.minimize_scalar(lambda e: -size(e), bounds=(low, high), method="bounded",
                                       options={"xatol": 1e-10 * max(high, 1e-12)})
    candidates = [float(refined.x)] + [float(grid_eps[i]) for i in np.argsort(-sizes)]
    for eps in sorted(candidates, key=size, reverse=True):  # the best pair that meets the condition (checked)
        delta = delta_for(eps)
        if delta > 0 and robustness_condition(p_lower, p_upper, eps, delta):
            return attack_size(eps, delta), eps, delta
    return 0.0, None, None


def certificate_seed(seed: int, idx: int, stream: int = 1) -> int:
    """Seed of the noise of a baseline's own certificate (``stream`` 1) or of another noise (other streams) for
    image ``idx`` of a run seeded with ``seed`` (NumPy's SeedSequence mixing): a result depends on (seed, idx) only,
    and the streams are apart from each other and from randomized smoothing's (``certify.core.image_seed``)."""
    if idx < 0:
        raise UserError(f"image index must be >= 0, got {idx}")
    return int(np.random.SeedSequence([seed, idx, stream]).generate_state(1)[0])


# ------------------------------------------------------------------------------------------ privacy report

DP_SGD_LABEL = ("DP-SGD: Poisson sampling at rate q, every per-example gradient clipped to L2 norm C, Gaussian noise "
                "N(0, (noise_multiplier C)^2 I) on the sum; noise fixed in advance: data-independent")


def dp_sgd_privacy_report(*, arm: str, sigma: float, clip_norm: float, noise_multiplier: float, sample_rate: float,
                          num_examples: int, expected_batch_size: float, delta: float, steps_planned: int,
                          steps_done: int, noise: dict[str, Any], target_epsilon: float | None,
                          calibration_accountant: str | None, claim: str,
                          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The released privacy report of a DP-SGD baseline, in the keys the product's reports use (``xi_up`` is
    the noise multiplier) plus ``extra`` (e.g. the paper's own analyses, each labelled)."""
    report: dict[str, Any] = {
        "arm": arm, "sigma": sigma, "clip_norm": clip_norm, "xi_up": noise_multiplier, "sample_rate": sample_rate,
        "num_examples": num_examples, "expected_batch_size": expected_batch_size, "delta": delta,
        "steps_planned": steps_planned, "steps_done": steps_done, "complete": steps_done == steps_planned,
        "units": "noise multipliers = std of Gaussian noise on the SUMMED clipped gradient / C; pixels in [0,1]",
        "target_epsilon": target_epsilon, "calibration_accountant": calibration_accountant, "noise": noise,
        "initialisation": {"kind": "random"}, "privacy_claim": claim, "guarantees": [],
    }
    if noise.get("mode") == "reproducible":
        report["privacy_claim"] = f"{noise['warning']} {claim}"
    if steps_done > 0:
        report["guarantees"].append({"name": "dp_sgd", "label": DP_SGD_LABEL, "data_independent": True,
                                     "noise_multiplier": noise_multiplier,
                                     "epsilon": epsilon_report(sample_rate, noise_multiplier, steps_done, delta)})
    report.update(extra or {})
    return json_safe(report)


def format_guarantee_lines(guarantees: list[dict[str, Any]]) -> list[str]:
    """Two lines per DP-SGD guarantee of a baseline's report: its label, and its epsilon by each accountant."""
    lines = []
    for g in guarantees:
        lines += [f"  [{g['name']}] {g['label']}", format_epsilon_line(g["epsilon"])]
    return lines


def format_baseline_privacy_report(report: dict[str, Any]) -> str:
    """Readable text of :func:`dp_sgd_privacy_report`'s dict."""
    lines = [f"Privacy report: arm {report['arm']}"
             + ("" if report.get("complete", True) else f"  (INCOMPLETE: {report['steps_done']} of "
                                                         f"{report['steps_planned']} steps)"),
             f"  input noise sigma {report['sigma']} (pixels in [0,1]); clip norm C {report['clip_norm']}; noise "
             f"multiplier {report['xi_up']:.4g} (std / C on the summed clipped gradient)",
             f"  Poisson sample rate q {report['sample_rate']:.5g} (expected batch {report['expected_batch_size']:g} "
             f"of N {report['num_examples']}), steps {report['steps_done']} of {report['steps_planned']}, "
             f"delta {report['delta']:g}"]
    if report.get("target_epsilon") is not None:
        lines.append(f"  noise multiplier calibrated for target epsilon {report['target_epsilon']} with the "
                     f"{report['calibration_accountant']} accountant")
    lines.append(f"  {report['privacy_claim']}")
    lines += format_guarantee_lines(report.get("guarantees", []))
    for key in ("noise_layer", "paper_analysis"):
        section = report.get(key)
        if isinstance(section, dict):
            lines.append(f"  [{key}] {section.get('label', '')}")
            for name, value in section.items():
                if name != "label":
                    lines.append(f"     {name}: {value}")
    return "\n".join(lines)
