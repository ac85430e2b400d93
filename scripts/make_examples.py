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
    # (1, 28, 28) in [0, 1]: each value the float32 the server decodes the PNG's pixel to (k / 255 in float32), written
    # in full, so the JSON request is bit for bit the PNG's image and gets the PNG's certificate
    image = (pixels.astype(np.float32) / np.float32(255.0))[None].astype(np.float64).tolist()
    (out / "digit7.json").write_text(json.dumps({"images": [image]}) + "\n")
    print(f"wrote {out}/digit7.png and digit7.json (mnist10k test index {index}, label 7)")


if __name__ == "__main__":
    main()
