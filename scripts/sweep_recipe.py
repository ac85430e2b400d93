"""Sweep the DP training recipe (batch size, optimiser and learning rate, parameter averaging, normalisation) at
one target epsilon, on a stand-in for the private split carved from the PUBLIC split, and write the winner as a
training config.

Why the public split: choosing hyperparameters by runs on the private data is itself a computation on the private
data, and the chosen run's epsilon does not account for it (Papernot and Steinke 2022). Here every run trains
with DP-SGD (the sepdp arm) on public images standing in for the private ones, with the same sample rate
q = B/N and steps T as the real run will use, so the same noise multiplier: the sweep touches no private example
and costs no privacy. Validation is on other public images (the classifier was trained on the public split, so
its accuracy there is optimistic for every run alike: the figures rank runs, they are not results).

Every run spends the same target epsilon: xi_up is calibrated to it by the RDP accountant, and the script checks
each run's privacy report (data-independent RDP epsilon in [0.99 target, target]) and stops if one misses.

    python scripts/sweep_recipe.py --dataset fashion-mnist --classifier DIR --sigma 0.5 --target-epsilon 1 \
        --out runs/recipe/sweep_fashion_sigma050_eps1 --write-config runs/recipe/fashion_sigma050_eps1.toml
    python scripts/sweep_recipe.py --quick --classifier DIR --out /tmp/sweep    # a seconds-long smoke run
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EPSILON_FLOOR = 0.99  # every run must land in [EPSILON_FLOOR * target, target]
STANDIN_SEED = 20231  # which public images stand in for the private split (fixed)


def standin_dataset(dataset, validation: int):
    """A Dataset whose private split is drawn from ``dataset.public`` (as many images as the real private split,
    at most all but ``validation``) and whose test split is ``validation`` other public images."""
    from training.datasets import Dataset

    public = dataset.public
    rng = np.random.default_rng(STANDIN_SEED)
    order = rng.permutation(len(public))
    validation = min(validation, len(public) // 5)
    train_size = min(len(dataset.private), len(public) - validation)
    return Dataset(name=f"{dataset.name}:public-standin", classes=dataset.classes, public=public.subset(order[:0]),
                   private=public.subset(np.sort(order[:train_size])),
                   test=public.subset(np.sort(order[train_size:train_size + validation])),
                   source=f"{dataset.source} (public split only)", split_seed=dataset.split_seed)


def grid(args, num_examples: int) -> list[dict]:
    """The runs: batch sizes from the planner (several step floors), optimiser/learning rate, EMA, norm."""
    from training.recipe import choose_batch_size, plan_batch_sizes

    plans = plan_batch_sizes(args.target_epsilon, args.delta, num_examples, args.epochs,
                             batch_sizes=args.batch_sizes)
    batches = sorted({choose_batch_size(plans, steps).batch_size for steps in args.min_steps})
    runs = []
    for batch, (optimizer, lr), ema, norm in itertools.product(batches, args.optimizers, args.ema, args.norm):
        runs.append({"batch_size": batch, "optimizer": optimizer, "learning_rate": lr, "ema_decay": ema,
                     "denoiser_kwargs": {"norm": norm} if norm != "none" else {}})
    return runs


def run_one(settings: dict, args, data, classifier, device) -> dict:
    import torch

    from training.private_train import train_denoiser
    from training.train_config import TrainConfig

    config = TrainConfig(arm="sepdp", sigma=args.sigma, target_epsilon=args.target_epsilon, delta=args.delta,
                         epochs=args.epochs, clip_norm=args.clip_norm, momentum=0.9, seed=args.seed,
                         denoiser="autoencoder", activation="relu", eval_examples=0, **settings)
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    _, meta = train_denoiser(config, data, classifier, device)
    guarantee = next(g for g in meta["privacy"]["guarantees"] if g["name"] == "sepdp")
    epsilon = float(guarantee["epsilon"]["rdp"])
    if not EPSILON_FLOOR * args.target_epsilon <= epsilon <= args.target_epsilon:
        raise SystemExit(f"run {settings}: RDP epsilon {epsilon:.4f} is not at the target {args.target_epsilon} "
                         f"(allowed [{EPSILON_FLOOR * args.target_epsilon:.4f}, {args.target_epsilon}])")
    last = meta["metrics"][-1]
    return {**settings, "noise_multiplier": guarantee["noise_multiplier"], "steps": meta["steps_done"],
            "epsilon_rdp": epsilon, "validation_accuracy_denoised": last["accuracy_denoised"],
            "validation_mse": last["mse"], "seconds": time.perf_counter() - started,
            "config": {k: v for k, v in asdict(config).items() if k in ("batch_size", "epochs", "optimizer",
                                                                      "learning_rate", "momentum", "ema_decay",
                                                                      "denoiser_kwargs")}}


def write_config(path: Path, best: dict, args, standin_n: int, private_n: int) -> None:
    """The winner as a TOML config for the real private split: the same sample rate q (batch scaled by N/N')."""
    batch = max(1, round(best["batch_size"] * private_n / standin_n))
    norm = best["denoiser_kwargs"].get("norm")
    lines = [f"# Tuned DP recipe at epsilon {args.target_epsilon:g} (RDP, delta {args.delta:g}), chosen by "
             f"scripts/sweep_recipe.py on a public stand-in",
             f"# ({standin_n} public images, validation accuracy on g(x + noise) "
             f"{best['validation_accuracy_denoised']:.4f}); no private example was used to choose it.",
             f"# Batch {best['batch_size']} on the stand-in -> {batch} here (same q = B/N, same steps, same xi_up).",
             f"# Run: transdenoiser train --config {path} --dataset {args.dataset} --classifier DIR --out DIR",
             'arm = "sepdp"', f"sigma = {args.sigma}", f"target_epsilon = {args.target_epsilon}",
             f"delta = {args.delta}", f"clip_norm = {args.clip_norm}", f"batch_size = {batch}",
             f"epochs = {args.epochs}", f'optimizer = "{best["optimizer"]}"',
             f"learning_rate = {best['learning_rate']}",
             "momentum = 0.9", f"ema_decay = {best['ema_decay']}", 'denoiser = "autoencoder"', 'activation = "relu"']
    if norm:
        lines.append(f'denoiser_kwargs = {{ norm = "{norm}" }}')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--classifier", type=Path, required=True)
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--target-epsilon", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--clip-norm", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--min-steps", type=int, nargs="+", default=[100, 300],
                   help="batch sizes: the planner's choice for each of these step floors")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                   help="candidate batch sizes for the planner (default: powers of two from 64 to N)")
    p.add_argument("--optimizers", type=lambda s: (s.split(":")[0], float(s.split(":")[1])), nargs="+",
                   default=[("adam", 1e-3), ("adam", 3e-3)], help="OPTIMIZER:LR pairs")
    p.add_argument("--ema", type=float, nargs="+", default=[0.0, 0.99])
    p.add_argument("--norm", nargs="+", default=["none"], choices=("none", "group"))
    p.add_argument("--validation", type=int, default=5000, help="public images held out for validation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, required=True, help="folder for results.json")
    p.add_argument("--write-config", type=Path, default=None, help="write the winner as a training config here")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: mnist10k, 1 epoch, 2 runs, small validation set (seconds)")
    args = p.parse_args(argv)
    if args.write_config is not None and args.write_config.exists():
        p.error(f"--write-config {args.write_config} exists: nothing is overwritten; choose another path")
    if args.quick:
        args.dataset, args.epochs, args.validation = "mnist10k", 1, 200
        args.min_steps, args.optimizers, args.ema, args.norm = [10], [("adam", 1e-3)], [0.0, 0.9], ["none"]
        args.batch_sizes = [32]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from training.checkpoint import load_checkpoint
    from training.datasets import load_dataset

    torch.set_num_threads(min(2, torch.get_num_threads()))
    device = torch.device(args.device)
    dataset = load_dataset(args.dataset)
    data = standin_dataset(dataset, args.validation)
    if args.quick:  # a few hundred examples: the smoke run takes seconds
        from training.datasets import Dataset

        data = Dataset(name=data.name, classes=data.classes, public=data.public,
                       private=data.private.subset(np.arange(min(400, len(data.private)))), test=data.test,
                       source=data.source, split_seed=data.split_seed)
    classifier = load_checkpoint(args.classifier, kind="classifier", map_location=device)
    runs = grid(args, len(data.private))
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for i, settings in enumerate(runs):
        row = run_one(settings, args, data, classifier, device)
        results.append(row)
        print(f"[{i + 1}/{len(runs)}] B {row['batch_size']} {row['optimizer']} lr {row['learning_rate']:g} "
              f"ema {row['ema_decay']:g} norm {row['denoiser_kwargs'].get('norm', 'none')}: "
              f"xi {row['noise_multiplier']:.3f}, T {row['steps']}, RDP epsilon {row['epsilon_rdp']:.4f}; "
              f"validation accuracy on g(x+noise) {row['validation_accuracy_denoised']:.4f}, "
              f"MSE {row['validation_mse']:.5f} ({row['seconds']:.0f} s)", flush=True)
    best = max(results, key=lambda r: (r["validation_accuracy_denoised"], -r["validation_mse"]))
    summary = {"dataset": args.dataset, "standin_examples": len(data.private), "validation_examples": len(data.test),
               "private_examples": len(dataset.private), "sigma": args.sigma,
               "target_epsilon": args.target_epsilon, "delta": args.delta, "epochs": args.epochs,
               "accountant": "rdp", "epsilon_band": [EPSILON_FLOOR * args.target_epsilon, args.target_epsilon],
               "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
               "runs": results, "best": best}
    (args.out / "results.json").write_text(json.dumps(summary, indent=2, default=float))
    print(f"best: {json.dumps(best['config'])}; all {len(results)} runs at RDP epsilon in "
          f"[{min(r['epsilon_rdp'] for r in results):.4f}, {max(r['epsilon_rdp'] for r in results):.4f}]")
    if args.write_config is not None:
        write_config(args.write_config, best, args, len(data.private), len(dataset.private))
        print(f"config: {args.write_config}")
    assert all(math.isfinite(r["epsilon_rdp"]) for r in results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
