"""Contact sheets: one poster per job on a grid, each labelled with its axis values. Pure.

    +-----------+-----------+-----------+
    |  poster   |  poster   |  (failed) |   a job without a poster gets a grey tile
    |           |           |  reason   |   saying its state
    | seed=1    | seed=2    | seed=3    |   one label line per swept axis
    | steps=20  | steps=20  | steps=20  |
    +-----------+-----------+-----------+

Columns default to the number of values of the last axis (the one that varies
fastest in a sweep's order), so a two-axis sweep reads as an X/Y grid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

BACKGROUND = (24, 24, 24)
MISSING = (64, 64, 64)
TEXT = (235, 235, 235)
PAD = 4  # pixels around each tile and between label lines
MIN_CELL_W = 96  # a label needs some width even under a tiny poster
AUTO_COLUMNS_MAX = 12


@dataclass
class Tile:
    """One job on the sheet: its poster (H, W, 3) uint8, or None and a note (its state)."""

    labels: list[str]
    image: np.ndarray | None = None
    note: list[str] = field(default_factory=list)


def axis_labels(values: Mapping[str, Any], axes: Sequence[str], width_chars: int = 40) -> list[str]:
    """'name=value' for each swept axis, shortened to width_chars (long prompts)."""
    out = []
    for name in axes:
        text = f"{name}={values.get(name)}"
        out.append(text if len(text) <= width_chars else text[: width_chars - 3] + "...")
    return out


def auto_columns(n: int, axis_sizes: Sequence[int]) -> int:
    """Columns for n tiles: the last axis' size when that makes a sensible grid, else ~sqrt(n)."""
    if n <= 0:
        return 1
    if axis_sizes and 1 < axis_sizes[-1] <= AUTO_COLUMNS_MAX:
        return min(axis_sizes[-1], n)
    return max(1, math.ceil(math.sqrt(n)))


def _font() -> ImageFont.ImageFont:
    return ImageFont.load_default()


def _line_height(font) -> int:
    box = font.getbbox("Ag=|")
    return int(box[3] - box[1]) + PAD


def _fit(img: np.ndarray, max_side: int) -> Image.Image:
    im = Image.fromarray(np.ascontiguousarray(img, dtype=np.uint8), "RGB")
    scale = min(1.0, max_side / max(im.width, im.height))
    if scale < 1.0:
        im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))), Image.BILINEAR)
    return im


def _clip(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..."


def contact_sheet(tiles: Sequence[Tile], columns: int = 0, max_side: int = 256,
                  axis_sizes: Sequence[int] = (), title: str | None = None) -> np.ndarray:
    """The sheet as (H, W, 3) uint8. Cells share one size: the largest scaled poster
    (posters of different sizes are centred), with room for the longest label list.
    """
    if max_side < 1:
        raise ValueError(f"max_side={max_side}: must be at least 1 pixel")
    n = max(1, len(tiles))
    cols = columns if columns > 0 else auto_columns(len(tiles), axis_sizes)
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    font = _font()
    lh = _line_height(font)
    fitted = [(_fit(t.image, max_side) if t.image is not None else None) for t in tiles]
    img_w = max([im.width for im in fitted if im is not None] or [min(max_side, 128)])
    img_h = max([im.height for im in fitted if im is not None] or [min(max_side, 128)])
    n_lines = max([len(t.labels) for t in tiles] or [0])
    cell_w = max(img_w, MIN_CELL_W) + 2 * PAD
    cell_h = img_h + n_lines * lh + 2 * PAD
    top = lh + PAD if title else 0
    sheet = Image.new("RGB", (cols * cell_w, top + rows * cell_h), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    if title:
        draw.text((PAD, PAD // 2), _clip(draw, title, font, sheet.width - 2 * PAD), fill=TEXT, font=font)
    for i, tile in enumerate(tiles):
        x0 = (i % cols) * cell_w + PAD
        y0 = top + (i // cols) * cell_h + PAD
        inner_w = cell_w - 2 * PAD
        im = fitted[i]
        if im is not None:
            sheet.paste(im, (x0 + (inner_w - im.width) // 2, y0 + (img_h - im.height) // 2))
        else:
            draw.rectangle((x0, y0, x0 + inner_w - 1, y0 + img_h - 1), fill=MISSING)
            for k, line in enumerate(tile.note[: max(1, img_h // lh)]):
                draw.text((x0 + PAD, y0 + PAD + k * lh), _clip(draw, line, font, inner_w - 2 * PAD),
                          fill=TEXT, font=font)
        for k, line in enumerate(tile.labels):
            draw.text((x0, y0 + img_h + k * lh + PAD // 2), _clip(draw, line, font, inner_w), fill=TEXT, font=font)
    return np.asarray(sheet, dtype=np.uint8)


def placeholder(lines: Sequence[str], width: int = 256, height: int = 128) -> np.ndarray:
    """A grey (H, W, 3) uint8 image with a few lines of text (a job with no frames yet)."""
    im = Image.new("RGB", (width, height), MISSING)
    draw = ImageDraw.Draw(im)
    font = _font()
    lh = _line_height(font)
    for k, line in enumerate(lines[: max(1, height // lh)]):
        draw.text((PAD, PAD + k * lh), _clip(draw, line, font, width - 2 * PAD), fill=TEXT, font=font)
    return np.asarray(im, dtype=np.uint8)
