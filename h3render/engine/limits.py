"""Validate a render's width, height and frame count against what the engine allows.

Pure functions over the limits an engine publishes in its info JSON
(`size_multiple`, `frame_rule {multiple, offset}`, `max_pixels`). The CLI and
the job model both call `check_request`; the error names the field, the value,
the rule and the nearest valid values, e.g.

    frames=20 is not 4k+1; nearest valid: 17 or 21
    width=100 is not a multiple of 16; nearest valid: 96 or 112
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from h3render.engine.exceptions import InvalidRequestError

# Hard caps independent of the model: they keep values inside the C ABI's int32
# fields and far beyond any video an engine here can render.
MAX_SIDE = 16384
MAX_FRAMES = 16385


class FrameRule(BaseModel):
    """Valid frame counts are multiple*k + offset for k >= 0 (Wan: 4k+1)."""

    model_config = ConfigDict(frozen=True)
    multiple: int = Field(4, ge=1)
    offset: int = Field(1, ge=0)

    def describe(self) -> str:
        if self.multiple == 1:
            return f"at least {self.minimum}"
        if self.offset == 0:
            return f"a multiple of {self.multiple}"
        return f"{self.multiple}k+{self.offset}"

    @property
    def minimum(self) -> int:
        return self.offset if self.offset >= 1 else self.multiple


class EngineLimits(BaseModel):
    """The size and frame limits of one engine and model."""

    model_config = ConfigDict(frozen=True)
    size_multiple: int = Field(16, ge=1)
    frame_rule: FrameRule = FrameRule()
    max_pixels: int = Field(0, ge=0)  # width*height per frame; 0: no limit

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> "EngineLimits":
        """Read the limits from an engine's info dict (h3r_info_json)."""
        rule = info.get("frame_rule") or {}
        return cls(
            size_multiple=int(info.get("size_multiple", 16)),
            frame_rule=FrameRule(
                multiple=int(rule.get("multiple", 4)), offset=int(rule.get("offset", 1))
            ),
            max_pixels=int(info.get("max_pixels", 0) or 0),
        )


class LimitError(InvalidRequestError):
    """A width, height or frame count the engine cannot render.

    `field`, `value`, `rule` and `nearest` (valid values closest to `value`)
    are kept as attributes so front ends can offer the fix.
    """

    def __init__(self, field: str, value: Any, rule: str, nearest: tuple[Any, ...], why: str = ""):
        self.field, self.value, self.rule, self.nearest = field, value, rule, nearest
        why = why or f"is not {rule}"
        text = f"{field}={value} {why}"
        if nearest:
            text += "; nearest valid: " + " or ".join(str(v) for v in nearest)
        super().__init__(text)


def nearest_on_grid(value: int, multiple: int, offset: int, minimum: int, maximum: int) -> tuple[int, ...]:
    """Valid values offset + multiple*k in [minimum, maximum] closest to `value`.

    Returns (below, above) when `value` lies between two valid values, else the
    single closest one. Assumes at least one valid value exists in the range.
    """
    def first_at_least(v: int) -> int:
        return offset + multiple * max(0, -(-(v - offset) // multiple))

    def last_at_most(v: int) -> int:
        return offset + multiple * ((v - offset) // multiple)

    lo_valid, hi_valid = first_at_least(minimum), last_at_most(maximum)
    if value <= lo_valid:
        return (lo_valid,)
    if value >= hi_valid:
        return (hi_valid,)
    below, above = last_at_most(value), first_at_least(value)
    return (below,) if below == above else (below, above)


def _require_int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitError(field, repr(value), "an integer", (), why="is not an integer")
    return value


def check_size(field: str, value: Any, multiple: int) -> int:
    """Check one side (width or height): a positive multiple of `multiple`, at most MAX_SIDE."""
    value = _require_int(field, value)
    rule = f"a multiple of {multiple}"
    top = MAX_SIDE - MAX_SIDE % multiple
    nearest = nearest_on_grid(value, multiple, 0, multiple, top)
    if value < multiple:
        raise LimitError(field, value, rule, nearest, why=f"is below the minimum {multiple} ({rule})")
    if value > top:
        raise LimitError(field, value, rule, nearest, why=f"is above the maximum {top} ({rule})")
    if value % multiple:
        raise LimitError(field, value, rule, nearest)
    return value


def check_frames(frames: Any, rule: FrameRule, field: str = "frames") -> int:
    """Check a frame count against the engine's frame rule (Wan: 4k+1)."""
    frames = _require_int(field, frames)
    text = rule.describe()
    top = rule.offset + rule.multiple * ((MAX_FRAMES - rule.offset) // rule.multiple)
    nearest = nearest_on_grid(frames, rule.multiple, rule.offset, rule.minimum, top)
    if frames < rule.minimum:
        raise LimitError(field, frames, text, nearest, why=f"is below the minimum {rule.minimum} ({text})")
    if frames > top:
        raise LimitError(field, frames, text, nearest, why=f"is above the maximum {top} ({text})")
    if (frames - rule.offset) % rule.multiple:
        raise LimitError(field, frames, text, nearest)
    return frames


def check_pixels(width: int, height: int, max_pixels: int, multiple: int) -> None:
    """Check width*height against max_pixels (0: no limit).

    The suggestion keeps the aspect ratio: the largest WxH on the size grid
    that fits.
    """
    if not max_pixels or width * height <= max_pixels:
        return
    scale = math.sqrt(max_pixels / (width * height))
    w = max(multiple, int(width * scale) // multiple * multiple)
    h = max(multiple, int(height * scale) // multiple * multiple)
    while w * h > max_pixels and (w > multiple or h > multiple):
        if w >= h:
            w -= multiple
        else:
            h -= multiple
    raise LimitError(
        "width*height",
        f"{width}x{height} ({width * height} pixels)",
        f"at most {max_pixels} pixels",
        (f"{w}x{h}",),
        why=f"exceeds max_pixels={max_pixels}",
    )


def check_request(width: Any, height: Any, frames: Any, limits: EngineLimits) -> tuple[int, int, int]:
    """Validate a render's size and length; raise LimitError on the first bad field."""
    width = check_size("width", width, limits.size_multiple)
    height = check_size("height", height, limits.size_multiple)
    frames = check_frames(frames, limits.frame_rule)
    check_pixels(width, height, limits.max_pixels, limits.size_multiple)
    return width, height, frames
