"""Serving settings: a model directory holds the checkpoints and one config file (TOML or JSON).

Layout of a model directory (``serving.bundle.write_model_dir`` writes one)::

    DIR/serving.toml     settings below (or DIR/serving.json, the same keys)
    DIR/classifier/      classifier checkpoint (a training.checkpoint directory)
    DIR/denoiser/        optional denoiser checkpoint

Every key is checked at start-up; an unknown key or a bad value is a ``UserError`` naming the file.
Units: ``sigma`` is the Gaussian noise standard deviation in [0,1]-pixel units; ``n0`` and ``n`` count
noisy samples; ``max_payload_bytes`` counts request-body bytes.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from transdenoiser.errors import UserError
from transdenoiser.runtime import available_cores
from transdenoiser.toml import tomllib

MODEL_DIR_ENV = "TRANSDENOISER_MODEL_DIR"
DEVICE_ENV = "TRANSDENOISER_DEVICE"
CONFIG_NAMES = ("serving.toml", "serving.json")
CPU_FORWARD_BATCH = 64  # measured fastest for the 28x28 models on CPU (docs/RESULTS.md, section 4)
CPU_FORWARD_NICE = 10  # the event loop first (docs/results/serving.md, "A burst of large bodies")
# "auto" slots for large bodies: parsing a body is CPU work in a thread; more at once than the cores can run only
# delays the event loop (and the small requests it reads) behind them: one per core and one more being read, at least 3
# (3 on 2 cores: docs/results/serving.md, overload)
EXTRA_PARSING_SLOTS, MIN_PARSING_SLOTS = 1, 3
ROUND_SAMPLES, CPU_ROUND_SAMPLES = 200, 100  # a small request next to a burst (docs/results/serving.md, overload)
CUDA_SWITCH_INTERVAL_US = 500  # the GPU's launching thread gets the GIL back sooner (docs/results/gpu.md, serving)


@dataclass(frozen=True)
class ServingConfig:
    sigma: float  # noise standard deviation, [0,1]-pixel units
    n0: int = 100  # selection samples per image (server-side, not per request)
    n: int = 1000  # default estimation samples per image
    max_n: int = 10_000  # largest n a request may ask for
    alpha: float = 0.001  # each certificate holds with probability >= 1 - alpha
    batch_size: int = 1000  # most noisy samples in one shared pass (batching on)
    chunk_samples: int = 100  # noisy samples per batching unit; a pass holds batch_size // chunk_samples units
    # noisy samples per forward pass of the models: "auto" is 64 on CPU (cache-sized passes, run side by side
    # in worker threads) and on a GPU the largest pass that fits in half the free memory, at most batch_size
    forward_batch: int | str = "auto"
    # niceness added to the forward-pass worker threads (0-19): "auto" is 10 on CPU, where they share the cores with
    # the event loop that reads requests and answers probes (which then goes first), and 0 elsewhere
    forward_nice: int | str = "auto"
    max_images: int = 16  # images per request
    max_payload_bytes: int = 2 * 1024 * 1024  # request body limit
    # adaptive batching across requests (true), one request at a time (false), or "auto": adaptive on a GPU only,
    # because on CPU it measured no faster than one at a time (0.98x-1.04x, docs/RESULTS.md, section 6)
    batching: bool | str = "auto"
    # the host hands out a pass's counts while the next pass computes (true), or passes one after another (false,
    # the default: on an H200 adaptive requests were answered 15-20% faster without it, docs/results/gpu.md);
    # "auto": with batching
    overlap: bool | str = False
    # noisy samples one request computes per scheduling round (its fair share of the compute): "auto" is 100 on
    # CPU (a small request arriving waits for at most one such round: about 25 ms on 2 cores) and 200 elsewhere
    round_samples: int | str = "auto"
    # the Python interpreter's thread switch interval in this server process (``sys.setswitchinterval``), in
    # microseconds: how long a thread that wants the GIL waits for another that holds it. "auto": 500 on a GPU, where
    # the thread launching each forward pass's kernels needs the GIL between them while the event loop reads
    # requests, and Python's own 5,000 elsewhere
    switch_interval_us: int | str = "auto"
    max_latency_ms: int = 120_000  # deadline: a request not answered this long after it arrived stops, 504
    max_request_samples: int = 200_000  # compute budget per request: images x (n0 + n) noisy samples
    max_queued_requests: int = 64  # requests in flight at once; one more is refused with 503 and Retry-After
    # request bodies over 64 KiB (or without Content-Length) read and parsed at once; one more is refused with 503 at
    # once. "auto": one per CPU core this process may run on, plus one, at least 3. Smaller bodies have an allowance
    # of their own, max_queued_requests (serving.limits)
    max_parsing_requests: int | str = "auto"
    # a request body must keep arriving (serving.limits.BodyPace): whole within body_timeout_ms of its headers, and
    # after its first 2 s at min_body_bytes_per_s or more on average (8 KiB/s: 64 kbit/s, below any mobile uplink;
    # a 2 MiB body within 60 s needs 35 KB/s); a body that stops is answered 408 and its connection closed
    body_timeout_ms: int = 60_000
    min_body_bytes_per_s: int = 8192
    # secret of the keyed noise (>= 32 characters); unset: random at start-up. Never shown (repr=False).
    noise_key: str | None = field(default=None, repr=False)
    allow_client_seed: bool = False  # accept a client "seed" (reproducible noise); see docs/SERVING.md
    show_versions: bool = False  # name BentoML's version in /docs.json and uvicorn in the server header
    # how the base classifier is run, part of what is certified (certify.numerics): "fp32", "bf16" or "fp16"
    # autocast, and torch.compile or not
    precision: str = "fp32"
    compile: bool = False
    # sound smoothing in floating point (certify.sound_noise): images must be on the 8-bit grid (others get 400),
    # noise is an exact discretized Gaussian added in integers; false: float32 x + sigma * randn
    sound_noise: bool = False
    # bundled with --allow-worse-than-classifier: the denoiser measured worse than no denoiser in training and was
    # bundled anyway (transdenoiser.checks.check_not_worse_than_classifier); shown on the model card
    allow_worse_than_classifier: bool = False
    classifier: str = "classifier"  # checkpoint directory, relative to the model directory
    denoiser: str | None = None  # optional denoiser checkpoint directory, relative to the model directory

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def forward_batch_on(self, device_type: str) -> int:
        """Noisy samples per forward pass on a device of this type."""
        if self.forward_batch != "auto":
            return int(self.forward_batch)
        return min(CPU_FORWARD_BATCH, self.batch_size) if device_type == "cpu" else self.batch_size

    def forward_nice_on(self, device_type: str) -> int:
        """Niceness added to the forward-pass worker threads on a device of this type."""
        if self.forward_nice != "auto":
            return int(self.forward_nice)
        return CPU_FORWARD_NICE if device_type == "cpu" else 0

    def round_samples_on(self, device_type: str) -> int:
        """Noisy samples per scheduling round on a device of this type."""
        if self.round_samples != "auto":
            return int(self.round_samples)
        return CPU_ROUND_SAMPLES if device_type == "cpu" else ROUND_SAMPLES

    def switch_interval_us_on(self, device_type: str) -> int | None:
        """The thread switch interval (microseconds) to set on a device of this type, or None: Python's own."""
        if self.switch_interval_us != "auto":
            return int(self.switch_interval_us)
        return CUDA_SWITCH_INTERVAL_US if device_type == "cuda" else None

    def body_slot_limits(self) -> tuple[int, int]:
        """The body slots (``serving.limits.BodySlots``): large bodies read and parsed at once
        (``parsing_slots``), and small ones: as many as requests may be in flight (``max_queued_requests``)."""
        return self.parsing_slots(), self.max_queued_requests

    def parsing_slots(self) -> int:
        """Large request bodies read and parsed at once (``max_parsing_requests``, "auto" resolved on this machine)."""
        if self.max_parsing_requests != "auto":
            return int(self.max_parsing_requests)
        return max(MIN_PARSING_SLOTS, available_cores() + EXTRA_PARSING_SLOTS)

    def batching_on(self, device_type: str) -> bool:
        """Whether requests share forward passes on a device of this type ("cpu", "cuda")."""
        return self.batching if isinstance(self.batching, bool) else device_type == "cuda"

    def overlap_on(self, device_type: str) -> bool:
        """Whether the host hands out a pass's counts while the next pass computes, on a device of this type."""
        return self.overlap if isinstance(self.overlap, bool) else self.batching_on(device_type)


_INT_KEYS = ("n0", "n", "max_n", "batch_size", "chunk_samples", "max_images", "max_payload_bytes", "max_latency_ms",
             "max_request_samples", "max_queued_requests", "body_timeout_ms", "min_body_bytes_per_s")
# an integer >= 1, or "auto" per device
_AUTO_INT_KEYS = ("forward_batch", "max_parsing_requests", "round_samples", "switch_interval_us")
MIN_NOISE_KEY_CHARS = 32
_BOOL_KEYS = ("allow_client_seed", "show_versions", "compile", "sound_noise", "allow_worse_than_classifier")
PRECISIONS = ("fp32", "bf16", "fp16")  # certify.numerics.PRECISION_CHOICES


def validate_config(raw: dict[str, Any], source: str) -> ServingConfig:
    """Check every key of ``raw`` (read from ``source``) and build the config; errors name ``source``."""
    known = {f.name for f in fields(ServingConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserError(f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if "sigma" not in raw:
        raise UserError(f"{source}: 'sigma' (noise standard deviation in [0,1]-pixel units) is required")

    def bad(key: str, what: str) -> UserError:
        return UserError(f"{source}: {key} must be {what}, got {raw[key]!r}")

    sigma = raw["sigma"]
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma <= 0:
        raise bad("sigma", "a finite number > 0")
    for key in _INT_KEYS:
        if key in raw and (isinstance(raw[key], bool) or not isinstance(raw[key], int) or raw[key] < 1):
            raise bad(key, "an integer >= 1")
    for key in _BOOL_KEYS:
        if key in raw and not isinstance(raw[key], bool):
            raise bad(key, "true or false")
    for key in ("batching", "overlap"):
        if key in raw and not (isinstance(raw[key], bool) or raw[key] == "auto"):
            raise bad(key, 'true, false or "auto"')
    for key in _AUTO_INT_KEYS:
        if key in raw and raw[key] != "auto" and (isinstance(raw[key], bool) or not isinstance(raw[key], int)
                                                  or raw[key] < 1):
            raise bad(key, 'an integer >= 1 or "auto"')
    if "forward_nice" in raw and raw["forward_nice"] != "auto" and (
            isinstance(raw["forward_nice"], bool) or not isinstance(raw["forward_nice"], int)
            or not 0 <= raw["forward_nice"] <= 19):
        raise bad("forward_nice", 'an integer from 0 to 19 or "auto"')
    if "precision" in raw and raw["precision"] not in PRECISIONS:
        raise bad("precision", f"one of {', '.join(repr(p) for p in PRECISIONS)}")
    if "alpha" in raw:
        alpha = raw["alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise bad("alpha", "a number strictly between 0 and 1")
    for key in ("classifier", "denoiser"):
        if key in raw and raw[key] is not None and (not isinstance(raw[key], str) or not raw[key]):
            raise bad(key, "a directory name (string)")
    if raw.get("noise_key") is not None and (not isinstance(raw["noise_key"], str)
                                             or len(raw["noise_key"]) < MIN_NOISE_KEY_CHARS):
        raise UserError(f"{source}: noise_key must be a secret string of at least {MIN_NOISE_KEY_CHARS} characters "
                        f"(e.g. python -c 'import secrets; print(secrets.token_hex(32))'), or left out")
    config = ServingConfig(**{**raw, "sigma": float(sigma), "alpha": float(raw.get("alpha", ServingConfig.alpha))})
    if config.n > config.max_n:
        raise UserError(f"{source}: default n = {config.n} exceeds max_n = {config.max_n}")
    if config.chunk_samples > config.batch_size:
        raise UserError(f"{source}: chunk_samples = {config.chunk_samples} exceeds batch_size = {config.batch_size}")
    return config


def config_path(model_dir: Path) -> Path:
    found = [model_dir / name for name in CONFIG_NAMES if (model_dir / name).is_file()]
    if not found:
        raise UserError(f"model directory {model_dir}: no {' or '.join(CONFIG_NAMES)} found")
    if len(found) > 1:
        raise UserError(f"model directory {model_dir}: both {' and '.join(CONFIG_NAMES)} exist; keep one")
    return found[0]


def load_config(model_dir: str | Path) -> ServingConfig:
    """Read and validate the config file of ``model_dir``."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UserError(f"model directory {model_dir}: no such directory")
    path = config_path(model_dir)
    try:
        raw = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid {path.suffix[1:].upper()} ({exc})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a table of settings at the top level")
    return validate_config(raw, str(path))


def model_dir_from_env() -> Path:
    value = os.environ.get(MODEL_DIR_ENV)
    if not value:
        raise UserError(f"set {MODEL_DIR_ENV} to a model directory (or run 'transdenoiser serve --model-dir DIR')")
    return Path(value)


def served_config() -> ServingConfig:
    """The settings of the model directory this process serves (``MODEL_DIR_ENV``)."""
    return load_config(model_dir_from_env())


def to_toml(config: ServingConfig) -> str:
    """The config as TOML (flat scalars only; ``None`` values are left out, as TOML has no null)."""
    lines = ["# TransDenoiser serving settings (see docs/SERVING.md). sigma in [0,1]-pixel units."]
    for key, value in config.as_dict().items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = json.dumps(value)  # a JSON string literal is a valid TOML basic string
        else:
            text = repr(value)
        lines.append(f"{key} = {text}")
    return "\n".join(lines) + "\n"
