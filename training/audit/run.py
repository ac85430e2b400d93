"""``privacy_audit``: train a denoiser with canaries, guess which were included, bound epsilon from below.

The run; its analysis (claims, verdict, the check against the claimed noise, the text) is
:mod:`training.privacy.audit`.

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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.privacy.audit import (
    AUDIT_FILE,
    AUDIT_LABEL,
    MODEL_DIR,
    NOT_A_RELEASE,
    PRIVATE_NOTE,
    AuditSettings,
    claimed_epsilons,
    claimed_noise_consistency,
    format_audit,
    verdict,
)
from training.privacy.bounds import abstaining_guesses, guess_counts, one_run_lower_bounds
from training.privacy.canaries import GradientCanaries, ImageCanaries, audited_arm_class, reconstruction_losses
from training.privacy.membership import CalibratedAttack, LossThresholdAttack, attack_metrics
from training.privacy.power import audit_power
from training.privacy.report import json_safe
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent

_ARM_LOCK = threading.Lock()


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


__all__ = ["membership_inference", "privacy_audit"]
