"""DP-SGD building blocks, one job each (in the spirit of Opacus): sampling, per-example gradients, clipping,
Gaussian noise. Each is a small class a user can replace.

Units: a *noise multiplier* is the standard deviation of the Gaussian noise added to the SUM of clipped
per-example gradients, divided by the clipping norm C. Pixels are in [0, 1].
"""
from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

Params = dict[str, torch.Tensor]
ExampleLoss = Callable[[Params, Params, torch.Tensor, torch.Tensor], torch.Tensor]
RowLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (model output rows, target rows) -> (n,) losses


def functional_example_loss(model: nn.Module, row_loss: RowLoss | None = None) -> ExampleLoss:
    """``loss(params, buffers, z, x) = ||g(z) - x||^2`` for ONE example (eq. 1, summed over pixels); with
    ``row_loss``, ``row_loss(g(z), x)`` of that one row (``x`` its target: an image or a class index)."""

    def loss(params: Params, buffers: Params, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (params, buffers), (z.unsqueeze(0),))
        if row_loss is not None:
            return row_loss(out, x.unsqueeze(0)).sum()
        return (out.squeeze(0) - x).pow(2).sum()

    return loss


def model_params(model: nn.Module, dtype: torch.dtype | None = None) -> tuple[Params, Params]:
    """Detached parameters (those requiring grad) and buffers of ``model``, optionally cast to ``dtype``."""
    cast = (lambda t: t.detach().to(dtype)) if dtype is not None else (lambda t: t.detach())
    params = {k: cast(v) for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: cast(v) for k, v in model.named_buffers()}
    return params, buffers


class PoissonSampler:
    """Poisson sampling: each of ``num_examples`` examples joins a batch independently with ``sample_rate`` q.

    An example joins when a uniform 62-bit integer falls below floor(q 2^62), so it joins with probability
    floor(q 2^62) / 2^62: at most q (the rate the accountant is given; a smaller rate spends less privacy) and
    within 2^-62 of it. (``torch.rand(n) < q`` would join with ceil(q 2^24) / 2^24 >= q in float32: above q.)"""

    RESOLUTION_BITS = 62

    def __init__(self, num_examples: int, sample_rate: float):
        if num_examples < 1:
            raise ValueError("PoissonSampler needs at least one example")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample rate must lie in (0, 1], got {sample_rate}")
        self.num_examples = num_examples
        self.sample_rate = sample_rate
        self.threshold = math.floor(Fraction(sample_rate) * 2 ** self.RESOLUTION_BITS)  # exact: q is a binary float

    @property
    def inclusion_probability(self) -> float:
        """The probability with which each example joins a batch: floor(q 2^62) / 2^62 <= q."""
        return self.threshold / 2 ** self.RESOLUTION_BITS

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        """Indices (int64, CPU) of one batch; may be empty."""
        draws = torch.randint(0, 2 ** self.RESOLUTION_BITS, (self.num_examples,), generator=generator,
                              dtype=torch.int64)
        return (draws < self.threshold).nonzero().flatten()


class PerExampleGradients:
    """Per-example gradients of eq. (1) (or of ``row_loss``: :func:`functional_example_loss`) with torch.func
    (``vmap(grad)``).

    ``chunk_size``: a batch of n examples is split into ceil(n / chunk_size) near-equal chunks, each one
    vmapped call (None or 0: the whole batch in one call). Chunks change only speed and memory, never the
    gradients' values beyond float rounding. ``compiled``: ``torch.compile`` the vmapped function. On CPU,
    chunks of at most 32 are about 1.3x faster than the
    whole batch of 64 for the paper's autoencoder (docs/results/training.md has the sweep).
    """

    def __init__(self, model: nn.Module, chunk_size: int | None = None, compiled: bool = False,
                 row_loss: RowLoss | None = None):
        self.model = model
        self.chunk_size = chunk_size or None
        loss = functional_example_loss(model, row_loss)
        self._grads = vmap(grad_and_value(loss), in_dims=(None, None, 0, 0))
        if compiled:  # torch.compile of the vmapped function (the first calls pay for compilation)
            self._grads = torch.compile(self._grads)

    def __call__(self, z: torch.Tensor, x: torch.Tensor) -> tuple[Params, torch.Tensor]:
        """Return ({name: (n, *shape)}, losses (n,)) for noisy inputs ``z`` and clean targets ``x``."""
        params, buffers = model_params(self.model)
        pieces = 1 if self.chunk_size is None else math.ceil(len(z) / self.chunk_size)
        if pieces <= 1:
            grads, losses = self._grads(params, buffers, z, x)
            return grads, losses.detach()
        parts = [self._grads(params, buffers, zc, xc)
                 for zc, xc in zip(torch.tensor_split(z, pieces), torch.tensor_split(x, pieces), strict=True)]
        grads = {k: torch.cat([g[k] for g, _ in parts]) for k in parts[0][0]}
        return grads, torch.cat([loss for _, loss in parts]).detach()


def per_example_norms(grads: Params) -> torch.Tensor:
    """L2 norm over all parameters of each example's gradient, shape (n,)."""
    squares = [g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads.values()]
    return torch.stack(squares).sum(0).sqrt()


class PerExampleClipper:
    """Clip factors ``s_i = min(1, C / ||g_i||)`` and the weighted sum ``sum_i s_i g_i``."""

    def __init__(self, clip_norm: float):
        if not clip_norm > 0:
            raise ValueError(f"clip norm must be > 0, got {clip_norm}")
        self.clip_norm = clip_norm

    def factors(self, norms: torch.Tensor) -> torch.Tensor:
        return (self.clip_norm / (norms + 1e-12)).clamp(max=1.0)

    @staticmethod
    def weighted_sum(grads: Params, weights: torch.Tensor) -> Params:
        """``sum_i weights_i * grads_i`` per parameter (weights 0 drop an example)."""
        return {k: torch.einsum("n,n...->...", weights.to(g.dtype), g) for k, g in grads.items()}


_DEVICE_GENERATORS: dict[torch.device, torch.Generator] = {}


def device_generator(generator: torch.Generator, device: torch.device | str) -> torch.Generator | None:
    """The generator a draw for ``device`` uses: None on CPU (draw from ``generator`` itself); on CUDA this
    device's Philox generator, re-seeded with a 63-bit integer drawn from ``generator``. The CPU ``generator``
    stays the run's one source of randomness (its saved state resumes a run bit for bit; under torchrun every rank
    draws the same seed) while the numbers are made on the device, where they are used: no draw on the host and
    no host-to-device copy per step. One CUDA draw is a different (equally distributed) stream than a CPU draw."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    seed = int(torch.randint(0, 2 ** 63 - 1, (), generator=generator))
    if device not in _DEVICE_GENERATORS:
        _DEVICE_GENERATORS[device] = torch.Generator(device=device)
    return _DEVICE_GENERATORS[device].manual_seed(seed)


def standard_normal(shape: tuple[int, ...] | torch.Size, generator: torch.Generator, device: torch.device | str,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """N(0, 1) draws of ``shape`` on ``device`` from the CPU ``generator``: drawn from it on CPU, on CUDA by the
    device generator it seeds (:func:`device_generator`)."""
    return _draw(shape, generator, device_generator(generator, device), device, dtype)


def _draw(shape: tuple[int, ...] | torch.Size, generator: torch.Generator, on_device: torch.Generator | None,
          device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """N(0, 1) draws of ``shape`` on ``device``: by ``on_device`` (a device generator, :func:`device_generator`) if
    given, else from the CPU ``generator``, then moved."""
    if on_device is None:
        return torch.randn(shape, generator=generator, dtype=torch.float32).to(device, dtype)
    return torch.randn(shape, generator=on_device, device=on_device.device, dtype=torch.float32).to(dtype)


class GaussianNoise:
    """Adds N(0, (noise_multiplier * C)^2) to every coordinate, drawn from the CPU ``generator``: on CPU from it
    directly, on CUDA by a device generator it seeds once per call (:func:`device_generator`)."""

    def __init__(self, clip_norm: float):
        self.clip_norm = clip_norm

    def add(self, tensors: Params, noise_multiplier: float, generator: torch.Generator) -> Params:
        if noise_multiplier < 0 or not math.isfinite(noise_multiplier):
            raise ValueError(f"noise multiplier must be finite and >= 0, got {noise_multiplier}")
        if noise_multiplier == 0:
            return dict(tensors)
        std = noise_multiplier * self.clip_norm
        devices = {t.device for t in tensors.values()}
        on_device = device_generator(generator, devices.pop()) if len(devices) == 1 else None
        # CPU (or tensors on several devices): on_device is None and every draw comes from the CPU generator
        return {k: t + std * _draw(t.shape, generator, on_device, t.device, t.dtype) for k, t in tensors.items()}


def input_gradient_fn(model: nn.Module) -> Callable:
    """vmapped ``(loss(x; target x), grad_x loss(x; target x))``: the Taylor expansion point of line 8."""
    loss = functional_example_loss(model)

    def at_clean(params, buffers, x):
        return grad_and_value(lambda inp: loss(params, buffers, inp, x))(x)

    return vmap(at_clean, in_dims=(None, None, 0))


def losses_fn(model: nn.Module) -> Callable:
    """vmapped per-example ``loss(z_i; target x_i)``."""
    return vmap(functional_example_loss(model), in_dims=(None, None, 0, 0))


__all__ = ["PoissonSampler", "PerExampleGradients", "PerExampleClipper", "GaussianNoise", "per_example_norms",
           "device_generator", "standard_normal",
           "functional_example_loss", "model_params", "input_gradient_fn", "losses_fn"]
