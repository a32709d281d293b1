"""Plots saved small: committed reports keep their figures, so each PNG is stored with a palette.

A matplotlib figure has a few flat colours plus anti-aliased edges; 128 palette colours keep it
legible at a third of the truecolour file's size (evals/results holds over a hundred plots).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image

PALETTE_COLOURS = 128


def save_png(fig: Any, path: Path, dpi: int = 110) -> None:
    """Write a matplotlib figure to ``path`` as a palette PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    with Image.open(buffer) as image:
        write_palette_png(image, path)


def write_palette_png(image: Image.Image, path: Path) -> None:
    """``image`` quantised to ``PALETTE_COLOURS`` colours (no dithering, so flat areas stay flat)."""
    palette = image.convert("RGB").quantize(colors=PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT,
                                            dither=Image.Dither.NONE)
    palette.save(path, format="PNG", optimize=True)
