"""The prediction API: a BentoML 1.4 service returning certified predictions.

Serve with ``transdenoiser serve --model-dir DIR`` or ``TRANSDENOISER_MODEL_DIR=DIR bentoml serve
serving.service:TransDenoiser``. Endpoints (POST, BentoML's convention for APIs):

- ``/predict``: JSON ``{"images": [[[...]]], "n": 1000}`` or multipart PNG/JPEG files in ``images``;
  per image: label, class name, certified L2 radius, abstained, pA lower bound, n0, n, sigma, alpha.
- ``/metadata``: the model card (architectures, dataset fingerprints, the denoiser's privacy report
  with the analysis behind each epsilon, certification settings).
- ``/healthz``, ``/livez``, ``/readyz``, ``/metrics`` (BentoML's probes; never behind the API key).

The pipeline is loaded and warmed up (a full forward pass, then a certification through the batcher)
before the server accepts connections, so ``/readyz`` answers 200 only once the model is ready.
"""
from __future__ import annotations

import os
from typing import Any, Literal

import bentoml
import torch
from bentoml.exceptions import ServiceUnavailable
from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema
from starlette.responses import JSONResponse

from certify.core import ABSTAIN, Smooth
from serving.auth import ApiKeyMiddleware
from serving.batching import AdaptiveBatcher
from serving.bundle import load_model_dir
from serving.card import model_card
from serving.config import DEVICE_ENV, model_dir_from_env
from serving.engine import NoiseJob, ServingCertifier, VoteCounter, fresh_seed
from serving.limits import PayloadLimitMiddleware
from serving.validation import PredictRequest, RequestError, parse_payload, parse_predict_request
from transdenoiser.runtime import keep_freed_memory, resolve_device

REQUEST_TIMEOUT_S = 600  # BentoML traffic timeout; the batcher's max_latency_ms refuses overload earlier


class PredictInput(bentoml.IODescriptor):
    """The documented JSON form; the body is parsed and validated by serving.validation, not by pydantic."""

    images: list[list[list[list[float]]]] = Field(
        default_factory=list, description="images, each a nested array of shape (C, H, W) with values in [0, 1]; "
                                          "or send multipart/form-data with PNG/JPEG files in 'images'")
    n: int | None = Field(default=None, description="estimation samples per image (default and maximum: "
                                                    "see /metadata)")
    seed: int | None = Field(default=None, description="noise seed, only where the server allows client seeds")
    parsed: SkipJsonSchema[Any] = None  # the validated request, or the RequestError refusing it

    @classmethod
    async def from_http_request(cls, request, serde) -> PredictInput:
        service = bentoml.get_current_service()
        try:
            parsed: PredictRequest | RequestError = await parse_predict_request(
                request, service.config, service.input_shape)
        except RequestError as exc:
            parsed = exc
        return cls.model_construct(images=[], n=None, seed=None, parsed=parsed)


class ImagePrediction(BaseModel):
    label: int | None = Field(description="class index; null when abstaining")
    class_name: str | None
    certified_radius: float = Field(description="certified L2 radius in [0,1]-pixel units; 0 when abstaining")
    abstained: bool
    p_lower: float = Field(description="one-sided (1 - alpha) Clopper-Pearson lower bound on pA")
    count: int = Field(description="estimation samples that voted for the selected class")
    n0: int
    n: int
    sigma: float
    alpha: float


class PredictResponse(BaseModel):
    predictions: list[ImagePrediction]
    seed: int = Field(description="the request's noise seed (reproduces these certificates)")
    seed_source: Literal["server", "client"]


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


@bentoml.service(name="transdenoiser", traffic={"timeout": REQUEST_TIMEOUT_S}, workers=1)
class TransDenoiser:
    def __init__(self) -> None:
        keep_freed_memory()  # this process serves for a long time: reuse freed CPU memory (runtime.py)
        self.device = resolve_device(os.environ.get(DEVICE_ENV, "auto"))
        self.bundle = load_model_dir(model_dir_from_env(), device=self.device)
        self.config = self.bundle.config
        pipeline = self.bundle.pipeline
        self.input_shape: tuple[int, int, int] = tuple(pipeline.input_shape)  # type: ignore[assignment]
        self.class_names = pipeline.class_names
        self.smooth = Smooth(pipeline.classifier, pipeline.num_classes, self.config.sigma, pipeline.denoiser,
                             batch_size=self.config.forward_batch_on(self.device.type), device=self.device)
        counter = VoteCounter(self.smooth)
        batching_on = self.config.batching_on(self.device.type)
        self.batcher = AdaptiveBatcher(counter, self.config.batch_size // self.config.chunk_samples,
                                       self.config.max_latency_ms) if batching_on else None
        self.certifier = ServingCertifier(self.smooth, self.config.n0, self.config.alpha,
                                          self.config.chunk_samples, self.batcher, self.config.batch_size)
        batching = (f"adaptive (BentoML CorkDispatcher, up to {self.config.batch_size} samples per pass)"
                    if self.batcher else f"off (one request at a time; setting batching = {self.config.batching!r})")
        self.card = model_card(self.bundle, str(self.device), batching)
        counter([NoiseJob(torch.zeros(self.input_shape), self.config.batch_size, 0)])  # full-size forward pass
        self._ready = False

    @bentoml.on_startup
    async def warm_up(self) -> None:
        """Certify a blank image through the batcher (this also runs BentoML's dispatcher calibration)."""
        blank = torch.zeros((1, *self.input_shape))
        for _ in range(4):
            await self.certifier.certify(blank, self.config.chunk_samples, request_seed=0)
        self._ready = True

    @bentoml.on_shutdown
    def stop_batcher(self) -> None:
        if self.batcher is not None:
            self.batcher.shutdown()

    def __is_ready__(self) -> bool:
        return self._ready

    @bentoml.api(input_spec=PredictInput)
    async def predict(self, images: list | None = None, n: int | None = None, seed: int | None = None,
                      parsed: Any = None) -> PredictResponse:
        """Certified predictions: for each image a class and an L2 radius valid with probability >= 1 - alpha."""
        if parsed is None:  # an in-process call: validate the arguments like a JSON body
            try:
                parsed = parse_payload({"images": images, "n": n, "seed": seed}, self.config, self.input_shape)
            except RequestError as exc:
                parsed = exc
        if isinstance(parsed, RequestError):
            return error_response(parsed.status, parsed.message)  # type: ignore[return-value]
        request: PredictRequest = parsed
        seed_source = "client" if request.seed is not None else "server"
        request_seed = request.seed if request.seed is not None else fresh_seed()
        try:
            certificates = await self.certifier.certify(request.images, request.n, request_seed)
        except ServiceUnavailable as exc:
            return error_response(503, str(exc))  # type: ignore[return-value]
        predictions = [ImagePrediction(
            label=None if c.prediction == ABSTAIN else c.prediction,
            class_name=None if c.prediction == ABSTAIN else self.class_names[c.prediction],
            certified_radius=c.radius, abstained=c.abstained, p_lower=c.p_lower, count=c.count, n0=c.n0, n=c.n,
            sigma=self.config.sigma, alpha=self.config.alpha) for c in certificates]
        return PredictResponse(predictions=predictions, seed=request_seed, seed_source=seed_source)

    @bentoml.api
    async def metadata(self) -> dict[str, Any]:
        """The model card: models, dataset fingerprints, privacy report, certification settings and limits."""
        return self.card


# Outermost first: refuse unauthenticated requests before reading their bodies.
TransDenoiser.add_asgi_middleware(ApiKeyMiddleware)
TransDenoiser.add_asgi_middleware(PayloadLimitMiddleware)
