"""Xiang et al.'s optimized noise: the claims checked numerically; the sound per-group variant's budgets and
effective noise multiplier against independent computations."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize
from scipy.stats import multivariate_normal, norm

from training.privacy import shaped_noise as sn
from training.privacy import shaped_noise_study as study


def monte_carlo_delta(epsilon, stds, shift, samples=200_000, seed=0):
    """delta(eps) = P[L > eps] - e^eps Q[L > eps] for P = N(0, diag s^2), Q = N(shift, diag s^2), with the privacy
    loss L = log p(x) - log q(x) evaluated by scipy's multivariate normal densities."""
    rng = np.random.default_rng(seed)
    cov = np.diag(np.asarray(stds) ** 2)
    p, q = multivariate_normal(np.zeros(len(stds)), cov), multivariate_normal(shift, cov)
    x_p = rng.normal(size=(samples, len(stds))) * stds
    x_q = x_p + shift
    loss_p = p.logpdf(x_p) - q.logpdf(x_p)
    loss_q = p.logpdf(x_q) - q.logpdf(x_q)
    return np.mean(loss_p > epsilon) - math.exp(epsilon) * np.mean(loss_q > epsilon)


def isotropic_delta(epsilon, std, sensitivity):
    a, b = sensitivity / (2 * std), epsilon * std / sensitivity
    return norm.cdf(a - b) - math.exp(epsilon) * norm.cdf(-a - b)


def test_anisotropic_gaussian_is_as_private_as_its_smallest_sigma():
    """(ii): for a worst-case difference of L2 norm alpha, N(0, diag sigma^2) is exactly the isotropic Gaussian with
    sigma_min, and a claim computed from the average sigma over-claims."""
    stds = np.array([0.5, 1.0, 2.0, 4.0])
    alpha, epsilon = 1.0, 0.5
    worst = np.array([alpha, 0, 0, 0])  # along the smallest sigma
    measured = monte_carlo_delta(epsilon, stds, worst)
    assert measured == pytest.approx(isotropic_delta(epsilon, stds.min(), alpha), abs=6e-3)
    assert sn.worst_case_delta(epsilon, stds, alpha) == pytest.approx(isotropic_delta(epsilon, 0.5, alpha), rel=1e-9)
    other = np.array([0, 0, alpha / math.sqrt(2), alpha / math.sqrt(2)])  # a milder direction of the same norm
    assert monte_carlo_delta(epsilon, stds, other) < measured - 0.05
    average_claim = isotropic_delta(epsilon, stds.mean(), alpha)
    assert measured > average_claim + 0.2


def test_exact_solution_of_eqn10_is_isotropic_and_the_papers_solver_breaks_the_constraint():
    rng = np.random.default_rng(0)
    w = rng.lognormal(sigma=2.0, size=300)
    tau, alpha = 0.3, 1.0
    exact = sn.exact_eqn10_sigmas(w, alpha, tau)
    assert np.allclose(exact, alpha / math.sqrt(tau))
    # the constraint sum Delta_i^2/sigma_i^2 <= tau over ||Delta|| <= alpha, maximised by scipy, is met with equality
    worst = -optimize.minimize(lambda d: -np.sum((alpha * d / np.linalg.norm(d)) ** 2 / exact ** 2),
                               rng.normal(size=300)).fun
    assert worst == pytest.approx(tau, rel=1e-6)
    approx = sn.paper_eqn11_sigmas(w, alpha, tau)
    assert approx.min() < alpha / math.sqrt(tau) * 0.9  # violated for the worst direction
    assert approx.std() > 0  # anisotropic
    assert np.sum(np.abs(w) * approx) < np.sum(np.abs(w) * exact)  # "better" only by breaking the constraint


def test_papers_tau_drops_the_variance_of_the_privacy_loss():
    """At sigma = alpha/sqrt(tau) the privacy loss is N(tau/2, tau); the paper's Markov bound used E e^{lambda c} =
    e^{lambda tau/2}, missing e^{lambda^2 tau / 2}. Its per-step (eps_t, delta_t) then fails by orders of magnitude."""
    eps_t, delta_t = 0.1, 1e-7
    order = sn.default_moment_order(eps_t, delta_t)
    tau = sn.paper_tau(eps_t, delta_t, order)
    std = 1.0 / math.sqrt(tau)
    assert isotropic_delta(eps_t, std, 1.0) > 1e4 * delta_t
    log_correct_markov = order * tau / 2 + order ** 2 * tau / 2 - order * eps_t
    assert log_correct_markov > 0  # the corrected moment bound (> 1) says nothing at this tau


def test_per_group_clipping_stays_within_budgets():
    torch.manual_seed(0)
    grads = {"a": 5 * torch.randn(32, 4, 3), "b": torch.randn(32, 7), "c": 0.01 * torch.randn(32, 2)}
    budgets = sn.group_clip_budgets({"a": 3.0, "b": 1.0, "c": 0.02}, clip_norm=2.0)
    assert sum(c * c for c in budgets.values()) == pytest.approx(4.0)
    clipped = sn.clip_per_group(grads, budgets)
    for name, g in clipped.items():
        norms = g.reshape(32, -1).norm(dim=1)
        assert torch.all(norms <= budgets[name] * (1 + 1e-6))
        small = grads[name].reshape(32, -1).norm(dim=1) <= budgets[name]
        assert torch.allclose(g[small], grads[name][small])  # untouched below the budget
    total = torch.cat([g.reshape(32, -1) for g in clipped.values()], 1).norm(dim=1)
    assert torch.all(total <= 2.0 * (1 + 1e-6))


def test_group_noise_is_optimal_and_equivalent_to_one_gaussian_with_multiplier_z():
    budgets = sn.group_clip_budgets({"a": 3.0, "b": 1.0, "c": 0.5}, clip_norm=1.0)
    sensitivities = {"a": 0.2, "b": 5.0, "c": 1.0}
    z = 1.3
    stds = sn.group_noise_stds(budgets, sensitivities, z)
    assert sn.effective_noise_multiplier(budgets, stds) == pytest.approx(z, rel=1e-12)
    keys = list(budgets)
    # optimality against scipy's constrained minimiser
    C = np.array([budgets[k] for k in keys])
    s = np.array([sensitivities[k] for k in keys])
    result = optimize.minimize(lambda x: s @ np.exp(x), np.log(np.full(3, z)), method="SLSQP",
                               constraints=[{"type": "eq", "fun": lambda x: np.sum(C ** 2 / np.exp(2 * x)) - z ** -2}],
                               options={"ftol": 1e-14, "maxiter": 500})
    assert s @ np.array([stds[k] for k in keys]) == pytest.approx(result.fun, rel=1e-5)
    # equivalence: for a neighbour differing by one clipped example (group norms C_g, the worst case), the exact
    # delta of the anisotropic Gaussian equals that of a Gaussian with multiplier z (Monte Carlo, 3 groups)
    sigma = np.array([stds[k] for k in keys])
    shift = C.copy()  # one coordinate per group carrying the group's whole budget
    for epsilon in (0.3, 1.0):
        assert monte_carlo_delta(epsilon, sigma, shift) == pytest.approx(isotropic_delta(epsilon, z, 1.0), abs=6e-3)
    # a planted error: budgets summing to 2 C^2 would give a larger effective sensitivity (smaller multiplier)
    doubled = {k: v * math.sqrt(2) for k, v in budgets.items()}
    assert sn.effective_noise_multiplier(doubled, stds) < z * 0.75


def _toy_task(n=300, d=8, classes=3, seed=0):
    centres = torch.randn(classes, d, generator=torch.Generator().manual_seed(123))  # one task, fresh draws
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n,), generator=g)
    x = centres[labels] + 0.5 * torch.randn(n, d, generator=g)
    return x, labels


def test_training_loops_run_and_report():
    x, y = _toy_task()
    xp, yp = _toy_task(seed=1)
    xt, yt = _toy_task(seed=2)

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    shaped = study.shaped_noise_dpsgd(model(), x, y, xp, yp, xt, yt, noise_multiplier=1.0, sample_rate=0.2, steps=30,
                                   clip_norm=1.0, learning_rate=0.5, delta=1e-5, public_sample=64)
    assert np.allclose(shaped.trace["effective_multiplier"], 1.0)
    for budgets in shaped.trace["budgets"]:
        assert sum(c * c for c in budgets.values()) == pytest.approx(1.0)
    plain = study.shaped_noise_dpsgd(model(), x, y, xp, yp, xt, yt, noise_multiplier=1.0, sample_rate=0.2, steps=30,
                                  clip_norm=1.0, learning_rate=0.5, delta=1e-5, shaped=False, public_sample=64)
    assert shaped.privacy["epsilon"] == plain.privacy["epsilon"]  # same multiplier, same accountant, same epsilon
    assert shaped.test_accuracy > 0.7 and plain.test_accuracy > 0.7  # chance is 1/3
    paper = study.paper_optimized_noise(model(), x, y, xt, yt, epsilon=1.0, delta=1e-5, sample_rate=0.2, steps=5,
                                     clip_norm=1.0, learning_rate=0.5)
    assert paper.privacy["data_independent_epsilon"] is None
    assert paper.privacy["smallest_sigma_over_bound"] < 1
    assert paper.privacy["per_step_delta_at_eps_t_worst_direction"] > paper.privacy["per_step_delta"]


# ------------------------------------------------------------------------------------------- in the denoiser trainer

def _tiny_sepdp_arm(noise="shaped", xi_up=1.5, batch=8.0):
    from training.arms import SepDPArm
    from training.models import build_model
    from training.train_config import TrainConfig

    torch.manual_seed(0)
    model = build_model("tiny", width=2, in_channels=1, activation="silu")
    config = TrainConfig(arm="sepdp", noise=noise, denoiser="tiny", denoiser_kwargs={"width": 2},
                         activation="silu", clip_norm=1.0, sigma=0.25)
    return SepDPArm(model, config, xi_up, batch, 10), model


def _independent_clipped_sum(model, x, z, budgets):
    """Per-example gradients by plain autograd, one example at a time, clipped per group by hand."""
    total = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
    contributions = []
    for i in range(len(x)):
        model.zero_grad()
        (model(z[i:i + 1]) - x[i:i + 1]).pow(2).sum().backward()
        clipped = {}
        for k, p in model.named_parameters():
            norm = float(p.grad.norm())
            clipped[k] = p.grad * min(1.0, budgets[k] / norm) if norm > 0 else p.grad.clone()
            total[k] += clipped[k]
        contributions.append(clipped)
    return total, contributions


def test_shaped_step_clips_each_group_to_its_budget_and_adds_noise_of_std_sigma_g():
    """The trainer's shaped sepdp step against an independent computation: with the same generator state, the
    update times B minus the hand-clipped sum is the noise; its per-group std must be sigma_g (not sigma_g / B,
    not z C), and each example's group contribution stays within C_g (total within C)."""
    arm, model = _tiny_sepdp_arm()
    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    budgets = sn.group_clip_budgets({k: 0.05 + i for i, (k, _) in enumerate(model.named_parameters())}, 1.0)
    big = 2000.0  # large stds so that the noise dominates float rounding of the clipped sum
    stds = {k: big * (1 + i) for i, k in enumerate(budgets)}
    shape = sn.GroupShape(budgets, stds)
    arm.shaper = sn.ShapedNoise(torch.rand(4, 1, 8, 8), seed=0, start_step=0, shape_examples=4)
    arm.shaper.shape = lambda _arm: shape  # a fixed shape: the test controls C_g and sigma_g
    residuals = {k: [] for k in budgets}
    for step in range(30):
        generator = torch.Generator().manual_seed(100 + step)
        replay = torch.Generator().manual_seed(100 + step)
        update, record = arm.gradient(x, generator)
        z = x + 0.25 * torch.randn(x.shape, generator=replay)  # the arm draws the input noise first
        expected, contributions = _independent_clipped_sum(model, x, z, budgets)
        if step == 0:
            for c in contributions:
                assert all(float(c[k].norm()) <= budgets[k] * (1 + 1e-6) for k in budgets)
                assert math.sqrt(sum(float(c[k].norm()) ** 2 for k in budgets)) <= 1.0 + 1e-6
        for k in budgets:
            residuals[k].append((update[k] * arm.expected_batch - expected[k]).flatten())
        assert record.explicit_multiplier == pytest.approx(sn.effective_noise_multiplier(budgets, stds))
    for k in budgets:
        noise = torch.cat(residuals[k]).double()
        assert abs(float(noise.mean())) < 4 * stds[k] / math.sqrt(len(noise))
        assert float(noise.std()) == pytest.approx(stds[k], rel=6 / math.sqrt(len(noise)) + 0.02)


def test_shaped_step_with_zero_noise_returns_exactly_the_group_clipped_sum():
    arm, model = _tiny_sepdp_arm()
    x = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    budgets = sn.group_clip_budgets({k: 1.0 for k, _ in model.named_parameters()}, 0.01)  # tight: all clipped
    arm.shaper = sn.ShapedNoise(torch.rand(4, 1, 8, 8), seed=0, start_step=0, shape_examples=4)
    arm.shaper.shape = lambda _arm: sn.GroupShape(budgets, {k: 1e-30 for k in budgets})  # noise below rounding
    update, _ = arm.gradient(x, torch.Generator().manual_seed(5))
    z = x + 0.25 * torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    expected, contributions = _independent_clipped_sum(model, x, z, budgets)
    for k in budgets:
        assert torch.allclose(update[k] * arm.expected_batch, expected[k], rtol=1e-4, atol=1e-7)
        for c in contributions:  # every group was clipped to exactly its budget
            assert float(c[k].norm()) == pytest.approx(budgets[k], rel=1e-5)


def test_public_shape_of_a_denoiser_meets_the_budget_and_gives_multiplier_z():
    """denoiser_group_shape on real public gradients: sum C_g^2 = C^2 and 1/sqrt(sum (C_g/sigma_g)^2) = z, both
    recomputed here with numpy; the shape is anisotropic (otherwise shaping would be a no-op)."""
    from training.privacy.dp import PerExampleGradients

    arm, model = _tiny_sepdp_arm()
    x_public = torch.rand(32, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    shape = sn.denoiser_group_shape(PerExampleGradients(model), x_public, 0.25, 2.0, 1.7,
                                    sn.public_shape_generator(0, 0))
    budgets = np.array([shape.budgets[k] for k in shape.budgets])
    stds = np.array([shape.stds[k] for k in shape.budgets])
    assert np.sum(budgets ** 2) == pytest.approx(4.0, rel=1e-12)
    z = 1 / np.sqrt(np.sum((budgets / stds) ** 2))
    assert z == pytest.approx(1.7, rel=1e-10) and z >= 1.7 * (1 - 1e-12)
    assert stds.max() / stds.min() > 1.5 and budgets.max() / budgets.min() > 1.5
    # the same public pick and noise from the same (seed, step): a resumed run recomputes the same shape
    again = sn.denoiser_group_shape(PerExampleGradients(model), x_public, 0.25, 2.0, 1.7,
                                    sn.public_shape_generator(0, 0))
    assert again.stds == shape.stds


@pytest.fixture(scope="module")
def shaped_run(tmp_path_factory, classifier_dir, mnist10k):
    from training.checkpoint import load_checkpoint
    from training.private_train import train_denoiser
    from training.release import load_private_record
    from training.train_config import TrainConfig

    config = TrainConfig(arm="sepdp", noise="shaped", shape_examples=16, denoiser="tiny",
                         denoiser_kwargs={"width": 2}, activation="silu", epochs=1, batch_size=16, train_examples=64,
                         eval_examples=50, learning_rate=0.05, target_epsilon=3.0, delta=1e-3)
    out = tmp_path_factory.mktemp("shaped") / "run"
    _, meta = train_denoiser(config, mnist10k, load_checkpoint(classifier_dir, kind="classifier"),
                             torch.device("cpu"), checkpoint_dir=out)
    return config, meta, load_private_record(out), out


def test_shaped_run_epsilon_is_dp_accountings_for_z(shaped_run):
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    config, meta, record, out = shaped_run
    privacy = meta["privacy"]
    assert privacy["gradient_noise"] == "shaped" and meta["config"]["noise"] == "shaped"
    (guarantee,) = privacy["guarantees"]
    assert guarantee["data_independent"] and "PUBLIC split" in guarantee["label"]
    z, q, steps = privacy["xi_up"], privacy["sample_rate"], privacy["steps_done"]
    assert (q, steps) == (16 / 64, 4)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    accountant = RdpAccountant()
    accountant.compose(event)
    assert guarantee["epsilon"]["rdp"] == pytest.approx(accountant.get_epsilon(config.delta), rel=1e-6)
    assert guarantee["epsilon"]["rdp"] <= 3.0 + 1e-9  # calibrated to the target through z
    # every step's effective multiplier, recorded privately, is z
    assert "shaped" in (out / "privacy_report.txt").read_text()
    from safetensors.torch import load_file

    history = load_file(out / "private" / "training_state.safetensors")["history.explicit_multiplier"]
    assert torch.allclose(history.double(), torch.full_like(history.double(), z), rtol=1e-9)
    assert record["privacy"]["gradient_noise"] == "shaped"


def test_optimized_noise_is_refused_without_the_acknowledgement(classifier_dir, capsys, tmp_path):
    from training.train_config import TrainConfig
    from transdenoiser.cli import main
    from transdenoiser.errors import UserError

    with pytest.raises(UserError, match="i-understand-unsound"):
        TrainConfig(arm="sepdp", noise="optimized", target_epsilon=1.0).validate(1000)
    with pytest.raises(UserError, match="sepdp arm only"):
        TrainConfig(arm="transdenoiser", noise="shaped").validate(1000)
    TrainConfig(arm="sepdp", noise="optimized", target_epsilon=1.0, acknowledge_unsound=True).validate(1000)
    status = main(["train", "--arm", "sepdp", "--noise", "optimized", "--target-epsilon", "1",
                   "--classifier", str(classifier_dir), "--out", str(tmp_path / "o"), "--denoiser", "tiny"])
    assert status == 2 and "--i-understand-unsound" in capsys.readouterr().err
    assert not (tmp_path / "o" / "metadata.json").exists()


def test_optimized_run_reports_no_data_independent_epsilon(tmp_path, classifier_dir, mnist10k):
    from training.checkpoint import load_checkpoint
    from training.private_train import train_denoiser
    from training.train_config import TrainConfig

    config = TrainConfig(arm="sepdp", noise="optimized", acknowledge_unsound=True, denoiser="tiny",
                         denoiser_kwargs={"width": 2}, activation="silu", epochs=1, batch_size=16, train_examples=64,
                         eval_examples=50, learning_rate=0.05, target_epsilon=1.0, delta=1e-3)
    _, meta = train_denoiser(config, mnist10k, load_checkpoint(classifier_dir, kind="classifier"),
                             torch.device("cpu"), checkpoint_dir=tmp_path / "run")
    privacy = meta["privacy"]
    assert "does NOT hold" in privacy["privacy_claim"] and privacy["claimed_epsilon"] == 1.0
    assert [g["name"] for g in privacy["guarantees"]] == ["data_independent"]
    assert privacy["guarantees"][0]["epsilon"]["rdp"] == "inf"
    text = (tmp_path / "run" / "privacy_report.txt").read_text()
    assert "NO PRIVACY GUARANTEE" in text and "none established" in text


def test_blackbox_privacy_audit_of_a_shaped_run_does_not_contradict_its_epsilon(tmp_path, classifier_dir, mnist10k):
    """The one-run audit (training/privacy) with image canaries through the real shaped mechanism: its empirical
    lower bounds stay below the claimed epsilon. The white-box audit, whose canaries ride on the isotropic noise
    component that the shaper bypasses, is refused rather than passed vacuously."""
    from training.audit.run import privacy_audit
    from training.checkpoint import load_checkpoint
    from training.privacy.audit import AuditSettings
    from training.train_config import TrainConfig
    from transdenoiser.errors import UserError

    config = TrainConfig(arm="sepdp", noise="shaped", shape_examples=16, denoiser="tiny",
                         denoiser_kwargs={"width": 2}, activation="silu", epochs=1, batch_size=16, train_examples=48,
                         eval_examples=50, learning_rate=0.05, target_epsilon=2.0, delta=1e-3,
                         reproducible_noise=True)  # one fixed draw: the verdict cannot flip between CI runs
    classifier = load_checkpoint(classifier_dir, kind="classifier")
    result = privacy_audit(config, mnist10k, classifier, torch.device("cpu"),
                           AuditSettings(mode="blackbox", num_canaries=32, membership=False), tmp_path / "bb")
    (claim,) = [c for c in result["claims"] if c["name"] == "sepdp"]
    assert claim["data_independent"] and "PUBLIC split" in claim["label"] and claim["epsilon"] <= 2.0 + 1e-9
    assert result["verdict"]["status"] == "PASS"
    assert result["epsilon_steinke"] <= claim["epsilon"] and result["epsilon_fdp"] <= claim["epsilon"]
    with pytest.raises(UserError, match="blackbox"):
        privacy_audit(config, mnist10k, classifier, torch.device("cpu"),
                      AuditSettings(mode="whitebox", num_canaries=32, membership=False), tmp_path / "wb")


def test_python_api_trains_with_shaped_noise():
    """train_private_denoiser(..., noise="shaped"): in-memory data has no public split, so the shape comes from the
    (public) test images; the released report names the mechanism and its epsilon is the target's."""
    from transdenoiser import api

    torch.manual_seed(0)
    classifier = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    images = torch.rand(48, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    test = (torch.rand(20, 1, 8, 8, generator=torch.Generator().manual_seed(1)), torch.randint(0, 3, (20,)))
    _, privacy = api.train_private_denoiser(classifier, images, test=test, arm="sepdp", noise="shaped",
                                            shape_examples=8, epochs=1, batch_size=12, target_epsilon=4.0,
                                            delta=1e-3, denoiser="tiny", denoiser_kwargs={"width": 2})
    assert privacy.extra["gradient_noise"] == "shaped"  # the typed report keeps the further keys in extra
    (guarantee,) = privacy.guarantees
    assert "PUBLIC split" in guarantee.label and guarantee.epsilon.value("rdp") <= 4.0 + 1e-9


def test_shaped_run_resumes_bit_for_bit(tmp_path, classifier_dir, mnist10k):
    """The public shape is a function of (seed, step): a resumed shaped run recomputes the same shapes."""
    from training.checkpoint import load_checkpoint
    from training.private_train import train_denoiser
    from training.train_config import TrainConfig

    config = TrainConfig(arm="sepdp", noise="shaped", shape_examples=8, denoiser="tiny", denoiser_kwargs={"width": 2},
                         activation="silu", epochs=2, batch_size=16, train_examples=48, eval_examples=20,
                         learning_rate=0.05, xi_up=1.0, delta=1e-3, reproducible_noise=True)
    clf = load_checkpoint(classifier_dir, kind="classifier")
    full, full_meta = train_denoiser(config, mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "full")
    train_denoiser(config, mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "part", stop_after_epochs=1)
    resumed, meta = train_denoiser(config, mnist10k, clf, torch.device("cpu"), checkpoint_dir=tmp_path / "part",
                                   resume=True)
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert meta["privacy"] == full_meta["privacy"]
