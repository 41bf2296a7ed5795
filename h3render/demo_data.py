"""Procedural clips for the demo model: coloured shapes moving over a plain background.

Pure numpy, deterministic by seed, generated on the fly (nothing is stored). The
training script (tools/train/) draws its data from here, and the analytic
detector's tests (h3render.engine.eval_demo) use it for clips whose attributes
are known.

A clip is described by a `ClipSpec`: one or two `ShapeSpec`s (shape, colour,
direction, speed, size, start position) over a background colour, plus the
caption that describes it. Geometry is in fractions of the frame, so a spec
renders at any size; speeds are in frame widths per frame.

    spec = sample_spec(np.random.default_rng(7))
    video = render_clip(spec, width=32, height=32, frames=9)   # (F, H, W, 3) float32 in [0, 1]

Captions come from templates with synonyms ("a crimson disc drifting left over a
black background"). `heldout_specs(n)` returns a fixed set of single-shape clips
whose captions the training sampler never emits (`is_heldout`), for evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# ---- vocabulary of the world --------------------------------------------------------

# name -> RGB in [0, 1]; chosen far apart from each other and from the backgrounds
COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.86, 0.10, 0.10),
    "green": (0.10, 0.70, 0.15),
    "blue": (0.12, 0.25, 0.92),
    "yellow": (0.95, 0.85, 0.10),
    "purple": (0.60, 0.15, 0.80),
    "orange": (0.98, 0.55, 0.05),
}
BACKGROUNDS: dict[str, tuple[float, float, float]] = {
    "black": (0.04, 0.04, 0.04),
    "white": (0.96, 0.96, 0.96),
    "gray": (0.50, 0.50, 0.50),
}
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = ("left", "right", "up", "down")
SPEEDS = ("slow", "fast")
# unit motion per direction in image coordinates (x right, y down)
DIRECTION_VECTORS: dict[str, tuple[int, int]] = {
    "left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1),
}  # fmt: skip
# frame widths per frame
SPEED_VALUES: dict[str, float] = {"slow": 1.0 / 32, "fast": 1.75 / 32}
SIZE_RANGE = (0.34, 0.38)  # bounding-box side, fraction of the frame's shorter side
JITTER = 0.03  # start-position jitter, fraction of the frame (1 px at 32x32)
LANE = 0.2  # two-shape clips: each path this far off centre, across its motion

# ---- caption synonyms ----------------------------------------------------------------

COLOR_WORDS: dict[str, tuple[str, ...]] = {
    "red": ("red", "crimson", "scarlet"),
    "green": ("green", "emerald", "lime"),
    "blue": ("blue", "azure", "cobalt"),
    "yellow": ("yellow", "golden", "lemon"),
    "purple": ("purple", "violet", "magenta"),
    "orange": ("orange", "amber", "tangerine"),
}
SHAPE_WORDS: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disc", "ball", "dot"),
    "square": ("square", "box", "block"),
    "triangle": ("triangle", "wedge"),
}
DIRECTION_WORDS: dict[str, tuple[str, ...]] = {
    "left": ("left", "to the left", "leftward", "westward"),
    "right": ("right", "to the right", "rightward", "eastward"),
    "up": ("up", "upward", "upwards", "northward"),
    "down": ("down", "downward", "downwards", "southward"),
}
SPEED_WORDS: dict[str, tuple[str, ...]] = {
    "slow": ("slowly", "gently", "lazily"),
    "fast": ("quickly", "rapidly", "swiftly"),
}
BACKGROUND_WORDS: dict[str, tuple[str, ...]] = {
    "black": ("black", "dark"),
    "white": ("white", "bright"),
    "gray": ("gray", "grey"),
}
VERBS = ("moving", "drifting", "sliding", "gliding", "travelling", "floating")
SCENES = ("background", "backdrop")
PREPOSITIONS = ("over", "on", "against")


@dataclass(frozen=True)
class ShapeSpec:
    """One moving shape. Positions are centre coordinates in frame fractions."""

    shape: str
    color: str
    direction: str
    speed: str
    size: float  # bounding-box side / shorter frame side
    x0: float  # centre at frame 0, fraction of width
    y0: float  # centre at frame 0, fraction of height


@dataclass(frozen=True)
class ClipSpec:
    """A clip: shapes over a background, and the caption that describes it."""

    background: str
    objects: tuple[ShapeSpec, ...]
    caption: str = ""
    frames_hint: int = 9  # the clip length the start positions were chosen for

    @property
    def main(self) -> ShapeSpec:
        return self.objects[0]


# ---- sampling -------------------------------------------------------------------------


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def _place(rng: np.random.Generator, direction: str, speed: str, size: float, frames: int,
           lane: float = 0.0):
    """A start centre: the path centred in the frame, jittered by up to JITTER.

    The path's midpoint sits at the frame centre, moved by `lane` across the
    motion (two-shape clips use separate lanes), so a caption fixes its clip up
    to about a pixel. A random start anywhere in the frame makes the clips of one
    caption a wide, many-moded distribution, and a one-million-parameter DiT
    trained for CPU minutes answered it with fragments of colour in several
    places instead of one shape (docs/DEMO_MODEL.md).
    """
    dx, dy = DIRECTION_VECTORS[direction]
    travel = SPEED_VALUES[speed] * (frames - 1)
    half = size / 2 + 0.04  # > 1 pixel of margin at 32x32
    lo = np.array([half, half])
    hi = np.array([1 - half, 1 - half])
    # along the motion axis leave room for the whole travel
    start_lo = lo - np.minimum(0, np.array([dx, dy])) * travel
    start_hi = hi - np.maximum(0, np.array([dx, dy])) * travel
    if np.any(start_hi < start_lo):
        raise ValueError(f"size={size} with speed={speed!r} does not fit in {frames} frames")
    centred = np.array([0.5, 0.5]) - np.array([dx, dy]) * travel / 2
    centred += lane * np.array([abs(dy), abs(dx)])  # across the motion
    p = np.clip(centred + (rng.random(2) * 2 - 1) * JITTER, start_lo, start_hi)
    return float(p[0]), float(p[1])


def sample_shape(rng: np.random.Generator, frames: int = 9, lane: float = 0.0, **fixed) -> ShapeSpec:
    """A random ShapeSpec; keyword arguments (shape=, color=, ...) pin attributes."""
    shape = fixed.get("shape") or _pick(rng, SHAPES)
    color = fixed.get("color") or _pick(rng, tuple(COLORS))
    direction = fixed.get("direction") or _pick(rng, DIRECTIONS)
    speed = fixed.get("speed") or _pick(rng, SPEEDS)
    size = float(SIZE_RANGE[0] + rng.random() * (SIZE_RANGE[1] - SIZE_RANGE[0]))
    x0, y0 = _place(rng, direction, speed, size, frames, lane)
    return ShapeSpec(shape, color, direction, speed, size, x0, y0)


def _a(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def caption_for(rng: np.random.Generator, background: str, objects: tuple[ShapeSpec, ...]) -> str:
    """A caption from the templates, with synonyms drawn from rng."""

    def phrase(o: ShapeSpec) -> str:
        color = _pick(rng, COLOR_WORDS[o.color])
        shape = _pick(rng, SHAPE_WORDS[o.shape])
        verb = _pick(rng, VERBS)
        direction = _pick(rng, DIRECTION_WORDS[o.direction])
        speed = _pick(rng, SPEED_WORDS[o.speed])
        form = int(rng.integers(3))
        if form == 0:
            return f"{_a(color)} {color} {shape} {verb} {direction} {speed}"
        if form == 1:
            return f"{_a(color)} {color} {shape} {speed} {verb} {direction}"
        return f"a {speed} {verb} {color} {shape} heading {direction}"

    bg = _pick(rng, BACKGROUND_WORDS[background])
    scene = _pick(rng, SCENES)
    prep = _pick(rng, PREPOSITIONS)
    body = " and ".join(phrase(o) for o in objects)
    if int(rng.integers(2)) == 0:
        return f"{body} {prep} a {bg} {scene}"
    return f"{bg} {scene}, {body}"


def sample_spec(rng: np.random.Generator, frames: int = 9, two_shape_prob: float = 0.2,
                **fixed) -> ClipSpec:
    """A random clip: one shape (or two, with probability two_shape_prob) and a caption.

    Keyword arguments pin the first shape's attributes (shape=, color=, direction=,
    speed=) and the background (background=).
    """
    background = fixed.pop("background", None) or _pick(rng, tuple(BACKGROUNDS))
    two = rng.random() < two_shape_prob
    objects = [sample_shape(rng, frames, -LANE if two else 0.0, **fixed)]
    if two:
        second = sample_shape(rng, frames, LANE)
        while second.color == objects[0].color:
            second = sample_shape(rng, frames, LANE)
        objects.append(second)
    objs = tuple(objects)
    return ClipSpec(background, objs, caption_for(rng, background, objs), frames)


# ---- reading a caption back --------------------------------------------------------------


def parse_caption(text: str) -> dict[str, str | None]:
    """The first-named shape's colour, shape and direction in a caption (None: not named).

    Matches whole words of the synonym tables, so any prompt in the demo world's
    vocabulary ("a crimson disc drifting left ...") says what its clip should show.
    """
    words = " " + " ".join(text.lower().replace(",", " ").replace(".", " ").split()) + " "
    found: dict[str, str | None] = {}
    for attr, table in (("color", COLOR_WORDS), ("shape", SHAPE_WORDS), ("direction", DIRECTION_WORDS)):
        best: tuple[int, str] | None = None
        for value, synonyms in table.items():
            for syn in synonyms:
                at = words.find(f" {syn} ")
                if at >= 0 and (best is None or at < best[0]):
                    best = (at, value)
        found[attr] = best[1] if best else None
    return found


# ---- held-out prompts ------------------------------------------------------------------

HELDOUT_SEED = 5_000_011


def heldout_specs(n: int = 120, frames: int = 9) -> list[ClipSpec]:
    """n single-shape clips covering colours, shapes and directions evenly.

    Every (colour, shape, direction) combination appears once per pass of 72, in
    a shuffled order; background and speed are random. Their captions are
    excluded from training (see `is_heldout`).
    """
    rng = np.random.default_rng(HELDOUT_SEED)
    combos = [(c, s, d) for c in COLORS for s in SHAPES for d in DIRECTIONS]
    out: list[ClipSpec] = []
    seen: set[str] = set()
    order: list[int] = []
    while len(out) < n:
        if not order:
            order = list(rng.permutation(len(combos)))
        color, shape, direction = combos[order.pop(0)]
        spec = sample_spec(rng, frames, two_shape_prob=0.0, color=color, shape=shape,
                           direction=direction)
        while spec.caption in seen:
            spec = sample_spec(rng, frames, two_shape_prob=0.0, color=color, shape=shape,
                               direction=direction)
        seen.add(spec.caption)
        out.append(spec)
    return out


_HELDOUT_CAPTIONS: frozenset[str] | None = None


def is_heldout(caption: str) -> bool:
    """True for a caption of the evaluation set (the first 500 held-out specs)."""
    global _HELDOUT_CAPTIONS
    if _HELDOUT_CAPTIONS is None:
        _HELDOUT_CAPTIONS = frozenset(s.caption for s in heldout_specs(500))
    return caption in _HELDOUT_CAPTIONS


def training_specs(seed: int, frames: int = 9, two_shape_prob: float = 0.2):
    """An endless stream of training clips for a seed, never a held-out caption."""
    rng = np.random.default_rng(seed)
    while True:
        spec = sample_spec(rng, frames, two_shape_prob)
        if not is_heldout(spec.caption):
            yield spec


# ---- rendering ----------------------------------------------------------------------------

SUPERSAMPLE = 4  # sub-pixels per pixel side, for anti-aliased edges


def _coverage(shape: str, cx: float, cy: float, side: float, xs: np.ndarray, ys: np.ndarray):
    """Boolean mask of sub-pixel centres (xs, ys in pixels) inside the shape."""
    h = side / 2
    if shape == "circle":
        return (xs - cx) ** 2 + (ys - cy) ** 2 <= h * h
    if shape == "square":
        return (np.abs(xs - cx) <= h) & (np.abs(ys - cy) <= h)
    if shape == "triangle":  # apex up, base down, isosceles filling half its box
        t = (ys - (cy - h)) / side  # 0 at apex, 1 at base
        return (t >= 0) & (t <= 1) & (np.abs(xs - cx) <= h * t)
    raise ValueError(f"shape={shape!r} is not one of {SHAPES}")


def object_center(o: ShapeSpec, frame: int, width: int, height: int) -> tuple[float, float]:
    """Centre of an object at a frame, in pixels."""
    dx, dy = DIRECTION_VECTORS[o.direction]
    step = SPEED_VALUES[o.speed] * frame
    return (o.x0 + dx * step) * width, (o.y0 + dy * step) * height


def render_clip(spec: ClipSpec, width: int = 32, height: int = 32, frames: int = 9) -> np.ndarray:
    """Render a clip: (frames, height, width, 3) float32 in [0, 1], anti-aliased.

    Later objects are drawn over earlier ones. Raises ValueError for a bad
    size or frame count.
    """
    for name, v in (("width", width), ("height", height), ("frames", frames)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive integer")
    s = SUPERSAMPLE
    ys, xs = np.mgrid[0:height * s, 0:width * s].astype(np.float32)
    xs = (xs + 0.5) / s
    ys = (ys + 0.5) / s
    bg = np.asarray(BACKGROUNDS[spec.background], np.float32)
    out = np.empty((frames, height, width, 3), np.float32)
    short = min(width, height)
    for f in range(frames):
        img = np.broadcast_to(bg, (height * s, width * s, 3)).copy()
        for o in spec.objects:
            cx, cy = object_center(o, f, width, height)
            mask = _coverage(o.shape, cx, cy, o.size * short, xs, ys)
            img[mask] = COLORS[o.color]
        out[f] = img.reshape(height, s, width, s, 3).mean(axis=(1, 3))
    return out
