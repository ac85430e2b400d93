"""PNG files of matplotlib figures, stored as palette PNGs.

The figures are line plots of a few colours on white; matplotlib writes them as 32-bit RGBA, anti-aliased edges
included. :func:`palette_png` maps each pixel to the nearest of at most 256 colours (median cut, no dither) and
keeps the alpha channel only where a pixel is not opaque, which shrinks such plots two to four times without a
visible change. Every figure of the package and its scripts goes through :func:`figure_png` or :func:`save_png`.

matplotlib and Pillow (a matplotlib dependency) are imported only inside the functions.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

PALETTE_COLOURS = 256


def palette_png(data: bytes) -> bytes:
    """The PNG ``data`` re-encoded as an optimised palette PNG of at most 256 colours (median cut, no dither;
    an image with transparent pixels keeps its alpha through a fast-octree palette). A palette PNG is returned
    as it is."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (OSError, SyntaxError) as error:
        raise ValueError(f"not a PNG image: {error}") from None
    if image.mode == "P":
        return data
    if image.mode in ("RGBA", "LA") and image.getchannel("A").getextrema()[0] < 255:
        paletted = image.convert("RGBA").quantize(PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE,
                                                  dither=Image.Dither.NONE)
    else:
        paletted = image.convert("RGB").quantize(PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT,
                                                 dither=Image.Dither.NONE)
    out = io.BytesIO()
    paletted.save(out, format="PNG", optimize=True)
    return out.getvalue()


def figure_png(fig: Any, dpi: float | None = None) -> bytes:
    """The matplotlib figure ``fig`` as palette PNG bytes (``dpi``: dots per inch; None: the figure's own)."""
    raw = io.BytesIO()
    fig.savefig(raw, format="png", **({} if dpi is None else {"dpi": dpi}))
    return palette_png(raw.getvalue())


def save_png(fig: Any, path: Path, dpi: float | None = None) -> Path:
    """Write the matplotlib figure ``fig`` to ``path`` as a palette PNG (:func:`figure_png`); return ``path``."""
    path = Path(path)
    path.write_bytes(figure_png(fig, dpi))
    return path
