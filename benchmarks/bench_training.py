"""Training throughput: sepdp vs Opacus DP-SGD, transdenoiser vs sepdp, and the cost of S_min as w grows.

    python -m benchmarks.bench_training [--device cpu] [--batch-size 64] [--steps 10] [--out FILE]

Prints one JSON object (also written to --out). Examples per second count examples actually processed
(fixed-size batches of --batch-size, so both DP implementations do identical work). Default run: < 2 min on
2 CPU cores.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from training.models import build_model, count_parameters
from training.private_train import SepDPArm, TrainConfig, TransDenoiserArm
from transdenoiser.runtime import hardware_description, resolve_device


def _images(n: int, device, seed: int = 0) -> torch.Tensor:
    from training.datasets import load_dataset

    x, _ = load_dataset("mnist10k").private.tensors(device)
    return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:n]]


def _timed(step, steps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - started


def bench_ours(arm_class, denoiser: str, kwargs: dict, x: torch.Tensor, steps: int, max_smin_dim: int) -> dict:
    torch.manual_seed(0)
    model = build_model(denoiser, **kwargs).to(x.device)
    config = TrainConfig(arm=arm_class.name, denoiser=denoiser, max_smin_dim=max_smin_dim)
    arm = arm_class(model, config, xi_up=2.0, expected_batch=float(len(x)), total_steps=1000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(0)

    def step():
        grads, _ = arm.gradient(x, generator)
        for name, p in model.named_parameters():
            p.grad = grads[name]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = _timed(step, steps)
    return {"examples_per_second": steps * len(x) / seconds, "seconds": seconds, "steps": steps,
            "num_parameters": count_parameters(model)}


def bench_opacus(denoiser: str, kwargs: dict, x: torch.Tensor, steps: int) -> dict:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    torch.manual_seed(0)
    model = GradSampleModule(build_model(denoiser, **kwargs).to(x.device), loss_reduction="sum")
    optimizer = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), noise_multiplier=2.0,
                            max_grad_norm=1.0, expected_batch_size=len(x), loss_reduction="sum")
    generator = torch.Generator().manual_seed(0)

    def step():
        z = x + 0.25 * torch.randn(x.shape, generator=generator).to(x.device)
        optimizer.zero_grad(set_to_none=True)
        loss = (model(z) - x).pow(2).sum()
        loss.backward()
        optimizer.step()

    seconds = _timed(step, steps)
    return {"examples_per_second": steps * len(x) / seconds, "seconds": seconds, "steps": steps}


def bench_smin(widths: list[int], examples: int, device) -> list[dict]:
    from training.smin import smin_lower_bound

    rows = []
    x = _images(examples, device, seed=1)
    for width in widths:
        torch.manual_seed(0)
        model = build_model("tiny", width=width, activation="silu").to(device)
        started = time.perf_counter()
        result = smin_lower_bound(model, x, torch.ones(examples, device=device), max_dim=10**9)
        rows.append({"width": width, "w": count_parameters(model), "examples": examples,
                     "seconds": time.perf_counter() - started, "method": result.method, "smin": result.value})
    return rows


def activation_study(classifier_dir: Path, activations: list[str], device) -> dict:
    """S_min, input-noise multiplier and sigma_bar of the transdenoiser arm with the tiny denoiser (w = 225)."""
    import tempfile

    from training.checkpoint import load_checkpoint
    from training.datasets import load_dataset
    from training.private_train import TrainConfig, train_denoiser

    dataset = load_dataset("mnist10k")
    classifier = load_checkpoint(classifier_dir, kind="classifier", map_location=device)
    rows = {}
    for activation in activations:
        config = TrainConfig(arm="transdenoiser", denoiser="tiny", denoiser_kwargs={"width": 4},
                             activation=activation, epochs=1, batch_size=16, train_examples=96, eval_examples=500,
                             sigma=0.25, xi_up=2.0, xi_low=0.5, delta=1e-3, seed=0)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            model, meta = train_denoiser(config, dataset, classifier, device, checkpoint_dir=Path(tmp) / "d")
        td = meta["privacy"]["transdenoiser"]
        rows[activation] = {"seconds": time.perf_counter() - started, "w": count_parameters(model),
                            "steps": meta["privacy"]["steps_done"], "nonnegative_share": td["nonnegative_share"],
                            "smin": td["smin"], "smin_methods": td["smin_methods"],
                            "input_multiplier": td["input_noise_multiplier"], "sigma_bar": td["sigma_bar"],
                            "share_steps_reduced": td["share_steps_input_noise_reduced_explicit_noise"]}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step (default: 64)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per measurement (default: 10)")
    parser.add_argument("--denoiser", default="autoencoder", help="denoiser for the throughput rows")
    parser.add_argument("--smin-widths", default="1,2,4,8", help="tiny widths for the S_min rows")
    parser.add_argument("--smin-examples", type=int, default=4, help="examples in K for the S_min rows")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--activation-study", type=Path, default=None, metavar="CLASSIFIER_DIR",
                        help="instead: the ReLU-vs-smooth S_min study with the tiny denoiser (about 5 min CPU)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.activation_study is not None:
        study = {"hardware": hardware_description(device),
                 "activation_study": activation_study(args.activation_study, ["relu", "silu", "tanh", "softplus"],
                                                      device)}
        text = json.dumps(study, indent=2)
        if args.out:
            args.out.write_text(text + "\n")
        print(text)
        return 0
    x = _images(args.batch_size, device)
    kwargs = {"in_channels": 1}
    result = {"hardware": hardware_description(device), "device": str(device), "batch_size": args.batch_size,
              "denoiser": args.denoiser, "command": "python -m benchmarks.bench_training " + " ".join(
                  argv if argv is not None else sys.argv[1:]),
              "note": "provisional unless run on a quiet machine"}
    result["sepdp"] = bench_ours(SepDPArm, args.denoiser, kwargs, x, args.steps, 4096)
    result["opacus_dpsgd"] = bench_opacus(args.denoiser, kwargs, x, args.steps)
    result["transdenoiser_smin_not_computed"] = bench_ours(TransDenoiserArm, args.denoiser, kwargs, x, args.steps,
                                                           4096)
    result["sepdp_over_opacus"] = (result["sepdp"]["examples_per_second"]
                                   / result["opacus_dpsgd"]["examples_per_second"])
    tiny = {"in_channels": 1, "width": 2, "activation": "silu"}
    small = x[:16]
    result["tiny_w77_batch16"] = {
        "sepdp": bench_ours(SepDPArm, "tiny", tiny, small, 3, 4096),
        "transdenoiser_smin_computed": bench_ours(TransDenoiserArm, "tiny", tiny, small, 3, 4096)}
    result["smin_cost"] = bench_smin([int(w) for w in args.smin_widths.split(",")], args.smin_examples, device)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
