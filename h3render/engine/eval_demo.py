"""Check that the demo model follows its prompts: an analytic detector and an evaluation.

The detector has no learned parts. Per clip (F, H, W, 3) it measures:

  background   per-channel median of every pixel of every frame (the shape covers
               well under half of the frame)
  foreground   pixels farther than FG_MIN from the background; their core (the
               farthest quarter) gives the object's colour, named by the nearest
               entry of h3render.demo_data.COLORS
  mask         per frame, coverage a = <p - bg, fg - bg> / |fg - bg|^2 > 0.5 (the
               half-way contour, so blur does not grow or shrink the shape), the
               largest 4-connected component
  direction    least-squares slope of the mask centroid over frames; the larger
               axis and its sign give left/right/up/down, or "none" below
               MIN_SPEED pixels per frame
  shape        median over frames of the fill ratio (summed coverage around the
               mask / its bounding-box area: square 1, circle pi/4, triangle 1/2)
               and of the coverage centroid's offset
               below the box centre (triangle, apex up: +1/6 of the height),
               classified by thresholds half-way between the measured ranges
  consistency  mean IoU of consecutive masks after aligning their centroids
               (1 = the same shape in every frame)

`evaluate` renders held-out prompts (h3render.demo_data.heldout_specs) with the
engine at each quant level, detects, scores against the prompt's attributes and
writes a contact sheet: one row per prompt, its frames left to right.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from h3render import demo_data as dd

FG_MIN = 0.15  # colour distance (RGB in [0, 1]) that marks a pixel as not background
MIN_SPEED = 0.25  # pixels per frame below which a clip counts as static
MIN_AREA = 4  # pixels: a smaller component is noise, not an object
PAD = 2  # pixels around the box whose coverage counts towards the soft measures
FLOOR = 0.15  # coverage below this is background noise (and above 1 - FLOOR, inside)
# Shape thresholds. Sharp shapes measure: square fill 0.93-1.0, circle fill
# 0.74-0.81 (pi/4 = 0.785), triangle offset 0.13-0.15 (apex up: 1/6 of the height
# ideally), circle and square offsets within +-0.015. A blur of about one pixel
# (what a small decoder does) rounds square corners down to fill 0.84 and brings
# the triangle offset down to 0.086. The boundaries sit half-way between.
TRIANGLE_MIN_OFFSET = 0.05
SQUARE_MIN_FILL = 0.83


@dataclass
class Detection:
    """What the detector saw in one clip; None fields when no object was found."""

    color: str | None
    direction: str | None
    shape: str | None
    background: str
    consistency: float
    found_frames: int
    fill: float = float("nan")
    offset: float = float("nan")
    velocity: tuple[float, float] = (0.0, 0.0)  # pixels per frame (x right, y down)
    rgb: tuple[float, float, float] = (0.0, 0.0, 0.0)


def _as_float(video: np.ndarray) -> np.ndarray:
    v = np.asarray(video)
    if v.ndim != 4 or v.shape[-1] != 3:
        raise ValueError(f"video shape {v.shape} must be (frames, height, width, 3)")
    if v.dtype == np.uint8:
        return v.astype(np.float32) / 255.0
    if not np.issubdtype(v.dtype, np.floating):
        raise ValueError(f"video dtype {v.dtype} must be uint8 or float in [0, 1]")
    return v.astype(np.float32)


def nearest(rgb: np.ndarray, palette: dict[str, tuple[float, float, float]]) -> str:
    """Name of the palette colour nearest to rgb (Euclidean in RGB)."""
    names = list(palette)
    d = [float(np.sum((np.asarray(palette[n]) - rgb) ** 2)) for n in names]
    return names[int(np.argmin(d))]


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected component of a 2-D boolean mask (ties: first in scan order)."""
    h, w = mask.shape
    labels = np.zeros((h, w), np.int32)
    best, best_n, cur = 0, 0, 0
    for y0, x0 in zip(*np.nonzero(mask)):
        if labels[y0, x0]:
            continue
        cur += 1
        labels[y0, x0] = cur
        stack, n = [(y0, x0)], 0
        while stack:
            y, x = stack.pop()
            n += 1
            for yy, xx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= yy < h and 0 <= xx < w and mask[yy, xx] and not labels[yy, xx]:
                    labels[yy, xx] = cur
                    stack.append((yy, xx))
        if n > best_n:
            best, best_n = cur, n
    return labels == best if best else np.zeros_like(mask)


def _aligned_iou(a: np.ndarray, b: np.ndarray, ca, cb) -> float:
    """IoU of masks a and b after shifting b by the rounded centroid difference."""
    dy, dx = int(round(ca[1] - cb[1])), int(round(ca[0] - cb[0]))
    b2 = np.roll(np.roll(b, dy, axis=0), dx, axis=1)
    inter = np.logical_and(a, b2).sum()
    union = np.logical_or(a, b2).sum()
    return float(inter / union) if union else 0.0


def classify_shape(fill: float, offset: float) -> str:
    """triangle if the centroid sits low in its box, else square or circle by fill ratio."""
    if offset > TRIANGLE_MIN_OFFSET:
        return "triangle"
    return "square" if fill > SQUARE_MIN_FILL else "circle"


def direction_of(vx: float, vy: float) -> str:
    """left/right/up/down from a velocity (image axes), or "none" when slower than MIN_SPEED."""
    if max(abs(vx), abs(vy)) < MIN_SPEED:
        return "none"
    if abs(vx) >= abs(vy):
        return "right" if vx > 0 else "left"
    return "down" if vy > 0 else "up"


def detect(video: np.ndarray) -> Detection:
    """Measure colour, direction, shape and consistency of the main object of a clip.

    video: (F, H, W, 3) uint8 or float in [0, 1]. Never raises on content (an empty
    clip gives None attributes); raises ValueError for a wrong shape or dtype.
    """
    v = _as_float(video)
    F, H, W, _ = v.shape
    bg = np.median(v.reshape(-1, 3), axis=0)
    background = nearest(bg, dd.BACKGROUNDS)
    dist = np.linalg.norm(v - bg, axis=-1)  # (F, H, W)
    coarse = dist > FG_MIN
    if coarse.sum() < MIN_AREA:
        return Detection(None, None, None, background, 0.0, 0)
    core = dist >= np.quantile(dist[coarse], 0.75)
    core &= coarse
    fg = np.median(v[core], axis=0)
    axis = fg - bg
    a = np.tensordot(v - bg, axis, axes=([-1], [0])) / max(float(axis @ axis), 1e-6)
    masks, cents, fills, offs, frames_found = [], [], [], [], []
    ys, xs = np.mgrid[0:H, 0:W]
    for f in range(F):
        m = largest_component(a[f] > 0.5)
        n = int(m.sum())
        if n < MIN_AREA:
            continue
        rows, cols = np.nonzero(m.any(axis=1))[0], np.nonzero(m.any(axis=0))[0]
        # Soft measures. Coverage is remapped to w = clip((a - FLOOR) / (1 - 2 FLOOR))
        # (zero on background noise, unchanged half-way point). Blur moves coverage
        # across an edge but keeps its sum, so the summed w is the sharp area, and
        # the per-column (per-row) maxima summed give the width (height) to a
        # fraction of a pixel, where a pixel-counted box is off by up to one.
        r0, r1 = max(rows[0] - PAD, 0), min(rows[-1] + PAD + 1, H)
        c0, c1 = max(cols[0] - PAD, 0), min(cols[-1] + PAD + 1, W)
        w = np.clip((a[f, r0:r1, c0:c1] - FLOOR) / (1 - 2 * FLOOR), 0.0, 1.0)
        soft = float(w.sum())
        py, px = w.max(axis=1), w.max(axis=0)  # (rows,), (cols,)
        bh, bw = float(py.sum()), float(px.sum())
        yy = ys[r0:r1, c0:c1]
        cx = float((w * xs[r0:r1, c0:c1]).sum() / max(soft, 1e-6))
        cy = float((w * yy).sum() / max(soft, 1e-6))
        box_cy = float((py * yy[:, 0]).sum() / max(bh, 1e-6))
        fills.append(soft / max(bh * bw, 1e-6))
        offs.append((cy - box_cy) / max(bh, 1e-6))
        masks.append(m)
        cents.append((cx, cy))
        frames_found.append(f)
    if not frames_found:
        return Detection(None, None, None, background, 0.0, 0, rgb=tuple(float(c) for c in fg))
    t = np.asarray(frames_found, np.float64)
    c = np.asarray(cents)
    if len(t) >= 2:
        tc = t - t.mean()
        vx = float(tc @ (c[:, 0] - c[:, 0].mean()) / (tc @ tc))
        vy = float(tc @ (c[:, 1] - c[:, 1].mean()) / (tc @ tc))
    else:
        vx = vy = 0.0
    ious = [_aligned_iou(masks[i], masks[i + 1], cents[i], cents[i + 1]) for i in range(len(masks) - 1)]
    consistency = float(np.mean(ious)) if ious else 0.0
    consistency *= len(frames_found) / F  # missing frames count against it
    fill, off = float(np.median(fills)), float(np.median(offs))
    return Detection(
        color=nearest(fg, dd.COLORS), direction=direction_of(vx, vy), shape=classify_shape(fill, off),
        background=background, consistency=consistency, found_frames=len(frames_found),
        fill=fill, offset=off, velocity=(vx, vy), rgb=tuple(float(x) for x in fg),
    )  # fmt: skip


# ---- scoring -------------------------------------------------------------------------------

ATTRIBUTES = ("color", "direction", "shape")


def score(spec: dd.ClipSpec, det: Detection) -> dict[str, bool]:
    """Per attribute, whether the detection matches the prompt's main object."""
    o = spec.main
    return {"color": det.color == o.color, "direction": det.direction == o.direction,
            "shape": det.shape == o.shape}


def check_prompt(prompt: str, clip: np.ndarray) -> dict[str, bool | None]:
    """For any prompt: per attribute it names, whether the clip shows it (None: not named)."""
    det = detect(clip)
    want = dd.parse_caption(prompt)
    return {a: None if want[a] is None else getattr(det, a) == want[a] for a in ATTRIBUTES}


@dataclass
class QuantReport:
    quant: str
    n: int
    accuracy: dict[str, float]
    consistency: float
    seconds: float
    failures: list[dict] = field(default_factory=list)


# ---- contact sheet -------------------------------------------------------------------------


def write_png(path: Path, rgb: np.ndarray) -> None:
    """Write an (H, W, 3) uint8 image as PNG, atomically (h3render.engine.video.write_png:
    Pillow's encoder under a temporary name, then a rename).

    Anything else is refused, naming the shape and dtype: an RGBA or float array would
    otherwise be written as some other picture than the one asked for."""
    a = np.asarray(rgb)
    if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8:
        raise ValueError(f"{path}: image must be uint8 (height, width, 3), got {a.dtype} {a.shape}")
    from h3render.engine.video import write_png as _write

    _write(Path(path), np.ascontiguousarray(a))


def contact_sheet(rows: list[np.ndarray], marks: list[dict[str, bool]] | None = None,
                  scale: int = 2, gap: int = 2) -> np.ndarray:
    """Rows of frames (each (F, H, W, 3) uint8) tiled into one image, one row per clip.

    With marks, a strip left of each row shows one square per attribute (color,
    direction, shape): green when detected as prompted, red when not, gray when
    the prompt does not name it (None).
    """
    if not rows:
        raise ValueError("contact_sheet: no rows")
    F, H, W, _ = rows[0].shape
    strip = (H * scale) // 3 if marks is not None else 0
    width = strip + gap + F * (W * scale + gap)
    height = len(rows) * (H * scale + gap) + gap
    sheet = np.full((height, width, 3), 255, np.uint8)
    for r, clip in enumerate(rows):
        y = gap + r * (H * scale + gap)
        if marks is not None:
            for k, attr in enumerate(ATTRIBUTES):
                ok = marks[r].get(attr, False)
                colour = (160, 160, 160) if ok is None else (40, 170, 60) if ok else (210, 40, 40)
                sheet[y + k * strip: y + (k + 1) * strip - 1, 0:strip - 1] = colour
        for f in range(min(F, clip.shape[0])):
            x = strip + gap + f * (W * scale + gap)
            big = np.repeat(np.repeat(clip[f], scale, axis=0), scale, axis=1)
            sheet[y:y + H * scale, x:x + W * scale] = big
    return sheet


# ---- evaluation over held-out prompts -------------------------------------------------------


def render_prompts(model_dir: Path, specs: list[dd.ClipSpec], quant: str, seed: int = 0,
                   threads: int = 0, steps: int | None = None,
                   on_clip: Callable[[int], None] | None = None) -> list[np.ndarray]:
    """Render each spec's caption with the engine at the model's defaults: (F, H, W, 3) uint8 each.

    Each clip is a job through the job contract (h3render.queue.contract), so it renders the
    frames `h3render run` and a worker render for the same prompt, seed and quant level."""
    from h3render.engine.binding import Engine
    from h3render.queue import contract

    model_dir = Path(model_dir)
    out = []
    with Engine(model_dir, threads) as eng:
        info = eng.info()
        for i, spec in enumerate(specs):
            frames: list[np.ndarray] = []
            fields = {"prompt": spec.caption, "seed": seed + i, "quant": quant}
            if steps:
                fields["steps"] = int(steps)
            job = contract.check(fields, lambda _model: info).job
            req = contract.request(job, info, model_dir, threads)
            eng.generate(req, on_frame=lambda kind, idx, rgb: frames.append(rgb) if kind == 0 else None)
            out.append(np.stack(frames))
            if on_clip:
                on_clip(i)
    return out


def evaluate_clips(specs: list[dd.ClipSpec], clips: list[np.ndarray], quant: str,
                   seconds: float = 0.0) -> tuple[QuantReport, list[dict[str, bool]]]:
    """Detect and score rendered clips against their specs."""
    marks, fails, cons = [], [], []
    for spec, clip in zip(specs, clips):
        det = detect(clip)
        ok = score(spec, det)
        marks.append(ok)
        cons.append(det.consistency)
        if not all(ok.values()):
            o = spec.main
            fails.append({"prompt": spec.caption, "want": [o.color, o.direction, o.shape],
                          "got": [det.color, det.direction, det.shape],
                          "fill": round(det.fill, 3), "offset": round(det.offset, 3)})
    n = len(specs)
    acc = {a: sum(m[a] for m in marks) / n for a in ATTRIBUTES}
    return QuantReport(quant, n, acc, float(np.mean(cons)), seconds, fails), marks


def evaluate(model_dir: Path, quants: list[str], n: int = 100, seed: int = 0, threads: int = 0,
             steps: int | None = None, sheet_dir: Path | None = None,
             on_clip: Callable[[str, int], None] | None = None) -> list[QuantReport]:
    """Render n held-out prompts per quant level, score them, write contact sheets.

    Writes <sheet_dir>/contact-<quant>.png (one row per prompt) and report.json
    when sheet_dir is given. Returns one QuantReport per quant level.
    """
    if n < 1:
        raise ValueError(f"n={n} must be at least 1")
    specs = dd.heldout_specs(n)
    reports = []
    for q in quants:
        t0 = time.time()
        clips = render_prompts(model_dir, specs, q, seed, threads, steps,
                               on_clip=(lambda i, q=q: on_clip(q, i)) if on_clip else None)
        rep, marks = evaluate_clips(specs, clips, q, time.time() - t0)
        reports.append(rep)
        if sheet_dir is not None:
            sheet_dir = Path(sheet_dir)
            sheet_dir.mkdir(parents=True, exist_ok=True)
            write_png(sheet_dir / f"contact-{q}.png", contact_sheet(clips, marks))
            (sheet_dir / f"prompts-{q}.txt").write_text(
                "".join(f"{i:3d} {s.caption}\n" for i, s in enumerate(specs)))
    if sheet_dir is not None:
        (Path(sheet_dir) / "report.json").write_text(
            json.dumps([asdict(r) for r in reports], indent=2) + "\n")
    return reports
