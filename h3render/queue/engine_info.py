"""Where a job's engine limits come from: what workers publish in Redis, else the local engine.

Workers publish Engine.info() of each model they serve at "h3render:engine:<model>"
(a JSON string; a hash with an "info" field is read too). A machine that only
enqueues can then validate without the model or the engine library installed.
"""

from __future__ import annotations

import difflib
import json

import redis

from h3render.queue.errors import JobValidationError, Problem
from h3render.keys import ENGINE_KEY


def publish_engine_info(r: redis.Redis, model: str, info: dict) -> None:
    """Store a model's engine info for validating clients (used by workers and tests)."""
    r.set(ENGINE_KEY.format(model=model), json.dumps(info, sort_keys=True))


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

    with Engine(resolve_model(model), threads=1) as engine:
        return dict(engine.info())


def engine_info(r: redis.Redis, model: str, cache: dict[str, dict] | None = None) -> dict:
    """The limits to validate a job for `model` against: published, else local.

    Raises JobValidationError on field "model" when neither knows the model.
    """
    if cache is not None and model in cache:
        return cache[model]
    info = published_info(r, model)
    if info is None:
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
