"""h3.c's render options and limits, checked at enqueue so a night's sweep never fails at 3 am.

Pure functions; no I/O. The rules come from h3.c's public header and README:

  width, height     multiples of 32, at least 32, width*height <= 768*1344
  frames            5 + 17n with n >= 1 (22, 39, 56, ... 362) at 24 fps; other
                    counts are rounded UP to the next one, with a warning
  steps             2..1000
  quant             bf16 (forces h3.c's slower BF16 paths), int8 (h3.c's default
                    paths), int8-row (use_int8_row_fc2)
  engine options    denoise_reuse 1..3, dit_layers 35..50, core_reuse 1..6
                    (core_reuse > 1 excludes denoise_reuse > 1), token_reduction,
                    render_width/render_height (both or neither, multiples of 32,
                    the output's aspect, no larger than the output),
                    ssd_streaming (not with quant=int8-row), preview_denoise

Every problem names the field, the value, the rule and the nearest valid value
(h3render.engine.limits.LimitError); all problems of one request are reported
together in one H3OptionsError.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from h3render.engine.exceptions import InvalidRequestError
from h3render.engine.limits import LimitError, check_pixels, nearest_on_grid

SIZE_MULTIPLE = 32  # pixels
MAX_PIXELS = 768 * 1344  # width * height
FPS = 24
FRAME_MULTIPLE, FRAME_OFFSET = 17, 5  # frames = 5 + 17n ...
MIN_FRAMES, MAX_FRAMES = 22, 362  # ... n >= 1: one trained 22-frame decoder chunk at least
MIN_STEPS, MAX_STEPS = 2, 1000
QUANT_LEVELS = ("bf16", "int8", "int8-row")
DEFAULT_QUANT = "int8"
QUANT_ALIASES = {"int8_row": "int8-row"}  # job quant fields may not allow '-'

# Integer options: (lowest, highest, default).
INT_OPTIONS: dict[str, tuple[int, int, int]] = {
    "denoise_reuse": (1, 3, 1),
    "dit_layers": (35, 50, 50),
    "core_reuse": (1, 6, 1),
}
BOOL_OPTIONS = ("token_reduction", "ssd_streaming", "preview_denoise")
SIZE_OPTIONS = ("render_width", "render_height")
KNOWN_OPTIONS = tuple(INT_OPTIONS) + BOOL_OPTIONS + SIZE_OPTIONS
# Set by the worker, never by a job: a path a job could choose would let anyone
# who can write to Redis overwrite files on the worker.
WORKER_OPTIONS = ("output_path",)


class H3OptionsError(InvalidRequestError):
    """One or more h3 options or limits broken; `problems` holds one LimitError each."""

    def __init__(self, problems: list[LimitError]):
        self.problems = list(problems)
        super().__init__("invalid h3.c request: " + "; ".join(str(p) for p in self.problems))


class H3Options(BaseModel):
    """h3.c engine options, normalized (the bridge reads them as key=value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    denoise_reuse: int = Field(1, ge=1, le=3)
    dit_layers: int = Field(50, ge=35, le=50)
    core_reuse: int = Field(1, ge=1, le=6)
    token_reduction: bool = False
    render_width: int = Field(0, ge=0)
    render_height: int = Field(0, ge=0)
    ssd_streaming: bool = False
    preview_denoise: bool = False


class H3Request(BaseModel):
    """A validated h3.c render: output size, rounded frames, quant level, options."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    width: int
    height: int
    frames: int
    quant: str
    steps: int | None = None
    options: H3Options = H3Options()

    def engine_options(self) -> dict[str, int | bool]:
        """The options the job set, in normalized types, for RenderJob.engine_options."""
        return {k: getattr(self.options, k) for k in sorted(self.options.model_fields_set)}

    def job_updates(self) -> dict[str, Any]:
        """Fields to write back into the job (frames may have been rounded up)."""
        return {"frames": self.frames, "quant": self.quant, "engine_options": self.engine_options()}

    @property
    def seconds(self) -> float:
        return self.frames / FPS


def align_frames(frames: int) -> int:
    """The frame count h3.c renders for a request: 5 + 17n rounded up, at least 22."""
    n = max(1, -(-(max(frames, FRAME_OFFSET) - FRAME_OFFSET) // FRAME_MULTIPLE))
    return FRAME_OFFSET + FRAME_MULTIPLE * n


def frames_for_seconds(seconds: float) -> int:
    """h3.c's --seconds: seconds at 24 fps, rounded up to a valid frame count."""
    return align_frames(int(-(-seconds * FPS // 1)))


# ---------------------------------------------------------------- value parsing

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _as_int(field: str, value: Any, lo: int, hi: int, default: int) -> int:
    """An integer option value: an int, or decimal text; never a bool or a fraction."""
    if isinstance(value, bool):
        raise LimitError(field, repr(value), f"an integer in {lo}..{hi}", (default,), why="is a boolean, not an integer")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        value = int(value.strip())
    if not isinstance(value, int):
        raise LimitError(field, repr(value), f"an integer in {lo}..{hi}", (default,), why="is not an integer")
    return value


def _as_bool(field: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise LimitError(field, repr(value), "a boolean (true/false, 1/0)", (True, False), why="is not a boolean")


def _range_problem(field: str, value: int, lo: int, hi: int) -> LimitError | None:
    if lo <= value <= hi:
        return None
    return LimitError(field, value, f"{lo}..{hi}", (lo if value < lo else hi,), why=f"is outside {lo}..{hi}")


def _check_side(field: str, value: Any) -> tuple[int | None, LimitError | None]:
    """A width or height: an int, a multiple of 32, at least 32."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None, LimitError(field, repr(value), f"a multiple of {SIZE_MULTIPLE}", (), why="is not an integer")
    rule = f"a multiple of {SIZE_MULTIPLE}"
    if value < SIZE_MULTIPLE:
        return None, LimitError(field, value, rule, (SIZE_MULTIPLE,), why=f"is below the minimum {SIZE_MULTIPLE}")
    if value % SIZE_MULTIPLE:
        near = nearest_on_grid(value, SIZE_MULTIPLE, 0, SIZE_MULTIPLE, 1344)
        return None, LimitError(field, value, rule, near)
    return value, None


def _render_size_candidates(width: int, height: int) -> list[tuple[int, int]]:
    """Every same-aspect internal canvas (multiples of 32, at most the output), largest first."""
    out = []
    for rw in range(width, SIZE_MULTIPLE - 1, -SIZE_MULTIPLE):
        if (rw * height) % width == 0:
            rh = rw * height // width
            if rh >= SIZE_MULTIPLE and rh % SIZE_MULTIPLE == 0:
                out.append((rw, rh))
    return out


def _nearest_render_size(rw: int, rh: int, width: int, height: int) -> tuple[str, ...]:
    cands = _render_size_candidates(width, height)
    best = min(cands, key=lambda c: (abs(c[0] - rw) + abs(c[1] - rh), -c[0]))
    return (f"{best[0]}x{best[1]}",)


# ---------------------------------------------------------------- validation


def validate_h3_options(
    options: Mapping[str, Any] | None,
    width: Any,
    height: Any,
    frames: Any,
    quant: str | None = None,
    steps: Any = None,
) -> tuple[H3Request, list[str]]:
    """Check one h3.c request; return (normalized request, warnings) or raise H3OptionsError.

    `options` is the job's engine_options. Frames that are not 5+17n (n >= 1)
    are rounded up, and a warning says so; the caller records the warnings in
    the job. Every problem is collected before raising, so one error lists
    them all.
    """
    problems: list[LimitError] = []
    warnings: list[str] = []
    options = dict(options or {})

    # -- size
    w, p = _check_side("width", width)
    if p:
        problems.append(p)
    h, p = _check_side("height", height)
    if p:
        problems.append(p)
    if w and h:
        try:
            check_pixels(w, h, MAX_PIXELS, SIZE_MULTIPLE)
        except LimitError as exc:
            problems.append(exc)

    # -- frames: rounded up, never down
    n_frames: int | None = None
    if isinstance(frames, bool) or not isinstance(frames, int):
        problems.append(LimitError("frames", repr(frames), "an integer", (MIN_FRAMES,), why="is not an integer"))
    elif frames < 1:
        problems.append(LimitError("frames", frames, f"1..{MAX_FRAMES}", (MIN_FRAMES,), why="is below 1"))
    elif frames > MAX_FRAMES:
        problems.append(LimitError("frames", frames, f"at most {MAX_FRAMES} (17n+5)", (MAX_FRAMES,),
                                   why=f"is above h3.c's maximum {MAX_FRAMES}"))
    else:
        n_frames = align_frames(frames)
        if n_frames != frames:
            warnings.append(
                f"frames={frames} rounded up to {n_frames}: h3.c renders 17n+5 frames, at least {MIN_FRAMES} "
                f"({n_frames / FPS:.3f} s at {FPS} fps)"
            )

    # -- steps
    n_steps: int | None = None
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int):
            problems.append(LimitError("steps", repr(steps), f"an integer in {MIN_STEPS}..{MAX_STEPS}", (20,),
                                       why="is not an integer"))
        elif (p := _range_problem("steps", steps, MIN_STEPS, MAX_STEPS)) is not None:
            problems.append(p)
        else:
            n_steps = steps

    # -- quant
    q = DEFAULT_QUANT if quant in (None, "") else QUANT_ALIASES.get(str(quant), str(quant))
    if q not in QUANT_LEVELS:
        near = difflib.get_close_matches(str(quant), QUANT_LEVELS, n=1, cutoff=0.0)
        problems.append(LimitError("quant", quant, "one of " + ", ".join(QUANT_LEVELS), tuple(near),
                                   why="is not an h3.c quant level (" + ", ".join(QUANT_LEVELS) + ")"))

    # -- engine options, one by one
    values: dict[str, Any] = {}
    for key, value in options.items():
        field = f"engine_options.{key}"
        try:
            if key in INT_OPTIONS:
                lo, hi, default = INT_OPTIONS[key]
                v = _as_int(field, value, lo, hi, default)
                if (p := _range_problem(field, v, lo, hi)) is not None:
                    raise p
                values[key] = v
            elif key in BOOL_OPTIONS:
                values[key] = _as_bool(field, value)
            elif key in SIZE_OPTIONS:
                v = _as_int(field, value, 0, 1344, 0)
                if v != 0:
                    if v < SIZE_MULTIPLE:
                        raise LimitError(field, v, f"a multiple of {SIZE_MULTIPLE} (0: the output size)",
                                         (SIZE_MULTIPLE,), why=f"is below the minimum {SIZE_MULTIPLE}")
                    if v % SIZE_MULTIPLE:
                        raise LimitError(field, v, f"a multiple of {SIZE_MULTIPLE}",
                                         nearest_on_grid(v, SIZE_MULTIPLE, 0, SIZE_MULTIPLE, 1344))
                values[key] = v
            elif key in WORKER_OPTIONS:
                raise LimitError(field, repr(value), "set by the worker only", (),
                                 why="is set by the worker (it names the output file); a job may not set it")
            else:
                near = difflib.get_close_matches(key, KNOWN_OPTIONS, n=1, cutoff=0.5)
                raise LimitError(field, repr(value), "one of " + ", ".join(KNOWN_OPTIONS), tuple(near),
                                 why="is not an h3.c option (known: " + ", ".join(KNOWN_OPTIONS) + ")")
        except LimitError as exc:
            problems.append(exc)

    # -- combinations
    dr, cr = values.get("denoise_reuse", 1), values.get("core_reuse", 1)
    if cr > 1 and dr > 1:
        problems.append(LimitError(
            "engine_options.core_reuse", cr, "core_reuse > 1 excludes denoise_reuse > 1", (1,),
            why=f"cannot be combined with denoise_reuse={dr} (h3.c: mutually exclusive); set one of them to 1",
        ))
    if values.get("ssd_streaming") and q == "int8-row":
        problems.append(LimitError(
            "engine_options.ssd_streaming", True, "not with quant=int8-row", (False,),
            why="cannot be combined with quant=int8-row (SSD streaming runs the original BF16 weights); "
                "use quant=int8 or bf16, or ssd_streaming=false",
        ))
    rw, rh = values.get("render_width", 0), values.get("render_height", 0)
    render_bad = any(p.field in ("engine_options.render_width", "engine_options.render_height") for p in problems)
    if render_bad:
        pass  # each bad side is already reported; a pair check would only repeat it
    elif (rw == 0) != (rh == 0):
        set_key, set_val = ("render_width", rw) if rw else ("render_height", rh)
        other = "render_height" if rw else "render_width"
        near: tuple[Any, ...] = ()
        if w and h:
            cands = [c for c in _render_size_candidates(w, h) if (c[0] if rw else c[1]) == set_val]
            near = tuple(f"{c[0]}x{c[1]}" for c in cands[:1])
        problems.append(LimitError(
            f"engine_options.{set_key}", set_val, "render_width and render_height both or neither", near,
            why=f"is set without {other}; set both (same aspect as the output) or neither",
        ))
    elif rw and rh and w and h:
        near = _nearest_render_size(rw, rh, w, h)
        if rw > w or rh > h:
            problems.append(LimitError(
                "engine_options.render_width*render_height", f"{rw}x{rh}", f"at most the output {w}x{h}", near,
                why=f"is larger than the output {w}x{h}",
            ))
        elif rw * h != rh * w:
            problems.append(LimitError(
                "engine_options.render_width*render_height", f"{rw}x{rh}", f"the output's aspect ({w}x{h})", near,
                why=f"does not have the output's aspect {w}x{h}",
            ))

    if problems:
        raise H3OptionsError(problems)

    # -- advice h3.c's README gives, recorded but not enforced
    if values.get("token_reduction") and values.get("dit_layers", 50) <= 40 and dr == 3:
        warnings.append("token_reduction with dit_layers<=40 and denoise_reuse=3 produced colour ringing and "
                        "ghosted limbs in h3.c's tests; drop one of the three")
    if values.get("token_reduction") and w == 256 and h == 256:
        warnings.append("token_reduction at 256x256: h3.c's README says to keep it off at this size")
    if n_steps is not None and n_steps < 8 and (dr > 1 or cr > 1):
        warnings.append(f"steps={n_steps} with reuse: at small step counts h3.c recommends denoise_reuse=1 "
                        "and core_reuse=1 so every pass runs the model")

    assert w is not None and h is not None and n_frames is not None
    opts = H3Options(**values)
    return H3Request(width=w, height=h, frames=n_frames, quant=q, steps=n_steps, options=opts), warnings
