"""The certified-accuracy figure reads well at any legend length: nothing outside the canvas, nothing on the curves."""
from __future__ import annotations

import numpy as np
import pytest

from certify.figures import cap_note, certified_accuracy_figure, legend_label, plot_certified_accuracy
from certify.rundir import CertifyRecord

pytest.importorskip("matplotlib")


def _records(seed: int, images: int = 60) -> list[CertifyRecord]:
    rng = np.random.default_rng(seed)
    radii = rng.uniform(0.0, 0.9, images)
    return [CertifyRecord(idx=i, label=i % 10, prediction=i % 10, radius=float(r), correct=bool(r > 0.05),
                          seconds=0.01, p_lower=0.9, count=900, samples=1100) for i, r in enumerate(radii)]


def _summary(arm: str, guarantees: list[dict], mode: str | None, n: int, dataset: str = "fashion-mnist") -> dict:
    settings = {"sigma": 0.25, "n": n, "alpha": 0.001, "dataset": dataset, "denoiser": "runs/x"}
    if mode:
        settings["mode"] = mode
        settings["radius"] = 0.5
    privacy = {"arm": arm, "delta": 1e-5, "guarantees": guarantees}
    return {"settings": settings, "denoiser_metadata": {"privacy": privacy}, "n": n, "alpha": 0.001,
            "max_certifiable_radius": {100000: 0.25 * 3.9, 10000: 0.25 * 3.4}.get(n, 0.25 * 2.0),
            **({"mode": mode} if mode else {})}


MMGA = [{"name": "mmga", "data_independent": False, "epsilon": {"rdp": 12.345}},
        {"name": "data_independent", "data_independent": True, "epsilon": {"rdp": float("inf")}}]
SEPDP = [{"name": "sepdp", "data_independent": True, "epsilon": {"rdp": 2.9972}}]


def longest_figure():
    """Every kind of label the product writes, at its longest: the MMGA legend, estimate and decide runs, a folder
    name added to tell equal labels apart, and two caps."""
    td = _summary("transdenoiser", MMGA, "estimate", 100000)
    sep = _summary("securesgd-prt", SEPDP, None, 10000)
    decide = _summary("transdenoiser", MMGA, "decide", 100000)
    labels = [legend_label(s) for s in (td, sep)]
    assert "(data-dependent, unproven, delta 1e-05)" in labels[0]  # the one the issue saw clipped
    curves = [(labels[0] + " (den_td_sigma025_long_folder_name)", _records(0)),
              (labels[0] + " (den_td_other_folder)", _records(1)), (labels[1], _records(2))]
    points = [(legend_label(decide), 0.5, 0.61)]
    caps = [cap_note(td), cap_note(sep)]
    return certified_accuracy_figure(curves, title="Certified accuracy against L2 radius", caps=caps, points=points)


def test_every_artist_lies_inside_the_canvas_and_no_text_sits_on_the_curves():
    fig = longest_figure()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    ax = fig.axes[0]
    (legend,) = fig.legends
    # every artist the figure draws: the axes (with ticks, labels, title, curves), the legend and each of its texts
    # and handles (get_tightbbox counts only what is drawn, e.g. not the tick positions beyond the x limit)
    artists = [*fig.get_children()[1:], *legend.get_texts(), *legend.legend_handles, ax.title, ax.xaxis.label,
               ax.yaxis.label, *ax.lines]
    for artist in artists:
        box = artist.get_tightbbox(renderer)
        if box is None or (box.width == 0 and box.height == 0):
            continue
        assert canvas.x0 - 1 <= box.x0 and box.x1 <= canvas.x1 + 1, f"{artist} runs off the canvas sideways: {box}"
        assert canvas.y0 - 1 <= box.y0 and box.y1 <= canvas.y1 + 1, f"{artist} runs off the canvas: {box}"
    assert fig.get_tightbbox(renderer).width <= fig.get_size_inches()[0] + 0.01
    legend_box = legend.get_window_extent(renderer)
    assert not legend_box.overlaps(ax.bbox), "the legend is drawn over the plot"
    assert ax.bbox.width >= 0.8 * canvas.width, "the plot is squeezed"
    assert not ax.texts, "no label is written inside the axes, over the curves"
    texts = [t.get_text() for t in legend.get_texts()]
    assert len(texts) == 6 and all(len(line) <= 72 for text in texts for line in text.split("\n"))
    assert any("largest certifiable radius" in t for t in texts)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_caps_are_dotted_lines_named_in_the_legend(tmp_path):
    sep = _summary("sepdp", SEPDP, None, 16)
    cap, text = cap_note(sep)
    fig = certified_accuracy_figure([(legend_label(sep), _records(3))], caps=[(cap, text)])
    ax = fig.axes[0]
    assert any(list(line.get_xdata()) == [cap, cap] and line.get_linestyle() == ":" for line in ax.lines)
    assert text in [t.get_text().replace("\n", " ") for t in fig.legends[0].get_texts()]
    path = plot_certified_accuracy([(legend_label(sep), _records(3))], tmp_path / "f.png", caps=[(cap, text)])
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_figures_are_saved_as_palette_pngs_that_look_the_same(tmp_path):
    """A figure is written as a palette PNG of at most 256 colours, smaller than matplotlib's RGBA PNG, and
    differs from it only on a few anti-aliased edge pixels."""
    import io

    from PIL import Image

    from transdenoiser.pngs import figure_png, palette_png

    sep = _summary("sepdp", SEPDP, None, 16)
    fig = certified_accuracy_figure([(legend_label(sep), _records(3)), ("other", _records(4))])
    raw = io.BytesIO()
    fig.savefig(raw, format="png")
    paletted = figure_png(fig)
    import matplotlib.pyplot as plt

    plt.close(fig)
    assert len(paletted) < len(raw.getvalue()) / 1.5
    assert palette_png(paletted) == paletted  # already a palette: kept as it is
    image = Image.open(io.BytesIO(paletted))
    assert image.mode == "P" and len(image.getcolors(256)) <= 256
    before = np.asarray(Image.open(raw).convert("RGB"), dtype=int)
    after = np.asarray(image.convert("RGB"), dtype=int)
    assert before.shape == after.shape
    error = np.abs(before - after).max(axis=-1)
    assert (error > 16).mean() < 0.01 and error.mean() < 1.0
    path = plot_certified_accuracy([(legend_label(sep), _records(3))], tmp_path / "f.png")
    assert Image.open(path).mode == "P"


def test_palette_png_keeps_transparency_and_refuses_what_is_not_an_image():
    import io

    from PIL import Image

    from transdenoiser.pngs import palette_png

    rgba = np.zeros((8, 8, 4), dtype=np.uint8)
    rgba[:4, :, :] = (255, 0, 0, 255)  # top half opaque red, bottom half transparent
    raw = io.BytesIO()
    Image.fromarray(rgba, mode="RGBA").save(raw, format="PNG")
    back = np.asarray(Image.open(io.BytesIO(palette_png(raw.getvalue()))).convert("RGBA"))
    assert (back[:4] == (255, 0, 0, 255)).all() and (back[4:, :, 3] == 0).all()
    with pytest.raises(ValueError, match="not a PNG image"):
        palette_png(b"\x89PNG\r\n\x1a\n broken")


def test_labels_wrap_between_clauses_where_they_fit():
    """A title or legend entry breaks at the ", " between clauses, so "sigma 0.25" is never split across lines;
    a clause longer than a line breaks at spaces."""
    from certify.figures import wrap_label

    assert wrap_label("Certified accuracy, sepdp, objective stability+mse, sigma 0.25", 60) == (
        "Certified accuracy, sepdp, objective stability+mse,\nsigma 0.25")
    assert wrap_label("Certified accuracy", 60) == "Certified accuracy"
    assert all(len(line) <= 20 for line in wrap_label("one two three four five six seven, eight", 20).split("\n"))
