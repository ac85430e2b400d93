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
