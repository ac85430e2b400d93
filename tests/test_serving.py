"""Serving: config, model directories, validation, the batched certifier, middlewares, and the service in process."""
from __future__ import annotations

import io
import json
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from certify.core import Smooth
from serving.auth import ApiKeyMiddleware, key_accepted
from serving.bundle import load_model_dir, write_model_dir
from serving.card import epsilon_statements
from serving.compute.counter import VoteCounter
from serving.compute.engine import (
    CertifyWork,
    NoiseJob,
    NoisePiece,
    StreamJob,
    job_seed,
    plan_jobs,
)
from serving.config import ServingConfig, load_config, validate_config
from serving.limits import PayloadLimitMiddleware
from serving.process import free_port
from serving.validation import RequestError, decode_image, parse_payload
from tests.conftest import in_process_service
from transdenoiser.cli import main as cli_main
from transdenoiser.errors import UserError

SHAPE = (1, 28, 28)
API_KEY = "k" * 32


def png_bytes(array: np.ndarray, mode: str = "L", fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode=mode).save(buffer, fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def digits(mnist10k):
    """The first test image of each of eight classes (the test split is ordered by class)."""
    x, y = mnist10k.test.tensors()
    first = [int(np.flatnonzero(y.numpy() == label)[0]) for label in range(8)]
    return x[first], y[first]


@pytest.fixture(scope="module")
def model_dir(classifier_dir, tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("serve") / "model", classifier_dir, sigma=0.25, batching=True,
                           n0=20, n=100, max_n=500, max_images=4, max_payload_bytes=200_000, allow_client_seed=True)


@pytest.fixture(scope="module")
def smooth(model_dir):
    pipeline = load_model_dir(model_dir).pipeline
    return Smooth(pipeline.classifier, pipeline.num_classes, 0.25, batch_size=100)


# ------------------------------------------------------------------------------------------------ config

def test_model_dir_round_trip_and_refusals(model_dir, classifier_dir, tmp_path):
    config = load_config(model_dir)
    assert (config.sigma, config.n0, config.n, config.max_n, config.max_images) == (0.25, 20, 100, 500, 4)
    assert config.denoiser is None and (model_dir / "classifier" / "weights.safetensors").is_file()
    with pytest.raises(UserError, match="not an empty directory"):
        write_model_dir(model_dir, classifier_dir, sigma=0.25)
    with pytest.raises(UserError, match="exceeds max_n"):
        write_model_dir(tmp_path / "m", classifier_dir, sigma=0.25, n=2000, max_n=1000)
    assert not (tmp_path / "m").exists()  # validated before anything is written


@pytest.mark.parametrize("raw, message", [
    ({}, "'sigma'.*required"),
    ({"sigma": 0}, "sigma must be a finite number > 0"),
    ({"sigma": float("nan")}, "sigma must be"),
    ({"sigma": 0.25, "alpha": 1.0}, "alpha must be a number strictly between 0 and 1"),
    ({"sigma": 0.25, "n0": 0}, "n0 must be an integer >= 1"),
    ({"sigma": 0.25, "batch_size": 2.5}, "batch_size must be an integer"),
    ({"sigma": 0.25, "batching": "yes"}, 'batching must be true, false or "auto"'),
    ({"sigma": 0.25, "overlap": 1}, 'overlap must be true, false or "auto"'),
    ({"sigma": 0.25, "forward_batch": 0}, 'forward_batch must be an integer >= 1 or "auto"'),
    ({"sigma": 0.25, "forward_batch": "big"}, 'forward_batch must be an integer >= 1 or "auto"'),
    ({"sigma": 0.25, "forward_nice": 20}, 'forward_nice must be an integer from 0 to 19 or "auto"'),
    ({"sigma": 0.25, "forward_nice": -1}, 'forward_nice must be an integer from 0 to 19 or "auto"'),
    ({"sigma": 0.25, "forward_nice": True}, 'forward_nice must be an integer from 0 to 19 or "auto"'),
    ({"sigma": 0.25, "chunk_samples": 2000}, "chunk_samples = 2000 exceeds batch_size"),
    ({"sigma": 0.25, "sigmaa": 1}, "unknown setting"),
    ({"sigma": 0.25, "noise_key": "too-short-a-secret"}, "noise_key must be a secret string of at least 32"),
    ({"sigma": 0.25, "noise_key": 12345}, "noise_key must be a secret string"),
    ({"sigma": 0.25, "round_samples": 0}, "round_samples must be an integer >= 1"),
    ({"sigma": 0.25, "max_queued_requests": True}, "max_queued_requests must be an integer >= 1"),
    ({"sigma": 0.25, "max_request_samples": 1.5}, "max_request_samples must be an integer >= 1"),
])
def test_config_refuses_bad_values(raw, message):
    with pytest.raises(UserError, match=message):
        validate_config(raw, "test.toml")


def test_noise_key_is_never_shown():
    config = validate_config({"sigma": 0.25, "noise_key": "s3cr3t" * 8}, "test")
    assert config.noise_key == "s3cr3t" * 8 and "s3cr3t" not in repr(config)


def test_config_file_errors_name_the_file(tmp_path):
    (tmp_path / "serving.toml").write_text("sigma = [")
    with pytest.raises(UserError, match="serving.toml: not valid TOML"):
        load_config(tmp_path)
    (tmp_path / "serving.json").write_text(json.dumps({"sigma": 0.5}))
    with pytest.raises(UserError, match="both"):
        load_config(tmp_path)
    (tmp_path / "serving.toml").unlink()
    assert load_config(tmp_path).sigma == 0.5
    (tmp_path / "serving.json").write_text(json.dumps({"sigma": 0.5, "classifier": "../elsewhere"}))
    with pytest.raises(UserError, match="outside the model directory"):
        load_model_dir(tmp_path)


# ------------------------------------------------------------------------------------------------ validation

CONFIG = ServingConfig(sigma=0.25, n=100, max_n=500, max_images=4, allow_client_seed=False)


@pytest.mark.parametrize("payload, message", [
    ({"images": [np.zeros(784).tolist()]}, r"shape \[784\].*never reshaped"),
    ({"images": [np.zeros((28, 28)).tolist()]}, r"shape \[28, 28\]"),
    ({"images": [np.zeros((3, 28, 28)).tolist()]}, r"shape \[3, 28, 28\]"),
    ({"images": np.zeros(784).tolist()}, "wrap it"),
    ({"images": [[[[0.5] * 28] * 27 + [[0.5] * 27]]]}, "ragged or non-numeric"),
    ({"images": [[[["a"] * 28] * 28]]}, "ragged or non-numeric"),
    ({"images": [np.full(SHAPE, np.nan).tolist()]}, "NaN or infinite"),
    ({"images": [np.full(SHAPE, np.inf).tolist()]}, "NaN or infinite"),
    ({"images": [np.full(SHAPE, 1.5).tolist()]}, r"\[0, 1\], got \[1.5, 1.5\]"),
    ({"images": [np.full(SHAPE, -0.1).tolist()]}, r"\[0, 1\]"),
    ({"images": [np.zeros(SHAPE).tolist()] * 5}, "at most 4"),
    ({"images": []}, "no images"),
    ({"images": [np.zeros(SHAPE).tolist()], "n": 501}, r"1\.\.500"),
    ({"images": [np.zeros(SHAPE).tolist()], "n": "100"}, "integer"),
    ({"images": [np.zeros(SHAPE).tolist()], "seed": 1}, "does not accept client seeds"),
    ({"images": [np.zeros(SHAPE).tolist()], "extra": 1}, "unknown field"),
])
def test_json_validation_refuses_with_a_clear_message(payload, message):
    with pytest.raises(RequestError, match=message) as info:
        parse_payload(payload, CONFIG, SHAPE)
    assert info.value.status == 400


def test_json_validation_accepts_and_keeps_values():
    image = np.random.default_rng(0).random(SHAPE)
    request = parse_payload({"images": [image.tolist()], "n": 300}, CONFIG, SHAPE)
    assert request.images.shape == (1, *SHAPE) and request.images.dtype == torch.float32
    assert request.n == 300 and request.seed is None
    assert torch.allclose(request.images[0].double(), torch.from_numpy(image), atol=1e-7)


def test_image_decoding():
    pixels = np.arange(784, dtype=np.uint8).reshape(28, 28)
    decoded = decode_image(png_bytes(pixels), 0, "a.png", SHAPE)
    assert torch.equal(decoded, torch.from_numpy(pixels).float().div(255).unsqueeze(0))
    assert decode_image(png_bytes(pixels, fmt="JPEG"), 0, "", SHAPE).shape == SHAPE
    rgb = png_bytes(np.zeros((28, 28, 3), np.uint8), mode="RGB")
    assert decode_image(rgb, 0, "", (3, 28, 28)).shape == (3, 28, 28)
    for data, message in [(b"not an image", "could not be decoded"), (png_bytes(pixels)[:60], "could not be decoded"),
                          (png_bytes(np.zeros((27, 28), np.uint8)), "28x27 pixels.*never resized"),
                          (rgb, "colour mode RGB, the model takes 1-channel"),
                          (png_bytes(pixels, fmt="BMP"), "only PNG and JPEG")]:
        with pytest.raises(RequestError, match=message):
            decode_image(data, 0, "a.png", SHAPE)


# ------------------------------------------------------------------------------------------------ engine

def test_vote_counter_matches_smooth_sample_counts(smooth, digits):
    x = digits[0][0]
    jobs = [NoiseJob(x, 37, 11), NoiseJob(x, 150, 12), NoiseJob(digits[0][1], 5, 13)]
    counts = VoteCounter(smooth)(jobs)  # one shared pass over 192 samples, split in batches of 100
    for job, job_counts in zip(jobs, counts, strict=True):
        expected = smooth.sample_counts(job.image, job.num_samples, smooth.generator(job.seed))
        np.testing.assert_array_equal(job_counts, expected)


def test_a_pass_counts_every_job_in_one_table(smooth):
    """``counts_per_job``: the counts of each job's run of predictions, equal to a bincount per job."""
    counter = VoteCounter(smooth)
    rng = np.random.default_rng(0)
    for sizes in ([1], [3, 1, 7], [50, 200, 1, 13, 64], [9] * 20):
        predictions = torch.as_tensor(rng.integers(0, smooth.num_classes, size=sum(sizes)))
        table = counter.counts_per_job(predictions, sizes)
        assert table.shape == (len(sizes), smooth.num_classes) and table.dtype == np.int64
        for row, part in zip(table, predictions.split(sizes), strict=True):
            np.testing.assert_array_equal(row, counter.counts(part))


def test_a_pass_copies_the_images_it_still_draws_from_to_the_device_at_once(smooth, digits, monkeypatch):
    """``on_device``: one stacked copy of each host image whose noise the pass still draws (a drawn piece's image is
    not copied again; images already on the device are not copied), keyed by the host image's id."""
    first, second, third = digits[0][:3]
    counter = VoteCounter(smooth)
    drawn = NoisePiece(second, 8, smooth.generator(1))
    drawn.samples(smooth)
    fresh = NoisePiece(third, 8, smooth.generator(2))
    jobs = [NoiseJob(first, 5, 3), StreamJob(drawn, 0, 4), StreamJob(fresh, 0, 4), StreamJob(fresh, 4, 4)]
    assert counter.on_device(jobs) == {}  # on this device already
    monkeypatch.setattr(smooth, "device", torch.device("meta"))
    copied = counter.on_device(jobs)
    assert set(copied) == {id(first), id(third)}
    assert all(image.device.type == "meta" and image.shape == first.shape for image in copied.values())


def test_jobs_never_share_draws():
    plan = plan_jobs(torch.zeros(2, *SHAPE), [5, 6], n0=30, n=250, chunk_samples=100)
    assert [(i, p, j.num_samples) for i, p, j in plan][:4] == [(0, 0, 30), (0, 1, 100), (0, 1, 100), (0, 1, 50)]
    seeds = [j.seed for _, _, j in plan]
    assert len(set(seeds)) == len(seeds) == 8
    assert job_seed(5, 0, 0) == seeds[0] and job_seed(6, 0, 0) == seeds[4] and job_seed(7, 0, 0) not in seeds


def test_certify_work_takes_whole_jobs_within_a_round():
    work = CertifyWork(torch.zeros(1, *SHAPE), [1], n0=30, n=250, alpha=0.001, sigma=0.25, num_classes=10,
                       chunk_samples=100)
    sizes = [[job.num_samples for _, job in work.take(200)] for _ in range(3)]
    assert sizes == [[30, 100], [100, 50], []] and work.samples_left == 0 and not work.finished
    assert [job.num_samples for _, job in CertifyWork(torch.zeros(1, *SHAPE), [1], 30, 250, 0.001, 0.25, 10,
                                                      100).take(10)] == [30]  # at least one job per round



def test_certify_work_derives_each_seed_when_its_job_is_taken(monkeypatch):
    """Building the work of a request derives no seed (admission may still refuse it, and a 16-image request at
    n = 10,000 has 1,616 jobs); the jobs handed out are plan_jobs' jobs, in its order, whatever the round size."""
    from serving.compute import engine

    images = torch.rand(3, *SHAPE)
    expected = [((i, p), job) for i, p, job in plan_jobs(images, [5, 6, 7], n0=30, n=250, chunk_samples=100)]
    derived = []
    monkeypatch.setattr(engine, "job_seed", lambda *args: derived.append(args) or job_seed(*args))
    work = CertifyWork(images, [5, 6, 7], n0=30, n=250, alpha=0.001, sigma=0.25, num_classes=10, chunk_samples=100)
    assert derived == [] and work.planned_samples == 3 * 280
    taken = []
    for max_samples in (200, 1, 350, 100, 10**6):
        taken += work.take(max_samples)
    assert len(derived) == len(taken) == len(expected) == 12 and work.samples_left == 0
    for (key, job), (want_key, want) in zip(taken, expected, strict=True):
        assert key == want_key and job.num_samples == want.num_samples and job.seed == want.seed
        assert torch.equal(job.image, want.image)
    with pytest.raises(ValueError, match="3 images but 2 image seeds"):
        CertifyWork(images, [5, 6], 30, 250, 0.001, 0.25, 10, 100)

# ------------------------------------------------------------------------------------------------ middlewares

async def _ok_app(scope, receive, send):
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(len(body)).encode()})


def _client(app):
    from starlette.testclient import TestClient

    return TestClient(app)


def test_api_key_middleware():
    client = _client(ApiKeyMiddleware(_ok_app, api_key=API_KEY.encode()))
    assert client.post("/predict").status_code == 401
    refused = client.post("/predict", headers={"Authorization": "Bearer " + "x" * 32})
    assert refused.status_code == 401 and "invalid API key" in refused.json()["error"]
    assert client.post("/predict", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert client.post("/predict", headers={"X-API-Key": API_KEY}).status_code == 200
    for path in ("/healthz", "/livez", "/readyz", "/metrics"):
        assert client.get(path).status_code == 200
    assert client.get("/metadata").status_code == 401 and client.get("/").status_code == 401
    open_client = _client(ApiKeyMiddleware(_ok_app, from_env=False))
    assert open_client.post("/predict").status_code == 200


def test_api_key_refuses_a_prefix_an_empty_key_and_one_more_character():
    """Only the whole key is accepted: its prefixes (the empty one included), the key with a character more, and
    the key with its last character changed are refused, in both headers and by ``key_accepted`` itself (which the
    front door also asks)."""
    key = API_KEY.encode()
    near_misses = [b"", key[:1], key[:-1], key + b"x", key + key, key[:-1] + b"X", b" " + key[1:]]
    assert key_accepted(key, key) and not key_accepted(None, key)
    assert not any(key_accepted(given, key) for given in near_misses)
    client = _client(ApiKeyMiddleware(_ok_app, api_key=key))
    for given in near_misses:
        for headers in ({"X-API-Key": given.decode()}, {"Authorization": "Bearer " + given.decode()}):
            refused = client.post("/predict", headers=headers)
            assert refused.status_code == 401 and "API key" in refused.json()["error"], (given, headers)
    assert client.post("/predict", headers={"X-API-Key": API_KEY}).status_code == 200


def test_api_key_from_env_refuses_short_keys(monkeypatch):
    monkeypatch.setenv("TRANSDENOISER_API_KEY", "short")
    with pytest.raises(UserError, match="shorter than 16"):
        ApiKeyMiddleware(_ok_app)


def test_payload_limit_middleware():
    client = _client(PayloadLimitMiddleware(_ok_app, max_bytes=1000, max_parsing=8, max_parsing_small=8))
    assert client.post("/predict", content=b"x" * 1000).text == "1000"
    too_big = client.post("/predict", content=b"x" * 1001)
    assert too_big.status_code == 413 and "max_payload_bytes" in too_big.json()["error"]
    chunked = client.post("/predict", content=iter([b"x" * 600, b"x" * 600]))  # no Content-Length
    assert chunked.status_code == 413


# ------------------------------------------------------------------------------------------------ the service

@pytest.fixture(scope="module")
def service_client(model_dir):
    with in_process_service(model_dir) as client:
        yield client


def test_start_up_objects_are_frozen(service_client):
    """After its warm-up the service moves the start-up's objects out of the garbage collector's full collections
    (transdenoiser.runtime.freeze_start_up_objects): the torch, BentoML and model objects, over 100,000."""
    import gc

    assert service_client.get("/readyz").status_code == 200
    assert gc.get_freeze_count() > 100_000


def test_requests_leave_no_timer_behind(service_client):
    """BentoML's request timeout (600 s) no longer leaves a timer, holding the request's context, per request
    (serving.library_patches.cancel_request_timers): 200 probes leave no timer due in more than 5 minutes."""
    import asyncio

    async def long_timers() -> int:
        loop = asyncio.get_running_loop()
        return sum(not handle.cancelled() and handle.when() - loop.time() > 300 for handle in loop._scheduled)

    before = service_client.portal.call(long_timers)
    for path in ("/livez", "/readyz") * 100:
        assert service_client.get(path).status_code == 200
    assert service_client.portal.call(long_timers) <= before


def test_service_predicts_json_and_png(service_client, digits):
    x, y = digits
    response = service_client.post("/predict", json={"images": x[:2].tolist(), "n": 200, "seed": 4})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["seed"] == 4 and body["seed_source"] == "client"
    for prediction, label in zip(body["predictions"], y[:2], strict=True):
        assert prediction["label"] == int(label) and prediction["class_name"] == str(int(label))
        assert prediction["certified_radius"] > 0 and not prediction["abstained"]
        assert (prediction["n0"], prediction["n"], prediction["sigma"], prediction["alpha"]) == (20, 200, 0.25, 0.001)
        assert 0.5 < prediction["p_lower"] < 1
    again = service_client.post("/predict", json={"images": x[:2].tolist(), "n": 200, "seed": 4}).json()
    assert again == body  # same seed, same certificates
    png = png_bytes((x[2, 0].numpy() * 255).round().astype(np.uint8))
    upload = service_client.post("/predict", files=[("images", ("d.png", png, "image/png"))], data={"n": "100"})
    assert upload.status_code == 200, upload.text
    assert upload.json()["predictions"][0]["label"] == int(y[2]) and upload.json()["seed_source"] == "server"


def test_service_refuses_bad_requests_with_json_4xx(service_client):
    nan_body = json.dumps({"images": [np.full(SHAPE, np.nan).tolist()]})
    cases = [
        dict(content=nan_body, headers={"content-type": "application/json"}),
        dict(json={"images": [np.zeros(784).tolist()]}),
        dict(json={"images": [np.full(SHAPE, 2.0).tolist()]}),
        dict(files=[("images", ("x.png", b"garbage", "image/png"))]),
        dict(files=[("images", ("x.png", png_bytes(np.zeros((28, 28, 3), np.uint8), "RGB"), "image/png"))]),
        dict(files=[("images", (f"{i}.png", png_bytes(np.zeros((28, 28), np.uint8)), "image/png")) for i in range(5)]),
        dict(content=b"x" * 200_001, headers={"content-type": "application/json"}),
        dict(content=b"images", headers={"content-type": "text/plain"}),
    ]
    statuses = []
    for case in cases:
        response = service_client.post("/predict", **case)
        assert 400 <= response.status_code < 500 and response.json()["error"], response.text
        statuses.append(response.status_code)
    assert statuses[-2:] == [413, 415]
    assert service_client.get("/readyz").status_code == 200


def test_service_concurrent_requests_with_a_bad_one(service_client, digits):
    x, y = digits
    results = {}

    def call(index):
        payload = {"images": [np.full(SHAPE, np.inf).tolist() if index == 3 else x[index].tolist()], "n": 100}
        results[index] = service_client.post("/predict", content=json.dumps(payload),
                                             headers={"content-type": "application/json"})

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert results[3].status_code == 400
    for i in (0, 1, 2, 4, 5):
        assert results[i].status_code == 200 and results[i].json()["predictions"][0]["label"] == int(y[i])


def test_service_metadata_card(service_client):
    card = service_client.post("/metadata").json()
    assert card["classifier"]["architecture"] == "cnn28"
    assert set(card["classifier"]["dataset"]["fingerprints"]) == {"public", "test"}  # never the private split's
    assert card["denoiser"] is None and "no differential-privacy claim" in card["privacy"]["statement"]
    assert card["certification"]["n0"] == 20 and card["certification"]["alpha"] == 0.001
    assert {k: card["limits"][k] for k in ("max_images", "max_payload_bytes", "max_n")} == {
        "max_images": 4, "max_payload_bytes": 200_000, "max_n": 500}
    assert card["limits"]["max_request_samples"] > 0 and card["limits"]["max_queued_requests"] > 0
    assert "HMAC" in card["certification"]["noise"]
    assert "wrong together with probability at most alpha" in card["certification"]["guarantee"]
    assert card["certification"]["adaptive_requests"]["default_budget"] == 500  # the server's max_n
    from serving.service import shared_rule  # the card names the confidence sequence the server's rules use
    served = {shared_rule(kind, 0.25, 500, 0.001, radius).cs.name for kind, radius in (("decide", 0.5),
                                                                                        ("estimate", None))}
    assert len(served) == 1 and served.pop() in card["certification"]["adaptive_requests"]["method"]


def test_epsilon_statements_name_their_analysis():
    report = {"arm": "sepdp", "delta": 1e-5, "guarantees": [
        {"name": "sepdp", "label": "DP-SGD", "data_independent": True,
         "epsilon": {"rdp": 3.2, "pld": 2.9, "gdp_epsilon": 2.5, "delta": 1e-5, "analyses": {"rdp": "RDP label"}}}]}
    statements = epsilon_statements(report)
    assert [(s["analysis"], s["epsilon"], s["delta"]) for s in statements] == [
        ("sepdp/rdp", 3.2, 1e-5), ("sepdp/pld", 2.9, 1e-5), ("sepdp/gdp_epsilon", 2.5, 1e-5)]
    assert statements[0]["accountant"] == "RDP label"
    assert [s["data_independent"] for s in statements] == [True, True, False]  # GDP is an approximation


def test_serve_cli_checks_before_starting(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRANSDENOISER_API_KEY", raising=False)
    port = free_port()
    assert cli_main(["serve", "--model-dir", str(model_dir), "--port", str(port), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"bentoml serve serving.service:TransDenoiser --host 127.0.0.1 --port {port}" in out
    assert f"TRANSDENOISER_MODEL_DIR={model_dir.resolve()}" in out
    assert cli_main(["serve", "--model-dir", str(tmp_path / "missing"), "--dry-run"]) == 2
    assert "no such directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["serve", "--port", "70000"])


def test_batching_auto_is_adaptive_on_gpu_only():
    from serving.config import validate_config

    auto = validate_config({"sigma": 0.25}, "test")
    assert auto.batching == "auto"
    assert auto.batching_on("cuda") and not auto.batching_on("cpu")
    forced = validate_config({"sigma": 0.25, "batching": True}, "test")
    assert forced.batching_on("cpu") and forced.batching_on("cuda")
    off = validate_config({"sigma": 0.25, "batching": False}, "test")
    assert not off.batching_on("cuda")
    # overlap is off unless set; "auto" follows batching
    assert not auto.overlap_on("cuda") and not auto.overlap_on("cpu") and not forced.overlap_on("cpu")
    follows = validate_config({"sigma": 0.25, "overlap": "auto"}, "test")
    assert follows.overlap_on("cuda") and not follows.overlap_on("cpu")
    assert not validate_config({"sigma": 0.25, "batching": False, "overlap": "auto"}, "test").overlap_on("cuda")
    assert not validate_config({"sigma": 0.25, "overlap": False}, "test").overlap_on("cuda")
    assert validate_config({"sigma": 0.25, "batching": False, "overlap": True}, "test").overlap_on("cpu")


def test_switch_interval_auto_is_shorter_on_gpu_only():
    from serving.config import CUDA_SWITCH_INTERVAL_US, validate_config

    auto = validate_config({"sigma": 0.25}, "test")
    assert auto.switch_interval_us_on("cuda") == CUDA_SWITCH_INTERVAL_US < 5000  # Python's own is 5,000 us
    assert auto.switch_interval_us_on("cpu") is None  # left as Python sets it
    assert validate_config({"sigma": 0.25, "switch_interval_us": 2000}, "test").switch_interval_us_on("cpu") == 2000
    for bad in (0, -1, 1.5, True, "fast"):
        with pytest.raises(UserError, match='switch_interval_us must be an integer >= 1 or "auto"'):
            validate_config({"sigma": 0.25, "switch_interval_us": bad}, "test")


def test_forward_batch_auto_is_cache_sized_on_cpu_only():
    from serving.config import CPU_FORWARD_BATCH, validate_config

    auto = validate_config({"sigma": 0.25, "batch_size": 500}, "test")
    assert auto.forward_batch_on("cpu") == CPU_FORWARD_BATCH and auto.forward_batch_on("cuda") == 500
    assert validate_config({"sigma": 0.25, "batch_size": 50, "chunk_samples": 50}, "t").forward_batch_on("cpu") == 50
    assert validate_config({"sigma": 0.25, "forward_batch": 300}, "test").forward_batch_on("cpu") == 300


def test_round_samples_auto_is_shorter_on_cpu():
    from serving.config import CPU_ROUND_SAMPLES, ROUND_SAMPLES, validate_config

    auto = validate_config({"sigma": 0.25}, "test")
    assert auto.round_samples == "auto" and (CPU_ROUND_SAMPLES, ROUND_SAMPLES) == (100, 200)
    assert auto.round_samples_on("cpu") == 100 and auto.round_samples_on("cuda") == 200
    assert validate_config({"sigma": 0.25, "round_samples": 300}, "test").round_samples_on("cpu") == 300
    for bad in (0, True, 1.5, "fast"):
        with pytest.raises(UserError, match='round_samples must be an integer >= 1 or "auto"'):
            validate_config({"sigma": 0.25, "round_samples": bad}, "test")


def test_max_parsing_requests_auto_is_one_per_core_plus_one_at_least_three(monkeypatch):
    from serving import config as config_module
    from serving.config import validate_config

    auto = validate_config({"sigma": 0.25}, "test")
    for cores, slots in ((1, 3), (2, 3), (3, 4), (16, 17)):
        monkeypatch.setattr(config_module, "available_cores", lambda cores=cores: cores)
        assert auto.parsing_slots() == slots
    assert validate_config({"sigma": 0.25, "max_parsing_requests": 9}, "test").parsing_slots() == 9
    for bad in (0, False, 2.5, "many"):
        with pytest.raises(UserError, match='max_parsing_requests must be an integer >= 1 or "auto"'):
            validate_config({"sigma": 0.25, "max_parsing_requests": bad}, "test")


def test_forward_nice_auto_lowers_the_passes_on_cpu_only():
    from serving.config import CPU_FORWARD_NICE, validate_config

    auto = validate_config({"sigma": 0.25}, "test")
    assert auto.forward_nice_on("cpu") == CPU_FORWARD_NICE > 0 and auto.forward_nice_on("cuda") == 0
    assert validate_config({"sigma": 0.25, "forward_nice": 0}, "test").forward_nice_on("cpu") == 0
    assert validate_config({"sigma": 0.25, "forward_nice": 19}, "test").forward_nice_on("cuda") == 19
