"""StoBatch's own certificate (training.baselines.stobatch.certified_robustness) on a split of a data set, as a
table of certified accuracy by radius, written to a JSON file.

    python scripts/stobatch_certificate.py --model runs/stobatch --skip 20 --n0 100 --n 1000 --out cert.json
    python scripts/stobatch_certificate.py --model runs/stobatch --quick --out cert.json   # 4 images, n 20

Radii: L2 in [0,1]-pixel units (the certificate is an L1 radius; L2 = L1 / sqrt(d)). Abstentions count as wrong.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RADII_L2 = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a checkpoint written by --arm stobatch")
    parser.add_argument("--dataset", default=None, help="data set (default: the model's)")
    parser.add_argument("--split", default="test", choices=("public", "private", "test"))
    parser.add_argument("--skip", type=int, default=20, help="every SKIP-th image (default: 20)")
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--alpha", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 images, n0 10, n 20 (a smoke test)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    from training.baselines.stobatch import ABSTAIN, certified_robustness
    from training.checkpoint import read_metadata
    from training.datasets import load_dataset
    from transdenoiser.errors import UserError
    from transdenoiser.runtime import hardware_description

    try:
        meta = read_metadata(args.model)
        data = meta.get("dataset") or {}
        dataset = load_dataset(args.dataset or data.get("name", "mnist10k"), None, data.get("split_seed", 0))
        split = dataset.split(args.split)
        indices = np.arange(0, len(split), args.skip)[:4 if args.quick else None]
        n0, n = (10, 20) if args.quick else (args.n0, args.n)
        images, labels = split.subset(indices).tensors("cpu")
        started = time.perf_counter()
        certificates = certified_robustness(args.model, images, n0=n0, n=n, alpha=args.alpha, seed=args.seed)
    except UserError as exc:
        print(f"stobatch_certificate: error: {exc}", file=sys.stderr)
        return 2
    correct = [c.prediction != ABSTAIN and c.prediction == int(y) for c, y in zip(certificates, labels, strict=True)]
    table = {f"{r:g}": float(np.mean([ok and (c.radius_l2 > r if r > 0 else True)
                                      for ok, c in zip(correct, certificates, strict=True)]))
             for r in RADII_L2}
    record = {
        "model": str(args.model), "dataset": dataset.name, "split": args.split, "indices": indices.tolist(),
        "n0": n0, "n": n, "alpha": args.alpha, "seed": args.seed,
        "certified_accuracy_l2": table,
        "abstain_rate": float(np.mean([c.prediction == ABSTAIN for c in certificates])),
        "median_radius_l2": float(np.median([c.radius_l2 for c in certificates])),
        "rows": [{"index": int(i), "label": int(y), **c.__dict__}
                 for i, y, c in zip(indices, labels, certificates, strict=True)],
        "seconds": time.perf_counter() - started, "hardware": hardware_description(torch.device("cpu")),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"{len(certificates)} images; abstained {100 * record['abstain_rate']:.1f}%; certified accuracy by L2 "
          "radius: " + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in table.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
