"""Every error answer is the documented JSON ``{"error": "one line"}``, and no answer names a software version.

BentoML 1.4 and Starlette answer some errors themselves in plain text (404 ``Not Found``, 405 ``Method Not
Allowed``) or as a JSON array (BentoML's refusal of its pickle content type, logged with a full traceback);
uvicorn answers a request it cannot parse (a malformed ``Content-Length``) in plain text before any application
sees it. ``JsonErrorMiddleware`` rewrites every 4xx/5xx body that is not already ``{"error": ...}``, refuses the
pickle content type itself (415, nothing logged), and, unless ``show_versions`` is set, names the server
``transdenoiser`` in the ``server`` header and drops the BentoML version badges from ``/docs.json``.
``serving.library_patches.json_protocol_errors`` makes uvicorn's own 400 answer JSON too (a checked patch of
uvicorn's h11 protocol, applied once in the worker).
"""
from __future__ import annotations

import json
import re
from http import HTTPStatus

from serving.auth import send_json

PICKLE = b"application/vnd.bentoml+pickle"
API_HINT = "the API: POST /predict, POST /metadata; GET /healthz, /livez, /readyz, /metrics"
_VERSION_LINE = re.compile(r"^.*(?:BentoML-\d|bentoml:\d|\d+\.\d+\.\d+).*$", re.MULTILINE)
_TAGGED_TITLE = re.compile(r"^# ([^:\s]+):\S*$", re.MULTILINE)  # "# transdenoiser:dev" -> "# transdenoiser"


def _header(headers, name: bytes) -> bytes:
    return next((value for key, value in headers if key.lower() == name), b"")


def error_message(status: int, body: bytes, method: str, path: str) -> str:
    """A one-line message for an error answer whose body is not our JSON."""
    if status == 404:
        return f"no such path {path!r} ({API_HINT})"
    if status == 405:
        return f"method {method} is not allowed on {path} ({API_HINT})"
    text = body.decode("utf-8", errors="replace").strip()
    try:
        decoded = json.loads(text)
    except ValueError:
        decoded = None
    if isinstance(decoded, list) and decoded and isinstance(decoded[0], dict):  # BentoML's [{"error": ...}]
        decoded = decoded[0]
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), str):
        text = decoded["error"]
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
    line = " ".join(text.split())[:300]
    return line if line and line.lower() != phrase.lower() else phrase.lower()


def is_json_error(body: bytes) -> bool:
    try:
        decoded = json.loads(body)
    except ValueError:
        return False
    return isinstance(decoded, dict) and isinstance(decoded.get("error"), str)


def scrub_docs(body: bytes) -> bytes:
    """``/docs.json`` without the lines of its description that name versions (BentoML's badges)."""
    try:
        document = json.loads(body)
    except ValueError:
        return body
    info = document.get("info") if isinstance(document, dict) else None
    if isinstance(info, dict) and isinstance(info.get("description"), str):
        info["description"] = _TAGGED_TITLE.sub(r"# \1", _VERSION_LINE.sub("", info["description"])).strip()
    return json.dumps(document).encode()


class JsonErrorMiddleware:
    def __init__(self, app, show_versions: bool | None = None):
        self.app = app
        if show_versions is None:
            from serving.config import served_config

            show_versions = served_config().show_versions
        self.show_versions = show_versions

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope.get("method", ""), scope.get("path", "")
        media_type = _header(scope.get("headers", []), b"content-type").split(b";")[0].strip().lower()
        if media_type == PICKLE:
            return await send_json(send, 415, {"error": "unsupported Content-Type 'application/vnd.bentoml+pickle': "
                                                        "send application/json or multipart/form-data"},
                                   self._server_header())
        rewrite_docs = not self.show_versions and path in ("/docs.json", "/schema.json")
        held: dict = {}

        async def wrapped(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if self.show_versions or k.lower() != b"server"]
                message = {**message, "headers": headers + self._server_header()}
                if message["status"] >= 400 or (rewrite_docs and message["status"] == 200):
                    held.update(start=message, body=b"")  # small bodies: rewritten once complete
                    return
                return await send(message)
            if message["type"] == "http.response.body" and "start" in held:
                held["body"] += message.get("body", b"")
                if message.get("more_body", False):
                    return
                start, body = held.pop("start"), held.pop("body")
                status = start["status"]
                if status >= 400 and not is_json_error(body):
                    body = json.dumps({"error": error_message(status, body, method, path)}).encode()
                elif status < 400:
                    body = scrub_docs(body)
                headers = [(k, v) for k, v in start["headers"] if k.lower() not in (b"content-length", b"content-type")]
                headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({**start, "headers": headers})
                return await send({"type": "http.response.body", "body": body})
            return await send(message)

        return await self.app(scope, receive, wrapped)

    def _server_header(self) -> list[tuple[bytes, bytes]]:
        return [] if self.show_versions else [(b"server", b"transdenoiser")]
