"""The model card served by ``/metadata``: what is deployed and what it guarantees, from checkpoint metadata only."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serving.bundle import ModelBundle
from serving.limits import BODY_GRACE_S
from transdenoiser.records import CheckpointMetadata, PrivacyReport, thaw

NO_DENOISER = "no denoiser: this pipeline is the classifier alone and makes no differential-privacy claim"
NO_REPORT = "the denoiser checkpoint carries no privacy report: no differential-privacy claim is made"
DATASET_KEYS = ("name", "source", "split_seed", "trained_on", "fingerprints")


def _model_summary(record: CheckpointMetadata) -> dict[str, Any]:
    dataset = record.dataset
    return {
        "architecture": record.architecture,
        "arch_kwargs": thaw(record.arch_kwargs),
        "num_parameters": record.num_parameters,
        "input_shape": thaw(record.input_shape),
        "dataset": {key: thaw(getattr(dataset, key)) if dataset else None for key in DATASET_KEYS},
        "weights_sha256": record.weights_sha256,
        "package_version": record.package_version,
    }


ACCOUNTANTS = (("rdp", "RDP moments accountant: an upper bound"),
               ("pld", "PLD accountant, pessimistic discretisation: an upper bound"),
               ("gdp_epsilon", "Gaussian DP central-limit approximation: can underestimate, not a guarantee"))


def _report(report: PrivacyReport | Mapping[str, Any] | None) -> PrivacyReport | None:
    return None if not report else PrivacyReport.from_json(report, "the denoiser's privacy report")


def epsilon_statements(report: PrivacyReport | Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Every epsilon of a privacy report, one statement per (guarantee, accountant).

    Each names its guarantee (``sepdp``, ``mmga``, ``data_independent``, ...) with that guarantee's label,
    the accountant (analysis) behind the number, delta, and whether the figure is data-independent.
    """
    record = _report(report)
    statements: list[dict[str, Any]] = []
    for guarantee in (record.guarantees or ()) if record else ():
        epsilon = guarantee.epsilon
        analyses = (epsilon.analyses if epsilon else None) or {}
        delta = epsilon.delta if epsilon and epsilon.delta is not None else record.delta
        for key, default_label in ACCOUNTANTS:
            statements.append({
                "guarantee": guarantee.name, "analysis": f"{guarantee.name}/{key}",
                "accountant": analyses.get(key, default_label), "label": guarantee.label,
                "epsilon": getattr(epsilon, key) if epsilon else None, "delta": delta,
                "data_independent": bool(guarantee.data_independent) and key != "gdp_epsilon",
            })
    return statements


def privacy_section(report: PrivacyReport | Mapping[str, Any] | None) -> dict[str, Any]:
    """The card's privacy section: each epsilon with its analysis, delta and data-independence, how the noise
    was drawn, and what the release leaves out (the private training record is never served)."""
    record = _report(report)
    if record is None:
        return {"statement": NO_REPORT, "noise": None, "epsilons": [], "not_released": [], "report": None}
    noise = thaw(record.noise) or {"mode": "unknown"}
    statement = record.privacy_claim
    if noise.get("mode") == "reproducible" and noise.get("warning", "") not in (statement or ""):
        statement = f"{noise['warning']} {statement or ''}".strip()
    return {"statement": statement, "noise": noise, "epsilons": epsilon_statements(record),
            "not_released": list(record.not_released or []),
            "private_training_record": "not part of this deployment (never copied into a model directory)",
            "report": record.to_json()}


def versus_classifier_section(record: CheckpointMetadata, allowed: bool) -> dict[str, Any]:
    """The card's account of what the denoiser adds: the classifier's accuracy on test images + noise with the
    denoiser and without, as training measured them (None where not recorded), whether that counts as worse
    (transdenoiser.records.VersusClassifier) and whether it was bundled with --allow-worse-than-classifier."""
    versus = record.versus_classifier
    figures = {"accuracy_with_denoiser": None, "accuracy_without_denoiser": None, "images": None,
               "worse_than_classifier": None}
    if versus is not None:
        figures = {"accuracy_with_denoiser": versus.with_denoiser, "accuracy_without_denoiser": versus.without_denoiser,
                   "images": versus.images, "worse_than_classifier": versus.worse}
    return {**figures, "sigma": record.trained_sigma, "allow_worse_than_classifier": allowed,
            "measured": "by training, at its last epoch: the frozen classifier on the test images + N(0, sigma^2), "
                        "one noise draw each, with and without the denoiser; worse = lower by more than a one-sided 5% "
                        "sampling margin (docs/TRAINING.md, 'A denoiser worse than none')"}


def model_card(bundle: ModelBundle, device: str, batching: str, as_run: str | None = None) -> dict[str, Any]:
    """The served model's card; ``as_run`` describes how the base classifier runs (``Smooth.describe``)."""
    pipeline, config = bundle.pipeline, bundle.config
    classifier = _model_summary(pipeline.classifier_record)
    classifier["test_accuracy"] = pipeline.classifier_record.test_accuracy
    if pipeline.denoiser_record is None:
        denoiser = None
        privacy = {"statement": NO_DENOISER, "noise": None, "epsilons": [], "not_released": [], "report": None}
    else:
        denoiser = _model_summary(pipeline.denoiser_record)
        denoiser["objective"] = pipeline.denoiser_record.training_objective  # what it was trained to minimise
        denoiser["versus_classifier_alone"] = versus_classifier_section(pipeline.denoiser_record,
                                                                        config.allow_worse_than_classifier)
        privacy = privacy_section(pipeline.denoiser_record.privacy)
    return {
        "service": "transdenoiser",
        "task": "image classification with certified L2 robustness (randomized smoothing, Cohen et al. 2019)",
        "classes": pipeline.class_names,
        "input": {"shape": list(pipeline.input_shape), "layout": "(C, H, W)", "pixel_range": [0.0, 1.0],
                  "formats": ["application/json", "multipart/form-data (PNG, JPEG)"]},
        "classifier": classifier,
        "denoiser": denoiser,
        "privacy": privacy,
        "certification": {
            "method": "n0 selection samples choose the class; the image's one stream of estimation samples is read by "
                      "one family of anytime-valid tests (decide's one-sided mixture at every radius of the 0.001 "
                      "grid, made monotone in the radius: certify.ladder); a fixed n answers the highest radius "
                      "certified by the first n samples; abstain when none is",
            "sigma": config.sigma, "sigma_units": "[0,1]-pixel units",
            "n0": config.n0, "default_n": config.n, "max_n": config.max_n, "alpha": config.alpha,
            "noise": "keyed per image: each image's noise seed is HMAC-SHA256, under a server secret, of the "
                     "served weights' hashes, the image on its 8-bit grid and the stream settings (sigma, n0, alpha, "
                     "the confidence sequence; not the request kind, n or radius); client seeds "
                     + ("accepted" if config.allow_client_seed else "refused"),
            "sound_noise": config.sound_noise,
            "noise_kind": ("sound: images must be on the 8-bit grid k/255 (others are refused with 400); noise is an "
                           "exact discretized Gaussian added in integers, so the certificate is sound in floating "
                           "point (Voracek and Hein 2023; docs/CERTIFY.md)" if config.sound_noise else
                           "gaussian: float32 x + sigma * randn, the usual implementation, which is not sound in "
                           "floating point against a base model that reads low-order bits (docs/CERTIFY.md)"),
            "guarantee": "per image (on its 8-bit grid): all the certificates this server gives about it, at any "
                         "n, radius and request kind, in any number of requests, are wrong together with "
                         "probability at most alpha (one test per image; across restarts and replicas only with a "
                         "fixed noise_key). Different images, including one pixel one 8-bit level apart, are "
                         "different questions, each at alpha. 'certified: false' and abstentions are not "
                         "certificates (docs/SERVING.md, 'One image, one test')",
            "adaptive_requests": {
                "decide": "send \"radius\": R to ask whether the prediction is certified at L2 radius R",
                "estimate": "send \"adaptive\": true for the largest certifiable radius under the budget",
                "default_budget": config.max_n,
                "method": "anytime-valid: the one-sided-mixture confidence sequence (mixtures of one-sided "
                          "likelihood ratios, Ville's inequality), each answer valid at whatever look it stops; "
                          "stops as soon as the answer is settled (docs/CERTIFY.md, 'Adaptive certification "
                          "(anytime-valid)')",
            },
        },
        "limits": {"max_images": config.max_images, "max_payload_bytes": config.max_payload_bytes,
                   "max_n": config.max_n, "max_latency_ms": config.max_latency_ms,
                   "max_request_samples": config.max_request_samples,
                   "max_queued_requests": config.max_queued_requests,
                   "body_timeout_ms": config.body_timeout_ms, "min_body_bytes_per_s": config.min_body_bytes_per_s,
                   "body": "a request body must arrive whole within body_timeout_ms of its headers and, after its "
                           f"first {BODY_GRACE_S:g} s, at min_body_bytes_per_s or more on average; a body that "
                           "stops is answered 408 and its connection closed"},
        "runtime": {"device": device, "batching": batching, "batch_size": config.batch_size,
                    "chunk_samples": config.chunk_samples,
                    "forward_batch": config.forward_batch_on(device.split(":")[0]),
                    "precision": config.precision, "compile": config.compile,
                    "base_classifier_as_run": as_run or f"{config.precision}, compile {config.compile}",
                    "note": "certificates are about the denoiser and classifier as run at this precision and "
                            "compilation (docs/CERTIFY.md, 'Precision and compilation')"},
    }
