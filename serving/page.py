"""The API page at ``/`` and ``/docs``, and the OpenAPI document at ``/docs.json``, in place of BentoML's.

BentoML 1.4 serves Swagger UI at ``/``: its form takes JSON only, its prefilled example is refused (an image of
shape [1, 1, 1]), it loads Google Tag Manager (a tracker, and a call out of an offline deployment), shows the
version "None", and gives no way to enter an API key. :class:`ApiPage` answers instead:

- ``GET``/``HEAD`` ``/`` and ``/docs``: one self-contained HTML page (``serving/static``: the HTML with its style
  and script inlined at start-up) with an image upload that posts to ``/predict`` and shows the certified answer,
  an API-key field when the server has a key, the product's version, and links to the model card and the OpenAPI
  document. Its ``Content-Security-Policy`` allows the page's own inline style and script (by hash) and
  connections, images and forms to this server only: the browser fetches nothing from anywhere else.
- ``GET``/``HEAD`` ``/docs.json``: BentoML's OpenAPI document with the product's title, version and description,
  the ``/predict`` body's multipart form beside its JSON, an example that is answered 200 (one image of the
  served model's shape), and, when the server has an API key, its security schemes (``Authorization: Bearer
  KEY`` or ``X-API-Key: KEY``) on every operation but the probes.

The middleware sits outside the API-key middleware (``serving.service``): the page and the document are open, so a
person can load the page and type the key; ``/predict`` and ``/metadata`` still need it. Both name the
product's version (``transdenoiser.version``) whatever ``show_versions`` says: that setting hides the versions of
the libraries (BentoML, uvicorn), not the product's own. Every other request passes through untouched.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.auth import api_key_from_env
from transdenoiser.version import __version__

PAGE_PATHS = frozenset({"/", "/docs"})
SPEC_PATH = "/docs.json"
STATIC = Path(__file__).parent / "static"
_METHODS = frozenset({"GET", "HEAD"})
OPEN_OPERATIONS = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})  # no key (serving.auth.OPEN_PATHS)
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key", "description": "X-API-Key: KEY"},
}
DESCRIPTION = (
    "Certified predictions by randomized smoothing (Cohen et al. 2019) over a frozen classifier, with a denoiser "
    "trained with differential privacy in front of it. POST /predict answers, for each image, a class and a "
    "certified L2 radius; POST /metadata answers the model card (models, privacy report, certification settings)."
)


@dataclass(frozen=True)
class Page:
    """The rendered page: its HTML and the ``Content-Security-Policy`` that admits its inline style and script."""

    html: bytes
    csp: str


def _sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def render_page(version: str, auth: bool, static: Path = STATIC) -> Page:
    """``static/page.html`` with ``page.css`` and ``page.js`` inlined, the version and whether the key field shows
    filled in; the policy allows exactly that style and script (by their SHA-256) and this origin, nothing else."""
    style = (static / "page.css").read_text(encoding="utf-8")
    script = (static / "page.js").read_text(encoding="utf-8")
    html = (static / "page.html").read_text(encoding="utf-8")
    for marker, value in (("@VERSION@", version), ("@AUTH@", "on" if auth else "off"),
                          ("@AUTH_HIDDEN@", "" if auth else "hidden"), ("@STYLE@", style), ("@SCRIPT@", script)):
        html = html.replace(marker, value)
    csp = "; ".join(["default-src 'none'", f"script-src {_sha256_source(script)}",
                     f"style-src {_sha256_source(style)}", "img-src 'self' blob: data:", "connect-src 'self'",
                     "form-action 'self'", "base-uri 'none'", "frame-ancestors 'none'"])
    return Page(html.encode(), csp)


def _form_schema(json_schema: dict[str, Any]) -> dict[str, Any]:
    """The multipart form of ``/predict``: PNG/JPEG files in ``images`` and the JSON body's other fields."""
    fields = {name: value for name, value in json_schema.get("properties", {}).items() if name != "images"}
    return {"type": "object", "required": ["images"],
            "properties": {"images": {"type": "array", "items": {"type": "string", "format": "binary"},
                                      "description": "PNG or JPEG files of the classifier's input size"},
                           **fields}}


def openapi_document(spec: dict[str, Any], version: str, auth: bool,
                     input_shape: tuple[int, ...] | None) -> dict[str, Any]:
    """BentoML's OpenAPI ``spec`` (not modified) as the product's: its title, ``version`` and description; the
    ``/predict`` body's multipart form; an example of one blank image of ``input_shape`` (none when unknown: no
    example is better than one that is refused); with ``auth``, the security schemes on every operation but the
    probes."""
    document = copy.deepcopy(spec)
    document["info"] = {"title": "TransDenoiser", "version": version, "description": DESCRIPTION}
    body = document.get("paths", {}).get("/predict", {}).get("post", {}).get("requestBody", {})
    content = body.get("content", {})
    if "application/json" in content:
        json_body = content["application/json"]
        for key in ("example", "examples"):
            json_body.pop(key, None)
            json_body.get("schema", {}).pop(key, None)
        if input_shape is not None:
            channels, rows, columns = input_shape
            json_body["example"] = {"images": [[[[0.0] * columns for _ in range(rows)] for _ in range(channels)]]}
        content["multipart/form-data"] = {"schema": _form_schema(json_body.get("schema", {}))}
    if auth:
        document.setdefault("components", {})["securitySchemes"] = copy.deepcopy(SECURITY_SCHEMES)
        for path, item in document.get("paths", {}).items():
            for operation in item.values():
                if isinstance(operation, dict):
                    operation["security"] = ([] if path in OPEN_OPERATIONS
                                             else [{name: []} for name in SECURITY_SCHEMES])
    return document


def _served_input_shape() -> tuple[int, ...] | None:
    """The served model's input shape (C, H, W), or None before the service is built."""
    try:
        import bentoml

        return tuple(bentoml.get_current_service().input_shape)
    except Exception:  # noqa: BLE001 - not instantiated yet: the document then has no example
        return None


class ApiPage:
    """Answers ``GET``/``HEAD`` on :data:`PAGE_PATHS` with the page and on :data:`SPEC_PATH` with the document
    (module docstring); passes every other request to ``app``. ``spec``: returns BentoML's OpenAPI document
    (called once, on the first request for it); ``api_key``: the server's key, by default
    ``serving.auth.api_key_from_env()`` as the API-key middleware reads it (only whether there is one is used: the
    page shows the key field, the document declares the schemes)."""

    def __init__(self, app, spec: Callable[[], dict[str, Any]], api_key: bytes | None = None, from_env: bool = True,
                 version: str = __version__, input_shape: Callable[[], tuple[int, ...] | None] = _served_input_shape):
        self.app = app
        self.spec = spec
        self.auth = (api_key if api_key is not None or not from_env else api_key_from_env()) is not None
        self.version = version
        self.input_shape = input_shape
        self.page = render_page(version, self.auth)
        self._document: bytes | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("method") in _METHODS:
            path = scope.get("path")
            if path in PAGE_PATHS:
                return await self._send(send, scope["method"], self.page.html, b"text/html; charset=utf-8",
                                        [(b"content-security-policy", self.page.csp.encode())])
            if path == SPEC_PATH:
                return await self._send(send, scope["method"], self._spec_body(), b"application/json", [])
        return await self.app(scope, receive, send)

    def _spec_body(self) -> bytes:
        if self._document is None:
            shape = self.input_shape()
            body = json.dumps(openapi_document(self.spec(), self.version, self.auth, shape)).encode()
            if shape is None:
                return body  # the service is not built yet: an example later
            self._document = body
        return self._document

    @staticmethod
    async def _send(send, method: str, body: bytes, content_type: bytes, extra: list[tuple[bytes, bytes]]) -> None:
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                   (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                   (b"cache-control", b"no-cache"), *extra]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})
