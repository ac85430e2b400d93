"""The API page (``/``, ``/docs``) and the OpenAPI document (``/docs.json``): serving.page.

In process: the page is self-contained and its Content-Security-Policy admits exactly its own style and script; the
page and the document are open when the server has an API key while the API is not; the document carries the
product's version, the multipart form, the security schemes and an example the service answers 200; the new path
gets its own request-metric label. In a real headless Chromium against a real server with an API key
(``@pytest.mark.server``): a person loads the page, uploads docs/examples/digit7.png, is told to type the key, types
it, and reads the certified answer, which is the API's own; the page asks no host but the server.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from serving.auth import ApiKeyMiddleware
from serving.bundle import write_model_dir
from serving.page import ApiPage, openapi_document, render_page
from serving.process import ServerProcess
from tests.browser import INSTALL_HINT, Browser, find_chromium
from tests.conftest import in_process_service
from transdenoiser.version import __version__

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
API_KEY = "page-test-key-" + "0123456789abcdef" * 2
START_TIMEOUT_S = 240  # as tests/test_serving_server.py: a loaded 2-core machine is slow to import torch and bentoml
ANSWER_TIMEOUT_S = 60


class _Attributes(HTMLParser):
    """Every (tag, attribute, value) of a document, and the text of its <style> and <script> elements."""

    def __init__(self) -> None:
        super().__init__()
        self.attributes: list[tuple[str, str, str]] = []
        self.inline: dict[str, list[str]] = {"style": [], "script": []}
        self._open: str | None = None

    def handle_starttag(self, tag, attrs):
        self.attributes += [(tag, name, value or "") for name, value in attrs]
        self._open = tag if tag in self.inline else None

    def handle_endtag(self, tag):
        self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self.inline[self._open].append(data)


def _parsed(html: bytes) -> _Attributes:
    parser = _Attributes()
    parser.feed(html.decode())
    return parser


def _hash_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_the_page_is_self_contained_and_its_policy_admits_only_itself():
    page = render_page("9.8.7", auth=False)
    parsed = _parsed(page.html)
    links = [(tag, name, value) for tag, name, value in parsed.attributes if name in ("src", "href", "action")]
    assert links, "the page links to its API"
    for tag, name, value in links:  # same origin (a relative path) or inline data, never another host
        assert not urlsplit(value).netloc and urlsplit(value).scheme in ("", "data"), (tag, name, value)
    assert not re.search(r"(?:https?:)?//[a-z0-9]", page.html.decode(), re.IGNORECASE), "an absolute URL in the page"
    assert [tag for tag, name, _ in parsed.attributes if name == "style" or name.startswith("on")] == []
    directives = dict(part.split(" ", 1) for part in page.csp.split("; "))
    assert directives["default-src"] == "'none'" and directives["connect-src"] == "'self'"
    assert directives["script-src"] == _hash_source("".join(parsed.inline["script"]))
    assert directives["style-src"] == _hash_source("".join(parsed.inline["style"]))
    assert 'id="version">9.8.7<' in page.html.decode()


async def _ok_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"the API"})


BENTO_SPEC = {"info": {"title": "transdenoiser", "version": "None"},
              "paths": {"/predict": {"post": {"requestBody": {"content": {"application/json": {"schema": {
                  "type": "object", "properties": {"images": {"type": "array"}, "n": {"type": "integer"}},
                  "example": {"images": [[[[0]]]]}}}}}}},
                        "/readyz": {"get": {}}, "/metadata": {"post": {}}}}


@pytest.mark.parametrize("auth", [False, True])
def test_page_and_document_are_open_and_the_api_is_not(auth):
    from starlette.testclient import TestClient

    key = API_KEY.encode() if auth else None
    inner = ApiKeyMiddleware(_ok_app, api_key=key, from_env=False)
    client = TestClient(ApiPage(inner, spec=lambda: BENTO_SPEC, api_key=key, from_env=False,
                                input_shape=lambda: (1, 2, 3)))
    for path in ("/", "/docs"):
        page = client.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), path
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        key_field = next(attrs for attrs in re.findall(r"<fieldset ([^>]*)>", page.text) if 'id="auth"' in attrs)
        assert ("hidden" in key_field) is not auth and f'data-auth="{"on" if auth else "off"}"' in page.text
    assert client.head("/").status_code == 200 and client.head("/").content == b""
    document = client.get("/docs.json").json()
    assert document["info"]["version"] == __version__ and document["info"]["title"] == "TransDenoiser"
    assert ("securitySchemes" in document.get("components", {})) is auth
    if auth:
        assert document["paths"]["/predict"]["post"]["security"] == [{"bearer": []}, {"apiKey": []}]
        assert document["paths"]["/readyz"]["get"]["security"] == []  # the probes stay open
        assert client.post("/predict").status_code == 401 and client.post("/metadata").status_code == 401
        assert client.get("/docs/").status_code == 401  # the exact paths only
        assert client.post("/predict", headers={"X-API-Key": API_KEY}).text == "the API"
    else:
        assert client.post("/predict").text == "the API"
    json_body = document["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]
    assert json_body["example"] == {"images": [[[[0.0] * 3] * 2]]} and "example" not in json_body["schema"]
    assert BENTO_SPEC["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "example"] == {"images": [[[[0]]]]}  # BentoML's document is not modified


def test_no_example_is_better_than_a_refused_one():
    document = openapi_document(BENTO_SPEC, "1", auth=False, input_shape=None)
    json_body = document["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]
    assert "example" not in json_body and "example" not in json_body["schema"]


@pytest.fixture(scope="module")
def service(random_classifier_dir, tmp_path_factory):
    model_dir = write_model_dir(tmp_path_factory.mktemp("page") / "model", random_classifier_dir, sigma=0.25, n0=20,
                                n=100, max_n=1000)
    with in_process_service(model_dir) as client:
        yield client


def test_the_served_document_is_the_products_and_its_example_is_answered(service):
    document = service.get("/docs.json")
    assert document.status_code == 200 and document.json()["info"]["version"] == __version__
    import bentoml

    assert bentoml.__version__ not in document.text and "googletagmanager" not in document.text
    body = document.json()["paths"]["/predict"]["post"]["requestBody"]["content"]
    form = body["multipart/form-data"]["schema"]["properties"]
    assert form["images"]["items"]["format"] == "binary" and {"n", "radius", "adaptive"} <= set(form)
    answer = service.post("/predict", json=body["application/json"]["example"])
    assert answer.status_code == 200 and len(answer.json()["predictions"]) == 1, answer.text
    page = service.get("/docs")
    assert page.status_code == 200 and "googletagmanager" not in page.text and "swagger" not in page.text.lower()
    assert service.get("/").text == page.text


def test_the_page_gets_its_own_request_metric_label():
    """The service's routes (``serving.service.ROUTES``, as bound at import) give the page's paths their own label
    in BentoML's request metrics; a path beside them shares the unknown one, and the app still sees the real path."""
    import asyncio

    from serving.library_patches import UNKNOWN_PATH, bound_request_labels
    from serving.service import ROUTES
    from tests.test_serving_library_patches import _recording_metrics_middleware

    middleware = _recording_metrics_middleware()
    bound_request_labels(ROUTES, middleware=middleware)
    seen: list[str] = []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    paths = ["/", "/docs", "/docs.json", "/docs/elsewhere", "/docs.json.bak"]
    for path in paths:
        asyncio.run(middleware(app)({"type": "http", "method": "GET", "path": path, "headers": []}, None, None))
    assert seen == paths and middleware.labels == ["/", "/docs", "/docs.json", UNKNOWN_PATH, UNKNOWN_PATH]


# ----------------------------------------------------------------------------------------- a real browser, a server

@pytest.fixture(scope="module")
def chromium():
    binary = find_chromium()
    if binary is None:
        pytest.skip(INSTALL_HINT)
    return binary


@pytest.fixture(scope="module")
def key_server(chromium, classifier_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("page_server")
    model_dir = write_model_dir(root / "model", classifier_dir, sigma=0.25, n0=20, n=200, max_n=2000)
    server = ServerProcess(model_dir, root / "server.log", api_key=API_KEY)
    try:
        server.wait_ready(time.monotonic() + START_TIMEOUT_S)
        yield server
    finally:
        server.stop()


def _text(browser: Browser, element_id: str) -> str:
    return browser.evaluate(f"document.getElementById({json.dumps(element_id)}).textContent")


def _outside(urls: list[str], origin: str) -> list[str]:
    """The URLs that are not the server's: another scheme, host or port (blob: URLs of the server's origin and
    inline data: URLs stay on the machine)."""
    return [url for url in urls if not (url.startswith(origin + "/") or url == origin
                                        or url.startswith(f"blob:{origin}/") or url.startswith("data:"))]


def _submit(browser: Browser) -> None:
    browser.evaluate("document.getElementById('submit').click()")
    browser.wait_for("document.getElementById('submit').disabled === false && "
                     "(!document.getElementById('result').hidden || !document.getElementById('error').hidden)",
                     ANSWER_TIMEOUT_S)


@pytest.mark.server
def test_a_person_certifies_an_image_in_a_real_browser(chromium, key_server):
    origin = key_server.url
    digit = EXAMPLES / "digit7.png"
    # names resolve to nothing but the loopback server: whatever the page asked elsewhere would leave no machine
    browser = Browser(chromium, extra_flags=("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",))
    try:
        browser.navigate(origin + "/")  # no key: the page itself is open
        assert _text(browser, "version") == __version__
        assert browser.evaluate("document.getElementById('auth').hidden") is False  # the key field shows
        browser.set_files("#images", [digit])
        _submit(browser)  # without the key: refused, and the page says so
        assert _text(browser, "error").startswith("401") and "API key" in _text(browser, "error")
        browser.type_text("#api-key", API_KEY)
        _submit(browser)
        assert browser.evaluate("document.getElementById('error').hidden"), _text(browser, "error")
        shown = {name: _text(browser, f"result-{name}") for name in ("label", "class-name", "radius", "abstained",
                                                                      "samples")}
        direct = httpx.post(origin + "/predict", headers={"X-API-Key": API_KEY}, timeout=ANSWER_TIMEOUT_S,
                            files=[("images", ("digit7.png", digit.read_bytes(), "image/png"))])
        assert direct.status_code == 200, direct.text
        expected = direct.json()["predictions"][0]  # the noise is keyed to the image: the same certificate
        assert shown == {"label": str(expected["label"]), "class-name": expected["class_name"],
                         "radius": str(expected["certified_radius"]), "abstained": "no",
                         "samples": str(expected["samples"])}, (shown, expected)
        assert shown["label"] in {str(digit) for digit in range(10)} and float(shown["radius"]) > 0
        requested = browser.requested_urls()
        assert origin + "/" in requested and origin + "/predict" in requested, requested
        assert _outside(requested, origin) == [] and browser.csp_violations() == [], requested
        # the checks above see a request elsewhere: one planted in the page is refused by the page's policy, and
        # the refusal recorded
        browser.evaluate("fetch('http://outside.example/x').catch(() => null)")
        browser.wait_for("new Promise((done) => setTimeout(() => done(true), 300))", 5)
        assert any("outside.example" in line for line in browser.csp_violations()), browser.events[-5:]
    finally:
        browser.close()
