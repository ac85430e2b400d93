"""Request-body limit: an ASGI middleware that refuses bodies over ``max_payload_bytes`` with 413.

BentoML 1.4.39 reads any body whole (no size limit). This middleware refuses a declared
``Content-Length`` over the limit before reading anything, and otherwise reads the body itself,
counting bytes, so a chunked upload is cut off at the limit instead of being buffered whole;
the app then receives the (bounded) body as if from the client.
"""
from __future__ import annotations

from serving.auth import send_json


class PayloadLimitMiddleware:
    def __init__(self, app, max_bytes: int | None = None):
        self.app = app
        if max_bytes is None:
            from serving.config import load_config, model_dir_from_env

            max_bytes = load_config(model_dir_from_env()).max_payload_bytes
        self.max_bytes = max_bytes

    def _too_large(self, size: str) -> dict:
        return {"error": f"request body of {size} exceeds this server's limit of {self.max_bytes} bytes "
                         f"(max_payload_bytes)"}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
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
