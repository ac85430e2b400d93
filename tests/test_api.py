"""docs/API.md's examples, each run on its own after the first (the stand-in model and data) as a user would paste
it, then checked against independent computations."""
from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "API.md"


def api_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", API_DOC.read_text(), re.S)


@pytest.fixture(scope="module")
def doc(classifier_dir):
    """Each ```python block of docs/API.md after the first executed on its own: in a fresh namespace holding only
    what the first block (the stand-in model and data) defines, so no block leans on another's names. The names
    of all blocks are then gathered, in page order, for the checks below; the classifier's state is kept from
    before the first training.

    The certify-run example reads its classifier checkpoint from TRANSDENOISER_CLASSIFIER (a user's would be
    ``make demo``'s runs/demo/classifier): here the suite's trained cnn28."""
    setup, *blocks = api_blocks()
    gathered: dict = {}
    previous = os.environ.get("TRANSDENOISER_CLASSIFIER")
    os.environ["TRANSDENOISER_CLASSIFIER"] = str(classifier_dir)
    try:
        for number, block in enumerate(blocks, start=1):
            namespace: dict = {"__name__": "api_doc"}
            exec(compile(setup, f"{API_DOC}:block0", "exec"), namespace)  # noqa: S102 - our own docs
            if "train_private_denoiser" in block and "classifier_before" not in gathered:
                gathered["classifier_before"] = {k: v.clone() for k, v in namespace["classifier"].state_dict().items()}
                gathered["classifier"] = namespace["classifier"]  # the one whose training is checked below
            exec(compile(block, f"{API_DOC}:block{number}", "exec"), namespace)  # noqa: S102 - our own docs
            if "classifier_before" in gathered:
                namespace.pop("classifier")
            gathered.update(namespace)
    finally:
        if previous is None:
            os.environ.pop("TRANSDENOISER_CLASSIFIER", None)
        else:
            os.environ["TRANSDENOISER_CLASSIFIER"] = previous
    return gathered


def test_doc_has_examples_for_each_part():
    text = "\n".join(api_blocks())
    for needle in ("Smooth(", ".certify(", ".predict(", ".certify_adaptive(", ".decide(", "PGD(", "FGSM(",
                   "train_private_denoiser(", "TensorDataset", "epsilon_report(", "noise_multiplier_for_epsilon(",
                   "load_model(", "run_certify_job(", "fit_private_head("):
        assert needle in text, needle


def test_certificate_is_cohen_certify_from_its_counts(doc):
    from scipy.stats import norm
    from statsmodels.stats.proportion import proportion_confint

    cert, label = doc["certificate"], doc["label"]
    # first certificate of the page (plain classifier) was replaced by the one with the denoiser: check both kinds
    for certificate, sigma in ((cert, 0.25),):
        p_lower = proportion_confint(certificate.count, certificate.n, alpha=2 * 0.001, method="beta")[0]
        if p_lower > 0.5:
            assert certificate.prediction == label
            assert certificate.radius == pytest.approx(sigma * norm.ppf(p_lower), rel=1e-9)
        else:
            assert certificate.prediction == doc["transdenoiser"].ABSTAIN
    cap = doc["transdenoiser"].max_certifiable_radius(sigma=0.25, n=1000, alpha=0.001)
    assert cap == pytest.approx(0.25 * norm.ppf(0.001 ** (1 / 1000)), rel=1e-9)  # all n votes for one class
    assert doc["adaptive"].prediction == label and doc["adaptive"].n <= 5000
    assert doc["decision"].outcome == "certified"


def test_attacks_stay_in_budget_and_shrink_the_margin(doc):
    x, y = doc["test_images"][:16], doc["test_labels"][:16]
    for x_adv, norm, eps in ((doc["x_adv"], 2, 1.0), (doc["x_fgsm"], math.inf, 0.1)):
        assert x_adv.min() >= 0 and x_adv.max() <= 1
        assert (x_adv - x).flatten(1).norm(p=norm, dim=1).max() <= eps
    smooth_adv = doc["x_smooth_adv"]
    assert (smooth_adv - x[:4]).flatten(1).norm(dim=1).max() <= 1.0
    classifier = doc["classifier"]

    def margin(images):  # logit of the label minus the largest other logit
        with torch.no_grad():
            logits = classifier(images)
        label_logit = logits.gather(1, y.view(-1, 1)).squeeze(1)
        return label_logit - logits.scatter(1, y.view(-1, 1), -math.inf).amax(dim=1)

    assert margin(doc["x_adv"]).mean() < margin(x).mean()


def test_private_denoiser_epsilon_matches_dp_accounting_and_classifier_untouched(doc):
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
    from dp_accounting.rdp import RdpAccountant

    privacy = doc["privacy"]  # the typed record (transdenoiser.records.PrivacyReport)
    assert privacy.arm == "sepdp" and privacy.sample_rate == pytest.approx(16 / 256)
    assert privacy.steps_planned == 16 and privacy.xi_up == 1.0
    guarantee = privacy.named("sepdp")
    assert guarantee.data_independent is True and privacy.data_independent() == [guarantee]
    library = RdpAccountant()  # dp-accounting's default orders; ours adds orders, so it may only be smaller
    library.compose(SelfComposedDpEvent(PoissonSampledDpEvent(16 / 256, GaussianDpEvent(1.0)), 16))
    expected = library.get_epsilon(1e-4)
    assert 0.95 * expected <= guarantee.epsilon.value("rdp") <= expected * (1 + 1e-9)
    from transdenoiser import format_privacy_report

    assert format_privacy_report(privacy) == format_privacy_report(privacy.to_json())

    classifier = doc["classifier"]
    assert all(p.requires_grad for p in classifier.parameters())
    assert not classifier.training
    for key, value in classifier.state_dict().items():
        assert torch.equal(value, doc["classifier_before"][key]), key
    denoiser = doc["denoiser"]
    with torch.no_grad():
        out = denoiser(doc["test_images"][:2])
    assert out.shape == (2, 1, 16, 16)
    reloaded = doc["reloaded"]
    assert sum(p.numel() for p in reloaded.parameters()) == sum(p.numel() for p in denoiser.parameters())


def test_accountant_example_meets_its_target(doc):
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent
    from dp_accounting.rdp import RdpAccountant

    epsilons, multiplier, steps, q = doc["epsilons"], doc["multiplier"], doc["steps"], doc["sample_rate"]
    assert epsilons["rdp"] <= 1.0
    library = RdpAccountant()
    library.compose(SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(multiplier)), steps))
    assert epsilons["rdp"] <= library.get_epsilon(1e-5) * (1 + 1e-9)
    assert steps == 2 * round(1 / q)  # round(1/q) steps per epoch, as the training loop takes


def test_api_refuses_bad_input_in_one_line():
    from torch import nn

    from transdenoiser import api
    from transdenoiser.errors import UserError

    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(UserError, match="sigma="):
        api.PGD(model, eps=0.5, norm="l2", threat="smoothed")
    with pytest.raises(UserError, match="alone"):
        api.FGSM(model, eps=0.1, denoiser=nn.Identity())
    images = torch.rand(8, 1, 2, 2)
    with pytest.raises(UserError, match="labels are needed"):
        api.train_private_denoiser(model, images, test=images)
    with pytest.raises(UserError, match=r"\[0, 1\]"):
        api.train_private_denoiser(model, images * 3, test=(images, torch.zeros(8, dtype=torch.long)))


def test_package_names_load_lazily():
    code = "import sys, transdenoiser; assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    import transdenoiser
    from transdenoiser import api

    assert sorted(api.__all__) == sorted(transdenoiser._API_NAMES)
    assert transdenoiser.Smooth is api.Smooth and transdenoiser.PGD is api.PGD and "Smooth" in dir(transdenoiser)


def test_certify_job_is_the_command_line_run_and_resumes(doc):
    """The API's run equals the rows Cohen's CERTIFY gives from the same counts, and a second call does nothing."""
    from scipy.stats import norm
    from statsmodels.stats.proportion import proportion_confint

    from certify.rundir import read_rows

    outcome, again = doc["outcome"], doc["again"]
    assert outcome.complete and outcome.done_before == 0 and outcome.done_now == 11 == outcome.expected
    assert again.complete and again.done_before == 11 and again.done_now == 0
    rows = read_rows(outcome.rows_path, "certify")
    assert [r.idx for r in rows] == list(range(0, 2004, 200))
    # the figure the example reads is the fraction of rows correct with radius >= 0.25, and every radius is
    # Cohen's sigma * Phi^-1(p_lower) for some count out of n = 1000 (or an abstention)
    assert doc["certified_at_025"] == pytest.approx(sum(r.correct and r.radius >= 0.25 for r in rows) / len(rows))
    lowers = proportion_confint(range(501, 1001), 1000, alpha=2 * 0.001, method="beta")[0]
    radii = 0.25 * norm.ppf(lowers)
    for row in rows:
        if row.prediction >= 0:
            assert min(abs(radii - row.radius)) < 1e-5, row
    # the command line's settings file: the same fields, so `transdenoiser certify` with these flags resumes it
    settings = __import__("json").loads((outcome.out / "settings.json").read_text())
    assert settings["n"] == 1000 and settings["skip"] == 200 and settings["sigma"] == 0.25
    # the paired comparison of the two seeds' runs: the exact difference of their files, inside its interval
    second = read_rows(outcome.out.parent / "certify_run_seed1" / "certify.tsv", "certify")
    difference = doc["difference"]
    assert difference.images == 11 and [r.idx for r in second] == [r.idx for r in rows]
    for k, radius in enumerate(difference.radii):
        def share(records, radius=radius):
            return sum(r.correct and (radius == 0 or r.radius >= radius) for r in records) / len(records)
        assert difference.difference[k] == pytest.approx(share(second) - share(rows))
        assert difference.low[k] <= difference.difference[k] <= difference.high[k]


def test_private_head_noise_is_the_analytic_gaussian_of_its_sensitivity(doc):
    """OPERA's released report: sensitivity = Ding et al.'s 5 L (mu + beta) / (n mu beta), noise std = the analytic
    Gaussian mechanism's for (epsilon, delta) at that sensitivity, solved here from its exact condition."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    report, weights = doc["head_privacy"], doc["head_weights"]
    features = doc["features"]
    assert weights.shape == (features.shape[1], 3) and np.isfinite(weights).all()
    n, mu, beta, lipschitz = report["n"], report["strong_convexity"], report["smoothness"], report["lipschitz"]
    assert n == 256 and mu == pytest.approx(0.1)
    assert report["sensitivity"] == pytest.approx(5 * lipschitz * (mu + beta) / (n * mu * beta), rel=1e-9)
    eps, delta, sens = 8.0, 1e-5, report["sensitivity"]

    def excess(s):  # Balle and Wang's exact delta of N(0, s^2) at L2 sensitivity sens, minus the target
        return (norm.cdf(sens / (2 * s) - eps * s / sens)
                - math.exp(eps) * norm.cdf(-sens / (2 * s) - eps * s / sens) - delta)

    assert report["noise_std"] == pytest.approx(brentq(excess, 1e-6 * sens, 1e3 * sens, xtol=1e-14), rel=1e-6)
    assert report["noise_std"] >= brentq(excess, 1e-6 * sens, 1e3 * sens, xtol=1e-14) * (1 - 1e-9)
    from transdenoiser.errors import UserError

    with pytest.raises(UserError, match="L2 norm <= 1"):
        doc["transdenoiser"].fit_private_head(features * 2, doc["train_labels"])
    with pytest.raises(UserError, match="^fit_private_head does not take learning_rat$"):
        doc["transdenoiser"].fit_private_head(features, doc["train_labels"], learning_rat=0.1)
    with pytest.raises(UserError, match="features and labels are empty"):
        doc["transdenoiser"].fit_private_head(np.zeros((0, features.shape[1])), np.zeros(0, dtype=np.int64))


def test_the_api_summarises_dp_accountings_convergence_warnings_once(caplog):
    """At a large sample rate dp-accounting logs one absl warning per dropped RDP order; the API turns them into one
    RuntimeWarning pointing at the caller, as the command line prints one note."""
    import transdenoiser
    from transdenoiser.convergence import CONVERGENCE_NOTE

    with caplog.at_level(logging.WARNING, logger="absl"), pytest.warns(RuntimeWarning) as caught:
        transdenoiser.epsilon_report(0.5, 0.8, 50, 1e-5)
    assert not [r for r in caplog.records if "failed to converge" in r.getMessage()]
    notes = [w for w in caught if "did not converge" in str(w.message)]
    assert len(notes) == 1 and notes[0].filename == __file__
    count = int(re.search(r"left out (\d+) RDP", str(notes[0].message)).group(1))
    assert str(notes[0].message) == CONVERGENCE_NOTE.format(count=count) and count > 0
    assert not logging.getLogger("absl").filters
