"""How long a job will take: a per-step time model, fitted to finished jobs when there are some.

    seconds = load + steps * cfg * (tokens / 1000) * step_s_per_ktoken + frames * decode_s_per_frame

tokens = T' * H' * W' / (pt * ph * pw), the DiT sequence length, with
T' = (frames - 1) / vae_t + 1, H' = height / vae_h, W' = width / vae_w from the engine
info (vae_stride, patch_size); cfg = 2 when guidance > 1 (two forward passes per step),
else 1. Linear in tokens: attention is quadratic, so long clips at high resolution
run longer than this predicts; fitting to measured jobs of the same model and quant
level corrects the constant for the sizes a user actually renders.

The defaults (Settings.est_*) are documented in docs/JOBS.md. Everything here is
pure except `measured_samples`, which reads finished jobs from Redis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from h3render.queue.job import RenderJob


@dataclass(frozen=True)
class TimeModel:
    step_s_per_ktoken: float
    load_s: float
    decode_s_per_frame: float
    source: str  # "default" or "measured from N jobs"


@dataclass(frozen=True)
class Sample:
    """One finished job: its parameters and measured seconds per phase."""

    job: RenderJob
    load_s: float  # load + encode
    denoise_s: float
    decode_s: float


def dit_tokens(job: RenderJob, info: Mapping[str, Any]) -> int:
    """DiT sequence length of a resolved job (see module docstring; h3.c counts its own way:
    h3render.engine.h3.estimate.video_tokens at the internal canvas)."""
    if info.get("engine") == "h3.c":
        from h3render.engine.h3.estimate import video_tokens

        opts = job.engine_options
        w = int(opts.get("render_width") or 0) or int(job.width)
        h = int(opts.get("render_height") or 0) or int(job.height)
        return max(1, video_tokens(w, h, int(job.frames)))
    vt, vh, vw = (list(info.get("vae_stride") or [4, 8, 8]) + [8, 8])[:3]
    pt, ph, pw = (list(info.get("patch_size") or [1, 2, 2]) + [2, 2])[:3]
    t = (int(job.frames) - 1) // int(vt) + 1
    h, w = int(job.height) // int(vh), int(job.width) // int(vw)
    return max(1, (t // int(pt)) * (h // int(ph)) * (w // int(pw)))


def step_work(job: RenderJob, info: Mapping[str, Any]) -> float:
    """Units the per-step constant multiplies: steps * cfg passes * ktokens."""
    cfg = 2 if float(job.guidance) > 1.0 else 1
    return int(job.steps) * cfg * dit_tokens(job, info) / 1000.0


def job_seconds(job: RenderJob, info: Mapping[str, Any], tm: TimeModel) -> float:
    return tm.load_s + step_work(job, info) * tm.step_s_per_ktoken + int(job.frames) * tm.decode_s_per_frame


def default_model(settings) -> TimeModel:
    return TimeModel(settings.est_step_s_per_ktoken, settings.est_load_s, settings.est_decode_s_per_frame, "default")


def fit(samples: Iterable[Sample], info: Mapping[str, Any], fallback: TimeModel) -> TimeModel:
    """A TimeModel from measured jobs (ratio of sums, so big jobs weigh more); fallback if none."""
    samples = list(samples)
    work = sum(step_work(s.job, info) for s in samples)
    if not samples or work <= 0:
        return fallback
    frames = sum(int(s.job.frames) for s in samples)
    return TimeModel(
        step_s_per_ktoken=sum(s.denoise_s for s in samples) / work,
        load_s=sum(s.load_s for s in samples) / len(samples),
        decode_s_per_frame=(sum(s.decode_s for s in samples) / frames) if frames else fallback.decode_s_per_frame,
        source=f"measured from {len(samples)} job{'s' if len(samples) != 1 else ''}",
    )


def sample_from(payload: Mapping[str, Any], meta: Mapping[str, Any], duration_s: float | None) -> Sample | None:
    """A Sample from a finished job's payload and meta["h3r"]; None if it has no timing.

    Uses meta "timings" {"load", "encode", "denoise", "decode"} (seconds) when the
    worker recorded them, else the job's whole run time counted as denoising
    (an overestimate, which is the safe side for an estimate).
    """
    try:
        job = RenderJob.model_validate(payload)
    except Exception:
        return None
    if not job.resolved:
        return None
    t = meta.get("timings") if isinstance(meta, Mapping) else None
    if isinstance(t, Mapping) and isinstance(t.get("denoise"), (int, float)):
        return Sample(job, float(t.get("load", 0) or 0) + float(t.get("encode", 0) or 0),
                      float(t["denoise"]), float(t.get("decode", 0) or 0))
    if duration_s and duration_s > 0:
        return Sample(job, 0.0, float(duration_s), 0.0)
    return None


def measured_samples(r, queue_name: str, model: str, quant: str, limit: int = 50) -> list[Sample]:
    """Up to `limit` most recent finished jobs of this model and quant level that have timings."""
    from rq import Queue
    from rq.job import Job
    from rq.registry import FinishedJobRegistry
    from rq.serializers import JSONSerializer

    q = Queue(queue_name, connection=r, serializer=JSONSerializer)
    ids = FinishedJobRegistry(queue=q).get_job_ids(-limit * 4, -1)
    out: list[Sample] = []
    for job in reversed([j for j in Job.fetch_many(ids, connection=r, serializer=JSONSerializer) if j]):
        payload = (job.kwargs or {}).get("job") or {}
        if payload.get("model") != model or payload.get("quant") != quant:
            continue
        dur = (job.ended_at - job.started_at).total_seconds() if job.started_at and job.ended_at else None
        s = sample_from(payload, (job.meta or {}).get("h3r") or {}, dur)
        if s is not None:
            out.append(s)
        if len(out) >= limit:
            break
    return out


def timeout_for(seconds: float, settings) -> int:
    """rq job_timeout: the estimate with margin, plus the longest admission wait for memory,
    never below the floor (and so never rq's 180 s default)."""
    budget = seconds * settings.job_timeout_margin + settings.admission_wait_limit_s
    return int(max(settings.job_timeout_min_s, budget))
