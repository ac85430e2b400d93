"""Request-body limit: an ASGI middleware that refuses bodies over ``max_payload_bytes`` with 413.

BentoML 1.4.39 reads any body whole (no size limit). This middleware refuses a declared
``Content-Length`` over the limit before reading anything, and otherwise reads the body itself,
counting bytes, so a chunked upload is cut off at the limit instead of being buffered whole;
the app then receives the (bounded) body as if from the client.

It also bounds the request bodies being read and parsed at once (:class:`BodySlots`): a request with a body takes a
*body slot* before a byte of it is read, and one more than the limit is refused at once with 503 and
``Retry-After: 1``, before reading or parsing anything. The slot is given back by the parser once the body is parsed
(``release_body_slot``, called by the service), or when the request ends, whichever comes first; so slow
computations never hold one. Large and small bodies have separate allowances: a body over ``SMALL_BODY_BYTES``, or
one without a ``Content-Length`` (chunked), takes one of ``max_parsing_requests`` slots; a body declared at most
``SMALL_BODY_BYTES`` takes one of ``max_queued_requests`` small slots (the requests in flight at once; at most 4 MiB
of small bodies at the default 64), so a burst of large bodies never refuses a small request, and many clients
sending one image each are not refused for the large bodies' limit. Requests without a body (GET, HEAD: the probes)
take no slot. In the server the front door (``serving.front_door``) takes the slot, or refuses, ahead of BentoML's
middlewares; this middleware then finds the slot held, and gives it back when the request ends here, as for a slot
it took itself.

A request body must also keep arriving (:class:`BodyPace`): whole within ``body_timeout_ms`` of the request's
headers and, after its first ``BODY_GRACE_S``, at ``min_body_bytes_per_s`` or more on average. The front door reads
the first ``SMALL_BODY_BYTES`` of a body (a small body whole) at that pace *before* it takes a slot, so a client that
stalls after its headers or inside a small body holds no slot at all, and one that stalls later in a large body
holds its slot until the pace drops it; a stalled body is answered 408 with ``Connection: close`` (uvicorn then
closes the connection) and its slot, if it took one, is given back at once.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from serving.auth import send_json

SLOT_KEY = "transdenoiser.release_body_slot"
BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
RETRY_AFTER_FULL_S = 1  # the Retry-After of a refusal for full body slots, in s
# a body declared (Content-Length) at most this large takes a small body slot, larger or undeclared (chunked) ones a
# large one: a one-image request of 28x28 or 32x32x3 pixels as JSON, or of a few PNGs, is small
SMALL_BODY_BYTES = 64 * 1024


BODY_GRACE_S = 2.0  # the first seconds of a body, not held to the minimum rate (a slow link's round trip or two)


def declared_small(scope) -> bool:
    """Whether the request declares a body of at most ``SMALL_BODY_BYTES`` (a chunked one declares none)."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            return value.isdigit() and int(value) <= SMALL_BODY_BYTES
    return False


def release_body_slot(scope) -> None:
    """Give back the request's body slot (idempotent; nothing to do for a request that holds none)."""
    release = scope.get(SLOT_KEY)
    if release is not None:
        release()


@dataclass
class _Allowance:
    """One kind of body slot: at most ``limit`` taken at once (None: not read from the settings yet)."""

    limit: int | None
    taken: int = 0


class BodySlots:
    """The request bodies being read or parsed at once: at most ``limit`` large ones (``max_parsing_requests``) and
    ``small_limit`` small ones (``max_queued_requests``; see the module docstring). ``None`` reads the limits from
    the served model directory's settings when first needed."""

    def __init__(self, limit: int | None = None, small_limit: int | None = None):
        self._large = _Allowance(limit)
        self._small = _Allowance(small_limit)

    def configure(self, limit: int, small_limit: int) -> None:
        """Set both limits (the service, from its model directory's settings); slots already taken stay taken."""
        if limit < 1 or small_limit < 1:
            raise ValueError(f"body-slot limits must be >= 1, got {limit} and {small_limit}")
        self._large.limit, self._small.limit = limit, small_limit

    def _allowance(self, small: bool) -> _Allowance:
        """The allowance of a small or large body, its limit read from the settings if not set yet."""
        allowance = self._small if small else self._large
        if allowance.limit is None:
            from serving.config import served_config

            limits = served_config().body_slot_limits()
            for kind, configured in zip((self._large, self._small), limits, strict=True):
                if kind.limit is None:
                    kind.limit = configured
        return allowance

    @property
    def limit(self) -> int:
        """Large bodies read or parsed at once, at most."""
        return self._allowance(False).limit

    @property
    def small_limit(self) -> int:
        """Small bodies read or parsed at once, at most."""
        return self._allowance(True).limit

    @property
    def taken_large(self) -> int:
        return self._large.taken

    @property
    def taken_small(self) -> int:
        return self._small.taken

    @property
    def taken(self) -> int:
        """Slots taken, of both kinds."""
        return self._large.taken + self._small.taken

    def full(self, small: bool = False) -> bool:
        """Whether a body cannot take a slot now; ``small``: declared at most ``SMALL_BODY_BYTES``."""
        allowance = self._allowance(small)
        return allowance.taken >= allowance.limit

    def take(self, small: bool = False) -> Callable[[], None]:
        """Take a slot of the body's kind (the caller has checked ``full(small)``); returns its release, which is
        idempotent."""
        allowance = self._allowance(small)
        allowance.taken += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                allowance.taken -= 1

        return release

    def refusal(self, small: bool = False) -> dict:
        """The 503 body of a request refused because every slot of its kind is taken."""
        if small:
            return {"error": f"the server is reading {self.taken_small} request bodies of at most {SMALL_BODY_BYTES} "
                             f"bytes already, the most it reads at once (max_queued_requests); retry in "
                             f"{RETRY_AFTER_FULL_S} s"}
        return {"error": f"the server is reading {self.taken_large} request bodies over {SMALL_BODY_BYTES} bytes (or "
                         f"without Content-Length) already, the most it reads at once (max_parsing_requests); retry "
                         f"in {RETRY_AFTER_FULL_S} s"}


async def refuse_for_full_slots(send, slots: BodySlots, on_full: Callable[[], None] | None,
                                headers: list[tuple[bytes, bytes]] = (), small: bool = False) -> None:
    """Answer 503 with ``Retry-After`` (and ``headers``) to a body sent while every slot of its kind is taken
    (``small``: as ``BodySlots.full``); ``on_full`` (a metric) is called first."""
    if on_full is not None:
        on_full()
    await send_json(send, 503, slots.refusal(small),
                    [(b"retry-after", str(RETRY_AFTER_FULL_S).encode()), *headers])


class BodyStalled(Exception):
    """A request body that stopped arriving at its :class:`BodyPace`; the message says how far it got."""


@dataclass(frozen=True)
class BodyPace:
    """How a request body must keep arriving: whole within ``timeout_s`` of the request's headers, and from
    ``grace_s`` on with ``received >= min_bytes_per_s * (t - grace_s)`` bytes at ``t`` seconds after them (an
    average rate, so a pause is fine where earlier bytes came faster)."""

    timeout_s: float
    min_bytes_per_s: float
    grace_s: float = BODY_GRACE_S

    @classmethod
    def from_config(cls, config=None) -> BodyPace:
        """The pace of a served model directory's settings (``body_timeout_ms``, ``min_body_bytes_per_s``);
        ``None``: the settings' defaults."""
        from serving.config import ServingConfig

        source = ServingConfig if config is None else config
        return cls(source.body_timeout_ms / 1000, float(source.min_body_bytes_per_s))

    def due_s(self, received: int) -> float:
        """Seconds after the headers by which a body with ``received`` bytes so far must have sent more (or ended)."""
        return min(self.timeout_s, self.grace_s + received / self.min_bytes_per_s)

    def stalled(self, received: int, elapsed_s: float) -> str:
        """The 408 message of a body that had sent ``received`` bytes ``elapsed_s`` seconds after its headers."""
        return (f"the request body stopped arriving: {received} bytes in {elapsed_s:.1f} s; a body must arrive "
                f"whole within {self.timeout_s:g} s of the headers (body_timeout_ms) and, after its first "
                f"{self.grace_s:g} s, at {self.min_bytes_per_s:g} bytes/s or more on average (min_body_bytes_per_s)")


class PacedReceive:
    """``receive`` held to ``pace`` until the body has ended: a wait past the pace's due time raises
    :class:`BodyStalled` (nothing of ``receive``'s state is lost: the wait is cancelled, not a message). After the
    body (or a disconnect), ``receive`` unchanged."""

    def __init__(self, receive: Callable[[], Awaitable[dict]], pace: BodyPace, started_s: float | None = None):
        self._receive = receive
        self.pace = pace
        self.started_s = time.monotonic() if started_s is None else started_s
        self.received = 0  # body bytes so far
        self.ended = False  # the body's last message (or a disconnect) has been received

    async def __call__(self) -> dict:
        if self.ended:
            return await self._receive()
        left_s = self.started_s + self.pace.due_s(self.received) - time.monotonic()
        try:
            if left_s <= 0:
                raise TimeoutError
            async with asyncio.timeout(left_s):
                message = await self._receive()
        except TimeoutError:
            raise BodyStalled(self.pace.stalled(self.received, time.monotonic() - self.started_s)) from None
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.ended = not message.get("more_body", False)
        else:
            self.ended = True
        return message


async def read_head(receive: PacedReceive, size: int) -> tuple[bytes, bool] | None:
    """Read a body until ``size`` bytes or its end, whichever comes first: ``(bytes read, whether the body
    ended)``, or None if the client disconnected. Raises :class:`BodyStalled` as ``receive`` does."""
    chunks: list[bytes] = []
    while receive.received < size:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if receive.ended:
            break
    return b"".join(chunks), receive.ended


def replaying(head: bytes, ended: bool, receive: Callable[[], Awaitable[dict]]) -> Callable[[], Awaitable[dict]]:
    """A receive that gives ``head`` (read by :func:`read_head`) as the body's first message, then ``receive``'s."""
    replayed = False

    async def replay() -> dict:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": head, "more_body": not ended}
        return await receive()

    return replay


async def answer_stalled(send, exc: BodyStalled, headers: list[tuple[bytes, bytes]] = ()) -> None:
    """408 to a body that stopped arriving, with ``Connection: close``: uvicorn closes the connection after it."""
    await send_json(send, 408, {"error": str(exc)}, [(b"connection", b"close"), *headers])


class PayloadLimitMiddleware:
    def __init__(self, app, max_bytes: int | None = None, max_parsing: int | None = None,
                 max_parsing_small: int | None = None, slots: BodySlots | None = None,
                 on_full: Callable[[], None] | None = None):
        self.app = app
        if max_bytes is None:
            from serving.config import served_config

            max_bytes = served_config().max_payload_bytes
        self.max_bytes = max_bytes
        self.slots = slots if slots is not None else BodySlots(max_parsing, max_parsing_small)
        self.on_full = on_full  # called for each request refused because every slot is taken (a metric)

    @property
    def parsing(self) -> int:
        """Body slots taken (requests whose body is being read or parsed)."""
        return self.slots.taken

    @property
    def max_parsing(self) -> int:
        """Large bodies read or parsed at once, at most (``max_parsing_requests``)."""
        return self.slots.limit

    def _too_large(self, size: str) -> dict:
        return {"error": f"request body of {size} exceeds this server's limit of {self.max_bytes} bytes "
                         f"(max_payload_bytes)"}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") in BODILESS_METHODS:
            return await self.app(scope, receive, send)
        if SLOT_KEY in scope:  # the front door (serving.front_door) took this request's slot
            release = scope[SLOT_KEY]
        elif self.slots.full(small := declared_small(scope)):
            return await refuse_for_full_slots(send, self.slots, self.on_full, small=small)
        else:
            release = scope[SLOT_KEY] = self.slots.take(small)
        # given back here when the request ends, e.g. an upload abandoned mid-body: the layers outside (BentoML's
        # timeout middleware) may wait much longer for an answer that never comes
        try:
            return await self._bounded(scope, receive, send)
        finally:
            release()

    async def _bounded(self, scope, receive, send) -> None:
        for name, value in scope.get("headers", []):
            if name.lower() == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await send_json(send, 400, {"error": "malformed Content-Length header"})
                if declared > self.max_bytes:
                    return await send_json(send, 413, self._too_large(f"{declared} bytes"))
        chunks, size = [], 0
        while True:
            try:
                message = await receive()  # held to the body's pace where the front door paces it
            except BodyStalled as exc:
                return await answer_stalled(send, exc)
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await send_json(send, 413, self._too_large(f"more than {self.max_bytes} bytes"))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the client to disconnect

        return await self.app(scope, replay, send)
