"""The privacy report saved with every denoiser: a JSON-safe dict (metadata ``privacy``) and readable text.

Every epsilon names the analysis behind it. For the transdenoiser arm there are two figures, and only the
second is computed from noise that was actually added; the first rests on the paper's analysis and is
data-dependent (see docs/PRIVACY.md).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from training.privacy.accounting import epsilon_report
from transdenoiser.records import PrivacyReport

QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
NO_CLAIM = "no privacy claim: nodp trains on noisy inputs with an ordinary optimiser and adds no gradient noise"
SEPDP_LABEL = "DP-SGD (sepdp): Poisson-subsampled Gaussian mechanism, noise fixed in advance: data-independent"
MMGA_LABEL = ("MMGA (paper's analysis, Corollary 2 + Theorem 3; data-dependent, rests on the paper's Lemmas 1-2, "
              "whose proofs are in appendices not reproduced here)")
EXPLICIT_LABEL = ("explicit noise alone: what the explicitly added noise would guarantee had its per-step levels "
                  "been fixed in advance; they were chosen from the private data (S_min of the batch), so only "
                  "the sepdp arm's figure is a data-independent guarantee")
MMGA_CAVEAT = ("The MMGA figure is NOT a data-independent guarantee: it assumes the input noise b_i acts like "
               "gradient noise of covariance sigma^2 T K_t (Lemma 2, including its factor T, whose proof we do "
               "not have), that the Taylor split of line 8 leaks nothing, and that the noise levels chosen from "
               "the private batch leak nothing.")


SEPDP_EQUIVALENT_LABEL = ("data-independent guarantee: every step added N(0, (xi_up C)^2 I) once to the whole clipped "
                          "sum (merge_uncredited_noise, and S_min is never computed because the denoiser's parameter "
                          "count w exceeds max_smin_dim, both fixed before training): the sepdp mechanism exactly")
NO_DATA_INDEPENDENT_LABEL = ("data-independent guarantee: none established. Algorithm 1 chooses each step's "
                             "explicit noise from the private batch (line 8's split and S_min); no data-independent "
                             "analysis bounds what that choice reveals, so no data-independent epsilon is claimed")
# What the private training record holds and a release never carries (docs/PRIVACY.md explains each).
NOT_RELEASED = (
    "per-step Poisson batch sizes and the number of empty batches",
    "training losses on the private split (per step and per epoch)",
    "Algorithm 1's per-step group sizes, S_min values, input-noise and explicit-noise multipliers, and the "
    "epsilon computed from those data-dependent multipliers",
    "training time per epoch",
    "the fingerprint (hash) of the private split",
    "the noise generator's state and the optimiser state",
)
# Keys of a full report that a release keeps: public settings and data-independent quantities only.
RELEASED_KEYS = ("arm", "sigma", "clip_norm", "xi_low", "xi_up", "merge_uncredited_noise", "sample_rate",
                 "num_examples",
                 "expected_batch_size", "delta", "steps_planned", "steps_done", "complete", "units",
                 "target_epsilon", "calibration_accountant", "noise", "initialisation", "privacy_claim")
# Guarantees whose epsilon is computed from settings fixed in advance only (mmga's claim is still data-dependent).
DATA_INDEPENDENT_GUARANTEES = ("sepdp", "mmga", "sepdp_equivalent")
# A step's num_nonnegative when line 8's remainder was not computed (no step could be credited: see below).
REMAINDER_NOT_COMPUTED = -1


def uncredited_by_construction(merge_uncredited_noise: bool, num_parameters: int, max_smin_dim: int) -> bool:
    """Whether no transdenoiser step can earn input-noise credit, whatever the data: S_min is never computed
    (w > max_smin_dim: taken as 0, so line 16 gives sigma_bar = xi_up) and uncredited steps are merged, so every
    step adds xi_up once to the whole clipped sum (the sepdp step). Then line 8's remainder changes nothing."""
    return merge_uncredited_noise and num_parameters > max_smin_dim


def json_safe(value: Any) -> Any:
    """Replace inf by the string "inf" and nan by None, recursively (JSON has neither)."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return json_safe(value.item())
    return value


def distribution(values: np.ndarray) -> dict[str, Any] | None:
    """min / quantiles / max / mean of the finite entries, or None if there are none."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    qs = np.quantile(values, QUANTILES)
    return {"count": int(values.size), "min": float(qs[0]), "q10": float(qs[1]), "q25": float(qs[2]),
            "median": float(qs[3]), "q75": float(qs[4]), "q90": float(qs[5]), "max": float(qs[6]),
            "mean": float(values.mean())}


def build_privacy_report(*, arm: str, sigma: float, clip_norm: float, xi_low: float, xi_up: float,
                         sample_rate: float, num_examples: int, expected_batch_size: float, delta: float,
                         steps_planned: int, history: dict[str, np.ndarray], smin_methods: list[str],
                         max_smin_dim: int, num_parameters: int, noise: dict[str, Any] | None = None,
                         merge_uncredited_noise: bool = False, initialisation: dict[str, Any] | None = None,
                         target_epsilon: float | None = None,
                         calibration_accountant: str | None = None) -> dict[str, Any]:
    """Assemble the FULL report from the per-step history (arrays of length steps done).

    The full report includes statistics of the private data (batch sizes, S_min, per-step noise): it belongs
    in the private training record. :func:`released_privacy_report` makes the version a release may carry.
    ``noise``: how the noise was drawn (``{"mode": "secret"|"reproducible", ...}``).
    """
    steps_done = int(len(history["batch_size"]))
    batch = np.asarray(history["batch_size"], dtype=np.int64)
    report: dict[str, Any] = {
        "arm": arm, "sigma": sigma, "clip_norm": clip_norm, "xi_low": xi_low, "xi_up": xi_up,
        "sample_rate": sample_rate, "num_examples": num_examples, "expected_batch_size": expected_batch_size,
        "delta": delta, "steps_planned": steps_planned, "steps_done": steps_done,
        "complete": steps_done == steps_planned,
        "units": "noise multipliers = std of Gaussian noise on the SUMMED clipped gradient / C; pixels in [0,1]",
        "empty_batches": int((batch == 0).sum()) if arm != "nodp" else 0,
        "merge_uncredited_noise": merge_uncredited_noise if arm == "transdenoiser" else None,
        "target_epsilon": target_epsilon, "calibration_accountant": calibration_accountant,
        "noise": noise if noise is not None else {"mode": "unknown"},
        "initialisation": initialisation or {"kind": "random"},
        "guarantees": [],
    }
    if arm == "nodp":
        report["privacy_claim"] = NO_CLAIM
        return json_safe(report)
    if steps_done == 0:
        report["privacy_claim"] = "no steps taken yet: nothing spent"
        return json_safe(report)
    if arm == "sepdp":
        report["privacy_claim"] = "a data-independent (epsilon, delta)-DP guarantee for the released denoiser:"
        report["guarantees"].append({"name": "sepdp", "label": SEPDP_LABEL, "data_independent": True,
                                     "noise_multiplier": xi_up,
                                     "epsilon": epsilon_report(sample_rate, xi_up, steps_done, delta)})
        return json_safe(report)

    explicit = np.asarray(history["explicit_multiplier"], dtype=np.float64)
    report["privacy_claim"] = MMGA_CAVEAT
    report["guarantees"].append({"name": "mmga", "label": MMGA_LABEL, "data_independent": False,
                                 "noise_multiplier": xi_up,
                                 "epsilon": epsilon_report(sample_rate, xi_up, steps_done, delta)})
    if uncredited_by_construction(merge_uncredited_noise, num_parameters, max_smin_dim):
        report["guarantees"].append({"name": "sepdp_equivalent", "label": SEPDP_EQUIVALENT_LABEL,
                                     "data_independent": True, "noise_multiplier": xi_up,
                                     "epsilon": epsilon_report(sample_rate, xi_up, steps_done, delta)})
    report["guarantees"].append({"name": "explicit_noise_alone", "label": EXPLICIT_LABEL, "data_independent": False,
                                 "noise_multiplier_per_step": distribution(explicit),
                                 "steps_without_explicit_noise": int((explicit == 0).sum()),
                                 "epsilon": epsilon_report(sample_rate, explicit.tolist(), steps_done, delta)})
    nonneg = np.asarray(history["num_nonnegative"], dtype=np.int64)
    smin = np.asarray(history["smin"], dtype=np.float64)
    sigma_bar = np.asarray(history["sigma_bar"], dtype=np.float64)
    input_mult = np.asarray(history["input_multiplier"], dtype=np.float64)
    has_nonneg = nonneg > 0
    split = nonneg != REMAINDER_NOT_COMPUTED  # steps whose remainders were computed
    method_counts = {m: smin_methods.count(m) for m in sorted(set(smin_methods)) if m}
    report["transdenoiser"] = {
        "nonnegative_share": float(nonneg[split].sum() / batch[split].sum()) if batch[split].sum() else None,
        "examples_seen": int(batch.sum()), "examples_split": int(batch[split].sum()),
        "nonnegative_examples": int(nonneg[split].sum()) if split.any() else None,
        "remainder_not_computed": (f"line 8's Taylor remainder not computed in {int((~split).sum())} steps "
                                   f"({int(batch[~split].sum())} examples): w={num_parameters} > max_smin_dim="
                                   f"{max_smin_dim} with merged noise, so no step could be credited and each was "
                                   "the sepdp step (the whole batch's clipped sum, xi_up once)"
                                   if not split.all() else None),
        "smin": distribution(smin[has_nonneg]),
        "smin_methods": method_counts,
        "smin_not_computed": (f"not computed in {method_counts['too_large']} steps: w={num_parameters} > "
                              f"max_smin_dim={max_smin_dim}, treated as 0: full explicit noise"
                              if method_counts.get("too_large") else None),
        "input_noise_multiplier": distribution(input_mult[has_nonneg]),
        "sigma_bar": distribution(sigma_bar[has_nonneg]),
        "steps_with_nonnegative_cases": int(has_nonneg.sum()),
        "share_steps_input_noise_reduced_explicit_noise": float((sigma_bar[has_nonneg] < xi_up).sum()
                                                                / max(1, steps_done)),
        "lemma2_factor_T": steps_planned,
    }
    return json_safe(report)


def released_privacy_report(report: dict[str, Any]) -> dict[str, Any]:
    """The part of a full report a release may carry: public settings and data-independent epsilons only.

    Kept: the settings fixed before training (sigma, C, xi_low, xi_up, q, N, B, delta, the planned steps),
    how the noise was drawn, and the guarantees computed from those alone (sepdp's DP-SGD epsilon; the MMGA
    figure, which uses xi_up and the step count only but rests on a data-dependent, unproven analysis and says
    so). Dropped: everything computed from the private batches (see :data:`NOT_RELEASED`). For the
    transdenoiser arm a ``data_independent`` entry states that no data-independent epsilon is established.
    """
    out = {key: report[key] for key in RELEASED_KEYS if key in report}
    guarantees = [g for g in report.get("guarantees", []) if g.get("name") in DATA_INDEPENDENT_GUARANTEES]
    if report.get("arm") == "transdenoiser" and guarantees and not any(g["data_independent"] for g in guarantees):
        guarantees.append({"name": "data_independent", "label": NO_DATA_INDEPENDENT_LABEL, "data_independent": True,
                           "epsilon": {"rdp": "inf", "pld": "inf", "gdp_mu": "inf", "gdp_epsilon": "inf",
                                       "delta": report["delta"], "analyses": {}}})
    out["guarantees"] = guarantees
    if report.get("noise", {}).get("mode") == "reproducible":
        out["privacy_claim"] = f"{report['noise']['warning']} {out.get('privacy_claim', '')}".strip()
    if report.get("arm") != "nodp":
        out["not_released"] = list(NOT_RELEASED)
    return json_safe(out)


def format_number(value, digits: int = 4, missing: str = "not computed") -> str:
    """A report figure as text: ``digits`` significant digits, ``missing`` for None, strings (e.g. "inf") as they
    are; the one number format of the privacy, baseline and audit reports."""
    if value is None:
        return missing
    if isinstance(value, str):
        return value
    return f"{value:.{digits}g}"


def format_epsilon_line(eps: dict) -> str:
    """The report line of one guarantee's epsilon at its delta by each accountant (RDP, PLD, GDP)."""
    return (f"     epsilon at delta {eps['delta']:g}: RDP (moments accountant) {format_number(eps['rdp'])}; "
            f"PLD {format_number(eps['pld'])}; GDP mu {format_number(eps['gdp_mu'])} -> epsilon "
            f"{format_number(eps['gdp_epsilon'])} (GDP: CLT approximation, can underestimate)")


def _dist(d: dict | None) -> str:
    if not d:
        return "n/a"
    return (f"min {d['min']:.4g}, q25 {d['q25']:.4g}, median {d['median']:.4g}, q75 {d['q75']:.4g}, "
            f"max {d['max']:.4g} ({d['count']} steps)")


def format_privacy_report(report: dict[str, Any] | PrivacyReport) -> str:
    """Readable text of a report made by :func:`build_privacy_report` (the dict, or its typed record)."""
    if isinstance(report, PrivacyReport):
        report = report.to_json()
    lines = [f"Privacy report: arm {report['arm']}"
             + ("" if report.get("complete", True) else f"  (INCOMPLETE: {report['steps_done']} of "
                                                         f"{report['steps_planned']} steps)"),
             f"  input noise sigma {report['sigma']} (pixels in [0,1]); clip norm C {report['clip_norm']}; "
             f"xi_low {report['xi_low']:.4g}, xi_up {report['xi_up']:.4g} (noise multipliers: std / C on the summed "
             "clipped gradient)",
             f"  Poisson sample rate q {report['sample_rate']:.5g} (expected batch {report['expected_batch_size']:g} "
             f"of N {report['num_examples']}), steps {report['steps_done']} of {report['steps_planned']}, "
             f"delta {report['delta']:g}"]
    noise = report.get("noise") or {}
    if noise.get("mode") == "reproducible" and noise["warning"] not in report.get("privacy_claim", ""):
        lines.insert(1, f"  {noise['warning']}")
    elif noise.get("mode") == "secret":
        lines.append("  noise: secret (" + noise["source"] + ")")
    if report["arm"] == "nodp":
        return "\n".join([lines[0], f"  input noise sigma {report['sigma']} (pixels in [0,1]); "
                           f"{report['steps_done']} steps", f"  {report['privacy_claim']}"])
    init = report.get("initialisation") or {}
    if init.get("kind") == "public":
        digest = f", weights sha256 {init['weights_sha256'][:16]}..." if init.get("weights_sha256") else ""
        how = ("trained without noise by this run" if init.get("phase") else
               "trained on the public split by its own metadata")
        lines.append(f"  initialisation: public ({init['checkpoint']}{digest}; {how}: no privacy spent on it)")
    if report.get("target_epsilon") is not None:
        lines.append(f"  xi_up calibrated for target epsilon {report['target_epsilon']} with the "
                     f"{report['calibration_accountant']} accountant")
    lines.append(f"  {report['privacy_claim']}")
    for g in report["guarantees"]:
        eps = g["epsilon"]
        lines.append(f"  [{g['name']}] {g['label']}")
        if g["name"] == "data_independent":
            lines.append("     epsilon: none established (inf)")
            continue
        lines.append(format_epsilon_line(eps))
        if "steps_without_explicit_noise" in g:
            lines.append(f"     per-step explicit multiplier: {_dist(g['noise_multiplier_per_step'])}; "
                         f"steps with none: {g['steps_without_explicit_noise']}")
    td = report.get("transdenoiser")
    if td:
        if td.get("nonnegative_share") is not None:
            lines.append(f"  non-negative cases (line 8 remainder >= 0): {100 * td['nonnegative_share']:.1f}% of "
                         f"{td.get('examples_split', td['examples_seen'])} examples split; steps with any: "
                         f"{td['steps_with_nonnegative_cases']}")
        if td.get("remainder_not_computed"):
            lines.append(f"  {td['remainder_not_computed']}")
        lines.append(f"  S_min(K_t): {_dist(td['smin'])}; how obtained: {td['smin_methods']}")
        if td.get("smin_not_computed"):
            lines.append(f"  S_min {td['smin_not_computed']}")
        lines.append(f"  input-noise multiplier sigma*sqrt(T*S_min)/C: {_dist(td['input_noise_multiplier'])}")
        lines.append(f"  sigma_bar (line 16): {_dist(td['sigma_bar'])}")
        lines.append(f"  share of steps where input noise reduced the explicit noise: "
                     f"{100 * td['share_steps_input_noise_reduced_explicit_noise']:.1f}%")
    if "empty_batches" in report:
        lines.append(f"  empty Poisson batches (noise still added, step counted): {report['empty_batches']}")
    if report.get("not_released"):
        lines.append("  not released (kept in the private training record only): "
                     + "; ".join(report["not_released"]))
    return "\n".join(lines)
