"""Device choice, seeding and process set-up, shared by every subcommand."""
from __future__ import annotations

import os
import platform
import random
import sys
from typing import TYPE_CHECKING

from transdenoiser.errors import UserError

if TYPE_CHECKING:  # torch is imported lazily so that `transdenoiser --help` starts fast
    import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")
MALLOC_HEAP_BLOCK_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit systems
MALLOC_TRIM_BYTES = 1 << 30
MALLOC_ENV_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD")


def discard_stdout() -> None:
    """After a BrokenPipeError (output piped into ``head`` and the like, the reader gone): point standard output at
    /dev/null, so that the interpreter's flush at exit finds no closed pipe and the command ends quietly."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


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


def available_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS has one), at least 1."""
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def hardware_description(device: torch.device) -> str:
    """A short human-readable description of where a figure was measured."""
    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}), torch {torch.__version__}"
    cores = available_cores()
    threads = torch.get_num_threads()
    return (f"CPU {_cpu_model()}, {cores} cores, {threads} torch thread{'s' if threads != 1 else ''}, "
            f"torch {torch.__version__}")


def freeze_start_up_objects() -> int:
    """Collect once, then move every object alive into the garbage collector's permanent generation (``gc.freeze``),
    so that its full collections never scan them again; returns how many were frozen.

    A server holds hundreds of thousands of objects from start-up (torch, BentoML, pydantic: about 342,000 in the
    prediction worker) that live as long as it does. CPython's full collection scans them all whenever enough new
    objects have survived, pausing the event loop: measured in the worker's process, 0.17 s of CPU per collection
    (1.3 s wall on a loaded 2-core machine; ``python -m benchmarks.bench_gc_pause``, docs/results/serving.md).
    Frozen, they are skipped (no measurable pause); objects made later are
    collected as before. Call it once, after start-up (freezing garbage would keep it for ever, hence the collect).
    """
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed CPU memory for reuse instead of handing it back to the OS.

    By default glibc serves each large block (the activations and per-example gradients of a step)
    with a fresh mmap and unmaps it when torch frees it, so every step page-faults its memory in
    again: measured on 2 CPU cores, a third of per-example-gradient time went to the kernel and
    throughput rose 1.3-1.5x with this set (docs/results/training.md). Blocks up to 32 MiB then
    come from the heap and up to 1 GiB of free heap is kept. Only the process's memory reuse
    changes, never a computed value. Nothing is done (returns False) off glibc, when the user set
    ``MALLOC_*``/``GLIBC_TUNABLES``/``LD_PRELOAD`` (their choice wins), or with
    ``TRANSDENOISER_MALLOC=system``.
    """
    import ctypes
    import os

    if os.environ.get("TRANSDENOISER_MALLOC", "") == "system" or any(v in os.environ for v in MALLOC_ENV_VARIABLES):
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, MALLOC_HEAP_BLOCK_BYTES)
                and libc.mallopt(m_trim_threshold, MALLOC_TRIM_BYTES))
