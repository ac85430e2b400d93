"""``privacy_audit``: train a denoiser with canaries, guess which were included, bound epsilon from below.

One training run of any arm (nodp, sepdp, transdenoiser) through the product's own ``train_denoiser``, with
m canaries each included with probability 1/2 (reproducibly from the audit seed; the training noise is
drawn as the product draws it: secret unless ``reproducible_noise``). Then:

1. score each canary (:mod:`training.privacy.canaries`), make the abstaining guesses and compute the
   empirical epsilon lower bounds at confidence 1 - beta by Steinke et al.'s analysis and by Mahloujifar et
   al.'s Gaussian f-DP analysis (:mod:`training.privacy.bounds`);
2. compare them with every epsilon the run claims (the released report's guarantees and the private
   record's explicit-noise figure): a lower bound above a claim is a FAILURE (a bug in the implementation
   or a false claim);
3. state the audit's power (:mod:`training.privacy.power`): the largest bound its canaries, guesses and
   confidence can reach; a claim above it cannot be refuted, and the verdict is then INCONCLUSIVE, not PASS;
4. white-box ``known_others`` audits of a noised arm: check the bounds and the excluded canaries' scores
   against the claimed mechanism itself (:mod:`training.privacy.consistency`); a run inconsistent with the
   claimed noise is a FAILURE even when its bound stays below the claim;
5. optionally run membership inference on the trained denoiser (:mod:`training.privacy.membership`).

Output directory (NOT a release: the scores and guesses are computed from a model trained on the private
split, and the canary inclusion is the audit's secret):

- ``OUT/model/``: the audited checkpoint (it includes canaries; never release it). Its ``metadata.json``
  carries an ``audit`` entry and its ``privacy_report.txt`` an audit section, both labelled as an
  EMPIRICAL LOWER BOUND.
- ``OUT/audit.json``: everything, including per-canary scores, inclusion and guesses.
- ``OUT/NOT_A_RELEASE.txt``: says so.
"""
from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.privacy.bounds import (
    DEFAULT_BETA,
    DEFAULT_GUESS_FRACTIONS,
    abstaining_guesses,
    guess_counts,
    one_run_lower_bounds,
)
from training.privacy.canaries import (
    WHITEBOX_SCORES,
    GradientCanaries,
    ImageCanaries,
    audited_arm_class,
    reconstruction_losses,
)
from training.privacy.consistency import DEFAULT_ALPHA, DEFAULT_SIMULATIONS, check_claimed_noise
from training.privacy.membership import DEFAULT_FPR, CalibratedAttack, LossThresholdAttack, attack_metrics
from training.privacy.power import audit_power
from training.privacy.report import format_number, json_safe
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent

MODES = ("whitebox", "blackbox")
AUDIT_FILE = "audit.json"
MODEL_DIR = "model"
NOT_A_RELEASE = "NOT_A_RELEASE.txt"
AUDIT_LABEL = ("EMPIRICAL LOWER BOUND (one-run privacy audit): the run is NOT (epsilon, delta)-DP for any "
               "epsilon below this, at the stated confidence; it is not a privacy guarantee")
PRIVATE_NOTE = ("The audit's scores, guesses and the model in this directory are computed from the private "
                "split (and the canaries' inclusion is the audit's secret): this directory is not a release.")
_ARM_LOCK = threading.Lock()


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


# ------------------------------------------------------------------------------------------------ the audit

def _swap_arm(arm: str, cls: type | None):
    from training import arms

    original = arms.ARM_CLASSES[arm]
    if cls is not None:
        arms.ARM_CLASSES[arm] = cls
    return original


def privacy_audit(config, dataset, classifier, device: torch.device, settings: AuditSettings, out_dir: str | Path,
                  track: Track = silent) -> dict[str, Any]:
    """Train ``config``'s arm with canaries, audit it, write ``out_dir`` (see the module docstring).

    Returns the JSON-safe audit summary (also stored as the checkpoint's ``audit`` entry): mode, canaries,
    the lower bounds, the claims, the verdict and, if requested, membership inference.
    """
    from training.arms import ARM_CLASSES
    from training.denoisers import denoiser_kwargs
    from training.evaluation import subset
    from training.models import build_model
    from training.private_train import train_denoiser
    from training.release import load_private_record

    settings.validate()
    out_dir = Path(out_dir)
    if (out_dir / AUDIT_FILE).exists() or (out_dir / MODEL_DIR).exists():
        raise UserError(f"{out_dir} already holds an audit; choose another --out (nothing is overwritten)")
    members = subset(dataset.private, config.train_examples)
    train_config = dataclasses.replace(config, train_examples=0)
    m = settings.num_canaries
    canaries: GradientCanaries | ImageCanaries
    if settings.mode == "blackbox":
        canaries = ImageCanaries(dataset.image_shape, m, settings.audit_seed)
        from training.datasets import Split

        chosen = canaries.images[canaries.included]
        private = Split(np.concatenate([members.images, chosen]),
                        np.concatenate([members.labels, np.zeros(len(chosen), dtype=members.labels.dtype)]))
        audit_dataset = dataclasses.replace(dataset, private=private)
        audited_cls = None
    else:
        shape_model = build_model(config.denoiser, **denoiser_kwargs(config.denoiser, dataset.image_shape[0],
                                                                     config.activation, config.denoiser_kwargs))
        train_config.validate(len(members))
        rate = min(1.0, config.batch_size / len(members))  # the run's Poisson rate q = B/N (see ``plan``)
        xi_planned = None
        if settings.whitebox_score == "likelihood_ratio":
            from training.private_train import plan

            xi_planned = plan(train_config, len(members))["xi_up"] if config.arm != "nodp" else None
            if not xi_planned:
                raise UserError("--whitebox-score likelihood_ratio needs an arm with DP noise (not nodp)")
        canaries = GradientCanaries(shape_model.to(device), m, settings.audit_seed, config.clip_norm, rate,
                                    settings.whitebox_score, xi_planned)
        audit_dataset = dataclasses.replace(dataset, private=members)
        audited_cls = audited_arm_class(ARM_CLASSES[config.arm], canaries)

    model_dir = out_dir / MODEL_DIR
    with _ARM_LOCK:
        original = _swap_arm(config.arm, audited_cls)
        try:
            model, meta = train_denoiser(train_config, audit_dataset, classifier, device, track=track,
                                         checkpoint_dir=model_dir)
        finally:
            _swap_arm(config.arm, original)

    loss_seed = int(np.random.default_rng([settings.audit_seed, 3]).integers(2 ** 62))
    if settings.mode == "blackbox":
        x_canary = torch.from_numpy(canaries.images).to(device=device, dtype=torch.float32).div_(255.0)
        scores = -reconstruction_losses(model, x_canary, config.sigma, settings.loss_draws, loss_seed)
        details = {"canary": "random binary 7x7 block patterns (out of distribution), added to the private split",
                   "score": "minus the reconstruction loss (mean over fixed input-noise draws)"}
    else:
        scores = canaries.scores()
        details = {"canary": (f"gradient C*u_j, u_j a {canaries.kind} direction; Poisson rate "
                              f"q = {canaries.sample_rate:.6g}"),
                   "score": settings.whitebox_score, "steps": canaries.steps,
                   "steps_with_dropped_canaries": canaries.dropped_steps,
                   "mean_insertions_included": float(canaries.times_inserted.double().sum()
                                                     / max(1, int(canaries.included.sum())))}
    counts = guess_counts(m, settings.guess_fractions)
    bounds = one_run_lower_bounds(scores, canaries.included, config.delta, settings.beta, counts)
    record = load_private_record(model_dir)
    claims = claimed_epsilons(meta["privacy"], record.get("privacy"))
    power = audit_power(m, config.delta, [c for c in claims if math.isfinite(c["epsilon"])], settings.beta,
                        settings.guess_fractions)
    consistency = (claimed_noise_consistency(config, settings, canaries, meta["privacy"], bounds, counts)
                   if claims else {"applicable": False, "reason": "nothing is claimed"})
    result = {
        "label": AUDIT_LABEL, "note": PRIVATE_NOTE, "arm": config.arm, "mode": settings.mode,
        "num_canaries": m, "audit_seed": settings.audit_seed, "confidence": 1 - settings.beta,
        "delta": config.delta, "noise": meta["privacy"].get("noise", {}).get("mode"),
        "details": details,
        "analyses": {"epsilon_steinke": "Steinke, Nasr & Jagielski 2023, Theorem 5.2 (abstaining guesses, "
                                        "binomial tail, delta term 2 m delta alpha)",
                     "epsilon_fdp": "Mahloujifar, Melis & Chaudhuri 2025 (Algorithm 3, Gaussian f-DP curve): "
                                    "largest mu-GDP refuted, its epsilon at the run's delta; presumes a "
                                    "Gaussian-shaped trade-off curve"},
        "guess_counts_tried": len(counts),
        "epsilon_steinke": bounds["epsilon_steinke"], "epsilon_fdp": bounds["epsilon_fdp"],
        "mu_fdp": bounds["mu_fdp"],
        "best_steinke": bounds["best_steinke"], "best_fdp": bounds["best_fdp"],
        "claims": claims, "power": power, "consistency": consistency,
        "verdict": verdict(bounds, claims, power, consistency),
        "private_files": {"audit": AUDIT_FILE, "model": MODEL_DIR},
    }
    if settings.membership:
        result["membership_inference"] = membership_inference(model, train_config, dataset, members, classifier,
                                                              device, settings, loss_seed, track)
    result = json_safe(result)
    _write_outputs(out_dir, model_dir, meta, result, scores, canaries.included, bounds, counts)
    return result


def membership_inference(model, config, dataset, members, classifier, device, settings: AuditSettings,
                         loss_seed: int, track: Track = silent) -> dict[str, Any]:
    """Loss-threshold and calibrated attacks: members = the private training examples, non-members = the test
    split (the same number, or all of it if smaller). Reference models: the same training on disjoint random
    subsets of the public split (every candidate is a non-member for them)."""
    from training.private_train import train_denoiser

    rng = np.random.default_rng([settings.audit_seed, 4])
    test = dataset.test
    n_non = min(len(test), len(members))
    non = test.subset(np.sort(rng.permutation(len(test))[:n_non]))
    x_mem, _ = members.tensors(device)
    x_non, _ = non.tensors(device)
    target_mem = reconstruction_losses(model, x_mem, config.sigma, settings.loss_draws, loss_seed)
    target_non = reconstruction_losses(model, x_non, config.sigma, settings.loss_draws, loss_seed + 1)
    attack = LossThresholdAttack()
    out = {"members": "private training examples", "nonmembers": "test split",
           "loss_threshold": attack_metrics(attack.scores(target_mem), attack.scores(target_non), settings.mia_fpr)}
    if settings.reference_models:
        public = dataset.public
        size = min(len(members), len(public))
        refs_mem, refs_non = [], []
        for k in range(settings.reference_models):
            picked = np.sort(rng.permutation(len(public))[:size])
            ref_data = dataclasses.replace(dataset, private=public.subset(picked))
            ref_model, _ = train_denoiser(dataclasses.replace(config, seed=config.seed + 1 + k), ref_data,
                                          classifier, device, track=track)
            refs_mem.append(reconstruction_losses(ref_model, x_mem, config.sigma, settings.loss_draws, loss_seed))
            refs_non.append(reconstruction_losses(ref_model, x_non, config.sigma, settings.loss_draws, loss_seed + 1))
        calibrated = CalibratedAttack(np.stack([np.concatenate([a, b]) for a, b in zip(refs_mem, refs_non,
                                                                                      strict=True)]))
        scores = calibrated.scores(np.concatenate([target_mem, target_non]))
        out["calibrated"] = {**attack_metrics(scores[:len(target_mem)], scores[len(target_mem):], settings.mia_fpr),
                             "reference_models": settings.reference_models,
                             "references": "same arm and settings, trained on random subsets of the public split"}
    return out


def _write_outputs(out_dir: Path, model_dir: Path, meta: dict, result: dict, scores, included, bounds, counts) -> None:
    from training.checkpoint import write_json, write_text
    from training.privacy.report import format_privacy_report
    from training.release import REPORT_FILE

    stored = {**meta, "audit": result}
    write_json(model_dir / "metadata.json", {**_read_json(model_dir / "metadata.json"), "audit": result})
    write_text(model_dir / REPORT_FILE, format_privacy_report(stored["privacy"]) + "\n" + format_audit(result) + "\n")
    guesses = {f"{kp}+/{km}-": abstaining_guesses(scores, kp, km).tolist() for kp, km in counts}
    write_json(out_dir / AUDIT_FILE, json_safe({
        "released": False, "note": PRIVATE_NOTE, "summary": result,
        "scores": np.asarray(scores, dtype=float).tolist(), "included": np.asarray(included).tolist(),
        "guesses": guesses, "per_count": bounds["per_count"]}))
    write_text(out_dir / NOT_A_RELEASE, PRIVATE_NOTE + "\nThe model in model/ was trained with audit canaries.\n")


def _read_json(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


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


__all__ = ["AUDIT_LABEL", "AuditSettings", "MODES", "claimed_epsilons", "claimed_noise_consistency", "format_audit",
           "format_consistency", "format_power", "membership_inference",
           "privacy_audit", "verdict"]
