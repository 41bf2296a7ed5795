"""Sweeps: a grid of jobs from axes, given as CLI flags or a TOML file. Pure functions.

Axis values are lists (TOML) or text (flags): "1-8" (inclusive range), "1-9:2"
(range with step), "20,30" and "4.5,5.5" (lists), mixed ("1-4,10"); "random"
in a seed list draws a seed per job at enqueue. Prompts are never split on
commas: each --prompt flag (or each TOML list entry) is one value.

Order: the grid is the cartesian product with `model` and `quant` outermost,
so jobs that use the same weights run next to each other and stay in the page cache.
A preview pass renders every combination small and short first
(PREVIEW_SCALE per side, the shortest clip with motion), then the full versions.

TOML file, the same axes; a list is an axis, a scalar is fixed for every job:

    prompt = ["a red fox in snow", "a lighthouse at dusk"]
    seed = "1-8"           # or [1, 2, 3]
    steps = [20, 30]
    quant = ["q8_0", "q4_0"]
    guidance = [4.5, 5.5]
    width = 480
    preview = true         # optional: the preview pass first
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, from PyPI, before it joined the standard library
    import tomli as tomllib

from h3render.engine.limits import EngineLimits
from h3render.queue.errors import JobValidationError, Problem
from h3render.queue.job import RenderJob
from h3render.queue.rules import short

INT_AXES = ("seed", "steps", "width", "height", "frames", "fps")
FLOAT_AXES = ("guidance", "shift")
TEXT_AXES = ("model", "quant", "sampler", "prompt", "negative_prompt")
AXES = ("model", "quant") + tuple(a for a in RenderJob.model_fields if a in INT_AXES + FLOAT_AXES + TEXT_AXES
                                  and a not in ("model", "quant"))
MAX_JOBS = 100_000
PREVIEW_SCALE = 0.5

_RANGE = re.compile(r"^\s*(-?\d+)\s*-\s*(-?\d+)\s*(?::\s*(\d+)\s*)?$")
_SYNTAX = "a list like 20,30 or an inclusive range like 1-8 or 1-9:2"


def parse_axis(name: str, text: str) -> list[Any]:
    """Values of one numeric or named axis from flag text; raises JobValidationError on `name`."""
    if name in ("prompt", "negative_prompt"):
        return [text]
    values: list[Any] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            raise _bad(name, text, f"has an empty item; {_SYNTAX}", ",".join(p.strip() for p in text.split(",") if p.strip()) or None)
        if name in INT_AXES:
            if name == "seed" and part == "random":
                values.append("random")
                continue
            m = _RANGE.match(part)
            if m:
                a, b, step = int(m[1]), int(m[2]), int(m[3] or 1)
                if step < 1 or b < a:
                    raise _bad(name, part, f"is an empty range; {_SYNTAX}", f"{min(a, b)}-{max(a, b)}")
                if (b - a) // step + 1 > MAX_JOBS:
                    raise _bad(name, part, f"has more than {MAX_JOBS} values", f"{a}-{a + MAX_JOBS - 1}")
                values.extend(range(a, b + 1, step))
                continue
            try:
                values.append(int(part))
            except ValueError:
                raise _bad(name, part, f"is not an integer; {_SYNTAX}", _int_guess(part)) from None
        elif name in FLOAT_AXES:
            try:
                x = float(part)
            except ValueError:
                x = math.nan
            if not math.isfinite(x):
                raise _bad(name, part, "is not a finite number; a list like 4.5,5.5", None)
            values.append(x)
        else:
            values.append(part)
    return values


def _int_guess(part: str) -> Any:
    m = re.search(r"-?\d+", part)
    return int(m[0]) if m else None


def _bad(name: str, value: Any, rule: str, nearest: Any) -> JobValidationError:
    return JobValidationError([Problem(name, value, rule, nearest)])


def from_flags(flags: Mapping[str, Sequence[str]]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(fixed, axes) from repeated flag texts {field: [text, ...]}; one value means fixed."""
    fixed: dict[str, Any] = {}
    axes: dict[str, list[Any]] = {}
    for name, texts in flags.items():
        if not texts:
            continue
        if name not in AXES:
            raise _bad(name, texts, "is not a sweep axis; axes: " + ", ".join(AXES), None)
        values = [v for t in texts for v in parse_axis(name, t)]
        if len(values) == 1:
            fixed[name] = values[0]
        else:
            axes[name] = values
    return fixed, axes


_TOML_AT = re.compile(r"^(?P<msg>.*?)\s*\((?:at line (?P<line>\d+), column (?P<col>\d+)|at end of document)\)\s*$",
                      re.S)


def toml_problem(e: Exception, text: str, source: str) -> Problem:
    """The parser's error as a Problem naming the file, the line and the column, with that line's text
    as the value (tomllib and tomli say where in their message; newer ones also as attributes)."""
    m = _TOML_AT.match(str(e))
    msg = m["msg"] if m else str(e)
    lines = text.splitlines() or [""]
    line, col = getattr(e, "lineno", None), getattr(e, "colno", None)
    if line is None and m and m["line"]:
        line, col = int(m["line"]), int(m["col"])
    if line is None:  # at the end of the document
        line, col = len(lines), len(lines[-1]) + 1
    shown = lines[line - 1] if 0 < line <= len(lines) else ""
    return Problem(f"{source} line {line}, column {col}", short(shown), f"is not valid TOML: {msg}", None)


def from_toml(text: str, source: str = "sweep file") -> tuple[dict[str, Any], dict[str, list[Any]], bool]:
    """(fixed, axes, preview) from a TOML sweep file; raises JobValidationError naming the key, or for
    text that is not TOML, the file (`source`), line and column."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobValidationError([toml_problem(e, text, source)]) from None
    preview = doc.pop("preview", False)
    if not isinstance(preview, bool):
        raise _bad("preview", preview, "must be true or false", bool(preview))
    fixed: dict[str, Any] = {}
    axes: dict[str, list[Any]] = {}
    for name, value in doc.items():
        if name not in RenderJob.model_fields:
            import difflib

            close = difflib.get_close_matches(name, list(RenderJob.model_fields) + ["preview"], n=1, cutoff=0.0)
            raise _bad(name, value, "is not a job field or sweep option", close[0] if close else None)
        if isinstance(value, list):
            if not value:
                raise _bad(name, value, "is an empty list; give at least one value", None)
            axes[name] = value
        elif isinstance(value, str) and name in INT_AXES and name in AXES and not value.strip().isdigit():
            parsed = parse_axis(name, value)
            if len(parsed) == 1:
                fixed[name] = parsed[0]
            else:
                axes[name] = parsed
        else:
            fixed[name] = value
    if any(n not in AXES for n in axes):
        bad = next(n for n in axes if n not in AXES)
        raise _bad(bad, axes[bad], "is not a sweep axis (give one value); axes: " + ", ".join(AXES), axes[bad][0])
    return fixed, axes, preview


def grid_size(axes: Mapping[str, list[Any]]) -> int:
    return math.prod(len(v) for v in axes.values()) if axes else 1


def expand(fixed: Mapping[str, Any], axes: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination as a payload dict, ordered with model and quant outermost."""
    n = grid_size(axes)
    if n > MAX_JOBS:
        sizes = " x ".join(f"{k}:{len(v)}" for k, v in axes.items())
        raise _bad("sweep", sizes, f"has {n} jobs; at most {MAX_JOBS}", MAX_JOBS)
    names = [a for a in AXES if a in axes] + [a for a in axes if a not in AXES]
    return [{**fixed, **dict(zip(names, combo))} for combo in itertools.product(*(axes[a] for a in names))]


def preview_version(job: RenderJob, info: Mapping[str, Any]) -> RenderJob:
    """The same job small and short: each side scaled by PREVIEW_SCALE (on the size grid,
    at least one grid step) and the shortest valid clip with motion (Wan: 5 frames)."""
    limits = EngineLimits.from_info(info)
    m = limits.size_multiple

    def side(v: int) -> int:
        return max(m, int(v * PREVIEW_SCALE) // m * m)

    rule = limits.frame_rule
    short = rule.offset + rule.multiple if rule.offset + rule.multiple > rule.minimum else rule.minimum + rule.multiple
    frames = min(int(job.frames), short)
    update: dict[str, Any] = {"width": side(job.width), "height": side(job.height), "frames": frames}
    if info.get("engine") == "h3.c":  # an internal canvas may not exceed the smaller output: drop it
        update["engine_options"] = {k: v for k, v in job.engine_options.items()
                                    if k not in ("render_width", "render_height")}
    return job.model_copy(update=update)
