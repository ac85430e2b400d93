"""The work list of a certification run, its units and its shards.

Images are packed into fixed *units* of consecutive positions of the work list (the unit plan depends only on the
work list, the samples per image and the batch size); a shard takes every k-th unit, so each image sees the same
forward-pass companions whether the run is whole or sharded.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from transdenoiser.errors import UserError

UNIT_FORWARD_PASSES = 8  # a unit packs about this many forward passes' worth of images
MAX_UNIT_IMAGES = 1024


# ----------------------------------------------------------------------------------------------- planning

def select_indices(size: int, skip: int = 1, max_index: int | None = None,
                   indices: Sequence[int] | None = None, what: str = "the split") -> list[int]:
    """The dataset indices to work on: ``indices`` as given, else every ``skip``-th index below ``max_index``.

    ``max_index`` (``--max-index``) follows Cohen et al.'s ``--max`` (stop before that index); past the end is an error.
    """
    if skip < 1:
        raise UserError(f"--skip must be >= 1, got {skip}")
    if indices is not None:
        bad = [i for i in indices if not 0 <= i < size]
        if bad:
            raise UserError(f"index {bad[0]} is past the end of {what} ({size} images: 0..{size - 1})")
        if len(set(indices)) != len(indices):
            raise UserError("the same image index is listed twice")
        if not indices:
            raise UserError("no image indices given")
        return list(indices)
    if max_index is not None:
        if max_index < 1:
            raise UserError(f"--max-index must be >= 1, got {max_index}")
        if max_index > size:
            raise UserError(f"--max-index {max_index} is past the end of {what} ({size} images); use "
                            f"--max-index {size} or leave it out")
    return list(range(0, size if max_index is None else max_index, skip))


def pack_size(samples_per_image: int, batch: int) -> int:
    """Images per unit: about UNIT_FORWARD_PASSES full forward passes of ``batch`` samples (at least one image)."""
    return max(1, min(MAX_UNIT_IMAGES, round(UNIT_FORWARD_PASSES * batch / samples_per_image)))


def plan_units(indices: Sequence[int], pack: int) -> list[list[int]]:
    """Split the work list into consecutive units of ``pack`` images (the last may be shorter)."""
    return [list(indices[i:i + pack]) for i in range(0, len(indices), pack)]


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based): it takes units index, index + count, index + 2 count, ..."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        parts = text.split("/")
        try:
            index, count = (int(p) for p in parts)
        except ValueError:
            raise UserError(f"--shard {text!r}: expected I/K with 0 <= I < K, e.g. 0/4") from None
        if not (count >= 1 and 0 <= index < count):
            raise UserError(f"--shard {text!r}: expected I/K with 0 <= I < K, e.g. 0/4 (shards are numbered from 0)")
        return cls(index, count)

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> Shard | None:
        """The shard of this process under ``torchrun`` (RANK of WORLD_SIZE), or None outside it."""
        env = os.environ if environ is None else environ
        if "WORLD_SIZE" not in env or "RANK" not in env:
            return None
        try:
            count, index = int(env["WORLD_SIZE"]), int(env["RANK"])
        except ValueError:
            raise UserError(f"torchrun environment: RANK={env['RANK']!r} WORLD_SIZE={env['WORLD_SIZE']!r} "
                            f"are not integers") from None
        if not (count >= 1 and 0 <= index < count):
            raise UserError(f"torchrun environment: RANK={index} WORLD_SIZE={count}: expected 0 <= RANK < WORLD_SIZE")
        return cls(index, count) if count > 1 else None

    def take(self, units: list[list[int]]) -> list[list[int]]:
        return units[self.index::self.count]

    @property
    def stem(self) -> str:
        return f"shard-{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
