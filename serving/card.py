"""The model card served by ``/metadata``: what is deployed and what it guarantees, from checkpoint metadata only."""
from __future__ import annotations

from typing import Any

from serving.bundle import ModelBundle

NO_DENOISER = "no denoiser: this pipeline is the classifier alone and makes no differential-privacy claim"
NO_REPORT = "the denoiser checkpoint carries no privacy report: no differential-privacy claim is made"


def _model_summary(metadata: dict[str, Any]) -> dict[str, Any]:
    dataset = metadata.get("dataset") or {}
    return {
        "architecture": metadata.get("architecture"),
        "arch_kwargs": metadata.get("arch_kwargs"),
        "num_parameters": metadata.get("num_parameters"),
        "input_shape": metadata.get("input_shape"),
        "dataset": {key: dataset.get(key) for key in ("name", "source", "split_seed", "trained_on", "fingerprints")},
        "weights_sha256": (metadata.get("files") or {}).get("weights.safetensors"),
        "package_version": metadata.get("package_version"),
    }


ACCOUNTANTS = (("rdp", "RDP moments accountant: an upper bound"),
               ("pld", "PLD accountant, pessimistic discretisation: an upper bound"),
               ("gdp_epsilon", "Gaussian DP central-limit approximation: can underestimate, not a guarantee"))


def epsilon_statements(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every epsilon of a privacy report, one statement per (guarantee, accountant).

    Each names its guarantee (``sepdp``, ``mmga``, ``data_independent``, ...) with that guarantee's label,
    the accountant (analysis) behind the number, delta, and whether the figure is data-independent.
    """
    statements: list[dict[str, Any]] = []
    for guarantee in (report or {}).get("guarantees", []):
        epsilon = guarantee.get("epsilon") or {}
        analyses = epsilon.get("analyses") or {}
        for key, default_label in ACCOUNTANTS:
            statements.append({
                "guarantee": guarantee.get("name"), "analysis": f"{guarantee.get('name')}/{key}",
                "accountant": analyses.get(key, default_label), "label": guarantee.get("label"),
                "epsilon": epsilon.get(key), "delta": epsilon.get("delta", (report or {}).get("delta")),
                "data_independent": bool(guarantee.get("data_independent")) and key != "gdp_epsilon",
            })
    return statements


def privacy_section(report: dict[str, Any] | None) -> dict[str, Any]:
    """The card's privacy section: each epsilon with its analysis, delta and data-independence, how the noise
    was drawn, and what the release leaves out (the private training record is never served)."""
    if not report:
        return {"statement": NO_REPORT, "noise": None, "epsilons": [], "not_released": [], "report": None}
    noise = report.get("noise") or {"mode": "unknown"}
    statement = report.get("privacy_claim")
    if noise.get("mode") == "reproducible" and noise.get("warning", "") not in (statement or ""):
        statement = f"{noise['warning']} {statement or ''}".strip()
    return {"statement": statement, "noise": noise, "epsilons": epsilon_statements(report),
            "not_released": report.get("not_released", []),
            "private_training_record": "not part of this deployment (never copied into a model directory)",
            "report": report}


def model_card(bundle: ModelBundle, device: str, batching: str, as_run: str | None = None) -> dict[str, Any]:
    """The served model's card; ``as_run`` describes how the base classifier runs (``Smooth.describe``)."""
    pipeline, config = bundle.pipeline, bundle.config
    classifier = _model_summary(pipeline.classifier_metadata)
    classifier["test_accuracy"] = pipeline.classifier_metadata.get("test_accuracy")
    if pipeline.denoiser_metadata is None:
        denoiser = None
        privacy = {"statement": NO_DENOISER, "noise": None, "epsilons": [], "not_released": [], "report": None}
    else:
        denoiser = _model_summary(pipeline.denoiser_metadata)
        privacy = privacy_section(pipeline.denoiser_metadata.get("privacy"))
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
            "method": "CERTIFY: n0 selection samples, n fresh estimation samples, one-sided Clopper-Pearson "
                      "lower bound pA at level 1 - alpha; radius = sigma * Phi^-1(pA); abstain when pA < 1/2",
            "sigma": config.sigma, "sigma_units": "[0,1]-pixel units",
            "n0": config.n0, "default_n": config.n, "max_n": config.max_n, "alpha": config.alpha,
            "noise": "keyed per image: each image's noise seed is HMAC-SHA256, under a server secret, of the "
                     "served weights' hashes, the image on its 8-bit grid and the sampling settings; client seeds "
                     + ("accepted" if config.allow_client_seed else "refused"),
            "sound_noise": config.sound_noise,
            "noise_kind": ("sound: images must be on the 8-bit grid k/255 (others are refused with 400); noise is an "
                           "exact discretized Gaussian added in integers, so the certificate is sound in floating "
                           "point (Voracek and Hein 2023; docs/CERTIFY.md)" if config.sound_noise else
                           "gaussian: float32 x + sigma * randn, the usual implementation, which is not sound in "
                           "floating point against a base model that reads low-order bits (docs/CERTIFY.md)"),
            "guarantee": "each certificate holds with probability >= 1 - alpha over its noise; the same input "
                         "with the same settings always gets the same certificate, so asking again cannot shop "
                         "for a larger radius; inputs that differ in any pixel get independent certificates "
                         "(docs/SERVING.md, 'One certificate per input')",
            "adaptive_requests": {
                "decide": "send \"radius\": R to ask whether the prediction is certified at L2 radius R",
                "estimate": "send \"adaptive\": true for the largest certifiable radius under the budget",
                "default_budget": config.max_n,
                "method": "anytime-valid: union of one-sided Clopper-Pearson bounds over a geometric schedule of "
                          "looks (alpha split over the looks); stops as soon as the answer is settled "
                          "(docs/CERTIFY.md, 'Adaptive certification (anytime-valid)')",
            },
        },
        "limits": {"max_images": config.max_images, "max_payload_bytes": config.max_payload_bytes,
                   "max_n": config.max_n, "max_latency_ms": config.max_latency_ms,
                   "max_request_samples": config.max_request_samples,
                   "max_queued_requests": config.max_queued_requests},
        "runtime": {"device": device, "batching": batching, "batch_size": config.batch_size,
                    "chunk_samples": config.chunk_samples,
                    "forward_batch": config.forward_batch_on(device.split(":")[0]),
                    "precision": config.precision, "compile": config.compile,
                    "base_classifier_as_run": as_run or f"{config.precision}, compile {config.compile}",
                    "note": "certificates are about the denoiser and classifier as run at this precision and "
                            "compilation (docs/CERTIFY.md, 'Precision and compilation')"},
    }
