"""Sound randomized smoothing in floating point, for inputs on the 8-bit grid (``--sound-noise``).

Why: the default sampler computes ``x + sigma * randn`` in float32. The rounded sum is not distributed as
N(x, sigma^2 I), and a base model that reads the low-order bits of its input can tell noise added to one image
from noise added to another: Voracek and Hein ("Sound randomized smoothing in floating-point arithmetic",
ICLR 2023) build models whose smoothed version is certified at a radius where an adversarial example exists.
Cohen et al.'s Theorem 1 is about real-valued noise, and no real-valued noise is drawn.

What this module does instead (the construction of Voracek and Hein: quantise the noisy input, draw the
quantised noise exactly; the code here is ours). An input x is on the grid h Z^d with h = 1/255 (pixel level
k / 255, k in 0..255). Let Q round every coordinate to the nearest grid point. The smoothed classifier is

    g(x') = argmax_c P[f(Q(x' + e)) = c],  e ~ N(0, sigma^2 I)   (real-valued e).

This is Gaussian smoothing of the deterministic base classifier f o Q, so Cohen et al.'s Theorem 1 holds for it
as stated, at every x' in R^d: if P[f(Q(x + e)) = c] >= pA > 1/2 then g(x') = c for ||x' - x||_2 <
sigma * Phi^-1(pA) (:func:`certified_radius`). For x on the grid, Q(x + e) = x + h K where the K_i are
independent with the *discretized Gaussian* law

    P[K_i = k] = Phi((k + 1/2) h / sigma) - Phi((k - 1/2) h / sigma)          (:func:`discretized_gaussian_pmf`),

so the sampler draws integers K exactly from that law (:class:`DiscretizedGaussian`: inverse CDF over a table
of cell edges computed with mpmath, integer uniforms, and the rare draws that the table cannot place resolved
exactly with further uniform bits), adds them to the integer levels of x (integer arithmetic) and converts to
float only for the model: the model sees fl((k + K) / 255), a deterministic function of integers, so whatever
its arithmetic does, it is part of the deterministic base classifier. The sampled law is the ideal one (no
table error to bound), so the radius and alpha are Cohen's, unchanged. The one assumption left is the one of
every sampler: the generator's integer uniforms (torch's Philox / Mersenne Twister) are treated as fair coins.

Inputs off the grid are refused (:func:`grid_levels`), never rounded silently.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from transdenoiser.errors import UserError

if TYPE_CHECKING:
    import torch

NOISE_KINDS = ("gaussian", "sound")  # the default float32 sampler, and this module's
GRID_LEVELS = 255  # the input grid: pixel values k / 255
GRID_TOLERANCE = 1e-5  # |x - k/255| above this (in [0,1] units) is off the grid (half a step is 2e-3)
UNIFORM_BITS = 62  # integer uniforms on [0, 2^62): torch.randint's int64 range, a power of two (exactly uniform)
GUIDE_BITS = 18  # the top bits of a uniform index a guide table that places most draws without a search
HEAD_BITS = 30  # the bits of a uniform drawn for every value (two per int64 draw); the others only where needed
SERIAL_CHUNK_ELEMENTS = 32768  # torch's grain size (at::internal::GRAIN_SIZE): smaller ops run in the caller's thread
TAIL_SIGMAS = 9.5  # the table covers |K| <= 9.5 sigma/h + 1; beyond it (mass < 2^-64) draws are resolved exactly


def check_noise_kind(noise: str) -> str:
    """``gaussian`` or ``sound``; anything else is a UserError."""
    if noise not in NOISE_KINDS:
        raise UserError(f"noise must be one of {', '.join(NOISE_KINDS)}, got {noise!r}")
    return noise


def certified_radius(p_lower: float, sigma: float) -> float:
    """Certified L2 radius of the quantised smoothed classifier g above: sigma * Phi^-1(p_lower).

    Cohen, Rosenfeld and Kolter (2019), Theorem 1 (with pB = 1 - pA), applied to the base classifier f o Q:
    rounding to the grid is part of the base classifier, the noise e is real-valued Gaussian, and the sampler
    draws Q(x + e) - x exactly. 0.0 when p_lower <= 1/2 (no certificate)."""
    from scipy.stats import norm

    if not 0.0 <= p_lower <= 1.0:
        raise ValueError(f"p_lower must lie in [0, 1], got {p_lower}")
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    return float(sigma * norm.ppf(p_lower)) if p_lower > 0.5 else 0.0


def discretized_gaussian_pmf(k: int, sigma: float, levels: int = GRID_LEVELS) -> float:
    """P[K = k] for K = round(e * levels), e ~ N(0, sigma^2): the law of one coordinate's grid noise (float64)."""
    from scipy.stats import norm

    scale = sigma * levels
    return float(norm.sf((k - 0.5) / scale) - norm.sf((k + 0.5) / scale)) if k >= 0 else \
        float(norm.cdf((k + 0.5) / scale) - norm.cdf((k - 0.5) / scale))


def grid_levels(images: torch.Tensor, levels: int = GRID_LEVELS) -> torch.Tensor:
    """The integer pixel levels k (int32) of ``images`` in [0, 1] on the grid k / ``levels``.

    Refuses (UserError, one line) values off the grid by more than :data:`GRID_TOLERANCE` or outside [0, 1]:
    sound smoothing certifies grid points, and rounding an input silently would certify another image."""
    import torch

    if not torch.is_floating_point(images):
        raise UserError(f"sound noise needs float images in [0, 1], got dtype {images.dtype}")
    if not bool(torch.isfinite(images).all()):
        raise UserError("sound noise: the image has NaN or infinite pixels")
    scaled = images.double() * levels
    k = scaled.round()
    off = (scaled - k).abs().max().item() / levels if images.numel() else 0.0
    if off > GRID_TOLERANCE:
        raise UserError(f"sound noise needs pixels on the 8-bit grid k/{levels}; a pixel is {off:.2g} off it "
                        f"(quantise the image to k/{levels} first, or use the default noise)")
    if images.numel() and (k.min().item() < 0 or k.max().item() > levels):
        raise UserError(f"sound noise needs pixels in [0, 1] (levels 0..{levels}); got levels "
                        f"{int(k.min().item())}..{int(k.max().item())}")
    return k.to(torch.int32)


def _mp_context(bits: int):
    import mpmath

    ctx = mpmath.MPContext()
    ctx.prec = bits
    return ctx


def _edge(ctx, k: int, scale) -> object:
    """Phi((k + 1/2) / scale), the CDF of the grid noise at the upper edge of cell k, at ``ctx``'s precision."""
    return ctx.ncdf((ctx.mpf(k) + ctx.mpf(0.5)) / scale)


def _floor_scaled(ctx, value, bits: int) -> int | None:
    """floor(value * 2^bits), or None when value * 2^bits lies too near an integer for ``ctx``'s precision."""
    scaled = value * ctx.mpf(2) ** bits
    floor = int(ctx.floor(scaled))
    margin = ctx.mpf(2) ** (bits + 24 - ctx.prec)  # far above the error of ctx.ncdf at this precision
    if scaled - floor < margin or floor + 1 - scaled < margin:
        return None
    return floor


class DiscretizedGaussian:
    """Exact sampler of K = round(e / h), e ~ N(0, sigma^2), h = 1 / ``levels``, by inverse CDF on integers.

    The CDF's cell edges F_k = Phi((k + 1/2) h / sigma) for |k| <= ``half_width`` are turned once into integer
    thresholds t_k = floor(F_k 2^B) (B = ``uniform_bits``), computed with mpmath at a precision at which every
    floor is certain. A draw is an integer uniform U on [0, 2^B), standing for the real uniform V in
    [U, U + 1) 2^-B: if t_{k-1} < U < t_k, that whole interval lies in cell k and K = k. If U equals a
    threshold (probability at most (2 half_width + 2) 2^-B per draw, or U falls in the tails), the interval
    straddles an edge: further uniforms refine V until its interval lies in one cell, edges evaluated with
    mpmath (:meth:`_resolve`). So P[K = k] is exactly the cell's probability: no table error to bound.
    Speed: the top :data:`GUIDE_BITS` bits of U index a guide table that places U directly unless a
    threshold or a tail falls in its bucket (under 1% of draws); those go through ``torch.searchsorted``, and
    only they draw U's low bits (:meth:`sample`)."""

    def __init__(self, sigma: float, levels: int = GRID_LEVELS, uniform_bits: int = UNIFORM_BITS):
        import torch

        if not (math.isfinite(sigma) and sigma > 0):
            raise UserError(f"sigma must be > 0, got {sigma}")
        if not 2 <= uniform_bits <= 62:
            raise ValueError(f"uniform_bits must lie in 2..62, got {uniform_bits}")
        self.sigma, self.levels, self.uniform_bits = float(sigma), int(levels), int(uniform_bits)
        self.half_width = int(math.ceil(TAIL_SIGMAS * sigma * levels)) + 1
        thresholds = _thresholds(self.sigma, self.levels, self.uniform_bits, self.half_width)
        self.thresholds = torch.tensor(thresholds, dtype=torch.int64)  # t for edges of cells -W-1 .. W
        self.head_bits = min(HEAD_BITS, uniform_bits)  # drawn for every value; the rest only where needed
        self.guide_bits = guide_bits = min(GUIDE_BITS, self.head_bits)
        self.guide_shift = uniform_bits - guide_bits
        starts = torch.arange(1 << guide_bits, dtype=torch.int64) << self.guide_shift
        ends = starts + (1 << self.guide_shift) - 1
        first = torch.searchsorted(self.thresholds, starts, right=False)
        last = torch.searchsorted(self.thresholds, ends, right=True)
        # the cell K = i - W - 1 (as float32: exact) when no threshold lies in the bucket and it is not in a tail;
        # NaN marks the buckets whose draws need their low bits and a search
        inside = (first == last) & (first > 0) & (first < len(thresholds))
        self.guide = torch.where(inside, (first - self.half_width - 1).to(torch.float32), float("nan"))
        self._on_device: dict = {}

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = (self.thresholds.to(device), self.guide.to(device))
        return self._on_device[key]

    def sample(self, shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device | str = "cpu"
               ) -> torch.Tensor:
        """Integer grid noise K (int32) of ``shape``, each entry exactly discretized-Gaussian, independent.

        The B bits of each uniform U are drawn lazily: first its top ``head_bits`` (at most 30) for every entry,
        which settle U's cell unless a threshold or a tail lies in its guide bucket; then, for those alone (under
        1%, in order), the remaining B - head_bits bits. Bits are independent and fair whenever they are drawn,
        so U is uniform on [0, 2^B) all the same, and the cell it falls in is what is returned."""
        import torch

        device = torch.device(device)
        _, guide = self._tables(device)
        heads = self._heads(math.prod(shape), generator, device)
        cells = guide.index_select(0, self._guide_index(heads))
        unplaced = cells.isnan().nonzero().squeeze(1)
        if unplaced.numel():
            cells.index_copy_(0, unplaced, self._place(heads.index_select(0, unplaced), generator, device))
        return cells.view(shape).to(torch.int32)

    def _heads(self, count: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
        """``count`` raw int32 words whose low ``head_bits`` bits are the top bits of the uniforms: one int64 on
        [0, 2^62) is two int32 halves whose low 30 bits are independent fair bits (half as many draws as values;
        ``torch.randint`` of 30 bits into int32 directly measured about twice as slow)."""
        import torch

        pairs = torch.randint(0, 1 << 62, ((count + 1) // 2,), generator=generator, device=device, dtype=torch.int64)
        return pairs.view(torch.int32)[:count]

    def _guide_index(self, heads: torch.Tensor) -> torch.Tensor:
        """The guide-table bucket of each raw head: its top ``guide_bits`` of ``head_bits``."""
        import torch

        index = torch.bitwise_and(heads, (1 << self.head_bits) - 1)
        return index.bitwise_right_shift_(self.head_bits - self.guide_bits)

    def _place(self, heads: torch.Tensor, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
        """The cells K (float32) of the uniforms whose raw ``heads`` the guide table could not place: draw their low
        bits, search the thresholds, and resolve the ones that straddle an edge or lie in a tail."""
        import torch

        thresholds, _ = self._tables(device)
        tail_bits = self.uniform_bits - self.head_bits
        u = torch.bitwise_and(heads, (1 << self.head_bits) - 1).to(torch.int64) << tail_bits
        if tail_bits:
            u |= torch.randint(0, 1 << tail_bits, u.shape, generator=generator, device=device, dtype=torch.int64)
        index = torch.searchsorted(thresholds, u, right=True)
        cells = index - (self.half_width + 1)
        straddle = (thresholds[(index - 1).clamp(min=0)] == u) | (index == 0) | (index == len(thresholds))
        if bool(straddle.any()):
            for i in straddle.nonzero().squeeze(1).tolist():
                cells[i] = self._resolve(int(u[i]), generator, device)
        return cells.to(torch.float32)

    def _resolve(self, uniform: int, generator: torch.Generator | None, device: torch.device) -> int:
        """The cell k of a real uniform V in [uniform, uniform + 1) 2^-B that straddles a cell edge: draw
        further B-bit uniforms, narrowing V's interval, until it lies inside one cell (exact; rare)."""
        import torch

        bits, low = self.uniform_bits, uniform
        while True:
            ctx = _mp_context(bits + 96)
            scale = ctx.mpf(self.sigma) * self.levels
            v_low, v_high = ctx.mpf(low) / ctx.mpf(2) ** bits, ctx.mpf(low + 1) / ctx.mpf(2) ** bits
            middle = (v_low + v_high) / 2
            k = int(ctx.nint(ctx.sqrt(2) * ctx.erfinv(2 * middle - 1) * scale))  # cell of the middle, then check
            while _edge(ctx, k - 1, scale) > middle:
                k -= 1
            while _edge(ctx, k, scale) <= middle:
                k += 1
            lower, upper = _edge(ctx, k - 1, scale), _edge(ctx, k, scale)
            gap = ctx.mpf(2) ** (-bits - 64)
            if lower + gap < v_low and v_high + gap < upper:
                return k
            more = int(torch.randint(0, 1 << self.uniform_bits, (1,), generator=generator, device=device,
                                     dtype=torch.int64).item())
            low, bits = (low << self.uniform_bits) | more, bits + self.uniform_bits

    def noisy(self, levels: torch.Tensor, num: int, generator: torch.Generator | None,
              dtype: torch.dtype) -> torch.Tensor:
        """``num`` noisy copies of one image given by its integer ``levels`` (C, H, W): (levels + K) / 255 in
        ``dtype``, the sum exact (integers in float32), the division the only rounding. The same draws as
        ``(sample((num, *levels.shape)) + levels) / 255``, whatever the chunking below."""
        import torch

        device = levels.device
        _, guide = self._tables(device)
        per_sample = levels.numel()
        heads = self._heads(num * per_sample, generator, device)
        level_values = levels.to(torch.float32)
        out = torch.empty((num, *levels.shape), dtype=dtype, device=device)
        # With several CPU threads, in chunks under torch's grain size, so that every op runs in this thread alone:
        # the forward passes' worker threads keep the cores and no op waits for an intra-op thread (on a loaded
        # 2-core machine whole 1M-value pieces took 9x longer with 2 intra-op threads than such chunks).
        serial = device.type == "cpu" and torch.get_num_threads() > 1
        per = max(1, SERIAL_CHUNK_ELEMENTS // max(1, per_sample)) if serial else num
        unplaced = []
        for start in range(0, num, per):
            size = min(per, num - start)
            first = start * per_sample
            cells = guide.index_select(0, self._guide_index(heads[first:first + size * per_sample]))
            missing = cells.isnan().nonzero().squeeze(1)
            if missing.numel():
                unplaced.append(missing + first)
            noisy = cells.view(size, *levels.shape).add_(level_values)
            torch.div(noisy.to(dtype), self.levels, out=out[start:start + size])
        if unplaced:  # their low bits are drawn after every head, in order: the chunking changes nothing
            where = torch.cat(unplaced)
            cells = self._place(heads.index_select(0, where), generator, device)
            values = cells.add_(level_values.view(-1).index_select(0, where % per_sample))
            out.view(-1).index_copy_(0, where, torch.div(values.to(dtype), self.levels))
        return out


@functools.lru_cache(maxsize=8)
def _thresholds(sigma: float, levels: int, bits: int, half_width: int) -> list[int]:
    """floor(F_k 2^bits) for the cell edges k = -half_width - 1 .. half_width (certain floors: the precision is
    raised until no edge lies within the evaluation error of an integer)."""
    precision = bits + 64
    while True:
        ctx = _mp_context(precision)
        scale = ctx.mpf(sigma) * levels
        floors = [_floor_scaled(ctx, _edge(ctx, k, scale), bits) for k in range(-half_width - 1, half_width + 1)]
        if all(f is not None for f in floors):
            return floors
        precision *= 2


@functools.lru_cache(maxsize=8)
def sampler(sigma: float, levels: int = GRID_LEVELS) -> DiscretizedGaussian:
    """The (cached) sampler of one sigma."""
    return DiscretizedGaussian(sigma, levels)
