"""The forward batch (noisy samples per forward pass) on CUDA, from the device's free memory.

On CPU the default is a fixed, measured cache-sized pass (``certify.job.DEFAULT_BATCH``). On CUDA a large
pass keeps the GPU busy, but what fits depends on the models and the image size (a 3x224x224 ResNet-50
needs about 100x the memory per sample of a 28x28 CNN): one eager probe pass measures the peak memory per
sample, and the batch is the largest that fits in a fraction of the free memory, capped.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from certify import numerics
from transdenoiser.errors import UserError

MEMORY_FRACTION = 0.5  # of the free memory: room for compilation workspaces, the allocator's slack, other work
PROBE_SAMPLES = 8
NOISE_COPIES = 3  # a pass's noisy samples are held about this many times over (pieces, their concatenation, layout)
ROUND_TO = 64


def batch_from_memory(free_bytes: int, bytes_per_sample: float, cap: int, fraction: float = MEMORY_FRACTION) -> int:
    """The largest batch whose samples fit in ``fraction`` of ``free_bytes``, at most ``cap``, at least 1;
    rounded down to a multiple of 64 when that large."""
    if bytes_per_sample <= 0 or free_bytes < 0 or cap < 1 or not 0 < fraction <= 1:
        raise ValueError(f"bad memory figures: free {free_bytes}, per sample {bytes_per_sample}, cap {cap}, "
                         f"fraction {fraction}")
    fit = int(free_bytes * fraction // bytes_per_sample)
    if fit >= ROUND_TO:
        fit -= fit % ROUND_TO
    return max(1, min(cap, fit))


def cuda_forward_batch(forward: Callable[[torch.Tensor], torch.Tensor], image_shape: tuple[int, ...],
                       device: torch.device, precision: str, cap: int) -> int:
    """Measure ``forward`` (eager, at ``precision``) on a probe batch and size the pass from free memory."""
    if device.type != "cuda":
        raise UserError(f"the forward batch is sized from free memory on CUDA only, not on {device.type}")
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.inference_mode(), numerics.autocast(device, precision):
        forward(torch.zeros((PROBE_SAMPLES, *image_shape), device=device))
    torch.cuda.synchronize(device)
    activations = (torch.cuda.max_memory_allocated(device) - before) / PROBE_SAMPLES
    noise = NOISE_COPIES * 4 * int(torch.Size(image_shape).numel())
    return batch_from_memory(free, activations + noise, cap)
