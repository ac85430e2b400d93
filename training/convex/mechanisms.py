"""OPERA and GRPUA (Ding et al.), the classical-Gaussian versions they are compared with, and DP-SGD on a head.

Neighbouring relation: REPLACE-ONE (one example of the n is replaced; n is public), the relation of the
paper's Definition 4 and of its sensitivity lemmas. Every release returns a JSON-safe ``privacy`` dict naming
the analysis behind each epsilon.

OPERA (Algorithm 1). Solve F(W) = (1/n) sum_i l(W; z_i) + (lambda/2)||W||^2 and add N(0, s^2 I) with s from the
analytic Gaussian mechanism (aGM, Balle & Wang 2018 Thm. 8 = Ding et al. Thm. 2) at the L2 sensitivity D:

- ``sensitivity="gd"`` (the paper's): T steps of full gradient descent from 0; strongly convex (lambda > 0):
  step 1/(beta + mu), D = 5 L (mu + beta) / (n mu beta) (Lemma 1, from Zhang et al. 2017), valid for EVERY T,
  so the optimisation error needs no assumption. Non-strongly convex (lambda = 0): step 1/beta,
  D = 3 L T eta / n (Lemma 2). Here mu = lambda and beta = (smoothness of the data term) + lambda.
- ``sensitivity="minimizer"`` (strongly convex only): L-BFGS until ||grad F|| <= g (checked), then
  D = 2L/(n mu) + 2g/mu: the exact minimiser moves by at most 2L/(n mu) (Chaudhuri et al. 2011, Lemma 7) and
  strong convexity puts the returned point within g/mu of it, on both datasets.

GRPUA (Algorithm 2). T single-example steps W <- Proj_R(W - eta_t (n grad f(W; z_i) + N(0, s^2 I))), i uniform
in [n]. The query n grad f(W; z_i) has replace-one L2 sensitivity 2nL (the sampled example may be the replaced
one); the paper's line 12 calibrates s to L instead, which does not give its Theorem 7 (docs/PRIVACY.md).
Here s is calibrated to 2nL, with per-step (eps_s, delta_s) from one of two analyses:

- ``accountant="theorem7"``: the paper's Theorem 7 for T steps: Lemma 3 (sampling one of n turns
  (eps_s, delta_s) into (2 eps_s / n, delta_s / n); true for eps_s <= 1 only, so larger eps_s is refused) and
  Lemma 4 (strong composition, slack delta_s / n as in the paper): epsilon = e' sqrt(2 T log(n / delta_s))
  + T e' (exp(e') - 1), e' = 2 eps_s / n, delta = (T + 1) delta_s / n (the paper writes n delta_s for T = n^2,
  dropping the slack's delta_s / n). For T = n^2 this is the paper's
  sqrt(8 log(n/delta)) eps + 2 n eps (e^{2eps/n} - 1).
- ``accountant="rdp"``: dp-accounting's RDP accountant, REPLACE_ONE relation, T-fold sampling without
  replacement of 1 of n records followed by a Gaussian with noise multiplier s / (2nL). Tighter.

Both epsilons are reported for the noise actually used. GRPUA's step sizes are the paper's: 1/(mu n t)
(strongly convex, Thm. 8) or R / sqrt(t (n^2 L^2 + p s^2)) (non-strongly convex, Thm. 9; p = parameter count),
with projection onto the ball ||W|| <= R (strongly convex: R = sqrt(2 l(0) / lambda), which contains the
minimiser for every dataset; non-strongly convex: the given ``radius``). Projection is post-processing.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import optimize

from training.convex.losses import ConvexLoss
from training.privacy.accounting import analytic_gaussian_sigma, classical_gaussian_sigma, gaussian_mechanism_delta
from transdenoiser.errors import UserError
from transdenoiser.progress import Track, silent

NEIGHBOURING = "replace-one (one example replaced; the dataset size n is public)"
CALIBRATIONS = ("analytic", "classical")
OPERA_SENSITIVITIES = ("gd", "minimizer")
GRPUA_ACCOUNTANTS = ("theorem7", "rdp")
AGM_NAME = ("analytic Gaussian mechanism (Balle & Wang 2018, Thm. 8; Ding et al. Thm. 2): exact condition "
            "Phi(D/2s - eps s/D) - e^eps Phi(-D/2s - eps s/D) <= delta solved numerically "
            "(training.privacy.accounting)")
CLASSICAL_NAME = "classical Gaussian mechanism s = sqrt(2 ln(1.25/delta)) D / eps (Dwork & Roth Thm. A.1; eps <= 1)"
MINIMIZER_GRADIENT_TOLERANCE = 1e-3  # g = this * L / n: the optimisation error adds 0.1% to the sensitivity
# RDP orders for sampling without replacement (each order is one numerical evaluation, so fewer than the Poisson
# accountant's grid). A coarser grid can only RAISE the epsilon: it stays an upper bound.
WOR_RDP_ORDERS = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0,
                  128.0, 256.0)


@dataclass
class Release:
    """A private head ``weights`` (d, columns) and its privacy report."""

    weights: np.ndarray
    privacy: dict[str, Any]


def _noise_std(calibration: str, epsilon: float, delta: float, sensitivity: float) -> float:
    if calibration == "analytic":
        return analytic_gaussian_sigma(epsilon, delta, sensitivity)
    if calibration == "classical":
        return classical_gaussian_sigma(epsilon, delta, sensitivity)
    raise UserError(f"calibration must be one of {', '.join(CALIBRATIONS)}, got {calibration!r}")


def _check_data(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or len(X) < 2:
        raise UserError(f"features must be an (n, d) array with n >= 2, got shape {X.shape}")
    norms = np.linalg.norm(X, axis=1)
    if norms.max() > 1 + 1e-9:
        raise UserError(f"feature vectors must have L2 norm <= 1 (the Lipschitz constants assume it); "
                        f"the largest is {norms.max():.6g}")
    over = norms > 1  # float rounding of a normalisation (within 1e-9): projected onto the unit ball, row by row,
    if over.any():  # so that the sensitivities' bound ||x|| <= 1 holds exactly (a per-example map: no privacy cost)
        X = X.copy()
        X[over] /= norms[over, None]
        while (still := np.linalg.norm(X, axis=1) > 1).any():
            X[still] *= 1 - 2.0 ** -52
    return X


# ------------------------------------------------------------------------------------------------------- OPERA

@dataclass
class OperaSolution:
    """The non-private solution and its sensitivity, before any noise (solve once, release at many epsilons)."""

    weights: np.ndarray
    sensitivity: float
    details: dict[str, Any]


def opera_solve(X: np.ndarray, labels: np.ndarray, loss: ConvexLoss, reg: float, *, sensitivity: str = "gd",
                steps: int | None = None, track: Track = silent) -> OperaSolution:
    """Solve the ERM as OPERA does and return the minimiser with its replace-one L2 sensitivity."""
    X = _check_data(X)
    n, d = X.shape
    if not (math.isfinite(reg) and reg >= 0):
        raise UserError(f"regularisation lambda must be >= 0, got {reg}")
    if sensitivity not in OPERA_SENSITIVITIES:
        raise UserError(f"OPERA sensitivity must be one of {', '.join(OPERA_SENSITIVITIES)}, got {sensitivity!r}")
    targets = loss.targets(labels)
    L, mu, beta = loss.lipschitz, reg, loss.smoothness + reg
    W = np.zeros((d, loss.columns))
    objective = functools.partial(loss.objective, X=X, targets=targets, reg=reg)
    if sensitivity == "minimizer":
        if reg <= 0:
            raise UserError("OPERA with sensitivity 'minimizer' needs lambda > 0 (strong convexity)")
        tolerance = MINIMIZER_GRADIENT_TOLERANCE * L / n
        result = optimize.minimize(lambda w: objective(w.reshape(W.shape)), W.ravel(), jac=True, method="L-BFGS-B",
                                   options={"maxiter": 20000, "gtol": tolerance / 10, "ftol": 0.0, "maxcor": 30})
        W = result.x.reshape(W.shape)
        grad_norm = float(np.linalg.norm(objective(W)[1]))
        for _ in track(range(100000), desc="OPERA polish"):  # plain gradient steps if L-BFGS stopped short
            if grad_norm <= tolerance:
                break
            W = W - objective(W)[1] / (beta + mu)
            grad_norm = float(np.linalg.norm(objective(W)[1]))
        if grad_norm > tolerance:
            raise UserError(f"OPERA: the gradient norm {grad_norm:.3g} did not reach {tolerance:.3g}; "
                            "nothing released (use --opera-sensitivity gd)")
        bound = 2 * L / (n * mu) + 2 * tolerance / mu
        details = {"solver": "L-BFGS-B (scipy) then gradient steps until ||grad F|| <= g", "gradient_norm": grad_norm,
                   "gradient_tolerance": tolerance,
                   "sensitivity_bound": "2L/(n mu) + 2g/mu: exact minimiser's replace-one sensitivity (Chaudhuri et "
                                        "al. 2011, Lemma 7) plus the distance g/mu to it on each dataset"}
    else:
        strongly = reg > 0
        eta = 1 / (beta + mu) if strongly else 1 / beta
        if steps is None:
            steps = (math.ceil((beta + mu) ** 2 / (mu * beta) * math.log(1e4)) if strongly
                     else math.ceil(math.sqrt(n)))
        if steps < 1:
            raise UserError(f"steps must be >= 1, got {steps}")
        for _ in track(range(steps), desc="OPERA gradient descent", total=steps):
            W = W - eta * objective(W)[1]
        if strongly:
            bound = 5 * L * (mu + beta) / (n * mu * beta)
            text = "5L(mu + beta)/(n mu beta) (Ding et al. Lemma 1, from Zhang et al. 2017), any number of steps"
        else:
            bound = 3 * L * steps * eta / n
            text = "3 L T eta / n (Ding et al. Lemma 2, from Zhang et al. 2017)"
        details = {"solver": "gradient descent from 0 (Ding et al. Algorithm 1 lines 13-15)", "steps": steps,
                   "step_size": eta, "sensitivity_bound": text,
                   "gradient_norm": float(np.linalg.norm(objective(W)[1]))}
    details.update({"lipschitz": L, "smoothness": beta, "strong_convexity": mu, "n": n,
                    "objective": objective(W)[0]})
    return OperaSolution(W, bound, details)


def opera_release(solution: OperaSolution, epsilon: float, delta: float, rng: np.random.Generator,
                  calibration: str = "analytic") -> Release:
    """Add the calibrated Gaussian noise to the solution (Algorithm 1 line 16)."""
    std = _noise_std(calibration, epsilon, delta, solution.sensitivity)
    noisy = solution.weights + std * rng.standard_normal(solution.weights.shape)
    name = "OPERA" if calibration == "analytic" else "OutPert (output perturbation, classical Gaussian)"
    privacy = {"mechanism": name, "paper": "Ding et al., Private ERM with the analytic Gaussian mechanism",
               "theorem": "Thm. 3 (strongly convex) / Thm. 5 (non-strongly convex): one Gaussian release",
               "epsilon": epsilon, "delta": delta, "neighbouring": NEIGHBOURING, "data_independent": True,
               "calibration": AGM_NAME if calibration == "analytic" else CLASSICAL_NAME,
               "sensitivity": solution.sensitivity, "noise_std": std, **solution.details}
    return Release(noisy, privacy)


# ------------------------------------------------------------------------------------------------------- GRPUA

def theorem7_epsilon_delta(step_epsilon: float, step_delta: float, n: int, steps: int) -> tuple[float, float]:
    """(epsilon, delta) of Ding et al.'s Theorem 7 for ``steps`` steps of an (eps_s, delta_s)-DP query on one of n.

    Lemma 3 (amplification 2 eps_s / n) needs eps_s <= 1: for larger eps_s the result is ``inf``."""
    if step_epsilon > 1:
        return math.inf, 1.0
    e = 2 * step_epsilon / n
    epsilon = e * math.sqrt(2 * steps * math.log(n / step_delta)) + steps * e * math.expm1(e)
    return epsilon, (steps + 1) * step_delta / n


def theorem7_step_delta(delta: float, n: int, steps: int) -> float:
    """Per-step delta_s with total delta (T + 1) delta_s / n <= ``delta`` (at most 1/2; rounded down)."""
    return min(delta * n / (steps + 1) * (1 - 1e-12), 0.5)


def theorem7_step_epsilon(epsilon: float, delta: float, n: int, steps: int) -> float:
    """Largest per-step eps_s <= 1 whose Theorem 7 epsilon is <= ``epsilon`` (at the delta_s above)."""
    step_delta = theorem7_step_delta(delta, n, steps)

    def gap(e: float) -> float:
        return theorem7_epsilon_delta(e, step_delta, n, steps)[0] - epsilon

    if gap(1.0) <= 0:
        return 1.0
    value = optimize.brentq(gap, 1e-300, 1.0, xtol=1e-15, rtol=1e-13)
    while gap(value) > 0:
        value *= 1 - 1e-12
    return value


def gaussian_epsilon(noise_ratio: float, delta: float) -> float:
    """Smallest eps with exact Gaussian-mechanism delta(eps) <= delta at std/sensitivity = ``noise_ratio``."""
    if gaussian_mechanism_delta(0.0, noise_ratio) <= delta:
        return 0.0
    high = 1.0
    while gaussian_mechanism_delta(high, noise_ratio) > delta:
        high *= 2
    value = optimize.brentq(lambda e: gaussian_mechanism_delta(e, noise_ratio) - delta, 0.0, high, xtol=1e-14)
    while gaussian_mechanism_delta(value, noise_ratio) > delta:
        value += max(value, 1e-300) * 1e-12
    return value


def rdp_replace_one_epsilon(noise_multiplier: float, dataset_size: int, sample_size: int, steps: int,
                            delta: float) -> float:
    """dp-accounting RDP epsilon: ``steps`` x (sample ``sample_size`` of ``dataset_size`` without replacement,
    then a Gaussian with ``noise_multiplier`` = std / replace-one L2 sensitivity), REPLACE_ONE relation."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(WOR_RDP_ORDERS, dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(dataset_size, sample_size,
                                                           dp_accounting.GaussianDpEvent(noise_multiplier))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def rdp_replace_one_multiplier(epsilon: float, dataset_size: int, sample_size: int, steps: int, delta: float,
                               rtol: float = 1e-3) -> float:
    """Smallest noise multiplier (to relative ``rtol``, rounded up) with RDP epsilon <= ``epsilon``."""
    def eps_of(log_z: float) -> float:
        return rdp_replace_one_epsilon(math.exp(log_z), dataset_size, sample_size, steps, delta)

    low, high = math.log(0.1), math.log(1.0)
    while eps_of(high) > epsilon:
        low, high = high, high + 1.0
        if high > math.log(1e7):
            raise UserError(f"epsilon {epsilon} is out of reach for noise multipliers up to 1e7")
    while eps_of(low) <= epsilon:
        low -= 1.0
    while high - low > rtol / 2:
        mid = (low + high) / 2
        low, high = (low, mid) if eps_of(mid) <= epsilon else (mid, high)
    return math.exp(high)


def grpua(X: np.ndarray, labels: np.ndarray, loss: ConvexLoss, epsilon: float, delta: float, reg: float,
          rng: np.random.Generator, *, steps: int | None = None, accountant: str = "theorem7",
          calibration: str = "analytic", radius: float | None = None, track: Track = silent) -> Release:
    """GRPUA (Ding et al. Algorithm 2) with the noise calibrated to the query's true sensitivity 2nL."""
    X = _check_data(X)
    n, d = X.shape
    steps = n * n if steps is None else steps
    if steps < 1:
        raise UserError(f"steps must be >= 1, got {steps}")
    if accountant not in GRPUA_ACCOUNTANTS:
        raise UserError(f"GRPUA accountant must be one of {', '.join(GRPUA_ACCOUNTANTS)}, got {accountant!r}")
    L, mu = loss.lipschitz, reg
    query_sensitivity = 2 * n * L
    step_delta = theorem7_step_delta(delta, n, steps)
    if accountant == "theorem7":
        step_epsilon = theorem7_step_epsilon(epsilon, delta, n, steps)
        std = _noise_std(calibration, step_epsilon, step_delta, query_sensitivity)
    else:
        if calibration != "analytic":
            raise UserError("GRPUA with the RDP accountant calibrates the Gaussian itself: use calibration 'analytic'")
        std = rdp_replace_one_multiplier(epsilon, n, 1, steps, delta) * query_sensitivity
    ratio = std / query_sensitivity
    realised_step_epsilon = gaussian_epsilon(ratio, step_delta)
    if accountant == "theorem7":  # aGM rounds s up, so (eps_s, delta_s) holds; the inversion may round a hair up
        realised_step_epsilon = min(realised_step_epsilon, step_epsilon)
    thm7_eps, thm7_delta = theorem7_epsilon_delta(realised_step_epsilon, step_delta, n, steps)
    rdp_eps = rdp_replace_one_epsilon(ratio, n, 1, steps, delta)
    claimed = thm7_eps if accountant == "theorem7" else rdp_eps
    if claimed > epsilon * (1 + 1e-9):
        raise AssertionError(f"GRPUA calibration failed: {claimed} > {epsilon}")  # a bug, never the user's input

    targets = loss.targets(labels)
    strongly = reg > 0
    R = math.sqrt(2 * loss.zero_loss() / reg) if strongly else radius
    if R is None or not R > 0:
        raise UserError("GRPUA without regularisation (non-strongly convex) needs a radius R > 0")
    params = d * loss.columns
    W = np.zeros((d, loss.columns))
    indices = rng.integers(0, n, size=steps)
    chunk = 65536
    for start in track(range(0, steps, chunk), desc="GRPUA steps", total=math.ceil(steps / chunk)):
        stop = min(start + chunk, steps)
        noise = rng.standard_normal((stop - start, d, loss.columns))
        for j, t in enumerate(range(start + 1, stop + 1)):
            i = indices[t - 1]
            _, G = loss.coefficients(W, X[i:i + 1], targets[i:i + 1])
            query = n * np.outer(X[i], G[0]) + std * noise[j]  # n grad l(W; z_i) + N(0, s^2 I)
            if strongly:
                W = W - (query + n * reg * W) / (mu * n * t)  # eta_t = 1 / (mu n t) on n grad f, f = l + reg
            else:
                W = W - R / math.sqrt(t * (n * n * L * L + params * std * std)) * query
            norm = np.linalg.norm(W)
            if norm > R:
                W *= R / norm
    name = "GRPUA" if calibration == "analytic" else "SgdPert (gradient perturbation, classical Gaussian)"
    privacy = {
        "mechanism": name, "paper": "Ding et al., Private ERM with the analytic Gaussian mechanism, Algorithm 2",
        "epsilon": claimed, "delta": delta, "target_epsilon": epsilon, "neighbouring": NEIGHBOURING,
        "data_independent": True, "accountant": accountant,
        "epsilons": {"theorem7": thm7_eps, "rdp": rdp_eps},
        "delta_theorem7": thm7_delta,
        "analyses": {
            "theorem7": ("Ding et al. Thm. 7 for T steps: Lemma 3 amplification (2 eps_s/n, delta_s/n; needs eps_s <= "
                         "1, else inf) + Lemma 4 strong composition with slack delta_s/n; per-step eps_s from the "
                         "exact Gaussian privacy profile at delta_s"),
            "rdp": ("RDP accountant (dp-accounting RdpAccountant, REPLACE_ONE, SampledWithoutReplacement 1 of n, "
                    "Gaussian with multiplier s/(2nL)), T-fold: upper bound"),
        },
        "calibration": AGM_NAME if calibration == "analytic" else CLASSICAL_NAME,
        "query": "n grad l(W; z_i) with i uniform in [n]", "query_sensitivity": query_sensitivity,
        "sensitivity_note": ("the paper's line 12 calibrates s to L; the query's replace-one sensitivity is 2nL, "
                             "used here"),
        "noise_std": std, "noise_multiplier": ratio, "step_epsilon": realised_step_epsilon, "step_delta": step_delta,
        "steps": steps, "n": n, "lipschitz": L, "strong_convexity": mu, "radius": R,
        "step_size": "1/(mu n t)" if strongly else "R/sqrt(t (n^2 L^2 + p s^2))",
    }
    return Release(W, privacy)


# --------------------------------------------------------------------------------------------- DP-SGD on the head

def dpsgd_head(X: np.ndarray, labels: np.ndarray, loss: ConvexLoss, epsilon: float, delta: float, reg: float,
               rng: np.random.Generator, *, batch_size: int = 256, epochs: float = 10, learning_rate: float = 1.0,
               clip_norm: float | None = None, track: Track = silent) -> Release:
    """DP-SGD on the head: fixed-size batches sampled without replacement, per-example clipping to C (default L,
    which the features' norm bound already guarantees), N(0, (2 C z)^2 I) on the sum, z from dp-accounting's RDP
    accountant (REPLACE_ONE, sampling without replacement), plain SGD with weight decay lambda."""
    X = _check_data(X)
    n, d = X.shape
    if not 1 <= batch_size <= n:
        raise UserError(f"batch size must lie in [1, n = {n}], got {batch_size}")
    C = loss.lipschitz if clip_norm is None else clip_norm
    steps = max(1, round(epochs * n / batch_size))
    z = rdp_replace_one_multiplier(epsilon, n, batch_size, steps, delta)
    std = 2 * C * z
    targets = loss.targets(labels)
    W = np.zeros((d, loss.columns))
    for _ in track(range(steps), desc="DP-SGD head steps", total=steps):
        batch = rng.choice(n, size=batch_size, replace=False)
        x = X[batch]
        _, G = loss.coefficients(W, x, targets[batch])
        norms = np.linalg.norm(x, axis=1) * np.linalg.norm(G, axis=1)
        G = G * np.minimum(1.0, C / np.maximum(norms, 1e-300))[:, None]
        noisy_sum = x.T @ G + std * rng.standard_normal(W.shape)
        W = W - learning_rate * (noisy_sum / batch_size + reg * W)
    eps = rdp_replace_one_epsilon(z, n, batch_size, steps, delta)
    privacy = {"mechanism": "DP-SGD on the head", "epsilon": eps, "delta": delta, "neighbouring": NEIGHBOURING,
               "data_independent": True,
               "analyses": {"rdp": "RDP accountant (dp-accounting RdpAccountant, REPLACE_ONE, sampling without "
                                   "replacement of the batch), T-fold: upper bound"},
               "noise_multiplier": z, "noise_std": std, "clip_norm": C, "batch_size": batch_size, "steps": steps,
               "learning_rate": learning_rate, "n": n}
    return Release(W, privacy)
