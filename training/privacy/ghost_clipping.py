"""Per-example gradient norms and clipped sums without a per-example copy of every weight ("ghost clipping").

For a layer whose weight gradient is a sum over positions t of outer products, one example's gradient is
``G_i = sum_t p_it q_it^T`` (p: output gradients or input activations, q: the other one, per position), so

    ||G_i||_F^2 = sum_{t,s} (p_it . p_is)(q_it . q_is)            (ghost norm: Li et al. 2022, Goodfellow 2015)
                = ||P_i^T Q_i||_F^2                                (instantiating G_i for this layer only)

whichever is cheaper: T^2 (d_p + d_q) against T d_p d_q multiply-adds per example (Bu et al. 2022, "mixed
ghost clipping"). Both need only the layer's inputs (saved by a forward hook) and the gradients at its output,
obtained by ONE backward pass of the summed loss with respect to the layer outputs (no parameter gradient is
formed). The clipped sum ``sum_i w_i G_i`` is then formed from the same saved tensors as one matrix product
per layer with the examples weighted by w_i (Bu et al. 2023, "book-keeping"): equal to one backward pass of
the w-weighted loss, without running it.

Layers handled this way (p, q per position t):

- ``Linear``: output gradient, input (every leading dimension but the batch is a position);
- ``Conv2d`` (stride, padding, dilation, groups; zero padding): output gradient, unfolded input patches;
- ``ConvTranspose2d`` (stride, padding, output padding, dilation, groups): input, unfolded OUTPUT-gradient
  patches (a transposed convolution is the adjoint of a convolution with the same weight);
- ``GroupNorm`` (affine): per-example gradients of its 2C parameters are formed directly.

Any other module that owns trainable parameters gets per-example gradients of ITS OWN parameters with
``torch.func.vmap`` over (its input, its output gradient): exact, only costlier. Models this module cannot
follow (a module called twice per forward, a module whose input is not one tensor, a parameter owned by two
modules (tied weights), a parameter used outside the module that owns it, e.g. read by a functional call in its
parent's forward) raise :class:`GhostUnsupported`; the caller then uses plain vmap per-example
gradients for the whole model. Each of those would otherwise give a silently wrong norm: a layer's hooks see only
the uses inside that layer. Tied weights are found at set-up (each parameter's owning modules are counted);
uses outside the owner on the first forward pass, which records every torch function a parameter enters while
no module owning it is the innermost module running (:class:`_OutsideUses`; once, then not again).

The loss may run modules after the model (``row_loss``: e.g. a frozen classifier's cross-entropy on the model's
output): the backward pass to the layer outputs goes through them, and as only the model's modules are hooked,
their layers carry no per-example gradients and their parameters (which must not require gradients) none at all.

With ``rows_per_example`` K > 1 (K input-noise draws per example), rows ``i*K .. i*K+K-1`` are one example:
its gradient is the MEAN of its K row gradients (the loss is scaled by 1/K and the rows' positions are
concatenated), so the norm computed is that of the averaged gradient, which is what is clipped.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

Params = dict[str, torch.Tensor]
RowLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (model output, target) -> per-row loss


# a grouped convolution-backward call forms per-example gradients several times faster per multiply-add than
# the batched matrix products of the ghost norm (2-core CPU); the ghost norm is used where it is this much cheaper
GHOST_DISCOUNT = 4


class GhostUnsupported(ValueError):
    """The model has a structure ghost clipping cannot follow exactly; use vmap per-example gradients."""


def squared_error(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Eq. (1) per row: ``||g(z) - x||^2`` summed over pixels."""
    return (out - target).pow(2).flatten(1).sum(1)


def _kind(module: nn.Module) -> str:
    """How a module's own parameters are handled: a ghost kind, or "vmap" (the per-layer fallback)."""
    kind = type(module)  # exact types only: a subclass may override forward
    if kind is nn.Linear:
        return "linear"
    if kind is nn.Conv2d and module.padding_mode == "zeros" and not isinstance(module.padding, str):
        return "conv2d"
    if kind is nn.ConvTranspose2d and module.padding_mode == "zeros":
        return "conv_transpose2d"
    if kind is nn.GroupNorm and module.affine:
        return "group_norm"
    return "vmap"


def ghost_layer_kinds(model: nn.Module) -> dict[str, str]:
    """{module name: kind} for every module owning trainable parameters ("vmap": per-layer fallback)."""
    return {name: _kind(m) for name, m in model.named_modules()
            if any(p.requires_grad for p in m.parameters(recurse=False))}


class _Layer:
    """One module owning trainable parameters: what its forward hook saved, and its per-example pieces."""

    def __init__(self, name: str, module: nn.Module, kind: str):
        self.name, self.module, self.kind = name, module, kind
        self.params = {k: p for k, p in module.named_parameters(recurse=False) if p.requires_grad}
        self.inputs: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []
        self.versions: list[int] = []
        self.statistics: tuple[torch.Tensor, torch.Tensor] | None = None  # GroupNorm: the forward's mean, 1/std
        # filled by GhostClipping.__call__
        self.pq: tuple[torch.Tensor, torch.Tensor] | None = None  # (n, G, T, d_p), (n, G, T, d_q)
        self.rows: Params = {}  # per-example gradients formed directly: {param name: (n, *shape)}

    def full(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key


def _positions(t: torch.Tensor, n: int, groups: int) -> torch.Tensor:
    """(n*K, groups*d, L) -> (n, groups, K*L, d): each example's rows and positions as one set of positions."""
    rows, channels, length = t.shape
    k = rows // n
    t = t.reshape(n, k, groups, channels // groups, length).permute(0, 2, 1, 4, 3)
    return t.reshape(n, groups, k * length, channels // groups)


def _per_example_sum(t: torch.Tensor, n: int) -> torch.Tensor:
    """(n*K, C, ...) -> (n, C): summed over the rows of each example and every position."""
    return t.reshape(n, -1, t.shape[1], *t.shape[2:]).sum(dim=(1, *range(3, t.dim() + 1)))


def _pair_norms(p: torch.Tensor, q: torch.Tensor, ghost: bool | None = None) -> torch.Tensor:
    """||P_i^T Q_i||_F^2 summed over groups, shape (n,), by the cheaper of ghost norm and instantiation."""
    n, groups, length, d_p = p.shape
    d_q = q.shape[-1]
    p, q = p.reshape(n * groups, length, d_p), q.reshape(n * groups, length, d_q)
    if ghost is None:
        ghost = length * (d_p + d_q) <= d_p * d_q
    with _float32_products(p.is_cuda):
        return _squares(p, q, ghost).reshape(n, groups).sum(1)


def _squares(p: torch.Tensor, q: torch.Tensor, ghost: bool) -> torch.Tensor:
    if ghost:  # two T x T Gram matrices per example
        squares = (torch.bmm(p, p.transpose(1, 2)) * torch.bmm(q, q.transpose(1, 2))).sum((1, 2))
    else:  # this layer's per-example gradient, then dropped
        squares = torch.bmm(p.transpose(1, 2), q).pow(2).sum((1, 2))
    return squares


def _conv_weight_grad(m: nn.Module, transposed: bool, a: torch.Tensor, b: torch.Tensor, shape: torch.Size,
                      groups: int) -> torch.Tensor:
    """The weight gradient of a (transposed) convolution for input ``a`` and output gradient ``b``."""
    output_padding = list(m.output_padding) if transposed else [0, 0]
    return torch.ops.aten.convolution_backward(
        b, a, torch.empty(shape, dtype=a.dtype, device=a.device), None, list(m.stride), list(m.padding),
        list(m.dilation), transposed, output_padding, groups, [False, True, False])[1]


def _conv_weight_norms(m: nn.Module, transposed: bool, a: torch.Tensor, b: torch.Tensor, n: int
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(||dW_i||^2 per example (n,), None) by the ghost norm over unfolded patches, for small output maps
    (T (d_p + d_q) <= d_p d_q / GHOST_DISCOUNT); otherwise (None, dW_i (n, *weight shape)): each row's weight
    gradient by ONE grouped convolution-backward call with the rows as groups, summed per example. Those are
    kept: the weighted sum over them is a cheap contraction, cheaper than another convolution backward."""
    rows = len(a)
    if transposed:  # P: input positions, Q: unfolded output-gradient patches
        d_p, d_q = a.shape[1] // m.groups, b.shape[1] // m.groups * math.prod(m.kernel_size)
        length = a.shape[2] * a.shape[3]
    else:  # P: output-gradient positions, Q: unfolded input patches
        d_p, d_q = b.shape[1] // m.groups, a.shape[1] // m.groups * math.prod(m.kernel_size)
        length = b.shape[2] * b.shape[3]
    if length * (d_p + d_q) * GHOST_DISCOUNT <= d_p * d_q:
        if transposed:
            patches = F.unfold(b, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)
            if patches.shape[-1] != length:
                raise GhostUnsupported("a transposed convolution whose output size is not set by its input size")
            p, q = _positions(a.flatten(2), n, m.groups), _positions(patches, n, m.groups)
        else:
            patches = F.unfold(a, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)
            p, q = _positions(b.flatten(2), n, m.groups), _positions(patches, n, m.groups)
        return _pair_norms(p, q, ghost=True), None
    weight = m.weight
    grouped = (rows * weight.shape[0], *weight.shape[1:])
    per_row = _conv_weight_grad(m, transposed, a.reshape(1, -1, *a.shape[2:]), b.reshape(1, -1, *b.shape[2:]),
                                torch.Size(grouped), rows * m.groups)
    if rows == n:
        return None, per_row.reshape(n, *weight.shape)
    return None, per_row.reshape(n, rows // n, *weight.shape).sum(1)


def _group_norm_rows(m: nn.GroupNorm, a: torch.Tensor, b: torch.Tensor, n: int,
                     statistics: tuple[torch.Tensor, torch.Tensor] | None = None) -> Params:
    """Per-example gradients of a GroupNorm's weight and bias from its input ``a`` and output gradient ``b``.

    torch's own GroupNorm backward kernel, called on the rows laid side by side as ONE example of rows x C
    channels in rows x G groups: each group holds the same channels of the same row as before, so its
    statistics are the forward's, and the kernel's weight and bias gradients per channel are the per-row
    ones (``sum_t b_ct a^_ct`` and ``sum_t b_ct``, a^: ``a`` normalised), summed over each example's rows. One
    fused pass over ``a`` and ``b`` instead of forming the normalised activation and its product with ``b``.
    ``statistics``: the forward's (mean, 1/std) per row and group, (rows, G), in the side-by-side layout's
    group order already; recomputed from ``a`` when not given."""
    rows, channels = a.shape[:2]
    positions, groups = a[0, 0].numel(), rows * m.num_groups
    side_by_side = a.reshape(1, rows * channels, positions).contiguous()
    grad = b.reshape(1, rows * channels, positions).contiguous()
    if statistics is None:
        _, mean, inv_std = torch.ops.aten.native_group_norm(side_by_side, None, None, 1, rows * channels,
                                                            positions, groups, m.eps)
    else:
        mean, inv_std = (s.reshape(1, groups) for s in statistics)
    # the weight and bias gradients do not depend on the scale; CUDA's kernel needs one all the same
    scale = torch.ones(rows * channels, device=a.device, dtype=a.dtype)
    _, weight, bias = torch.ops.aten.native_group_norm_backward(grad, side_by_side, mean, inv_std, scale, 1,
                                                                rows * channels, positions, groups,
                                                                [False, True, True])
    return {"weight": weight.reshape(n, -1, channels).sum(1), "bias": bias.reshape(n, -1, channels).sum(1)}


def _saved_group_norm_statistics(output: torch.Tensor, a: torch.Tensor
                                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (mean, 1/std) that a GroupNorm's forward kernel saved for its backward, (rows, G), read from its
    output's autograd node; None where the output did not come from that kernel (then they are recomputed)."""
    node = output.grad_fn
    if type(node).__name__ != "NativeGroupNormBackward0":
        return None
    mean, inv_std = node._saved_result1, node._saved_result2
    if mean.dtype != a.dtype or inv_std.dtype != a.dtype or mean.numel() != len(a) * node._saved_group:
        return None
    return mean, inv_std


def _shared_parameters(layers: list[_Layer]) -> list[list[str]]:
    """The names under which each parameter owned by more than one layer is owned (tied weights)."""
    owners: dict[int, list[str]] = {}
    for layer in layers:
        for key, p in layer.params.items():
            owners.setdefault(id(p), []).append(layer.full(key))
    return [names for names in owners.values() if len(names) > 1]


class _OutsideUses(TorchFunctionMode):
    """While active (one forward pass of ``model``), records the name of every trainable parameter that enters a
    torch function whose result takes part in autograd while the innermost running module of ``model`` does not
    own it: a use no layer's hooks see, so its gradient would be missing from that layer's per-example norm."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.owner = {id(p): m for m in model.modules() for p in m.parameters(recurse=False) if p.requires_grad}
        self.names = {id(p): k for k, p in model.named_parameters() if p.requires_grad}
        self.stack: list[nn.Module] = []
        self.outside: list[str] = []
        self._handles = []
        for m in model.modules():
            self._handles.append(m.register_forward_pre_hook(self._enter))
            self._handles.append(m.register_forward_hook(self._leave, always_call=True))

    def _enter(self, module: nn.Module, inputs) -> None:
        self.stack.append(module)

    def _leave(self, module: nn.Module, inputs, output) -> None:
        self.stack.pop()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        current = self.stack[-1] if self.stack else None
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and self.owner.get(id(t), current) is not current \
                    and any(isinstance(r, torch.Tensor) and r.requires_grad for r in tree_leaves(result)):
                name = self.names[id(t)]
                if name not in self.outside:
                    self.outside.append(name)
        return result


@contextmanager
def _float32_products(cuda: bool) -> Iterator[None]:
    """Matrix products and cuDNN convolutions in float32, not TF32, inside the block (on CUDA; the settings are
    restored after). A ghost norm and the weighted sum of the same layer are formed by different kernels: both in
    float32, so that no example's part of the sum exceeds C by more than float32 rounding (TF32's 10-bit mantissa
    could put it about 1e-3 past C)."""
    if not cuda:
        yield
        return
    previous = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = False, False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous


class GhostClipping:
    """Per-example gradient norms of ``row_loss(model(z), x)`` and weighted sums of the per-example gradients.

    ``batch = GhostClipping(model)(z, x)`` runs one forward pass and one backward pass to the layer outputs;
    ``batch.norms`` (n,),
    ``batch.losses`` (n,), ``batch.weighted_sum(w)`` = ``{name: sum_i w_i g_i}``. Raises
    :class:`GhostUnsupported` for a model it cannot follow exactly.
    """

    def __init__(self, model: nn.Module, row_loss: RowLoss = squared_error):
        self.model = model
        self.row_loss = row_loss
        self.layers = [_Layer(name, m, kind) for name, m in model.named_modules()
                       if (kind := _kind(m)) and any(p.requires_grad for p in m.parameters(recurse=False))]
        covered = {id(p) for layer in self.layers for p in layer.params.values()}
        missing = [k for k, p in model.named_parameters() if p.requires_grad and id(p) not in covered]
        if missing:
            raise GhostUnsupported(f"parameters outside the model's modules: {', '.join(missing)}")
        shared = _shared_parameters(self.layers)
        if shared:
            raise GhostUnsupported(f"a parameter is shared by several modules ({' = '.join(shared[0])}): each "
                                   "module's hooks would see only its own use of it")
        self.names = [k for k, p in model.named_parameters() if p.requires_grad]
        self._uses_checked = False  # the first forward pass also looks for parameters used outside their module
        self._capturing = False
        self._copy_outputs = False
        self._handles = [layer.module.register_forward_hook(self._hook(layer)) for layer in self.layers]

    def close(self) -> None:
        """Remove the forward hooks from the model."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, layer: _Layer):
        def save(module, inputs, output):
            if not self._capturing:
                return
            if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor) or not isinstance(output, torch.Tensor):
                raise GhostUnsupported(f"module {layer.name!r} does not map one tensor to one tensor")
            layer.inputs.append(inputs[0].detach())
            layer.outputs.append(output)
            if layer.kind == "group_norm":
                layer.statistics = _saved_group_norm_statistics(output, inputs[0])
            layer.versions.append(output._version)
            if self._copy_outputs:  # the next layer changes it in place (ReLU(inplace=True)): it gets a copy
                return output.clone()
        return save

    def __call__(self, z: torch.Tensor | tuple[torch.Tensor, ...], x: torch.Tensor,
                 rows_per_example: int = 1) -> GhostBatch:
        """``z``: the model's input rows (a tuple: several inputs, e.g. an image and its layer noise); ``x``: the
        target rows of ``row_loss``."""
        inputs = z if isinstance(z, tuple) else (z,)
        if len(x) % rows_per_example or any(len(t) != len(x) for t in inputs):
            raise ValueError(f"{len(x)} rows are not {rows_per_example} rows per example")
        n = len(x) // rows_per_example
        for layer in self.layers:
            layer.inputs, layer.outputs, layer.versions, layer.pq, layer.rows = [], [], [], None, {}
            layer.statistics = None
        self._capturing = True
        try:
            out = self._checked_forward(inputs) if not self._uses_checked else self.model(*inputs)
        finally:
            self._capturing = False
        for layer in self.layers:
            if len(layer.outputs) != 1:
                raise GhostUnsupported(f"module {layer.name!r} ran {len(layer.outputs)} times in one forward pass")
            if layer.outputs[0]._version != layer.versions[0]:
                if self._copy_outputs:
                    raise GhostUnsupported(f"the output of module {layer.name!r} is modified in place")
                self._copy_outputs = True  # once: from now on every saved output is handed on as a copy
                return self(z, x, rows_per_example)
        row_losses = self.row_loss(out, x)
        outputs = [layer.outputs[0] for layer in self.layers]
        # the mean over each example's K rows: every output gradient carries the factor 1/K
        grads = torch.autograd.grad(row_losses.sum() / rows_per_example, outputs)
        squares = torch.zeros(n, dtype=torch.float32, device=x.device)
        for layer, grad_out in zip(self.layers, grads, strict=True):
            squares = squares + self._prepare(layer, layer.inputs[0], grad_out, n).to(squares.dtype)
            layer.inputs, layer.outputs, layer.statistics = [], [], None
        losses = row_losses.detach().reshape(n, rows_per_example).mean(1)
        return GhostBatch(self, squares.sqrt(), losses)

    def _checked_forward(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The model's forward pass, watched by :class:`_OutsideUses`: raises :class:`GhostUnsupported` if a
        parameter was used outside the module owning it (then the caller takes the per-example vmap path)."""
        uses = _OutsideUses(self.model)
        try:
            with uses:
                out = self.model(*inputs)
        finally:
            uses.close()
        if uses.outside:
            raise GhostUnsupported(f"parameter {uses.outside[0]} is used outside the module that owns it: that "
                                   "module's hooks would not see that use")
        self._uses_checked = True
        return out

    def _prepare(self, layer: _Layer, a: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
        """Save what the layer's weighted sums need; return its per-example squared gradient norms (n,)."""
        m, kind, rows = layer.module, layer.kind, {}
        squares = torch.zeros(n, dtype=b.dtype, device=b.device)
        if kind == "linear":
            p = b.reshape(n, 1, -1, b.shape[-1])
            q = a.reshape(n, 1, -1, a.shape[-1])
            if "bias" in layer.params:
                rows["bias"] = p.sum(2).squeeze(1)
            if "weight" in layer.params:
                layer.pq = (p, q)
                squares = squares + _pair_norms(p, q)
        elif kind in ("conv2d", "conv_transpose2d"):
            if "bias" in layer.params:
                rows["bias"] = _per_example_sum(b, n)
            if "weight" in layer.params:
                norms, per_example = _conv_weight_norms(m, kind == "conv_transpose2d", a, b, n)
                if per_example is None:
                    layer.pq = (a, b)
                    squares = squares + norms
                else:
                    rows["weight"] = per_example
        elif kind == "group_norm":
            rows = _group_norm_rows(m, a, b, n, layer.statistics)
        else:
            rows = self._vmap_rows(layer, a, b, n)
        rows = {k: v for k, v in rows.items() if k in layer.params}
        layer.rows = rows
        for g in rows.values():
            squares = squares + torch.linalg.vector_norm(g.reshape(n, -1), dim=1).square()
        return squares

    def _vmap_rows(self, layer: _Layer, a: torch.Tensor, b: torch.Tensor, n: int) -> Params:
        """Per-example gradients of this module's own parameters: vjp of one row's forward, vmapped."""
        params = {k: p.detach() for k, p in layer.params.items()}

        def row_grad(a_row, b_row):
            _, pull = vjp(lambda prm: functional_call(layer.module, prm, (a_row.unsqueeze(0),)), params)
            return pull(b_row.unsqueeze(0))[0]

        per_row = vmap(row_grad)(a, b)
        return {k: g.reshape(n, -1, *g.shape[1:]).sum(1) for k, g in per_row.items()}


class GhostBatch:
    """What one :class:`GhostClipping` pass leaves: per-example norms and losses, and the saved layer tensors
    from which any weighted sum of the per-example gradients is formed."""

    def __init__(self, owner: GhostClipping, norms: torch.Tensor, losses: torch.Tensor):
        self.norms, self.losses = norms, losses
        self.names = owner.names
        self.layers = [(layer, layer.pq, layer.rows) for layer in owner.layers]

    def __len__(self) -> int:
        return len(self.norms)

    def weighted_sum(self, weights: torch.Tensor) -> Params:
        """``{name: sum_i weights_i g_i}`` for every trainable parameter (weights 0 drop an example)."""
        out: Params = {}
        for layer, pq, rows in self.layers:
            for key, g in rows.items():
                out[layer.full(key)] = torch.einsum("n,n...->...", weights.to(g.dtype), g)
            if pq is None:
                continue
            weight = layer.params["weight"]
            if layer.kind == "linear":
                p, q = pq
                n, _, length, d_p = p.shape
                pw = (p * weights.to(p.dtype).reshape(n, 1, 1, 1)).reshape(n * length, d_p)
                with _float32_products(p.is_cuda):
                    out[layer.full("weight")] = pw.transpose(0, 1) @ q.reshape(n * length, q.shape[-1])
            else:  # the convolution's own weight-gradient kernel, output gradients weighted by example
                a, b = pq
                rows_per_example = len(b) // len(weights)
                w = weights.to(b.dtype).repeat_interleave(rows_per_example).reshape(-1, 1, 1, 1)
                with _float32_products(a.is_cuda):  # cuDNN's default on CUDA is TF32
                    out[layer.full("weight")] = _conv_weight_grad(layer.module, layer.kind == "conv_transpose2d",
                                                                  a, b * w, weight.shape, layer.module.groups)
        return {k: out[k] for k in self.names}


def ghost_supported(model: nn.Module) -> bool:
    """Whether every trainable parameter of ``model`` is owned by a module (ghost kind or per-layer vmap); a
    forward pass can still raise :class:`GhostUnsupported` (e.g. a module run twice)."""
    covered = {id(p) for m in model.modules() for p in m.parameters(recurse=False) if p.requires_grad}
    return all(id(p) in covered for p in model.parameters() if p.requires_grad)


__all__ = ["GhostClipping", "GhostBatch", "GhostUnsupported", "ghost_layer_kinds", "ghost_supported",
           "squared_error"]
