"""Promises of docs/SERVING.md that no other test guards:

- "The service abstains (label: null, radius 0) when pA < 1/2": a request's counts go through the real
  ``CertifyWork`` and the service's answer builder; pA is the one-sided Clopper-Pearson bound computed here
  from scipy's beta quantile, and a certified answer's radius is sigma * Phi^-1(pA);
- the probes stay open without the API key on their "exact paths only": a path that merely starts with, or
  extends, a probe's path needs the key; and the key check sits outside the body limit (401 before 413, through
  the middleware stack BentoML builds for the service);
- ``/metadata`` never shows ``noise_key``; a denoiser without a privacy report gets "no DP claim" and no epsilon;
- ``transdenoiser serve`` warns when it binds beyond loopback without an API key, and when the model directory's
  sigma differs from the sigma its denoiser was trained at.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import beta, norm

from serving.bundle import load_model_dir, write_model_dir
from tests.conftest import serve_dry_run
from transdenoiser.cli import main as cli_main

SHAPE = (1, 28, 28)
SECRET = "noise-key-" + "x7Q2" * 10  # 50 characters


def one_sided_cp_lower(k: int, n: int, alpha: float) -> float:
    """The (1 - alpha) lower Clopper-Pearson bound: the alpha quantile of Beta(k, n - k + 1), 0 when k = 0."""
    return 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))


def answers_for(estimation_votes: list[int], n0=100, n=1000, alpha=0.001, sigma=0.25):
    """The service's predictions for images whose selection samples all vote for class 3 and whose
    estimation samples give ``votes`` to class 3 (the rest to class 5), through CertifyWork and TransDenoiser."""
    from serving.compute.engine import ESTIMATION, SELECTION, CertifyWork
    from serving.service import TransDenoiser

    images = torch.zeros((len(estimation_votes), *SHAPE))
    work = CertifyWork(images, list(range(len(estimation_votes))), n0, n, alpha, sigma, num_classes=10,
                       chunk_samples=100)
    handed_out = {}  # (image, phase) -> samples handed out
    while work.samples_left:
        for key, job in work.take(300):
            handed_out[key] = handed_out.get(key, 0) + job.num_samples
            index, phase = key
            counts = np.zeros(10, dtype=np.int64)
            if phase == SELECTION:
                counts[3] = job.num_samples
            else:  # spread this image's votes for class 3 over its estimation jobs
                before = handed_out[key] - job.num_samples
                share = min(job.num_samples, max(0, estimation_votes[index] - before))
                counts[3], counts[5] = share, job.num_samples - share
            work.add(key, counts)
    assert work.finished and all(handed_out[(i, SELECTION)] == n0 and handed_out[(i, ESTIMATION)] == n
                                 for i in range(len(estimation_votes)))
    service = SimpleNamespace(class_names=[f"class-{c}" for c in range(10)],
                              config=SimpleNamespace(sigma=sigma, alpha=alpha))
    return [TransDenoiser.inner._prediction(service, certificate, seed).model_dump()
            for seed, certificate in enumerate(work.result())]


def test_abstains_with_null_label_and_zero_radius_when_the_bound_is_below_one_half():
    n, alpha, sigma = 1000, 0.001, 0.25
    votes = [549, 550, 900]  # p_lower just below 1/2, just above 1/2, far above
    lowers = [one_sided_cp_lower(k, n, alpha) for k in votes]
    assert lowers[0] < 0.5 < lowers[1] < lowers[2]  # the test's premise, from scipy alone
    abstained, barely, clear = answers_for(votes, n=n, alpha=alpha, sigma=sigma)
    assert abstained["abstained"] is True and abstained["label"] is None and abstained["class_name"] is None
    assert abstained["certified_radius"] == 0.0
    for answer, k, lower in ((barely, votes[1], lowers[1]), (clear, votes[2], lowers[2])):
        assert answer["abstained"] is False and answer["label"] == 3 and answer["class_name"] == "class-3"
        assert answer["p_lower"] == pytest.approx(lower, rel=1e-9) and answer["count"] == k
        assert answer["certified_radius"] == pytest.approx(sigma * norm.ppf(lower), rel=1e-9)
    for answer in (abstained, barely, clear):
        assert (answer["n0"], answer["n"], answer["samples"]) == (100, n, 100 + n)


def test_probes_are_open_on_their_exact_paths_only():
    from starlette.testclient import TestClient

    from serving.auth import ApiKeyMiddleware

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    client = TestClient(ApiKeyMiddleware(app, api_key=b"k" * 32))
    for path in ("/healthz", "/livez", "/readyz", "/metrics"):
        assert client.get(path).status_code == 200, path
        for near in (path + "/", path + "x", path + "/../metadata", path.upper(), "/api" + path):
            assert client.get(near).status_code == 401, near
    assert client.get("/metadata", headers={"X-API-Key": "k" * 32}).status_code == 200


# ----------------------------------------------------------------------------------------------- model directories

@pytest.fixture(scope="module")
def checkpoints(random_classifier_dir, tmp_path_factory):
    """A random cnn28 classifier and a random tiny denoiser trained "at sigma 0.25" with no privacy report."""
    from training.checkpoint import save_checkpoint
    from training.models import build_model

    root = tmp_path_factory.mktemp("doc_serving")
    torch.manual_seed(0)
    classifier = random_classifier_dir
    denoiser_kwargs = {"in_channels": 1, "width": 2}
    denoiser = save_checkpoint(root / "denoiser", build_model("tiny", **denoiser_kwargs),
                               {"kind": "denoiser", "architecture": "tiny", "arch_kwargs": denoiser_kwargs,
                                "input_shape": [1, 28, 28], "sigma": 0.25})
    return classifier, denoiser


def test_model_card_never_shows_the_noise_key_and_claims_nothing_without_a_report(checkpoints, tmp_path):
    from serving.card import NO_REPORT, model_card

    classifier, denoiser = checkpoints
    model_dir = write_model_dir(tmp_path / "model", classifier, denoiser, sigma=0.25, noise_key=SECRET)
    bundle = load_model_dir(model_dir)
    assert bundle.config.noise_key == SECRET  # the key is set and in use...
    card = json.dumps(model_card(bundle, "cpu", "one round per pass"))
    assert SECRET not in card and "x7Q2" not in card  # ...and no part of it is on the card
    privacy = json.loads(card)["privacy"]
    assert privacy["statement"] == NO_REPORT and "no differential-privacy claim" in privacy["statement"]
    assert privacy["epsilons"] == [] and privacy["report"] is None  # nothing invented


def test_serve_warns_beyond_loopback_without_a_key_and_on_a_sigma_mismatch(checkpoints, tmp_path, capsys, monkeypatch):
    classifier, denoiser = checkpoints
    model_dir = write_model_dir(tmp_path / "model", classifier, denoiser, sigma=0.25)
    monkeypatch.delenv("TRANSDENOISER_API_KEY", raising=False)
    assert cli_main(serve_dry_run(model_dir)) == 0 and "warning" not in capsys.readouterr().err  # 127.0.0.1
    assert cli_main(serve_dry_run(model_dir, "--host", "::1")) == 0 and "warning" not in capsys.readouterr().err
    assert cli_main(serve_dry_run(model_dir, "--host", "0.0.0.0")) == 0
    assert "warning: listening on 0.0.0.0 without an API key" in capsys.readouterr().err
    monkeypatch.setenv("TRANSDENOISER_API_KEY", "a-long-enough-key-" + "9" * 10)
    assert cli_main(serve_dry_run(model_dir, "--host", "0.0.0.0")) == 0 and "warning" not in capsys.readouterr().err

    mismatched = write_model_dir(tmp_path / "mismatched", classifier, denoiser, sigma=0.5)
    assert cli_main(serve_dry_run(mismatched)) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "0.5" in err and "0.25" in err


def test_requests_without_the_key_are_refused_before_the_body_limit(checkpoints, tmp_path, monkeypatch):
    """"The middleware ... sits outside the body limit, so requests without a key are refused before their
    bodies are read": through the middleware stack BentoML builds for the real service, an oversized body
    without the key gets 401 (the key check), with the key 413 (the body limit)."""
    from starlette.testclient import TestClient

    from tests.conftest import forget_bentoml_metrics

    classifier, _ = checkpoints
    model_dir = write_model_dir(tmp_path / "model", classifier, sigma=0.25, n0=10, n=20, max_n=40, batch_size=100,
                                chunk_samples=10, max_payload_bytes=10_000)
    key = "a-long-enough-key-" + "9" * 10
    monkeypatch.setenv("TRANSDENOISER_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("TRANSDENOISER_DEVICE", "cpu")
    monkeypatch.setenv("TRANSDENOISER_API_KEY", key)
    from serving.service import TransDenoiser

    oversized = b'{"images": [' + b"0.0, " * 5_000 + b"0.0]}"  # 25 kB, over the 10 kB limit
    try:
        with TestClient(TransDenoiser.to_asgi(), raise_server_exceptions=False) as client:
            for body in (oversized, iter([oversized[:8_000], oversized[8_000:]])):  # declared length, then chunked
                refused = client.post("/predict", content=body, headers={"content-type": "application/json"})
                assert refused.status_code == 401 and "missing API key" in refused.json()["error"]
            limited = client.post("/predict", content=oversized,
                                  headers={"content-type": "application/json", "X-API-Key": key})
            assert limited.status_code == 413 and "max_payload_bytes" in limited.json()["error"]
    finally:
        forget_bentoml_metrics()
