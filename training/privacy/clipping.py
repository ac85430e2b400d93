"""Clipped sums of per-example gradients for a batch, by the fastest exact method for the model and device.

Two engines give the same clipped sums (to float rounding):

- ``vmap``: every per-example gradient with ``torch.func.vmap(grad)`` (``dp.PerExampleGradients``),
  in chunks of ``chunk_size`` examples;
- ``ghost``: per-example norms from layer activations and output gradients, and the weighted sums from the
  same tensors (:mod:`training.privacy.ghost_clipping`); no per-example copy of the weights.

``auto`` times both on a synthetic batch of the training batch's shape (fixed-seed random pixels: no private
data decides the choice) and keeps the faster. A batch may be processed in physical pieces of
``physical_batch_size`` examples: each piece's clip factors and clipped sums are formed and its tensors freed
before the next; the sums over pieces equal the one-piece sums (a sum is a sum), so a logical Poisson batch
larger than memory is exact.

The chunk size of the vmap engine is sized for the device (:func:`device_chunk_size`): on CUDA from the free
memory and the per-example gradient size (the whole batch in one call when it fits), on CPU the measured
default (:data:`CPU_CHUNK_SIZE`).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from training.privacy.dp import Params, PerExampleClipper, PerExampleGradients, RowLoss, per_example_norms
from training.privacy.ghost_clipping import GhostClipping, GhostUnsupported
from training.privacy.graphed import GraphedPieces, default_granule, graphs_possible

CLIPPING_MODES = ("auto", "ghost", "vmap")
CUDA_GRAPH_MODES = ("auto", "off")  # auto: the ghost engine's clipped sums as CUDA graphs where possible
AUTO = -1  # grad_chunk_size / physical_batch_size: sized for the device
# On a 2-core CPU, vmap chunks of at most 32 examples are about 1.3x faster than one call over a batch of 64
# for the paper's autoencoder (docs/TRAINING.md).
CPU_CHUNK_SIZE = 32
# Fraction of the device's free memory a chunk's (or a physical piece's) per-example tensors may take; the rest
# is left to activations, the optimiser and the allocator's fragmentation.
MEMORY_FRACTION = 0.5
# Bytes held per example per byte of its parameter gradient (the gradient, vmap's intermediate copies, and the
# clipped-sum product): a conservative factor for the chunk-size rule.
VMAP_FOOTPRINT = 4
GHOST_FOOTPRINT = 6  # bytes held per example per byte of its layer inputs and outputs (saved tensors + products)

Split = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (noisy rows, clean rows) -> bool mask per example
TargetsOf = Callable[[torch.Tensor], torch.Tensor]  # clean synthetic rows -> their targets for the row loss


@dataclass
class ClippedSums:
    """One batch's per-example clip factors and losses, and the clipped sums of its groups of examples."""

    losses: torch.Tensor  # (n,) per-example loss (mean over its input-noise draws)
    factors: torch.Tensor  # (n,) min(1, C / ||g_i||)
    sums: dict[str, Params]  # "whole" (no split) or "nonneg" and "negative": sum_i factor_i g_i over the group
    mask: torch.Tensor | None = None  # (n,) bool: the split's group "nonneg"

    def whole(self) -> Params:
        """The clipped sum over every example."""
        if "whole" in self.sums:
            return self.sums["whole"]
        return {k: self.sums["nonneg"][k] + self.sums["negative"][k] for k in self.sums["nonneg"]}


@dataclass
class ExecutionPlan:
    """How the clipped sums are computed on this device (recorded in the private training record)."""

    clipping: str  # "ghost" or "vmap"
    grad_chunk_size: int  # vmap chunk; 0: the whole piece in one call
    physical_batch_size: int  # 0: the whole batch in one piece
    reasons: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # auto: seconds per step of each engine
    cuda_graphs: bool = False  # ghost on CUDA: each piece padded to a multiple of graph_granule and replayed
    graph_granule: int = 0  # examples; 0 without CUDA graphs

    def as_dict(self) -> dict:
        return {"clipping": self.clipping, "grad_chunk_size": self.grad_chunk_size,
                "physical_batch_size": self.physical_batch_size, "cuda_graphs": self.cuda_graphs,
                "graph_granule": self.graph_granule, "reasons": list(self.reasons),
                "timings_seconds": dict(self.timings)}

    @classmethod
    def from_dict(cls, saved: dict, note: str) -> ExecutionPlan:
        """A recorded plan (:meth:`as_dict`), ``note`` appended to its reasons; a record written before CUDA
        graphs existed runs without them."""
        return cls(saved["clipping"], saved["grad_chunk_size"], saved["physical_batch_size"],
                   [*saved.get("reasons", []), note], cuda_graphs=bool(saved.get("cuda_graphs", False)),
                   graph_granule=int(saved.get("graph_granule", 0)))

    def describe(self) -> str:
        chunk = "whole batch" if not self.grad_chunk_size else f"chunks of {self.grad_chunk_size}"
        piece = "one piece" if not self.physical_batch_size else f"pieces of {self.physical_batch_size}"
        vmap_part = f", vmap {chunk}" if self.clipping == "vmap" else ""
        graphs = f", CUDA graphs (granule {self.graph_granule})" if self.cuda_graphs else ""
        return f"clipping: {self.clipping}{vmap_part}{graphs}, {piece} ({'; '.join(self.reasons)})"


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of one gradient of the trainable parameters (= one per-example gradient)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def free_memory(device: torch.device) -> int | None:
    """Free bytes on a CUDA device (``torch.cuda.mem_get_info``); None elsewhere."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def device_chunk_size(model: nn.Module, device: torch.device, batch_rows: int, configured: int = AUTO
                      ) -> tuple[int, str]:
    """(vmap chunk size, why). ``configured`` >= 0 is used as given (0: one call); AUTO: on CUDA the most
    examples whose per-example gradients fit in MEMORY_FRACTION of the free memory (0 when the whole batch
    fits), elsewhere :data:`CPU_CHUNK_SIZE`."""
    if configured != AUTO:
        return configured, f"grad_chunk_size {configured} as configured"
    free = free_memory(torch.device(device))
    if free is None:
        return CPU_CHUNK_SIZE, f"CPU default chunk {CPU_CHUNK_SIZE} (measured)"
    per_example = VMAP_FOOTPRINT * parameter_bytes(model)
    fits = max(1, int(MEMORY_FRACTION * free // max(1, per_example)))
    if fits >= batch_rows:
        return 0, f"whole batch in one vmap call ({batch_rows} x {per_example / 2**20:.1f} MiB fits " \
                  f"{free / 2**30:.1f} GiB free)"
    return fits, f"chunks of {fits} ({per_example / 2**20:.1f} MiB per example, {free / 2**30:.1f} GiB free)"


def ghost_example_bytes(model: nn.Module, example_shape: tuple[int, ...], device: torch.device) -> int:
    """Bytes the ghost engine holds per example: GHOST_FOOTPRINT x the inputs and outputs of every module
    owning parameters, measured by one forward pass of a zero image, plus one per-example gradient (what the
    layers whose per-example weight gradients are formed directly keep, at most)."""
    total = 0
    handles = []

    def count(module, inputs, output):
        nonlocal total
        total += sum(t.numel() * t.element_size() for t in (*inputs, output) if isinstance(t, torch.Tensor))

    for m in model.modules():
        if any(True for _ in m.parameters(recurse=False)):
            handles.append(m.register_forward_hook(count))
    try:
        with torch.no_grad():
            model(torch.zeros((1, *example_shape), device=device))
    finally:
        for h in handles:
            h.remove()
    return GHOST_FOOTPRINT * total + parameter_bytes(model)


def device_physical_batch(model: nn.Module, clipping: str, example_shape: tuple[int, ...], device: torch.device,
                          configured: int = AUTO) -> tuple[int, str]:
    """(physical piece size, why): as configured (0: the whole batch); AUTO: on CUDA the most examples whose
    saved tensors fit in MEMORY_FRACTION of the free memory, elsewhere the whole batch."""
    if configured != AUTO:
        return configured, ("whole batch in one piece" if not configured else
                            f"physical pieces of {configured} as configured")
    free = free_memory(torch.device(device))
    if free is None:
        return 0, "whole batch in one piece (CPU)"
    per_example = (ghost_example_bytes(model, example_shape, device) if clipping == "ghost"
                   else VMAP_FOOTPRINT * parameter_bytes(model))
    fits = max(1, int(MEMORY_FRACTION * free // max(1, per_example)))
    return fits, f"physical pieces of at most {fits} ({per_example / 2**20:.1f} MiB per example, " \
                 f"{free / 2**30:.1f} GiB free)"


class ClippedGradients:
    """Clipped sums of per-example gradients of ``||model(z) - x||^2`` (or of ``row_loss(model(z), x)`` per row,
    ``x`` the rows' targets: e.g. a frozen classifier's cross-entropy, training/objectives.py) by the engine of
    ``plan``. Only ``model``'s parameters get per-example gradients: a module the loss runs after the model (the
    frozen classifier) is backpropagated through, never hooked."""

    def __init__(self, model: nn.Module, clip_norm: float, plan: ExecutionPlan, compile_model: bool = False,
                 row_loss: RowLoss | None = None):
        self.model, self.plan = model, plan
        self.clipper = PerExampleClipper(clip_norm)
        # compile: torch.compile of vmap's per-example function. The ghost engine stays eager: it needs the
        # layer outputs as autograd nodes, which a compiled graph does not expose
        self.vmap = PerExampleGradients(model, chunk_size=plan.grad_chunk_size, compiled=compile_model,
                                        row_loss=row_loss)
        self.ghost = None
        if plan.clipping == "ghost":
            try:
                self.ghost = GhostClipping(model) if row_loss is None else GhostClipping(model, row_loss)
            except GhostUnsupported as exc:
                self._fall_back(exc)
        self.graphs: GraphedPieces | None = None  # built on the first piece (its example shape sizes the memory)

    def _fall_back(self, exc: Exception) -> None:
        self.ghost = None
        self.plan.clipping = "vmap"
        self.plan.cuda_graphs = False
        self.plan.reasons.append(f"ghost clipping cannot follow this model ({exc}): vmap")

    def _graph_piece(self, z: torch.Tensor, x: torch.Tensor, mask: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, Params]:
        """What one graph replays: the ghost pass, the clip factors (0 on padded rows) and the clipped sums."""
        batch = self.ghost(z, x, len(z) // len(mask))
        factors = self.clipper.factors(batch.norms) * mask
        return batch.losses, factors, batch.weighted_sum(factors)

    def _graphed(self, z: torch.Tensor, x: torch.Tensor, rows: int
                 ) -> tuple[torch.Tensor, torch.Tensor, Params] | None:
        """(losses, factors, clipped sum) of one piece by a CUDA graph replay; None: run it eagerly (no graph of
        its size fits, or a capture failed, after which the rest of the run is eager and the plan says why)."""
        if self.graphs is None and not z.is_cuda:  # e.g. a run planned on CUDA, resumed elsewhere
            return None
        try:
            if self.graphs is None:
                device = z.device
                budget = int(MEMORY_FRACTION * (free_memory(device) or 0))
                self.graphs = GraphedPieces(self._graph_piece, self.plan.graph_granule,
                                            ghost_example_bytes(self.model, tuple(z.shape[1:]), device), budget)
            return self.graphs(z, x, rows)
        except Exception as exc:  # noqa: BLE001 - any capture failure: eager from here on, recorded
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.graphs = None
            self.plan.cuda_graphs = False
            self.plan.reasons.append(f"CUDA graph capture failed ({type(exc).__name__}: {first_line}): eager")
            return None

    def _engine(self, z: torch.Tensor, x: torch.Tensor, rows: int
                ) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], Params]]:
        """(per-example norms, losses, weights -> weighted sum of the per-example gradients) for one piece."""
        if self.ghost is not None:
            try:
                batch = self.ghost(z, x, rows)
                return batch.norms, batch.losses, batch.weighted_sum
            except GhostUnsupported as exc:
                self._fall_back(exc)
        grads, losses = self.vmap(z, x)
        if rows > 1:
            n = len(z) // rows
            grads = {k: g.reshape(n, rows, *g.shape[1:]).mean(1) for k, g in grads.items()}
            losses = losses.reshape(n, rows).mean(1)
        return per_example_norms(grads).detach(), losses, lambda w: self.clipper.weighted_sum(grads, w)

    def _piece(self, z: torch.Tensor, x: torch.Tensor, rows: int, split: Split | None
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Params], torch.Tensor | None]:
        """(losses, clip factors, {group: clipped sum}, the split's mask or None) of one piece: replayed from a
        CUDA graph where the plan has them (no split), else eagerly."""
        if split is None and self.plan.cuda_graphs and self.ghost is not None:
            graphed = self._graphed(z, x, rows)
            if graphed is not None:
                piece_losses, piece_factors, whole = graphed
                return piece_losses, piece_factors, {"whole": whole}, None
        norms, piece_losses, weighted_sum = self._engine(z, x, rows)
        piece_factors = self.clipper.factors(norms)
        mask = None
        if split is None:
            parts = {"whole": piece_factors}
        else:
            mask = split(z, x).to(piece_factors.device)
            weight = mask.to(piece_factors.dtype)
            parts = {"nonneg": piece_factors * weight, "negative": piece_factors * (1 - weight)}
        return piece_losses, piece_factors, {name: weighted_sum(w) for name, w in parts.items()}, mask

    def __call__(self, z: torch.Tensor, x: torch.Tensor, rows_per_example: int = 1,
                 split: Split | None = None) -> ClippedSums:
        """Clip each example's gradient (the mean over its ``rows_per_example`` rows) to C and sum; with
        ``split`` (a mask per example from its rows), the sums of the masked ("nonneg") and other examples."""
        n = len(z) // rows_per_example
        piece = self.plan.physical_batch_size or n
        losses, factors, masks = [], [], []
        sums: dict[str, Params] = {}
        for start in range(0, n, piece):
            stop = min(n, start + piece)
            zp = z[start * rows_per_example:stop * rows_per_example]
            xp = x[start * rows_per_example:stop * rows_per_example]
            piece_losses, piece_factors, part_sums, mask = self._piece(zp, xp, rows_per_example, split)
            for name, part in part_sums.items():
                sums[name] = part if name not in sums else {k: sums[name][k] + v for k, v in part.items()}
            losses.append(piece_losses)
            factors.append(piece_factors)
            if mask is not None:
                masks.append(mask)
        return ClippedSums(torch.cat(losses), torch.cat(factors), sums, torch.cat(masks) if masks else None)


def synthetic_batch(example_shape: tuple[int, ...], batch_size: int, device: torch.device,
                    sigma: float = 0.25) -> tuple[torch.Tensor, torch.Tensor]:
    """(noisy, clean) images of fixed-seed random pixels: what ``auto`` times the engines on (no private data)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand((batch_size, *example_shape), generator=generator)
    z = x + sigma * torch.randn(x.shape, generator=generator)
    return z.to(device), x.to(device)


def measure_engines(model: nn.Module, example_shape: tuple[int, ...], batch_size: int, device: torch.device,
                    plans: dict[str, ExecutionPlan], repeats: int = 3, rows_per_example: int = 1,
                    compile_model: bool = False, row_loss: RowLoss | None = None,
                    targets_of: TargetsOf | None = None) -> dict[str, float]:
    """Median seconds of one clipped sum per engine on a synthetic batch, the engines interleaved (each
    warmed up once first); an engine that cannot follow the model (found at set-up or in its warm-up pass) is
    left out. ``row_loss``: the loss per row (default eq. 1), ``targets_of``: the synthetic rows' targets for
    it (default the clean rows)."""
    z, x = synthetic_batch(example_shape, max(1, batch_size) * rows_per_example, device)
    if targets_of is not None:
        x = targets_of(x)
    engines = {name: ClippedGradients(model, 1.0, plan, compile_model, row_loss) for name, plan in plans.items()}
    engines = {name: e for name, e in engines.items() if e.plan.clipping == name}
    times: dict[str, list[float]] = {name: [] for name in engines}
    for attempt in range(repeats + 1):
        for name, engine in engines.items():
            if engine.plan.clipping != name:  # fell back to vmap in its warm-up pass: not this engine's time
                continue
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            engine(z, x, rows_per_example)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if attempt:
                times[name].append(time.perf_counter() - started)
    for engine in engines.values():
        if engine.ghost is not None:
            engine.ghost.close()
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()
            if t and engines[name].plan.clipping == name}


def plan_execution(model: nn.Module, example_shape: tuple[int, ...], batch_size: int, device: torch.device, *,
                   clipping: str = "auto", grad_chunk_size: int = AUTO, physical_batch_size: int = AUTO,
                   rows_per_example: int = 1, compile_model: bool = False,
                   cuda_graphs: str = "auto", row_loss: RowLoss | None = None,
                   targets_of: TargetsOf | None = None) -> ExecutionPlan:
    """The engine, vmap chunk and physical piece size for ``model`` on ``device`` at an expected batch of
    ``batch_size`` examples; ``auto`` clipping measures both engines (:func:`measure_engines`, with the run's
    ``row_loss`` and ``targets_of``); ``cuda_graphs`` auto: the ghost engine replays CUDA graphs where
    :func:`training.privacy.graphed.graphs_possible` allows."""
    if clipping not in CLIPPING_MODES:
        raise ValueError(f"clipping must be one of {', '.join(CLIPPING_MODES)}, got {clipping!r}")
    if cuda_graphs not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPH_MODES)}, got {cuda_graphs!r}")
    device = torch.device(device)
    rows = max(1, batch_size) * rows_per_example
    chunk, chunk_reason = device_chunk_size(model, device, rows, grad_chunk_size)
    candidates = ("ghost", "vmap") if clipping == "auto" else (clipping,)
    plans = {}
    for name in candidates:
        piece, piece_reason = device_physical_batch(model, name, example_shape, device, physical_batch_size)
        reasons = [chunk_reason] if name == "vmap" else []
        plans[name] = ExecutionPlan(name, chunk, piece, reasons + [piece_reason])
    if "ghost" in plans and cuda_graphs == "auto":
        possible, why = graphs_possible(model, device)
        if possible:
            ghost = plans["ghost"]
            ghost.cuda_graphs, ghost.graph_granule = True, default_granule(max(1, batch_size))
            if ghost.physical_batch_size:  # a padded piece never exceeds the piece size
                if physical_batch_size == AUTO:  # sized from memory: down to a whole number of granules
                    ghost.physical_batch_size = max(ghost.graph_granule,
                                                    ghost.physical_batch_size // ghost.graph_granule
                                                    * ghost.graph_granule)
                else:  # as configured: a granule that divides it
                    ghost.graph_granule = max(d for d in range(1, min(ghost.graph_granule,
                                                                      ghost.physical_batch_size) + 1)
                                              if ghost.physical_batch_size % d == 0)
            ghost.reasons.append(f"{why} ({ghost.graph_granule} examples)")
        elif device.type == "cuda":
            plans["ghost"].reasons.append(why)
    elif "ghost" in plans and device.type == "cuda":
        plans["ghost"].reasons.append("CUDA graphs: off as configured")
    if clipping != "auto":
        plans[clipping].reasons.insert(0, f"clipping {clipping} as configured")
        return plans[clipping]
    timings = measure_engines(model, example_shape, batch_size, device, plans, rows_per_example=rows_per_example,
                              compile_model=compile_model, row_loss=row_loss, targets_of=targets_of)
    best = min(timings, key=timings.get) if timings else "vmap"
    plan = plans[best]
    shown = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in sorted(timings.items()))
    plan.reasons.insert(0, f"auto: the faster on a synthetic batch of {batch_size} ({shown})")
    plan.timings = timings
    return plan


def plan_for_arm(arm, config, image_shape, device, record: dict | None) -> ExecutionPlan | None:
    """How a DP arm computes its clipped sums on ``device`` (a DP arm; None for --noise shaped|optimized, which
    form every per-example gradient): a resumed run keeps its recorded plan (the same engine, so the same
    float rounding), else :func:`training.privacy.clipping.plan_execution` (``auto`` measures the engines on a
    synthetic batch; with reproducible noise it takes ghost untimed, so that two runs repeat bit for bit).
    Under torchrun rank 0's plan is used by every rank."""
    if config.noise != "isotropic":
        return None
    saved = (record or {}).get("execution")
    if saved:
        arm.execution = ExecutionPlan.from_dict(saved, "kept from the resumed run")
        return arm.execution
    share = -(-config.batch_size // arm.group.world_size)
    clipping = config.clipping
    if clipping == "auto" and config.reproducible_noise:  # a timed choice could differ between two runs
        clipping = "ghost"
    arm.execution = plan_execution(arm.model, tuple(image_shape), share, torch.device(device),
                                   clipping=clipping, grad_chunk_size=config.grad_chunk_size,
                                   physical_batch_size=config.physical_batch_size,
                                   rows_per_example=config.noise_draws, compile_model=config.compile,
                                   cuda_graphs=config.cuda_graphs, **_objective_of(arm))
    if clipping != config.clipping:
        arm.execution.reasons[0] = "auto with reproducible noise: ghost, not timed, so that runs repeat bit for bit"
    if arm.group.distributed:  # the same engine on every rank
        choice = arm.group.from_rank_zero(torch.tensor([float(arm.execution.clipping == "ghost")],
                                                       dtype=torch.float64))
        arm.execution.clipping = "ghost" if float(choice[0]) > 0.5 else "vmap"
    if not getattr(arm, "credit_possible", True):  # the transdenoiser arm when no step can be credited
        arm.execution.reasons.append("transdenoiser: no step can be credited (merged noise, w > max_smin_dim), so "
                                     "line 8's Taylor remainder is not computed and every step is sepdp's")
    return arm.execution


def _objective_of(arm) -> dict:
    """The arm's loss per row and the synthetic rows' targets, for timing the engines on the loss the run trains
    (training/objectives.py); nothing for an arm without an objective (eq. 1)."""
    objective = getattr(arm, "objective", None)
    if objective is None or objective.loss == "mse":
        return {}
    return {"row_loss": objective.row_loss, "targets_of": objective.synthetic_targets}


def parse_size(text: str, what: str) -> int:
    """``auto`` -> AUTO, else an integer >= 0 (a command-line value)."""
    if text == "auto":
        return AUTO
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} must be auto or an integer >= 0, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{what} must be auto or an integer >= 0, got {text!r}")
    return value


__all__ = ["CLIPPING_MODES", "CUDA_GRAPH_MODES", "AUTO", "CPU_CHUNK_SIZE", "ClippedSums", "ExecutionPlan",
           "ClippedGradients", "device_chunk_size", "device_physical_batch", "plan_execution", "measure_engines",
           "parse_size", "parameter_bytes", "plan_for_arm"]
