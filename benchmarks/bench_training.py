"""Training throughput: every DP-SGD implementation against non-private SGD on the same model and batch.

    python -m benchmarks.bench_training [--device cpu|cuda] [--quick] [--clipping auto|ghost|vmap] [--compile]
                                        [--cuda-graphs auto|off] [--steps 4] [--warmup 3] [--repeats 5]
                                        [--smin] [--objectives mse stability classification] [--out FILE]

Rows: non-private SGD (plain autograd, the floor), sepdp (``SepDPArm.gradient`` + SGD, its clipping planned
for the device as in training), the transdenoiser arm with S_min not computed (its merged step), Opacus 1.6
hooks (GradSampleModule + DPOptimizer) and Opacus ghost clipping (its fast-gradient-clipping module, optimiser
and loss); on CUDA also sepdp with its CUDA graphs off and non-private SGD replayed as a CUDA graph
(``CUDA_ROWS``). Every row draws its input noise as the arms do (``training.privacy.dp.standard_normal``: from
the CPU generator, on CUDA by a device generator it seeds). Grid: autoencoder 1x28x28 at batch 64, 256, 1024;
DnCNN-17x64 3x32x32 at 64, 256 (``--quick``: a tiny grid, for the test suite). Every row is built once and
warmed up; then --repeats blocks of timed steps
alternate between the rows (order rotated every repeat), and every figure is the median over repeats of the
per-repeat value (examples/s; fraction of non-private; ratios), so a noisy neighbour slows all rows alike.
Peak memory: on CUDA the allocator's peak per row; on CPU the peak resident memory of a fresh process running
that row (torch's own few hundred MB included; not in --quick). Prints one JSON object (also to --out) and a
markdown table on stderr.

``--objectives``: instead of the rows above, the sepdp step with each training objective (training/objectives.py:
``mse``, and ``stability`` / ``classification``, whose backward pass runs through a frozen classifier: cnn28 for
1x28x28, resnet20 for 3x32x32, random weights) and non-private MSE SGD, interleaved as above; each objective's
figure also as a ratio to the MSE step's examples/s (median of per-repeat ratios). ``stability+mse``'s private
step is the stability step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks import prepare_process, print_result
from training.arms import SepDPArm, TransDenoiserArm
from training.models import build_model, count_parameters
from training.objectives import PHASES, build_objective
from training.privacy.dp import standard_normal
from training.privacy.graphed import record_graph
from training.train_config import TrainConfig
from transdenoiser.runtime import hardware_description


def _time_steps(step, steps: int, cuda_device=None) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda_device is not None:
        torch.cuda.synchronize(cuda_device)
    return time.perf_counter() - started


ROWS = ("nonprivate_sgd", "sepdp", "transdenoiser_smin_not_computed", "opacus_hooks", "opacus_ghost")
# on CUDA also: sepdp with its CUDA graphs off (the eager step, side by side), and non-private SGD whose forward
# and backward passes are one CUDA graph too (the like-for-like floor of a graphed DP step)
CUDA_ROWS = ("sepdp_no_cuda_graphs", "nonprivate_sgd_cuda_graph")
GRID = (("autoencoder", {"in_channels": 1}, (1, 28, 28), (64, 256, 1024)),
        ("dncnn", {"in_channels": 3}, (3, 32, 32), (64, 256)))
QUICK_GRID = (("autoencoder", {"in_channels": 1}, (1, 28, 28), (8,)),
              ("dncnn", {"in_channels": 3, "depth": 3, "width": 16}, (3, 32, 32), (4,)))


def synthetic_images(n: int, shape: tuple[int, ...], device, seed: int = 0) -> torch.Tensor:
    """Fixed-seed random pixels in [0, 1] (throughput does not depend on the pixels)."""
    return torch.rand((n, *shape), generator=torch.Generator().manual_seed(seed)).to(device)


def _sgd_step(model, gradient):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step():
        grads = gradient()
        for name, p in model.named_parameters():
            p.grad = grads[name]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def ours_step(arm_class, denoiser: str, kwargs: dict, x: torch.Tensor, max_smin_dim: int, **settings):
    """One optimiser step of our arm (gradient, then SGD with momentum), as a closure; and the model. The arm
    plans its clipping for the device on its first batch (``settings``: TrainConfig fields, e.g. clipping)."""
    torch.manual_seed(0)
    model = build_model(denoiser, **kwargs).to(x.device)
    config = TrainConfig(arm=arm_class.name, denoiser=denoiser, max_smin_dim=max_smin_dim, **settings)
    arm = arm_class(model, config, xi_up=2.0, expected_batch=float(len(x)), total_steps=1000)
    generator = torch.Generator().manual_seed(0)
    step = _sgd_step(model, lambda: arm.gradient(x, generator)[0])
    step.arm = arm
    return step, model


CLASSIFIERS = {(1, 28, 28): ("cnn28", {"in_channels": 1}), (3, 32, 32): ("resnet20", {"in_channels": 3})}


def objective_step(objective: str, denoiser: str, kwargs: dict, x: torch.Tensor, settings: dict):
    """One sepdp step (gradient, then SGD with momentum) minimising ``objective`` through a frozen classifier of
    the images' shape (random weights, eval mode), as a closure; its ``arm`` attached."""
    torch.manual_seed(0)
    model = build_model(denoiser, **kwargs).to(x.device)
    name, classifier_kwargs = CLASSIFIERS[tuple(x.shape[1:])]
    classifier = build_model(name, num_classes=10, **classifier_kwargs).to(x.device)
    config = TrainConfig(arm="sepdp", denoiser=denoiser, objective=objective, **settings)
    arm = SepDPArm(model, config, xi_up=2.0, expected_batch=float(len(x)), total_steps=1000,
                   objective=build_objective(PHASES[objective][1], classifier))
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (len(x),), generator=torch.Generator().manual_seed(1)).to(x.device)
    step = _sgd_step(model, lambda: arm.gradient(x, generator, labels)[0])
    step.arm = arm
    return step


def objectives_grid(args, device) -> dict:
    """The sepdp step with each of ``args.objectives`` and non-private MSE SGD at every (model, batch) of the
    grid, interleaved; examples/s medians, fraction of non-private, and each objective's ratio to MSE's."""
    grid = _grid(args)
    settings = {"clipping": args.clipping, "compile": args.compile, "cuda_graphs": args.cuda_graphs}
    steps, warmup, repeats = (1, 1, 2) if args.quick else (args.steps, args.warmup, args.repeats)
    objectives = ["mse", *[o for o in args.objectives if o != "mse"]]
    out = {}
    for denoiser, kwargs, shape, batches in grid:
        for batch in batches:
            x = synthetic_images(batch, shape, device)
            rows = {"nonprivate_sgd": nonprivate_step(denoiser, kwargs, x),
                    **{f"sepdp_{o}": objective_step(o, denoiser, kwargs, x, settings) for o in objectives}}
            timed = compare(rows, batch, max(1, steps * 64 // batch) if not args.quick else steps, warmup,
                            repeats, device)
            floor, mse = timed["nonprivate_sgd"]["examples_per_second"], timed["sepdp_mse"]["examples_per_second"]
            for name, row in timed.items():
                row["fraction_of_nonprivate"] = statistics.median(
                    a / b for a, b in zip(row["examples_per_second"], floor, strict=True))
                row["over_sepdp_mse"] = statistics.median(
                    a / b for a, b in zip(row["examples_per_second"], mse, strict=True))
                if name != "nonprivate_sgd":
                    plan = rows[name].arm.execution
                    row["execution"] = plan.as_dict() if plan is not None else None
            out[f"{denoiser} {'x'.join(map(str, shape))} batch {batch}"] = {"rows": timed}
    return out


def format_objectives_table(grid: dict) -> str:
    names = list(next(iter(grid.values()))["rows"]) if grid else []
    lines = ["| model, batch | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key, entry in grid.items():
        cells = []
        for name in names:
            row = entry["rows"][name]
            engine = (row.get("execution") or {}).get("clipping")
            cells.append(f"{row['median_examples_per_second']:.0f} ({row['over_sepdp_mse']:.2f}x MSE"
                         + (f", {engine}" if engine else "") + ")")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def nonprivate_step(denoiser: str, kwargs: dict, x: torch.Tensor):
    """Plain autograd SGD on the same model, batch, loss and input noise: the floor."""
    torch.manual_seed(0)
    model = build_model(denoiser, **kwargs).to(x.device)
    params = [p for p in model.parameters()]
    names = [k for k, _ in model.named_parameters()]
    generator = torch.Generator().manual_seed(0)

    def gradient():
        z = x + 0.25 * standard_normal(x.shape, generator, x.device)
        loss = (model(z) - x).pow(2).flatten(1).sum(1).sum()
        return dict(zip(names, torch.autograd.grad(loss, params), strict=True))

    return _sgd_step(model, gradient)


def nonprivate_graphed_step(denoiser: str, kwargs: dict, x: torch.Tensor):
    """Non-private SGD with its forward and backward passes replayed as one CUDA graph; the input noise drawn
    before it and the SGD step after it, as in our arms' graphed step (CUDA only)."""
    torch.manual_seed(0)
    model = build_model(denoiser, **kwargs).to(x.device)
    params = [p for p in model.parameters()]
    names = [k for k, _ in model.named_parameters()]
    generator = torch.Generator().manual_seed(0)
    z = torch.zeros_like(x)

    def forward_backward():
        loss = (model(z) - x).pow(2).flatten(1).sum(1).sum()
        return torch.autograd.grad(loss, params)

    graph, static = record_graph(forward_backward, x.device)

    def gradient():
        z.copy_(x + 0.25 * standard_normal(x.shape, generator, x.device))
        graph.replay()
        return {name: g.clone() for name, g in zip(names, static, strict=True)}

    return _sgd_step(model, gradient)


class _SquaredError(torch.nn.Module):
    """Eq. (1) with a ``reduction`` attribute, as Opacus's fast-gradient-clipping loss wrapper wants."""

    reduction = "sum"

    def forward(self, out, target):
        per_example = (out - target).pow(2).flatten(1).sum(1)
        return per_example if self.reduction == "none" else per_example.sum()


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
        z = x + 0.25 * standard_normal(x.shape, generator, x.device)
        optimizer.zero_grad(set_to_none=True)
        loss = (model(z) - x).pow(2).sum()
        with warnings.catch_warnings():  # "full backward hook is firing ... no inputs require gradients"
            warnings.simplefilter("ignore", UserWarning)
            loss.backward()
        optimizer.step()

    return step


def opacus_ghost_step(denoiser: str, kwargs: dict, x: torch.Tensor):
    """One Opacus 1.6 ghost-clipping step (GradSampleModuleFastGradientClipping, DPOptimizerFastGradientClipping
    and DPLossFastGradientClipping: its two backward passes), same loss, noise and optimiser."""
    import warnings

    from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    torch.manual_seed(0)
    model = GradSampleModuleFastGradientClipping(build_model(denoiser, **kwargs).to(x.device), max_grad_norm=1.0,
                                                 use_ghost_clipping=True, loss_reduction="sum")
    optimizer = DPOptimizerFastGradientClipping(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                                noise_multiplier=2.0, max_grad_norm=1.0,
                                                expected_batch_size=len(x), loss_reduction="sum")
    criterion = DPLossFastGradientClipping(model, optimizer, _SquaredError(), loss_reduction="sum")
    generator = torch.Generator().manual_seed(0)

    def step():
        z = x + 0.25 * standard_normal(x.shape, generator, x.device)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(z), x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            loss.backward()
        optimizer.step()

    return step


def compare(steps_by_name: dict, batch: int, steps: int, warmup: int, repeats: int, device=None) -> dict:
    """Warm every step up, then time ``repeats`` interleaved blocks of ``steps`` steps each (order rotated).
    On CUDA each row also gets its peak allocated memory over its blocks (bytes)."""
    cuda = device is not None and torch.device(device).type == "cuda"
    for step in steps_by_name.values():
        for _ in range(warmup):
            step()
    names = list(steps_by_name)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    peak: dict[str, int] = {name: 0 for name in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            seconds[name].append(_time_steps(steps_by_name[name], steps, device if cuda else None))
            if cuda:
                peak[name] = max(peak[name], torch.cuda.max_memory_allocated(device))
    return {name: {"examples_per_second": [steps * batch / s for s in seconds[name]],
                   "median_examples_per_second": statistics.median(steps * batch / s for s in seconds[name]),
                   "seconds": seconds[name], "steps_per_repeat": steps, "warmup_steps": warmup,
                   **({"peak_memory_bytes": peak[name]} if cuda else {})}
            for name in names}


def bench_smin(widths: list[int], examples: int, device) -> list[dict]:
    from training.privacy.smin import smin_lower_bound

    rows = []
    x = synthetic_images(examples, (1, 28, 28), device, seed=1)
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
    from training.private_train import train_denoiser
    from training.release import load_private_record
    from training.train_config import TrainConfig

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


def build_row(name: str, denoiser: str, kwargs: dict, x: torch.Tensor, settings: dict):
    if name == "nonprivate_sgd":
        return nonprivate_step(denoiser, kwargs, x)
    if name == "nonprivate_sgd_cuda_graph":
        return nonprivate_graphed_step(denoiser, kwargs, x)
    if name == "sepdp_no_cuda_graphs":
        return ours_step(SepDPArm, denoiser, kwargs, x, max_smin_dim=1, **{**settings, "cuda_graphs": "off"})[0]
    if name == "opacus_hooks":
        return opacus_step(denoiser, kwargs, x)
    if name == "opacus_ghost":
        return opacus_ghost_step(denoiser, kwargs, x)
    arm = SepDPArm if name == "sepdp" else TransDenoiserArm
    # S_min not computed: max_smin_dim below w, so every step takes the merged (sepdp) noise
    return ours_step(arm, denoiser, kwargs, x, max_smin_dim=1, **settings)[0]


def peak_rss(row: str, denoiser: str, kwargs: dict, shape, batch: int, device: str, settings: dict) -> int:
    """Peak resident memory (bytes) of a fresh process that builds ``row`` and runs 2 steps of it: the process
    total, torch's own ~0.3-0.5 GB included (CPU; on CUDA the in-process allocator peak is reported instead)."""
    import subprocess

    spec = json.dumps({"row": row, "denoiser": denoiser, "kwargs": kwargs, "shape": list(shape), "batch": batch,
                       "device": device, "settings": settings})
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench_training", "--peak-row", spec],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return int(out.stdout.strip().splitlines()[-1])


def _peak_row_main(spec_text: str) -> int:
    spec = json.loads(spec_text)
    x = synthetic_images(spec["batch"], tuple(spec["shape"]), torch.device(spec["device"]))
    step = build_row(spec["row"], spec["denoiser"], spec["kwargs"], x, spec["settings"])
    for _ in range(2):
        step()
    print(peak_resident_bytes())
    return 0


def peak_resident_bytes() -> int:
    """This process's peak resident memory: Linux's VmHWM (of this process's own address space; ru_maxrss
    would also count the parent's peak, which Linux carries over a fork and exec), else ru_maxrss."""
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _grid(args) -> tuple:
    """The (model, kwargs, shape, batches) grid: the quick one or the full one, restricted by ``--only``."""
    grid = QUICK_GRID if args.quick else GRID
    if args.only:  # e.g. ["autoencoder:64,256", "dncnn:64"]
        wanted = {name: {int(b) for b in sizes.split(",")} for name, sizes in (item.split(":") for item in args.only)}
        grid = tuple((d, k, s, tuple(b for b in batches if b in wanted[d])) for d, k, s, batches in grid if d in wanted)
    return grid


def throughput_grid(args, device) -> dict:
    """Every row at every (model, batch) of the grid, interleaved; examples/s medians, fraction of non-private,
    peak memory."""
    grid = _grid(args)
    settings = {"clipping": args.clipping, "compile": args.compile, "cuda_graphs": args.cuda_graphs}
    names = ROWS + (CUDA_ROWS if device.type == "cuda" else ())
    steps, warmup, repeats = (1, 1, 2) if args.quick else (args.steps, args.warmup, args.repeats)
    out = {}
    for denoiser, kwargs, shape, batches in grid:
        for batch in batches:
            x = synthetic_images(batch, shape, device)
            rows = {name: build_row(name, denoiser, kwargs, x, settings) for name in names}
            timed = compare(rows, batch, max(1, steps * 64 // batch) if not args.quick else steps, warmup,
                            repeats, device)
            floor = timed["nonprivate_sgd"]["examples_per_second"]
            for name in names:
                per_repeat = [a / b for a, b in zip(timed[name]["examples_per_second"], floor, strict=True)]
                timed[name]["fraction_of_nonprivate"] = statistics.median(per_repeat)
                if device.type == "cpu" and not args.quick and args.peak_memory:
                    timed[name]["peak_rss_bytes"] = peak_rss(name, denoiser, kwargs, shape, batch, "cpu", settings)
            ratio = [a / b for a, b in zip(timed["sepdp"]["examples_per_second"],
                                           timed["opacus_hooks"]["examples_per_second"], strict=True)]
            arm_cost = [a / b for a, b in zip(timed["sepdp"]["examples_per_second"],
                                              timed["transdenoiser_smin_not_computed"]["examples_per_second"],
                                              strict=True)]
            plan = rows["sepdp"].arm.execution
            out[f"{denoiser} {'x'.join(map(str, shape))} batch {batch}"] = {
                "rows": timed, "sepdp_over_opacus_hooks": statistics.median(ratio),
                "transdenoiser_cost_over_sepdp": statistics.median(arm_cost),
                "sepdp_execution": plan.as_dict() if plan is not None else None,
                "num_parameters": count_parameters(build_model(denoiser, **kwargs))}
    return out


def format_table(grid: dict) -> str:
    names = list(next(iter(grid.values()))["rows"]) if grid else list(ROWS)
    lines = ["| model, batch | " + " | ".join(names) + " | sepdp / Opacus hooks | transdenoiser cost / sepdp |",
             "|---" * (len(names) + 3) + "|"]
    for key, entry in grid.items():
        cells = []
        for name in names:
            row = entry["rows"][name]
            memory = row.get("peak_memory_bytes", row.get("peak_rss_bytes"))
            mem = f", {memory / 2**20:.0f} MiB" if memory else ""
            cells.append(f"{row['median_examples_per_second']:.0f} ({row['fraction_of_nonprivate']:.2f}x{mem})")
        lines.append(f"| {key} | " + " | ".join(cells) + f" | {entry['sepdp_over_opacus_hooks']:.2f} | "
                     f"{entry['transdenoiser_cost_over_sepdp']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default: cpu)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny grid, 1 step, 2 repeats (seconds)")
    parser.add_argument("--steps", type=int, default=4,
                        help="timed steps per repeat at batch 64 (larger batches: proportionally fewer, at least 1)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per row first (default: 3)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed blocks (default: 5)")
    parser.add_argument("--clipping", choices=("auto", "ghost", "vmap"), default="auto",
                        help="our arms' clipping engine (default: auto, as training)")
    parser.add_argument("--compile", action="store_true", help="our arms with --compile")
    parser.add_argument("--cuda-graphs", choices=("auto", "off"), default="auto",
                        help="our arms' CUDA graphs (default: auto, as training; on CUDA the row "
                             "sepdp_no_cuda_graphs is always eager)")
    parser.add_argument("--only", nargs="+", default=None, metavar="MODEL:B,B",
                        help="a part of the grid, e.g. autoencoder:64,256 dncnn:64 (default: all of it)")
    parser.add_argument("--peak-memory", action=argparse.BooleanOptionalAction, default=True,
                        help="CPU: each row's peak resident memory in a fresh process (default: on)")
    parser.add_argument("--smin", action="store_true", help="also the S_min cost rows (tiny denoiser)")
    parser.add_argument("--smin-widths", default="1,2,4,8", help="tiny widths for the S_min rows")
    parser.add_argument("--smin-examples", type=int, default=4, help="examples in K for the S_min rows")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--activation-study", type=Path, default=None, metavar="CLASSIFIER_DIR",
                        help="instead: the ReLU-vs-smooth S_min study with the tiny denoiser (about 5 min CPU)")
    parser.add_argument("--objectives", nargs="+", default=None, choices=tuple(PHASES), metavar="OBJECTIVE",
                        help="instead: the sepdp step with each training objective (mse, stability, "
                             "classification, stability+mse), side by side with MSE's, as ratios")
    parser.add_argument("--peak-row", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.peak_row is not None:
        return _peak_row_main(args.peak_row)
    allocator, device = prepare_process(args.threads, args.device)
    if args.activation_study is not None:
        study = {"hardware": hardware_description(device),
                 "activation_study": activation_study(args.activation_study, ["relu", "silu", "tanh", "softplus"],
                                                      device)}
        print_result(args.out, study)
        return 0
    result = {"hardware": hardware_description(device), "allocator": allocator, "device": str(device),
              "command": "python -m benchmarks.bench_training " + " ".join(
                  argv if argv is not None else sys.argv[1:])}
    if args.objectives:
        result["objectives"] = objectives_grid(args, device)
        print_result(args.out, result)
        print(format_objectives_table(result["objectives"]), file=sys.stderr)
        return 0
    result["grid"] = throughput_grid(args, device)
    if args.smin:
        result["smin_cost"] = bench_smin([int(w) for w in args.smin_widths.split(",")], args.smin_examples, device)
    print_result(args.out, result)
    print(format_table(result["grid"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
