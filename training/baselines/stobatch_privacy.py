"""StoBatch's privacy (the two analyses of :mod:`training.baselines.stobatch`, never confused): the paper's budget
split and the Laplace scales it sets, the DP-SGD plan (noise multiplier calibrated by dp-accounting), and the
released privacy report with its text."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.baselines.common import format_guarantee_lines
from training.baselines.stobatch_config import StoBatchConfig
from training.privacy.report import format_number as _number

ARM = "stobatch"  # the arm's name, in its metadata and privacy report
PAPER_ANALYSIS_LABEL = (
    "the paper's analysis (Phan et al. 2020): eps1 + eps1/gamma_x + eps1/gamma + eps2, objective perturbation with "
    "Laplace noise drawn once per disjoint batch; NOT a guarantee for this model: the perturbed coefficients depend "
    "on the parameters being trained (h = W1 x, the hidden features under the output layer), so one fixed noise "
    "draw is reused at every parameter value the training visits, and ||W1|| is taken at initialisation while W1 "
    "is trained (docs/BASELINES.md, StoBatch)")
OURS_LABEL = (
    "DP-SGD over disjoint batches: every per-example gradient clipped to L2 norm C, Gaussian noise N(0, (z C)^2 I) "
    "on the sum; each example is in one step per epoch, so E epochs compose E Gaussian mechanisms (no "
    "amplification by sampling claimed); noise fixed in advance: data-independent")



@dataclass(frozen=True)
class PaperBudget:
    """The paper's privacy budget split and the Laplace noise scales it sets (pixels in [0, 1])."""

    paper_epsilon: float  # eps1 + eps1/gamma_x + eps1/gamma + eps2
    eps1: float
    eps2: float
    gamma_x: float
    gamma: float
    reconstruction_sensitivity: float  # Delta_R
    output_sensitivity: float  # Delta_3 = 2 x (hidden units under the output layer)
    first_layer_norm_at_init: float  # ||W1|| at initialisation
    batch_size: float  # m
    input_scale: float  # Laplace scale of the input noise: Delta_R / (m eps1)
    hidden_scale: float  # Laplace scale of the first-layer noise: 2 Delta_R / (m eps1)
    output_scale: float  # Laplace scale of the output-layer coefficient noise: Delta_3 / (m eps2)


def paper_budget(total_epsilon: float, output_share: float, reconstruction_sens: float, output_sens: float,
                 w1_norm: float, batch_size: float) -> PaperBudget:
    """Split the paper's total budget: eps2 = share x total; eps1 chosen so that eps1 (1 + 1/gamma_x + 1/gamma)
    is the rest (the public code's epsilon2_update)."""
    eps2 = output_share * total_epsilon
    gamma_x = reconstruction_sens / batch_size
    gamma = 2 * reconstruction_sens / (batch_size * w1_norm)
    eps1 = (total_epsilon - eps2) / (1 + 1 / gamma_x + 1 / gamma)
    return PaperBudget(
        paper_epsilon=eps1 * (1 + 1 / gamma_x + 1 / gamma) + eps2, eps1=eps1, eps2=eps2, gamma_x=gamma_x,
        gamma=gamma, reconstruction_sensitivity=reconstruction_sens, output_sensitivity=output_sens,
        first_layer_norm_at_init=w1_norm, batch_size=batch_size,
        input_scale=reconstruction_sens / (batch_size * eps1),
        hidden_scale=2 * reconstruction_sens / (batch_size * eps1),
        output_scale=output_sens / (batch_size * eps2))


def noise_description(config: StoBatchConfig) -> dict[str, Any]:
    if config.reproducible_noise:
        return {"mode": "reproducible", "seed": config.seed,
                "warning": ("REPRODUCIBLE NOISE: the DP noise, the batches and the Laplace noise can be recomputed "
                            f"from the recorded seed ({config.seed}); no epsilon in this report holds against anyone "
                            "who has the seed. For research only.")}
    return {"mode": "secret", "seed": None,
            "source": "a generator seeded from the operating system's CSPRNG; the seed is not recorded anywhere"}


def plan(config: StoBatchConfig, num_examples: int) -> dict[str, Any]:
    """Batches K, expected batch size N/K, and the DP-SGD noise multiplier z (calibrated if a target is set)."""
    from training.privacy.accounting import noise_multiplier_for_epsilon

    num_batches = max(1, round(num_examples / config.batch_size))
    if config.target_epsilon is not None:
        z = noise_multiplier_for_epsilon(config.target_epsilon, 1.0, config.epochs, config.delta,
                                         accountant=config.calibration_accountant)
    else:
        z = float(config.noise_multiplier)
    return {"num_batches": num_batches, "expected_batch_size": float(config.batch_size),
            "steps_per_epoch": num_batches, "total_steps": num_batches * config.epochs,
            "noise_multiplier": float(z), "compositions": config.epochs}


def privacy_report(config: StoBatchConfig, schedule: dict[str, Any], budget: PaperBudget, num_examples: int,
                   epochs_done: int) -> dict[str, Any]:
    """The released privacy report: ours (data-independent, dp-accounting) and the paper's analysis (labelled)."""
    from training.privacy.accounting import epsilon_report
    from training.privacy.report import json_safe

    noise = noise_description(config)
    claim = ("a data-independent (epsilon, delta)-DP guarantee for the released classifier (DP-SGD over disjoint "
             "batches); the paper's own epsilon is shown beside it, labelled, and is not a guarantee")
    if noise["mode"] == "reproducible":
        claim = f"{noise['warning']} {claim}"
    report: dict[str, Any] = {
        "arm": ARM, "clip_norm": config.clip_norm, "xi_up": schedule["noise_multiplier"],
        "noise_multiplier": schedule["noise_multiplier"], "delta": config.delta, "num_examples": num_examples,
        "sampling": "disjoint batches, each visited once per epoch (stochastic batching); no Poisson sampling",
        "num_batches": schedule["num_batches"], "expected_batch_size": schedule["expected_batch_size"],
        "epochs_planned": config.epochs, "epochs_done": epochs_done, "complete": epochs_done == config.epochs,
        "steps_planned": schedule["total_steps"], "steps_done": epochs_done * schedule["num_batches"],
        "units": "noise multiplier = std of Gaussian noise on the SUMMED clipped gradient / C; pixels in [0,1]",
        "target_epsilon": config.target_epsilon,
        "calibration_accountant": config.calibration_accountant if config.target_epsilon is not None else None,
        "noise": noise, "initialisation": {"kind": "random", "seed": config.seed},
        "privacy_claim": claim, "guarantees": [],
    }
    if epochs_done > 0:
        report["guarantees"].append({
            "name": "dp_sgd_disjoint_batches", "label": OURS_LABEL, "data_independent": True,
            "noise_multiplier": schedule["noise_multiplier"], "gaussian_compositions": epochs_done,
            "epsilon": epsilon_report(1.0, schedule["noise_multiplier"], epochs_done, config.delta)})
    report["paper_analysis"] = {
        "label": PAPER_ANALYSIS_LABEL, "data_independent": False, "epsilon": budget.paper_epsilon,
        "delta": 0.0, "eps1": budget.eps1, "eps2": budget.eps2, "gamma_x": budget.gamma_x, "gamma": budget.gamma,
        "Delta_R": budget.reconstruction_sensitivity, "Delta_3": budget.output_sensitivity,
        "W1_norm_at_init": budget.first_layer_norm_at_init}
    report["noise_layer"] = {
        "label": "the Laplace noise of the paper's mechanism, drawn once per disjoint batch (pixels in [0,1])",
        "input_scale": budget.input_scale, "hidden_scale": budget.hidden_scale,
        "output_scale": budget.output_scale if config.output_perturbation else 0.0}
    return json_safe(report)


def format_privacy_report(report: dict[str, Any]) -> str:
    """Readable text of :func:`privacy_report`'s dict."""
    lines = [f"Privacy report: arm {report['arm']}" + ("" if report.get("complete", True) else
                                                      f"  (INCOMPLETE: {report['epochs_done']} of "
                                                      f"{report['epochs_planned']} epochs)"),
             f"  clip norm C {report['clip_norm']}; noise multiplier z {report['noise_multiplier']:.4g} (std / C on "
             "the summed clipped gradient); delta " + f"{report['delta']:g}",
             f"  {report['sampling']}: K {report['num_batches']} batches of {report['expected_batch_size']:g} "
             f"examples on average (N {report['num_examples']}), {report['epochs_done']} of "
             f"{report['epochs_planned']} epochs, {report['steps_done']} steps"]
    if report.get("target_epsilon") is not None:
        lines.append(f"  z calibrated for target epsilon {report['target_epsilon']} with the "
                     f"{report['calibration_accountant']} accountant")
    lines.append(f"  {report['privacy_claim']}")
    lines += format_guarantee_lines(report.get("guarantees", []))
    paper = report["paper_analysis"]
    lines.append(f"  [paper_analysis] {paper['label']}")
    lines.append(f"     epsilon {_number(paper['epsilon'])} (delta 0): eps1 {_number(paper['eps1'])}, eps2 "
                 f"{_number(paper['eps2'])}, gamma_x {_number(paper['gamma_x'])}, gamma {_number(paper['gamma'])}, "
                 f"Delta_R {_number(paper['Delta_R'])}, Delta_3 {_number(paper['Delta_3'])}")
    layer = report["noise_layer"]
    lines.append(f"  [noise_layer] {layer['label']}: input {_number(layer['input_scale'])}, first layer "
                 f"{_number(layer['hidden_scale'])}, output coefficients {_number(layer['output_scale'])}")
    return "\n".join(lines)
