"""Node inputs -> queue payloads. Pure functions: no Redis, no ComfyUI.

ComfyUI widgets always hold a value, so "use the model's default" needs a value of
its own: 0 for width, height, frames and steps, a negative guidance, an empty
negative prompt, and the quant choice "default". These become None (omitted) in
the payload, and `h3render.queue` fills in the model's defaults at enqueue.

Sweep axes come as text, parsed by the queue's own sweep syntax
(h3render.queue.sweep.parse_axis): "1-8", "1-9:2", "20,30", "4.5, 5.5";
prompts one per line. One value is fixed; several make an axis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from h3render.engine.builtin import DEFAULT_MODEL
from h3render.queue.errors import JobValidationError, Problem
from h3render.queue.sweep import from_flags

DEFAULT_QUANT = "default"  # the quant choice that means "the model's default level"


def render_payload(
    *,
    prompt: str,
    negative_prompt: str,
    seed: int,
    width: int,
    height: int,
    frames: int,
    steps: int,
    guidance: float,
    quant: str,
    model: str,
    preview_every: int = 0,
) -> dict[str, Any]:
    """The RenderJob payload for one H3 Render node's widget values (defaults omitted)."""
    payload: dict[str, Any] = {"prompt": prompt, "model": model, "seed": int(seed)}
    if int(preview_every) != 0:
        payload["preview_every"] = int(preview_every)
    if negative_prompt.strip():
        payload["negative_prompt"] = negative_prompt
    for name, value in (("width", width), ("height", height), ("frames", frames), ("steps", steps)):
        if int(value) != 0:
            payload[name] = int(value)
    if float(guidance) >= 0:
        payload["guidance"] = float(guidance)
    if quant and quant != DEFAULT_QUANT:
        payload["quant"] = quant
    return payload


def lines(text: str) -> list[str]:
    """Non-blank lines of a multiline widget, stripped at the ends."""
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def sweep_grid(
    *,
    model: str,
    quant: str,
    prompts: str,
    negative_prompts: str,
    seed: str,
    width: str,
    height: str,
    frames: str,
    steps: str,
    guidance: str,
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(fixed, axes) for one H3 Sweep node; an empty text means the model's default.

    Raises JobValidationError naming the field (as the queue's sweep parser does).
    """
    prompt_list = lines(prompts)
    if not prompt_list:
        raise JobValidationError([Problem("prompts", prompts, "needs at least one non-empty line (one prompt per line)",
                                          None)])
    flags: dict[str, list[str]] = {"model": [model], "prompt": prompt_list}
    if negative_prompts.strip():
        flags["negative_prompt"] = lines(negative_prompts)
    if quant.strip() and quant.strip() != DEFAULT_QUANT:
        flags["quant"] = [quant]
    for name, text in (("seed", seed), ("width", width), ("height", height), ("frames", frames),
                       ("steps", steps), ("guidance", guidance)):
        if str(text).strip():
            flags[name] = [str(text)]
    return from_flags(flags)


def quant_levels(info: Mapping[str, Any] | None) -> list[str]:
    """The quant levels an engine info lists ("quant_levels"), or none."""
    levels = (info or {}).get("quant_levels") or []
    return [str(q) for q in levels if isinstance(q, str)]


def merge_choices(
    published: Mapping[str, Mapping[str, Any] | None],
    local: Iterable[tuple[str, list[str]]],
) -> tuple[list[str], list[str]]:
    """Model and quant dropdown lists: what workers published first, then local models.

    published: model -> Engine.info() from Redis; local: (name, quant levels) pairs.
    The model list always holds the built-in default model (so a saved workflow
    validates even before anything is published); the quant list starts with
    DEFAULT_QUANT.
    """
    models: dict[str, None] = {}
    quants: dict[str, None] = {}
    for name, info in published.items():
        models.setdefault(name, None)
        for q in quant_levels(info):
            quants.setdefault(q, None)
    for name, levels in local:
        models.setdefault(name, None)
        for q in levels:
            quants.setdefault(q, None)
    models.setdefault(DEFAULT_MODEL, None)
    return list(models), [DEFAULT_QUANT] + [q for q in quants if q != DEFAULT_QUANT]
