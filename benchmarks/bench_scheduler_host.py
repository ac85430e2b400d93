"""The server's scheduler, host side: time per adaptive image spent outside the forward passes.

    python -m benchmarks.bench_scheduler_host --quick          # seconds: a smoke run
    python -m benchmarks.bench_scheduler_host --json runs/bench/scheduler_host.json
    python -m benchmarks.bench_scheduler_host --device-us-per-sample 1.3 --overlap-ab   # host work under device time

The API's scheduler (``serving.compute.scheduler.FairScheduler``) awaits each pass's counts, then, on its event
loop, hands the counts to the requests, reads the stopping rules and takes the next pass's jobs: the device idles
for all of that. This benchmark runs the real scheduler and the real adaptive works
(``serving.compute.engine.SequentialWork``) with a stand-in counter that evaluates no model and draws no noise:
each job's votes for class 0 are Binomial(samples, pA) from a generator keyed by the job (its image's pA, where
its piece starts, its offset and size), so a run's answers depend on the requests alone. The scheduler's wall
time minus the counter's is its host time (passes one after another: ``overlap`` off).

``--device-us-per-sample`` makes a pass of the stand-in counter last at least that long per sample (it sleeps
for what is left after drawing the votes), as a device computing the pass would keep the counter's thread waiting
with the host free (1.3: the H200's fixed-n rate for the MNIST pipeline,
761k samples per second). ``--overlap-ab`` then times the scheduler with ``overlap`` off and on (the host hands a
pass's counts out while the next pass computes, and each image's next block is drawn ahead, as the server does),
interleaved: wall time per image, and how much of it the stand-in
device was busy (its sleep over the wall time). With ``--pipelined`` the side with ``overlap`` on runs a pipelined
stand-in, as the server does on CUDA: each pass is queued on the stand-in device, which computes queued passes one
after another, before the last one's counts are read. A stand-in device, not a GPU: the figure says what the
scheduler's structure allows, with this machine's host.

``--client-probe`` gives each request the disconnection probe the scheduler looks at before every pass: by
default none; ``watch`` is the server's (``serving.disconnect.DisconnectWatch``), ``starlette`` Starlette's
``Request.is_disconnected`` (one event-loop turn per look), each over an ASGI ``receive`` that waits as uvicorn's
does once the body has been read.

``--requests`` concurrent requests of ``--images`` images each (pA alternating ``--p-high`` and ``--p-low``),
all decide at ``--radius``, all estimate, or all fixed-n certify (``--mode``), budget (or n) ``--n-max``; the
GPU's scheduler settings (passes shared, ``--pass-samples`` per pass, ``--round-samples`` per request and round)
and block plan. Repeated ``--repeats`` times, medians; the answers must be the same in every repeat (checked) and
are written with a digest, so runs of two versions of the library can be compared.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import statistics
import sys
import time
import weakref
from pathlib import Path

import numpy as np

from benchmarks import write_result
from transdenoiser.argtypes import positive_float, positive_int

NUM_CLASSES = 10


class StandInCounter:
    """Counts without a model: a job's votes for class 0 are Binomial(samples, pA of its image), the rest class 1,
    drawn from a generator keyed by (image seed, the piece's place in the image's stream, the job's offset and
    size), or for a fixed-n job by (its seed, its size): the same votes for the same job whichever pass computes
    it."""

    def __init__(self, device_s_per_sample: float = 0.0):
        self.device_s_per_sample = device_s_per_sample
        self.device_seconds = 0.0  # slept: the stand-in device's compute time
        self.seconds = 0.0
        self.samples = 0
        self._pieces: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # piece -> its place in its stream
        self._next_piece: dict[int, int] = {}

    pipelined = False  # a plain counter; ``QueuedStandIn`` is the pipelined one

    def __call__(self, jobs) -> list[np.ndarray]:
        started = time.perf_counter()
        results = self.votes(jobs)
        if self.device_s_per_sample:
            # the stand-in device computes from the pass's start, while this thread draws the votes (as a GPU
            # computes while its host thread launches the kernels): the pass ends when both are done
            device = self.device_s_per_sample * sum(job.num_samples for job in jobs)
            remaining = started + device - time.perf_counter()
            if remaining > 0:
                time.sleep(remaining)
            self.device_seconds += device
        self.seconds += time.perf_counter() - started
        return results

    def votes(self, jobs) -> list[np.ndarray]:
        results = []
        for job in jobs:
            if hasattr(job, "piece"):  # an adaptive job: keyed by its place in its image's stream
                piece = job.piece
                seed = int(piece.generator.initial_seed())
                if piece not in self._pieces:  # an image's pieces are handed out in stream order
                    self._pieces[piece] = self._next_piece.get(seed, 0)
                    self._next_piece[seed] = self._pieces[piece] + 1
                image, key = piece.image, [seed, self._pieces[piece], job.start, job.num_samples]
            else:  # a fixed-n job (NoiseJob): keyed by its seed
                image, key = job.image, [job.seed, job.num_samples]
            votes = np.random.default_rng(key).binomial(job.num_samples, float(image.flatten()[0]))
            counts = np.zeros(NUM_CLASSES, dtype=np.int64)
            counts[0], counts[1] = votes, job.num_samples - votes
            results.append(counts)
            self.samples += job.num_samples
        return results


class QueuedStandIn(StandInCounter):
    """The stand-in as a pipelined counter (``VoteCounter`` on CUDA): ``launch`` draws the votes and queues the
    pass on the stand-in device, which computes queued passes one after another from when each is launched;
    ``collect`` waits until the device has finished that pass."""

    pipelined = True

    def __init__(self, device_s_per_sample: float = 0.0):
        super().__init__(device_s_per_sample)
        self._device_free_at = 0.0

    def launch(self, jobs):
        started = time.perf_counter()
        results = self.votes(jobs)
        device = self.device_s_per_sample * sum(job.num_samples for job in jobs)
        done_at = max(self._device_free_at, started) + device
        self._device_free_at = done_at
        self.device_seconds += device
        self.seconds += time.perf_counter() - started
        return results, done_at

    def collect(self, launched):
        results, done_at = launched
        started = time.perf_counter()
        if done_at > started:
            time.sleep(done_at - started)
        self.seconds += time.perf_counter() - started
        return results


def client_probe(kind: str):
    """The disconnection probe a request carries: none, or the server's, over an ASGI ``receive`` that waits as
    uvicorn's does once the body has been read (until the client goes: never, here)."""
    if kind == "none":
        return None
    from starlette.requests import Request

    never = asyncio.Event()

    async def receive():
        await never.wait()
        return {"type": "http.disconnect"}

    request = Request({"type": "http", "method": "POST", "headers": [], "path": "/predict"}, receive)
    if kind == "starlette":
        return request.is_disconnected
    from serving.disconnect import DisconnectWatch
    return DisconnectWatch(request.receive)


def run_once(args, rule, p_values: np.ndarray, overlap: bool = False, seed_offset: int = 0) -> dict:
    import torch

    from serving.compute.engine import CertifyWork, SequentialWork
    from serving.compute.scheduler import FairScheduler

    counter = (QueuedStandIn if overlap and args.pipelined else StandInCounter)(args.device_us_per_sample * 1e-6)
    scheduler = FairScheduler(counter, args.round_samples, args.pass_samples, True, args.requests + 1,
                              overlap=overlap)
    works = []
    for request in range(args.requests):
        p = p_values[request * args.images:(request + 1) * args.images]
        images = torch.as_tensor(p, dtype=torch.float32)[:, None, None, None].expand(-1, 1, 28, 28).contiguous()
        seeds = [seed_offset + request * args.images + i for i in range(args.images)]
        if args.mode == "certify":  # fixed n: n_max estimation samples per image, jobs of chunk_samples
            works.append(CertifyWork(images, seeds, args.n0, args.n_max, args.alpha, args.sigma, NUM_CLASSES,
                                     args.chunk_samples))
            continue
        works.append(SequentialWork(args.mode, images, seeds, args.n0, rule, args.sigma, NUM_CLASSES,
                                    args.chunk_samples, lambda seed: torch.Generator().manual_seed(seed),
                                    device="cuda", draw_ahead=overlap))

    async def one(work):
        probe = client_probe(args.client_probe)
        try:
            return await scheduler.run(work, 3600, 10**12, probe)
        finally:
            if hasattr(probe, "close"):
                probe.close()  # as the server does when a request's computation ends

    async def run():
        return await asyncio.gather(*(one(work) for work in works))

    started = time.perf_counter()
    results = asyncio.run(run())
    wall = time.perf_counter() - started
    answers = [(c.prediction, getattr(c, "outcome", "certify"), c.n, c.count, float(c.p_lower))
               for result in results for c in result]
    return {"wall_s": wall, "counter_s": counter.seconds, "host_s": wall - counter.seconds,
            "device_s": counter.device_seconds,
            "samples": counter.samples, "passes": scheduler.stats.passes, "answers": answers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_scheduler_host", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("decide", "estimate", "certify"), default="estimate",
                        help="the requests' kind; certify: fixed n = --n-max, the server's jobs of --chunk-samples")
    parser.add_argument("--requests", type=positive_int, default=32, help="concurrent requests")
    parser.add_argument("--images", type=positive_int, default=1, help="images per request")
    parser.add_argument("--p-high", type=float, default=0.995, help="pA of every other image")
    parser.add_argument("--p-low", type=float, default=0.98, help="pA of the others")
    parser.add_argument("--sigma", type=positive_float, default=0.25)
    parser.add_argument("--radius", type=positive_float, default=0.5, help="decide mode's radius")
    parser.add_argument("--n-max", type=positive_int, default=10_000, help="the adaptive budget")
    parser.add_argument("--n0", type=positive_int, default=100)
    parser.add_argument("--alpha", type=positive_float, default=0.001)
    parser.add_argument("--pass-samples", type=positive_int, default=1000, help="samples per shared pass "
                        "(the server's batch_size)")
    parser.add_argument("--round-samples", type=positive_int, default=200, help="samples per request and round "
                        "(the server's round_samples on a GPU)")
    parser.add_argument("--chunk-samples", type=positive_int, default=1000)
    parser.add_argument("--device-us-per-sample", type=float, default=0.0,
                        help="stand-in device time per sample, microseconds (the counter sleeps)")
    parser.add_argument("--overlap-ab", action="store_true", help="time overlap off and on, interleaved")
    parser.add_argument("--pipelined", action="store_true", help="with overlap on, a pipelined stand-in (as "
                        "VoteCounter on CUDA): each pass queued on the stand-in device before the last is collected")
    parser.add_argument("--warm-rule", action="store_true", help="each run starts with the stopping rule as one "
                        "untimed run of the same requests on other seeds left it (the server keeps one rule per "
                        "setting, with its boundaries and bounds); by default each run makes a new rule")
    parser.add_argument("--client-probe", choices=("none", "starlette", "watch"), default="none",
                        help="each request's disconnection probe: none, Starlette's Request.is_disconnected, or "
                        "serving.disconnect.DisconnectWatch")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 requests, budget 2,000, one repeat (a smoke run)")
    parser.add_argument("--json", type=Path, default=Path("runs/bench/scheduler_host.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.n_max, args.repeats = 4, 2000, 1
    if not (0 <= args.p_low <= 1 and 0 <= args.p_high <= 1):
        parser.error("--p-low and --p-high must lie in [0, 1]")
    if args.device_us_per_sample < 0:
        parser.error("--device-us-per-sample must be >= 0")
    import torch

    from certify.core import sequential_rule
    from transdenoiser.runtime import hardware_description

    def new_rule():
        if args.mode == "certify":
            return None
        return sequential_rule(args.mode, args.sigma, args.n_max, args.alpha,
                               radius=args.radius if args.mode == "decide" else None)

    count = args.requests * args.images
    p_values = np.where(np.arange(count) % 2 == 0, args.p_high, args.p_low)
    warmed = None
    if args.warm_rule:  # other images of the same pA: the rule as a server's would be after earlier requests
        warmed = new_rule()
        run_once(args, warmed, p_values, seed_offset=10 ** 6)

    def make_rule():  # by default a new rule for every run: each starts with nothing kept
        return copy.deepcopy(warmed) if warmed is not None else new_rule()

    sides = (False, True) if args.overlap_ab else (False,)
    by_side: dict[bool, list[dict]] = {side: [] for side in sides}
    for _ in range(args.repeats):
        for side in sides:
            by_side[side].append(run_once(args, make_rule(), p_values, overlap=side))
    runs = by_side[False]
    everything = [run for side in sides for run in by_side[side]]
    same = all(run["answers"] == runs[0]["answers"] for run in everything)
    digest = hashlib.sha256(repr(runs[0]["answers"]).encode()).hexdigest()[:16]
    host = statistics.median(run["host_s"] for run in runs)
    command = "python -m benchmarks.bench_scheduler_host " + " ".join(sys.argv[1:] if argv is None else argv)
    record = {"command": command,
              "hardware": hardware_description(torch.device("cpu")),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "host_ms_per_image": host / count * 1e3, "host_s": [run["host_s"] for run in runs],
              "counter_s": [run["counter_s"] for run in runs], "passes": runs[0]["passes"],
              "samples": runs[0]["samples"], "mean_samples_used": float(np.mean([a[2] for a in runs[0]["answers"]])),
              "answers_same_every_repeat": same, "answers_digest": digest, "answers": runs[0]["answers"]}
    print(f"{args.requests} {args.mode} requests of {args.images} image(s), budget {args.n_max}: host "
          f"{record['host_ms_per_image']:.2f} ms per image (median of {args.repeats}), {record['passes']} passes, "
          f"{record['samples']} samples; answers {digest}, the same every repeat: {same}")
    if args.overlap_ab:
        record["overlap_ab"] = {}
        for side in sides:
            wall = statistics.median(run["wall_s"] for run in by_side[side])
            busy = statistics.median(run["device_s"] / run["wall_s"] for run in by_side[side])
            record["overlap_ab"]["on" if side else "off"] = {
                "wall_ms_per_image": wall / count * 1e3, "device_busy_share": busy,
                "wall_s": [run["wall_s"] for run in by_side[side]], "passes": [run["passes"] for run in by_side[side]]}
            print(f"overlap {'on ' if side else 'off'}: {wall / count * 1e3:.2f} ms per image, the stand-in device "
                  f"busy {busy:.0%} of the time ({args.device_us_per_sample:g} us per sample)")
    write_result(args.json, record)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
