"""StoBatch's certificate cost, side by side: the first layer's Laplace noise drawn by ``laplace_noise`` (in place)
against the plain out-of-place inversion it replaced (kept here as the reference), alone and inside one batch of
the certificate's noisy forward passes (input noise, hidden noise, cnn28), on the same generator seeds. Interleaved
repeats, medians; the two samplers give the same bits (asserted on every repeat).

    python -m benchmarks.bench_stobatch --repeats 5 [--batch 500] [--threads 1] [--json out.json]
    python -m benchmarks.bench_stobatch --quick      # smoke test: batch 8, one repeat
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def plain_laplace(shape, scale, generator):
    """The out-of-place inversion (six float64 buffers): the reference ``laplace_noise`` is measured against."""
    import torch

    u = torch.rand(tuple(shape), generator=generator, dtype=torch.float64) - 0.5
    magnitude = -torch.log1p(-2 * u.abs().clamp(max=0.5 - 1e-17))
    return (scale * torch.sign(u) * magnitude).to(torch.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per side (default: 5)")
    parser.add_argument("--batch", type=int, default=500, help="noisy passes per batch, as baseline-certify's "
                        "--batch (default: 500)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--quick", action="store_true", help="batch 8, one repeat (smoke test)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    for name in ("repeats", "batch", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    import torch

    from benchmarks import write_result
    from training.baselines.stobatch_mechanisms import first_layer, laplace_noise, noisy_logits
    from training.models import build_model
    from transdenoiser.runtime import hardware_description

    torch.set_num_threads(args.threads)
    batch, repeats = (8, 1) if args.quick else (args.batch, args.repeats)
    model = build_model("cnn28", in_channels=1, num_classes=10).eval()
    image = torch.rand(1, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden_shape = tuple(first_layer(model)(model.normalize(image)).shape[1:])
    shape = (batch, *hidden_shape)
    samplers = {"plain": plain_laplace, "in_place": laplace_noise}

    def certificate_batch(sampler, generator):
        x = image.expand(batch, 1, 28, 28) + sampler((batch, 1, 28, 28), 0.3, generator)
        return noisy_logits(model, x, sampler(shape, 0.6, generator)).argmax(1)

    seconds: dict[str, list[float]] = {f"{part}_{name}": [] for part in ("noise", "batch") for name in samplers}
    with torch.no_grad():
        for repeat in range(repeats):
            draws = {}
            for name, sampler in samplers.items():
                started = time.perf_counter()
                draws[name] = sampler(shape, 0.6, torch.Generator().manual_seed(repeat))
                seconds[f"noise_{name}"].append(time.perf_counter() - started)
            if not torch.equal(draws["plain"], draws["in_place"]):
                raise AssertionError("laplace_noise and the plain inversion drew different bits")
            del draws
            labels = {}
            for name, sampler in samplers.items():
                started = time.perf_counter()
                labels[name] = certificate_batch(sampler, torch.Generator().manual_seed(repeat))
                seconds[f"batch_{name}"].append(time.perf_counter() - started)
            if not torch.equal(labels["plain"], labels["in_place"]):
                raise AssertionError("the two samplers gave different votes")
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    result = {"batch": batch, "hidden_shape": list(hidden_shape), "repeats": repeats, "seconds": seconds,
              "median_seconds": medians,
              "speedup": {part: medians[f"{part}_plain"] / medians[f"{part}_in_place"] for part in ("noise", "batch")},
              "hardware": hardware_description(torch.device("cpu"))}
    print(json.dumps(result, indent=2))
    if args.json:
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
