"""Adaptive requests vs fixed n in the API: requests/s at C clients and the certified fraction at radius R.

    python -m benchmarks.bench_serving_adaptive [--model-dir runs/demo/serve] [--no-denoiser] [--clients 16]
        [--radius 0.5] [--n 10000] [--seconds 60] [--fixed-waves 1] [--repeats 2] [--device cpu]
        [--server-setting KEY=VALUE ...] [--compare KEY=VALUE ...] [--estimate] [--quick]

One real server (``transdenoiser serve``, 127.0.0.1 only) starts from a copy of the model directory's checkpoints
with ``max_n = --n``. Phases alternate, ``--repeats`` times: *fixed* sends ``{"images": [x], "n": N}`` (Cohen's
CERTIFY, n0 + N samples) and counts an image certified at R when ``certified_radius >= R``; *decide* sends
``{"images": [x], "radius": R}`` (budget N, the server's max_n) and counts ``certified == true``; with
``--estimate``, a third phase in each repeat, *estimate*, sends ``{"images": [x], "adaptive": true}`` (budget N)
and counts an image certified when ``certified_radius >= R``. C client
threads send one-image requests, cycling through the first ``--images`` mnist10k test images; no new request
after ``--seconds``, and a fixed phase sends at most ``--fixed-waves`` x C requests (the scheduler serves
requests round robin, so C fixed requests finish together: one wave is a steady-state measurement); a phase's
throughput is completed requests over its wall time (including the requests still running at the cut-off), and
its noisy samples per second are that times the mean samples a request used (n0 + n used).
The noise is keyed per image, so every answer about an image is the same whichever phase asked: the certified
fractions are compared on the images both modes answered. From the server's ``/metrics`` before and after each
phase: its passes per request, noisy samples per pass, and the fraction of the phase the passes took to compute
(``server``; the rest of the time went to the host's work or to waiting for requests).

``--compare KEY=VALUE`` starts a second server with that setting on top (both with one noise key, so both give
the same noise to the same image) and takes the two servers' phases in turn, repeat by repeat: an A/B of a server
setting in one run. The record's ``second`` holds that server's figures, its decide requests per second over the
first's (per repeat and the median) and the answers that differ between the two (none, for a setting that changes
only when samples are computed, such as ``overlap`` or ``switch_interval_us``).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchmarks.serving_common import (
    SERVER_RATES,
    closed_loop,
    describe_server,
    percentiles,
    run_record,
    running_servers,
    save_result,
    server_figures,
    server_totals,
    setting,
)
from transdenoiser.argtypes import positive_float, positive_int

MODES = ("fixed", "decide")
WITH_ESTIMATE = (*MODES, "estimate")  # --estimate: estimate requests too, against the same fixed n
DEFAULT_MODEL_DIR = "runs/demo/serve"  # make demo writes it
# the settings each server gets from the benchmark (its flags), not from --server-setting or --compare
BENCHMARK_SETTINGS = frozenset({"sigma", "n0", "alpha", "n", "max_n", "max_latency_ms", "max_queued_requests",
                                "noise_key"})
COMPARE_NOISE_KEY = "bench-serving-adaptive-compare-noise-key-0000"  # both servers' (>= 32 characters)


def run_phase(url: str, images: list, body: dict, clients: int, max_seconds: float, max_requests: int) -> dict:
    """One-image requests ``{**body, "images": [image]}`` from ``clients`` threads, cycling through ``images``."""
    answers: dict[int, dict] = {}
    samples: list[int] = []

    def record(number: int, answer: dict) -> None:
        prediction = answer["predictions"][0]
        answers[number % len(images)] = prediction
        samples.append(prediction["samples"])

    load = closed_loop(url, lambda number: {**body, "images": [images[number % len(images)]]}, clients,
                       max_requests, max_seconds, timeout=900, on_answer=record)
    latencies, wall = load["latencies"], load["wall_s"]
    return {"requests": len(latencies), "failures": load["failures"], "wall_s": wall,
            "requests_per_s": len(latencies) / wall, "mean_samples": statistics.fmean(samples) if samples else None,
            **percentiles(latencies), "answers": answers}


def certified(mode: str, prediction: dict, radius: float) -> bool:
    if mode in ("fixed", "estimate"):  # a radius certified at least as large as R
        return prediction["label"] is not None and prediction["certified_radius"] >= radius
    return prediction["certified"] is True


def run_repeat(url: str, images: list, radius: float, n: int, clients: int, seconds: float, max_requests: int,
               fixed_requests: int | None = None, modes: tuple[str, ...] = MODES
               ) -> tuple[dict[str, dict], dict[str, dict[int, dict]]]:
    """One phase of each mode on one server: (mode -> the phase's figures, with the server's side from its
    ``/metrics`` around it; mode -> the answers by image)."""
    bodies = {"fixed": {"n": n}, "decide": {"radius": radius}, "estimate": {"adaptive": True}}
    phases, answers = {}, {}
    for mode in modes:
        limit = min(max_requests, fixed_requests or max_requests) if mode == "fixed" else max_requests
        before = server_totals(url)
        phase = run_phase(url, images, bodies[mode], clients, seconds, limit)
        phase["server"] = server_figures(before, server_totals(url), phase["requests"], phase["wall_s"])
        answers[mode] = phase.pop("answers")
        phases[mode] = phase
    return phases, answers


def measure(url: str, images: list, labels: list[int], radius: float, n: int, clients: int, seconds: float,
            repeats: int, max_requests: int = 100_000, fixed_requests: int | None = None,
            modes: tuple[str, ...] = MODES) -> dict:
    """Interleaved phases of the modes on one server; the median throughput ratio and the certified fractions."""
    phases: dict[str, list[dict]] = {mode: [] for mode in modes}
    answers: dict[str, dict[int, dict]] = {mode: {} for mode in modes}
    for _ in range(repeats):
        collect(phases, answers, *run_repeat(url, images, radius, n, clients, seconds, max_requests, fixed_requests,
                                             modes))
    return summarize(phases, answers, labels, radius)


def collect(phases: dict[str, list[dict]], answers: dict[str, dict[int, dict]], repeat_phases: dict[str, dict],
            repeat_answers: dict[str, dict[int, dict]]) -> None:
    for mode in repeat_phases:
        phases[mode].append(repeat_phases[mode])
        answers[mode].update(repeat_answers[mode])


def summarize(phases: dict[str, list[dict]], answers: dict[str, dict[int, dict]], labels: list[int],
              radius: float) -> dict:
    """The phases of one server: medians over repeats, the ratios decide / fixed, the certified fractions on the
    images both modes answered, and the server's side of each mode; with estimate phases, the same figures of
    estimate against fixed n under ``estimate``."""
    for mode in phases:
        if not answers[mode]:
            failures = [f for p in phases[mode] for f in p["failures"]]
            raise RuntimeError(f"no {mode} request was answered" + (f": {failures[0]}" if failures else ""))
    common = sorted(set(answers["fixed"]) & set(answers["decide"]))
    fractions = certified_fractions(answers, MODES, common, radius)
    accuracy = {mode: (sum(certified(mode, answers[mode][i], radius) and answers[mode][i]["label"] == labels[i]
                           for i in common) / len(common) if common else None) for mode in MODES}
    disagree = [i for i in common if certified("fixed", answers["fixed"][i], radius)
                != certified("decide", answers["decide"][i], radius)]
    rates = {mode: median_requests_per_s(phases[mode]) for mode in MODES}
    sample_rates = {mode: median_samples_per_s(phases[mode]) for mode in MODES}
    per_repeat = [d["requests_per_s"] / f["requests_per_s"] if f["requests_per_s"] > 0 else None
                  for f, d in zip(phases["fixed"], phases["decide"], strict=True)]
    record = {"phases": {mode: phases[mode] for mode in MODES}, "median_requests_per_s": rates,
              "speedup": rates["decide"] / rates["fixed"] if rates["fixed"] > 0 else None,
              "median_samples_per_s": sample_rates,
              "samples_per_second_vs_fixed": (sample_rates["decide"] / sample_rates["fixed"]
                                              if sample_rates["fixed"] > 0 else None),
              "speedup_per_repeat": per_repeat, "images_compared": len(common),
              "certified_fraction": fractions, "certified_accuracy": accuracy, "disagreements": disagree,
              "mean_samples": {mode: mean_samples(phases[mode]) for mode in MODES},
              "server": {mode: server_medians(phases[mode]) for mode in MODES}}
    if "estimate" in phases:
        record["estimate"] = summarize_estimate(phases, answers, radius, sample_rates["fixed"])
    return record


def summarize_estimate(phases: dict[str, list[dict]], answers: dict[str, dict[int, dict]], radius: float,
                       fixed_samples_per_s: float) -> dict:
    """Estimate's phases against fixed n's: its noisy samples per second over fixed n's (medians over repeats),
    and on the images both answered, the fractions certified at ``radius`` or more."""
    own = phases["estimate"]
    sample_rate = median_samples_per_s(own)
    common = sorted(set(answers["fixed"]) & set(answers["estimate"]))
    return {"phases": own, "median_requests_per_s": median_requests_per_s(own), "median_samples_per_s": sample_rate,
            "samples_per_second_vs_fixed": sample_rate / fixed_samples_per_s if fixed_samples_per_s > 0 else None,
            "mean_samples": mean_samples(own), "images_compared": len(common),
            "certified_fraction": certified_fractions(answers, ("fixed", "estimate"), common, radius),
            "server": server_medians(own)}


def median_requests_per_s(phases: list[dict]) -> float:
    return statistics.median(p["requests_per_s"] for p in phases)


def median_samples_per_s(phases: list[dict]) -> float:
    """Noisy samples per second, the median over the phases that know their samples per request."""
    return statistics.median(p["requests_per_s"] * p["mean_samples"] for p in phases if p["mean_samples"] is not None)


def mean_samples(phases: list[dict]) -> float:
    return statistics.fmean(p["mean_samples"] for p in phases if p["mean_samples"] is not None)


def certified_fractions(answers: dict[str, dict[int, dict]], modes: tuple[str, ...], common: list[int],
                        radius: float) -> dict[str, float | None]:
    """Each mode's fraction of the images ``common`` certified at ``radius`` or more (None: no image)."""
    return {mode: (sum(certified(mode, answers[mode][i], radius) for i in common) / len(common) if common else None)
            for mode in modes}


def server_medians(phases: list[dict]) -> dict[str, float]:
    """The server's side of one mode's phases, medians: passes per request, samples per pass, and how much of the
    time the passes took to compute (each where every phase has it)."""
    return {key: statistics.median(p["server"][key] for p in phases)
            for key in SERVER_RATES if all(p["server"][key] is not None for p in phases)}


def compare_sides(phases: dict[str, dict[str, list[dict]]], answers: dict[str, dict[str, dict[int, dict]]]) -> dict:
    """The second server against the first, phases taken in turn: its decide requests per second over the first's,
    per repeat and their median, and the answers of both about the same images (same noise key: a setting that
    changes only when samples are computed must change no answer)."""
    per_repeat = [second["requests_per_s"] / first["requests_per_s"] if first["requests_per_s"] > 0 else None
                  for first, second in zip(phases["first"]["decide"], phases["second"]["decide"], strict=True)]
    known = [ratio for ratio in per_repeat if ratio is not None]
    pairs = [(mode, image) for mode in answers["first"]
             for image in sorted(set(answers["first"][mode]) & set(answers["second"][mode]))]
    differing = [f"{mode} image {image}" for mode, image in pairs
                 if answers["first"][mode][image] != answers["second"][mode][image]]
    return {"decide_ratio_per_repeat": per_repeat, "decide_ratio": statistics.median(known) if known else None,
            "answers_compared": len(pairs), "answers_differing": differing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_serving_adaptive",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", default=DEFAULT_MODEL_DIR, help="model directory (its checkpoints are used)")
    parser.add_argument("--radius", type=positive_float, default=0.5, help="L2 radius to decide at")
    parser.add_argument("--n", type=positive_int, default=10_000, help="fixed n, and the adaptive budget (max_n)")
    parser.add_argument("--clients", type=positive_int, default=16, help="concurrent clients")
    parser.add_argument("--images", type=positive_int, default=64, help="test images cycled through")
    parser.add_argument("--seconds", type=positive_float, default=40, help="no new request after this, per phase")
    parser.add_argument("--fixed-waves", type=positive_int, default=1, help="fixed phases: at most this x clients "
                                                                               "requests")
    parser.add_argument("--no-denoiser", action="store_true", help="serve the classifier alone")
    parser.add_argument("--repeats", type=positive_int, default=2, help="interleaved phases per mode")
    parser.add_argument("--device", default="cpu", help="the server's device (cpu, cuda)")
    parser.add_argument("--server-setting", type=setting, action="append", default=[], metavar="KEY=VALUE",
                        help="a further serving setting of the server's model directory (repeatable), e.g. "
                             "overlap=false")
    parser.add_argument("--compare", type=setting, action="append", default=[], metavar="KEY=VALUE",
                        help="a second server, with this setting on top of the first's (repeatable): the two servers' "
                             "phases alternate, repeat by repeat, and the record gives the second's decide requests "
                             "per second over the first's, per repeat and their median, e.g. overlap=true")
    parser.add_argument("--estimate", action="store_true",
                        help='estimate requests too ({"adaptive": true}, budget --n), a phase of them in each repeat: '
                             "their noisy samples per second against fixed n's, and the fraction certified at R")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: n = 200, R = 0.25, 2 clients, 4 images, 3 s phases")
    parser.add_argument("--out", default="runs/bench_serving_adaptive.json", help="JSON results file")
    args = parser.parse_args(argv)
    if args.quick:
        # R = 0.25: a budget of 200 cannot certify 0.5, and the server refuses a radius beyond its budget's reach
        args.n, args.radius, args.clients, args.images, args.seconds, args.repeats = 200, 0.25, 2, 4, 3.0, 1

    server_settings, compared = dict(args.server_setting), dict(args.compare)
    for flag, given in (("--server-setting", server_settings), ("--compare", compared)):
        fixed_here = BENCHMARK_SETTINGS & set(given)
        if fixed_here:
            parser.error(f"{flag} {sorted(fixed_here)[0]}: set by the benchmark itself")
    from serving.config import load_config, validate_config
    from transdenoiser.errors import UserError

    for flag, given in (("--server-setting", server_settings), ("--compare", {**server_settings, **compared})):
        try:
            validate_config({"sigma": 0.25, **given}, flag)
        except (UserError, ValueError) as exc:
            parser.error(str(exc))
    from training.datasets import load_dataset

    model_dir = Path(args.model_dir)
    try:
        config = load_config(model_dir)
    except UserError as exc:  # the default, runs/demo/serve, is made by `make demo`
        parser.error(f"--model-dir: {exc}" + ("; run `make demo` first, or give --model-dir DIR"
                                              if args.model_dir == DEFAULT_MODEL_DIR else ""))
    denoiser = (str(model_dir / config.denoiser) if config.denoiser is not None and not args.no_denoiser
                else None)
    x, y = load_dataset("mnist10k").test.tensors()
    images = [x[i].tolist() for i in range(args.images)]
    labels = [int(v) for v in y[:args.images]]
    record = {**run_record(argv, "benchmarks.bench_serving_adaptive"), "model_dir": str(model_dir),
              "sigma": config.sigma, "n0": config.n0, "alpha": config.alpha, "n": args.n, "radius": args.radius,
              "clients": args.clients, "images": args.images, "denoiser": denoiser is not None, "device": args.device,
              "server_settings": server_settings}
    if args.device != "cpu":
        import torch

        from transdenoiser.runtime import hardware_description

        record["hardware"] = hardware_description(torch.device(args.device))
    sides = {"first": server_settings, **({"second": {**server_settings, **compared}} if compared else {})}
    if compared:  # one noise key for both: the same noise for the same image, so their answers can be compared
        sides = {name: {"noise_key": COMPARE_NOISE_KEY, **given} for name, given in sides.items()}
        record["compare"] = compared
    modes = WITH_ESTIMATE if args.estimate else MODES
    phases = {name: {mode: [] for mode in modes} for name in sides}
    answers = {name: {mode: {} for mode in modes} for name in sides}
    shared = {"sigma": config.sigma, "n0": config.n0, "alpha": config.alpha, "n": min(1000, args.n), "max_n": args.n,
              "max_latency_ms": 900_000, "max_queued_requests": max(64, args.clients)}
    with tempfile.TemporaryDirectory(prefix="bench_serving_adaptive_") as tmp, running_servers(
            Path(tmp), {name: {**shared, **given} for name, given in sides.items()},
            str(model_dir / config.classifier), denoiser, args.device) as servers:
        for server in servers.values():
            run_phase(server.url, images[:1], {"n": 100}, 1, 60, 1)  # warm the HTTP path
        for _ in range(args.repeats):  # the servers in turn, repeat by repeat
            for name, server in servers.items():
                collect(phases[name], answers[name], *run_repeat(
                    server.url, images, args.radius, args.n, args.clients, args.seconds, 100_000,
                    args.fixed_waves * args.clients, modes))
    record.update(summarize(phases["first"], answers["first"], labels, args.radius))
    if compared:
        record["second"] = {"settings": sides["second"] | {"noise_key": "(the benchmark's own)"},
                            **summarize(phases["second"], answers["second"], labels, args.radius),
                            **compare_sides(phases, answers)}
    for mode in MODES:
        rates = ", ".join(f"{p['requests_per_s']:.3f}" for p in record["phases"][mode])
        print(f"{mode:7s} req/s per phase: {rates}; mean samples/request {record['mean_samples'][mode]:.0f}; "
              f"certified fraction at R = {args.radius}: {record['certified_fraction'][mode]}")
        if described := describe_server(record["server"][mode]):
            print(f"        server: {described}")
    print(f"decide / fixed noisy samples per second: {record['samples_per_second_vs_fixed']:.2f}")
    if args.estimate:
        estimate = record["estimate"]
        described = describe_server(estimate["server"])
        print(f"estimate / fixed noisy samples per second: {estimate['samples_per_second_vs_fixed']:.2f} "
              f"({estimate['median_requests_per_s']:.3f} requests/s, mean samples/request "
              f"{estimate['mean_samples']:.0f}; certified fraction at R = {args.radius}: "
              f"{estimate['certified_fraction']['estimate']} against fixed n's "
              f"{estimate['certified_fraction']['fixed']} on {estimate['images_compared']} images)"
              + (f"; server: {described}" if described else ""))
    print(f"decide / fixed requests per second at {args.clients} clients: {record['speedup']:.2f}x "
          f"(median of {args.repeats} interleaved phases; {record['images_compared']} images compared, "
          f"{len(record['disagreements'])} certified differently)")
    if compared:
        second = record["second"]
        ratios = ", ".join("-" if ratio is None else f"{ratio:.2f}" for ratio in second["decide_ratio_per_repeat"])
        rates = second["median_requests_per_s"]["decide"], record["median_requests_per_s"]["decide"]
        print(f"with {' '.join(f'{k}={v}' for k, v in compared.items())}: decide requests per second "
              f"{rates[0]:.1f} against {rates[1]:.1f}, "
              f"{'-' if second['decide_ratio'] is None else format(second['decide_ratio'], '.2f')}x "
              f"(per repeat: {ratios}); "
              f"decide / fixed noisy samples per second "
              f"{second['samples_per_second_vs_fixed']:.2f}; {second['answers_compared']} answers compared, "
              f"{len(second['answers_differing'])} differing")
    save_result(args.out, record, f"hardware: {record['hardware']}; commit {record['commit']}; ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
