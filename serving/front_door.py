"""The front door: the outermost ASGI layer of the server, ahead of every BentoML middleware.

BentoML runs each request through its own middlewares before any of the service's (request metrics, an
OpenTelemetry span where tracing is on, the access log, the request timeout, its context), about 1 ms of the event
loop's time per request on a 2-core Intel Xeon with the span. Two kinds of request need none of it, and are
answered here instead:

- **The health probes** (``GET``/``HEAD`` ``/livez``, ``/healthz``, ``/readyz``): BentoML already leaves them out
  of its request metrics and access log; here they also skip its tracing and routing, so a probe costs the loop a
  fraction of what it did and waits behind less of everyone else's work. ``/livez`` and ``/healthz`` answer 200;
  ``/readyz`` answers 200 once the service has warmed up (:class:`Readiness`), 503 before. The bodies and headers
  are BentoML's (``"\\n"``, ``text/plain``).
- **A request with a body while every body slot of its kind is taken** (``max_parsing_requests`` for large
  bodies, ``max_queued_requests`` for small ones, ``serving.limits``): 503
  with ``Retry-After: 1`` before anything is read, as the body-limit middleware answers it, but without the cost of
  the layers in between; a burst of large bodies is refused at a fraction of the loop's time. For that the front
  door takes the body slot itself, once the body's first bytes have arrived (below), before the layers behind it
  run (BentoML's timeout middleware runs the rest of a request as a task of its own, so the body-limit middleware
  would take it only after every request of a burst has passed the door); the body-limit middleware finds it held,
  and it is given back as before: by the service once the body is parsed, or by the body-limit middleware when the
  request ends there (an upload abandoned mid-body ends there at once), at the latest here. Such refusals are counted in
  ``transdenoiser_refused_requests_total{reason="parsing"}`` (not in BentoML's request counter, which they no
  longer reach). When the server has an API key, only a request presenting the right key takes a slot here or is
  refused here; any other goes on to the authentication middleware and gets its 401, as before, holding no slot.
- **A body that stops arriving** (``serving.limits.BodyPace``: ``body_timeout_ms``, ``min_body_bytes_per_s``): the
  door reads the first ``SMALL_BODY_BYTES`` of each body (a small body whole) at the pace *before* it takes the
  body's slot (a body refused because its kind's slots are full as it arrives is still refused before a byte is
  read), and the rest of the body is held to the same pace behind it. A client that stalls after its headers or
  in those first bytes holds no slot; one that stops for longer than the pace allows gets 408 with
  ``Connection: close`` and its connection is closed, its slot, if it took one, given back at once. So
  connections that send headers and then nothing cannot take the server's slots from the clients that send.

Everything else passes through untouched. The front door wraps the app ``Service.to_asgi`` builds
(``serving.library_patches.serve_behind_front_door``).
"""
from __future__ import annotations

from collections.abc import Callable

from serving.auth import key_accepted, presented_key, send_json
from serving.limits import (
    BODILESS_METHODS,
    SLOT_KEY,
    SMALL_BODY_BYTES,
    BodyPace,
    BodySlots,
    BodyStalled,
    PacedReceive,
    answer_stalled,
    declared_small,
    read_head,
    refuse_for_full_slots,
    replaying,
)

PROBE_PATHS = frozenset({"/livez", "/healthz", "/readyz"})
_PROBE_METHODS = frozenset({"GET", "HEAD"})
_TEXT = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"1")]


class Readiness:
    """Whether the service in this process has warmed up (set by the service, read by ``/readyz``)."""

    def __init__(self) -> None:
        self.ready = False


class FrontDoor:
    """``app`` behind the probes and the full-slots refusal (module docstring). ``api_key``: the server's key, or
    None when authentication is off; ``show_versions``: as the error middleware's (no ``server`` header naming
    the product when True, so that none is sent at all); ``on_full``: called for each refusal (a metric);
    ``pace``: how request bodies must keep arriving (None: the settings' defaults)."""

    def __init__(self, app, slots: BodySlots, readiness: Readiness, api_key: bytes | None,
                 show_versions: bool = False, on_full: Callable[[], None] | None = None,
                 pace: BodyPace | None = None):
        self.app = app
        self.slots = slots
        self.pace = pace if pace is not None else BodyPace.from_config()
        self.readiness = readiness
        self.api_key = api_key
        self.on_full = on_full
        self.server_header = [] if show_versions else [(b"server", b"transdenoiser")]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            method = scope.get("method")
            if method in _PROBE_METHODS and scope.get("path") in PROBE_PATHS:
                return await self._probe(scope["path"], method, send)
            if method not in BODILESS_METHODS and self._authorized(scope):
                return await self._with_body(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _with_body(self, scope, receive, send) -> None:
        """A request with a body: refused at once if its kind's slots are full; else its first bytes read at the
        pace, holding no slot, then its slot taken (or refused, if the slots filled meanwhile) and the request
        passed on with the rest of its body held to the pace."""
        if self.slots.full(small := declared_small(scope)):
            return await refuse_for_full_slots(send, self.slots, self.on_full, self.server_header, small)
        paced = PacedReceive(receive, self.pace)
        try:
            head = await read_head(paced, SMALL_BODY_BYTES)
        except BodyStalled as exc:
            return await answer_stalled(send, exc, self.server_header)
        if head is None:  # the client left mid-body: no one to answer
            return
        if self.slots.full(small):  # filled while this body arrived; the rest of it is never read
            closing = [] if head[1] else [(b"connection", b"close")]
            return await refuse_for_full_slots(send, self.slots, self.on_full, [*closing, *self.server_header],
                                               small)
        release = scope[SLOT_KEY] = self.slots.take(small)  # the body-limit middleware finds it held
        try:
            return await self.app(scope, replaying(*head, paced), send)
        finally:
            release()

    def _authorized(self, scope) -> bool:
        return self.api_key is None or key_accepted(presented_key(scope.get("headers", [])), self.api_key)

    async def _probe(self, path: str, method: str, send) -> None:
        if path == "/readyz" and not self.readiness.ready:
            return await send_json(send, 503, {"error": "not ready: the service is still warming up"},
                                   self.server_header)
        await send({"type": "http.response.start", "status": 200, "headers": [*_TEXT, *self.server_header]})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else b"\n"})
