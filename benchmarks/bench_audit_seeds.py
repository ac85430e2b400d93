"""Does the privacy audit catch a run whose DP noise was secretly scaled down? Seeds table of real training runs.

For each setting (the docs' epsilon-8 and epsilon-2 white-box audits: sepdp, mnist10k, 1,000 private examples,
autoencoder, C = 1, B = 500 so q = 0.5, 10 epochs = T = 20 steps, 1,000 canaries) it trains and audits
``--correct-seeds`` runs with the claimed noise and ``--scaled-seeds`` runs whose noise multiplier is
secretly multiplied by ``--noise-scale`` (default 0.5; the product's GaussianNoise is patched, the claim is
not), through ``training.audit.run.privacy_audit``, and prints one row per run and the count of runs
flagged (verdict FAIL) and inconclusive. The training seed and the audit seed are both the row's seed.

``--simulate N`` instead draws N runs per setting and noise from the claimed mechanism's exact model of the
``known_others`` scores (training.privacy.consistency.simulate_scores, no training) and applies the same two
tests: the false-alarm rate and the power at large N, in seconds.

The classifier is an untrained cnn28 (the audit never uses its accuracy) unless ``--classifier`` is given.

    python benchmarks/bench_audit_seeds.py --correct-seeds 20 --scaled-seeds 10
    python benchmarks/bench_audit_seeds.py --simulate 1000
    python benchmarks/bench_audit_seeds.py --quick        # smoke test: one tiny setting, 1 + 1 runs
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {  # name -> training flags of the docs' audits (docs/AUDIT.md, "Measured")
    "eps8": {"arm": "sepdp", "target_epsilon": 8.0, "delta": 1e-5, "denoiser": "autoencoder", "train_examples": 1000,
             "batch_size": 500, "epochs": 10, "learning_rate": 0.5, "eval_examples": 100},
    "eps2": {"arm": "sepdp", "target_epsilon": 2.0, "delta": 1e-5, "denoiser": "autoencoder", "train_examples": 1000,
             "batch_size": 500, "epochs": 10, "learning_rate": 0.5, "eval_examples": 100},
}
QUICK = {"quick": {"arm": "sepdp", "xi_up": 1.0, "delta": 1e-5, "denoiser": "tiny",
                   "denoiser_kwargs": {"width": 8}, "activation": "silu", "train_examples": 100, "batch_size": 50,
                   "epochs": 2, "learning_rate": 0.05, "eval_examples": 20, "max_smin_dim": 10}}


@contextlib.contextmanager
def scaled_noise(scale: float):
    """Every GaussianNoise.add call draws noise at ``scale`` times the multiplier it is asked for (a planted bug)."""
    from training.privacy import dp

    original = dp.GaussianNoise.add
    if scale == 1.0:
        yield
        return

    def add(self, tensors, noise_multiplier, generator):
        return original(self, tensors, noise_multiplier * scale, generator)

    dp.GaussianNoise.add = add
    try:
        yield
    finally:
        dp.GaussianNoise.add = original


def untrained_classifier(directory: Path) -> Path:
    import torch

    from training.checkpoint import save_checkpoint
    from training.models import build_model

    torch.manual_seed(0)
    kwargs = {"in_channels": 1, "num_classes": 10}
    meta = {"kind": "classifier", "architecture": "cnn28", "arch_kwargs": kwargs, "input_shape": [1, 28, 28],
            "num_classes": 10}
    return save_checkpoint(directory / "classifier", build_model("cnn28", **kwargs), meta)


def one_run(values: dict, seed: int, scale: float, canaries: int, classifier, dataset, out: Path, settings_kw,
            device=None):
    import torch

    from training.audit.run import privacy_audit
    from training.privacy.audit import AuditSettings
    from training.train_config import TrainConfig

    config = TrainConfig.from_dict({**values, "seed": seed}, source="bench_audit_seeds")
    settings = AuditSettings(mode="whitebox", num_canaries=canaries, audit_seed=seed, membership=False, **settings_kw)
    started = time.perf_counter()
    with scaled_noise(scale):
        result = privacy_audit(config, dataset, classifier, device or torch.device("cpu"), settings, out)
    c = result["consistency"]
    return {"seed": seed, "noise_scale": scale, "status": result["verdict"]["status"],
            "claimed_epsilon": min(x["epsilon"] for x in result["claims"]),
            "epsilon_steinke": result["epsilon_steinke"], "epsilon_fdp": result["epsilon_fdp"],
            "bound_test_p": c["bound_test"]["p_value"], "bound_null_quantile": c["bound_test"]["null_quantile"],
            "noise_test_p": c["noise_test"]["p_value"],
            "measured_noise_multiplier": c["noise_test"]["measured_noise_multiplier"],
            "claimed_noise_multiplier": c["noise_multiplier"],
            "flag_bound": not c["bound_test"]["consistent"], "flag_noise": not c["noise_test"]["consistent"],
            "seconds": round(time.perf_counter() - started, 1)}


def simulate(values: dict, runs: int, scale: float, canaries: int, settings_kw: dict, seed: int = 1) -> dict:
    """The two tests on ``runs`` runs drawn from the exact score model (no training)."""
    import numpy as np

    from training.privacy.bounds import guess_counts
    from training.privacy.consistency import (
        BoundTable,
        bounds_of_scores,
        cached_null_bounds,
        consistency_test,
        noise_scale_test,
        simulate_scores,
    )
    from training.private_train import plan
    from training.train_config import TrainConfig

    schedule = plan(TrainConfig.from_dict(values, source="bench_audit_seeds"), values["train_examples"])
    q, steps, xi = schedule["sample_rate"], schedule["total_steps"], schedule["xi_up"]
    counts = guess_counts(canaries)
    alpha, beta = settings_kw.get("consistency_alpha", 0.001), 0.05
    null = cached_null_bounds(canaries, steps, q, xi, values["delta"], counts, beta,
                              settings_kw.get("null_simulations", 1999))
    table = BoundTable(canaries, values["delta"], beta / len(counts))
    rng = np.random.default_rng([seed, int(1000 * scale)])
    flags = {"bound": 0, "noise": 0, "either": 0}
    for _ in range(runs):
        scores, included = simulate_scores(rng, canaries, steps, q, xi * scale)
        fdp = bounds_of_scores(scores, included, table, counts)[1]
        bound = not consistency_test(fdp, null["epsilon_fdp"], alpha / 2)["consistent"]
        noise = not noise_scale_test(scores[~included], steps, xi, alpha / 2)["consistent"]
        flags["bound"] += bound
        flags["noise"] += noise
        flags["either"] += bound or noise
    return {"noise_scale": scale, "runs": runs, "steps": steps, "sample_rate": q, "noise_multiplier": xi,
            "flagged": flags}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=["eps8", "eps2"])
    parser.add_argument("--correct-seeds", type=int, default=20)
    parser.add_argument("--scaled-seeds", type=int, default=10)
    parser.add_argument("--noise-scale", type=float, default=0.5)
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--null-simulations", type=int, default=1999)
    parser.add_argument("--simulate", type=int, default=0, help="N simulated runs per setting and noise instead")
    parser.add_argument("--classifier", type=Path, default=None)
    parser.add_argument("--device", default="cpu", help="torch device of the training runs (default: cpu)")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds FIRST .. FIRST + N - 1 (default: 0)")
    parser.add_argument("--quick", action="store_true", help="smoke test: one tiny setting, one run of each noise")
    args = parser.parse_args(argv)
    logging.getLogger("absl").setLevel(logging.ERROR)
    settings = {name: SETTINGS[name] for name in args.settings}
    if args.quick:
        settings, args.correct_seeds, args.scaled_seeds, args.canaries = QUICK, 1, 1, 100
        args.null_simulations = min(args.null_simulations, 199)
    settings_kw = {"null_simulations": args.null_simulations}
    if args.simulate:
        for name, values in settings.items():
            for scale in (1.0, args.noise_scale):
                print(json.dumps({"setting": name, **simulate(values, args.simulate, scale, args.canaries,
                                                               settings_kw)}), flush=True)
        return 0
    import torch

    from training.checkpoint import load_checkpoint
    from training.datasets import load_dataset

    device = torch.device(args.device)
    dataset = load_dataset("mnist10k")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        classifier_dir = args.classifier or untrained_classifier(tmp)
        classifier = load_checkpoint(classifier_dir, kind="classifier", map_location=device)
        for name, values in settings.items():
            summary = {}
            for scale, seeds in ((1.0, args.correct_seeds), (args.noise_scale, args.scaled_seeds)):
                rows = []
                for seed in range(args.first_seed, args.first_seed + seeds):
                    row = one_run(values, seed, scale, args.canaries, classifier, dataset,
                                  tmp / f"{name}-{scale}-{seed}", settings_kw, device)
                    rows.append(row)
                    print(json.dumps({"setting": name, **row}), flush=True)
                summary[scale] = {"runs": len(rows), "FAIL": sum(r["status"] == "FAIL" for r in rows),
                                  "INCONCLUSIVE": sum(r["status"] == "INCONCLUSIVE" for r in rows),
                                  "flag_bound": sum(r["flag_bound"] for r in rows),
                                  "flag_noise": sum(r["flag_noise"] for r in rows)}
            print(json.dumps({"setting": name, "summary": {str(k): v for k, v in summary.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
