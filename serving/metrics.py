"""The service's own Prometheus metrics, served with BentoML's on ``/metrics``.

Made with ``prometheus_client`` as BentoML's own are, and only once the worker has set
``PROMETHEUS_MULTIPROC_DIR`` (so they are created from the service's ``__init__``, never at import time).
Gauges use the ``livesum`` multiprocess mode: the sum over the live worker processes.

- ``transdenoiser_noisy_samples_total{kind}``: noisy samples computed (forward passes' worth of work)
- ``transdenoiser_queue_depth``: requests holding a scheduler ticket (computing or waiting for a round)
- ``transdenoiser_queued_samples``: noisy samples those requests still have to compute
- ``transdenoiser_in_flight_requests{kind}``: requests inside the predict handler
- ``transdenoiser_certificates_total{kind,outcome}``: certificates returned, ``outcome`` certified,
  not_certified (a decide answer not certified at R or out of budget: it keeps its class) or abstained;
  the abstention rate is ``rate(..{outcome="abstained"}) / rate(..)`` summed over outcomes
- ``transdenoiser_request_duration_seconds{kind,status}``: latency per request kind and HTTP status
- ``transdenoiser_requests_total{kind,status}``: requests answered, per kind and HTTP status
- ``transdenoiser_dropped_requests_total{reason}``: requests stopped before finishing (``deadline``,
  ``disconnected``, ``budget``, ``abandoned``)
- ``transdenoiser_refused_requests_total{reason}``: requests refused at admission, before any compute
  (``queue``: max_queued_requests in flight; ``busy``: would not finish within its deadline behind the
  admitted work, or would delay an admitted request; ``never``: not even alone, at the planning rate; ``parsing``: a
  body sent while every body slot of its kind was taken (``max_parsing_requests`` for bodies over 64 KiB,
  ``max_queued_requests`` for smaller ones), refused before reading it, mostly by
  the front door ahead of BentoML's middlewares, so that these refusals are not in BentoML's request counter)
- ``transdenoiser_compute_rate``: the measured noisy samples per second, a moving average (admission plans with 75 %
  of the lowest of it and of the last minute's 2-second windows: ``serving.compute.admission``)
- ``transdenoiser_passes_total``: forward passes computed (noisy samples per pass: the samples' rate over this one)
- ``transdenoiser_counter_seconds_total``: the time the passes took to compute (noise, forward passes, votes);
  its rate is the fraction of the time the compute was busy, the rest went to the host (taking jobs, handing out
  counts) or to waiting for requests

BentoML's own request metrics carry the path as a label; ``serving.library_patches.bound_request_labels`` limits
those labels to the service's routes (every other path shares one label).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0)
PREFIX = "transdenoiser_"


@dataclass
class ServiceMetrics:
    noisy_samples: Any
    queue_depth: Any
    queued_samples: Any
    in_flight: Any
    certificates: Any
    latency: Any
    requests: Any
    dropped: Any
    refused: Any
    compute_rate: Any
    passes: Any
    counter_seconds: Any

    def on_pass(self, samples_by_kind: dict[str, int], depth: int, queued_samples: int) -> None:
        for kind, count in samples_by_kind.items():
            self.noisy_samples.labels(kind=kind).inc(count)
        self.queue_depth.set(depth)
        self.queued_samples.set(queued_samples)

    def answered(self, kind: str, status: int, seconds: float) -> None:
        self.latency.labels(kind=kind, status=str(status)).observe(seconds)
        self.requests.labels(kind=kind, status=str(status)).inc()


_made: ServiceMetrics | None = None


def service_metrics() -> ServiceMetrics:
    """The metrics of this process (made on first call; later calls return the same objects)."""
    global _made
    if _made is None:
        from prometheus_client import Counter, Gauge, Histogram

        _made = ServiceMetrics(
            noisy_samples=Counter(PREFIX + "noisy_samples", "noisy samples computed", ["kind"]),
            queue_depth=Gauge(PREFIX + "queue_depth", "requests holding a scheduler ticket",
                              multiprocess_mode="livesum"),
            queued_samples=Gauge(PREFIX + "queued_samples", "noisy samples the queued requests still need",
                                 multiprocess_mode="livesum"),
            in_flight=Gauge(PREFIX + "in_flight_requests", "requests inside the predict handler", ["kind"],
                            multiprocess_mode="livesum"),
            certificates=Counter(PREFIX + "certificates", "certificates returned", ["kind", "outcome"]),
            latency=Histogram(PREFIX + "request_duration_seconds", "time from parsed request to answer",
                              ["kind", "status"], buckets=LATENCY_BUCKETS_S),
            requests=Counter(PREFIX + "requests", "requests answered", ["kind", "status"]),
            dropped=Counter(PREFIX + "dropped_requests", "requests stopped before finishing", ["reason"]),
            refused=Counter(PREFIX + "refused_requests", "requests refused at admission", ["reason"]),
            compute_rate=Gauge(PREFIX + "compute_rate", "measured noisy samples per second (admission)",
                               multiprocess_mode="livesum"),
            passes=Counter(PREFIX + "passes", "forward passes computed"),
            counter_seconds=Counter(PREFIX + "counter_seconds", "time the passes took to compute"),
        )
    return _made
