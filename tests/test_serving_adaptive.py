"""Adaptive requests of the prediction API (``"radius": R`` decides, ``"adaptive": true`` estimates), in process
and against a real server: the scheduled certificates equal ``Smooth.decide`` / ``Smooth.certify_adaptive`` run
offline with the image's noise seed, easy images stop early, one certificate per input, validation."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
import torch

from certify.core import Smooth, sequential_rule
from serving.bundle import load_model_dir, write_model_dir
from serving.compute.counter import VoteCounter
from serving.compute.engine import SequentialWork
from serving.compute.refusals import BudgetExceeded
from serving.compute.scheduler import FairScheduler
from serving.process import ServerProcess
from serving.validation import RequestError, form_bool, form_radius, parse_payload
from tests.conftest import in_process_service
from tests.test_serving_server import START_TIMEOUT_S, png

SHAPE = (1, 28, 28)
SIGMA, N0, ALPHA = 0.25, 20, 0.001


@pytest.fixture(scope="module")
def model_dir(classifier_dir, tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("adaptive") / "model", classifier_dir, sigma=SIGMA, n0=N0, n=100,
                           max_n=2000, max_images=4, max_payload_bytes=200_000, allow_client_seed=True,
                           round_samples=150, chunk_samples=50)


@pytest.fixture(scope="module")
def smooth(model_dir):
    pipeline = load_model_dir(model_dir).pipeline
    return Smooth(pipeline.classifier, pipeline.num_classes, SIGMA, batch_size=100)


@pytest.fixture(scope="module")
def digits(mnist10k):
    x, y = mnist10k.test.tensors()
    first = [int(np.flatnonzero(y.numpy() == label)[0]) for label in range(4)]
    return x[first], y[first]


def images_easy_and_hard(digits) -> torch.Tensor:
    """Two digits and a blend of two others (an image the classifier is unsure of)."""
    x, _ = digits
    return torch.stack([x[0], x[1], 0.5 * (x[2] + x[3])])


def offline_decided_and_estimated(smooth, images, seeds, budget: int) -> list:
    """``Smooth.decide`` at R = 0.5, then ``Smooth.certify_adaptive``, of each image with its seed."""
    offline = [smooth.decide(image, 0.5, N0, budget, ALPHA, smooth.generator(seed))
               for image, seed in zip(images, seeds, strict=True)]
    return offline + smooth.certify_adaptive_many(images, N0, budget, ALPHA, [smooth.generator(seed) for seed in seeds])


def scheduled(smooth, works, share_passes: bool, round_samples: int = 120):
    scheduler = FairScheduler(VoteCounter(smooth), round_samples=round_samples, pass_samples=300,
                              share_passes=share_passes, max_queued=8)

    async def run():
        return await asyncio.gather(*(scheduler.run(w, 120, 100_000) for w in works))

    return asyncio.run(run()), scheduler


def test_scheduled_answers_equal_the_offline_adaptive_functions(smooth, digits):
    """Two requests share passes (jobs of both in one pass), rounds cut looks into several passes."""
    images = images_easy_and_hard(digits)
    seeds = [11, 12, 13]
    budget = 1000
    decide = sequential_rule("decide", SIGMA, budget, ALPHA, radius=0.5)
    estimate = sequential_rule("estimate", SIGMA, budget, ALPHA)
    works = [SequentialWork("decide", images, seeds, N0, decide, SIGMA, 10, 50, smooth.generator),
             SequentialWork("estimate", images, seeds, N0, estimate, SIGMA, 10, 50, smooth.generator)]
    (decided, estimated), scheduler = scheduled(smooth, works, share_passes=True)
    # offline: one generator per image seeded with its noise seed, Smooth's own rounds (certify.core)
    offline_decided = [smooth.decide(image, 0.5, N0, budget, ALPHA, smooth.generator(seed))
                       for image, seed in zip(images, seeds, strict=True)]
    offline_estimated = smooth.certify_adaptive_many(images, N0, budget, ALPHA,
                                                     [smooth.generator(seed) for seed in seeds])
    assert decided == offline_decided and estimated == offline_estimated
    certified = [c for c in decided[:2] if c.outcome == "certified"]  # both outcomes are exercised:
    assert certified and all(c.prediction in digits[1][:2].tolist() for c in certified)
    assert decided[2].outcome != "certified"  # the blend is not certified at 0.5
    # only the blocks the tests looked into were computed: nothing past the stopping look's block was drawn
    assert scheduler.stats.samples == sum(c.n0 + c.computed for c in decided + estimated)
    assert all(c.n <= c.computed <= 1.125 * c.n + 8 for c in decided + estimated)
    assert max(scheduler.stats.pass_sizes) > 1  # passes were in fact shared between the two requests


@pytest.mark.parametrize("overlap, pipelined", [(False, False), (True, False), (True, True)])
def test_blocks_drawn_ahead_give_the_offline_answers_and_count_what_they_evaluate(smooth, digits, overlap, pipelined):
    """With ``draw_ahead`` (the server's ``overlap``) each image's next block is handed out before its current one is
    read: every answer is still the offline one for its seed; only the samples evaluated can grow (a block drawn
    ahead for an image that then stops), and they are counted in ``computed``. The same with a pipelined counter
    (each pass launched before the last one is collected, as on CUDA; forced here on CPU)."""
    import dataclasses

    images = images_easy_and_hard(digits)
    seeds = [11, 12, 13]
    budget = 1000
    rules = {"decide": sequential_rule("decide", SIGMA, budget, ALPHA, radius=0.5),
             "estimate": sequential_rule("estimate", SIGMA, budget, ALPHA)}
    works = [SequentialWork(kind, images, seeds, N0, rule, SIGMA, 10, 50, smooth.generator, draw_ahead=True)
             for kind, rule in rules.items()]
    scheduler = FairScheduler(VoteCounter(smooth, pipelined=pipelined), round_samples=120, pass_samples=300,
                              share_passes=True, max_queued=8, overlap=overlap)
    assert scheduler.pipelined is pipelined

    async def run():
        return await asyncio.gather(*(scheduler.run(w, 120, 100_000) for w in works))

    decided, estimated = asyncio.run(run())
    offline = offline_decided_and_estimated(smooth, images, seeds, budget)
    ours = decided + estimated
    assert [dataclasses.replace(c, computed=0) for c in ours] == [dataclasses.replace(c, computed=0) for c in offline]
    assert all(c.computed >= o.computed for c, o in zip(ours, offline, strict=True))
    assert any(c.computed > o.computed for c, o in zip(ours, offline, strict=True))  # a block drawn ahead, unread
    if not overlap:  # every pass is counted before the last answer: what was computed is what the answers say
        assert scheduler.stats.samples == sum(c.n0 + c.computed for c in ours)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU check's device calls run it)")
def test_pipelined_passes_on_cuda_give_the_offline_answers(model_dir, digits):
    """On CUDA ``VoteCounter`` is pipelined: with ``overlap`` each pass is queued on the device before the last one's
    counts are read (copied to pinned host memory behind its kernels); the answers are ``Smooth.decide``'s and
    ``Smooth.certify_adaptive``'s on the same device for the same seeds."""
    import dataclasses

    pipeline = load_model_dir(model_dir).pipeline
    smooth = Smooth(pipeline.classifier, pipeline.num_classes, SIGMA, batch_size=100, device="cuda")
    images, seeds, budget = images_easy_and_hard(digits), [21, 22, 23], 1000
    works = [SequentialWork("decide", images, seeds, N0, sequential_rule("decide", SIGMA, budget, ALPHA, radius=0.5),
                            SIGMA, 10, 50, smooth.generator, draw_ahead=True),
             SequentialWork("estimate", images, seeds, N0, sequential_rule("estimate", SIGMA, budget, ALPHA), SIGMA,
                            10, 50, smooth.generator, draw_ahead=True)]
    scheduler = FairScheduler(VoteCounter(smooth), round_samples=120, pass_samples=300, share_passes=True,
                              max_queued=8, overlap=True)
    assert scheduler.pipelined

    async def run():
        return await asyncio.gather(*(scheduler.run(w, 120, 100_000) for w in works))

    decided, estimated = asyncio.run(run())
    offline = offline_decided_and_estimated(smooth, images, seeds, budget)
    assert [dataclasses.replace(c, computed=0) for c in decided + estimated] == [
        dataclasses.replace(c, computed=0) for c in offline]


def test_an_image_that_stops_drops_the_jobs_of_its_block_drawn_ahead(smooth, digits):
    """Stepped by hand: an easy image's block drawn ahead, not yet handed out when the image stops, is never handed
    out; a job of it counted after the stop changes nothing."""
    from serving.compute.engine import read_counted_blocks

    rule = sequential_rule("decide", SIGMA, 2000, ALPHA, radius=0.25)
    work = SequentialWork("decide", digits[0][:1], [5], N0, rule, SIGMA, 10, 10, smooth.generator, draw_ahead=True)
    counter = VoteCounter(smooth)
    while not work.finished:
        jobs = work.take(10)  # small takes: the block drawn ahead is queued while the current one is counted
        for (key, _), counts in zip(jobs, counter([job for _, job in jobs]), strict=True):
            work.add(key, counts)
        read_counted_blocks([work])
    (answer,) = work.result()
    offline = smooth.decide(digits[0][0], 0.25, N0, 2000, ALPHA, smooth.generator(5))
    assert answer.outcome == offline.outcome == "certified" and answer.n == offline.n
    assert work.take(10_000) == []  # nothing of the dropped block is handed out
    taken = work.samples_taken
    assert taken == N0 + answer.computed  # every sample handed out is counted as evaluated


def test_one_image_requests_with_one_rule_are_read_together(smooth, digits, monkeypatch):
    """Concurrent one-image requests with the same settings share their rule (``shared_rule``), and the scheduler
    reads the blocks counted in a pass together (``read_counted_blocks``): one rule evaluation covers several
    requests' images, and every answer is still the offline one for its seed."""
    import certify.streams as streams
    from serving.service import shared_rule

    rows = []
    original = streams.first_outcomes
    monkeypatch.setattr(streams, "first_outcomes", lambda *args: rows.append(len(args[2])) or original(*args))
    rule = shared_rule("estimate", SIGMA, 1000, ALPHA, None)
    assert shared_rule("estimate", SIGMA, 1000, ALPHA, None) is rule
    images, seeds = images_easy_and_hard(digits), [21, 22, 23]
    works = [SequentialWork("estimate", image[None], [seed], N0, rule, SIGMA, 10, 50, smooth.generator)
             for image, seed in zip(images, seeds, strict=True)]
    answers, _ = scheduled(smooth, works, share_passes=True, round_samples=2000)
    assert max(rows) == len(works)  # a reading across the three requests
    offline = smooth.certify_adaptive_many(images, N0, 1000, ALPHA, [smooth.generator(seed) for seed in seeds])
    assert [answer for (answer,) in answers] == offline


def test_an_easy_image_stops_early_and_looks_follow_the_offline_schedule(smooth, digits):
    from certify.confidence import geometric_looks

    rule = sequential_rule("decide", SIGMA, 2000, ALPHA, radius=0.25)
    work = SequentialWork("decide", digits[0][:1], [5], N0, rule, SIGMA, 10, 50, smooth.generator)
    assert work.planned_samples == N0 + 2000 and work.samples_left == N0 + 2000
    first = work.take(10_000)  # only the selection jobs are ready before any counts
    assert sum(job.num_samples for _, job in first) == N0 and work.take(10_000) == []
    stopping = SequentialWork("decide", digits[0][:1], [5], N0, rule, SIGMA, 10, 50, smooth.generator)
    ((answer,),), _ = scheduled(smooth, [stopping], share_passes=False)
    assert answer.outcome == "certified" and answer.prediction == int(digits[1][0])
    # what a deadline message reports: the samples drawn, not the budget the stop left unused
    assert stopping.samples_taken == answer.samples < stopping.planned_samples - stopping.samples_left
    assert answer.n in set(geometric_looks(2000).tolist()) and answer.n < 2000 // 2  # stopped at an early look
    # the certificate is valid at the stop: the anytime bound at that look reaches Phi(R / sigma)
    assert answer.p_lower >= rule.threshold


def test_samples_left_kept_between_changes_equals_the_sum_after_every_step(smooth, digits):
    """``samples_left`` is summed again only after a take or a reading of blocks; stepped by hand through a whole
    run (an easy image that stops early next to a harder one), it equals the sum over the running images every
    time, and reaches 0 when both have stopped."""
    from serving.compute.engine import read_counted_blocks

    rule = sequential_rule("decide", SIGMA, 2000, ALPHA, radius=0.25)
    work = SequentialWork("decide", digits[0][:2], [5, 6], N0, rule, SIGMA, 10, 50, smooth.generator)
    counter = VoteCounter(smooth)

    def summed():
        return sum(N0 + 2000 - int(taken) for taken, test in zip(work._taken, work._tests, strict=True)
                   if not test.done)

    seen = set()
    while not work.finished:
        jobs = work.take(300)
        assert work.samples_left == summed()
        for (key, _), counts in zip(jobs, counter([job for _, job in jobs]), strict=True):
            work.add(key, counts)
        read_counted_blocks([work])
        seen.add(work.samples_left)
        assert work.samples_left == summed()
    assert work.samples_left == 0 and len(seen) > 2


def test_scheduler_budget_counts_the_worst_case(smooth, digits):
    rule = sequential_rule("estimate", SIGMA, 2000, ALPHA)
    work = SequentialWork("estimate", digits[0][:2], [1, 2], N0, rule, SIGMA, 10, 50, smooth.generator)
    scheduler = FairScheduler(VoteCounter(smooth), round_samples=120, pass_samples=300, share_passes=False,
                              max_queued=8)
    with pytest.raises(BudgetExceeded, match="4040 noisy samples"):
        asyncio.run(scheduler.run(work, 60, 4000))


# ------------------------------------------------------------------------------------------------ validation

@pytest.fixture(scope="module")
def config(model_dir):
    from serving.config import load_config

    return load_config(model_dir)


def _payload(**extra):
    return {"images": [np.zeros(SHAPE).tolist()], **extra}


@pytest.mark.parametrize("extra, message", [
    ({"radius": 0}, "'radius' must be a finite number > 0"),
    ({"radius": -0.5}, "'radius' must be a finite number > 0"),
    ({"radius": float("nan")}, "'radius' must be a finite number > 0"),
    ({"radius": float("inf")}, "'radius' must be a finite number > 0"),
    ({"radius": 10 ** 400}, "'radius' must be a finite number > 0"),
    ({"radius": True}, "'radius' must be a number > 0"),
    ({"radius": "0.5"}, "'radius' must be a number > 0"),
    ({"adaptive": 1}, "'adaptive' must be true or false"),
    ({"adaptive": "true"}, "'adaptive' must be true or false"),
    ({"radius": 0.5, "adaptive": True}, "not both"),
    ({"radius": 0.7}, r"exceeds 0\.6755, the largest radius any request can certify"),  # sigma 0.25, max_n 2000
    # below the largest (0.67546) as asked, above it on the grid: the message shows the rounding
    ({"radius": 0.6755}, r"'radius' 0\.6755 \(rounded up to the 0\.001 grid: 0\.676\) exceeds 0\.6755,"),
    ({"radius": 1e300}, "the largest radius any request can certify"),
    ({"radius": 0.5, "n": 2001}, r"'n' must lie in 1..2000"),
    ({"adaptive": True, "n": 0}, r"'n' must lie in 1..2000"),
])
def test_adaptive_fields_are_validated(config, extra, message):
    with pytest.raises(RequestError, match=message) as caught:
        parse_payload(_payload(**extra), config, SHAPE)
    assert caught.value.status == 400 and "\n" not in caught.value.message


def test_adaptive_fields_are_read(config):
    decide = parse_payload(_payload(radius=0.6), config, SHAPE)
    assert (decide.kind, decide.radius, decide.n) == ("decide", 0.6, 2000)  # budget defaults to max_n
    estimate = parse_payload(_payload(adaptive=True, n=500), config, SHAPE)
    assert (estimate.kind, estimate.n, estimate.radius) == ("estimate", 500, None)
    fixed = parse_payload(_payload(adaptive=False), config, SHAPE)
    assert (fixed.kind, fixed.n) == ("certify", 100)  # fixed n keeps the server's default n
    assert form_radius("0.5") == 0.5 and form_radius("2") == 2.0 and form_radius(None) is None
    assert form_bool("true", "adaptive") is True and form_bool("false", "adaptive") is False
    for bad in ("+0.5", "0.5 ", "5e-1", ".5", "0,5", "0.5.1", "٠.5", "0"):
        with pytest.raises(RequestError, match="'radius'"):
            form_radius(bad)
    with pytest.raises(RequestError, match="true or false"):
        form_bool("1", "adaptive")


# ------------------------------------------------------------------------------------------------ service in process

@pytest.fixture(scope="module")
def service(model_dir):
    with in_process_service(model_dir) as client:
        yield client


def test_service_answers_reproduce_offline_and_duplicates_agree(service, smooth, digits):
    x, y = digits
    body = {"images": [x[0].tolist(), x[1].tolist(), x[0].tolist()], "radius": 0.5}
    response = service.post("/predict", json=body)
    assert response.status_code == 200, response.text
    first = response.json()["predictions"]
    assert first[0] == first[2]  # the same image in one request: one answer
    assert service.post("/predict", json=body).json()["predictions"] == first  # and across requests
    for prediction, image in zip(first[:2], x[:2], strict=True):
        offline = smooth.decide(image, 0.5, N0, 2000, ALPHA, smooth.generator(prediction["noise_seed"]))
        assert prediction["certified"] is True and prediction["label"] == offline.prediction
        assert (prediction["samples"], prediction["n"], prediction["count"]) == (offline.samples, offline.n,
                                                                                 offline.count)
        assert prediction["radius"] == 0.5 and prediction["n_max"] == 2000 and prediction["samples"] < N0 + 2000
    estimate = service.post("/predict", json={"images": [x[0].tolist()], "adaptive": True}).json()["predictions"][0]
    offline = smooth.certify_adaptive(x[0], N0, 2000, ALPHA, smooth.generator(estimate["noise_seed"]))
    assert estimate["certified_radius"] == pytest.approx(offline.radius) and estimate["samples"] == offline.samples
    assert "certified" not in estimate and estimate["outcome"] == "estimated" and not estimate["abstained"]
    # one image, one test: every kind, radius and n reads the image's one stream (docs/SERVING.md)
    other_radius = service.post("/predict", json={"images": [x[0].tolist()], "radius": 0.25}).json()
    fixed = service.post("/predict", json={"images": [x[0].tolist()]}).json()["predictions"][0]
    seeds = {first[0]["noise_seed"], estimate["noise_seed"], other_radius["predictions"][0]["noise_seed"],
             fixed["noise_seed"]}
    assert len(seeds) == 1
    assert fixed["samples"] == N0 + 100 and "certified" not in fixed


def test_every_budget_and_kind_continues_the_same_stream(service, smooth, digits):
    """Every request about an image reads its one stream of votes (docs/SERVING.md, "One image, one test"): asking
    again with a larger ``n`` continues one test, and each answer, fixed n included, is the offline one for that seed
    and budget (a fixed n: the ladder's highest rung certified by the votes of the first n estimation samples)."""
    from certify.adaptive import adaptive_many, sequential_rule

    x, _ = digits
    for fields, mode in (({"radius": 0.675}, "decide"), ({"adaptive": True}, "estimate"), ({}, "fixed")):
        answers = [service.post("/predict", json={"images": [x[0].tolist()], **fields, "n": n}).json()
                   ["predictions"][0] for n in (100, 500, 2000)]
        assert len({a["noise_seed"] for a in answers}) == 1, mode
        for answer, n in zip(answers, (100, 500, 2000), strict=True):
            generator = smooth.generator(answer["noise_seed"])
            if mode == "decide":
                offline = smooth.decide(x[0], 0.675, N0, n, ALPHA, generator)
            elif mode == "estimate":
                offline = smooth.certify_adaptive(x[0], N0, n, ALPHA, generator)
            else:
                rule = sequential_rule("fixed", smooth.sigma, n, ALPHA)
                offline = adaptive_many(smooth, x[0].unsqueeze(0), N0, rule, [generator])[0]
                assert answer["certified_radius"] == offline.radius and answer["n"] == n
            assert (answer["samples"], answer["count"]) == (offline.samples, offline.count), mode


def test_service_form_fields_and_refusals(service, digits):
    x, y = digits
    upload = [("images", ("d.png", png((x[1, 0].numpy() * 255).round().astype(np.uint8)), "image/png"))]
    decided = service.post("/predict", files=upload, data={"radius": "0.25", "n": "1000"})
    assert decided.status_code == 200, decided.text
    answer = decided.json()["predictions"][0]
    assert answer["label"] == int(y[1]) and answer["certified"] is True and answer["n_max"] == 1000
    estimated = service.post("/predict", files=upload, data={"adaptive": "true"})
    assert estimated.status_code == 200 and estimated.json()["predictions"][0]["n_max"] == 2000
    for data in ({"radius": "-1"}, {"radius": "1e-1"}, {"adaptive": "yes"}, {"radius": "0.5", "adaptive": "true"}):
        refused = service.post("/predict", files=upload, data=data)
        assert refused.status_code == 400 and "\n" not in refused.json()["error"], (data, refused.text)
    refused = service.post("/predict", content=json.dumps(_payload(radius=None, adaptive="yes")),
                           headers={"content-type": "application/json"})
    assert refused.status_code == 400 and "'adaptive' must be true or false" in refused.json()["error"]


# ------------------------------------------------------------------------------------------------ real server

@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    process = ServerProcess(model_dir, tmp_path_factory.mktemp("adaptive_server") / "server.log", api_key=None)
    try:
        process.wait_ready(time.monotonic() + START_TIMEOUT_S)
        yield process
    finally:
        process.stop()


@pytest.mark.server
def test_a_real_server_answers_both_adaptive_kinds(server, digits):
    x, y = digits
    with httpx.Client(base_url=server.url, timeout=120) as http:
        decided = http.post("/predict", json={"images": x[:2].tolist(), "radius": 0.5})
        assert decided.status_code == 200, decided.text
        for prediction, label in zip(decided.json()["predictions"], y[:2], strict=True):
            assert prediction["label"] == int(label) and prediction["certified"] is True
            assert N0 < prediction["samples"] < N0 + 2000 and prediction["radius"] == 0.5
        estimated = http.post("/predict", json={"images": [x[2].tolist()], "adaptive": True, "n": 1500})
        assert estimated.status_code == 200, estimated.text
        answer = estimated.json()["predictions"][0]
        assert answer["label"] == int(y[2]) and answer["certified_radius"] > 0 and answer["n_max"] == 1500
        assert N0 < answer["samples"] <= N0 + 1500 and answer["samples"] == N0 + answer["n"]
        fixed = http.post("/predict", json={"images": [x[3].tolist()], "n": 200}).json()["predictions"][0]
        assert fixed["samples"] == N0 + 200
        for bad in ({"radius": -0.5}, {"radius": "0.5"}, {"radius": True}, {"radius": 0.5, "adaptive": True},
                    {"radius": 0.5, "n": 2001}):
            response = http.post("/predict", json={"images": [x[0].tolist()], **bad})
            assert response.status_code == 400 and response.json()["error"], (bad, response.text)
        upload = [("images", ("d.png", png((x[0, 0].numpy() * 255).round().astype(np.uint8)), "image/png"))]
        assert http.post("/predict", files=upload, data={"radius": "abc"}).status_code == 400
        assert http.get("/readyz").status_code == 200
        metrics = http.get("/metrics").text
        assert 'transdenoiser_requests_total{kind="decide",status="200"}' in metrics
        assert 'transdenoiser_requests_total{kind="estimate",status="200"}' in metrics


@pytest.mark.server
def test_the_adaptive_api_benchmark_runs_against_a_server(server, digits):
    """benchmarks.bench_serving_adaptive's measuring code, tiny, on this module's server."""
    from benchmarks.bench_serving_adaptive import measure

    x, y = digits
    result = measure(server.url, x[:2].tolist(), y[:2].tolist(), radius=0.25, n=300, clients=2, seconds=1, repeats=1,
                     max_requests=3)
    for mode in ("fixed", "decide"):
        (phase,) = result["phases"][mode]
        assert phase["requests"] >= 1 and not phase["failures"] and phase["requests_per_s"] > 0
    assert result["images_compared"] >= 1 and result["speedup"] > 0
    for mode in ("fixed", "decide"):  # noisy samples per second: requests per second x samples per request
        assert result["median_samples_per_s"][mode] == pytest.approx(
            result["phases"][mode][0]["requests_per_s"] * result["mean_samples"][mode])
    assert result["samples_per_second_vs_fixed"] == pytest.approx(
        result["median_samples_per_s"]["decide"] / result["median_samples_per_s"]["fixed"])
    assert result["mean_samples"]["fixed"] == N0 + 300 and result["mean_samples"]["decide"] < N0 + 300
    for mode in ("fixed", "decide"):  # the server's side, from its /metrics around the phase
        side = result["server"][mode]
        assert side["passes_per_request"] > 0 and side["samples_per_pass"] > 0
        assert 0 < side["counter_busy_fraction"] <= 1
    # a mode none of whose requests was answered (a radius beyond the server's reach: 400) is an error that says so
    with pytest.raises(RuntimeError, match="no decide request was answered: 400"):
        measure(server.url, x[:1].tolist(), y[:1].tolist(), radius=5.0, n=300, clients=1, seconds=1, repeats=1,
                max_requests=1)


@pytest.mark.server
def test_the_adaptive_api_benchmark_measures_estimate_requests_too(server, digits):
    """``--estimate``: a phase of estimate requests in each repeat, against the same fixed-n phases; the decide
    figures stay where they were."""
    from benchmarks.bench_serving_adaptive import WITH_ESTIMATE, measure

    x, y = digits
    result = measure(server.url, x[:2].tolist(), y[:2].tolist(), radius=0.25, n=300, clients=2, seconds=1, repeats=1,
                     max_requests=3, modes=WITH_ESTIMATE)
    assert set(result["phases"]) == {"fixed", "decide"} and result["speedup"] > 0
    estimate = result["estimate"]
    (phase,) = estimate["phases"]
    assert phase["requests"] >= 1 and not phase["failures"]
    assert estimate["median_samples_per_s"] == pytest.approx(phase["requests_per_s"] * phase["mean_samples"])
    assert estimate["samples_per_second_vs_fixed"] == pytest.approx(
        estimate["median_samples_per_s"] / result["median_samples_per_s"]["fixed"])
    assert N0 < estimate["mean_samples"] <= N0 + 2000  # the server's max_n is the estimate budget
    assert estimate["images_compared"] >= 1 and set(estimate["certified_fraction"]) == {"fixed", "estimate"}
    assert 0 < estimate["server"]["counter_busy_fraction"] <= 1


@pytest.mark.server
def test_the_serving_benchmark_measures_against_a_server(server, digits):
    """benchmarks.bench_serving's measuring code, tiny, on this module's server (as both modes): fixed-n requests
    answered in every phase, and the server's passes over each phase from its /metrics."""
    from benchmarks.bench_serving import measure

    x, _ = digits
    result = measure({"adaptive": server.url, "one-at-a-time": server.url}, x[0].tolist(), n=200, clients=2,
                     seconds=0.5, repeats=2, warmup_seconds=0.2, max_requests=4)  # one server as both modes
    for mode in ("adaptive", "one-at-a-time"):
        assert len(result["phases"][mode]) == 2
        for phase in result["phases"][mode]:
            assert 1 <= phase["requests"] <= 4 and not phase["failures"] and phase["requests_per_s"] > 0
            assert phase["p50_s"] <= phase["p99_s"]
            # the phase's passes computed n0 + n samples for each of its requests, nothing else
            server_side, samples = phase["server"], phase["requests"] * (N0 + 200)
            assert server_side["passes"] * server_side["samples_per_pass"] == pytest.approx(samples)
            assert server_side["passes_per_request"] == server_side["passes"] / phase["requests"]
            assert 0 < server_side["counter_busy_fraction"] <= 1
    medians = result["median_requests_per_s"]
    assert result["speedup"] == pytest.approx({"one-at-a-time": medians["adaptive"] / medians["one-at-a-time"]})


@pytest.mark.server
def test_the_adaptive_api_benchmark_compares_two_servers_phase_by_phase(server, digits):
    """``--compare``'s measuring code: phases of two sides in turn, the second's decide requests per second over the
    first's per repeat, and every answer of one side against the other's. One server as both sides here: the same
    noise, so the same answers."""
    from benchmarks.bench_serving_adaptive import MODES, collect, compare_sides, run_repeat

    x, _ = digits
    phases = {name: {mode: [] for mode in MODES} for name in ("first", "second")}
    answers = {name: {mode: {} for mode in MODES} for name in ("first", "second")}
    for _ in range(2):
        for name in ("first", "second"):
            collect(phases[name], answers[name], *run_repeat(server.url, x[:2].tolist(), radius=0.25, n=300,
                                                             clients=2, seconds=1, max_requests=3))
    compared = compare_sides(phases, answers)
    assert len(compared["decide_ratio_per_repeat"]) == 2 and compared["decide_ratio"] > 0
    assert compared["decide_ratio_per_repeat"][0] == pytest.approx(
        phases["second"]["decide"][0]["requests_per_s"] / phases["first"]["decide"][0]["requests_per_s"])
    assert compared["answers_compared"] >= 2 and compared["answers_differing"] == []
    image = next(iter(answers["second"]["decide"]))  # an answer that differs is named
    answers["second"]["decide"][image] = {**answers["second"]["decide"][image], "certified": None}
    assert compare_sides(phases, answers)["answers_differing"] == [f"decide image {image}"]


def test_a_decide_answer_that_is_not_certified_keeps_its_class(service, smooth, digits):
    """Asked at a radius its budget cannot certify, the answer still names the selected class: certified false (or null
    when the budget ran out), radius 0, not an abstention."""
    x, _ = digits
    # 0.675 is within the server's cap (0.6755 at max_n 2000) but beyond what a budget of 500 can certify (0.55)
    answer = service.post("/predict", json={"images": [x[0].tolist()], "radius": 0.675, "n": 500}).json()
    answer = answer["predictions"][0]
    offline = smooth.decide(x[0], 0.675, N0, answer["n"], ALPHA, smooth.generator(answer["noise_seed"]))
    assert answer["certified"] is not True and answer["outcome"] in ("not_certified", "budget_spent")
    assert answer["label"] == offline.prediction and answer["label"] is not None and answer["class_name"] is not None
    assert answer["abstained"] is False and answer["certified_radius"] == 0.0
