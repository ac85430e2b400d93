"""Optional API-key authentication: an ASGI middleware comparing keys in constant time.

When ``TRANSDENOISER_API_KEY`` is set (at least :data:`MIN_KEY_LENGTH` characters), every HTTP request
must carry the key as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``, except the probes in
:data:`OPEN_PATHS` (health, readiness, liveness, metrics), which orchestrators call without secrets.
Keys are compared with ``hmac.compare_digest`` so the response time does not reveal how much of a
guessed key was right. Unset: no authentication (bind to 127.0.0.1, the default of ``transdenoiser serve``).
"""
from __future__ import annotations

import hmac
import json
import os

from transdenoiser.errors import UserError

API_KEY_ENV = "TRANSDENOISER_API_KEY"
MIN_KEY_LENGTH = 16
OPEN_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})


def api_key_from_env() -> bytes | None:
    """The configured key, None when authentication is off; a too-short key is a start-up error."""
    key = os.environ.get(API_KEY_ENV)
    if key is None:
        return None
    if len(key) < MIN_KEY_LENGTH:
        raise UserError(f"{API_KEY_ENV} is set but shorter than {MIN_KEY_LENGTH} characters; use a long random "
                        f"key (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))') or unset it")
    return key.encode()


def presented_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        name = name.lower()
        if name == b"x-api-key":
            return value.strip()
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].strip()
    return None


def key_accepted(given: bytes | None, api_key: bytes) -> bool:
    """Whether ``given`` (the key a request presents, :func:`presented_key`) is ``api_key``, in constant time."""
    return given is not None and hmac.compare_digest(given, api_key)


async def send_json(send, status: int, payload: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class ApiKeyMiddleware:
    """Refuse HTTP requests without the right key (401), except :data:`OPEN_PATHS`; off when no key is set."""

    def __init__(self, app, api_key: bytes | None = None, from_env: bool = True):
        self.app = app
        self.api_key = api_key if api_key is not None or not from_env else api_key_from_env()

    async def __call__(self, scope, receive, send) -> None:
        if self.api_key is None or scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = presented_key(scope.get("headers", []))
        if not key_accepted(given, self.api_key):
            what = "missing" if given is None else "invalid"
            return await send_json(send, 401, {"error": f"{what} API key: send 'Authorization: Bearer KEY' or "
                                                        f"'X-API-Key: KEY'"},
                                   [(b"www-authenticate", b"Bearer")])
        return await self.app(scope, receive, send)
