"""Clipped sums replayed as CUDA graphs: the host launches a piece's hundreds of kernels once, then one replay.

On a GPU a DP step of a small or mid-sized denoiser is bound by the host, not the device: ghost clipping issues
two to three times the kernels of a plain backward pass (measured on an H200: 153 against 62 kernels for the
autoencoder at batch 256, 949 against 435 for DnCNN), and the host takes longer to launch them than the device
takes to run them. A CUDA graph (``torch.cuda.CUDAGraph``) records the kernels of one call and replays them with
one launch.

A graph has fixed shapes, and a Poisson batch's size varies. Each piece of a batch is therefore padded with zero
rows up to a multiple of ``granule`` examples (:func:`padded_size`), and one graph is captured per padded size met
(lazily; a handful in practice: the batch size varies by about its square root). A padded row's clip weight is 0,
so its part of every clipped sum is ``0 x`` a finite gradient, exactly 0; its loss and factor are dropped. No
layer the graph runs mixes examples (BatchNorm and the other batch-statistics layers are refused by
:func:`graphs_possible`), so the real rows' norms, losses and sums are the unpadded ones, to float rounding (a
matrix product over more rows may sum in another order).

Only the clipped sums run in the graph: the input noise is drawn before it and the DP noise after it, by the
run's generators, exactly as without graphs. A capture that fails (an operation the capture does not allow)
leaves the engine eager for the rest of the run, and the reason is recorded in the execution plan.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Params = dict[str, torch.Tensor]
# (z rows, x rows, per-example weight mask) -> (losses (n,), clip factors (n,) times the mask, clipped sums)
PieceFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, Params]]

WARMUP_CALLS = 3  # eager calls on a side stream before a capture (cuBLAS/cuDNN workspaces, lazy state)
MAX_GRAPHS = 16  # padded sizes captured at most; a piece of another size runs eagerly
# modules that mix the examples of a batch (batch statistics): padding rows would change the real rows' results
_BATCH_MIXING = (nn.modules.batchnorm._NormBase,)


def graphs_possible(model: nn.Module, device: torch.device) -> tuple[bool, str]:
    """(whether the clipped sums of ``model`` may be replayed as CUDA graphs on ``device``, why)."""
    if torch.device(device).type != "cuda":
        return False, "CUDA graphs: not on a CUDA device"
    mixing = [name for name, m in model.named_modules() if isinstance(m, _BATCH_MIXING)]
    if mixing:
        return False, f"CUDA graphs: off, module {mixing[0]!r} mixes the examples of a batch"
    return True, "CUDA graphs: each piece padded with zero-weight rows to a multiple of the granule and replayed"


def default_granule(expected_examples: int) -> int:
    """Padding granule for an expected batch of ``expected_examples``: an eighth of the largest power of two
    not above it, at least 8 (64 -> 8, 256 -> 32, 1024 -> 128): at most granule - 1 padded rows per batch,
    about 6% of the batch on average, and a few padded sizes for the batch sizes Poisson sampling gives."""
    power = 1 << max(0, int(expected_examples).bit_length() - 1)
    return max(8, power // 8)


def padded_size(examples: int, granule: int) -> int:
    """``examples`` rounded up to a multiple of ``granule``."""
    if examples < 1 or granule < 1:
        raise ValueError(f"examples and granule must be >= 1, got {examples} and {granule}")
    return -(-examples // granule) * granule


def record_graph(fn: Callable[[], Any], device: torch.device) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``fn()`` run WARMUP_CALLS times on a side stream, then recorded as a CUDA graph: (the graph, the static
    outputs its replays overwrite). ``fn`` must read its inputs from tensors that outlive the graph."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


class _Capture:
    """One padded size: static input buffers, the recorded graph, and its static outputs."""

    def __init__(self, piece: PieceFn, z_shape: torch.Size, x_shape: torch.Size, examples: int,
                 dtype: torch.dtype, device: torch.device, record: bool = True, x_dtype: torch.dtype | None = None):
        self.z = torch.zeros(z_shape, dtype=dtype, device=device)
        # the targets keep their own dtype (class indices for a cross-entropy objective; a padded row's is 0)
        self.x = torch.zeros(x_shape, dtype=x_dtype or dtype, device=device)
        self.mask = torch.zeros(examples, dtype=torch.float32, device=device)
        self.graph, self.piece = None, piece
        if not record:  # the same buffers and padding, the piece run eagerly on each call (CPU tests)
            return
        self.graph, self.outputs = record_graph(lambda: piece(self.z, self.x, self.mask), device)

    def __call__(self, z: torch.Tensor, x: torch.Tensor, examples: int) -> tuple[torch.Tensor, torch.Tensor, Params]:
        rows = len(z)
        self.z[:rows].copy_(z)
        self.x[:rows].copy_(x)
        if rows < len(self.z):  # the sums need no zeroing (clip weight 0); a padded row holds no earlier example
            self.z[rows:].zero_()
            self.x[rows:].zero_()
        self.mask[:examples].fill_(1.0)
        self.mask[examples:].zero_()
        if self.graph is None:
            self.outputs = self.piece(self.z, self.x, self.mask)
        else:
            self.graph.replay()
        losses, factors, sums = self.outputs
        # copies: the static outputs are overwritten by the next replay
        return losses[:examples].clone(), factors[:examples].clone(), {k: v.clone() for k, v in sums.items()}


class GraphedPieces:
    """``piece``'s results for pieces of any size, each padded to a multiple of ``granule`` examples and
    replayed from a graph captured for that size. Raises whatever a capture raises; the caller falls back.
    ``record=False`` runs the same padded buffers eagerly, without graphs (how the padding is tested on CPU)."""

    def __init__(self, piece: PieceFn, granule: int, bytes_per_example: int, free_bytes: int, record: bool = True):
        if granule < 1:
            raise ValueError(f"granule must be >= 1, got {granule}")
        self.piece, self.granule, self.record = piece, granule, record
        # bytes per example of a capture: an estimate for the first (the caller's), then the last one's measured
        self.bytes_per_example, self.budget = bytes_per_example, free_bytes
        self.captures: dict[tuple, _Capture] = {}
        self.held = 0  # bytes held by the captures' memory pools (measured on CUDA)

    def capturable(self, padded: int) -> bool:
        """Whether another capture of ``padded`` examples fits: at most MAX_GRAPHS, within the memory budget."""
        return (len(self.captures) < MAX_GRAPHS
                and self.held + padded * self.bytes_per_example <= self.budget)

    def __call__(self, z: torch.Tensor, x: torch.Tensor, rows_per_example: int
                 ) -> tuple[torch.Tensor, torch.Tensor, Params] | None:
        """(losses, factors, clipped sums) of the piece's ``len(z) // rows_per_example`` examples, or None when
        no graph of its padded size exists or fits (the caller runs it eagerly)."""
        examples = len(z) // rows_per_example
        padded = padded_size(examples, self.granule)
        key = (padded, rows_per_example, tuple(z.shape[1:]), tuple(x.shape[1:]), z.dtype, x.dtype)
        capture = self.captures.get(key)
        if capture is None:
            if not self.capturable(padded):
                return None
            rows = padded * rows_per_example
            before = torch.cuda.memory_reserved(z.device) if self.record else 0
            capture = _Capture(self.piece, torch.Size((rows, *z.shape[1:])), torch.Size((rows, *x.shape[1:])),
                               padded, z.dtype, z.device, self.record, x.dtype)
            self.captures[key] = capture
            if self.record:  # the memory this capture took, measured (its warm-up's cached blocks included): the
                # next captures are budgeted by it rather than by the estimate the first one was
                taken = max(0, torch.cuda.memory_reserved(z.device) - before)
                self.bytes_per_example = max(1, -(-taken // padded))
                self.held += taken
            else:
                self.held += padded * self.bytes_per_example
        return capture(z, x, examples)


__all__ = ["GraphedPieces", "record_graph", "graphs_possible", "default_granule", "padded_size", "MAX_GRAPHS"]
