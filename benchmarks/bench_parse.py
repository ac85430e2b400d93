"""What reading a JSON request body costs the server: its two decoders side by side, per body, in one process.

    python -m benchmarks.bench_parse [--repeats 50] [--out runs/bench/parse.json]
    python -m benchmarks.bench_parse --quick     # 3 repeats: a smoke run

Bodies: bench_overload's small request (1 mnist10k image, n = 100), its large request (16 images, n = 1,000) and
its burst body (one image padded with spaces to just under 2 MiB). Per body, the median over ``--repeats`` of:
decoding by the standard library (``json.loads`` as the strict path calls it) and by orjson; converting the
decoded images to float64 arrays strictly (``json_image_array``, every cell's type checked) and directly (NumPy);
``fast_payload``'s checks with orjson's decoding; and the whole of ``parse_json`` (what the server runs: the fast
path where it applies) against ``parse_json_strict`` plus the depth check (the standard library's path alone). All
of it holds Python's interpreter lock, so during a burst of bodies each millisecond here is one in which the event
loop and the forward passes' Python steps wait. One thread, nothing else timed alongside.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from transdenoiser.argtypes import positive_int


def _median_ms(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def body_row(body: bytes, shape: tuple[int, int, int], repeats: int) -> dict:
    """The figures of one body (module docstring)."""
    import numpy as np
    import orjson

    from serving.config import ServingConfig
    from serving.validation import (
        _JSON_STRING,
        _json_int,
        _unique_keys,
        fast_payload,
        json_depth,
        json_image_array,
        parse_json,
        parse_json_strict,
    )

    config = ServingConfig(sigma=0.25)
    text = body.decode()
    emptied = _JSON_STRING.sub(b'""', body)
    decoded = json.loads(text)
    if fast_payload(body, emptied) is None:
        raise RuntimeError("a benchmark body does not take the fast path")
    return {
        "bytes": len(body),
        "decode_json_ms": _median_ms(lambda: json.loads(text, parse_int=_json_int, object_pairs_hook=_unique_keys),
                                     repeats),
        "decode_orjson_ms": _median_ms(lambda: orjson.loads(body), repeats),
        "convert_strict_ms": _median_ms(lambda: [json_image_array(image, index, shape)
                                                 for index, image in enumerate(decoded["images"])], repeats),
        "convert_direct_ms": _median_ms(lambda: [np.array(image, dtype=np.float64) for image in decoded["images"]],
                                        repeats),
        "fast_payload_ms": _median_ms(lambda: fast_payload(body, emptied), repeats),
        "parse_json_ms": _median_ms(lambda: parse_json(body, config, shape), repeats),
        "strict_path_ms": _median_ms(lambda: (json_depth(body), parse_json_strict(text, config, shape)), repeats),
    }


def measure(repeats: int) -> dict:
    from benchmarks.bench_overload import burst_body, large_body, small_body
    from benchmarks.serving_common import mnist_test_images

    images = mnist_test_images()
    shape = tuple(images.shape[1:])
    bodies = {"small (1 image)": small_body(images), "large (16 images)": large_body(images, 0, 1000),
              "burst (1 image, 2 MB of spaces)": burst_body(2_093_050)}
    return {name: body_row(body, shape, repeats) for name, body in bodies.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_parse", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=positive_int, default=50, help="timings per figure (their median)")
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--out", default="runs/bench/parse.json", help="JSON results file")
    args = parser.parse_args(argv)
    from benchmarks.serving_common import run_record, save_result

    record = run_record(argv, "benchmarks.bench_parse")
    rows = measure(3 if args.quick else args.repeats)
    for name, row in rows.items():
        print(f"{name}, {row['bytes']} bytes: decode json {row['decode_json_ms']:.3f} ms / orjson "
              f"{row['decode_orjson_ms']:.3f} ms; convert strict {row['convert_strict_ms']:.3f} ms / direct "
              f"{row['convert_direct_ms']:.3f} ms; fast_payload {row['fast_payload_ms']:.3f} ms; parse_json "
              f"{row['parse_json_ms']:.3f} ms against the strict path {row['strict_path_ms']:.3f} ms")
    save_result(args.out, {**record, "repeats": 3 if args.quick else args.repeats, "bodies": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
