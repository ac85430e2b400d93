"""Real servers: ``transdenoiser serve`` (hence ``bentoml serve``) subprocesses on 127.0.0.1, driven by httpx.

Two servers start in parallel from one model directory: one open, one requiring an API key. Every loop is
bounded; every process is stopped in teardown (SIGTERM, then SIGKILL by pid for whatever remains).
"""
from __future__ import annotations

import io
import json
import threading
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from serving.bundle import write_model_dir
from serving.process import ServerProcess

pytestmark = pytest.mark.server

API_KEY = "test-key-" + "0123456789abcdef" * 2
SHAPE = (1, 28, 28)
START_TIMEOUT_S = 240  # a loaded 2-core machine needs most of a minute to import torch and bentoml twice


def png(array: np.ndarray, mode: str = "L", fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def servers(classifier_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("servers")
    model_dir = write_model_dir(root / "model", classifier_dir, sigma=0.25, batching=True, n0=20, n=100, max_n=500,
                                max_images=4, max_payload_bytes=200_000, allow_client_seed=True)
    started = []
    try:
        started.append(ServerProcess(model_dir, root / "open.log", api_key=None))
        started.append(ServerProcess(model_dir, root / "auth.log", api_key=API_KEY))
        deadline = time.monotonic() + START_TIMEOUT_S
        for server in started:
            server.wait_ready(deadline)
        yield {"open": started[0], "auth": started[1]}
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def client(servers):
    with httpx.Client(base_url=servers["open"].url, timeout=60) as http:
        yield http


@pytest.fixture(scope="module")
def digits(mnist10k):
    x, y = mnist10k.test.tensors()
    first = [int(np.flatnonzero(y.numpy() == label)[0]) for label in range(10)]
    return x[first].numpy(), y[first].numpy()


def test_probes_and_model_card(client):
    for path in ("/healthz", "/livez", "/readyz"):
        assert client.get(path).status_code == 200
    metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "bentoml_service_request" in metrics.text
    card = client.post("/metadata").json()
    assert card["classifier"]["architecture"] == "cnn28" and card["certification"]["sigma"] == 0.25


def test_good_requests(client, digits):
    x, y = digits
    body = {"images": x[:3].tolist(), "n": 200, "seed": 12}
    first = client.post("/predict", json=body)
    assert first.status_code == 200, first.text
    predictions = first.json()["predictions"]
    assert [p["label"] for p in predictions] == y[:3].tolist()
    assert all(p["certified_radius"] > 0 and p["n"] == 200 and p["n0"] == 20 for p in predictions)
    assert client.post("/predict", json=body).json() == first.json()  # seeded: reproducible
    files = [("images", (f"{i}.png", png((x[i, 0] * 255).round().astype(np.uint8)), "image/png")) for i in (3, 4)]
    upload = client.post("/predict", files=files)
    assert upload.status_code == 200, upload.text
    assert [p["label"] for p in upload.json()["predictions"]] == y[3:5].tolist()
    assert upload.json()["seed_source"] == "server" and upload.json()["predictions"][0]["n"] == 100


def _json(text: str) -> dict:
    return {"content": text, "headers": {"content-type": "application/json"}}


def _image(value: float) -> list:
    return np.full(SHAPE, value).tolist()


BAD_REQUESTS = {
    "undecodable image": (400, {"files": [("images", ("a.png", b"\x89PNG\r\n\x1a\n garbage", "image/png"))]}),
    "truncated PNG": (400, {"files": [("images", ("a.png", png(np.zeros((28, 28), np.uint8))[:50], "image/png"))]}),
    "wrong image size": (400, {"files": [("images", ("a.png", png(np.zeros((32, 28), np.uint8)), "image/png"))]}),
    "wrong channel count": (400, {"files": [("images", ("a.png", png(np.zeros((28, 28, 3), np.uint8), "RGB"),
                                                        "image/png"))]}),
    "flat array": (400, {"json": {"images": [np.zeros(784).tolist()]}}),
    "array without channel axis": (400, {"json": {"images": [np.zeros((28, 28)).tolist()]}}),
    "NaN": (400, _json('{"images": [' + json.dumps(_image(0.5)).replace("0.5", "NaN", 1) + "]}")),
    "infinity": (400, _json('{"images": [' + json.dumps(_image(0.5)).replace("0.5", "1e999", 1) + "]}")),
    "value above 1": (400, {"json": {"images": [_image(1.01)]}}),
    "value below 0": (400, {"json": {"images": [_image(-0.01)]}}),
    "too many images (JSON)": (400, {"json": {"images": [_image(0.0)] * 5}}),
    "too many images (files)": (400, {"files": [("images", (f"{i}.png", png(np.zeros((28, 28), np.uint8)),
                                                            "image/png")) for i in range(5)]}),
    "oversized payload": (413, _json(" " * 200_001)),
    "oversized chunked payload": (413, {"content": iter([b" " * 150_000] * 2),
                                        "headers": {"content-type": "application/json"}}),
    "n above max_n": (400, {"json": {"images": [_image(0.0)], "n": 501}}),
    "not JSON": (400, _json("{images")),
    "unsupported content type": (415, {"content": b"\x00\x01", "headers": {"content-type": "image/png"}}),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_gets_a_4xx_json_error(client, case):
    status, request = BAD_REQUESTS[case]
    response = client.post("/predict", **request)
    assert response.status_code == status, response.text
    assert isinstance(response.json()["error"], str) and response.json()["error"]


def test_server_stays_up_after_bad_inputs(client, digits):
    assert client.get("/readyz").status_code == 200
    response = client.post("/predict", json={"images": digits[0][5:6].tolist()})
    assert response.status_code == 200 and response.json()["predictions"][0]["label"] == int(digits[1][5])


def test_concurrent_requests_with_a_bad_one(servers, client, digits):
    """Good requests sharing batches with bad ones succeed, with the certificates they get when sent alone."""
    x, _ = digits
    bad = {6: _json('{"images": [' + json.dumps(_image(0.5)).replace("0.5", "NaN", 1) + "]}"),
           9: {"json": {"images": [_image(2.0)]}}}
    good = {i: {"json": {"images": [x[i].tolist()], "n": 300, "seed": i}} for i in range(10) if i not in bad}
    alone = {i: client.post("/predict", **request).json() for i, request in good.items()}
    results: dict[int, httpx.Response] = {}

    def call(index: int) -> None:
        with httpx.Client(base_url=servers["open"].url, timeout=120) as http:
            results[index] = http.post("/predict", **(bad.get(index) or good[index]))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert sorted(results) == list(range(10))
    for index, response in results.items():
        if index in bad:
            assert response.status_code == 400 and "error" in response.json()
        else:
            assert response.status_code == 200, response.text
            assert response.json() == alone[index]


def test_api_key_required_when_configured(servers, digits):
    body = {"images": digits[0][:1].tolist()}
    with httpx.Client(base_url=servers["auth"].url, timeout=60) as http:
        assert http.post("/predict", json=body).status_code == 401
        assert http.post("/metadata").status_code == 401
        wrong = http.post("/predict", json=body, headers={"Authorization": "Bearer " + "x" * len(API_KEY)})
        assert wrong.status_code == 401 and "invalid API key" in wrong.json()["error"]
        for headers in ({"Authorization": f"Bearer {API_KEY}"}, {"X-API-Key": API_KEY}):
            response = http.post("/predict", json=body, headers=headers)
            assert response.status_code == 200 and response.json()["predictions"][0]["label"] == int(digits[1][0])
        for path in ("/healthz", "/livez", "/readyz", "/metrics"):
            assert http.get(path).status_code == 200
    with httpx.Client(base_url=servers["open"].url, timeout=60) as http:  # no key configured: open
        assert http.post("/predict", json=body).status_code == 200
