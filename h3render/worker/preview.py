"""Per-step preview frames as small PNGs for the job's meta. Pure functions.

The render task asks the engine for a preview every `preview_every` denoising steps
(RenderJob.preview_every; h3.c also sends one per step with preview_denoise). Each
one is scaled to at most MAX_SIDE pixels on its long side, keeping the aspect
ratio, and stored as base64 PNG in job.meta["h3r"]["preview_png"] with
"preview_step" (denoising steps done, as meta "step" counts them). Only the
latest preview is kept, and at most one is written per step.
"""

from __future__ import annotations

import base64
import io

import numpy as np

MAX_SIDE = 256  # pixels on the long side of a stored preview


def preview_size(width: int, height: int, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """(w, h) scaled down so the long side is at most max_side (never scaled up), each >= 1."""
    if width <= 0 or height <= 0:
        raise ValueError(f"preview frame {width}x{height}: both sides must be positive")
    scale = min(1.0, max_side / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def preview_png(rgb: np.ndarray, max_side: int = MAX_SIDE) -> bytes:
    """PNG bytes of an (H, W, 3) uint8 frame, scaled to at most max_side on its long side."""
    from PIL import Image

    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"preview frame has shape {rgb.shape}; expected (H, W, 3) uint8")
    img = Image.fromarray(rgb, "RGB")
    size = preview_size(img.width, img.height, max_side)
    if size != img.size:
        img = img.resize(size, Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


def preview_b64(rgb: np.ndarray, max_side: int = MAX_SIDE) -> str:
    """preview_png as base64 text, as stored in job meta."""
    return base64.b64encode(preview_png(rgb, max_side)).decode("ascii")
