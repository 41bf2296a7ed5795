"""Job validation that explains itself: every problem names field, value, rule and nearest valid value.

Two pure layers:
  problems_from_pydantic(err, payload)  the engine-independent rules of RenderJob
  resolve(job, info, rng)               the target engine's limits and defaults
Neither does I/O; h3render.queue.engine_info finds the `info` dict.
"""

from __future__ import annotations

import difflib
import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from h3render.engine.builtin import DEFAULT_MODEL
from h3render.engine.limits import (
    MAX_FRAMES,
    MAX_SIDE,
    EngineLimits,
    LimitError,
    check_frames,
    check_pixels,
    check_size,
)
from h3render.queue.errors import JobValidationError, Problem
from h3render.queue.job import MAX_PROMPT_CHARS, PRIORITIES, SAMPLERS, SEED_MAX, RenderJob

# Fallbacks when an engine's info has no "defaults" entry for a field.
FALLBACK_DEFAULTS: dict[str, Any] = {
    "negative_prompt": "",
    "width": 832,
    "height": 480,
    "frames": 81,
    "steps": 30,
    "guidance": 5.0,
    "shift": 3.0,
    "sampler": "unipc",
    "fps": 16,
}


@dataclass(frozen=True)
class Spec:
    """The engine-independent rule of one field and how to find its nearest valid value."""

    rule: str
    lo: float | None = None
    hi: float | None = None
    integer: bool = False
    choices: tuple[str, ...] = ()
    default: Any = None
    fix: Callable[[Any], Any] | None = None

    def nearest(self, value: Any) -> Any:
        if self.fix is not None:
            return self.fix(value)
        if self.choices:
            close = difflib.get_close_matches(str(value).lower(), self.choices, n=1, cutoff=0.0)
            return close[0] if close else self.choices[0]
        if self.lo is not None:
            x = _as_number(value)
            if x is None:
                return self.default
            x = min(max(x, self.lo), self.hi)
            if self.integer:
                x = int(min(max(round(x), math.ceil(self.lo)), math.floor(self.hi)))
            return x
        return self.default


def _as_number(value: Any) -> float | None:
    """A finite number read from value (bools and non-numeric text are not numbers)."""
    if isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return x if math.isfinite(x) else None


def _fix_prompt(value: Any) -> Any:
    if isinstance(value, str) and value.replace("\x00", "").strip():
        return value.replace("\x00", "")[:MAX_PROMPT_CHARS]
    return None  # a missing or blank prompt has no nearest valid text


def _fix_name(value: Any) -> str:
    text = re.sub(r"[^A-Za-z0-9._-]", "-", str(value)).replace("..", ".").lstrip("._-")[:64]
    return text or DEFAULT_MODEL


def _fix_quant(value: Any) -> str:
    text = re.sub(r"[^a-z0-9_-]", "_", str(value).lower()).lstrip("_-")[:16]
    return text or "f16"


def _fix_seed(value: Any) -> Any:
    x = _as_number(value)
    return "random" if x is None else int(min(max(round(x), 0), SEED_MAX))


SPECS: dict[str, Spec] = {
    "prompt": Spec(f"is required: a text with at least one non-space character, at most {MAX_PROMPT_CHARS} "
                   "characters, no NUL", fix=_fix_prompt),
    "negative_prompt": Spec(f"must be a text of at most {MAX_PROMPT_CHARS} characters without NUL, or null for the "
                            "model's default",
                            fix=lambda v: v.replace("\x00", "")[:MAX_PROMPT_CHARS] if isinstance(v, str) else ""),
    "seed": Spec(f"must be an integer in [0, {SEED_MAX}] or \"random\"", fix=_fix_seed),
    "width": Spec(f"must be an integer in [1, {MAX_SIDE}] (pixels)", 1, MAX_SIDE, True, default=832),
    "height": Spec(f"must be an integer in [1, {MAX_SIDE}] (pixels)", 1, MAX_SIDE, True, default=480),
    "frames": Spec(f"must be an integer in [1, {MAX_FRAMES}]", 1, MAX_FRAMES, True, default=81),
    "steps": Spec("must be an integer in [1, 1000]", 1, 1000, True, default=30),
    "guidance": Spec("must be a finite number in [0, 50]", 0, 50, default=5.0),
    "shift": Spec("must be a finite number in (0, 100]", 0.01, 100, default=3.0),
    "sampler": Spec("must be one of " + ", ".join(SAMPLERS), choices=SAMPLERS),
    "quant": Spec("must be a quant level name: 1-16 lower-case letters, digits, '_' or '-', starting with a "
                  "letter or digit (f16, q8_0, int8-row, ...)", fix=_fix_quant),
    "model": Spec("must be a model name (not a path): 1-64 letters, digits, '.', '_' or '-', no '..'", fix=_fix_name),
    "fps": Spec("must be an integer in [1, 240]", 1, 240, True, default=16),
    "priority": Spec("must be one of " + ", ".join(PRIORITIES), choices=PRIORITIES),
    "engine_options": Spec("must be an object of at most 32 options {name: text|number|bool}", fix=lambda v: {}),
    "preview_every": Spec("must be an integer in [0, 1000]: a preview every n denoising steps, 0 for none",
                          0, 1000, True, default=0),
}
FIELDS = tuple(RenderJob.model_fields)
OPTION_KEY_RULE = "must be an option name: a lower-case letter, then up to 63 lower-case letters, digits or '_'"
OPTION_VALUE_RULE = "must be a number, a bool, or a text of at most 256 characters without ';', '=' or NUL"


def _fix_option_key(key: Any) -> str:
    text = re.sub(r"[^a-z0-9_]", "_", str(key).lower()).lstrip("0123456789_")[:64]
    return text or "option"


def _fix_option_value(value: Any) -> Any:
    if isinstance(value, (bool, int, float)) and not (isinstance(value, float) and not math.isfinite(value)):
        return value
    return re.sub(r"[;=\x00]", "_", str(value))[:256]


def problems_from_pydantic(err: ValidationError, payload: Mapping[str, Any]) -> list[Problem]:
    """One Problem per bad field of a RenderJob payload, in the order pydantic found them.

    pydantic reports a union field once per member; this folds them into one problem
    with the field's own rule (SPECS), so messages never leak pydantic internals.
    """
    problems: dict[str, Problem] = {}
    for e in err.errors():
        loc = e["loc"]
        name = str(loc[0]) if loc else "job"
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(name, FIELDS, n=1, cutoff=0.6)
            shown = name if name.isidentifier() else repr(name)  # "" or "a b" stay visible
            problems.setdefault(name, Problem(
                shown, _short(payload.get(name)), "unknown field; allowed: " + ", ".join(FIELDS),
                close[0] if close else "(remove the field)"))
            continue
        if name == "engine_options" and len(loc) >= 2 and isinstance(payload.get(name), dict):
            key = loc[1]
            is_key = len(loc) >= 3 and loc[2] == "[key]"
            shown = key if isinstance(key, str) and key.isprintable() else repr(key)  # a NUL stays visible
            field = f"engine_options.{shown}" + (" (name)" if is_key else "")
            value = key if is_key else payload[name].get(key)
            rule, fix = (OPTION_KEY_RULE, _fix_option_key) if is_key else (OPTION_VALUE_RULE, _fix_option_value)
            problems.setdefault(field, Problem(field, _short(value), rule, fix(value)))
            continue
        spec = SPECS.get(name)
        if spec is None:
            problems.setdefault(name, Problem(name, _short(payload.get(name)), e["msg"], None))
            continue
        if e["type"] == "missing":
            problems.setdefault(name, Problem(name, None, spec.rule, spec.nearest(None)))
            continue
        value = payload.get(name)
        problems.setdefault(name, Problem(name, _short(value), spec.rule, spec.nearest(value)))
    return list(problems.values())


def _short(v: Any) -> Any:
    r = repr(v)
    return v if len(r) <= 80 else r[:77] + "..."


# ---- engine limits ---------------------------------------------------------------------------


# Quant levels from most to least precise; the nearest valid level is the closest in this order.
QUANT_ORDER = ("f32", "bf16", "f16", "q8_0", "q6_k", "q5_k", "q5_1", "q5_0", "q4_k", "q4_1", "q4_0", "q3_k", "q2_k")


def _nearest_quant(value: str, levels: list[str]) -> str:
    """The model's level closest in precision to `value` (by spelling if either is unranked)."""
    ranked = [q for q in levels if q in QUANT_ORDER]
    if value in QUANT_ORDER and ranked:
        at = QUANT_ORDER.index(value)
        return min(ranked, key=lambda q: (abs(QUANT_ORDER.index(q) - at), QUANT_ORDER.index(q)))
    close = difflib.get_close_matches(value, levels, n=1, cutoff=0.0)
    return close[0] if close else levels[0]


H3_ENGINE = "h3.c"  # Engine.info()["engine"] of the bridge to antirez's h3.c (csrc/h3bridge)


def is_h3(info: Mapping[str, Any]) -> bool:
    """True when `info` describes the h3.c bridge (its options and limits apply)."""
    return info.get("engine") == H3_ENGINE


def resolve(job: RenderJob, info: Mapping[str, Any], rng: random.Random | None = None) -> RenderJob:
    """The job made concrete for the engine described by `info`; see resolve_with_warnings."""
    return resolve_with_warnings(job, info, rng)[0]


def resolve_with_warnings(
    job: RenderJob, info: Mapping[str, Any], rng: random.Random | None = None
) -> tuple[RenderJob, list[str]]:
    """The job made concrete for the engine described by `info` (an Engine.info() dict),
    and the warnings to record with it.

    Fills every None field from info["defaults"] (else FALLBACK_DEFAULTS), draws a
    random seed if asked, and checks the fields against the engine:
      - h3.c (info["engine"] == "h3.c"): h3render.engine.h3.options first. Its
        normalized values replace the job's (frames rounded up to 17n+5, quant
        aliases, typed engine_options) and its warnings are returned;
      - then, for every engine, width/height/frames (h3render.engine.limits), the
        quant level against the model's, the sampler against info["samplers"] and
        preview_every against steps.
    Raises JobValidationError listing every problem.
    """
    engine_fps = {"fps": int(info["fps"])} if isinstance(info.get("fps"), int) and info["fps"] > 0 else {}
    defaults = {**FALLBACK_DEFAULTS, **engine_fps, **(info.get("defaults") or {})}
    levels = [str(q) for q in info.get("quant_levels") or []]
    values = job.model_dump()
    for name, value in values.items():
        if value is None and name in defaults:
            values[name] = defaults[name]
    if values["quant"] is None:
        values["quant"] = defaults.get("quant") or (levels[0] if levels else "f16")
    if values["fps"] is None:
        values["fps"] = int(info.get("fps") or 16)
    if values["seed"] == "random":
        values["seed"] = (rng or random.SystemRandom()).randrange(0, 2**32)

    problems: list[Problem] = []
    warnings: list[str] = []
    engine_checked = False
    if is_h3(info):
        from h3render.engine.h3.options import H3OptionsError, validate_h3_options

        try:
            request, warnings = validate_h3_options(values["engine_options"], values["width"], values["height"],
                                                    values["frames"], quant=values["quant"], steps=values["steps"])
        except H3OptionsError as e:
            problems.extend(_limit_problem(p) for p in e.problems)
            engine_checked = True  # size, frames and quant are reported; the generic rules would repeat them
        else:
            values.update(request.job_updates())
    if not engine_checked:
        problems += _generic_limit_problems(values, levels, info, job.model)
    samplers = [str(s) for s in info.get("samplers") or []]
    if samplers and values["sampler"] not in samplers:
        problems.append(Problem("sampler", values["sampler"],
                                f"must be one of the samplers of model {job.model!r}'s engine: {', '.join(samplers)}",
                                samplers[0]))
    steps = values["steps"]
    if isinstance(steps, int) and values["preview_every"] > steps:
        problems.append(Problem("preview_every", values["preview_every"],
                                f"must be at most steps={steps} (a preview every n denoising steps; 0: none)", steps))
    if problems:
        raise JobValidationError(problems)
    try:
        return RenderJob.model_validate(values), warnings
    except ValidationError as e:  # a default from the engine broke a static rule
        raise JobValidationError(problems_from_pydantic(e, values)) from None


def _generic_limit_problems(values: dict[str, Any], levels: list[str], info: Mapping[str, Any],
                            model: str) -> list[Problem]:
    """Quant level, width, height, frames and width*height against any engine's info."""
    problems: list[Problem] = []
    if levels and values["quant"] not in levels:
        problems.append(Problem("quant", values["quant"],
                                f"must be one of the quant levels of model {model!r}: {', '.join(levels)}",
                                _nearest_quant(values["quant"], levels)))
    limits = EngineLimits.from_info(info)
    checks = [
        lambda: check_size("width", values["width"], limits.size_multiple),
        lambda: check_size("height", values["height"], limits.size_multiple),
        lambda: check_frames(values["frames"], limits.frame_rule),
    ]
    for check in checks:  # each on its own, so every bad field is listed
        try:
            check()
        except LimitError as e:
            problems.append(_limit_problem(e))
    if not problems:
        try:
            check_pixels(values["width"], values["height"], limits.max_pixels, limits.size_multiple)
        except LimitError as e:
            problems.append(_limit_problem(e))
    return problems


def _limit_problem(e: LimitError) -> Problem:
    """A Problem from h3render.engine.limits' error: its reason, and its nearest value(s).

    LimitError gives (below, above) when two valid values are equally near; both are kept.
    """
    msg, prefix = str(e), f"{e.field}={e.value} "
    rule = msg[len(prefix):].split("; nearest valid")[0] if msg.startswith(prefix) else f"must be {e.rule}"
    nearest = e.nearest[0] if len(e.nearest) == 1 else " or ".join(str(v) for v in e.nearest) or None
    return Problem(e.field, e.value, rule, nearest)


# ---- ids --------------------------------------------------------------------------------------

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
ID_RULE = ("must be an id as enqueue prints it (j-... for a job, s-... for a sweep): 1-128 letters, digits, "
           "'.', '_', ':' or '-', no NUL or other control characters")


def check_id(field: str, value: Any) -> str:
    """`value` if it is a well-formed job or sweep id; else JobValidationError naming `field`.

    Ids become Redis keys and folder names: a NUL or a '/' in one is refused here, once,
    not retried wherever it would fail later."""
    if isinstance(value, str) and ID_PATTERN.fullmatch(value):
        return value
    text = value if isinstance(value, str) else str(value)
    nearest = re.sub(r"[^A-Za-z0-9._:-]", "", text).lstrip("._:-")[:128] or None
    raise JobValidationError([Problem(field, _short(value), ID_RULE, nearest)])
