"""Is an audit's lower bound consistent with the claimed noise? Its distribution under the claimed mechanism.

A lower bound below the claimed epsilon does not mean the run added the claimed noise: with m canaries the
bound of a correct run sits far below the claim (and below the audit's attainable maximum,
:mod:`training.privacy.power`). But the white-box ``known_others`` score of a canary is, under the claimed
mechanism, exactly simulable without training: in units of C,

    score_j = (number of the T steps canary j was Poisson-sampled into, rate q, if included; else 0)
              + N(0, T xi^2)        (the projection of T independent noise draws N(0, (xi C)^2 I) on u_j)

(each canary owns a coordinate of the parameter vector, so the projections are independent across canaries).
:func:`simulate_scores` draws that; :func:`null_bounds` runs the audit's own guesses and analyses
(:func:`training.privacy.bounds.one_run_lower_bounds`, same counts, same level) on ``simulations`` such runs,
seeded, and caches the result on disk (:func:`cached_null_bounds`).

:func:`consistency_test` compares an observed bound with that null distribution by a Monte Carlo test: with
n simulated bounds and N_ge of them >= the observed one, p = (1 + N_ge) / (1 + n) is a valid p-value
(the observed run and the simulations are exchangeable under the null; ties count against rejection), so
rejecting at p <= alpha has a false-alarm rate of at most alpha for a run that added the claimed noise. The
statistic is one of the two bounds (``statistic``, default the f-DP epsilon, the more powerful of the two).

:func:`noise_scale_test` checks the noise itself: an EXCLUDED canary's score is the projection of the noise alone,
N(0, T xi^2) under the claim, so sum_j score_j^2 / (T xi^2) over the n excluded canaries is chi-square with n
degrees of freedom; too small a sum (lower tail, p <= alpha) means less noise than claimed. Extra noise
calls only enlarge the sum, so the test stays valid (conservative) for them.

:func:`check_claimed_noise` runs both at alpha / 2 each (Bonferroni): a run that added the claimed noise is
flagged with probability at most alpha. The bound test detects any leak beyond the claimed mechanism (a canary
counted more than once, a larger sampling rate, less noise); the noise-scale test is far more powerful against
less noise than claimed (it uses every excluded score, not a count of correct guesses).

Scope: exact for the white-box ``known_others`` score with the claimed multiplier on every step that carries
canaries. A step that drops its canaries (transdenoiser arm, no full-noise call) or adds extra noise only
lowers the observed bound, so the test can then only be conservative. It does not apply to the ``update``
score (real gradients blur the scores) or to black-box canaries.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np

from training.privacy.bounds import (
    DEFAULT_BETA,
    abstaining_guesses,
    fdp_mu_lower_bound,
    gdp_epsilon_lower,
    steinke_epsilon_lower_bound,
)

DEFAULT_ALPHA = 0.001  # false-alarm rate of the consistency test
DEFAULT_SIMULATIONS = 1999  # simulated runs; p can reach 1/2000 < DEFAULT_ALPHA
STATISTICS = ("epsilon_fdp", "epsilon_steinke")
CACHE_ENV = "TRANSDENOISER_CACHE"
CACHE_FORMAT = 1


def simulate_scores(rng: np.random.Generator, m: int, steps: int, sample_rate: float,
                    noise_multiplier: float) -> tuple[np.ndarray, np.ndarray]:
    """One simulated run's ``known_others`` scores (units of C) and inclusion (see the module docstring)."""
    included = rng.random(m) < 0.5
    insertions = rng.binomial(steps, sample_rate, m) * included
    scores = insertions + rng.standard_normal(m) * noise_multiplier * math.sqrt(steps)
    return scores, included


class BoundTable:
    """The two analyses' bounds for (m, r, v) at one level and delta, memoised (they depend on nothing else)."""

    def __init__(self, m: int, delta: float, level: float):
        self.m, self.delta, self.level = m, delta, level
        self._steinke: dict[tuple[int, int], float] = {}
        self._mu: dict[tuple[int, int], float] = {}

    def steinke(self, r: int, v: int) -> float:
        if (r, v) not in self._steinke:
            self._steinke[r, v] = steinke_epsilon_lower_bound(self.m, r, v, self.delta, self.level)
        return self._steinke[r, v]

    def mu(self, r: int, v: int) -> float:
        if (r, v) not in self._mu:
            self._mu[r, v] = fdp_mu_lower_bound(self.m, r, v, self.level)
        return self._mu[r, v]


def bounds_of_scores(scores: np.ndarray, included: np.ndarray, table: BoundTable,
                     counts: list[tuple[int, int]]) -> tuple[float, float]:
    """(Steinke epsilon, f-DP epsilon): the best over ``counts``, exactly as ``one_run_lower_bounds`` computes."""
    truth = np.where(included, 1, -1)
    steinke, mu = 0.0, 0.0
    for k_plus, k_minus in counts:
        guesses = abstaining_guesses(scores, k_plus, k_minus)
        r, v = int((guesses != 0).sum()), int((guesses == truth).sum())
        steinke, mu = max(steinke, table.steinke(r, v)), max(mu, table.mu(r, v))
    return steinke, gdp_epsilon_lower(mu, table.delta)


def null_bounds(m: int, steps: int, sample_rate: float, noise_multiplier: float, delta: float,
                counts: list[tuple[int, int]], beta: float = DEFAULT_BETA, simulations: int = DEFAULT_SIMULATIONS,
                seed: int = 0) -> dict:
    """Both bounds over ``simulations`` simulated runs of the claimed mechanism (seeded: reproducible)."""
    _check(m, steps, sample_rate, noise_multiplier, simulations)
    table = BoundTable(m, delta, beta / len(counts))
    rng = np.random.default_rng([seed, 41])
    steinke, fdp = np.empty(simulations), np.empty(simulations)
    for i in range(simulations):
        scores, included = simulate_scores(rng, m, steps, sample_rate, noise_multiplier)
        steinke[i], fdp[i] = bounds_of_scores(scores, included, table, counts)
    return {"format": CACHE_FORMAT, "parameters": _parameters(m, steps, sample_rate, noise_multiplier, delta, counts,
                                                              beta, simulations, seed),
            "epsilon_steinke": steinke.tolist(), "epsilon_fdp": fdp.tolist()}


def _check(m, steps, sample_rate, noise_multiplier, simulations) -> None:
    if m < 2 or steps < 1 or simulations < 1:
        raise ValueError(f"need m >= 2, steps >= 1 and simulations >= 1, got {m}, {steps}, {simulations}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must lie in (0, 1], got {sample_rate}")
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise multiplier must be finite and >= 0, got {noise_multiplier}")


def _parameters(m, steps, sample_rate, noise_multiplier, delta, counts, beta, simulations, seed) -> dict:
    return {"canaries": int(m), "steps": int(steps), "sample_rate": float(sample_rate),
            "noise_multiplier": float(noise_multiplier), "delta": float(delta),
            "counts": [list(map(int, c)) for c in counts], "beta": float(beta), "simulations": int(simulations),
            "seed": int(seed), "score": "known_others"}


def default_cache_dir() -> Path:
    """$TRANSDENOISER_CACHE, else $XDG_CACHE_HOME/transdenoiser, else ~/.cache/transdenoiser; + /audit-null."""
    base = os.environ.get(CACHE_ENV)
    if base is None:
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "transdenoiser"
    return Path(base) / "audit-null"


def cached_null_bounds(m: int, steps: int, sample_rate: float, noise_multiplier: float, delta: float,
                       counts: list[tuple[int, int]], beta: float = DEFAULT_BETA,
                       simulations: int = DEFAULT_SIMULATIONS, seed: int = 0,
                       cache_dir: str | Path | None = None) -> dict:
    """:func:`null_bounds`, read from / written to a JSON file named by the hash of its parameters. A file
    whose parameters differ (or that cannot be read) is recomputed and rewritten, never trusted."""
    params = _parameters(m, steps, sample_rate, noise_multiplier, delta, counts, beta, simulations, seed)
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:24]
    path = Path(cache_dir if cache_dir is not None else default_cache_dir()) / f"{key}.json"
    try:
        stored = json.loads(path.read_text())
        if stored.get("format") == CACHE_FORMAT and stored.get("parameters") == params \
                and len(stored["epsilon_fdp"]) == len(stored["epsilon_steinke"]) == simulations:
            return {**stored, "cache": str(path), "cached": True}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    result = null_bounds(m, steps, sample_rate, noise_multiplier, delta, counts, beta, simulations, seed)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, path)
    except OSError:
        path = None  # an unwritable cache costs time, never correctness
    return {**result, "cache": str(path) if path else None, "cached": False}


def consistency_test(observed: float, null: list[float] | np.ndarray, alpha: float = DEFAULT_ALPHA) -> dict:
    """Monte Carlo test of one observed bound against its simulated null distribution (module docstring).

    ``consistent`` is False when p = (1 + #{null >= observed}) / (1 + n) <= alpha. Also returns the null's
    (1 - alpha)-quantile (order statistic rounded up) and median for display."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    null = np.sort(np.asarray(null, dtype=np.float64))
    n = len(null)
    if n == 0:
        raise ValueError("empty null distribution")
    at_least = int(n - np.searchsorted(null, observed, side="left"))
    p_value = (1 + at_least) / (1 + n)
    index = min(n - 1, math.ceil((1 - alpha) * (n + 1)) - 1)
    return {"observed": float(observed), "p_value": p_value, "alpha": alpha, "consistent": p_value > alpha,
            "null_median": float(np.median(null)), "null_quantile": float(null[index]),
            "quantile_level": 1 - alpha, "simulations": n,
            "resolvable": 1 / (1 + n) <= alpha}


def noise_scale_test(excluded_scores: np.ndarray, steps: int, noise_multiplier: float,
                     alpha: float = DEFAULT_ALPHA) -> dict:
    """Lower-tail chi-square test of the excluded canaries' scores (units of C) against N(0, T xi^2)."""
    from scipy import stats

    x = np.asarray(excluded_scores, dtype=np.float64)
    if len(x) == 0 or steps < 1 or not noise_multiplier > 0:
        raise ValueError("need excluded canaries, steps >= 1 and a positive noise multiplier")
    statistic = float(np.sum(x * x) / (steps * noise_multiplier ** 2))
    p_value = float(stats.chi2.cdf(statistic, len(x)))
    return {"excluded_canaries": len(x), "claimed_noise_multiplier": float(noise_multiplier),
            "measured_noise_multiplier": float(math.sqrt(np.mean(x * x) / steps)),
            "p_value": p_value, "alpha": alpha, "consistent": p_value > alpha}


def check_claimed_noise(scores: np.ndarray, included: np.ndarray, observed: dict, *, steps: int,
                        sample_rate: float, noise_multiplier: float, delta: float, counts: list[tuple[int, int]],
                        beta: float = DEFAULT_BETA, alpha: float = DEFAULT_ALPHA,
                        simulations: int = DEFAULT_SIMULATIONS, seed: int = 0, statistic: str = "epsilon_fdp",
                        cache_dir: str | Path | None = None) -> dict:
    """Both tests at alpha / 2 (module docstring). ``scores``: known_others scores in units of C;
    ``observed``: the run's bounds (``epsilon_steinke``, ``epsilon_fdp``)."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    included = np.asarray(included, dtype=bool)
    null = cached_null_bounds(len(scores), steps, sample_rate, noise_multiplier, delta, counts, beta, simulations,
                              seed, cache_dir)
    bound = {"statistic": statistic, **consistency_test(observed[statistic], null[statistic], alpha / 2)}
    noise = noise_scale_test(np.asarray(scores)[~included], steps, noise_multiplier, alpha / 2)
    return {"consistent": bound["consistent"] and noise["consistent"], "alpha": alpha,
            "steps": int(steps), "sample_rate": float(sample_rate), "noise_multiplier": float(noise_multiplier),
            "bound_test": bound, "noise_test": noise, "null_seed": seed, "null_cache": null.get("cache"),
            "null_cached": null.get("cached", False)}


__all__ = ["BoundTable", "CACHE_ENV", "DEFAULT_ALPHA", "DEFAULT_SIMULATIONS", "STATISTICS", "bounds_of_scores",
           "cached_null_bounds", "check_claimed_noise", "consistency_test", "default_cache_dir", "noise_scale_test",
           "null_bounds", "simulate_scores"]
