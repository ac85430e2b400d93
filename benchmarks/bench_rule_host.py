"""The stopping rules' host time per image in the server's path: blocks read across images, a block's looks at once,
one look at a time.

    python -m benchmarks.bench_rule_host --quick          # seconds: a smoke run
    python -m benchmarks.bench_rule_host --json runs/bench/rule_host.json

The API's scheduler feeds each adaptive image's test (:class:`certify.streams.SequentialTest`) the counts of one
block at a time; a GPU computes a block in far less time than a rule evaluated look by look takes on the host.
No model: each image's votes are Bernoulli draws at a fixed pA (half the images at
``--p-high``, half at ``--p-low``), the same for every side. Sides, interleaved ``--repeats`` times, medians:

- ``across``: ``SequentialTest.observe_blocks``, every running image's next block read together (one evaluation of
  the rule per block for all the images at it): the server's path when a pass holds a block of every image of a
  request (``serving.compute.engine.SequentialWork`` reads together the blocks counted in one pass);
- ``block``: ``observe_block``, one image at a time, the rule evaluated at all of a block's looks at once
  (``Rule.step_looks``);
- ``look``: ``observe`` one look at a time (``Rule.step``).

All must give every image the same outcome, sample count and bound (checked). Decide at ``--radius`` (budget
``--n-max``) and estimate (budget ``--estimate-n-max``), with ``--plan-device``'s block plan.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import write_result

SIDES = ("across", "block", "look")


def _block_votes(test, cumulative: np.ndarray) -> np.ndarray:
    _, segments = test.next_block()
    ends = test.samples + np.cumsum(segments)
    return np.diff(cumulative[np.concatenate([[test.samples], ends])])


def run_side(rule, plan, votes: np.ndarray, side: str) -> tuple[float, list[tuple]]:
    """Seconds to feed every image's votes through its test, and each image's (outcome, samples, p_lower)."""
    from certify.streams import SequentialTest

    tests = SequentialTest.many(rule, plan, len(votes))
    cumulatives = [np.concatenate([[0], np.cumsum(stream)]) for stream in votes]
    started = time.perf_counter()
    if side == "across":
        running = list(range(len(tests)))
        while running:
            SequentialTest.observe_blocks([tests[i] for i in running],
                                          [_block_votes(tests[i], cumulatives[i]) for i in running])
            running = [i for i in running if not tests[i].done]
    for test, cumulative in zip(tests, cumulatives, strict=True):
        while not test.done:
            if side == "block":
                test.observe_block(_block_votes(test, cumulative))
            else:
                needed = test.samples_needed
                test.observe(int(cumulative[test.samples + needed] - cumulative[test.samples]), needed)
    seconds = time.perf_counter() - started
    return seconds, [(t.outcome, t.samples, t.p_lower) for t in tests]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_rule_host", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=40)
    parser.add_argument("--p-high", type=float, default=0.995, help="pA of half the images")
    parser.add_argument("--p-low", type=float, default=0.98, help="pA of the other half")
    parser.add_argument("--sigma", type=float, default=0.25)
    parser.add_argument("--radius", type=float, default=0.5, help="decide mode's radius")
    parser.add_argument("--n-max", type=int, default=100_000, help="decide mode's budget")
    parser.add_argument("--estimate-n-max", type=int, default=10_000)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--plan-device", default="cuda", help="whose block plan cuts the samples (cpu, cuda)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 images, small budgets, one repeat (a smoke run)")
    parser.add_argument("--json", type=Path, default=Path("runs/bench/rule_host.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.n_max, args.estimate_n_max, args.repeats = 4, 2000, 2000, 1
    if args.images < 1 or args.repeats < 1 or not (0 <= args.p_low <= 1 and 0 <= args.p_high <= 1):
        parser.error("--images and --repeats must be >= 1, --p-low and --p-high in [0, 1]")
    import torch

    from certify.adaptive import sequential_rule
    from certify.streams import BlockPlan
    from transdenoiser.runtime import hardware_description

    plan = BlockPlan.for_device(args.plan_device)
    rng = np.random.default_rng(args.seed)
    p = np.where(np.arange(args.images) % 2 == 0, args.p_high, args.p_low)
    # a new rule for every run: each starts with its bounds' cache empty (certify.one_sided.BoundCache)
    modes = {"decide": lambda: sequential_rule("decide", args.sigma, args.n_max, args.alpha, radius=args.radius),
             "estimate": lambda: sequential_rule("estimate", args.sigma, args.estimate_n_max, args.alpha)}
    record = {"command": "python -m benchmarks.bench_rule_host " + " ".join(sys.argv[1:] if argv is None else argv),
              "hardware": hardware_description(torch.device("cpu")), "plan": plan.describe(),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "modes": {}}
    print(f"{args.images} images, {plan.describe()}; host ms per image, median of {args.repeats}")
    for name, make_rule in modes.items():
        votes = (rng.random((args.images, make_rule().cs.n_max)) < p[:, None]).astype(np.int64)
        seconds: dict[str, list[float]] = {side: [] for side in SIDES}
        answers = {}
        for _ in range(args.repeats):
            for side in SIDES:
                elapsed, answers[side] = run_side(make_rule(), plan, votes, side)
                seconds[side].append(elapsed)
        same = answers["across"] == answers["block"] == answers["look"]
        across, block, look = (statistics.median(seconds[s]) / args.images * 1e3 for s in SIDES)
        record["modes"][name] = {"ms_per_image_across": across, "ms_per_image_block": block,
                                 "ms_per_image_look": look, "speedup_across_over_block": block / across,
                                 "speedup": look / block, "seconds": seconds, "answers_identical": same,
                                 "mean_samples": float(np.mean([a[1] for a in answers["block"]]))}
        print(f"{name:9s} across images {across:8.2f}  block {block:8.2f} ({block / across:.1f}x)  "
              f"look by look {look:8.2f} ({look / block:.1f}x), "
              f"{record['modes'][name]['mean_samples']:.0f} samples per image; answers identical: {same}")
    write_result(args.json, record)
    return 0 if all(m["answers_identical"] for m in record["modes"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
