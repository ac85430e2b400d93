"""Private training split across processes (torchrun): one Poisson batch per step, shared out among the ranks.

Every rank holds the same model, optimiser and *shared* noise generator (same seed: in secret mode rank 0
draws it from the OS CSPRNG and broadcasts it, it is never written). So every rank draws the same Poisson
batch, the same input noise and the same DP noise, and takes only its contiguous share of the batch's
examples for the per-example gradients. The clipped sums of all ranks are added by ONE all-reduce per step
(every parameter's sum flattened into one bucket tensor, plus a few scalars), after which every rank adds
the identical Gaussian noise draw: the released update is the single-process mechanism's, drawn once.

``RankGroup`` is the only thing the training loop knows about distribution: a single process is the
``RankGroup()`` default (world size 1, no communication), so the one-process code path is unchanged.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass, field

import torch

from transdenoiser.errors import UserError


@dataclass
class CommunicationStats:
    """What this rank sent through collectives (for the benchmark and the one-all-reduce-per-step test)."""

    all_reduce_calls: int = 0
    all_reduce_bytes: int = 0  # payload of each call (the bucket), not the wire traffic of the algorithm
    all_reduce_seconds: float = 0.0
    broadcast_calls: int = 0


@dataclass
class RankGroup:
    """This process's place among ``world_size`` training processes (rank 0 writes checkpoints).

    ``device``: where collective tensors live (the training device: gloo on CPU, nccl on ``cuda:LOCAL_RANK``).
    """

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    stats: CommunicationStats = field(default_factory=CommunicationStats)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_writer(self) -> bool:
        """Rank 0 writes checkpoints and prints."""
        return self.rank == 0

    def share(self, size: int) -> slice:
        """This rank's contiguous share of ``size`` examples (near-equal parts; the first ranks get the extra)."""
        base, extra = divmod(size, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (1 if self.rank < extra else 0))

    def local(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's share of a batch (dimension 0)."""
        return batch[self.share(len(batch))] if self.distributed else batch

    def place(self, local: torch.Tensor, size: int) -> torch.Tensor:
        """A length-``size`` vector holding ``local`` at this rank's share and zeros elsewhere (summing these
        over ranks gathers the whole batch's values exactly: each entry has one non-zero term)."""
        if not self.distributed:
            return local
        out = torch.zeros(size, *local.shape[1:], dtype=local.dtype, device=local.device)
        out[self.share(size)] = local
        return out

    def sum_over_ranks(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Sum each named tensor over all ranks with ONE all-reduce: all are flattened into one bucket of the
        first tensor's dtype (counts and clip factors are exact in float32 up to 2^24). One process: unchanged."""
        if not self.distributed:
            return tensors
        import torch.distributed as dist

        dtype = next(iter(tensors.values())).dtype
        shapes = {k: v.shape for k, v in tensors.items()}
        bucket = torch.cat([v.detach().reshape(-1).to(self.device, dtype) for v in tensors.values()])
        started = time.perf_counter()
        dist.all_reduce(bucket, op=dist.ReduceOp.SUM)
        self.stats.all_reduce_seconds += time.perf_counter() - started
        self.stats.all_reduce_calls += 1
        self.stats.all_reduce_bytes += bucket.numel() * bucket.element_size()
        out, offset = {}, 0
        for key, value in tensors.items():
            count = value.numel()
            out[key] = bucket[offset:offset + count].reshape(shapes[key]).to(value.device, value.dtype)
            offset += count
        return out

    def from_rank_zero(self, values: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``values`` on every rank (a broadcast; one process: unchanged)."""
        if not self.distributed:
            return values
        import torch.distributed as dist

        buffer = values.detach().to(self.device).clone()
        dist.broadcast(buffer, src=0)
        self.stats.broadcast_calls += 1
        return buffer.to(values.device)

    def shared_seed(self) -> int:
        """A secret seed from the OS CSPRNG, drawn on rank 0 and sent to every rank; it is never written."""
        seed = secrets.randbits(63) if self.rank == 0 else 0
        return int(self.from_rank_zero(torch.tensor([seed], dtype=torch.int64))[0])

    def check_same(self, text: str, what: str) -> None:
        """Refuse to train if the ranks disagree on ``text`` (e.g. their settings): every rank raises the same
        one-line error (an all-gather, so no rank is left waiting)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")
        mine = torch.tensor([digest], dtype=torch.int64, device=self.device)
        every = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine)
        differing = [rank for rank, value in enumerate(every) if int(value[0]) != int(every[0][0])]
        if differing:
            raise UserError(f"the {self.world_size} training processes disagree on {what} (rank(s) "
                            f"{', '.join(map(str, differing))} differ from rank 0); launch every rank with the "
                            "same command and data")

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()


def backend_for(device: torch.device) -> str:
    """nccl for CUDA devices, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def rank_group_from_environment(device: torch.device, environ: dict[str, str] | None = None) -> RankGroup:
    """The rank group of this process: under ``torchrun`` (WORLD_SIZE > 1) the default process group is
    initialised (gloo on CPU, nccl on CUDA, ``device`` being this rank's, see ``certify.runner.rank_device``);
    otherwise one process."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return RankGroup(device=device)
    try:
        world_size, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
    except ValueError:
        raise UserError(f"torchrun environment: RANK={env['RANK']!r} WORLD_SIZE={env['WORLD_SIZE']!r} "
                        "are not integers") from None
    if world_size <= 1:
        return RankGroup(device=device)
    import torch.distributed as dist

    # torch.distributed.nn.functional binds group.WORLD as a default argument when it is first imported (torch
    # imports it lazily). Imported after init_process_group it would keep the process group, and its gloo worker
    # threads, alive past destroy_process_group, and a worker thread still releasing a finished collective at
    # interpreter exit aborts the process (SIGABRT). Imported first, those defaults hold None.
    import torch.distributed.nn  # noqa: F401

    backend = backend_for(device)
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return RankGroup(rank=rank, world_size=world_size, device=device, backend=backend)


def close(group: RankGroup) -> None:
    """Tear the process group down (at the end of a distributed run): its communication threads are joined here,
    so none is left running while the interpreter exits."""
    if group.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


__all__ = ["RankGroup", "CommunicationStats", "rank_group_from_environment", "backend_for", "close"]
