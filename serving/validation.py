"""Request validation the server does itself (BentoML 1.4.39 does not; see docs/SERVING.md).

A predict request is JSON ``{"images": [...], "n": N, "seed": S}`` (``n`` and ``seed`` optional), each
image a nested array of exactly the classifier's (C, H, W) with values in [0, 1], or multipart/form-data
with one or more PNG/JPEG files in the ``images`` field and optional ``n``/``seed`` fields. An adaptive
request adds ``"radius": R`` (decide: certified at L2 radius R?) or ``"adaptive": true`` (estimate the
largest certifiable radius); ``n`` is then the budget of estimation samples, by default the server's
``max_n`` (form fields: ``radius`` a plain decimal such as ``0.5``, ``adaptive`` ``true`` or ``false``). Nothing is
reshaped, resized, converted between colour modes or clipped: anything else is refused with a
:class:`RequestError` whose message names the problem and the image.

Bounded parsing: a JSON body must be UTF-8, nested at most ``MAX_JSON_DEPTH`` deep (checked on the bytes before
parsing) and free of duplicate keys; a multipart body may not repeat a field other than ``images``. One question,
one answer: ``n`` is rounded to the nearest multiple of ``chunk_samples`` (at least one chunk, at most ``max_n``)
and ``radius`` up to the ``RADIUS_GRID`` (values within 1e-9 of a grid point snap to it), so requests differing
by a trivial amount ask the same question and get the same certificate; ``radius`` beyond what any request could
certify (``largest_servable_radius``) or that float64 cannot decide (``max_decidable_radius``: Phi(R / sigma) < 1) is
refused. The answer states the values used. Parsing is synchronous: ``parse_predict_request`` runs it in a worker
thread, off the event loop.

Two decoders, one result: a JSON body is decoded by orjson (9x faster than the standard library on a 16-image
body, ``benchmarks/bench_parse.py``, so a burst of large bodies holds the interpreter lock for less time) whenever a
few checks on the bytes show its result is exactly what the standard library's strict decoding gives
(``fast_payload``): every string a key, no key twice, no object inside another, no ``true``/``false``/``null`` but
as a field's value, no integer of 19 digits or more. Anything else (a duplicate key, a boolean among the pixels,
NaN, a huge integer, invalid JSON) is decoded by the standard library as before, with the same refusals and
messages. The tests compare both paths on handwritten and generated bodies.
"""
from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import orjson
import torch
from PIL import Image, UnidentifiedImageError

from certify.decisions import max_certifiable_radius
from certify.ladder import RADIUS_GRID, radius_on_grid  # the request grid is the ladder's rungs
from certify.sequential import max_decidable_radius
from serving.compute.engine import MAX_SEED
from serving.config import ServingConfig

IMAGE_FORMATS = ("PNG", "JPEG")
MODE_CHANNELS = {"L": 1, "RGB": 3}  # the PIL modes accepted, and their channel counts
JSON_KEYS = ("images", "n", "seed", "radius", "adaptive")
MAX_INTEGER_DIGITS = 40  # longest integer literal read from a body: n and seed need at most 19 digits
PLAIN_DECIMAL = re.compile(rf"[0-9]{{1,{MAX_INTEGER_DIGITS}}}", re.ASCII)  # form fields: digits only
MAX_JSON_DEPTH = 8  # a request needs 5 levels: {"images": [image [C [H [W]]]]}
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_WHITESPACE = b" \t\n\r"
_DIGITS_AS_ONES = bytes.maketrans(b"0123456789", b"1111111111")  # a run of 19 digits becomes b"1" * 19
LONG_INTEGER_DIGITS = 19  # orjson reads integers beyond 64 bits as floats, json as ints: such bodies go to json
PLAIN_DECIMAL_FRACTION = re.compile(rf"[0-9]{{1,{MAX_INTEGER_DIGITS}}}(\.[0-9]{{1,{MAX_INTEGER_DIGITS}}})?",
                                    re.ASCII)  # form radius: digits, optionally a point and more digits


class RequestError(Exception):
    """A request the server refuses: HTTP ``status`` (4xx) and a one-line ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class PredictRequest:
    images: torch.Tensor  # (K, C, H, W) float32 in [0, 1]
    n: int  # estimation samples (fixed n), or the budget n_max of an adaptive request
    seed: int | None  # a client seed (if the server allows it); None: noise keyed to each image (serving.compute.noise)
    radius: float | None = None  # decide: is the prediction certified at this L2 radius ([0,1]-pixel units)?
    adaptive: bool = False  # estimate: the largest certifiable radius under the budget n

    @property
    def kind(self) -> str:
        """The request kind: ``certify`` (fixed n), ``decide`` (radius) or ``estimate`` (adaptive)."""
        return "decide" if self.radius is not None else "estimate" if self.adaptive else "certify"


def _bad(message: str) -> RequestError:
    return RequestError(400, message)


def n_on_grid(n: int, config: ServingConfig) -> int:
    """``n`` rounded to the nearest multiple of ``chunk_samples`` (halves up), at least one chunk, at most
    ``max_n``: the grid of estimation-sample counts this server certifies with."""
    grid = config.chunk_samples
    return min(config.max_n, max(grid, (n + grid // 2) // grid * grid))


def check_n(value: Any, config: ServingConfig, sequential: bool = False) -> int:
    """Fixed n (default ``config.n``), or the budget n_max of an adaptive request (default ``config.max_n``);
    a requested value is put on the grid (``n_on_grid``)."""
    if value is None:
        return config.max_n if sequential else config.n
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'n' must be an integer number of noise samples, got {value!r}")
    if not 1 <= value <= config.max_n:
        raise _bad(f"'n' must lie in 1..{config.max_n} (this server's max_n), got {value}")
    return n_on_grid(value, config)


def largest_servable_radius(config: ServingConfig) -> float:
    """The largest radius any request could certify on this server: sigma * Phi^-1(alpha^(1/max_n)), the radius of
    max_n votes out of max_n under the one-sided Clopper-Pearson bound at level alpha (the adaptive kinds'
    confidence sequences are stricter still)."""
    return max_certifiable_radius(config.sigma, config.max_n, config.alpha)


def check_seed(value: Any, config: ServingConfig) -> int | None:
    if value is None:
        return None
    if not config.allow_client_seed:
        raise _bad("this server does not accept client seeds (allow_client_seed = false): the server keys "
                   "the noise to each image; leave 'seed' out")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise _bad(f"'seed' must be an integer in 0..{MAX_SEED}, got {value!r}")
    return value


def check_radius(value: Any, config: ServingConfig | None = None) -> float | None:
    """A finite radius > 0, on the grid (``radius_on_grid``), at most ``largest_servable_radius(config)`` and
    ``max_decidable_radius(sigma)``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'radius' must be a number > 0 (an L2 radius in [0,1]-pixel units), got {value!r}")
    try:
        radius = float(value)
    except OverflowError:
        radius = float("inf")
    if not (math.isfinite(radius) and radius > 0):
        raise _bad(f"'radius' must be a finite number > 0 (an L2 radius in [0,1]-pixel units), got {value!r}")
    on_grid = radius_on_grid(radius)
    if config is not None:
        largest = largest_servable_radius(config)
        if on_grid > largest:
            rounded = "" if on_grid == radius else f" (rounded up to the {RADIUS_GRID:g} grid: {on_grid:g})"
            asked = f"{value!r}{rounded}"
            raise _bad(f"'radius' {asked} exceeds {largest:.4f}, the largest radius any request can certify on "
                       f"this server (sigma * Phi^-1(alpha^(1/max_n)), all max_n votes for one class)")
        decidable = max_decidable_radius(config.sigma, RADIUS_GRID)
        if on_grid > decidable:  # reached only where max_n is so large that the bound above lies beyond it
            rounded = "" if on_grid == radius else f" (rounded up to the {RADIUS_GRID:g} grid: {on_grid:g})"
            raise _bad(f"'radius' {value!r}{rounded} cannot be decided at this server's sigma {config.sigma:g}: "
                       f"float64's Phi(R / sigma) is 1 beyond R / sigma = 8.29; the largest radius that can be "
                       f"decided is {decidable}")
    return on_grid


def check_adaptive(value: Any, radius: float | None) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(f"'adaptive' must be true or false, got {value!r}")
    if value and radius is not None:
        raise _bad("send either 'radius' (decide at that radius) or 'adaptive': true (estimate the largest "
                   "radius), not both")
    return value


def check_count(count: int, config: ServingConfig) -> None:
    if count == 0:
        raise _bad("no images: send at least one")
    if count > config.max_images:
        raise _bad(f"{count} images in one request; this server takes at most {config.max_images} (max_images)")


def image_array(image: list, index: int, shape: tuple[int, int, int], numbers_only: bool) -> np.ndarray:
    """``json_image_array``; where the cells are known to be ints and floats, NumPy's direct conversion (the same
    values, a third of the time), falling back to ``json_image_array`` for its message when that fails."""
    if numbers_only:
        try:
            return np.array(image, dtype=np.float64)
        except (ValueError, TypeError, OverflowError, RecursionError):  # ragged: the strict path says how
            pass
    return json_image_array(image, index, shape)


def json_image_array(image: list, index: int, shape: tuple[int, int, int]) -> np.ndarray:
    """A decoded JSON image (nested lists) as a float64 array, refusing anything but JSON numbers: ``true`` and
    ``false`` are never pixels (NumPy would read them as 1.0 and 0.0 among floats), nor are strings or nulls."""
    ragged = _bad(f"image {index}: expected a rectangular array of numbers of shape {list(shape)} (C, H, W), "
                  f"got ragged or non-numeric data")
    try:
        cells = np.asarray(image, dtype=object)
        kinds = {type(value) for value in cells.flat}
    except (ValueError, TypeError, RuntimeError, RecursionError):  # RuntimeError: nested beyond NumPy's 64 dims
        raise ragged from None
    if bool in kinds:
        raise _bad(f"image {index}: contains true/false; pixels must be numbers in [0, 1]")
    if not kinds <= {int, float}:  # strings, nulls, objects, or lists left inside a ragged array
        raise ragged
    try:
        return cells.astype(np.float64)
    except OverflowError:  # an integer beyond float64's range
        raise _bad(f"image {index}: contains a number too large for a pixel value") from None


def check_pixels(array: np.ndarray, index: int, shape: tuple[int, int, int]) -> torch.Tensor:
    """A (C, H, W) array of finite values in [0, 1] as float32, or a RequestError; never reshaped."""
    if array.dtype == object or array.dtype.kind not in "iuf":
        raise _bad(f"image {index}: expected a rectangular array of numbers of shape {list(shape)} "
                   f"(C, H, W), got ragged or non-numeric data")
    if tuple(array.shape) != tuple(shape):
        raise _bad(f"image {index}: shape {list(array.shape)}, the model takes exactly {list(shape)} (C, H, W); "
                   f"images are never reshaped")
    if not np.isfinite(array).all():
        raise _bad(f"image {index}: contains NaN or infinite values")
    low, high = float(array.min()), float(array.max())
    if low < 0.0 or high > 1.0:
        raise _bad(f"image {index}: pixel values must lie in [0, 1], got [{low:g}, {high:g}] (never clipped)")
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


def _json_int(literal: str) -> int:
    """JSON integer literals, refusing over-long ones before Python's int-string limit (4300 digits) raises."""
    if len(literal.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _bad(f"a JSON integer of {len(literal.lstrip('-'))} digits; integers here (n, seed, pixel values) "
                   f"have at most {MAX_INTEGER_DIGITS} digits")
    return int(literal)


_NOT_BRACKETS = bytes(code for code in range(256) if code not in b"[]{}")


def json_depth(body: bytes, emptied: bytes | None = None) -> int:
    """How deep ``body``'s arrays and objects nest (brackets inside strings ignored); vectorised, no parsing.
    Only the brackets are kept (``bytes.translate``) before counting, so a body padded to the payload limit costs
    a copy of itself, not tens of MB of counters (a burst of such bodies parses in several threads at once).
    ``emptied``: ``body`` with its strings emptied, if already computed."""
    if emptied is None:
        emptied = _JSON_STRING.sub(b'""', body)
    brackets = emptied.translate(None, _NOT_BRACKETS)
    codes = np.frombuffer(brackets, dtype=np.uint8)
    if codes.size == 0:
        return 0
    steps = (np.isin(codes, (0x5B, 0x7B)).astype(np.int32) - np.isin(codes, (0x5D, 0x7D)).astype(np.int32))
    return int(np.cumsum(steps).max(initial=0))


def fast_payload(body: bytes, emptied: bytes) -> dict[str, Any] | None:
    """``body`` decoded by orjson, or None where its result might differ from the standard library's strict
    decoding (``json.loads`` refusing duplicate keys) or hold anything but numbers among the images' cells.
    ``emptied``: ``body`` with its strings emptied. Kept only when, on a body orjson decodes to an object:

    - every string is a key and there are as many keys as fields: no duplicate key (also none spelled with
      escapes), no object inside another, no string value anywhere (pixels, ``n``, ...);
    - ``true``/``false``/``null`` occur only as top-level values: none inside the images, where NumPy would read
      them as numbers;
    - no run of 19 digits: integers that orjson and json read alike (orjson reads those beyond 64 bits as floats).

    Numbers: both decoders give the same values, bit for bit (tested on 20,000 random literals of several forms,
    ``tests/test_serving_json_paths.py``). NaN, Infinity and invalid JSON
    fail in orjson and so take the standard path, which refuses them as before."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    # valid JSON (orjson read it) with its strings emptied and its whitespace removed: whitespace only ever stood
    # between tokens that a bracket, comma or colon also separates, so no two tokens merge. Every scan below is one
    # C pass over the bytes (a body padded with 2 MB of spaces costs a few ms, not a regex engine's tens of ms).
    compact = emptied.translate(None, _JSON_WHITESPACE)
    if b"1" * LONG_INTEGER_DIGITS in compact.translate(_DIGITS_AS_ONES):
        return None
    strings = compact.count(b'""')  # in valid JSON two strings are never adjacent
    keys = compact.count(b'"":')
    literals = sum(compact.count(word) for word in (b"true", b"false", b"null"))  # strings emptied: no other letters
    top_literals = sum(value is None or isinstance(value, bool) for value in payload.values())  # but exponents
    if strings != keys or keys != len(payload) or literals != top_literals:
        return None
    return payload


def _unique_keys(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        raise _bad(f"duplicate JSON key(s) {', '.join(map(repr, repeated))}: send each field once")
    return dict(pairs)


def parse_json(body: bytes, config: ServingConfig, shape: tuple[int, int, int]) -> PredictRequest:
    """A JSON request body as a PredictRequest, or a RequestError (module docstring: two decoders, one result)."""
    try:
        text = body.decode("utf-8")  # json.loads would also guess UTF-16 and UTF-32
    except UnicodeDecodeError:
        raise _bad("body is not UTF-8: send JSON encoded as UTF-8") from None
    emptied = _JSON_STRING.sub(b'""', body)
    depth = json_depth(body, emptied)
    if depth > MAX_JSON_DEPTH:
        raise _bad(f"JSON nested {depth} levels deep; a request needs 5 ({{\"images\": [image [C [H [W]]]]}}), at most "
                   f"{MAX_JSON_DEPTH} are accepted")
    payload = fast_payload(body, emptied)
    if payload is not None:
        return parse_payload(payload, config, shape, numbers_only=True)
    return parse_json_strict(text, config, shape)


def parse_json_strict(text: str, config: ServingConfig, shape: tuple[int, int, int]) -> PredictRequest:
    """A JSON request (already checked for UTF-8 and depth) decoded by the standard library, strictly."""
    try:  # NaN/Infinity parse, then are refused by check_pixels
        payload = json.loads(text, parse_int=_json_int, object_pairs_hook=_unique_keys)
    except RequestError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise _bad(f"body is not valid JSON ({exc})") from None
    if not isinstance(payload, dict):
        raise _bad('expected a JSON object {"images": [...], "n": N, "seed": S}')
    return parse_payload(payload, config, shape)


def parse_payload(payload: dict[str, Any], config: ServingConfig, shape: tuple[int, int, int],
                  numbers_only: bool = False) -> PredictRequest:
    """Validate a decoded JSON request (also used for in-process calls of the predict API). ``numbers_only``: the
    images' cells are known to be ints and floats (``fast_payload``), so NumPy converts them directly."""
    unknown = sorted(set(payload) - set(JSON_KEYS))
    if unknown:
        raise _bad(f"unknown field(s) {', '.join(map(repr, unknown))}; known: {', '.join(JSON_KEYS)}")
    images = payload.get("images")
    if not isinstance(images, list):
        raise _bad("'images' must be a list of images, each a nested array of shape (C, H, W)")
    if images and not all(isinstance(image, list) for image in images):
        raise _bad(f"'images' must be a list of images, each a nested array of shape {list(shape)} (C, H, W); "
                   f"got a list holding non-arrays (to send one image, wrap it: [image])")
    check_count(len(images), config)
    radius = check_radius(payload.get("radius"), config)
    adaptive = check_adaptive(payload.get("adaptive"), radius)
    n = check_n(payload.get("n"), config, sequential=radius is not None or adaptive)
    seed = check_seed(payload.get("seed"), config)
    tensors = []
    for index, image in enumerate(images):
        tensors.append(check_pixels(image_array(image, index, shape, numbers_only), index, shape))
    return PredictRequest(torch.stack(tensors), n, seed, radius, adaptive)


def decode_image(data: bytes, index: int, name: str, shape: tuple[int, int, int]) -> torch.Tensor:
    """PNG/JPEG bytes -> (C, H, W) float32 in [0, 1]; size and colour mode must already match the model."""
    label = f"image {index} ({name})" if name else f"image {index}"
    channels, height, width = shape
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format not in IMAGE_FORMATS:
                raise _bad(f"{label}: format {image.format}; only PNG and JPEG are accepted")
            if image.size != (width, height):  # checked from the header, before any pixel is decoded
                raise _bad(f"{label}: {image.size[0]}x{image.size[1]} pixels, the model takes exactly "
                           f"{width}x{height}; images are never resized")
            if MODE_CHANNELS.get(image.mode) != channels:
                wanted = next(mode for mode, c in MODE_CHANNELS.items() if c == channels) \
                    if channels in MODE_CHANNELS.values() else f"{channels}-channel"
                raise _bad(f"{label}: colour mode {image.mode}, the model takes {channels}-channel ({wanted}) "
                           f"images; convert it yourself, the server never does")
            pixels = np.array(image, dtype=np.uint8)  # a writable copy
    except RequestError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise _bad(f"{label}: could not be decoded as PNG or JPEG ({type(exc).__name__})") from None
    pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)  # HWC -> CHW, the format's layout
    return torch.from_numpy(np.ascontiguousarray(pixels)).float().div_(255.0)


def form_int(value: Any, key: str) -> int | None:
    """A form field holding a plain decimal integer: ASCII digits only (no sign, no spaces, no '1_000', no
    non-ASCII digits, which Python's ``int`` would all accept), at most ``MAX_INTEGER_DIGITS`` of them."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(f"'{key}' must be a plain form field, not a file")
    if not PLAIN_DECIMAL.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise _bad(f"'{key}' must be a plain decimal integer (ASCII digits only), got {shown!r}")
    return int(value)


def form_radius(value: Any, config: ServingConfig | None = None) -> float | None:
    """A form field holding a plain decimal number (``0.5``, ``2``): ASCII digits with at most one point."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad("'radius' must be a plain form field, not a file")
    if not PLAIN_DECIMAL_FRACTION.fullmatch(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise _bad(f"'radius' must be a plain decimal number such as 0.5 (ASCII digits and one point), got {shown!r}")
    return check_radius(float(value), config)


def form_bool(value: Any, key: str) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(f"'{key}' must be a plain form field, not a file")
    if value not in ("true", "false"):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise _bad(f"'{key}' must be the form field true or false, got {shown!r}")
    return value == "true"


async def parse_multipart(request, config: ServingConfig, shape: tuple[int, int, int]) -> PredictRequest:
    """Parse a Starlette multipart request (body size already capped by the payload middleware)."""
    from starlette.datastructures import UploadFile
    from starlette.exceptions import HTTPException
    from starlette.formparsers import MultiPartException

    try:
        form = await request.form(max_files=config.max_images, max_fields=8,
                                  max_part_size=config.max_payload_bytes)
    except (MultiPartException, HTTPException) as exc:  # Starlette wraps the first in the second inside an app
        message = str(getattr(exc, "message", None) or getattr(exc, "detail", None) or exc)
        if "Too many files" in message:
            raise _bad(f"too many files; this server takes at most {config.max_images} images (max_images)") \
                from None
        raise _bad(f"malformed multipart body ({message})") from None
    try:
        unknown = sorted(set(form.keys()) - set(JSON_KEYS))
        if unknown:
            raise _bad(f"unknown form field(s) {', '.join(map(repr, unknown))}; known: {', '.join(JSON_KEYS)}")
        repeated = sorted({key for key in form.keys() if key != "images" and len(form.getlist(key)) > 1})
        if repeated:
            raise _bad(f"form field(s) {', '.join(map(repr, repeated))} sent more than once: send each once")
        files = form.getlist("images")
        check_count(len(files), config)
        radius = form_radius(form.get("radius"), config)
        adaptive = check_adaptive(form_bool(form.get("adaptive"), "adaptive"), radius)
        n = check_n(form_int(form.get("n"), "n"), config, sequential=radius is not None or adaptive)
        seed = check_seed(form_int(form.get("seed"), "seed"), config)
        uploads = []
        for index, upload in enumerate(files):
            if not isinstance(upload, UploadFile):
                raise _bad(f"image {index}: 'images' must be file uploads (PNG or JPEG), got a text field")
            uploads.append((await upload.read(), index, upload.filename or ""))
        images = await anyio.to_thread.run_sync(
            lambda: torch.stack([decode_image(data, index, name, shape) for data, index, name in uploads]))
        return PredictRequest(images, n, seed, radius, adaptive)
    finally:
        await form.close()


async def parse_predict_request(request, config: ServingConfig, shape: tuple[int, int, int]) -> PredictRequest:
    """Dispatch on Content-Type; any problem is a RequestError (400, or 415 for an unsupported type)."""
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";")[0].strip().lower()
    if media_type == "application/json":
        charset = re.search(r";\s*charset\s*=\s*\"?([^\s;\"]+)", content_type, re.IGNORECASE)
        if charset and charset.group(1).lower() not in ("utf-8", "utf8"):
            raise RequestError(415, f"charset {charset.group(1)!r}: send JSON encoded as UTF-8")
        body = await request.body()
        return await anyio.to_thread.run_sync(parse_json, body, config, shape)  # off the event loop
    if media_type == "multipart/form-data":
        return await parse_multipart(request, config, shape)
    raise RequestError(415, f"unsupported Content-Type {media_type or '(none)'!r}: send application/json "
                            f"or multipart/form-data with PNG/JPEG files in the 'images' field")
