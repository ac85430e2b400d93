"""Xiang et al.'s optimized noise: the claims checked numerically; the sound per-group variant's budgets and
effective noise multiplier against independent computations."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize
from scipy.stats import multivariate_normal, norm

from training import shaped_noise as sn


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

    shaped = sn.shaped_noise_dpsgd(model(), x, y, xp, yp, xt, yt, noise_multiplier=1.0, sample_rate=0.2, steps=30,
                                   clip_norm=1.0, learning_rate=0.5, delta=1e-5, public_sample=64)
    assert np.allclose(shaped.trace["effective_multiplier"], 1.0)
    for budgets in shaped.trace["budgets"]:
        assert sum(c * c for c in budgets.values()) == pytest.approx(1.0)
    plain = sn.shaped_noise_dpsgd(model(), x, y, xp, yp, xt, yt, noise_multiplier=1.0, sample_rate=0.2, steps=30,
                                  clip_norm=1.0, learning_rate=0.5, delta=1e-5, shaped=False, public_sample=64)
    assert shaped.privacy["epsilon"] == plain.privacy["epsilon"]  # same multiplier, same accountant, same epsilon
    assert shaped.test_accuracy > 0.7 and plain.test_accuracy > 0.7  # chance is 1/3
    paper = sn.paper_optimized_noise(model(), x, y, xt, yt, epsilon=1.0, delta=1e-5, sample_rate=0.2, steps=5,
                                     clip_norm=1.0, learning_rate=0.5)
    assert paper.privacy["data_independent_epsilon"] is None
    assert paper.privacy["smallest_sigma_over_bound"] < 1
    assert paper.privacy["per_step_delta_at_eps_t_worst_direction"] > paper.privacy["per_step_delta"]
