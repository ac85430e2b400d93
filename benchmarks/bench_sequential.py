"""The confidence sequences compared by simulation (no model): samples used, and wrong answers at the boundary.

    python -m benchmarks.bench_sequential                   # about a minute of CPU
    python -m benchmarks.bench_sequential --quick           # seconds: a smoke run
    python -m benchmarks.bench_sequential --exact           # seconds: exact table (docs/CERTIFY.md)

--exact computes instead, with no simulation error (certify.sequential_exact, dynamic programming over
the vote counts), each method's mean estimation samples to a decision and its false-certificate
probability at pA = Phi(2), at alpha 0.001 and the given n_max.

For each construction of certify.sequential (and a deliberately invalid fixed-level Clopper-Pearson
bound read at every look, as a control), Bernoulli(pA) vote streams run through the same rules and
driver as ``Smooth.decide`` / ``Smooth.certify_adaptive``:
- decide at R = 0.5 (sigma 0.25, threshold Phi(2) = 0.97725), n_max 100,000, alpha 0.001: mean
  estimation samples and share certified, for pA from 0.9 to 1;
- the share of wrong "certified" answers at pA = Phi(2) exactly, at alpha 0.01 and 0.001, with the
  one-sided binomial p-value of that count against alpha (small = more wrong answers than alpha allows).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from scipy.stats import binomtest, norm

from certify.confidence import UnionClopperPearson, confidence_sequence
from certify.sequential import CERTIFIED, DecideRule
from certify.streams import run_streams

SIGMA, RADIUS = 0.25, 0.5
P_VALUES = (0.9, 0.97, 0.98, 0.99, 0.995, 0.999, 0.9999, 1.0)


class FixedLevelClopperPearson(UnionClopperPearson):
    """Invalid under optional stopping: the whole alpha at every look (the control)."""

    name = "fixed-level-cp (invalid)"

    def __init__(self, looks, alpha):
        super().__init__(looks, alpha)
        self.alphas = np.full(len(self.looks), self.alpha)


def build(method: str, n_max: int, alpha: float):
    if method == "fixed-level-cp":
        return FixedLevelClopperPearson(confidence_sequence("union-cp", n_max, alpha).looks, alpha)
    return confidence_sequence(method, n_max, alpha)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sequential", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams-cost", type=int, default=2000, help="streams per pA for the sample cost")
    parser.add_argument("--streams-boundary", type=int, default=100_000, help="streams at the boundary")
    parser.add_argument("--n-max", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--exact", action="store_true", help="exact table by dynamic programming (no streams)")
    parser.add_argument("--json", type=Path, default=Path("runs/bench/sequential.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.streams_cost, args.streams_boundary, args.n_max = 50, 2000, 5000
    if args.exact:
        return exact_table(args)
    rng = np.random.default_rng(args.seed)
    threshold = float(norm.cdf(RADIUS / SIGMA))
    result = {"command": "python -m benchmarks.bench_sequential " + " ".join(argv or []), "radius": RADIUS,
              "sigma": SIGMA, "threshold": threshold, "n_max": args.n_max, "cost": {}, "boundary": {}}
    for method in ("union-cp", "beta-mixture", "fixed-level-cp"):
        rule = DecideRule(build(method, args.n_max, 0.001), RADIUS, SIGMA)
        costs = {}
        for p in P_VALUES:
            out = run_streams(rule, lambda active, m, p=p: rng.binomial(m, p, size=active.size), args.streams_cost)
            costs[str(p)] = {"mean_samples": float(out.samples.mean()),
                             "certified": float((out.outcome == CERTIFIED).mean())}
        result["cost"][method] = costs
        for alpha in (0.01, 0.001):
            rule = DecideRule(build(method, args.n_max, alpha), RADIUS, SIGMA)
            start = time.perf_counter()
            out = run_streams(rule, lambda active, m: rng.binomial(m, threshold, size=active.size),
                              args.streams_boundary)
            wrong = int((out.outcome == CERTIFIED).sum())
            result["boundary"][f"{method} alpha {alpha:g}"] = {
                "streams": args.streams_boundary, "wrong_certified": wrong, "rate": wrong / args.streams_boundary,
                "p_value_excess": float(binomtest(wrong, args.streams_boundary, alpha, alternative="greater").pvalue),
                "seconds": round(time.perf_counter() - start, 2)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print("decide at R 0.5, sigma 0.25, alpha 0.001: mean estimation samples (share certified)")
    print("pA:" + "".join(f"{p:>16}" for p in P_VALUES))
    for method, costs in result["cost"].items():
        print(method + ":" + "".join(f"{c['mean_samples']:>9.0f} ({c['certified']:.2f})" for c in costs.values()))
    for name, row in result["boundary"].items():
        print(f"boundary {name}: {row['wrong_certified']} wrong of {row['streams']} (rate {row['rate']:.5f}), "
              f"p-value {row['p_value_excess']:.3g}")
    return 0


EXACT_P = (0.98, 0.99, 0.995, 0.999, 1.0)
N0 = 100  # the default selection samples


def exact_table(args) -> int:
    from certify.confidence import DEFAULT_METHOD, METHODS
    from certify.sequential_exact import boundaries, operating

    threshold = float(norm.cdf(RADIUS / SIGMA))
    result = {"command": "python -m benchmarks.bench_sequential --exact", "radius": RADIUS, "sigma": SIGMA,
              "alpha": 0.001, "n_max": args.n_max, "exact": {}}
    print(f"decide at R {RADIUS}, sigma {SIGMA}, alpha 0.001, n_max {args.n_max}: exact mean estimation samples")
    print("method".ljust(20) + "".join(f"{p:>10}" for p in EXACT_P) + "   false certificates at Phi(2)")
    for method in METHODS:
        start = time.perf_counter()
        bounds = boundaries(DecideRule(confidence_sequence(method, args.n_max, 0.001), RADIUS, SIGMA))
        row = {str(p): operating(bounds, p).mean_samples for p in EXACT_P}
        row["false_certified_at_threshold"] = operating(bounds, threshold).certified
        row["seconds"] = round(time.perf_counter() - start, 2)
        result["exact"][method] = row
        print(method.ljust(20) + "".join(f"{row[str(p)]:>10,.0f}" for p in EXACT_P)
              + f"   {row['false_certified_at_threshold']:.2e}")
    # The selection's cost: n0 = 100 samples before the default's test, against folding the selection into the
    # test (every class tested from the first sample, each at alpha / 10 for 10 classes: Bonferroni).
    folded = boundaries(DecideRule(confidence_sequence(DEFAULT_METHOD, args.n_max, 0.0001), RADIUS, SIGMA))
    kept = {str(p): N0 + result["exact"][DEFAULT_METHOD][str(p)] for p in EXACT_P}
    fold = {str(p): operating(folded, p).mean_samples for p in EXACT_P}
    result["selection"] = {"n0": N0, "kept_n0_plus_test": kept, "folded_alpha_over_10": fold}
    print(f"selection: n0 {N0} + test".ljust(20) + "".join(f"{kept[str(p)]:>10,.0f}" for p in EXACT_P))
    print("folded, alpha / 10".ljust(20) + "".join(f"{fold[str(p)]:>10,.0f}" for p in EXACT_P))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
