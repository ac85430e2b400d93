"""How small a private split `transdenoiser train` works with at its defaults: image folders of growing size.

    .venv/bin/python scripts/measure_private_size.py --classifier runs/classifier --out runs/private_size \
        --sizes 220 440 880 1760 3500 --repeats 2

Each folder (``--classes`` digit classes, the same number of PNGs each) is drawn from mnist10k's private and test
splits, which the classifier (``pretrain`` on mnist10k's public split) never saw; as an image folder it splits per
class into public 50%, private 30% and test 20% (docs/DATA.md). On each, README's command with the defaults
(``train --arm sepdp --target-epsilon 1 --sigma 0.25 --dataset imagefolder --data-root DIR``: batch 64, 10
epochs, the paper's autoencoder, SGD lr 0.1) is run ``--repeats`` times (the DP noise is secret: every run differs),
and the table gives the frozen classifier's accuracy on the folder's test images + N(0, 0.25^2) with the denoiser
and without it, and whether that counts as worse (transdenoiser.records.VersusClassifier, the rule `bundle`
applies). A run refused (a private split smaller than the batch) is a row too.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def write_folder(root: Path, images: np.ndarray, labels: np.ndarray, classes: int, per_class: int, seed: int) -> None:
    """``per_class`` PNGs of each of the first ``classes`` digits under ``root/<digit>/`` (a seeded choice)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for digit in range(classes):
        (root / str(digit)).mkdir(parents=True)
        picks = rng.choice(np.flatnonzero(labels == digit), per_class, replace=False)
        for i, index in enumerate(picks):
            pixels = np.round(images[index, 0] * 255).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(root / str(digit) / f"{i}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classifier", type=Path, required=True, help="a cnn28 pretrained on mnist10k")
    parser.add_argument("--out", type=Path, required=True, help="folder for the image folders, runs and table")
    parser.add_argument("--sizes", type=int, nargs="+", default=[220, 440, 880, 1760, 3500],
                        help="images per folder (all classes together)")
    parser.add_argument("--classes", type=int, default=10, help="digit classes per folder (default 10)")
    parser.add_argument("--repeats", type=int, default=2, help="training runs per folder (default 2)")
    args = parser.parse_args(argv)
    from training.datasets import load_dataset
    from transdenoiser.checks import worse_than_classifier
    from transdenoiser.cli import main as cli
    from transdenoiser.records import CheckpointMetadata

    source = load_dataset("mnist10k")
    unseen = [source.private.tensors(), source.test.tensors()]  # splits the mnist10k classifier never trained on
    images = np.concatenate([x.numpy() for x, _ in unseen])
    labels = np.concatenate([y.numpy() for _, y in unseen])
    rows = []
    for size in args.sizes:
        folder = args.out / f"folder_{size}"
        if not folder.exists():
            write_folder(folder, images, labels, args.classes, size // args.classes, seed=size)
        for repeat in range(args.repeats):
            run = args.out / f"train_{size}_{repeat}"
            argv = ["train", "--arm", "sepdp", "--target-epsilon", "1", "--sigma", "0.25", "--dataset", "imagefolder",
                    "--data-root", str(folder), "--classifier", str(args.classifier), "--out", str(run)]
            started, err = time.perf_counter(), io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                code = cli(argv)
            row = {"images": size, "repeat": repeat, "exit": code, "seconds": round(time.perf_counter() - started, 1)}
            if code == 0:
                record = CheckpointMetadata.from_json(json.loads((run / "metadata.json").read_text()))
                versus = record.versus_classifier
                row.update(private=record.dataset.train_examples, test=versus.images, steps=versus.steps,
                           with_denoiser=versus.with_denoiser, without=versus.without_denoiser,
                           margin=round(versus.margin, 4), worse=worse_than_classifier(record) is not None)
            else:
                row["error"] = err.getvalue().strip().splitlines()[-1]
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "private_size.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n| folder | private N | test images | steps | with denoiser | without | margin | worse |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["exit"] != 0:
            print(f"| {row['images']} | | | | refused: {row['error']} | | | |")
            continue
        print(f"| {row['images']} | {row['private']} | {row['test']} | {row['steps']} | {row['with_denoiser']:.4f} | "
              f"{row['without']:.4f} | {row['margin']:.4f} | {'**worse**' if row['worse'] else 'no'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
