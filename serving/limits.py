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
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from serving.auth import send_json

SLOT_KEY = "transdenoiser.release_body_slot"
BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
RETRY_AFTER_FULL_S = 1  # the Retry-After of a refusal for full body slots, in s
# a body declared (Content-Length) at most this large takes a small body slot, larger or undeclared (chunked) ones a
# large one: a one-image request of 28x28 or 32x32x3 pixels as JSON, or of a few PNGs, is small
SMALL_BODY_BYTES = 64 * 1024


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
            message = await receive()
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
