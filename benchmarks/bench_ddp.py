"""Private training across processes (torchrun's process group, gloo on CPU): examples/s for 1 and 2 ranks.

    python -m benchmarks.bench_ddp [--arm sepdp] [--denoiser autoencoder] [--batch-size 64] [--steps 20]
                                   [--warmup 5] [--repeats 3] [--quick] [--out FILE]

Each block launches the processes of one configuration (spawned, like torchrun's workers: RANK, WORLD_SIZE,
MASTER_ADDR/PORT; one process runs in this one), builds the model and arm as ``train_denoiser`` does, runs
--warmup untimed steps, then times --steps steps of the training loop (shared Poisson sample on mnist10k's
private split, this rank's share of the per-example gradients, the one all-reduce, noise, SGD step).
Process start-up is not timed. Configurations: 1 process with 1 torch thread, 1 process with 2 threads,
2 processes with 1 thread each; blocks alternate (order rotated every repeat) and ratios are medians of
per-repeat ratios, so a busy neighbour slows all alike.
Examples/s counts the examples of the Poisson batches actually drawn (the same batches in every configuration).
Also reported: bytes all-reduced per step (the bucket) and the seconds spent in the all-reduce.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import print_result

CONFIGURATIONS = {"1 process x 1 thread": (1, 1), "1 process x 2 threads": (1, 2), "2 processes x 1 thread": (2, 1)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, threads: int, port: int, spec: dict, out: str) -> None:
    if world_size > 1:  # a spawned process of its own, as torchrun's workers are
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(threads)
    from transdenoiser.runtime import keep_freed_memory

    keep_freed_memory()  # as the CLI does in every rank (transdenoiser.cli)
    from training.arms import ARM_CLASSES
    from training.datasets import load_dataset
    from training.distributed import RankGroup, close, rank_group_from_environment
    from training.models import build_model
    from training.privacy.dp import PoissonSampler
    from training.train_config import TrainConfig

    device = torch.device("cpu")
    group = rank_group_from_environment(device) if world_size > 1 else RankGroup(device=device)
    x_train, _ = load_dataset("mnist10k").private.tensors(device)
    config = TrainConfig(arm=spec["arm"], denoiser=spec["denoiser"], denoiser_kwargs=spec["denoiser_kwargs"],
                         batch_size=spec["batch_size"], max_smin_dim=spec["max_smin_dim"])
    torch.manual_seed(0)
    model = build_model(config.denoiser, in_channels=1, **config.denoiser_kwargs)
    arm = ARM_CLASSES[config.arm](model, config, 2.0, float(config.batch_size), 1000, group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sampler = PoissonSampler(len(x_train), config.batch_size / len(x_train))
    generator = torch.Generator().manual_seed(0)

    def step() -> int:
        index = sampler.sample(generator)
        grads, _ = arm.gradient(x_train[index], generator)
        for name, p in model.named_parameters():
            p.grad = grads[name]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return len(index)

    for _ in range(spec["warmup"]):
        step()
    group.barrier()
    calls_before, seconds_before = group.stats.all_reduce_calls, group.stats.all_reduce_seconds
    started = time.perf_counter()
    examples = sum(step() for _ in range(spec["steps"]))
    group.barrier()
    elapsed = time.perf_counter() - started
    if rank == 0:
        calls = group.stats.all_reduce_calls - calls_before
        Path(out).write_text(json.dumps({
            "seconds": elapsed, "examples": examples, "examples_per_second": examples / elapsed,
            "all_reduce_calls": calls, "all_reduce_seconds": group.stats.all_reduce_seconds - seconds_before,
            "bytes_per_all_reduce": group.stats.all_reduce_bytes // max(1, group.stats.all_reduce_calls),
            "num_parameters": sum(p.numel() for p in model.parameters())}))
    close(group)


def run_block(world_size: int, threads: int, spec: dict) -> dict:
    """Launch one configuration's processes (one process: this one) and return rank 0's timing."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank0.json")
        if world_size == 1:
            before = torch.get_num_threads()
            try:
                _worker(0, 1, threads, 0, spec, out)
            finally:
                torch.set_num_threads(before)
        else:
            mp.start_processes(_worker, args=(world_size, threads, _free_port(), spec, out), nprocs=world_size,
                               join=True, start_method="spawn")
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", default="sepdp", choices=("nodp", "sepdp", "transdenoiser"))
    parser.add_argument("--denoiser", default="autoencoder", help="denoiser (default: the paper's autoencoder)")
    parser.add_argument("--batch-size", type=int, default=64, help="expected Poisson batch size B (default: 64)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per block (default: 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per block first (default: 5)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of blocks (default: 3)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: tiny denoiser (width 2), B 16, 2 steps, 1 repeat, 1 and 2 processes only")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    from transdenoiser.runtime import hardware_description

    spec = {"arm": args.arm, "denoiser": args.denoiser, "denoiser_kwargs": {}, "batch_size": args.batch_size,
            "steps": args.steps, "warmup": args.warmup, "max_smin_dim": 4096}
    configurations = dict(CONFIGURATIONS)
    if args.quick:
        spec.update(denoiser="tiny", denoiser_kwargs={"width": 2}, batch_size=16, steps=2, warmup=1)
        args.repeats = 1
        configurations = {"1 process x 1 thread": (1, 1), "2 processes x 1 thread": (2, 1)}
    names = list(configurations)
    rows: dict[str, list[dict]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            rows[name].append(run_block(*configurations[name], spec))
    result = {
        "command": "python -m benchmarks.bench_ddp " + " ".join(argv if argv is not None else sys.argv[1:]),
        "hardware": hardware_description(torch.device("cpu")), "backend": "gloo", "spec": spec,
        "load_average_1min_at_end": os.getloadavg()[0],
        "num_parameters": rows[names[0]][0]["num_parameters"],
        "configurations": {name: {"examples_per_second": [r["examples_per_second"] for r in rows[name]],
                                  "median_examples_per_second": statistics.median(
                                      r["examples_per_second"] for r in rows[name]),
                                  "all_reduce_calls_per_step": [r["all_reduce_calls"] / spec["steps"]
                                                                for r in rows[name]],
                                  "bytes_per_all_reduce": rows[name][0]["bytes_per_all_reduce"],
                                  "all_reduce_seconds_per_step": statistics.median(
                                      r["all_reduce_seconds"] / spec["steps"] for r in rows[name])}
                           for name in names},
    }
    two, one = "2 processes x 1 thread", "1 process x 1 thread"
    result["two_processes_over_one_process_one_thread"] = statistics.median(
        a["examples_per_second"] / b["examples_per_second"] for a, b in zip(rows[two], rows[one], strict=True))
    if "1 process x 2 threads" in rows:
        result["two_processes_over_one_process_two_threads"] = statistics.median(
            a["examples_per_second"] / b["examples_per_second"]
            for a, b in zip(rows[two], rows["1 process x 2 threads"], strict=True))
    print_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
