"""Committed plots are palette PNGs: same picture size, at most PALETTE_COLOURS colours, smaller files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from mia.evals.plots import PALETTE_COLOURS, save_png


def _figure() -> Figure:
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for i in range(8):
        ax.plot(np.arange(20), np.sin(np.arange(20) / (i + 1)), marker="o", label=f"series {i}")
    ax.legend()
    return fig


def test_a_saved_plot_is_a_smaller_palette_png_of_the_same_size(tmp_path: Path) -> None:
    fig = _figure()
    small, full = tmp_path / "small.png", tmp_path / "full.png"
    save_png(fig, small, dpi=100)
    fig.savefig(full, format="png", dpi=100)
    with Image.open(small) as got, Image.open(full) as truecolour:
        assert got.mode == "P" and got.size == truecolour.size
        assert len(got.getcolors(maxcolors=256)) <= PALETTE_COLOURS
    assert small.stat().st_size < 0.6 * full.stat().st_size
