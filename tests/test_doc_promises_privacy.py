"""Promises of docs/PRIVACY.md ("What the reports claim") that no other test guards, against dp-accounting
called directly:

- the transdenoiser arm's released report carries a data-independent epsilon (``sepdp_equivalent``) only when
  ``merge_uncredited_noise`` is on AND the parameter count w exceeds ``max_smin_dim``; in the three other cases
  its data-independent entry is "none established" with epsilon inf, and the MMGA figure is never labelled
  data-independent (checked on the report builder for all four cases, and end to end for merge on with S_min
  computed, the case a default run with a small denoiser and a large ``--max-smin-dim`` lands in);
- the full report's "explicit noise alone" epsilon is infinite as soon as one step added no explicit noise,
  and neither it nor the per-step statistics are in the released report.
"""
from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant

from training.privacy.accounting import RDP_ORDERS
from training.privacy.report import build_privacy_report, released_privacy_report

Q, XI_UP, DELTA, STEPS = 0.25, 2.0, 1e-3, 4
W = 77  # the parameter count of the tiny denoiser at width 2


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def dp_accounting_rdp(q: float, multiplier: float, steps: int, delta: float) -> float:
    accountant = RdpAccountant(orders=RDP_ORDERS)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(multiplier)), steps)
    return accountant.get_epsilon(delta)


def history(explicit: list[float]) -> dict[str, np.ndarray]:
    """A transdenoiser run's per-step history: batches of 4, 2 non-negative examples each, no input-noise credit."""
    steps = len(explicit)
    return {"batch_size": np.full(steps, 4), "num_nonnegative": np.full(steps, 2), "smin": np.zeros(steps),
            "input_multiplier": np.zeros(steps), "sigma_bar": np.full(steps, XI_UP),
            "explicit_multiplier": np.asarray(explicit, dtype=float), "mean_loss": np.ones(steps)}


def full_report(merge: bool, max_smin_dim: int, explicit: list[float] | None = None) -> dict:
    explicit = [XI_UP] * STEPS if explicit is None else explicit
    method = "too_large" if W > max_smin_dim else "eigvalsh"
    return build_privacy_report(
        arm="transdenoiser", sigma=0.25, clip_norm=1.0, xi_low=0.5, xi_up=XI_UP, sample_rate=Q, num_examples=16,
        expected_batch_size=4.0, delta=DELTA, steps_planned=len(explicit), history=history(explicit),
        smin_methods=[method] * len(explicit), max_smin_dim=max_smin_dim, num_parameters=W,
        noise={"mode": "secret"}, merge_uncredited_noise=merge)


def finite_data_independent(report: dict) -> dict[str, float]:
    """name -> RDP epsilon of every guarantee labelled data-independent whose epsilon is a number."""
    return {g["name"]: g["epsilon"]["rdp"] for g in report["guarantees"]
            if g["data_independent"] and isinstance(g["epsilon"]["rdp"], float) and math.isfinite(g["epsilon"]["rdp"])}


@pytest.mark.parametrize(("merge", "max_smin_dim"), [(True, 10), (True, 4096), (False, 10), (False, 4096)])
def test_released_data_independent_epsilon_only_for_the_merged_run_that_never_computes_smin(merge, max_smin_dim):
    released = released_privacy_report(full_report(merge, max_smin_dim))
    by_name = {g["name"]: g for g in released["guarantees"]}
    assert by_name["mmga"]["data_independent"] is False  # the paper's analysis: never a data-independent claim
    if merge and W > max_smin_dim:  # every step is exactly the sepdp step: sepdp's epsilon holds
        assert finite_data_independent(released) == {
            "sepdp_equivalent": pytest.approx(dp_accounting_rdp(Q, XI_UP, STEPS, DELTA), rel=1e-9)}
        assert "data_independent" not in by_name
    else:  # Algorithm 1 picks each step's noise from the private batch: nothing data-independent is claimed
        assert finite_data_independent(released) == {}
        assert "sepdp_equivalent" not in by_name
        none = by_name["data_independent"]
        assert none["epsilon"]["rdp"] == none["epsilon"]["pld"] == "inf" and "none established" in none["label"]


def test_a_default_merged_run_that_computes_smin_claims_no_data_independent_epsilon(random_classifier_dir, tmp_path):
    """End to end: merge_uncredited_noise on (the default), w = 77 <= max_smin_dim = 4096, so S_min is computed
    from the private batches and the released metadata must not carry sepdp's epsilon."""
    from training.checkpoint import load_checkpoint, read_metadata
    from training.datasets import load_dataset
    from training.private_train import train_denoiser
    from training.release import load_private_record
    from training.train_config import TrainConfig

    classifier = load_checkpoint(random_classifier_dir, kind="classifier")
    config = TrainConfig(arm="transdenoiser", denoiser="tiny", denoiser_kwargs={"width": 2}, activation="silu",
                         epochs=1, batch_size=5, train_examples=20, eval_examples=20, max_smin_dim=4096,
                         learning_rate=0.05, optimizer="sgd", delta=1e-2, xi_up=XI_UP)  # q = 0.25, 4 steps
    assert config.merge_uncredited_noise is True  # the product default
    train_denoiser(config, load_dataset("mnist10k"), classifier, torch.device("cpu"), checkpoint_dir=tmp_path / "td")
    assert load_private_record(tmp_path / "td")["privacy"]["transdenoiser"]["smin_methods"].get("eigvalsh", 0) >= 1
    released = read_metadata(tmp_path / "td")["privacy"]
    assert finite_data_independent(released) == {}
    names = [g["name"] for g in released["guarantees"]]
    assert "sepdp_equivalent" not in names and "data_independent" in names
    text = (tmp_path / "td" / "privacy_report.txt").read_text()
    assert "the sepdp mechanism exactly" not in text and "none established" in text


def test_explicit_noise_alone_is_infinite_once_a_step_added_none_and_is_never_released():
    with_noise = full_report(False, 4096, [XI_UP, math.sqrt(2) * XI_UP, XI_UP, XI_UP])
    without = full_report(False, 4096, [XI_UP, 0.0, XI_UP, XI_UP])  # one step's explicit noise was 0
    (finite,) = [g for g in with_noise["guarantees"] if g["name"] == "explicit_noise_alone"]
    (infinite,) = [g for g in without["guarantees"] if g["name"] == "explicit_noise_alone"]
    assert math.isfinite(finite["epsilon"]["rdp"])
    assert infinite["epsilon"]["rdp"] == infinite["epsilon"]["pld"] == "inf"  # json_safe writes inf as "inf"
    assert infinite["data_independent"] is False and infinite["steps_without_explicit_noise"] == 1
    released = released_privacy_report(without)
    assert "explicit_noise_alone" not in [g["name"] for g in released["guarantees"]]
    for private in ("empty_batches", "transdenoiser"):  # statistics of the private batches
        assert private in without and private not in released
