"""OPERA, GRPUA and DP-SGD on a head: noise scales against independent computations, sensitivities on
neighbouring datasets, loss constants against finite differences."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy.stats import norm

from training.convex import mechanisms as mech
from training.convex.losses import ConvexLoss


def exact_gaussian_delta(epsilon: float, std: float, sensitivity: float) -> float:
    """Balle & Wang's exact delta(eps) of the Gaussian mechanism, written out with scipy's normal CDF."""
    a, b = sensitivity / (2 * std), epsilon * std / sensitivity
    return norm.cdf(a - b) - math.exp(epsilon) * norm.cdf(-a - b)


def paper_agm_std(epsilon: float, delta: float, sensitivity: float) -> float:
    """Ding et al. Algorithm 1 lines 2-12 (Balle & Wang's Algorithm 1) with scipy: sigma = alpha D / sqrt(2 eps)."""
    phi = norm.cdf
    delta0 = phi(0) - math.exp(epsilon) * phi(-math.sqrt(2 * epsilon))
    if delta >= delta0:
        def b_plus(v):
            return phi(math.sqrt(epsilon * v)) - math.exp(epsilon) * phi(-math.sqrt(epsilon * (v + 2))) - delta
        hi = 1.0
        while b_plus(hi) <= 0:
            hi *= 2
        v = optimize.brentq(b_plus, 0.0, hi, xtol=1e-14)
        alpha = math.sqrt(1 + v / 2) - math.sqrt(v / 2)
    else:
        def b_minus(v):
            return phi(-math.sqrt(epsilon * v)) - math.exp(epsilon) * phi(-math.sqrt(epsilon * (v + 2))) - delta
        hi = 1.0
        while b_minus(hi) > 0:
            hi *= 2
        v = optimize.brentq(b_minus, 0.0, hi, xtol=1e-14)
        alpha = math.sqrt(1 + v / 2) + math.sqrt(v / 2)
    return alpha * sensitivity / math.sqrt(2 * epsilon)


def toy_data(n=200, d=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centres = rng.normal(size=(classes, d))
    X = centres[labels] + 0.7 * rng.normal(size=(n, d))
    return X / np.linalg.norm(X, axis=1, keepdims=True), labels


@pytest.mark.parametrize("loss_name", ["logistic", "softmax", "huber-svm"])
@pytest.mark.parametrize("epsilon", [0.05, 1.0, 8.0])
def test_opera_noise_is_the_analytic_gaussian_of_its_sensitivity(loss_name, epsilon):
    X, y = toy_data()
    loss = ConvexLoss(loss_name, 3)
    solution = mech.opera_solve(X, y, loss, reg=0.05)
    # the paper's Lemma 1 written out: 5 L (mu + beta) / (n mu beta), beta including lambda
    L, beta, mu = {"softmax": math.sqrt(2)}.get(loss_name, math.sqrt(3)), None, 0.05
    beta = {"logistic": 0.25, "softmax": 0.5, "huber-svm": 1.0}[loss_name] + mu
    assert solution.sensitivity == pytest.approx(5 * L * (mu + beta) / (200 * mu * beta), rel=1e-12)
    release = mech.opera_release(solution, epsilon, 1e-5, np.random.default_rng(1))
    std = release.privacy["noise_std"]
    assert std == pytest.approx(paper_agm_std(epsilon, 1e-5, solution.sensitivity), rel=1e-6)
    assert exact_gaussian_delta(epsilon, std, solution.sensitivity) <= 1e-5 * (1 + 1e-9)
    assert exact_gaussian_delta(epsilon, std, solution.sensitivity) == pytest.approx(1e-5, rel=1e-5)
    # a planted error: half the noise must fail the same check
    assert exact_gaussian_delta(epsilon, std / 2, solution.sensitivity) > 1e-5
    # the noise actually added has that scale (root mean square over 50 releases of 18 coordinates)
    rng = np.random.default_rng(2)
    noise = np.stack([mech.opera_release(solution, epsilon, 1e-5, rng).weights - solution.weights for _ in range(50)])
    assert np.sqrt(np.mean(noise ** 2)) == pytest.approx(std, rel=0.1)


def test_classical_calibration_is_the_textbook_formula():
    X, y = toy_data()
    solution = mech.opera_solve(X, y, ConvexLoss("logistic", 3), reg=0.05)
    release = mech.opera_release(solution, 0.5, 1e-5, np.random.default_rng(0), calibration="classical")
    expected = math.sqrt(2 * math.log(1.25 / 1e-5)) * solution.sensitivity / 0.5
    assert release.privacy["noise_std"] == pytest.approx(expected, rel=1e-12)
    assert release.privacy["noise_std"] > mech.opera_release(solution, 0.5, 1e-5, np.random.default_rng(0)
                                                             ).privacy["noise_std"]


def _neighbour(X, y, index, rng):
    X2, y2 = X.copy(), y.copy()
    v = rng.normal(size=X.shape[1])
    X2[index] = v / np.linalg.norm(v)
    y2[index] = (y[index] + 1 + rng.integers(0, 2)) % 3
    return X2, y2


@pytest.mark.parametrize("loss_name", ["logistic", "softmax", "huber-svm"])
@pytest.mark.parametrize("mode", ["gd", "minimizer"])
def test_opera_solution_moves_less_than_its_sensitivity_on_neighbouring_datasets(loss_name, mode):
    X, y = toy_data(n=60, d=4)
    loss = ConvexLoss(loss_name, 3)
    rng = np.random.default_rng(3)
    base = mech.opera_solve(X, y, loss, reg=0.1, sensitivity=mode)
    moves = []
    for index in range(0, 60, 6):
        X2, y2 = _neighbour(X, y, index, rng)
        other = mech.opera_solve(X2, y2, loss, reg=0.1, sensitivity=mode)
        moves.append(np.linalg.norm(base.weights - other.weights))
    assert max(moves) <= base.sensitivity
    assert max(moves) > 0.02 * base.sensitivity  # the bound is not vacuous for this problem
    if mode == "minimizer":  # within 0.1% of 2L/(n mu): the checked optimisation error is accounted for
        assert base.sensitivity == pytest.approx(2 * loss.lipschitz / (60 * 0.1), rel=2e-3)


def test_opera_non_strongly_convex_uses_lemma_2():
    X, y = toy_data(n=60, d=4)
    loss = ConvexLoss("logistic", 3)
    base = mech.opera_solve(X, y, loss, reg=0.0, steps=40)
    assert base.sensitivity == pytest.approx(3 * loss.lipschitz * 40 * (1 / 0.25) / 60)
    X2, y2 = _neighbour(X, y, 5, np.random.default_rng(0))
    assert np.linalg.norm(mech.opera_solve(X2, y2, loss, reg=0.0, steps=40).weights - base.weights) <= base.sensitivity


@pytest.mark.parametrize("loss_name", ["logistic", "softmax", "huber-svm"])
def test_loss_gradients_and_constants(loss_name):
    rng = np.random.default_rng(0)
    loss = ConvexLoss(loss_name, 4)
    X, y = toy_data(n=30, d=5, classes=4)
    targets = loss.targets(y)
    W0 = rng.normal(size=(5, 4))
    error = optimize.check_grad(lambda w: loss.objective(w.reshape(5, 4), X, targets, 0.3)[0],
                                lambda w: loss.objective(w.reshape(5, 4), X, targets, 0.3)[1].ravel(), W0.ravel())
    assert error < 1e-5
    # per-example gradient norms never exceed L, even for large weights
    for scale in (0.1, 1.0, 30.0):
        _, G = loss.coefficients(scale * rng.normal(size=(5, 4)), X, targets)
        assert np.max(np.linalg.norm(G, axis=1) * np.linalg.norm(X, axis=1)) <= loss.lipschitz + 1e-12
    # smoothness: the gradient of one example's loss is beta-Lipschitz (finite differences along random pairs)
    worst = 0.0
    for _ in range(200):
        i = rng.integers(30)
        A, B = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
        B = A + 0.3 * B
        ga = np.outer(X[i], loss.coefficients(A, X[i:i + 1], targets[i:i + 1])[1][0])
        gb = np.outer(X[i], loss.coefficients(B, X[i:i + 1], targets[i:i + 1])[1][0])
        worst = max(worst, np.linalg.norm(ga - gb) / np.linalg.norm(A - B))
    assert worst <= loss.smoothness + 1e-9


def test_theorem7_matches_the_paper_for_n_squared_steps():
    n, step_eps, step_delta = 50, 0.3, 1e-6
    eps, delta = mech.theorem7_epsilon_delta(step_eps, step_delta, n, n * n)
    paper = math.sqrt(8 * math.log(n / step_delta)) * step_eps + 2 * n * step_eps * math.expm1(2 * step_eps / n)
    assert eps == pytest.approx(paper, rel=1e-12)
    assert delta == pytest.approx(n * step_delta + step_delta / n)
    assert mech.theorem7_epsilon_delta(1.01, step_delta, n, n * n)[0] == math.inf  # Lemma 3 needs eps_s <= 1


def test_grpua_noise_is_the_analytic_gaussian_at_the_true_query_sensitivity():
    X, y = toy_data(n=40, d=4)
    loss = ConvexLoss("logistic", 3)
    release = mech.grpua(X, y, loss, 2.0, 1e-5, 0.1, np.random.default_rng(0))
    p = release.privacy
    n, T = 40, 1600
    assert p["steps"] == T and p["query_sensitivity"] == pytest.approx(2 * n * loss.lipschitz)
    step_delta = 1e-5 * n / (T + 1)
    # the per-step epsilon spends the whole budget under Theorem 7 ...
    step_eps = p["step_epsilon"]
    paper = math.sqrt(8 * math.log(n / step_delta)) * step_eps + 2 * n * step_eps * math.expm1(2 * step_eps / n)
    assert paper == pytest.approx(2.0, rel=1e-6) and paper <= 2.0 * (1 + 1e-9)
    # ... and the noise is the analytic Gaussian for it at sensitivity 2nL (the paper's line 12 would use L)
    assert p["noise_std"] == pytest.approx(paper_agm_std(step_eps, step_delta, 2 * n * loss.lipschitz), rel=1e-6)
    assert exact_gaussian_delta(step_eps, p["noise_std"] / 2, 2 * n * loss.lipschitz) > step_delta
    assert p["epsilons"]["rdp"] < p["epsilons"]["theorem7"]  # the RDP accountant is tighter here
    assert np.linalg.norm(release.weights) <= p["radius"] + 1e-9


def test_grpua_rdp_calibration_meets_its_target():
    X, y = toy_data(n=40, d=4)
    release = mech.grpua(X, y, ConvexLoss("huber-svm", 3), 1.0, 1e-5, 0.1, np.random.default_rng(0), steps=400,
                         accountant="rdp")
    assert 0.97 < release.privacy["epsilons"]["rdp"] <= 1.0
    assert release.privacy["delta_theorem7"] <= 1e-5


def test_replace_one_rdp_with_full_sampling_is_the_gaussian_rdp():
    """Sampling all n records is no sampling: dp-accounting's add/remove Gaussian RDP gives the same epsilon."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    ours = mech.rdp_replace_one_epsilon(2.0, 100, 100, 10, 1e-5)
    reference = RdpAccountant(mech.WOR_RDP_ORDERS)
    reference.compose(dp_accounting.GaussianDpEvent(2.0), 10)
    assert ours == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)


def test_dpsgd_head_reaches_its_epsilon_and_learns():
    X, y = toy_data(n=400, d=6)
    loss = ConvexLoss("softmax", 3)
    release = mech.dpsgd_head(X, y, loss, 4.0, 1e-5, 1e-3, np.random.default_rng(0), batch_size=50, epochs=5)
    assert 3.9 < release.privacy["epsilon"] <= 4.0
    assert (loss.predict(release.weights, X) == y).mean() > 0.6


def test_unnormalised_features_are_refused():
    from transdenoiser.errors import UserError

    X, y = toy_data()
    with pytest.raises(UserError, match="norm <= 1"):
        mech.opera_solve(2 * X, y, ConvexLoss("logistic", 3), 0.1)


def test_rounding_above_norm_1_is_projected_so_the_bound_holds_exactly():
    """Rows a normalisation left within 1e-9 above norm 1 are projected onto the unit ball (row by row), so the
    sensitivities' assumption ||x|| <= 1 holds exactly; rows inside the ball are untouched."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 6))
    X[:20] /= np.linalg.norm(X[:20], axis=1, keepdims=True) / (1 + 5e-10)  # just above 1
    X[20:] /= 2 * np.linalg.norm(X[20:], axis=1, keepdims=True)  # norm 1/2
    checked = mech._check_data(X)
    assert np.linalg.norm(checked, axis=1).max() <= 1.0 and np.array_equal(checked[20:], X[20:])
    assert np.abs(checked - X).max() < 1e-9


def test_the_papers_grpua_noise_is_2n_times_too_small():
    """Ding et al. Algorithm 2 line 12 calibrates s to L; the query n grad f(w, z_i) has replace-one sensitivity 2nL.
    For n = 3000, K = 10, delta = 1e-5, T = n^2 and a total epsilon of 1, each step should be (eps_s, delta_s)-DP with
    eps_s of about 0.066, but the paper's s is not even (100, delta_s)-DP for the real sensitivity."""
    n, L, T = 3000, math.sqrt(10), 3000 * 3000
    step_eps = mech.theorem7_step_epsilon(1.0, 1e-5, n, T)
    step_delta = mech.theorem7_step_delta(1e-5, n, T)
    assert 0.06 < step_eps < 0.07
    papers_std = paper_agm_std(step_eps, step_delta, L)
    assert exact_gaussian_delta(100.0, papers_std, 2 * n * L) > step_delta
    ours = paper_agm_std(step_eps, step_delta, 2 * n * L)
    assert exact_gaussian_delta(step_eps, ours, 2 * n * L) <= step_delta * 1.000001


def test_one_run_privacy_audit_does_not_contradict_opera_and_catches_a_planted_error():
    """The product's one-run audit (Steinke et al.; Mahloujifar et al.) on OPERA with 1000 canaries, replace-one per
    slot: slot i holds (e_i, class 1) or its neighbour (e_i, class 0), each with probability 1/2. The empirical
    lower bounds must stay below the claimed epsilon; with the noise divided by 10 they must exceed it."""
    from training.privacy.bounds import one_run_lower_bounds

    m = 1000
    included = np.random.default_rng(0).random(m) < 0.5
    loss = ConvexLoss("logistic", 2, binary=True)
    solution = mech.opera_solve(np.eye(m), included.astype(np.int64), loss, 1e-3, sensitivity="minimizer")
    release = mech.opera_release(solution, 2.0, 1e-5, np.random.default_rng(1))
    honest = one_run_lower_bounds(release.weights[:, 0], included, 1e-5)
    assert max(honest["epsilon_steinke"], honest["epsilon_fdp"]) <= 2.0
    planted = solution.weights + (release.weights - solution.weights) / 10
    broken = one_run_lower_bounds(planted[:, 0], included, 1e-5)
    assert min(broken["epsilon_steinke"], broken["epsilon_fdp"]) > 2.0
