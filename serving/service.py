"""The prediction API: a BentoML 1.4 service returning certified predictions.

Serve with ``transdenoiser serve --model-dir DIR`` or ``TRANSDENOISER_MODEL_DIR=DIR bentoml serve
serving.service:TransDenoiser``. Endpoints (POST, BentoML's convention for APIs):

- ``/predict``: JSON ``{"images": [[[...]]], "n": 1000}`` or multipart PNG/JPEG files in ``images``;
  per image: label, class name, certified L2 radius, abstained, pA lower bound, n0, n, samples used, sigma,
  alpha, noise seed. With ``"radius": R`` the answer decides whether the prediction is certified at R; with
  ``"adaptive": true`` it estimates the largest certifiable radius; both draw estimation samples look by
  look (``certify.sequential``) and stop as soon as the answer is settled, ``n`` (default ``max_n``) being
  the budget.
- ``/metadata``: the model card (architectures, dataset fingerprints, the denoiser's privacy report
  with the analysis behind each epsilon, certification settings).
- ``/healthz``, ``/livez``, ``/readyz``, ``/metrics`` (BentoML's probes; never behind the API key).
- ``GET /`` and ``/docs``: the API page; ``GET /docs.json``: the OpenAPI document (serving.page; open, as the probes).

Requests share the compute in fair rounds (serving.compute.scheduler); each image's noise is keyed to the model, its
pixels and the settings (serving.compute.noise), so asking again gives the same certificate.

The pipeline is loaded and warmed up (its largest forward passes, then certifications through the scheduler)
before the server accepts connections, so ``/readyz`` answers 200 only once the model is ready.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import time
from typing import Any, Literal

import bentoml
import torch
from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema
from starlette.responses import JSONResponse

from certify.core import ABSTAIN, AdaptiveCertificate, Certificate, Smooth, sequential_rule
from certify.sound_noise import grid_levels
from serving.auth import ApiKeyMiddleware, api_key_from_env
from serving.bundle import load_model_dir
from serving.card import model_card
from serving.compute.counter import VoteCounter
from serving.compute.engine import NoiseJob, SequentialWork, prepare_ladder
from serving.compute.noise import NoiseKey, client_image_seed, model_identity
from serving.compute.refusals import SchedulerRefusal
from serving.compute.scheduler import FairScheduler, Work
from serving.config import DEVICE_ENV, model_dir_from_env, served_config
from serving.disconnect import DisconnectWatch
from serving.front_door import FrontDoor, Readiness
from serving.http_errors import JsonErrorMiddleware
from serving.library_patches import (
    bound_request_labels,
    cancel_request_timers,
    json_protocol_errors,
    serve_behind_front_door,
    trace_only_when_exported,
)
from serving.limits import BodyPace, BodySlots, PayloadLimitMiddleware, release_body_slot
from serving.metrics import service_metrics
from serving.page import ApiPage
from serving.validation import PredictRequest, RequestError, parse_payload, parse_predict_request
from training.checkpoint import WEIGHTS
from transdenoiser.errors import UserError
from transdenoiser.runtime import freeze_start_up_objects, keep_freed_memory, resolve_device

logger = logging.getLogger(__name__)
# the service's routes (BentoML's and ours): the only paths that get their own label in BentoML's request metrics
ROUTES = frozenset({"/", "/docs", "/predict", "/metadata", "/healthz", "/livez", "/readyz", "/metrics",
                    "/docs.json", "/schema.json", "/static_content"})
RULES_KEPT = 64  # adaptive requests' stopping rules kept for reuse, by settings
REQUEST_TIMEOUT_S = 600  # BentoML traffic timeout; the scheduler's deadline (max_latency_ms) stops requests earlier
# this process's body slots (max_parsing_requests, max_queued_requests), shared by the front door and the
# body-limit middleware
BODY_SLOTS = BodySlots()
READINESS = Readiness()  # set once the service has warmed up; /readyz is answered from it (serving.front_door)


class PredictInput(bentoml.IODescriptor):
    """The documented JSON form; the body is parsed and validated by serving.validation, not by pydantic."""

    images: list[list[list[list[float]]]] = Field(
        default_factory=list, description="images, each a nested array of shape (C, H, W) with values in [0, 1]; "
                                          "or send multipart/form-data with PNG/JPEG files in 'images'")
    n: int | None = Field(default=None, description="estimation samples per image (default and maximum: "
                                                    "see /metadata)")
    seed: int | None = Field(default=None, description="noise seed, only where the server allows client seeds")
    radius: float | None = Field(default=None, description="decide: is the prediction certified at this L2 radius "
                                                           "([0,1]-pixel units)? n is then the budget (default max_n)")
    adaptive: bool | None = Field(default=None, description="estimate the largest certifiable radius, stopping "
                                                            "early; n is then the budget (default max_n)")
    parsed: SkipJsonSchema[Any] = None  # the validated request, or the RequestError refusing it
    disconnected: SkipJsonSchema[Any] = None  # serving.disconnect.DisconnectWatch: whether the client has gone

    @classmethod
    async def from_http_request(cls, request, serde) -> PredictInput:
        service = bentoml.get_current_service()
        try:
            parsed: PredictRequest | RequestError = await parse_predict_request(
                request, service.config, service.input_shape)
        except RequestError as exc:
            parsed = exc
        except Exception:  # a bug: answered 500 (and counted) by predict, with the traceback in the log only
            logger.exception("unexpected error while parsing a predict request")
            parsed = RequestError(500, "internal error while reading the request (logged on the server)")
        finally:
            release_body_slot(request.scope)  # parsed: the next body may be read (serving.limits)
        return cls.model_construct(images=[], n=None, seed=None, radius=None, adaptive=None, parsed=parsed,
                                   disconnected=DisconnectWatch(request.receive))


class _Prediction(BaseModel):
    label: int | None = Field(description="class index; null when abstaining")
    class_name: str | None
    certified_radius: float = Field(description="certified L2 radius in [0,1]-pixel units; 0 when abstaining")
    abstained: bool
    count: int = Field(description="estimation samples that voted for the selected class")
    n0: int = Field(description="selection samples")
    n: int = Field(description="estimation samples used")
    samples: int = Field(description="noisy samples this image used: n0 + n")
    sigma: float
    alpha: float
    noise_seed: int = Field(description="this image's noise seed (reproduces its certificate offline)")


class ImagePrediction(_Prediction):
    """A fixed n: the image's one test read at n estimation samples (docs/SERVING.md, "One image, one test")."""

    p_lower: float = Field(description="lower bound on pA: Phi(radius / sigma) of the highest radius of the 0.001 "
                                       "grid that the image's one anytime-valid test certifies at n (0: none)")


class EstimatePrediction(_Prediction):
    """The largest certifiable radius under the budget n_max (``"adaptive": true``)."""

    p_lower: float = Field(description="anytime-valid lower bound on pA where the test stopped")
    n_max: int = Field(description="the budget of estimation samples")
    outcome: str = Field(description="estimated")


class DecidePrediction(_Prediction):
    """Certified at the requested radius? (``"radius": R``)."""

    p_lower: float = Field(description="anytime-valid lower bound on pA where the test stopped (Phi(R / sigma) "
                                       "when certified)")
    radius: float = Field(description="the L2 radius R decided: the request's, rounded up to the 0.001 grid")
    certified: bool | None = Field(description="true: certified at R; false: not certified at R; null: the "
                                               "budget was spent without an answer (no claim either way). `label` "
                                               "is the class the n0 selection samples chose in all three cases")
    n_max: int = Field(description="the budget of estimation samples")
    outcome: str = Field(description="certified, not_certified or budget_spent")


class PredictResponse(BaseModel):
    predictions: list[DecidePrediction | EstimatePrediction | ImagePrediction]
    seed: int | None = Field(description="the client's seed; null when the server keyed the noise to each image")
    seed_source: Literal["server", "client"]
    noise: Literal["gaussian", "sound"] = Field(
        description="sound: images on the 8-bit grid, exact integer noise (sound in floating point, Voracek and "
                    "Hein 2023); gaussian: float32 x + sigma * randn (docs/CERTIFY.md)")


@functools.lru_cache(maxsize=RULES_KEPT)
def shared_rule(kind: str, sigma: float, n_max: int, alpha: float, radius: float | None):
    """``certify.core.sequential_rule``, one object per setting (a rule is immutable): the scheduler reads
    together the blocks of requests that share their rule (``serving.compute.engine.read_counted_blocks``)."""
    return sequential_rule(kind, sigma, n_max, alpha, radius=radius)


def request_rule(kind: str, sigma: float, n: int, alpha: float, radius: float | None):
    """The rule that answers a validated request of ``kind`` (``certify``: a fixed n, read from the ladder at n;
    ``decide``, ``estimate``) with budget ``n``: :func:`shared_rule`."""
    return shared_rule("fixed" if kind == "certify" else kind, sigma, n, alpha, radius)


def stream_settings(config, rule) -> dict[str, object]:
    """What an image's one stream of votes depends on beyond the model, the pixels and the server secret: sigma,
    n0, alpha and the confidence sequence's method and unbounded look schedule. Neither the request kind, nor the
    budget ``n``, nor a decide radius: every answer about an image reads the same selection and the same stream,
    through the ladder of tests of (alpha, sigma) (``certify.ladder``), so all of them are one test at level alpha."""
    return {"stream": "one test per image", "sigma": config.sigma, "n0": config.n0, "alpha": config.alpha,
            "method": rule.cs.name, "schedule": list(rule.cs.schedule)}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


@bentoml.service(name="transdenoiser", traffic={"timeout": REQUEST_TIMEOUT_S}, workers=1)
class TransDenoiser:
    def __init__(self) -> None:
        keep_freed_memory()  # this process serves for a long time: reuse freed CPU memory (runtime.py)
        READINESS.ready = False  # until this service has warmed up (a process may build a second one: the tests)
        self.device = resolve_device(os.environ.get(DEVICE_ENV, "auto"))
        self.bundle = load_model_dir(model_dir_from_env(), device=self.device)
        self.config = config = self.bundle.config
        switch_interval_us = config.switch_interval_us_on(self.device.type)
        if switch_interval_us is not None:  # this process serves: the setting is the process's
            sys.setswitchinterval(switch_interval_us / 1e6)
        # this model directory's limits, not a previous service's in this process
        BODY_SLOTS.configure(*config.body_slot_limits())
        pipeline = self.bundle.pipeline
        self.input_shape: tuple[int, int, int] = tuple(pipeline.input_shape)  # type: ignore[assignment]
        self.class_names = pipeline.class_names
        self.smooth = Smooth(pipeline.classifier, pipeline.num_classes, config.sigma, pipeline.denoiser,
                             batch_size=config.forward_batch_on(self.device.type), device=self.device,
                             precision=config.precision, compile=config.compile,  # the bundle's settings
                             noise="sound" if config.sound_noise else "gaussian",
                             worker_nice=config.forward_nice_on(self.device.type))
        if self.device.type == "cuda" and config.forward_batch == "auto":  # what fits in free memory, <= batch_size
            from certify.batching import cuda_forward_batch

            self.smooth.batch_size = cuda_forward_batch(self.smooth.base_pipeline, self.input_shape, self.device,
                                                        self.smooth.precision, cap=config.batch_size)
        counter = VoteCounter(self.smooth)
        self.metrics = service_metrics()
        share_passes = config.batching_on(self.device.type)
        round_samples = config.round_samples_on(self.device.type)
        self.scheduler = FairScheduler(counter, round_samples, config.batch_size, share_passes,
                                       config.max_queued_requests, on_pass=self._on_pass,
                                       on_drop=lambda reason: self.metrics.dropped.labels(reason=reason).inc(),
                                       on_refuse=lambda reason: self.metrics.refused.labels(reason=reason).inc(),
                                       overlap=config.overlap_on(self.device.type), on_counted=self._on_counted)
        weights = [self.bundle.path / config.classifier / WEIGHTS,
                   self.bundle.path / config.denoiser / WEIGHTS if config.denoiser is not None else None]
        self.noise_key = NoiseKey.from_setting(config.noise_key, model_identity(weights))
        batching = (f"shared passes (rounds of {round_samples} samples from several requests, up to "
                    f"{config.batch_size} samples per pass)" if share_passes else
                    f"one request's round of {round_samples} samples per pass, requests in turn "
                    f"(setting batching = {config.batching!r})")
        self.card = model_card(self.bundle, str(self.device), batching, self.smooth.describe())
        self.card["runtime"]["forward_batch"] = self.smooth.batch_size  # as sized on this device
        self.card["runtime"]["forward_workers"] = self.smooth.workers  # threads running passes side by side
        self.card["runtime"]["forward_nice"] = self.smooth.worker_nice if self.smooth.workers > 1 else 0
        self.card["runtime"]["round_samples"] = round_samples  # a request's round on this device
        self.card["runtime"]["overlap"] = self.scheduler.overlap  # counts handed out while the next pass computes
        self.card["runtime"]["pipelined"] = self.scheduler.pipelined  # next pass queued on the device before then
        self.card["runtime"]["switch_interval_us"] = round(sys.getswitchinterval() * 1e6)  # the GIL's, as set
        self.card["runtime"]["max_parsing_requests"] = BODY_SLOTS.limit  # large-body slots on this machine
        # the largest passes this device runs: on a GPU one full batch (cuDNN's plans, the memory it takes); on CPU one
        # forward batch per worker thread (a CPU pass is never larger, and 1,000 samples there take over a second)
        warm_samples = (config.batch_size if self.device.type != "cpu"
                        else min(config.batch_size, self.smooth.batch_size * self.smooth.workers))
        counter([NoiseJob(torch.zeros(self.input_shape), warm_samples, 0)])
        # request kinds: name -> builds the scheduler work of a validated request. A new kind adds a Work class
        # (serving.compute.scheduler.Work) and an entry here, plus its response.
        self.kinds = {"certify": self._sequential_work, "decide": self._sequential_work,
                      "estimate": self._sequential_work}
        # the ladder's count boundaries at every look of the largest budget and at every n of the grid, computed
        # now rather than in the first requests (certify.ladder; a few seconds at most)
        self.ladder = prepare_ladder(config.sigma, config.alpha, config.max_n, config.chunk_samples)
        self._ready = False

    def _on_pass(self, samples_by_kind: dict[str, int], depth: int, queued_samples: int) -> None:
        self.metrics.on_pass(samples_by_kind, depth, queued_samples)
        self.metrics.compute_rate.set(self.scheduler.rate)

    def _on_counted(self, counter_seconds: float) -> None:
        self.metrics.passes.inc()
        self.metrics.counter_seconds.inc(counter_seconds)

    @bentoml.on_startup
    async def warm_up(self) -> None:
        """Certify a blank image through the scheduler (this also starts its compute loop); then freeze the
        start-up's objects (``transdenoiser.runtime.freeze_start_up_objects``)."""
        blank = PredictRequest(torch.zeros((1, *self.input_shape)), self.config.chunk_samples, seed=0)
        for _ in range(4):
            await self.scheduler.run(self._sequential_work(blank), self.config.max_latency_ms / 1000,
                                     self.config.max_request_samples)
        # the start-up's objects (about 342,000) out of the garbage collector's full collections, which would
        # otherwise scan them all and pause every request, probes included, for 0.17 s of CPU now and then
        freeze_start_up_objects()
        self._ready = READINESS.ready = True

    @bentoml.on_shutdown
    async def stop_scheduler(self) -> None:
        await self.scheduler.shutdown()

    async def __is_ready__(self) -> bool:
        """Ready once warmed up (the server's /readyz is answered by the front door from ``READINESS``, set at the
        same moment; this serves BentoML's own route, e.g. in process). A coroutine, so that BentoML awaits it on
        the event loop instead of sending a one-line check through a worker thread and back."""
        return self._ready

    def image_seeds(self, request: PredictRequest, rule) -> list[int]:
        """Each image's noise seed: keyed to (model, pixels, :func:`stream_settings`), or from the client's seed
        (opt-in). The same for every request kind, budget and radius: one stream per image, one test."""
        if request.seed is not None:
            return [client_image_seed(request.seed, index) for index in range(len(request.images))]
        settings = stream_settings(self.config, rule)
        return [self.noise_key.image_seed(image, settings) for image in request.images]

    def sequential_rule(self, request: PredictRequest):
        """The offline mode's rule (``certify.core.sequential_rule``) for a request; a fixed-n request reads the
        ladder at n (mode ``fixed``). One object for requests with the same settings, so the scheduler reads their
        blocks together."""
        return request_rule(request.kind, self.config.sigma, request.n, self.config.alpha, request.radius)

    def _sequential_work(self, request: PredictRequest) -> Work:
        rule = self.sequential_rule(request)
        return SequentialWork(request.kind, request.images, self.image_seeds(request, rule),
                              self.config.n0, rule, self.config.sigma, self.smooth.num_classes,
                              self.config.chunk_samples, self.smooth.generator, self.smooth.device,
                              draw_ahead=self.scheduler.overlap)

    def _prediction(self, certificate: Certificate | AdaptiveCertificate, noise_seed: int,
                    radius: float | None = None) -> _Prediction:
        c = certificate
        common = dict(label=None if c.prediction == ABSTAIN else c.prediction,
                      class_name=None if c.prediction == ABSTAIN else self.class_names[c.prediction],
                      certified_radius=c.radius, abstained=c.abstained, p_lower=c.p_lower, count=c.count, n0=c.n0,
                      n=c.n, samples=c.n0 + c.n, sigma=self.config.sigma, alpha=self.config.alpha,
                      noise_seed=noise_seed)
        if not isinstance(c, AdaptiveCertificate) or c.mode == "fixed":
            return ImagePrediction(**common)
        if c.mode == "estimate":
            return EstimatePrediction(**common, n_max=c.n_max, outcome=c.outcome)
        certified = {"certified": True, "not_certified": False, "budget_spent": None}[c.outcome]
        return DecidePrediction(**common, radius=radius, certified=certified,
                                n_max=c.n_max, outcome=c.outcome)

    async def _answer(self, kind: str, parsed: PredictRequest | RequestError, disconnected) -> Any:
        if isinstance(parsed, RequestError):
            return error_response(parsed.status, parsed.message)
        request: PredictRequest = parsed
        if self.smooth.noise == "sound":  # sound noise certifies images on the 8-bit grid only
            for index, image in enumerate(request.images):
                try:
                    grid_levels(image)
                except UserError as exc:
                    return error_response(400, f"image {index}: {exc}")
        work = self.kinds[kind](request)
        try:
            certificates = await self.scheduler.run(work, self.config.max_latency_ms / 1000,
                                                    self.config.max_request_samples, disconnected)
        except SchedulerRefusal as exc:
            return error_response(exc.status, exc.message, exc.headers)
        finally:
            if disconnected is not None:
                disconnected.close()
        for certificate in certificates:
            self.metrics.certificates.labels(kind=kind, outcome="abstained" if certificate.abstained
                                             else "not_certified" if getattr(certificate, "certified", True) is not True
                                             else "certified").inc()
        seeds = work.image_seeds
        return PredictResponse(predictions=[self._prediction(c, s, request.radius)
                                            for c, s in zip(certificates, seeds, strict=True)],
                               seed=request.seed, seed_source="client" if request.seed is not None else "server",
                               noise=self.smooth.noise)

    @bentoml.api(input_spec=PredictInput)
    async def predict(self, images: list | None = None, n: int | None = None, seed: int | None = None,
                      radius: float | None = None, adaptive: bool | None = None, parsed: Any = None,
                      disconnected: Any = None) -> PredictResponse:
        """Certified predictions: for each image a class and an L2 radius valid with probability >= 1 - alpha;
        with ``radius``, whether the prediction is certified at that radius; with ``adaptive``, the largest
        certifiable radius under the budget ``n``; every answer gives the noisy samples it used."""
        if parsed is None:  # an in-process call: validate the arguments like a JSON body
            try:
                parsed = parse_payload({"images": images, "n": n, "seed": seed, "radius": radius,
                                        "adaptive": adaptive}, self.config, self.input_shape)
            except RequestError as exc:
                parsed = exc
        kind = parsed.kind if isinstance(parsed, PredictRequest) else "certify"
        started = time.perf_counter()
        self.metrics.in_flight.labels(kind=kind).inc()
        status = 500
        try:
            answer = await self._answer(kind, parsed, disconnected)
            status = answer.status_code if isinstance(answer, JSONResponse) else 200
            return answer
        finally:
            self.metrics.in_flight.labels(kind=kind).dec()
            self.metrics.answered(kind, status, time.perf_counter() - started)

    @bentoml.api
    async def metadata(self) -> dict[str, Any]:
        """The model card: models, dataset fingerprints, privacy report, certification settings and limits."""
        return self.card


def _count_parsing_refusal() -> None:
    service_metrics().refused.labels(reason="parsing").inc()


def _front_door(app) -> FrontDoor:
    """BentoML's app behind the front door (serving.front_door): probes, full-slot refusals and stalled bodies
    answered first."""
    config = served_config()
    return FrontDoor(app, BODY_SLOTS, READINESS, api_key=api_key_from_env(), show_versions=config.show_versions,
                     on_full=_count_parsing_refusal, pace=BodyPace.from_config(config))


# Outermost first: every error answer as our JSON; refuse unauthenticated requests before reading their bodies.
TransDenoiser.add_asgi_middleware(JsonErrorMiddleware)
# the API page and the OpenAPI document (serving.page): open, so that a person can load the page and type the key
TransDenoiser.add_asgi_middleware(ApiPage, spec=lambda: TransDenoiser.openapi_spec.asdict())
TransDenoiser.add_asgi_middleware(ApiKeyMiddleware)
TransDenoiser.add_asgi_middleware(PayloadLimitMiddleware, slots=BODY_SLOTS, on_full=_count_parsing_refusal)
# Checked patches of library internals (serving.library_patches): a changed BentoML or uvicorn stops the start here
bound_request_labels(ROUTES)  # BentoML's request metrics: one label per route, one for every other path
json_protocol_errors()  # uvicorn's own 400 (an unparsable request) as our JSON
cancel_request_timers()  # BentoML's request timeout cancels its timer when the request ends (no 10-minute contexts)
serve_behind_front_door(TransDenoiser, _front_door)  # ahead of BentoML's middlewares: probes, full-slot refusals
trace_only_when_exported()  # BentoML's OpenTelemetry spans only where an exporter takes them
