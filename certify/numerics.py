"""How the base classifier is run: arithmetic precision, compilation, memory layout, forward batch.

The smoothed classifier g certifies the base pipeline f(D(.)) *as it is run*. Running it in bfloat16
or float16 autocast, or compiled by ``torch.compile``, makes f a slightly different function (other
rounding, sometimes another argmax near a tie); randomized smoothing's guarantee (Cohen et al. 2019,
Theorem 1) holds for any deterministic base classifier, so a certificate is exactly as valid for
that function as for the float32 one, but it is a certificate of *that* function. The setting is
therefore part of the certified model: recorded in every run's settings, summary, report and in the
served model card, and runs of different settings are never merged or overlaid.

Library code only (no printing); names and checks in one place for the CLI, the Python API, the
server's model directory and the benchmarks. Torch is imported inside the functions that need it.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from transdenoiser.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn

# Canonical names are torch's dtype names (what settings.json records); the short spellings are accepted.
PRECISIONS = ("float32", "bfloat16", "float16")
PRECISION_SPELLINGS = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
                       "fp16": "float16", "float16": "float16"}
PRECISION_CHOICES = ("fp32", "bf16", "fp16")  # the CLI's spelling
DEFAULT_PRECISION = "float32"
DEFAULT_NOISE = "gaussian"  # float32 x + sigma * randn; "sound": exact grid noise (certify.sound_noise)
# The settings that make the base classifier a different function: runs that differ in them never mix. The noise
# kind is one: sound smoothing certifies f o Q (Q: rounding to the input grid), not f.
NUMERIC_SETTINGS = ("precision", "compile", "noise")


def canonical_precision(name: str) -> str:
    """``fp32|bf16|fp16`` (or torch's names) -> ``float32|bfloat16|float16``; anything else is a UserError."""
    if not isinstance(name, str) or name.lower() not in PRECISION_SPELLINGS:
        raise UserError(f"precision must be one of fp32, bf16, fp16, got {name!r}")
    return PRECISION_SPELLINGS[name.lower()]


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of ``precision``, or None for float32 (no autocast)."""
    import torch

    return {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}[canonical_precision(precision)]


def autocast(device: torch.device, precision: str):
    """A context running the forward pass at ``precision`` on ``device`` (a no-op for float32)."""
    import torch

    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def check_precision_supported(device: torch.device, precision: str) -> str:
    """Refuse a precision this torch cannot autocast to on ``device`` (one line); return the canonical name.

    Checked by running one small convolution and linear layer under autocast, not from a version table."""
    import torch

    precision = canonical_precision(precision)
    dtype = autocast_dtype(precision)
    if dtype is None:
        return precision
    if not torch.amp.is_autocast_available(device.type):
        raise UserError(f"--precision {short_name(precision)}: torch {torch.__version__} has no autocast on "
                        f"{device.type}; use --precision fp32")
    try:
        conv = torch.nn.Conv2d(1, 2, 3).to(device)
        with torch.inference_mode(), torch.autocast(device_type=device.type, dtype=dtype):
            out = conv(torch.zeros(1, 1, 4, 4, device=device)).flatten(1)
            out = torch.nn.functional.linear(out, torch.zeros(2, out.shape[1], device=device))
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        raise UserError(f"--precision {short_name(precision)}: torch {torch.__version__} cannot run {precision} "
                        f"on {device.type} ({str(exc).splitlines()[0]}); use --precision fp32") from None
    if out.dtype != dtype:
        raise UserError(f"--precision {short_name(precision)}: autocast on {device.type} computes in {out.dtype}, "
                        f"not {precision}; use --precision fp32")
    return precision


def short_name(precision: str) -> str:
    """``float32`` -> ``fp32`` (the CLI spelling)."""
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[canonical_precision(precision)]


def default_memory_format(device: torch.device, compiled: bool, convolutional: bool) -> str:
    """``auto``'s choice, as measured (docs/CERTIFY.md, "Speed"): channels-last for convolutional models on CPU
    (about 2x faster there); on CUDA only when compiled (eager channels-last made the CIFAR DnCNN pipeline slower
    on an H200, compiled channels-last faster); contiguous otherwise."""
    if not convolutional:
        return "contiguous"
    if device.type == "cpu":
        return "channels_last"
    return "channels_last" if device.type == "cuda" and compiled else "contiguous"


def compile_module(module: nn.Module) -> nn.Module:
    """``torch.compile`` (inductor, static shapes). ``Smooth`` pads every pass to its batch size, so one graph
    computes every sample: no recompilation per pass size, and never torch's eager fallback past its recompile
    limit (which would make the base classifier a mix of two functions)."""
    import torch

    return torch.compile(module, dynamic=False)


def describe(precision: str, compiled: bool, memory_format: str, noise: str = DEFAULT_NOISE) -> str:
    """One line for reports and the model card: how the base classifier was run, and how noise was drawn."""
    return (f"{canonical_precision(precision)}{' autocast' if canonical_precision(precision) != 'float32' else ''}, "
            f"{'torch.compile' if compiled else 'eager'}, {memory_format} memory format, {describe_noise(noise)}")


def describe_noise(noise: str) -> str:
    """How the noise was drawn, in a few words."""
    if noise == "sound":
        return ("sound noise (inputs on the 8-bit grid, exact discretized Gaussian noise added in integers; "
                "Voracek and Hein 2023)")
    return "float32 Gaussian noise (x + sigma * randn: not sound in floating point, docs/CERTIFY.md)"


def numeric_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A run's precision, compile flag and noise kind (older runs, which lack them, ran float32 eagerly with
    float32 Gaussian noise)."""
    return {"precision": settings.get("precision", DEFAULT_PRECISION), "compile": bool(settings.get("compile", False)),
            "noise": settings.get("noise", DEFAULT_NOISE)}


def refuse_mixed_numerics(named_settings: list[tuple[str, dict[str, Any]]], action: str) -> None:
    """One-line UserError when the runs (name, settings) were not all run at the same precision and compile flag:
    their certificates are about different base classifiers. ``action`` is e.g. "merge" or "overlay"."""
    if not named_settings:
        return
    first_name, first = named_settings[0][0], numeric_settings(named_settings[0][1])
    for name, settings in named_settings[1:]:
        other = numeric_settings(settings)
        if other != first:
            diff = "; ".join(f"{key} {first[key]!r} in {first_name}, {other[key]!r} in {name}"
                             for key in NUMERIC_SETTINGS if first[key] != other[key])
            raise UserError(f"refusing to {action} runs of different base classifiers as run ({diff}): "
                            f"certificates of one are not certificates of the other")
