"""How many launches the adaptive driver needs, by ``fill``: the host round trips that bound decide's speed on a GPU.

    python -m benchmarks.bench_launches --quick                      # seconds: a smoke run
    python -m benchmarks.bench_launches --images 250 --radius 0.25 --plan-device cuda --fills 0 8192

Adaptive certification (:func:`certify.adaptive.adaptive_many`) draws each running image's samples block by block
and reads each launch's votes before deciding who goes on. On a GPU a launch is a round trip (queue the noise and
the passes, wait for the votes, run the rule on the host): once most images have stopped, the few left run one
small launch per block. ``fill`` makes a launch take consecutive blocks of each running image until it evaluates
at least ``fill`` samples (on CUDA: the forward batch). This benchmark runs the real pipeline on any device with a
device's block plan (``--plan-device``, the plan decides the noise) and counts, for each fill: launches, launches
holding at most 2 images, launches asked for while no other was in flight (a device then idles for the host's
round trip: every launch but the first without lookahead), samples used and evaluated (the rest of each stopped
image's last launches), the host's time in the stopping rule, and checks that every answer is the same.
``--lookahead-ab`` adds, for each fill, a run with every launch drawn ahead (by default a launch is drawn ahead
only when at least three quarters of its images are expected to use it). Launch and sample counts depend on the
device only through the votes (its rounding may flip a noisy sample's argmax); the wall time here is this device's,
not a GPU's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from benchmarks import prepare_process, write_result
from benchmarks.bench_adaptive import add_pipeline_arguments, launches_ahead, spread_over_split
from certify.cli import DEFAULT_BATCH
from transdenoiser.runtime import hardware_description


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_launches", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pipeline_arguments(parser, images=250)
    parser.add_argument("--mode", choices=("decide", "estimate"), default="decide")
    parser.add_argument("--radius", type=float, default=0.25, help="decide mode's radius")
    parser.add_argument("--n-max", type=int, default=100_000)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--plan-device", default="cuda", help="whose block plan cuts the samples (cpu, cuda)")
    parser.add_argument("--fills", type=int, nargs="+", default=[0, 8192],
                        help="samples a launch evaluates at least (0: one block a launch)")
    parser.add_argument("--lookahead", choices=("on", "off"), default="on", help="on: as on CUDA")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH["cpu"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="8 images, a small budget (a smoke run)")
    parser.add_argument("--lookahead-ab", action="store_true",
                        help="also run each fill with every launch drawn ahead (sides '<fill>_ahead_every')")
    parser.add_argument("--json", type=Path, default=Path("runs/bench/launches.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.n_max, args.fills = 8, 2000, [0, 4096]
    if any(fill < 0 for fill in args.fills) or args.images < 1:
        parser.error("--fills must be >= 0 and --images >= 1")
    allocator, device = prepare_process(args.threads, args.device)
    from certify.adaptive import adaptive_many, sequential_rule
    from certify.core import Smooth
    from certify.pipeline import load_pipeline
    from certify.streams import BlockPlan
    from training.datasets import load_dataset

    pipeline = load_pipeline(args.classifier, None if str(args.denoiser) == "none" else args.denoiser, device)
    images, _ = load_dataset("mnist10k").test.tensors("cpu")
    _, indices = spread_over_split(len(images), args.images)
    batch = images[indices]
    smooth = Smooth(pipeline.classifier, pipeline.num_classes, args.sigma, pipeline.denoiser, args.batch, device)
    rule = sequential_rule(args.mode, args.sigma, args.n_max, args.alpha, radius=args.radius)
    plan = BlockPlan.for_device(args.plan_device)
    launches: list[list[int]] = []  # per launch of the current side: images in it
    evaluated: list[int] = []  # per launch: samples it evaluates
    queue = smooth.queue_counts_blocks

    in_flight = [0]  # launches asked for whose votes are not read yet
    waits: list[int] = []  # per side: launches asked for with none in flight (a device idles for the round trip)

    def counted(images_, blocks, generators):
        if launches[-1] and not in_flight[0]:
            waits[-1] += 1
        launches[-1].append(images_.shape[0])
        evaluated[-1] += images_.shape[0] * sum(int(sum(segments)) for _, segments in blocks)
        in_flight[0] += 1
        counts = queue(images_, blocks, generators)

        def read():
            in_flight[0] -= 1
            return counts()
        return read
    smooth.queue_counts_blocks = counted
    rule_seconds = [0.0]  # the host's time evaluating the stopping rule (a GPU waits for it unless work is queued)
    evaluate = rule.step_looks

    def timed(*args_, **kwargs):
        started_ = time.perf_counter()
        try:
            return evaluate(*args_, **kwargs)
        finally:
            rule_seconds[0] += time.perf_counter() - started_
    object.__setattr__(rule, "step_looks", timed)  # the rule is a frozen dataclass

    sides, answers = {}, {}
    for fill, variant in [(fill, variant) for fill in args.fills
                          for variant in (["", "_ahead_every"] if args.lookahead_ab else [""])]:
        launches.append([])
        evaluated.append(0)
        waits.append(0)
        rule_seconds[0] = 0.0
        started = time.perf_counter()
        with launches_ahead(every=bool(variant)):
            certs = adaptive_many(smooth, batch, args.n0, rule,
                                  [smooth.image_generator(args.seed, i) for i in indices],
                                  lookahead=args.lookahead == "on", fill=fill, plan=plan)
        seconds = time.perf_counter() - started
        answers[f"{fill}{variant}"] = [(c.prediction, c.radius, c.p_lower, c.count, c.n, c.outcome) for c in certs]
        used = sum(c.n for c in certs)
        sides[f"{fill}{variant}"] = {
            "fill": fill, "every_launch_ahead": bool(variant), "launches": len(launches[-1]),
            "launches_of_at_most_2_images": sum(k <= 2 for k in launches[-1]), "launches_after_a_wait": waits[-1],
            "estimation_samples_used": used, "estimation_samples_evaluated": evaluated[-1],
            "evaluated_per_launch_mean": evaluated[-1] / max(1, len(launches[-1])),
            "seconds_on_this_device": round(seconds, 2), "rule_seconds_on_this_host": round(rule_seconds[0], 3)}
    smooth.close()
    same = all(answer == answers[str(args.fills[0])] for answer in answers.values())
    record = {"command": "python -m benchmarks.bench_launches " + " ".join(sys.argv[1:] if argv is None else argv),
              "hardware": hardware_description(device), "allocator": allocator, "plan": plan.describe(),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "images": len(indices), "answers_identical": same, "sides": sides}
    write_result(args.json, record)
    print(f"{len(indices)} images, {args.mode}" + (f" R = {args.radius:g}" if args.mode == "decide" else "")
          + f", {plan.describe()}, lookahead {args.lookahead}; answers identical across fills: {same}")
    if args.lookahead_ab:
        print("*: every launch drawn ahead (the others: only launches most of whose images are expected to use them)")
    print(f"{'fill':>7} {'launches':>8} {'<= 2 images':>12} {'after a wait':>12} {'samples used':>13} "
          f"{'evaluated':>10} {'s here':>7} {'rule s':>7}")
    for side in sides.values():
        mark = "*" if side["every_launch_ahead"] else " "
        print(f"{side['fill']:>6}{mark} {side['launches']:>8} {side['launches_of_at_most_2_images']:>12} "
              f"{side['launches_after_a_wait']:>12} "
              f"{side['estimation_samples_used']:>13,} {side['estimation_samples_evaluated']:>10,} "
              f"{side['seconds_on_this_device']:>7} {side['rule_seconds_on_this_host']:>7}")
    return 0 if same else 1


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    raise SystemExit(main())
