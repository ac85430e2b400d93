"""The service's limits in process: bounded parsing, JSON error bodies, versions hidden, one certificate per
question (trivial changes of a pixel, n or radius ask the same question), and the documented JSON example."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from serving.bundle import write_model_dir
from serving.limits import PayloadLimitMiddleware, release_body_slot
from tests.conftest import in_process_service

SHAPE = (1, 28, 28)
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client(random_classifier_dir, tmp_path_factory):
    model_dir = write_model_dir(tmp_path_factory.mktemp("limits") / "model", random_classifier_dir, sigma=0.25, n0=20,
                                n=100, max_n=2000, chunk_samples=100, max_images=2, max_payload_bytes=200_000)
    with in_process_service(model_dir) as http:
        yield http


def _image() -> np.ndarray:
    image = np.random.default_rng(3).integers(0, 256, SHAPE).astype(np.float32) / np.float32(255)
    image[0, 0, 0] = 0.0
    return image


def _predict(client, **body):
    response = client.post("/predict", json={"images": [_image().tolist()], **body})
    assert response.status_code == 200, response.text
    return response.json()["predictions"][0]


def test_trivial_changes_ask_the_same_question(client):
    """A pixel 0 sent as 1e-40, n from 951 to 1049 (the grid of 100), a radius + 1e-12: one certificate each."""
    base = _image()
    tiny = base.copy()
    tiny[0, 0, 0] = 1e-40
    first = client.post("/predict", json={"images": [base.tolist()], "n": 200}).json()["predictions"][0]
    assert client.post("/predict", json={"images": [tiny.tolist()], "n": 200}).json()["predictions"][0] == first
    by_n = [_predict(client, n=n) for n in (951, 992, 1007, 1049)]
    assert all(p == by_n[0] for p in by_n) and by_n[0]["n"] == 1000  # the answer states the n it used
    assert _predict(client, n=1050)["n"] == 1100
    by_radius = [_predict(client, radius=0.225 + k * 1e-12, n=300) for k in (0, 1, 7)]
    assert all(p == by_radius[0] for p in by_radius) and by_radius[0]["radius"] == 0.225
    assert _predict(client, radius=0.2251, n=300)["radius"] == 0.226  # rounded up: a claim at least as strong


def test_the_documented_json_example_reproduces_the_png_certificate(client):
    png = client.post("/predict", files=[("images", ("digit7.png", (EXAMPLES / "digit7.png").read_bytes(),
                                                     "image/png"))])
    as_json = client.post("/predict", content=(EXAMPLES / "digit7.json").read_bytes(), headers=JSON)
    assert png.status_code == as_json.status_code == 200, (png.text, as_json.text)
    assert as_json.json() == png.json()


@pytest.mark.parametrize("body, message", [
    ('{"images": [' + "[" * 40 + "0.5" + "]" * 40 + "]}", "nested 42 levels deep"),
    ('{"images": [' + "[" * 35 + "0.5" + "]" * 35 + "]}", "nested 37 levels deep"),
    ('{"images": [[[[0.5]]]], "n": 100, "n": 200}', "duplicate JSON key"),
    ('{"images": [[[[0.5]]]], "radius": 1e300}', "the largest radius any request can certify"),
])
def test_bad_json_is_a_400_naming_the_problem(client, body, message):
    response = client.post("/predict", content=body, headers=JSON)
    assert response.status_code == 400 and message in response.json()["error"], response.text


def test_only_utf8_json(client):
    body = json.dumps({"images": [_image().tolist()]})
    for encoding in ("utf-16", "utf-32"):
        response = client.post("/predict", content=body.encode(encoding), headers=JSON)
        assert response.status_code == 400 and "UTF-8" in response.json()["error"]
    latin = client.post("/predict", content=body, headers={"content-type": "application/json; charset=latin-1"})
    assert latin.status_code == 415 and "UTF-8" in latin.json()["error"]


def test_repeated_form_fields_are_refused(client):
    png = (EXAMPLES / "digit7.png").read_bytes()
    response = client.post("/predict", files=[("images", ("a.png", png, "image/png")), ("n", (None, "100")),
                                              ("n", (None, "200"))])
    assert response.status_code == 400 and "'n' sent more than once" in response.json()["error"], response.text


def test_error_bodies_are_json_and_versions_hidden(client):
    cases = {404: client.get("/no/such/path"), 405: client.get("/predict"),
             415: client.post("/predict", content=b"\x80\x04N.", headers={"content-type":
                                                                          "application/vnd.bentoml+pickle"})}
    for status, response in cases.items():
        assert response.status_code == status and response.headers["content-type"] == "application/json"
        assert isinstance(response.json()["error"], str) and response.json()["error"], response.text
    import bentoml

    docs = client.get("/docs.json")
    assert docs.status_code == 200 and bentoml.__version__ not in docs.text and "BentoML-1" not in docs.text
    assert client.get("/readyz").headers["server"] == "transdenoiser"


def test_an_unexpected_parse_error_is_a_counted_500(client, monkeypatch):
    import serving.service
    from serving.metrics import service_metrics

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    counter = service_metrics().requests.labels(kind="certify", status="500")
    before = counter._value.get()
    monkeypatch.setattr(serving.service, "parse_predict_request", broken)
    response = client.post("/predict", json={"images": [_image().tolist()]})
    assert response.status_code == 500 and "internal error" in response.json()["error"]
    assert counter._value.get() == before + 1


@pytest.mark.parametrize("kind", ["small", "large"])
def test_bodies_beyond_the_parsing_limit_are_refused_before_reading(kind):
    """Two bodies of a kind being read or parsed: a third of that kind gets 503 with Retry-After at once, without
    its body being read, naming the limit of its kind; once a body is parsed its slot is free, although its request
    is still computing. Small: a declared Content-Length of at most 64 KiB; large: none (chunked) or more."""
    parsed = asyncio.Event()
    finish = asyncio.Event()

    async def app(scope, receive, send):
        await receive()
        await parsed.wait()
        release_body_slot(scope)  # as the service does once the body is parsed
        await finish.wait()  # computing
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limits = {"max_parsing": 2, "max_parsing_small": 5} if kind == "large" else \
        {"max_parsing": 5, "max_parsing_small": 2}
    middleware = PayloadLimitMiddleware(app, max_bytes=1000, **limits)
    headers = [(b"content-length", b"2")] if kind == "small" else []

    async def call(body_reads: list | None = None):
        sent = []

        async def receive():
            if body_reads is not None:
                body_reads.append(1)
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            sent.append(message)

        await middleware({"type": "http", "method": "POST", "path": "/predict", "headers": headers}, receive, send)
        return sent

    async def run():
        first = [asyncio.create_task(call()) for _ in range(2)]
        await asyncio.sleep(0.01)
        reads: list = []
        refused = await call(reads)
        assert refused[0]["status"] == 503 and (b"retry-after", b"1") in refused[0]["headers"] and not reads
        limit = b"max_queued_requests" if kind == "small" else b"max_parsing_requests"
        assert limit in refused[1]["body"]
        parsed.set()
        await asyncio.sleep(0.01)
        assert middleware.parsing == 0  # both parsed, both still computing
        third = asyncio.create_task(call())
        await asyncio.sleep(0.01)
        finish.set()
        results = await asyncio.gather(*first, third)
        assert [r[0]["status"] for r in results] == [200, 200, 200] and middleware.parsing == 0

    asyncio.run(run())
    get = PayloadLimitMiddleware(app, max_bytes=1000, max_parsing=0, max_parsing_small=0)  # probes take no slot
    assert get.max_parsing == 0
