"""Training throughput: sepdp vs Opacus DP-SGD, transdenoiser vs sepdp, and the cost of S_min as w grows.

    python -m benchmarks.bench_training [--device cpu] [--batch-size 64] [--steps 20] [--repeats 5] [--out FILE]

Prints one JSON object (also written to --out). Examples per second count examples actually processed
(fixed-size batches of --batch-size, so both DP implementations do identical work). Each implementation is
built once and warmed up (--warmup steps: the first few dozen steps of either pay for kernel selection and
allocation, and steady state is what a training run of thousands of steps sees); then --repeats blocks of
--steps timed steps alternate between sepdp, Opacus and the others (order rotated every repeat); the ratio is the
median of the per-repeat ratios, so a noisy neighbour slows both sides alike. Default run: ~1 min on 2 CPU
cores.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks import prepare_process
from training.models import build_model, count_parameters
from training.private_train import SepDPArm, TrainConfig, TransDenoiserArm
from transdenoiser.runtime import hardware_description


def _images(n: int, device, seed: int = 0) -> torch.Tensor:
    from training.datasets import load_dataset

    x, _ = load_dataset("mnist10k").private.tensors(device)
    return x[torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:n]]


def _time_steps(step, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - started


def ours_step(arm_class, denoiser: str, kwargs: dict, x: torch.Tensor, max_smin_dim: int):
    """One optimiser step of our arm (gradient, then SGD with momentum), as a closure; and the model."""
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

    return step, model


def opacus_step(denoiser: str, kwargs: dict, x: torch.Tensor, force_functorch: bool = False):
    """One Opacus DP-SGD step (GradSampleModule + DPOptimizer, same loss, noise and optimiser) as a closure.

    ``force_functorch``: Opacus computes per-sample gradients with torch.func for every layer instead of
    its default per-layer hooks (its ``grad_sample_mode="functorch"``)."""
    import warnings

    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    torch.manual_seed(0)
    model = GradSampleModule(build_model(denoiser, **kwargs).to(x.device), loss_reduction="sum",
                             force_functorch=force_functorch)
    optimizer = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), noise_multiplier=2.0,
                            max_grad_norm=1.0, expected_batch_size=len(x), loss_reduction="sum")
    generator = torch.Generator().manual_seed(0)

    def step():
        z = x + 0.25 * torch.randn(x.shape, generator=generator).to(x.device)
        optimizer.zero_grad(set_to_none=True)
        loss = (model(z) - x).pow(2).sum()
        with warnings.catch_warnings():  # "full backward hook is firing ... no inputs require gradients"
            warnings.simplefilter("ignore", UserWarning)
            loss.backward()
        optimizer.step()

    return step


def compare(steps_by_name: dict, batch: int, steps: int, warmup: int, repeats: int) -> dict:
    """Warm every step up, then time ``repeats`` interleaved blocks of ``steps`` steps each (order rotated)."""
    for step in steps_by_name.values():
        for _ in range(warmup):
            step()
    names = list(steps_by_name)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            seconds[name].append(_time_steps(steps_by_name[name], steps))
    return {name: {"examples_per_second": [steps * batch / s for s in seconds[name]],
                   "median_examples_per_second": statistics.median(steps * batch / s for s in seconds[name]),
                   "seconds": seconds[name], "steps_per_repeat": steps, "warmup_steps": warmup}
            for name in names}


def bench_ours(arm_class, denoiser: str, kwargs: dict, x: torch.Tensor, steps: int, max_smin_dim: int,
               warmup: int = 2) -> dict:
    step, model = ours_step(arm_class, denoiser, kwargs, x, max_smin_dim)
    row = compare({"ours": step}, len(x), steps, warmup, 1)["ours"]
    return {"examples_per_second": row["examples_per_second"][0], "seconds": row["seconds"][0], "steps": steps,
            "num_parameters": count_parameters(model)}


def bench_smin(widths: list[int], examples: int, device) -> list[dict]:
    from training.privacy.smin import smin_lower_bound

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
    from training.private_train import TrainConfig, load_private_record, train_denoiser

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
            td = load_private_record(Path(tmp) / "d")["privacy"]["transdenoiser"]  # private statistics
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
    parser.add_argument("--steps", type=int, default=20, help="timed steps per repeat (default: 20)")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps per implementation first (default: 30)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed blocks (default: 5)")
    parser.add_argument("--denoiser", default="autoencoder", help="denoiser for the throughput rows")
    parser.add_argument("--smin-widths", default="1,2,4,8", help="tiny widths for the S_min rows")
    parser.add_argument("--smin-examples", type=int, default=4, help="examples in K for the S_min rows")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--activation-study", type=Path, default=None, metavar="CLASSIFIER_DIR",
                        help="instead: the ReLU-vs-smooth S_min study with the tiny denoiser (about 5 min CPU)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    allocator, device = prepare_process(args.threads, args.device)
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
    result = {"hardware": hardware_description(device), "allocator": allocator, "device": str(device),
              "batch_size": args.batch_size,
              "denoiser": args.denoiser, "command": "python -m benchmarks.bench_training " + " ".join(
                  argv if argv is not None else sys.argv[1:]),
              "note": "provisional unless run on a quiet machine"}
    sepdp, model = ours_step(SepDPArm, args.denoiser, kwargs, x, 4096)
    transdenoiser, _ = ours_step(TransDenoiserArm, args.denoiser, kwargs, x, 4096)
    rows = compare({"sepdp": sepdp, "opacus_dpsgd": opacus_step(args.denoiser, kwargs, x),
                    "opacus_dpsgd_functorch": opacus_step(args.denoiser, kwargs, x, force_functorch=True),
                    "transdenoiser_smin_not_computed": transdenoiser}, len(x), args.steps, args.warmup, args.repeats)
    result.update(rows)
    result["num_parameters"] = count_parameters(model)
    ratios = [a / b for a, b in zip(rows["sepdp"]["examples_per_second"], rows["opacus_dpsgd"]["examples_per_second"],
                                    strict=True)]
    result["sepdp_over_opacus_per_repeat"] = ratios
    result["sepdp_over_opacus"] = statistics.median(ratios)
    result["sepdp_over_opacus_functorch"] = statistics.median(
        a / b for a, b in zip(rows["sepdp"]["examples_per_second"],
                              rows["opacus_dpsgd_functorch"]["examples_per_second"], strict=True))
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
