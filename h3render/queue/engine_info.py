"""Where a job's engine limits come from: what workers publish in Redis, else the local engine.

Workers publish Engine.info() of each model they serve at "h3render:engine:<model>"
(a JSON string; a hash with an "info" field is read too). A machine that only
enqueues can then validate without the model or the engine library installed.

What is published is Engine.info() plus two facts the engine's JSON does not carry
(`with_model_facts`):
  "options"     {name: what it does} of the engine options the engine accepts, so an
                unknown option is refused at enqueue rather than failing in the worker
                (the CPU engine: csrc/engine.c's parse_options, kept equal by a test;
                h3.c: h3render.engine.h3.options);
  "vocabulary"  the words of a word-level tokenizer (h3render.queue.vocabulary), for
                the warning about prompt words the model never saw; absent for a
                tokenizer that covers any text.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path

import redis

from h3render.queue.errors import JobValidationError, Problem
from h3render.keys import ENGINE_KEY

CPU_ENGINE = "h3render-cpu"  # Engine.info()["engine"] of the CPU engine (csrc/)
# The options csrc/engine.c's parse_options accepts; it refuses any other name.
CPU_ENGINE_OPTIONS = {
    "prewarm": "0 or 1: read the DiT weights in file order before step 0",
    "test_crash_at_step": "a step number: the render crashes there (a test trigger: the worker needs "
                          "H3RENDER_ENABLE_TEST_TRIGGERS=1)",
}


def engine_options(info: Mapping) -> dict[str, str] | None:
    """{name: what it does} of the options the engine described by `info` accepts; None when unknown
    (an engine this build does not know, published without its options)."""
    published = info.get("options")
    if isinstance(published, Mapping):
        return {str(k): str(v) for k, v in published.items()}
    if isinstance(published, list):
        return {str(k): "" for k in published}
    if info.get("engine") == CPU_ENGINE:
        return dict(CPU_ENGINE_OPTIONS)
    if info.get("engine") == "h3.c":
        from h3render.engine.h3.options import KNOWN_OPTIONS

        return {k: "" for k in KNOWN_OPTIONS}
    return None


def with_model_facts(model: str, info: Mapping, model_dir: Path | None = None) -> dict:
    """`info` with "options" and "vocabulary" filled in where it lacks them (see the module doc).

    The vocabulary is read from model_dir's tokenizer.json, else from the model of that name
    installed or built in here. "vocabulary": null says the model has none (a sub-word
    tokenizer), so a reader does not look for one locally."""
    from h3render.queue import vocabulary

    out = dict(info)
    if "options" not in out:
        options = engine_options(out)
        if options is not None:
            out["options"] = options
    if "vocabulary" not in out:
        if model_dir is not None:
            out["vocabulary"] = vocabulary.tokenizer_words(Path(model_dir) / "tokenizer.json")
        else:
            words = vocabulary.local_words(model)
            if words:
                out["vocabulary"] = words
    return out


def publish_engine_info(r: redis.Redis, model: str, info: dict, model_dir: Path | None = None) -> None:
    """Store a model's engine info, with its options and vocabulary, for validating clients
    (workers, which have the model: its vocabulary is read from there, or recorded as none)."""
    facts = with_model_facts(model, info, model_dir)
    facts.setdefault("vocabulary", None)
    r.set(ENGINE_KEY.format(model=model), json.dumps(facts, sort_keys=True))


def published_info(r: redis.Redis, model: str) -> dict | None:
    """The info a worker published for `model`, or None."""
    key = ENGINE_KEY.format(model=model)
    kind = r.type(key)
    if kind == b"string":
        return json.loads(r.get(key))
    if kind == b"hash":
        h = r.hgetall(key)
        if b"info" in h:
            return json.loads(h[b"info"])
        return {k.decode(): _maybe_json(v.decode()) for k, v in h.items()}
    return None


def _maybe_json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return text


def published_models(r: redis.Redis) -> list[str]:
    return sorted(k.decode().split(":", 2)[2] for k in r.scan_iter(match=ENGINE_KEY.format(model="*")))


def local_info(model: str) -> dict:
    """Engine.info() of an installed (or built-in) model on this machine."""
    from h3render.engine.binding import Engine
    from h3render.engine.models import resolve_model

    model_dir = resolve_model(model)
    with Engine(model_dir, threads=1) as engine:
        return with_model_facts(model, engine.info(), model_dir)


def engine_info(r: redis.Redis, model: str, cache: dict[str, dict] | None = None) -> dict:
    """The limits to validate a job for `model` against: published, else local.

    Raises JobValidationError on field "model" when neither knows the model.
    """
    if cache is not None and model in cache:
        return cache[model]
    info = published_info(r, model)
    if info is not None:
        info = with_model_facts(model, info)  # a worker of an older build published neither
    else:
        try:
            info = local_info(model)
        except Exception as e:  # missing model, missing library: both are "unknown model" to the user
            known = published_models(r) + _local_models()
            close = difflib.get_close_matches(model, known, n=1, cutoff=0.0)
            raise JobValidationError([Problem(
                "model", model,
                "must be a model a worker published or one installed here "
                f"(known: {', '.join(sorted(set(known))) or 'none'}); local lookup failed: {e}",
                close[0] if close else None,
            )]) from None
    if cache is not None:
        cache[model] = info
    return info


def _local_models() -> list[str]:
    try:
        from h3render.engine.models import list_models

        return [m.name for m in list_models()]
    except Exception:
        return []
