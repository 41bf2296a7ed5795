"""The engine layer of job validation: a job's fields against the engine that will render it.

Pure functions over an engine info dict (Engine.info() plus the facts workers publish,
h3render.queue.engine_info); no I/O. Every problem names the field, the value, the rule
and the nearest valid value. h3render.queue.contract fills a job's defaults and calls
`engine_check`; the engine-independent rules are h3render.queue.rules'.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from h3render.engine.limits import EngineLimits, LimitError, check_frames, check_pixels, check_size
from h3render.queue.errors import JobValidationError, Problem
from h3render.queue.rules import FIELDS, SPECS, problems_from_pydantic, short  # noqa: F401 - re-exported

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


def engine_check(values: dict[str, Any], info: Mapping[str, Any],
                 model: str) -> tuple[list[Problem], list[str], dict[str, Any]]:
    """(problems, warnings, updates) of a job's concrete fields (defaults filled) against the
    engine described by `info`:
      - h3.c (info["engine"] == "h3.c"): h3render.engine.h3.options first; its normalized
        values are the updates (frames rounded up to 17n+5, quant aliases, typed
        engine_options) and its warnings are returned;
      - then, for every engine, width/height/frames (h3render.engine.limits), the quant
        level against the model's usable levels (an unusable one with its reason), the
        sampler against info["samplers"], preview_every against steps, and the engine
        options against the ones the engine accepts.
    Every problem is listed; none is raised."""
    levels = [str(q) for q in info.get("quant_levels") or []]
    problems: list[Problem] = []
    warnings: list[str] = []
    updates: dict[str, Any] = {}
    engine_checked = False
    if is_h3(info):
        from h3render.engine.h3.options import H3OptionsError, validate_h3_options

        try:
            request, warnings = validate_h3_options(values["engine_options"], values["width"], values["height"],
                                                    values["frames"], quant=values["quant"], steps=values["steps"])
        except H3OptionsError as e:
            problems.extend(_limit_problem(p) for p in e.problems)
            engine_checked = True  # size, frames, quant and options are reported; the rules below would repeat them
        else:
            updates = request.job_updates()
    else:
        problems += option_problems(values.get("engine_options") or {}, info, model)
    if not engine_checked:
        problems += _generic_limit_problems({**values, **updates}, levels, info, model)
    samplers = [str(s) for s in info.get("samplers") or []]
    if samplers and values["sampler"] not in samplers:
        problems.append(Problem("sampler", values["sampler"],
                                f"must be one of the samplers of model {model!r}'s engine: {', '.join(samplers)}",
                                samplers[0]))
    steps = values["steps"]
    if isinstance(steps, int) and values["preview_every"] > steps:
        problems.append(Problem("preview_every", values["preview_every"],
                                f"must be at most steps={steps} (a preview every n denoising steps; 0: none)", steps))
    return problems, warnings, updates


def option_problems(options: Mapping[str, Any], info: Mapping[str, Any], model: str) -> list[Problem]:
    """An unknown engine option, refused naming the options the engine accepts (nothing is
    checked when the info does not say which it accepts)."""
    from h3render.queue.engine_info import engine_options

    known = engine_options(info)
    if known is None:
        return []
    names = sorted(known)
    out = []
    for key, value in options.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
            out.append(Problem(f"engine_options.{short(key)}", short(value),
                               f"is not an option of the engine of model {model!r}; its options: "
                               f"{', '.join(names) or 'none'}", close[0] if close else "(remove the option)"))
    return out


def prompt_warnings(job_fields: Mapping[str, Any], info: Mapping[str, Any], model: str) -> list[str]:
    """Warnings for the prompt and the negative prompt a job gives (not the model's default)
    when the model publishes a vocabulary (h3render.queue.vocabulary)."""
    words = info.get("vocabulary")
    if not isinstance(words, list) or not words:
        return []
    from h3render.queue.vocabulary import prompt_warnings as warn

    text_len = info.get("text_len") if isinstance(info.get("text_len"), int) else None
    out = []
    for field in ("prompt", "negative_prompt"):
        text = job_fields.get(field)
        if isinstance(text, str) and text.strip():
            out += warn(field, text, [str(w) for w in words], model, text_len)
    return out


def _generic_limit_problems(values: dict[str, Any], levels: list[str], info: Mapping[str, Any],
                            model: str) -> list[Problem]:
    """Quant level, width, height, frames and width*height against any engine's info."""
    problems: list[Problem] = []
    unusable = info.get("unusable_levels") if isinstance(info.get("unusable_levels"), Mapping) else {}
    if levels and values["quant"] not in levels:
        why = unusable.get(values["quant"])
        rule = (f"is unusable in model {model!r}: {why}; usable levels: {', '.join(levels)}" if why else
                f"must be one of the quant levels of model {model!r}: {', '.join(levels)}")
        problems.append(Problem("quant", values["quant"], rule, _nearest_quant(values["quant"], levels)))
    limits = EngineLimits.from_info(info)
    checks = [
        lambda: check_size("width", values["width"], limits.size_multiple),
        lambda: check_size("height", values["height"], limits.size_multiple),
        lambda: check_frames(values["frames"], limits.frame_rule),
    ]
    size: list[Problem] = []
    for check in checks:  # each on its own, so every bad field is listed
        try:
            check()
        except LimitError as e:
            size.append(_limit_problem(e))
    if not any(p.field in ("width", "height") for p in size):  # the area of sides that are valid
        try:
            check_pixels(values["width"], values["height"], limits.max_pixels, limits.size_multiple)
        except LimitError as e:
            size.append(_limit_problem(e))
    return problems + size


def engine_nearest(field: str, value: Any, info: Mapping[str, Any]) -> Any:
    """`value` of width, height or frames moved onto the engine's grid when it is off it (the static
    layer's nearest value, 1 for a width of 0, may not be one the engine takes); else `value`."""
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    limits = EngineLimits.from_info(info)
    try:
        if field in ("width", "height"):
            check_size(field, value, limits.size_multiple)
        elif field == "frames":
            check_frames(value, limits.frame_rule)
    except LimitError as e:
        return _limit_problem(e).nearest
    return value


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
    raise JobValidationError([Problem(field, short(value), ID_RULE, nearest)])
