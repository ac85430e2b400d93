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


def epsilon_statements(report: Any, path: str = "") -> list[dict[str, Any]]:
    """Every (epsilon, delta) found in a privacy report, each with the report key (the analysis) it came from."""
    found: list[dict[str, Any]] = []
    if isinstance(report, dict):
        if "epsilon" in report:
            found.append({"analysis": path or "(top level)", "epsilon": report.get("epsilon"),
                          "delta": report.get("delta"),
                          **({"note": report["note"]} if isinstance(report.get("note"), str) else {})})
        for key, value in report.items():
            found.extend(epsilon_statements(value, f"{path}.{key}" if path else str(key)))
    elif isinstance(report, list):
        for index, value in enumerate(report):
            found.extend(epsilon_statements(value, f"{path}[{index}]"))
    return found


def model_card(bundle: ModelBundle, device: str, batching: str) -> dict[str, Any]:
    pipeline, config = bundle.pipeline, bundle.config
    classifier = _model_summary(pipeline.classifier_metadata)
    classifier["test_accuracy"] = pipeline.classifier_metadata.get("test_accuracy")
    if pipeline.denoiser_metadata is None:
        denoiser, privacy = None, {"statement": NO_DENOISER, "report": None, "epsilons": []}
    else:
        denoiser = _model_summary(pipeline.denoiser_metadata)
        report = pipeline.denoiser_metadata.get("privacy")
        privacy = {"statement": None if report else NO_REPORT, "report": report,
                   "epsilons": epsilon_statements(report) if report else []}
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
            "noise": "fresh per request (seeded from the OS CSPRNG); client seeds "
                     + ("accepted" if config.allow_client_seed else "refused"),
            "guarantee": "each certificate holds with probability >= 1 - alpha over the request's noise; "
                         "repeated calls are independent certificates (keeping the best of k calls voids the "
                         "level: the error bound becomes k * alpha)",
        },
        "limits": {"max_images": config.max_images, "max_payload_bytes": config.max_payload_bytes,
                   "max_n": config.max_n},
        "runtime": {"device": device, "batching": batching, "batch_size": config.batch_size,
                    "chunk_samples": config.chunk_samples,
                    "forward_batch": config.forward_batch_on(device.split(":")[0])},
    }
