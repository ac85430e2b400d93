"""Request-body limit: an ASGI middleware that refuses bodies over ``max_payload_bytes`` with 413.

BentoML 1.4.39 reads any body whole (no size limit). This middleware refuses a declared
``Content-Length`` over the limit before reading anything, and otherwise reads the body itself,
counting bytes, so a chunked upload is cut off at the limit instead of being buffered whole;
the app then receives the (bounded) body as if from the client.

It also bounds the request bodies being read and parsed at once (``max_parsing_requests``): a request with a
body takes a *body slot* before a byte of it is read, and one more than the limit is refused at once with 503
and ``Retry-After: 1``, before reading or parsing anything. The slot is given back by the parser once the body
is parsed (``release_body_slot``, called by the service), or when the request ends, whichever comes first; so
slow computations never hold one. Requests without a body (GET, HEAD: the probes) take no slot.
"""
from __future__ import annotations

from serving.auth import send_json

SLOT_KEY = "transdenoiser.release_body_slot"
BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def release_body_slot(scope) -> None:
    """Give back the request's body slot (idempotent; nothing to do for a request that holds none)."""
    release = scope.get(SLOT_KEY)
    if release is not None:
        release()


class PayloadLimitMiddleware:
    def __init__(self, app, max_bytes: int | None = None, max_parsing: int | None = None):
        self.app = app
        if max_bytes is None or max_parsing is None:
            from serving.config import load_config, model_dir_from_env

            config = load_config(model_dir_from_env())
            max_bytes = config.max_payload_bytes if max_bytes is None else max_bytes
            max_parsing = config.max_parsing_requests if max_parsing is None else max_parsing
        self.max_bytes = max_bytes
        self.max_parsing = max_parsing
        self.parsing = 0  # body slots taken (requests whose body is being read or parsed)

    def _too_large(self, size: str) -> dict:
        return {"error": f"request body of {size} exceeds this server's limit of {self.max_bytes} bytes "
                         f"(max_payload_bytes)"}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") in BODILESS_METHODS:
            return await self.app(scope, receive, send)
        if self.parsing >= self.max_parsing:
            return await send_json(send, 503, {"error": f"the server is reading {self.parsing} request bodies "
                                                        f"already, the most it reads at once "
                                                        f"(max_parsing_requests); retry in 1 s"},
                                   [(b"retry-after", b"1")])
        self.parsing += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.parsing -= 1

        scope[SLOT_KEY] = release
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
