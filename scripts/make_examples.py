"""Write docs/examples/digit7.png and digit7.json: the first '7' of mnist10k's test split, for the curl examples."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from training.datasets import load_dataset


def main() -> None:
    out = Path("docs/examples")
    out.mkdir(parents=True, exist_ok=True)
    test = load_dataset("mnist10k").test
    index = int(np.flatnonzero(test.labels == 7)[0])
    pixels = test.images[index, 0]  # uint8 (28, 28)
    Image.fromarray(pixels, mode="L").save(out / "digit7.png")
    image = (pixels.astype(np.float64) / 255.0).round(6)[None].tolist()  # (1, 28, 28), pixels in [0, 1]
    (out / "digit7.json").write_text(json.dumps({"images": [image]}) + "\n")
    print(f"wrote {out}/digit7.png and digit7.json (mnist10k test index {index}, label 7)")


if __name__ == "__main__":
    main()
