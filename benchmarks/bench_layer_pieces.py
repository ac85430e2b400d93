"""One DnCNN middle layer's pieces of a DP step, each timed alone: where the ghost engine's extra time goes.

    python -m benchmarks.bench_layer_pieces --device cuda --json runs/bench/layer_pieces.json
    python -m benchmarks.bench_layer_pieces --quick          # CPU, tiny sizes: a smoke run

The layer is DnCNN's Conv2d(width -> width, 3x3, padding 1) followed by GroupNorm(groups, width), at ``--batch``
examples of ``--size`` x ``--size``. Pieces (ms per call, the mean of ``--iters`` calls after 3 untimed ones):
the forward convolution, its input gradient, its weight gradient summed over the batch (what non-private SGD
forms), the per-example weight gradients by one grouped convolution backward (what the ghost engine forms for
such a layer, ``training.privacy.ghost_clipping``), the same with channels-last inputs (already in that layout,
and with the two copies to it), GroupNorm's per-example weight and bias gradients four ways (normalise, multiply
and sum; batched dot products; torch's GroupNorm backward kernel with the rows side by side, with the statistics
recomputed, or with the forward's statistics, the engine's way), and the per-example norms and clipped sum of
the per-example weight gradients. On CUDA the convolutions are timed with cuDNN's TF32 allowed (its default) and
not allowed (float32).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import write_result


def _timer(device) -> Callable[[Callable[[], object], int], float]:
    import torch

    def timed(fn: Callable[[], object], iters: int) -> float:
        for _ in range(3):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / iters * 1e3
    return timed


def measure(device_name: str, batch: int, width: int, size: int, groups: int, iters: int) -> dict[str, float]:
    """{piece: ms per call}."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from training.privacy.ghost_clipping import _group_norm_rows

    device = torch.device(device_name)
    timed = _timer(device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(batch, width, size, size, generator=generator).to(device)
    b = torch.randn(batch, width, size, size, generator=generator).to(device)
    weight = torch.randn(width, width, 3, 3, generator=generator).to(device)

    def backward(x, grad, shape, n_groups, mask):
        return torch.ops.aten.convolution_backward(grad, x, torch.empty(shape, device=device), None, [1, 1], [1, 1],
                                                   [1, 1], False, [0, 0], n_groups, mask)

    side_a, side_b = a.reshape(1, batch * width, size, size), b.reshape(1, batch * width, size, size)
    last_a = side_a.contiguous(memory_format=torch.channels_last)
    last_b = side_b.contiguous(memory_format=torch.channels_last)
    per_example = (batch * width, width, 3, 3)
    result: dict[str, float] = {}
    settings = (("tf32", True), ("fp32", False)) if device.type == "cuda" else (("fp32", False),)
    previous = torch.backends.cudnn.allow_tf32
    try:
        for tag, tf32 in settings:
            torch.backends.cudnn.allow_tf32 = tf32
            result[f"forward convolution, {tag}"] = timed(lambda: F.conv2d(a, weight, padding=1), iters)
            result[f"input gradient, {tag}"] = timed(lambda: backward(a, b, weight.shape, 1, [True, False, False]),
                                                     iters)
            result[f"weight gradient summed over the batch, {tag}"] = timed(
                lambda: backward(a, b, weight.shape, 1, [False, True, False]), iters)
            result[f"per-example weight gradients, grouped, {tag}"] = timed(
                lambda: backward(side_a, side_b, per_example, batch, [False, True, False]), iters)
            result[f"per-example weight gradients, grouped, channels-last, {tag}"] = timed(
                lambda: backward(last_a, last_b, per_example, batch, [False, True, False]), iters)
            result[f"per-example weight gradients, grouped, channels-last with the copies to it, {tag}"] = timed(
                lambda: backward(side_a.contiguous(memory_format=torch.channels_last),
                                 side_b.contiguous(memory_format=torch.channels_last), per_example, batch,
                                 [False, True, False]), iters)
    finally:
        torch.backends.cudnn.allow_tf32 = previous
    norm = nn.GroupNorm(groups, width).to(device)
    result["GroupNorm per-example gradients: normalise, multiply, sum"] = timed(
        lambda: ((b * F.group_norm(a, groups, eps=norm.eps)).sum((2, 3)), b.sum((2, 3))), iters)
    result["GroupNorm per-example gradients: batched dot products"] = timed(
        lambda: (torch.matmul(F.group_norm(a, groups, eps=norm.eps).reshape(batch, width, 1, -1),
                              b.reshape(batch, width, -1, 1)), b.sum((2, 3))), iters)
    result["GroupNorm per-example gradients: GroupNorm backward kernel, statistics recomputed"] = timed(
        lambda: _group_norm_rows(norm, a, b, batch), iters)
    _, mean, inv_std = torch.ops.aten.native_group_norm(a, None, None, batch, width, size * size, groups, norm.eps)
    result["GroupNorm per-example gradients: GroupNorm backward kernel, the forward's statistics (ghost engine)"] = (
        timed(lambda: _group_norm_rows(norm, a, b, batch, (mean, inv_std)), iters))
    grads = torch.randn(batch, width * width * 9, generator=generator).to(device)
    ones = torch.ones(batch, device=device)
    result["per-example norms and the clipped sum"] = timed(
        lambda: (torch.linalg.vector_norm(grads, dim=1), torch.einsum("n,n...->...", ones, grads)), iters)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_layer_pieces", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=64, help="channels in and out (DnCNN's width)")
    parser.add_argument("--size", type=int, default=32, help="height and width of the feature maps")
    parser.add_argument("--groups", type=int, default=16, help="GroupNorm groups (must divide --width)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="CPU, batch 4, width 8, 8x8, 2 iterations")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.width, args.size, args.groups, args.iters = 4, 8, 8, 2, 2
    for name in ("batch", "width", "size", "groups", "iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.width % args.groups:
        parser.error(f"--groups {args.groups} does not divide --width {args.width}")
    from transdenoiser.runtime import hardware_description, resolve_device

    device = resolve_device(args.device)
    pieces = measure(str(device), args.batch, args.width, args.size, args.groups, args.iters)
    record = {"command": "python -m benchmarks.bench_layer_pieces " + " ".join(sys.argv[1:] if argv is None else argv),
              "hardware": hardware_description(device),
              "layer": {"batch": args.batch, "width": args.width, "size": args.size, "groups": args.groups},
              "iters": args.iters, "ms_per_call": pieces}
    width = max(len(k) for k in pieces)
    for name, ms in pieces.items():
        print(f"{name:<{width}}  {ms:9.4f} ms")
    if args.json is not None:
        write_result(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
