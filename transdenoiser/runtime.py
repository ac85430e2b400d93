"""Device choice and seeding, shared by every subcommand."""
from __future__ import annotations

import platform
import random
from typing import TYPE_CHECKING

from transdenoiser.errors import UserError

if TYPE_CHECKING:  # torch is imported lazily so that `transdenoiser --help` starts fast
    import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str = "auto") -> torch.device:
    """Map ``auto|cpu|cuda|cuda:N`` to a torch device; ``cuda`` without a GPU is an error, not a fallback."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA GPU is available on this machine (use --device cpu or auto)")
        return torch.device(name)
    raise UserError(f"--device {name!r}: expected one of auto, cpu, cuda, cuda:N")


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a CPU generator for code that takes one explicitly."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_description(device: torch.device) -> str:
    """A short human-readable description of where a figure was measured."""
    import os

    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}), torch {torch.__version__}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU {_cpu_model()}, {cores} cores, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
