"""The privacy audit's analysis: its settings, the epsilons a run claims, the verdict, the check against the
claimed noise and the audit's text. The run itself (training with canaries, scoring, writing the output
directory) is :mod:`training.audit.run`, above training; this module stays below it, with the rest of the
privacy layer.

The audit (docs/AUDIT.md): one training run with m canaries, each included with probability 1/2; the empirical
epsilon lower bounds at confidence 1 - beta by Steinke et al.'s and by Mahloujifar et al.'s Gaussian f-DP
analyses (:mod:`training.privacy.bounds`), compared with every epsilon the run claims: a lower bound above a
claim is a FAILURE (a bug in the implementation or a false claim); the audit's power
(:mod:`training.privacy.power`) says when a claim is beyond its reach (INCONCLUSIVE, not PASS); white-box
``known_others`` audits of a noised arm are checked against the claimed mechanism itself
(:mod:`training.privacy.consistency`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from training.privacy.bounds import (
    DEFAULT_BETA,
    DEFAULT_GUESS_FRACTIONS,
    one_run_lower_bounds,
)
from training.privacy.canaries import (
    WHITEBOX_SCORES,
)
from training.privacy.consistency import DEFAULT_ALPHA, DEFAULT_SIMULATIONS, check_claimed_noise
from training.privacy.membership import DEFAULT_FPR
from training.privacy.report import format_number
from transdenoiser.errors import UserError

MODES = ("whitebox", "blackbox")
AUDIT_FILE = "audit.json"
MODEL_DIR = "model"
NOT_A_RELEASE = "NOT_A_RELEASE.txt"
AUDIT_LABEL = ("EMPIRICAL LOWER BOUND (one-run privacy audit): the run is NOT (epsilon, delta)-DP for any "
               "epsilon below this, at the stated confidence; it is not a privacy guarantee")
PRIVATE_NOTE = ("The audit's scores, guesses and the model in this directory are computed from the private "
                "split (and the canaries' inclusion is the audit's secret): this directory is not a release.")


@dataclass
class AuditSettings:
    mode: str = "whitebox"
    num_canaries: int = 1000
    audit_seed: int = 0
    whitebox_score: str = "known_others"
    beta: float = DEFAULT_BETA
    guess_fractions: tuple[float, ...] = DEFAULT_GUESS_FRACTIONS
    loss_draws: int = 4  # input-noise draws per loss (black-box scores and membership inference)
    membership: bool = True
    reference_models: int = 1
    mia_fpr: float = DEFAULT_FPR
    consistency_alpha: float = DEFAULT_ALPHA  # false-alarm rate of the check against the claimed noise
    null_simulations: int = DEFAULT_SIMULATIONS
    cache_dir: str | None = None  # simulated null distributions (None: training.privacy.consistency's default)
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        checks = [
            (self.mode in MODES, f"audit mode must be one of {', '.join(MODES)}, got {self.mode!r}"),
            (self.num_canaries >= 2, f"need at least 2 canaries, got {self.num_canaries}"),
            (self.whitebox_score in WHITEBOX_SCORES,
             f"white-box score must be one of {', '.join(WHITEBOX_SCORES)}, got {self.whitebox_score!r}"),
            (0 < self.beta < 1, f"beta (1 - confidence) must lie in (0, 1), got {self.beta}"),
            (len(self.guess_fractions) >= 1 and all(0 < f <= 1 for f in self.guess_fractions),
             f"guess fractions must lie in (0, 1], got {list(self.guess_fractions)}"),
            (self.loss_draws >= 1, f"loss draws must be >= 1, got {self.loss_draws}"),
            (self.reference_models >= 0, f"reference models must be >= 0, got {self.reference_models}"),
            (0 < self.mia_fpr < 1, f"membership FPR must lie in (0, 1), got {self.mia_fpr}"),
            (0 < self.consistency_alpha < 1,
             f"the consistency check's false-alarm rate must lie in (0, 1), got {self.consistency_alpha}"),
            (self.null_simulations >= 1, f"null simulations must be >= 1, got {self.null_simulations}"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)


# ------------------------------------------------------------------------------------------------ claims

def claimed_epsilons(released_privacy: dict, private_privacy: dict | None) -> list[dict]:
    """Every epsilon the run claims, with the tightest valid upper bound of each (min of RDP and PLD)."""
    claims = []
    sources = [(g, True) for g in released_privacy.get("guarantees", [])]
    if private_privacy is not None:
        sources += [(g, False) for g in private_privacy.get("guarantees", [])
                    if g.get("name") == "explicit_noise_alone"]
    for guarantee, released in sources:
        eps = guarantee.get("epsilon", {})
        bounds = [_as_float(eps.get(k)) for k in ("rdp", "pld")]
        bounds = [b for b in bounds if b is not None]
        claims.append({"name": guarantee["name"], "label": guarantee.get("label", ""), "released": released,
                       "data_independent": guarantee.get("data_independent"),
                       "epsilon": min(bounds) if bounds else math.inf,
                       "epsilon_rdp": _as_float(eps.get("rdp")), "epsilon_pld": _as_float(eps.get("pld")),
                       "epsilon_gdp_approximation": _as_float(eps.get("gdp_epsilon")),
                       "delta": eps.get("delta")})
    return claims


def _as_float(value) -> float | None:
    if value is None:
        return None
    if value in ("inf", "+inf"):
        return math.inf
    return float(value)


def verdict(bounds: dict, claims: list[dict], power: dict | None = None, consistency: dict | None = None) -> dict:
    """FAIL if a lower bound exceeds a claimed epsilon or the run is inconsistent with the claimed noise; else
    INCONCLUSIVE if a finite claim lies above what the audit can attain (``power``); else PASS (NO CLAIM when
    nothing finite is claimed)."""
    violations = []
    for claim in claims:
        for analysis in ("epsilon_steinke", "epsilon_fdp"):
            if bounds[analysis] > claim["epsilon"]:
                violations.append({"claim": claim["name"], "claimed_epsilon": claim["epsilon"],
                                   "analysis": analysis, "lower_bound": bounds[analysis]})
    finite = [c for c in claims if math.isfinite(c["epsilon"])]
    inconsistent = consistency is not None and consistency.get("applicable") and not consistency["consistent"]
    unrefutable = [row["name"] for row in (power or {}).get("claims", [])
                   if math.isfinite(row["epsilon"]) and not row["refutable"]]
    if violations or inconsistent:
        status = "FAIL"
    elif not finite:
        status = "NO CLAIM"
    else:
        status = "INCONCLUSIVE" if unrefutable else "PASS"
    ratios = {c["name"]: {"steinke": bounds["epsilon_steinke"] / c["epsilon"],
                          "fdp": bounds["epsilon_fdp"] / c["epsilon"]} for c in finite if c["epsilon"] > 0}
    return {"status": status, "violations": violations, "inconsistent_with_claimed_noise": bool(inconsistent),
            "claims_beyond_reach": unrefutable, "tightness": ratios}


def claimed_noise_consistency(config, settings: AuditSettings, canaries, privacy: dict, bounds: dict,
                              counts: list[tuple[int, int]]) -> dict:
    """The check against the claimed noise (:func:`training.privacy.consistency.check_claimed_noise`) where it
    applies: white-box, an arm with noise, isotropic noise, a step with full noise. It always tests the
    ``known_others`` sum score (computed beside any white-box score but ``update``), the score it can simulate."""
    xi_up = _as_float(privacy.get("xi_up"))
    reasons = [(settings.mode != "whitebox", "black-box canaries: the scores are not simulable"),
               (settings.whitebox_score == "update", "the update score includes the real gradients"),
               (config.arm == "nodp", "nodp claims no noise"),
               (getattr(config, "noise", "isotropic") != "isotropic", "only isotropic noise is simulated"),
               (not xi_up, "no claimed noise multiplier"),
               (getattr(canaries, "full_noise_steps", 0) < 1, "no step carried the full noise")]
    reason = next((why for bad, why in reasons if bad), None)
    if reason is not None:
        return {"applicable": False, "reason": reason}
    known = canaries.known_others_scores() / config.clip_norm
    if settings.whitebox_score != "known_others":  # the check simulates the known_others score: its own bounds
        bounds = one_run_lower_bounds(known, canaries.included, config.delta, settings.beta, counts)
    result = check_claimed_noise(known, canaries.included, bounds,
                                 steps=canaries.full_noise_steps, sample_rate=canaries.sample_rate,
                                 noise_multiplier=xi_up, delta=config.delta, counts=counts, beta=settings.beta,
                                 alpha=settings.consistency_alpha, simulations=settings.null_simulations,
                                 cache_dir=settings.cache_dir)
    return {"applicable": True, **result}


def _fmt(value) -> str:
    return format_number(value, digits=3, missing="n/a")


def format_audit(result: dict) -> str:
    """Readable text of an audit summary (the checkpoint's ``audit`` entry)."""
    v = result["verdict"]
    lines = [f"Privacy audit ({result['mode']}, {result['num_canaries']} canaries, audit seed {result['audit_seed']}, "
             f"noise {result['noise']}): {v['status']}",
             f"  {result['label']}",
             f"  empirical epsilon lower bound at {100 * result['confidence']:g}% confidence, delta "
             f"{result['delta']:g}: Steinke et al. {_fmt(result['epsilon_steinke'])} "
             f"({result['best_steinke']['correct']}/{result['best_steinke']['guesses']} correct); "
             f"f-DP (Gaussian) {_fmt(result['epsilon_fdp'])} (mu {_fmt(result['mu_fdp'])}; "
             f"{result['best_fdp']['correct']}/{result['best_fdp']['guesses']} correct); "
             f"best of {result['guess_counts_tried']} guess counts, Bonferroni"]
    for claim in result["claims"]:
        where = "released" if claim["released"] else "private record"
        ratio = v["tightness"].get(claim["name"])
        tight = (f"; lower/claimed: Steinke {ratio['steinke']:.2f}, f-DP {ratio['fdp']:.2f}" if ratio else "")
        lines.append(f"  claimed [{claim['name']}] ({where}): epsilon {_fmt(claim['epsilon'])}{tight}")
    if not result["claims"]:
        lines.append("  no epsilon is claimed for this arm: the bound measures its leakage")
    if result.get("power"):
        lines += ["  " + line for line in format_power(result["power"]).splitlines()]
    consistency = result.get("consistency") or {}
    if consistency.get("applicable"):
        lines += ["  " + line for line in format_consistency(consistency).splitlines()]
    elif consistency:
        lines.append(f"  check against the claimed noise: not applicable ({consistency['reason']})")
    for violation in v["violations"]:
        lines.append(f"  FAILURE: {violation['analysis']} lower bound {_fmt(violation['lower_bound'])} exceeds the "
                     f"claimed [{violation['claim']}] epsilon {_fmt(violation['claimed_epsilon'])}: a bug or a "
                     "false claim")
    if v.get("inconsistent_with_claimed_noise"):
        lines.append("  FAILURE: the audit is inconsistent with the claimed noise: the run leaked more, or added less "
                     "noise, than the mechanism its epsilon is computed for")
    if v["status"] == "INCONCLUSIVE":
        lines.append(f"  INCONCLUSIVE: the audit cannot refute [{', '.join(v['claims_beyond_reach'])}] at this size "
                     "(see the attainable bound above); this is not a PASS")
    mia = result.get("membership_inference")
    if mia:
        for name in ("loss_threshold", "calibrated"):
            if name in mia:
                a = mia[name]
                lines.append(f"  membership inference [{name}]: AUC {a['auc']:.4f}, TPR {a['tpr_at_fpr']:.4f} at FPR "
                             f"{a['fpr']:g} ({a['members']} members vs {a['nonmembers']} test non-members)")
    lines.append(f"  {result['note']}")
    return "\n".join(lines)


def _needed(count) -> str:
    return f"{count:,} canaries" if count is not None else "no canary count up to 100,000 (not at this delta)"


def format_power(power: dict) -> str:
    """The audit's power: attainable bounds, and per claim whether it can be refuted (or how many canaries)."""
    a = power["attainable"]
    lines = [f"audit power: with {power['canaries']:,} canaries, {a['guess_counts']} guess counts and "
             f"{100 * power['confidence']:g}% confidence the largest attainable lower bound (every guess right) is "
             f"{_fmt(a['steinke'])} (Steinke et al.) / {_fmt(a['fdp'])} (f-DP)"]
    for row in power["claims"]:
        if row["refutable"]:
            lines.append(f"  claim [{row['name']}] epsilon {_fmt(row['epsilon'])}: within reach")
        else:
            need = row["canaries_needed"]
            lines.append(f"  claim [{row['name']}] epsilon {_fmt(row['epsilon'])}: ABOVE the attainable bound: this "
                         f"audit cannot refute it at this size; it would take {_needed(need['fdp'])} (f-DP), "
                         f"{_needed(need['steinke'])} (Steinke et al.)")
    return "\n".join(lines)


def format_consistency(c: dict) -> str:
    b, n = c["bound_test"], c["noise_test"]
    state = "consistent" if c["consistent"] else "INCONSISTENT"
    return "\n".join([
        f"check against the claimed noise (xi {c['noise_multiplier']:.4g}, q {c['sample_rate']:.4g}, "
        f"T {c['steps']} steps): {state} with it (false-alarm rate <= {c['alpha']:g})",
        f"  {b['statistic']} {_fmt(b['observed'])} vs its distribution under the claimed mechanism "
        f"({b['simulations']} simulated runs): median {_fmt(b['null_median'])}, "
        f"{100 * b['quantile_level']:g}% quantile {_fmt(b['null_quantile'])}, p = {b['p_value']:.3g}",
        f"  noise measured on the {n['excluded_canaries']} excluded canaries: multiplier "
        f"{n['measured_noise_multiplier']:.4g} (claimed {n['claimed_noise_multiplier']:.4g}), p = {n['p_value']:.3g}"])


__all__ = ["AUDIT_FILE", "AUDIT_LABEL", "AuditSettings", "MODEL_DIR", "MODES", "NOT_A_RELEASE", "PRIVATE_NOTE",
           "claimed_epsilons", "claimed_noise_consistency", "format_audit", "format_consistency", "format_power",
           "verdict"]
