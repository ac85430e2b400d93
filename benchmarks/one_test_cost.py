"""What one test per image costs: the radius a fixed-n answer gets from the ladder (certify.ladder) against Cohen's
Clopper-Pearson at the same votes, and decide's mean samples with the ladder against its threshold test alone.

Exact numbers (no sampling): the votes are round(pA * n) of n; decide's mean samples come from
certify.sequential_exact (dynamic programming over vote counts). Prints a Markdown table (docs/CERTIFY.md, "What
one test per image costs"), or writes JSON with --json.

    python -m benchmarks.one_test_cost            # sigma 0.25, alpha 0.001: n = 1,000 / 10,000 / 100,000
    python -m benchmarks.one_test_cost --quick    # n = 1,000 only (seconds)
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from certify.confidence import confidence_sequence
from certify.decisions import radius_from_p_lower
from certify.ladder import ladder
from certify.sequential import DecideRule
from certify.sequential_exact import boundaries, operating
from transdenoiser.stats import clopper_pearson_lower

P_TRUE = (0.9, 0.99, 0.999)


def fixed_n_rows(sigma: float, alpha: float, budgets: list[int]) -> list[dict]:
    """Per (n, pA): Clopper-Pearson's radius and the ladder's, at round(pA * n) votes of n."""
    shared = ladder(alpha, sigma)
    rows = []
    for n in budgets:
        for p in P_TRUE:
            votes = int(round(p * n))
            cp = clopper_pearson_lower(votes, n, alpha)
            cp_radius = radius_from_p_lower(cp, sigma) if cp >= 0.5 else 0.0
            rung = float(shared.radius_of_threshold(shared.lower(np.array([votes]), n))[0])
            rows.append({"n": n, "p_true": p, "votes": votes, "clopper_pearson_radius": round(cp_radius, 4),
                         "ladder_radius": rung, "ratio": round(rung / cp_radius, 4) if cp_radius else None})
    return rows


def decide_rows(sigma: float, alpha: float, n_max: int, radii: list[float]) -> list[dict]:
    """Decide at each radius, pA at 1.02 x and 0.98 x of the threshold's distance to 1: mean samples and P[certified]
    with the ladder and with the threshold test alone (exact)."""
    cs = confidence_sequence("one-sided-mixture", n_max, alpha)
    shared = ladder(alpha, sigma)
    rows = []
    for radius in radii:
        alone, joint = DecideRule(cs, radius, sigma), DecideRule(cs, radius, sigma, shared)
        bounds_alone = boundaries(alone)
        bounds_joint = type(bounds_alone)(bounds_alone.looks, joint._certify_at, bounds_alone.reject_at)
        for p in (1 - (1 - alone.threshold) / 2, 1 - 2 * (1 - alone.threshold)):
            a, j = operating(bounds_alone, p), operating(bounds_joint, p)
            rows.append({"radius": radius, "p_true": p, "mean_samples_alone": round(a.mean_samples, 1),
                         "mean_samples_ladder": round(j.mean_samples, 1), "certified_alone": a.certified,
                         "certified_ladder": j.certified})
    return rows


def markdown(fixed: list[dict], decide: list[dict]) -> str:
    lines = ["| n | pA | votes | Clopper-Pearson radius | ladder radius | ladder / CP |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['n']:,} | {r['p_true']} | {r['votes']:,} | {r['clopper_pearson_radius']:.4f} | "
              f"{r['ladder_radius']:.3f} | {r['ratio'] if r['ratio'] is not None else '-'} |" for r in fixed]
    lines += ["", "| decide radius | pA | mean samples, test alone | mean samples, ladder | P[certified] alone | "
              "P[certified] ladder |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['radius']} | {r['p_true']:.6f} | {r['mean_samples_alone']:,} | {r['mean_samples_ladder']:,} | "
              f"{r['certified_alone']:.6f} | {r['certified_ladder']:.6f} |" for r in decide]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--quick", action="store_true", help="n = 1,000 only and one decide radius")
    parser.add_argument("--json", action="store_true", help="JSON instead of Markdown")
    args = parser.parse_args(argv)
    budgets = [1_000] if args.quick else [1_000, 10_000, 100_000]
    radii = [0.25] if args.quick else [0.25, 0.5]
    fixed = fixed_n_rows(args.sigma, args.alpha, budgets)
    decide = decide_rows(args.sigma, args.alpha, 10_000, radii)
    if args.json:
        json.dump({"sigma": args.sigma, "alpha": args.alpha, "fixed_n": fixed, "decide": decide}, sys.stdout, indent=1)
    else:
        print(markdown(fixed, decide))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
