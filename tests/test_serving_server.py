"""Real servers: ``transdenoiser serve`` (hence ``bentoml serve``) subprocesses on 127.0.0.1, driven by httpx.

Two servers start in parallel from one model directory: one open, one requiring an API key. Every loop is
bounded; every process is stopped in teardown (SIGTERM, then SIGKILL by pid for whatever remains).
"""
from __future__ import annotations

import io
import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from PIL import Image

from serving.bundle import write_model_dir
from serving.limits import SMALL_BODY_BYTES
from serving.process import ServerProcess
from transdenoiser.runtime import available_cores

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
    # batching "auto": one request's round per pass on CPU, as served by default (tests/test_serving_scheduler.py
    # covers shared passes); rounds of 150 samples in jobs of 50: a 1-image n = 100 request is one round
    model_dir = write_model_dir(root / "model", classifier_dir, sigma=0.25, n0=20, n=100, max_n=2000, max_images=4,
                                max_payload_bytes=200_000, allow_client_seed=True, max_queued_requests=10,
                                round_samples=150, chunk_samples=50, max_latency_ms=600_000)
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
    runtime = card["runtime"]  # CPU: "auto" runs the passes' worker threads at niceness +10 (none with one worker)
    assert runtime["forward_workers"] >= 1 and runtime["forward_nice"] == (10 if runtime["forward_workers"] > 1 else 0)
    assert runtime["round_samples"] == 150  # the setting of this model directory (default "auto": 100 on CPU)
    assert runtime["overlap"] is False and "one request's round" in runtime["batching"]  # CPU: passes in turn
    assert runtime["pipelined"] is False
    assert runtime["switch_interval_us"] == 5000  # CPU: Python's own thread switch interval, left as it is
    assert runtime["max_parsing_requests"] == max(3, available_cores() + 1)  # "auto": cores + 1, at least 3


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
    "n above max_n": (400, {"json": {"images": [_image(0.0)], "n": 2001}}),
    "over-long integer n": (400, _json('{"images": [' + json.dumps(_image(0.5)) + '], "n": ' + "9" * 5000 + "}")),
    "over-long integer pixel": (400, _json('{"images": [' + json.dumps(_image(0.5)).replace("0.5", "1" * 4301, 1)
                                           + "]}")),
    "boolean pixel": (400, _json('{"images": [' + json.dumps(_image(0.5)).replace("0.5", "true", 1) + "]}")),
    "boolean n": (400, {"json": {"images": [_image(0.5)], "n": True}}),
    "form n with underscore": (400, {"files": [("images", ("a.png", png(np.zeros((28, 28), np.uint8)), "image/png"))],
                                     "data": {"n": "1_000"}}),
    "form n with sign": (400, {"files": [("images", ("a.png", png(np.zeros((28, 28), np.uint8)), "image/png"))],
                               "data": {"n": "+5"}}),
    "form n with spaces": (400, {"files": [("images", ("a.png", png(np.zeros((28, 28), np.uint8)), "image/png"))],
                                 "data": {"n": " 50 "}}),
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


# ------------------------------------------------------------------------------------------------ keyed noise

def test_one_certificate_per_input(servers, client, digits):
    """No seed: the same image twice in a request, and again in another request, gets one certificate; a changed
    pixel gets other noise; a server with another secret (the second server's, generated at its start) too."""
    x, _ = digits
    image = (0.5 * x[0] + 0.5 * x[1]).tolist()  # ambiguous: its counts move with the noise
    first = client.post("/predict", json={"images": [image, image], "n": 300})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["seed"] is None and body["seed_source"] == "server"
    assert body["predictions"][0] == body["predictions"][1]
    assert client.post("/predict", json={"images": [image], "n": 300}).json()["predictions"][0] == \
        body["predictions"][0]
    changed = np.array(image)
    changed[0, 0, 0] = 0.01  # one pixel three 8-bit levels away
    other = client.post("/predict", json={"images": [changed.tolist()], "n": 300}).json()["predictions"][0]
    assert other["noise_seed"] != body["predictions"][0]["noise_seed"]
    with httpx.Client(base_url=servers["auth"].url, timeout=60, headers={"X-API-Key": API_KEY}) as http:
        elsewhere = http.post("/predict", json={"images": [image], "n": 300}).json()["predictions"][0]
    assert elsewhere["noise_seed"] != body["predictions"][0]["noise_seed"]
    assert elsewhere["n"] == body["predictions"][0]["n"] == 300


def test_every_answer_about_one_image_reads_one_stream(client, digits):
    """One image asked at 11 decide radii, at 20 values of n on the server's grid (50 .. 1,000) and once in
    estimate mode: every answer has the same noise seed and the same selected class, the fixed-n vote counts are
    prefixes of one stream (never falling, never rising by more than the samples added), each fixed-n radius is the
    ladder's highest rung for its votes, and the radii certified by decide are all the lower ones."""
    from certify.ladder import ladder

    x, _ = digits
    image = (0.7 * x[3] + 0.3 * x[8]).tolist()  # a digit with a runner-up class: its votes are not all one class
    answers = []
    for n in range(50, 1001, 50):
        response = client.post("/predict", json={"images": [image], "n": n})
        assert response.status_code == 200, response.text
        answers.append(response.json()["predictions"][0])
    fixed = answers[:]
    radius = fixed[-1]["certified_radius"] or 0.1
    decided = []
    for k in range(11):
        response = client.post("/predict", json={"images": [image], "radius": round(radius - 0.005 + k * 0.001, 3)})
        assert response.status_code == 200, response.text
        decided.append(response.json()["predictions"][0])
    estimate = client.post("/predict", json={"images": [image], "adaptive": True}).json()["predictions"][0]
    answers += decided + [estimate]
    assert len({a["noise_seed"] for a in answers}) == 1  # one stream, whatever the kind, n or radius
    assert len({a["label"] for a in decided + [estimate]} | {a["label"] for a in fixed if not a["abstained"]}) == 1
    counts, ns = np.array([a["count"] for a in fixed]), np.array([a["n"] for a in fixed])
    assert np.all(np.diff(counts) >= 0) and np.all(np.diff(counts) <= np.diff(ns))
    shared = ladder(0.001, 0.25)
    for a in fixed:
        assert a["certified_radius"] == float(shared.radius_of_threshold(shared.lower(np.array([a["count"]]),
                                                                                       a["n"]))[0])
    certified = [a["certified"] is True for a in decided]
    assert certified == sorted(certified, reverse=True)  # certified up to some radius, then not (or no answer)


# ------------------------------------------------------------------------------------------------ fair scheduling

def metric_values(client: httpx.Client) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics as {(name, sorted labels): value}, parsed with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def metric(values: dict, name: str, **labels) -> float:
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


def _timed_post(url: str, body: dict, out: dict, key: str) -> None:
    with httpx.Client(base_url=url, timeout=120) as http:
        started = time.perf_counter()
        out[key] = http.post("/predict", json=body)
        out[key + "_s"] = time.perf_counter() - started
        out[key + "_done"] = time.perf_counter()


def test_a_small_request_is_not_blocked_by_a_large_one(servers, client, digits):
    """Scaled-down fairness target: 1 image at n = 100 next to 4 images at n = 2,000 (8,080 samples)."""
    x, _ = digits
    small = {"images": [x[2].tolist()], "n": 100}
    idle = []
    for _ in range(3):
        started = time.perf_counter()
        assert client.post("/predict", json=small).status_code == 200
        idle.append(time.perf_counter() - started)
    idle_s = float(np.median(idle))
    out: dict = {}
    large = threading.Thread(target=_timed_post, args=(servers["open"].url, {"images": x[:4].tolist(), "n": 2000},
                                                        out, "large"))
    large.start()
    deadline = time.monotonic() + 30
    while metric(metric_values(client), "transdenoiser_queue_depth") < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    _timed_post(servers["open"].url, small, out, "small")
    large.join(timeout=120)
    assert out["small"].status_code == 200 and out["large"].status_code == 200, out["large"].text
    assert out["small_done"] < out["large_done"]  # the small request did not wait for the large one's work
    # it waits for at most one round of the large request (150 samples) before its own (120): about 2.3x the
    # compute of an idle server, less with the fixed cost of HTTP; a little slack for a shared machine
    assert out["small_s"] < max(3 * idle_s, idle_s + 0.4), (out["small_s"], idle_s, out["large_s"])


def _raw_predict(url: str, body: dict) -> socket.socket:
    """Send a predict request on a raw socket and return it without reading the answer."""
    host, port = url.split("://")[1].split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return sock


def test_a_disconnected_client_stops_computing(servers, client, digits):
    x, _ = digits
    before = metric_values(client)
    sock = _raw_predict(servers["open"].url, {"images": x[:4].tolist(), "n": 2000})  # 8,080 samples
    deadline = time.monotonic() + 30
    while (metric(metric_values(client), "transdenoiser_noisy_samples_total", kind="certify")
           == metric(before, "transdenoiser_noisy_samples_total", kind="certify")) and time.monotonic() < deadline:
        time.sleep(0.02)
    sock.close()
    time.sleep(1.0)
    settled = metric_values(client)
    time.sleep(1.0)
    after = metric_values(client)
    computed = (metric(after, "transdenoiser_noisy_samples_total", kind="certify")
                - metric(before, "transdenoiser_noisy_samples_total", kind="certify"))
    assert 0 < computed < 8080
    assert metric(after, "transdenoiser_noisy_samples_total", kind="certify") == \
        metric(settled, "transdenoiser_noisy_samples_total", kind="certify")  # nothing more computed
    assert metric(after, "transdenoiser_dropped_requests_total", reason="disconnected") == \
        metric(before, "transdenoiser_dropped_requests_total", reason="disconnected") + 1


def test_a_full_queue_answers_503_with_retry_after(servers, client, digits):
    x, _ = digits
    # 10 requests of 8,080 samples: within the fixture's 600 s deadline together at any rate this machine reaches
    # (180 samples/s with admission's margin), so admission by deadline admits them all and the queue bound is what
    # refuses the 11th; large enough that the first ones are still computing when the tenth is admitted
    # sent one at a time, each once the one before holds its ticket, so none waits for a parsing slot
    socks = []
    try:
        for i in range(10):
            socks.append(_raw_predict(servers["open"].url, {"images": x[:4].tolist(), "n": 2000, "seed": i}))
            deadline = time.monotonic() + 30
            while metric(metric_values(client), "transdenoiser_queue_depth") < i + 1 and time.monotonic() < deadline:
                time.sleep(0.02)
        assert metric(metric_values(client), "transdenoiser_queue_depth") == 10
        refused = client.post("/predict", json={"images": [x[0].tolist()], "n": 100})
        assert refused.status_code == 503 and "max_queued_requests" in refused.json()["error"]
        assert int(refused.headers["retry-after"]) >= 1
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 30
    while metric(metric_values(client), "transdenoiser_queue_depth") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.post("/predict", json={"images": [x[0].tolist()], "n": 100}).status_code == 200


def test_metrics_appear_and_move(client, digits):
    x, _ = digits
    before = metric_values(client)
    response = client.post("/predict", json={"images": x[:2].tolist(), "n": 150})
    assert response.status_code == 200
    assert client.post("/predict", json={"images": [_image(2.0)]}).status_code == 400
    after = metric_values(client)
    samples = metric(after, "transdenoiser_noisy_samples_total", kind="certify") - \
        metric(before, "transdenoiser_noisy_samples_total", kind="certify")
    assert samples == 2 * (20 + 150)
    abstained = sum(p["abstained"] for p in response.json()["predictions"])
    assert metric(after, "transdenoiser_certificates_total", kind="certify", outcome="abstained") - \
        metric(before, "transdenoiser_certificates_total", kind="certify", outcome="abstained") == abstained
    assert metric(after, "transdenoiser_certificates_total", kind="certify", outcome="certified") - \
        metric(before, "transdenoiser_certificates_total", kind="certify", outcome="certified") == 2 - abstained
    for status in ("200", "400"):
        assert metric(after, "transdenoiser_requests_total", kind="certify", status=status) == \
            metric(before, "transdenoiser_requests_total", kind="certify", status=status) + 1
        assert metric(after, "transdenoiser_request_duration_seconds_count", kind="certify", status=status) == \
            metric(before, "transdenoiser_request_duration_seconds_count", kind="certify", status=status) + 1
    assert ("transdenoiser_queue_depth", ()) in after and metric(after, "transdenoiser_queue_depth") == 0
    assert metric(after, "transdenoiser_in_flight_requests", kind="certify") == 0
    # the passes and the time they took to compute: at least one pass (CPU: one request's round per pass), and
    # some, but not more than the whole request's, compute time
    passes = metric(after, "transdenoiser_passes_total") - metric(before, "transdenoiser_passes_total")
    busy = metric(after, "transdenoiser_counter_seconds_total") - metric(before, "transdenoiser_counter_seconds_total")
    assert 1 <= passes <= samples and 0 < busy < 60


# ----------------------------------------------------------------------------------------------- bounded labels, bursts

def test_unique_paths_do_not_grow_metrics(servers, client):
    """3,000 unique paths, open and unauthenticated (401): /metrics stays within a few kB of its size before."""
    client.get("/no-such-path-warm-up")
    before = len(client.get("/metrics").content)
    with httpx.Client(base_url=servers["auth"].url, timeout=30) as unauthenticated:
        for index in range(1500):
            assert client.get(f"/probe-{index}").status_code == 404
            refused = unauthenticated.get(f"/probe-{index}")
            assert refused.status_code == 401 and refused.json()["error"]
    assert len(client.get("/metrics").content) < before + 4096
    with httpx.Client(base_url=servers["auth"].url, timeout=30) as http:
        assert len(http.get("/metrics").content) < before + 8192  # the key server: same bound


def test_server_header_and_malformed_content_length_are_ours(servers):
    host, port = servers["open"].url.split("://")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 12abc\r\n\r\n{}")
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head, answer
    assert "malformed HTTP request" in json.loads(body)["error"]
    assert httpx.get(servers["open"].url + "/readyz").headers["server"] == "transdenoiser"


def test_probes_answer_quickly_under_a_burst_of_large_bodies(servers, client):
    """40 bodies just under the payload limit at once: the ones beyond max_parsing_requests are refused with 503
    at once (by the front door, counted as refused for parsing; the others' 503s are admission's, counted too);
    none is a 5xx otherwise; /readyz and /livez keep answering fast."""
    def refusals() -> dict[str, float]:
        return {dict(labels)["reason"]: value for (name, labels), value in metric_values(client).items()
                if name == "transdenoiser_refused_requests_total"}

    before = refusals()
    body = ('{"images": [' + json.dumps(np.full(SHAPE, 0.123456789).tolist()) + "]" + " " * 150_000 + "}").encode()
    statuses: list[int] = []
    probes: list[float] = []

    def post() -> None:
        with httpx.Client(base_url=servers["open"].url, timeout=60) as http:
            statuses.append(http.post("/predict", content=body, headers={"content-type": "application/json"})
                            .status_code)

    threads = [threading.Thread(target=post) for _ in range(40)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads) or len(probes) < 10:
        for path in ("/readyz", "/livez"):
            started = time.perf_counter()
            assert client.get(path).status_code == 200
            probes.append(time.perf_counter() - started)
        if len(probes) > 400:
            break
    for thread in threads:
        thread.join(timeout=60)
    assert len(statuses) == 40 and set(statuses) <= {200, 503}, statuses
    assert float(np.median(probes)) < 0.1, sorted(probes)[-5:]
    after = refusals()
    new = {reason: after[reason] - before.get(reason, 0.0) for reason in after}
    assert sum(new.values()) == statuses.count(503), (new, statuses)


def _hold_body_slots(url: str, count: int, key: str | None = None) -> list[socket.socket]:
    """``count`` connections, each with a request whose large body (declared over 64 KiB) is started and never
    finished: each holds a large body slot (max_parsing_requests) until closed, or until the body's pace drops it
    (the door takes the slot once the first SMALL_BODY_BYTES have arrived; at the default 8 KiB/s after 2 s, those
    bytes keep the slot for about 10 s)."""
    host, port = url.split("://")[1].split(":")
    held = []
    first_bytes = b'{"images": ' + b" " * (SMALL_BODY_BYTES - 11)
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {SMALL_BODY_BYTES + 1000}\r\n".encode()
                     + (f"X-API-Key: {key}\r\n".encode() if key else b"") + b"\r\n" + first_bytes)
        held.append(sock)
    return held


@pytest.mark.parametrize("which", ["open", "auth"])
def test_full_body_slots_refuse_at_the_door_and_unauthenticated_requests_still_get_401(servers, which):
    """Every large body slot held by a slow upload: the next large body is refused with 503 at once (the front door),
    counted as refused for parsing, while a small one (its own allowance) is answered; on the key server a request
    without the key still gets its 401; probes answer."""
    url = servers[which].url
    key = API_KEY if which == "auth" else None
    headers = {"content-type": "application/json", **({"x-api-key": key} if key else {})}
    with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
        def parsing_refusals() -> float:
            return metric(metric_values(http), "transdenoiser_refused_requests_total", reason="parsing")

        before = parsing_refusals()
        slots = http.post("/metadata").json()["runtime"]["max_parsing_requests"]  # "auto": cores + 1, at least 3
        held = _hold_body_slots(url, slots, key)
        try:
            time.sleep(1.0)  # the server reads the requests' headers and each takes a slot; none is answered
            for sock in held:
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(100)
            answer = http.post("/predict", content=b'{"images": []}' + b" " * SMALL_BODY_BYTES)
            assert answer.status_code == 503, answer.text
            assert "max_parsing_requests" in answer.json()["error"] and answer.headers["retry-after"] == "1"
            assert answer.headers["server"] == "transdenoiser" and parsing_refusals() == before + 1
            assert http.post("/predict", json={"images": [np.zeros(SHAPE).tolist()]}).status_code == 200  # small
            if key:
                refused = httpx.post(url + "/predict", content=b"{}", headers={"content-type": "application/json"})
                assert refused.status_code == 401 and "API key" in refused.json()["error"]
            assert http.get("/readyz").status_code == 200 and http.get("/livez").text == "\n"
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 20
        while http.post("/predict", json={"images": [np.zeros(SHAPE).tolist()]}).status_code != 200:
            assert time.monotonic() < deadline, "the slots were not given back when the uploads were abandoned"
            time.sleep(0.1)


def _stalled_bodies(url: str, count: int, body_bytes: int) -> list[socket.socket]:
    """``count`` connections that send a POST's headers (a 5,000-byte JSON body declared) and ``body_bytes`` of it."""
    host, port = url.split("://")[1].split(":")
    head = (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
            + b'{"images": [[['[:body_bytes])
    socks = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(head)
        socks.append(sock)
    return socks


def _until_closed(socks: list[socket.socket], deadline: float) -> dict[socket.socket, bytes]:
    """What the server sent on each socket until it closed it, for those it closed before ``deadline``."""
    import select

    received = {sock: b"" for sock in socks}
    closed: dict[socket.socket, bytes] = {}
    while len(closed) < len(socks) and time.monotonic() < deadline:
        waiting = [sock for sock in socks if sock not in closed]
        readable, _, _ = select.select(waiting, [], [], max(0.0, min(0.5, deadline - time.monotonic())))
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                received[sock] += data
            else:
                closed[sock] = received[sock]
    return closed


def test_stalled_bodies_neither_hold_the_slots_nor_stay_open(servers, client):
    """uvicorn alone, no nginx (issue 68): 60 connections stalled after their headers and 60 after 13 bytes of a small
    body, against 10 small-body slots (max_queued_requests). Small requests sent meanwhile are all answered promptly
    (the stalled ones hold no slot: the door takes a body's slot once the body has arrived), and every stalled
    connection gets 408 and is closed 2 s after its headers (nothing arrived within the pace's first 2 s). Before
    the pace every small request got 503. At scale: benchmarks/bench_stalled_bodies.py (docs/SERVING.md)."""
    body = {"images": [(np.random.default_rng(0).integers(0, 256, SHAPE) / 255).tolist()], "n": 100}

    def small() -> tuple[int, float]:
        started = time.perf_counter()
        status = client.post("/predict", json=body).status_code
        return status, time.perf_counter() - started

    limits = client.post("/metadata").json()["limits"]
    assert (limits["body_timeout_ms"], limits["min_body_bytes_per_s"]) == (60_000, 8192)  # the defaults
    idle = [small() for _ in range(6)]
    opened = time.monotonic()
    stalled = _stalled_bodies(servers["open"].url, 60, 0) + _stalled_bodies(servers["open"].url, 60, 13)
    try:
        busy = []
        while time.monotonic() < opened + 3.5:  # the stalled connections open, then dropped
            busy.append(small())
            time.sleep(0.25)
        answers = _until_closed(stalled, opened + 10)
    finally:
        for sock in stalled:
            sock.close()
    assert [status for status, _ in busy] == [200] * len(busy), busy
    idle_s = sorted(seconds for _, seconds in idle[1:])[2]
    assert max(seconds for _, seconds in busy) < max(2.0, 10 * idle_s), (idle, busy)
    assert len(answers) == len(stalled), f"{len(stalled) - len(answers)} stalled connections still open"
    assert all(answer.startswith(b"HTTP/1.1 408 ") and b"min_body_bytes_per_s" in answer for answer in answers.values())


# ------------------------------------------------------------------------------------------------ slow clients

PROXY_CAP = 64  # nginx's worker_connections in this test: clients and upstream connections together


@pytest.fixture(scope="module")
def proxy(servers, tmp_path_factory):
    from serving.process import free_port
    from serving.proxy import ProxyProcess, ProxySettings, nginx_binary

    if nginx_binary() is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light); the slow-client protection "
                    "of docs/SERVING.md needs it")
    started = ProxyProcess(servers["open"].url, tmp_path_factory.mktemp("proxy"), free_port(),
                           ProxySettings(header_timeout_s=2, body_timeout_s=2, max_connections=PROXY_CAP,
                                         max_body_bytes=200_000))
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def _stalled(url: str, count: int) -> list[socket.socket]:
    """Connections that send half a request line and then nothing."""
    host, port = url.split("://")[1].split(":")
    socks = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Le")
        socks.append(sock)
    return socks


def _closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        sock.recv(1024)  # b"" (EOF) or an error page: either way the proxy answered and closed
        return True
    except ConnectionResetError:  # closed with a reset (reset_timedout_connection on)
        return True
    except TimeoutError:
        return False


def test_proxy_times_out_stalled_headers(proxy, client, digits):
    x, _ = digits
    body = {"images": [x[0].tolist()], "n": 100, "seed": 3}
    with httpx.Client(base_url=proxy.url, timeout=60) as http:
        assert http.post("/predict", json=body).json() == client.post("/predict", json=body).json()
    stalled = _stalled(proxy.url, 5)
    direct = _stalled(client.base_url.__str__().rstrip("/"), 1)  # the same against uvicorn: never timed out
    try:
        started = time.monotonic()
        assert all(_closed_by_peer(sock, timeout=6) for sock in stalled)
        assert time.monotonic() - started < 6
        assert not _closed_by_peer(direct[0], timeout=3)
    finally:
        for sock in stalled + direct:
            sock.close()


def _raw_answer(url: str, request: bytes) -> tuple[bytes, bytes]:
    host, port = url.split("://")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


def test_proxy_error_pages_are_json(proxy):
    """nginx's own 413 and 400 are the documented JSON, not its HTML pages; the server's own errors pass through."""
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        too_large = http.post("/predict", content=b" " * 250_000, headers={"content-type": "application/json"})
        assert too_large.status_code == 413 and "client_max_body_size" in too_large.json()["error"]
        missing = http.get("/no/such/path")
        assert missing.status_code == 404 and "no such path" in missing.json()["error"]
        server = http.get("/readyz").headers.get("server", "")
        assert not any(char.isdigit() for char in server), server  # server_tokens off: no version
    head, body = _raw_answer(proxy.url, b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n"
                                        b"Connection: close\r\n\r\n{}")
    assert head.startswith(b"HTTP/1.1 400") and "malformed HTTP request" in json.loads(body)["error"], head + body


def test_proxy_caps_open_connections(proxy, digits):
    import psutil

    x, _ = digits
    workers = [child for child in psutil.Process(proxy.process.pid).children()]
    assert workers, "no nginx worker process"
    stalled = _stalled(proxy.url, PROXY_CAP + 40)
    try:
        time.sleep(0.5)
        open_connections = sum(len(worker.net_connections(kind="tcp")) for worker in workers)
        assert open_connections <= PROXY_CAP  # the rest wait in the kernel's backlog, holding no nginx slot
        # At the cap nginx may close a new connection at once instead of leaving it in the backlog, or accept it
        # and find no connection left for the upstream: then it answers 503 with Retry-After (never its bare 500).
        # A client that retries is served once the stalled connections time out (client_header_timeout).
        deadline, response = time.monotonic() + 60, None
        with httpx.Client(base_url=proxy.url, timeout=60) as http:
            while response is None or response.status_code == 503:
                try:
                    response = http.post("/predict", json={"images": [x[1].tolist()], "n": 100})
                except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1.0)
                    continue
                if response.status_code == 503:
                    assert response.headers["retry-after"] == "1" and "connection cap" in response.json()["error"]
                    assert time.monotonic() < deadline, "still at the cap after 60 s"
                    time.sleep(1.0)
        assert response.status_code == 200, response.text
    finally:
        for sock in stalled:
            sock.close()


# ------------------------------------------------------------------------------------------------ benchmark smoke

def test_benchmarks_run_against_a_server(servers, proxy, digits):
    """The soak, fairness and slow-client benchmarks' measuring code, tiny, on this module's servers."""
    from benchmarks.bench_fairness import measure as measure_fairness
    from benchmarks.bench_slow_clients import measure as measure_slow
    from benchmarks.bench_soak import run_soak

    x, _ = digits
    soak = run_soak(servers["open"].url, x, clients=3, seconds=3, payload_limit=200_000, malformed_every=2)
    assert soak["passed"] and soak["responses_5xx"] == 0 and soak["dropped_connections"] == 0
    malformed = soak["per_kind"]["malformed"]
    assert malformed["count"] >= 1 and all(400 <= int(status) < 500 for status in malformed["statuses"])
    assert sum(kind["count"] for kind in soak["per_kind"].values()) == soak["requests"]
    fairness = measure_fairness(servers["open"].url, {"images": [x[0].tolist()], "n": 100},
                                {"images": x[:4].tolist(), "n": 2000}, repeats=1, small_requests=2)
    assert fairness["idle"]["count"] == fairness["loaded"]["count"] == 2 and fairness["median_ratio"] > 0
    slow = measure_slow({"proxy": proxy.url}, {"images": [x[0].tolist()], "n": 100}, stalled=10, repeats=1,
                        requests=2)
    assert slow["proxy"]["failures"] == 0 and slow["proxy"]["stalled"]["count"] == 2
    from benchmarks.bench_overload import measure_burst

    burst = measure_burst(servers["open"].url, bodies=3, body_bytes=150_000, loop_clients=1, loop_seconds=1,
                          in_process_probes=True)
    at_once, looping = burst["at_once"], burst["looping"]
    # the probes from their own process, each with its start; those from a thread of the load's process beside them
    assert len(at_once["slow_probes_start_latency_s"]) == at_once["probes_over_100ms"]
    assert at_once["in_process_probes"]["count"] >= 1 and at_once["load_s"] > 0
    assert sum(at_once["statuses"].values()) == 3 and set(at_once["statuses"]) <= {"200", "503"}
    assert sum(looping["statuses"].values()) == looping["requests"] >= 1
    assert set(looping["statuses"]) <= {"200", "503"}
    assert at_once["probes"]["count"] >= 2 and looping["probes"]["count"] >= 2


def test_proxy_without_a_connection_for_the_upstream_answers_503_with_retry_after(servers, digits, tmp_path):
    """worker_connections 3: the listening socket, the worker's channel to the master and one client fill it (with 2
    nginx cannot even accept the client), so it cannot open the upstream
    connection ("worker_connections are not enough"). It answers 503 with Retry-After, as the server's full queue
    does, not its bare 500."""
    from serving.process import free_port
    from serving.proxy import ProxyProcess, ProxySettings, nginx_binary

    if nginx_binary() is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx-light)")
    x, _ = digits
    tight = ProxyProcess(servers["open"].url, tmp_path / "tight", free_port(),
                         ProxySettings(header_timeout_s=2, body_timeout_s=2, max_connections=3))
    try:
        tight.wait_ready()
        with httpx.Client(base_url=tight.url, timeout=30) as http:
            response = http.post("/predict", json={"images": [x[1].tolist()], "n": 100})
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1" and "connection cap" in response.json()["error"]
        assert "worker_connections are not enough" in (tight.out_dir / "error.log").read_text()
    finally:
        tight.stop()
