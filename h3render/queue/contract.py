"""The job contract: every way in turns a job into an engine request here, the same way.

`h3render run`, `enqueue`/`sweep`, the ComfyUI nodes (through the queue), the dashboard,
`eval-demo` and `tune` all go through three steps, so one seed gives one video whichever
door it came in by:

    check(payload, info_for)      RenderJob.parse (h3render.queue.rules' static rules), then the
                                  engine's limits (h3render.queue.validation) with the model's
                                  defaults filled in: every problem of both layers in one
                                  JobValidationError, or (resolved job, warnings, info)
    resolve_with_warnings(job, info)   the engine layer alone, for a job already parsed
    request(job, info, model_dir) the engine's GenerateRequest of a resolved job (the prompt
                                  tokenized as the model's pipeline does)

Defaults, in order: the engine's info["defaults"], its info["fps"], then the one table
h3render.queue.rules.FALLBACK_DEFAULTS. A job that names no quant level gets the engine
default's, else DEFAULT_QUANT (f16) when the model has it usable, else its first usable
level. `seed="random"` is drawn here, once, and recorded in the resolved job.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from h3render.queue.errors import JobValidationError, Problem
from h3render.queue.job import RenderJob
from h3render.queue.rules import DEFAULT_QUANT, FALLBACK_DEFAULTS, FIELDS, problems_from_pydantic
from h3render.queue.validation import engine_check, engine_nearest, prompt_warnings

SEED_DRAW = 2**32  # a drawn seed is below this (it shows and types easily); any seed up to SEED_MAX is taken
# A problem of the engine layer that a bad field of the static layer makes meaningless: the static
# problem replaced the field by its default, and a check that reads it would blame the default.
DEPENDS_ON = {"preview_every": ("steps",), "width*height": ("width", "height")}
PLACEHOLDER_PROMPT = "x"  # stands in for a bad prompt while the engine layer checks the other fields


@dataclass(frozen=True)
class Checked:
    """A job that passed both layers: complete (every field concrete), the warnings to show and
    record with it, and the engine info it was checked against."""

    job: RenderJob
    warnings: list[str] = field(default_factory=list)
    info: Mapping[str, Any] = field(default_factory=dict)


def defaults_of(info: Mapping[str, Any]) -> dict[str, Any]:
    """Every field's default for the engine described by `info` (quant excepted: default_quant)."""
    fps = {"fps": int(info["fps"])} if isinstance(info.get("fps"), int) and info["fps"] > 0 else {}
    return {**FALLBACK_DEFAULTS, **fps, **(info.get("defaults") or {})}


def default_quant(info: Mapping[str, Any]) -> str:
    """The quant level of a job that names none (see the module doc)."""
    named = (info.get("defaults") or {}).get("quant")
    if named:
        return str(named)
    levels = [str(q) for q in info.get("quant_levels") or []]
    if not levels or DEFAULT_QUANT in levels:
        return DEFAULT_QUANT
    return levels[0]


def resolve(job: RenderJob, info: Mapping[str, Any], rng: random.Random | None = None) -> RenderJob:
    """The job made concrete for the engine described by `info`; see resolve_with_warnings."""
    return resolve_with_warnings(job, info, rng)[0]


def resolve_with_warnings(job: RenderJob, info: Mapping[str, Any],
                          rng: random.Random | None = None) -> tuple[RenderJob, list[str]]:
    """The job made concrete for the engine described by `info` (an Engine.info() dict, with
    the facts h3render.queue.engine_info adds), and the warnings to record with it.

    Fills every None field from the defaults, draws a random seed if asked, and checks the
    fields against the engine (h3render.queue.validation.engine_check). Warnings: the
    engine's (h3.c's rounded frames) and the prompt's words outside the model's vocabulary.
    Raises JobValidationError listing every problem.
    """
    defaults = defaults_of(info)
    values = job.model_dump()
    for name, value in values.items():
        if value is None and name in defaults:
            values[name] = defaults[name]
    if values["quant"] is None:
        values["quant"] = default_quant(info)
    if values["seed"] == "random":
        values["seed"] = (rng or random.SystemRandom()).randrange(0, SEED_DRAW)
    problems, warnings, updates = engine_check(values, info, job.model)
    if problems:
        raise JobValidationError(problems)
    values.update(updates)
    warnings = warnings + prompt_warnings(job.model_dump(), info, job.model)
    try:
        return RenderJob.model_validate(values), warnings
    except ValidationError as e:  # a default from the engine broke a static rule
        raise JobValidationError(problems_from_pydantic(e, values)) from None


def check(payload: Any, info_for: Callable[[str], Mapping[str, Any]],
          rng: random.Random | None = None) -> Checked:
    """A payload through both layers, every problem in one round.

    info_for(model) returns the engine info of a model, or raises JobValidationError on
    field "model" (h3render.queue.engine_info.engine_info does both). When the static
    layer refuses some fields, the engine layer still checks the others (the refused ones
    at their defaults), and the problems of both come back together.
    """
    static: list[Problem] = []
    try:
        job = RenderJob.parse(payload)
    except JobValidationError as e:
        static = list(e.problems)
        job = _salvage(payload, static)
        if job is None:
            raise
    try:
        info = info_for(job.model)
    except JobValidationError as e:
        raise JobValidationError(static + [p for p in e.problems if p not in static]) from None
    try:
        resolved, warnings = resolve_with_warnings(job, info, rng)
    except JobValidationError as e:
        engine = list(e.problems)
    else:
        engine = []
    if static:
        bad = {_top(p.field) for p in static}
        engine = [p for p in engine if _top(p.field) not in bad and not set(DEPENDS_ON.get(p.field, ())) & bad]
        static = [replace(p, nearest=engine_nearest(p.field, p.nearest, info)) for p in static]
    if static or engine:
        raise JobValidationError(static + [p for p in engine if p not in static])
    return Checked(resolved, warnings, info)


def _top(name: str) -> str:
    """The job field a problem is about ("engine_options.x (name)" is about engine_options)."""
    return name.split(".", 1)[0].split(" ", 1)[0]


def _salvage(payload: Any, static: list[Problem]) -> RenderJob | None:
    """The payload without the fields the static layer refused, for the engine layer to check
    the rest; None when that cannot tell anything (not an object, or its model refused)."""
    if not isinstance(payload, Mapping):
        return None
    bad = {_top(p.field) for p in static}
    if "model" in bad or "job" in bad:  # which engine would check it is not known
        return None
    kept = {k: v for k, v in payload.items() if isinstance(k, str) and k in FIELDS and k not in bad}
    kept.setdefault("prompt", PLACEHOLDER_PROMPT)
    try:
        return RenderJob.model_validate(kept)
    except ValidationError:
        return None


def request(job: RenderJob, info: Mapping[str, Any], model_dir: Path, threads: int = 0,
            init_latents: Any = None):
    """The engine's GenerateRequest for a resolved job: the same request from every door.

    The prompt is tokenized as the model's pipeline does (h3render.engine.tokenize) when the
    engine takes token ids (info["prompt"], the CPU engine); h3.c takes the text itself.
    """
    from h3render.engine.binding import GenerateRequest

    if not job.resolved:
        raise ValueError("request() needs a resolved job (contract.check or resolve fills its defaults)")
    req = GenerateRequest(
        width=job.width, height=job.height, frames=job.frames, steps=job.steps, seed=int(job.seed),
        prompt=job.prompt, negative_prompt=job.negative_prompt or "", guidance=job.guidance, shift=job.shift,
        sampler=job.sampler, quant=job.quant, threads=threads, options=dict(job.engine_options),
        preview_every=job.preview_every, init_latents=init_latents,
    )  # fmt: skip
    if info.get("prompt", "token_ids") == "token_ids":
        from h3render.engine.tokenize import load_tokenizer

        tok = load_tokenizer(Path(model_dir), int(info["text_len"]))
        req.prompt_ids = tok.encode(job.prompt).tolist()
        req.negative_ids = tok.encode(job.negative_prompt or "").tolist()
    return req
