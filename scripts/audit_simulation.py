"""What a one-run white-box audit can reach on an idealised DP-SGD run (no training, seconds).

Each of m canaries is included with probability 1/2; an included canary's score is the number of the T steps it
was Poisson-sampled into (rate q) plus the projection of the noise, N(0, T xi^2), with xi calibrated to the target
epsilon by the RDP accountant (as ``--target-epsilon`` does). That is the ``known_others`` score of
``transdenoiser privacy-audit`` without a model, drawn by the library's own model of it
(``training.privacy.consistency.simulate_scores``, which the audit's check against the claimed noise uses).
Prints the lower bounds of both analyses.

    python scripts/audit_simulation.py --epsilon 8 --sample-rate 0.5 --steps 20
"""
from __future__ import annotations

import argparse
import json
import logging

import numpy as np


def likelihood_ratio_scores(rng, canaries: int, steps: int, sample_rate: float, xi: float):
    """Per-step observations y_t = b_t [included] + N(0, xi^2), b_t ~ Bernoulli(q), scored as the audit's
    ``likelihood_ratio`` score does: sum_t log(1 - q + q exp((y_t - 1/2) / xi^2))."""
    included = rng.random(canaries) < 0.5
    y = (rng.random((canaries, steps)) < sample_rate) * included[:, None] + rng.standard_normal((canaries, steps)) * xi
    return np.logaddexp(np.log1p(-sample_rate), np.log(sample_rate) + (y - 0.5) / xi ** 2).sum(1), included


def simulate(epsilon: float, sample_rate: float, steps: int, canaries: int, delta: float, seeds: int,
             score: str = "known_others") -> dict:
    """Lower bounds of both analyses over ``seeds`` independent simulated runs: median, min and max."""
    from training.privacy.accounting import noise_multiplier_for_epsilon
    from training.privacy.bounds import one_run_lower_bounds
    from training.privacy.consistency import simulate_scores

    xi = noise_multiplier_for_epsilon(epsilon, sample_rate, steps, delta)
    steinke, fdp = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        scores, included = (simulate_scores(rng, canaries, steps, sample_rate, xi) if score == "known_others"
                            else likelihood_ratio_scores(rng, canaries, steps, sample_rate, xi))
        bounds = one_run_lower_bounds(scores, included, delta)
        steinke.append(bounds["epsilon_steinke"])
        fdp.append(bounds["epsilon_fdp"])
    return {"epsilon": epsilon, "sample_rate": sample_rate, "steps": steps, "noise_multiplier": xi,
            "canaries": canaries, "seeds": seeds, "score": score,
            "epsilon_steinke": {"median": float(np.median(steinke)), "min": min(steinke), "max": max(steinke)},
            "epsilon_fdp": {"median": float(np.median(fdp)), "min": min(fdp), "max": max(fdp)}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 8.0])
    parser.add_argument("--sample-rate", type=float, nargs="+", default=[0.5, 0.1])
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 50], help="one per sample rate")
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--seeds", type=int, default=10, help="simulated runs per setting (seeds 0..N-1)")
    parser.add_argument("--score", choices=("known_others", "likelihood_ratio"), default="known_others")
    parser.add_argument("--quick", action="store_true", help="one small setting (for the smoke test)")
    args = parser.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)
    if args.quick:
        args.epsilon, args.sample_rate, args.steps, args.canaries, args.seeds = [8.0], [0.5], [4], 100, 2
    if len(args.steps) != len(args.sample_rate):
        parser.error("give one --steps value per --sample-rate")
    for epsilon in args.epsilon:
        for q, steps in zip(args.sample_rate, args.steps, strict=True):
            print(json.dumps(simulate(epsilon, q, steps, args.canaries, args.delta, args.seeds, args.score)),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
