"""The engine-independent rule of every job field, in words, with its nearest valid value.

RenderJob (h3render.queue.job) enforces these rules; this module explains a refusal:
`problems_from_pydantic` turns pydantic's errors into one Problem per bad field (field,
value, rule, nearest valid value), so messages never leak pydantic's internals. It
imports no other job module, so the job model and the engine layer
(h3render.queue.validation) both use it without an import cycle.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from h3render.engine.builtin import DEFAULT_MODEL
from h3render.engine.limits import MAX_FRAMES, MAX_SIDE
from h3render.queue.errors import Problem

SEED_MAX = 2**63 - 1  # the largest seed every front end takes (Redis and JSON readers keep it exact)
MAX_PROMPT_CHARS = 4000
SAMPLERS = ("unipc", "euler")
PRIORITIES = ("normal", "high")
# Quant level names: f16, q8_0, int8-row (h3.c). Lower-case letters, digits, '_' and '-'.
QUANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,15}$"
# The one table of defaults for a field the engine's info gives none for (info["defaults"] first,
# then these): Wan 2.1's pipeline defaults (diffusers' WanPipeline), 16 fps.
FALLBACK_DEFAULTS: dict[str, Any] = {
    "negative_prompt": "", "width": 832, "height": 480, "frames": 81, "steps": 50,
    "guidance": 5.0, "shift": 3.0, "sampler": "unipc", "fps": 16,
}  # fmt: skip
# The quant level of a job that names none, when the engine's defaults name none either (and the
# model has it; else its first usable level). The same for run, the queue, the nodes and tune.
DEFAULT_QUANT = "f16"
SHOWN_CHARS = 80  # an echoed value longer than this is cut (a 100 KB prompt must not make a 100 KB message)


def short(v: Any) -> Any:
    """v itself when its repr is short; else a text of about SHOWN_CHARS: the start of a long
    text with its length, or the start of any other value's repr."""
    r = repr(v)
    if len(r) <= SHOWN_CHARS:
        return v
    if isinstance(v, str):
        tail = f"... ({len(v)} characters)"
        return v[: max(SHOWN_CHARS - len(tail), 20)] + tail
    return r[: SHOWN_CHARS - 3] + "..."


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
            x = as_number(value)
            if x is None:
                return self.default
            x = min(max(x, self.lo), self.hi)
            if self.integer:
                x = int(min(max(round(x), math.ceil(self.lo)), math.floor(self.hi)))
            return x
        return self.default


def as_number(value: Any) -> float | None:
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
        return short(value.replace("\x00", "")[:MAX_PROMPT_CHARS])
    return None  # a missing or blank prompt has no nearest valid text


def _fix_negative(value: Any) -> Any:
    return short(value.replace("\x00", "")[:MAX_PROMPT_CHARS]) if isinstance(value, str) else ""


def _fix_name(value: Any) -> str:
    text = re.sub(r"[^A-Za-z0-9._-]", "-", str(value)).replace("..", ".").lstrip("._-")[:64]
    return text or DEFAULT_MODEL


def _fix_quant(value: Any) -> str:
    text = re.sub(r"[^a-z0-9_-]", "_", str(value).lower()).lstrip("_-")[:16]
    return text or "f16"


def _fix_seed(value: Any) -> Any:
    x = as_number(value)
    return "random" if x is None else int(min(max(round(x), 0), SEED_MAX))


_D = FALLBACK_DEFAULTS
# In RenderJob's field order (a test checks they stay the same list).
SPECS: dict[str, Spec] = {
    "prompt": Spec(f"is required: a text with at least one non-space character, at most {MAX_PROMPT_CHARS} "
                   "characters, no NUL", fix=_fix_prompt),
    "negative_prompt": Spec(f"must be a text of at most {MAX_PROMPT_CHARS} characters without NUL, or null for the "
                            "model's default", fix=_fix_negative),
    "seed": Spec(f"must be an integer in [0, {SEED_MAX}] or \"random\"", fix=_fix_seed),
    "width": Spec(f"must be an integer in [1, {MAX_SIDE}] (pixels)", 1, MAX_SIDE, True, default=_D["width"]),
    "height": Spec(f"must be an integer in [1, {MAX_SIDE}] (pixels)", 1, MAX_SIDE, True, default=_D["height"]),
    "frames": Spec(f"must be an integer in [1, {MAX_FRAMES}]", 1, MAX_FRAMES, True, default=_D["frames"]),
    "steps": Spec("must be an integer in [1, 1000]", 1, 1000, True, default=_D["steps"]),
    "guidance": Spec("must be a finite number in [0, 50]", 0, 50, default=_D["guidance"]),
    "shift": Spec("must be a finite number in (0, 100]", 0.01, 100, default=_D["shift"]),
    "sampler": Spec("must be one of " + ", ".join(SAMPLERS), choices=SAMPLERS),
    "quant": Spec("must be a quant level name: 1-16 lower-case letters, digits, '_' or '-', starting with a "
                  "letter or digit (f16, q8_0, int8-row, ...)", fix=_fix_quant),
    "model": Spec("must be a model name (not a path): 1-64 letters, digits, '.', '_' or '-', no '..'", fix=_fix_name),
    "fps": Spec("must be an integer in [1, 240]", 1, 240, True, default=_D["fps"]),
    "priority": Spec("must be one of " + ", ".join(PRIORITIES), choices=PRIORITIES),
    "engine_options": Spec("must be an object of at most 32 options {name: text|number|bool}", fix=lambda v: {}),
    "preview_every": Spec("must be an integer in [0, 1000]: a preview every n denoising steps, 0 for none",
                          0, 1000, True, default=0),
}
FIELDS = tuple(SPECS)
OPTION_KEY_RULE = "must be an option name: a lower-case letter, then up to 63 lower-case letters, digits or '_'"
OPTION_VALUE_RULE = "must be a number, a bool, or a text of at most 256 characters without ';', '=' or NUL"


def _fix_option_key(key: Any) -> str:
    text = re.sub(r"[^a-z0-9_]", "_", str(key).lower()).lstrip("0123456789_")[:64]
    return text or "option"


def _fix_option_value(value: Any) -> Any:
    if isinstance(value, (bool, int, float)) and not (isinstance(value, float) and not math.isfinite(value)):
        return value
    return short(re.sub(r"[;=\x00]", "_", str(value))[:256])


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
                short(shown), short(payload.get(name)), "unknown field; allowed: " + ", ".join(FIELDS),
                close[0] if close else "(remove the field)"))
            continue
        if name == "engine_options" and len(loc) >= 2 and isinstance(payload.get(name), dict):
            key = loc[1]
            is_key = len(loc) >= 3 and loc[2] == "[key]"
            shown = key if isinstance(key, str) and key.isprintable() else repr(key)  # a NUL stays visible
            field = f"engine_options.{short(shown)}" + (" (name)" if is_key else "")
            value = key if is_key else payload[name].get(key)
            rule, fix = (OPTION_KEY_RULE, _fix_option_key) if is_key else (OPTION_VALUE_RULE, _fix_option_value)
            problems.setdefault(field, Problem(field, short(value), rule, fix(value)))
            continue
        spec = SPECS.get(name)
        if spec is None:
            problems.setdefault(name, Problem(name, short(payload.get(name)), e["msg"], None))
            continue
        if e["type"] == "missing":
            problems.setdefault(name, Problem(name, None, spec.rule, spec.nearest(None)))
            continue
        value = payload.get(name)
        problems.setdefault(name, Problem(name, short(value), spec.rule, spec.nearest(value)))
    return list(problems.values())
