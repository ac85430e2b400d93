"""Keyed noise: one stream of noise per input, so every answer about an image is one test (docs/SERVING.md).

Without a client seed, the noise seed of each image is an HMAC-SHA256, under a server secret, of

- the model's identity (SHA-256 of every served weights file),
- the image quantised to its 8-bit grid (each pixel ``round(255 x)`` as one byte, C-contiguous, shape stated):
  a PNG/JPEG input is exactly on that grid; a float input shares its key with every float image that rounds to
  the same 8-bit image (a pixel 0 sent as 1e-40 is the same question), and
- the stream settings (``serving.service.stream_settings``: sigma, n0, alpha, the confidence sequence; not the
  request kind, n or radius, so every request about an image reads the same selection and the same stream).

The model still sees the submitted pixels, so the certificate is about them; two float images in one 8-bit cell
get the same noise, hence the same votes unless their difference itself moves a vote. The same image under the
same settings therefore always gets the same noise and the same certificate, within a request (duplicates) and
across requests, while an image differing by one 8-bit level in one pixel gets noise no client can predict without
the secret. The secret comes from the ``noise_key`` setting or,
when that is unset, from the operating system's CSPRNG at start-up (then certificates are repeatable only
until the server restarts). See docs/SERVING.md, "One image, one test".
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

MAX_SEED = 2**63 - 1  # torch generators take seeds in [0, 2^64); JSON clients handle 63 bits safely
KEY_BYTES = 32


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_identity(weight_files: Iterable[Path | None]) -> str:
    """The SHA-256 of each weights file (``None`` for an absent model), in order, as one string."""
    return ",".join("none" if path is None else file_sha256(path) for path in weight_files)


def canonical_image_bytes(image: torch.Tensor) -> bytes:
    """One (C, H, W) image in [0, 1] on its 8-bit grid: ``round(255 x)`` per pixel (halves to even), one byte each."""
    array = np.asarray(image.detach().cpu().numpy(), dtype=np.float64)
    return np.ascontiguousarray(np.rint(np.clip(array, 0.0, 1.0) * 255.0), dtype=np.uint8).tobytes()


class NoiseKey:
    """Derives each image's noise seed from the server secret, the model, the pixels and the sampling settings."""

    def __init__(self, secret: bytes, model: str):
        if len(secret) < 16:
            raise ValueError("the noise secret must hold at least 16 bytes")
        self._secret = secret
        self.model = model

    @classmethod
    def from_setting(cls, noise_key: str | None, model: str) -> NoiseKey:
        """``noise_key`` from the config (a string of >= 32 characters), or a fresh random secret."""
        secret = noise_key.encode() if noise_key is not None else secrets.token_bytes(KEY_BYTES)
        return cls(secret, model)

    def image_seed(self, image: torch.Tensor, settings: dict[str, object]) -> int:
        """The noise seed of ``image`` (C, H, W) under ``settings`` (kind, sigma, n0, n, alpha, ...)."""
        header = json.dumps({"model": self.model, "grid": "uint8/255", "shape": list(image.shape),
                             "settings": settings}, sort_keys=True).encode()
        message = len(header).to_bytes(8, "big") + header + canonical_image_bytes(image)
        digest = hmac.new(self._secret, message, hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") & MAX_SEED


def client_image_seed(client_seed: int, index: int) -> int:
    """The noise seed of image ``index`` in a request carrying a client seed (opt-in, reproducible testing)."""
    state = np.random.SeedSequence([client_seed, index]).generate_state(2, np.uint32)
    return (int(state[0]) << 32 | int(state[1])) & MAX_SEED
