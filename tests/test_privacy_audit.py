"""One-run privacy audit: the bounds against independent computations, the attacks' metrics, and the audit
end to end (a planted bug must fail it; the correct sepdp must pass)."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from training.privacy.bounds import (
    abstaining_guesses,
    fdp_mu_lower_bound,
    fdp_rejects,
    gdp_epsilon_lower,
    guess_counts,
    one_run_lower_bounds,
    steinke_epsilon_lower_bound,
    steinke_p_value,
)
from training.privacy.membership import CalibratedAttack, roc_auc, tpr_at_fpr

# ------------------------------------------------------------------------------------------------ Steinke et al.


@pytest.mark.parametrize("r,v", [(10, 7), (50, 35), (200, 120), (30, 15)])
def test_steinke_at_epsilon_zero_is_the_binomial_test(r, v):
    """epsilon = 0, delta = 0: the bound is P[Binomial(r, 1/2) >= v], the one-sided binomial test."""
    expected = stats.binomtest(v, r, 0.5, alternative="greater").pvalue
    assert steinke_p_value(1000, r, v, 0.0, 0.0) == pytest.approx(expected, rel=1e-9)


def _exact_tail(r: int, v: int, p_correct: float) -> float:
    """P[>= v of r guesses correct] by enumerating all 2^r correctness patterns (no scipy)."""
    total = 0.0
    for pattern in itertools.product((0, 1), repeat=r):
        if sum(pattern) >= v:
            total += math.prod(p_correct if c else 1 - p_correct for c in pattern)
    return total


@pytest.mark.parametrize("epsilon", [0.0, 0.5, 2.0])
def test_steinke_tail_matches_brute_force_randomized_response(epsilon):
    """delta = 0: eps-DP randomized response on each canary attains the bound exactly (enumerated, r = 8)."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    for v in range(9):
        assert steinke_p_value(8, 8, v, epsilon, 0.0) == pytest.approx(_exact_tail(8, v, p), abs=1e-12)


def test_steinke_tail_dominates_an_eps_delta_mechanism():
    """A per-canary (eps, delta)-DP mechanism (reveal S_i with probability delta, else eps-randomized response):
    its exact tail (enumerated) never exceeds the bound with the delta term; without the term it can."""
    epsilon, delta, m = 1.0, 0.02, 8
    p = delta + (1 - delta) * math.exp(epsilon) / (1 + math.exp(epsilon))
    exceeded_without_delta = False
    for v in range(1, m + 1):
        exact = _exact_tail(m, v, p)
        assert exact <= steinke_p_value(m, m, v, epsilon, delta) + 1e-12
        exceeded_without_delta |= exact > steinke_p_value(m, m, v, epsilon, 0.0)
    assert exceeded_without_delta


def test_steinke_lower_bound_inverts_the_p_value():
    m, r, v, delta = 1000, 200, 170, 1e-5
    eps = steinke_epsilon_lower_bound(m, r, v, delta)
    assert eps > 0
    assert steinke_p_value(m, r, v, eps, delta) < 0.05 <= steinke_p_value(m, r, v, eps + 1e-3, delta)
    # by hand at delta = 0: the largest eps with P[Binomial(r, expit(eps)) >= v] < 0.05, by a scan
    grid = np.linspace(0, 5, 5001)
    scan = grid[stats.binom.sf(v - 1, r, 1 / (1 + np.exp(-grid))) < 0.05].max()
    assert steinke_epsilon_lower_bound(m, r, v, 0.0) == pytest.approx(scan, abs=1.1e-3)
    assert steinke_epsilon_lower_bound(m, 100, 50, delta) == 0.0  # chance level proves nothing


# ------------------------------------------------------------------------------------------------ f-DP (Mahloujifar)

def test_fdp_never_rejects_the_true_gaussian_curve_too_often():
    """Monte Carlo: canary scores from a mu-GDP (Gaussian) mechanism; mu itself is refuted in <= ~5% of runs."""
    rng = np.random.default_rng(0)
    mu, m, runs, rejected, refuted_half = 1.0, 500, 60, 0, 0
    for _ in range(runs):
        included = rng.random(m) < 0.5
        scores = rng.standard_normal(m) + mu * included
        guesses = abstaining_guesses(scores, 50, 50)
        r, v = 100, int((guesses == np.where(included, 1, -1)).sum())
        rejected += fdp_rejects(m, r, v, mu)
        refuted_half += fdp_rejects(m, r, v, mu / 4)
    assert rejected <= 0.05 * runs + 2 * math.sqrt(0.05 * 0.95 * runs)
    assert refuted_half >= runs // 2  # and it has power against a much smaller mu


def test_fdp_at_chance_refutes_nothing_and_grows_with_correct_guesses():
    assert fdp_mu_lower_bound(1000, 100, 50) == 0.0
    bounds = [fdp_mu_lower_bound(1000, 100, v) for v in (60, 75, 90, 100)]
    assert bounds == sorted(bounds) and bounds[-1] > bounds[0] > 0


def test_gdp_epsilon_lower_matches_the_accountant():
    from training.privacy.accounting import gdp_delta, gdp_epsilon

    for mu in (0.3, 1.0, 2.5):
        low = gdp_epsilon_lower(mu, 1e-5)
        assert low <= gdp_epsilon(mu, 1e-5) and low == pytest.approx(gdp_epsilon(mu, 1e-5), rel=1e-7)
        assert gdp_delta(low, mu) >= 1e-5  # still NOT (low, 1e-5)-DP: a valid lower bound


def test_abstaining_guesses_and_bonferroni():
    scores = np.array([0.1, 5.0, -3.0, 2.0, 0.0, -1.0])
    assert abstaining_guesses(scores, 2, 1).tolist() == [0, 1, -1, 1, 0, 0]
    included = np.array([False, True, False, True, False, False])
    assert guess_counts(6, (0.5, 1.0), (0.5,)) == [(2, 1), (3, 3), (3, 0)]
    out = one_run_lower_bounds(scores, included, 1e-5, counts=guess_counts(6, (0.5, 1.0), ()))
    assert out["bonferroni_counts"] == 2 and all(c["beta"] == 0.025 for c in out["per_count"])


def test_confidence_changes_the_bound():
    """The bounds are computed at the confidence asked for (a mutant using the default beta must die)."""
    rng = np.random.default_rng(3)
    included = rng.random(400) < 0.5
    scores = included * 2.0 + rng.standard_normal(400)
    at95 = one_run_lower_bounds(scores, included, 1e-5, beta=0.05)
    at70 = one_run_lower_bounds(scores, included, 1e-5, beta=0.3)
    assert at70["confidence"] == pytest.approx(0.7)
    assert [c["beta"] for c in at70["per_count"]] == pytest.approx([0.3 / at70["bonferroni_counts"]] * 9)
    assert at70["epsilon_steinke"] > at95["epsilon_steinke"] > 0 and at70["epsilon_fdp"] > at95["epsilon_fdp"] > 0


def test_help_states_the_confidence_in_use():
    import argparse

    from training.audit import cli as audit_cli
    from training.privacy import consistency
    from transdenoiser.cli import build_parser

    parser = build_parser(["privacy-audit", "--help"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["privacy-audit"]
    text = sub.format_help()
    assert "95% confidence" not in text and f"(default {audit_cli.DEFAULT_CONFIDENCE:g})" in text
    assert (audit_cli.DEFAULT_ALPHA, audit_cli.DEFAULT_SIMULATIONS) == (consistency.DEFAULT_ALPHA,
                                                                       consistency.DEFAULT_SIMULATIONS)


# ------------------------------------------------------------------------------------------------ power

def test_attainable_bound_is_what_perfect_guesses_reach():
    """Perfectly separated scores with exactly half included: every guess count is all right, so the audit's
    own bounds equal the attainable ones; any other outcome stays at or below them."""
    from training.privacy.power import attainable_bounds

    m = 200
    included = np.arange(m) < m // 2
    perfect = one_run_lower_bounds(included.astype(float), included, 1e-5)
    attainable = attainable_bounds(m, 1e-5)
    assert perfect["epsilon_steinke"] == pytest.approx(attainable["steinke"], rel=1e-9)
    assert perfect["epsilon_fdp"] == pytest.approx(attainable["fdp"], rel=1e-9)
    noisy = one_run_lower_bounds(included + np.random.default_rng(0).standard_normal(m), included, 1e-5)
    assert noisy["epsilon_steinke"] <= attainable["steinke"] and noisy["epsilon_fdp"] <= attainable["fdp"]
    # a lower confidence reaches higher
    assert attainable_bounds(m, 1e-5, beta=0.3)["steinke"] > attainable["steinke"]


def test_canaries_needed_reaches_the_claim_and_steinke_is_capped_by_delta():
    from training.privacy.power import attainable_bound, canaries_needed

    needed = canaries_needed(2.0, 1e-5, analysis="steinke")
    assert attainable_bound(needed, 1e-5, analysis="steinke") > 2.0
    assert attainable_bound(int(needed * 0.9), 1e-5, analysis="steinke") <= 2.0
    needed_fdp = canaries_needed(7.29, 1e-5, analysis="fdp")
    assert attainable_bound(needed_fdp, 1e-5, analysis="fdp") > 7.29 >= attainable_bound(needed_fdp // 2, 1e-5,
                                                                                        analysis="fdp")
    # Steinke et al.'s delta term 2 m delta caps its bound: at delta 1e-5 no canary count reaches 7.29
    assert canaries_needed(7.29, 1e-5, analysis="steinke") is None


def test_verdict_is_inconclusive_when_a_claim_is_beyond_reach():
    from training.privacy.audit import verdict
    from training.privacy.power import audit_power

    bounds = {"epsilon_steinke": 1.0, "epsilon_fdp": 1.5}
    claims = [{"name": "sepdp", "epsilon": 7.29}]
    small, large = audit_power(100, 1e-5, claims), audit_power(1000, 1e-5, claims)
    assert not small["claims"][0]["refutable"] and small["claims"][0]["canaries_needed"]["fdp"] > 100
    assert verdict(bounds, claims, small)["status"] == "INCONCLUSIVE"
    assert large["claims"][0]["refutable"] and verdict(bounds, claims, large)["status"] == "PASS"
    inconsistent = {"applicable": True, "consistent": False}
    assert verdict(bounds, claims, large, inconsistent)["status"] == "FAIL"
    assert verdict({"epsilon_steinke": 8.0, "epsilon_fdp": 8.0}, claims, small)["status"] == "FAIL"


# ------------------------------------------------------------------------------------------------ claimed noise

def test_null_simulation_runs_the_audits_own_analysis():
    """bounds_of_scores (memoised, used for the null) equals one_run_lower_bounds on the same simulated run."""
    from training.privacy.consistency import BoundTable, bounds_of_scores, simulate_scores

    rng = np.random.default_rng(5)
    counts = guess_counts(300)
    table = BoundTable(300, 1e-5, 0.05 / len(counts))
    for _ in range(3):
        scores, included = simulate_scores(rng, 300, 10, 0.5, 1.2)
        direct = one_run_lower_bounds(scores, included, 1e-5, counts=counts)
        assert bounds_of_scores(scores, included, table, counts) == pytest.approx(
            (direct["epsilon_steinke"], direct["epsilon_fdp"]), rel=1e-12)


def test_consistency_test_p_value_and_false_alarm_rate():
    from training.privacy.consistency import consistency_test, noise_scale_test

    null = np.arange(1, 1000, dtype=float)  # 999 simulations
    assert consistency_test(1000.0, null, 0.001)["p_value"] == pytest.approx(1 / 1000)
    assert not consistency_test(1000.0, null, 0.001)["consistent"]
    assert consistency_test(999.0, null, 0.001)["consistent"]  # a tie counts against rejection
    assert consistency_test(500.0, null, 0.001)["p_value"] == pytest.approx(501 / 1000)
    # the noise-scale test: uniform p under the claimed noise (false alarms at the nominal rate), power at x0.5
    rng = np.random.default_rng(6)
    p = np.array([noise_scale_test(rng.standard_normal(300) * 2.0 * np.sqrt(20), 20, 2.0)["p_value"]
                  for _ in range(2000)])
    assert abs((p <= 0.05).mean() - 0.05) < 0.02 and abs((p <= 0.5).mean() - 0.5) < 0.05
    assert not noise_scale_test(rng.standard_normal(300) * 1.0 * np.sqrt(20), 20, 2.0)["consistent"]


def test_null_distribution_is_cached_and_checked(tmp_path):
    from training.privacy.consistency import cached_null_bounds

    args = (100, 4, 0.5, 1.0, 1e-5, guess_counts(100))
    first = cached_null_bounds(*args, simulations=30, cache_dir=tmp_path)
    again = cached_null_bounds(*args, simulations=30, cache_dir=tmp_path)
    assert not first["cached"] and again["cached"] and again["epsilon_fdp"] == first["epsilon_fdp"]
    path = tmp_path / first["cache"].rsplit("/", 1)[-1]
    stored = json.loads(path.read_text())
    stored["parameters"]["noise_multiplier"] = 9.0  # a file whose parameters differ is never trusted
    path.write_text(json.dumps(stored))
    assert not cached_null_bounds(*args, simulations=30, cache_dir=tmp_path)["cached"]
    other = cached_null_bounds(100, 4, 0.5, 0.5, 1e-5, guess_counts(100), simulations=30, cache_dir=tmp_path)
    assert np.median(other["epsilon_fdp"]) > np.median(first["epsilon_fdp"])  # less noise, larger bounds


# ------------------------------------------------------------------------------------------------ membership metrics

def test_auc_and_tpr_against_brute_force():
    rng = np.random.default_rng(1)
    members, non = rng.normal(0.5, 1, 300), np.round(rng.normal(0, 1, 400), 1)
    pairs = (members[:, None] > non[None, :]).mean() + 0.5 * (members[:, None] == non[None, :]).mean()
    assert roc_auc(members, non) == pytest.approx(pairs, rel=1e-12)
    # FPR 1%: at most 4 of 400 non-members strictly above the threshold
    tpr = tpr_at_fpr(members, non, 0.01)
    threshold = min(t for t in np.unique(non) if (non > t).sum() <= 4)
    assert tpr == pytest.approx((members > threshold).mean())


def test_calibrated_attack_removes_per_example_difficulty():
    """Loss = difficulty (shared with the references) + a small member discount: the loss threshold sees the
    difficulty, the calibrated attack sees the discount."""
    rng = np.random.default_rng(2)
    difficulty = np.exp(rng.normal(0, 1.0, 2000))
    member = np.arange(2000) < 1000
    target = difficulty * np.where(member, 0.9, 1.0) * np.exp(rng.normal(0, 0.02, 2000))
    refs = difficulty * np.exp(rng.normal(0, 0.02, (2, 2000)))
    plain = roc_auc(-target[member], -target[~member])
    scores = CalibratedAttack(refs).scores(target)
    assert roc_auc(scores[member], scores[~member]) > 0.95 > plain + 0.2


# ------------------------------------------------------------------------------------------------ the audit end to end

# T = 2 steps of q = 0.5 (one epoch of 100 examples, B = 50); xi_up = 3 claims epsilon ~1.07 (PLD) at delta 1e-5
AUDIT_ARGS = ["--denoiser", "tiny", "--denoiser-width", "8", "--activation", "silu", "--train-examples", "100",
              "--batch-size", "50", "--epochs", "1", "--eval-examples", "50", "--lr", "0.05", "--canaries", "200",
              "--device", "cpu"]
SEPDP = ["--arm", "sepdp", "--delta", "1e-5", "--xi-up", "3"]  # the flags of the DP arms (nodp refuses them)
# The DP-noise draws from --seed: each audit below is one fixed draw, so its statistical checks (alpha = 5e-4, a
# 25% band on the measured noise) cannot fail by chance on one CI run while passing on the next.
REPRODUCIBLE = ["--reproducible-noise"]


@pytest.fixture(autouse=True)
def _null_cache(tmp_path_factory, monkeypatch):
    """The simulated null distributions go to one temporary cache for this module, never the user's."""
    from training.privacy.consistency import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.getbasetemp() / "audit-null-cache"))


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """An untrained cnn28 checkpoint: the audit only evaluates the denoiser, never relies on the classifier's
    accuracy, so the suite's pretrained classifier (slow to train) is not needed here."""
    import torch

    from training.checkpoint import save_checkpoint
    from training.models import build_model

    torch.manual_seed(0)
    kwargs = {"in_channels": 1, "num_classes": 10}
    meta = {"kind": "classifier", "architecture": "cnn28", "arch_kwargs": kwargs, "input_shape": [1, 28, 28],
            "num_classes": 10}
    return save_checkpoint(tmp_path_factory.mktemp("audit") / "classifier", build_model("cnn28", **kwargs), meta)


def _audit(tmp_path, classifier_dir, name, *extra):
    from transdenoiser.cli import main

    out = tmp_path / name
    status = main(["privacy-audit", "--classifier", str(classifier_dir), "--out", str(out), *AUDIT_ARGS, *extra])
    return status, out


def test_correct_sepdp_passes_and_the_report_carries_the_audit(tmp_path, classifier_dir, capsys):
    status, out = _audit(tmp_path, classifier_dir, "ok", *SEPDP, *REPRODUCIBLE, "--reference-models", "0",
                         "--confidence", "0.9")
    assert status == 0
    meta = json.loads((out / "model" / "metadata.json").read_text())
    audit = meta["audit"]
    assert audit["verdict"]["status"] == "PASS" and "EMPIRICAL LOWER BOUND" in audit["label"]
    # --confidence reaches the bounds: every guess count is tested at (1 - 0.9) / K
    assert audit["confidence"] == pytest.approx(0.9) and audit["power"]["confidence"] == pytest.approx(0.9)
    levels = [c["beta"] for c in json.loads((out / "audit.json").read_text())["per_count"]]
    assert levels == pytest.approx([0.1 / audit["guess_counts_tried"]] * len(levels))
    printed = capsys.readouterr()
    assert "at 90% confidence" in printed.out and "95% confidence" not in printed.out
    assert "before training, audit power" in printed.err
    # the claim (1.07) is within reach of 200 canaries; the run is consistent with the claimed noise
    assert audit["power"]["claims"][0]["refutable"] and audit["consistency"]["applicable"]
    assert audit["consistency"]["consistent"] and not audit["verdict"]["inconsistent_with_claimed_noise"]
    claim = next(c for c in audit["claims"] if c["name"] == "sepdp")
    assert claim["epsilon"] == pytest.approx(1.07, abs=0.05)
    assert 0 <= audit["epsilon_steinke"] <= claim["epsilon"] and audit["epsilon_fdp"] <= claim["epsilon"]
    assert "audit" not in meta["privacy"]  # the released report's fields are untouched; the audit sits beside
    assert "Privacy audit" in (out / "model" / "privacy_report.txt").read_text()
    private = json.loads((out / "audit.json").read_text())
    assert private["released"] is False and len(private["scores"]) == 200
    assert (out / "NOT_A_RELEASE.txt").exists()
    mia = audit["membership_inference"]
    assert mia["loss_threshold"]["members"] == 100 and "calibrated" not in mia


def test_planted_bug_noise_off_fails_the_audit(tmp_path, classifier_dir, monkeypatch, capsys):
    """Switch the DP noise off (GaussianNoise.add returns its input): the white-box canaries are then
    separated perfectly, the lower bound exceeds the claimed epsilon, the CLI says so and exits 1."""
    from training.privacy import dp

    monkeypatch.setattr(dp.GaussianNoise, "add", lambda self, tensors, multiplier, generator: dict(tensors))
    status, out = _audit(tmp_path, classifier_dir, "bug", *SEPDP, "--no-membership")
    assert status == 1
    assert "PRIVACY AUDIT FAILED" in capsys.readouterr().err
    audit = json.loads((out / "model" / "metadata.json").read_text())["audit"]
    claimed = next(c["epsilon"] for c in audit["claims"] if c["name"] == "sepdp")
    assert audit["verdict"]["status"] == "FAIL" and audit["epsilon_steinke"] > claimed


def test_planted_bug_halved_noise_fails_the_consistency_check(tmp_path, classifier_dir, monkeypatch, capsys):
    """The reduced-size seeds table: the noise multiplier secretly halved (the claim unchanged). The bound stays
    below the claim, but the run is inconsistent with the claimed noise: FAILURE, exit 1."""
    from training.privacy import dp

    original = dp.GaussianNoise.add
    monkeypatch.setattr(dp.GaussianNoise, "add", lambda self, tensors, multiplier, generator:
                        original(self, tensors, 0.5 * multiplier, generator))
    status, out = _audit(tmp_path, classifier_dir, "halved", *SEPDP, *REPRODUCIBLE, "--no-membership")
    audit = json.loads((out / "model" / "metadata.json").read_text())["audit"]
    assert status == 1 and audit["verdict"]["status"] == "FAIL"
    assert audit["verdict"]["inconsistent_with_claimed_noise"] and not audit["consistency"]["consistent"]
    noise = audit["consistency"]["noise_test"]
    assert noise["measured_noise_multiplier"] == pytest.approx(0.5 * noise["claimed_noise_multiplier"], rel=0.25)
    assert "inconsistent with the claimed noise" in capsys.readouterr().err


def test_likelihood_ratio_score_audits_and_is_checked_against_the_claimed_noise(tmp_path, classifier_dir):
    """The per-step likelihood-ratio score: a valid audit (PASS at the correct noise, log-ratio scores above
    log(1 - q) = log 0.5 per step), and the check against the claimed noise still runs on the summed
    known_others score."""
    status, out = _audit(tmp_path, classifier_dir, "lr", *SEPDP, *REPRODUCIBLE, "--no-membership",
                         "--whitebox-score", "likelihood_ratio")
    assert status == 0
    private = json.loads((out / "audit.json").read_text())
    audit = private["summary"]
    assert audit["details"]["score"] == "likelihood_ratio" and audit["verdict"]["status"] == "PASS"
    assert audit["consistency"]["applicable"] and audit["consistency"]["consistent"]
    scores = np.array(private["scores"])
    assert np.all(np.isfinite(scores)) and np.all(scores > 2 * math.log(0.5)) and len(np.unique(scores)) == 200


def test_blackbox_canaries_join_the_private_split(tmp_path, classifier_dir):
    """nodp (no accounting, quick) with black-box canaries, and membership inference with a reference model."""
    status, out = _audit(tmp_path, classifier_dir, "bb", "--arm", "nodp", "--mode", "blackbox", "--canaries", "40",
                         "--reference-models", "1")
    assert status == 0
    private = json.loads((out / "audit.json").read_text())
    meta = json.loads((out / "model" / "metadata.json").read_text())
    assert meta["dataset"]["train_examples"] == 100 + sum(private["included"])
    assert meta["audit"]["verdict"]["status"] == "NO CLAIM"
    mia = meta["audit"]["membership_inference"]
    for attack in ("loss_threshold", "calibrated"):
        assert 0 <= mia[attack]["auc"] <= 1 and mia[attack]["members"] == mia[attack]["nonmembers"] == 100


def test_audit_simulation_script_quick(capsys):
    """Smoke test of scripts/audit_simulation.py --quick: valid JSON, bounds within [0, claimed epsilon]."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "audit_simulation.py"
    spec = importlib.util.spec_from_file_location("audit_simulation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--quick"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["seeds"] == 2 and 0 <= row["epsilon_steinke"]["max"] <= 8.0 and 0 <= row["epsilon_fdp"]["max"] <= 8.0


def test_bench_audit_seeds_quick_simulation(capsys):
    """Smoke test of benchmarks/bench_audit_seeds.py in its simulated mode (the exact score model, no training)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_audit_seeds.py"
    spec = importlib.util.spec_from_file_location("bench_audit_seeds", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--quick", "--simulate", "20", "--null-simulations", "99"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    correct, halved = (next(r for r in rows if r["noise_scale"] == s) for s in (1.0, 0.5))
    assert correct["runs"] == halved["runs"] == 20
    assert correct["flagged"]["either"] <= 1 and halved["flagged"]["noise"] >= 18
