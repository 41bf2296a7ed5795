"""The job model: one render as it travels through Redis, and the states it passes through.

A RenderJob is validated twice:
  1. `RenderJob.parse(payload)`: types and ranges that hold for every engine
     (no I/O). Unknown fields are refused.
  2. `resolve(job, info)` (h3render.queue.contract): against the target engine's
     limits, filling the model's defaults and drawing `seed="random"`, so the
     payload stored in Redis is complete and reproducible.
The words of each rule and the nearest valid values are h3render.queue.rules'.
Every error names the field, the value, the rule and the nearest valid value
(h3render.queue.errors.Problem).

The payload on the queue is `job.model_dump(mode="json")`, passed as
kwargs={"job": payload} to RENDER_FUNC, the only function a worker runs.
"""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from h3render.engine.builtin import DEFAULT_MODEL
from h3render.engine.limits import MAX_FRAMES, MAX_SIDE
from h3render.keys import RENDER_FUNC  # noqa: F401 - re-exported for the queue's users
from h3render.queue.errors import JobValidationError, Problem
from h3render.queue.rules import (  # noqa: F401 - the limits are re-exported for the job's users
    MAX_PROMPT_CHARS,
    PRIORITIES,
    QUANT_PATTERN,
    SAMPLERS,
    SEED_MAX,
    problems_from_pydantic,
    short,
)


class JobPhase(str, Enum):
    """The state of a job as status shows it: job.meta["h3r"]["state"].

    queued          waiting in the queue (or for a retry interval)
    waiting_memory  dequeued, but admission waits for memory to free up
    waiting_disk    dequeued, but admission waits for disk space under renders/
    loading         mapping weights
    encoding        text encoder
    denoising       sampler steps (meta "step"/"steps" move)
    decoding        VAE decode
    writing         video, poster and meta.json being written
    paused_thermal  between two steps, waiting for the machine to cool
    finished        outputs complete in meta "output_dir"
    failed          meta "error" (and "engine_error") says why; may be retried
    canceled        stopped on request; never retried automatically
    abandoned       shown by status only, never written: rq says started but the job's
                    worker is gone (h3render.queue.liveness); a live worker runs it again
    """

    queued = "queued"
    waiting_memory = "waiting_memory"
    waiting_disk = "waiting_disk"
    loading = "loading"
    encoding = "encoding"
    denoising = "denoising"
    decoding = "decoding"
    writing = "writing"
    paused_thermal = "paused_thermal"
    finished = "finished"
    failed = "failed"
    canceled = "canceled"
    abandoned = "abandoned"

    @property
    def terminal(self) -> bool:
        return self in (JobPhase.finished, JobPhase.failed, JobPhase.canceled)


def new_job_id() -> str:
    return "j-" + uuid.uuid4().hex[:12]


def new_sweep_id() -> str:
    return "s-" + uuid.uuid4().hex[:12]


StrictInt = Annotated[int, Field(strict=True)]
OptionKey = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
OptionValue = Annotated[str, StringConstraints(max_length=256, pattern=r"^[^;=\x00]*$")] | bool | StrictInt | float


class RenderJob(BaseModel):
    """One render. None means "the model's default" until `resolve` fills it in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    negative_prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    seed: Annotated[int, Field(strict=True, ge=0, le=SEED_MAX)] | Literal["random"] = "random"
    width: StrictInt | None = Field(None, ge=1, le=MAX_SIDE)
    height: StrictInt | None = Field(None, ge=1, le=MAX_SIDE)
    frames: StrictInt | None = Field(None, ge=1, le=MAX_FRAMES)
    steps: StrictInt | None = Field(None, ge=1, le=1000)
    guidance: float | None = Field(None, ge=0, le=50, allow_inf_nan=False)
    shift: float | None = Field(None, gt=0, le=100, allow_inf_nan=False)
    sampler: Literal["unipc", "euler"] | None = None
    quant: str | None = Field(None, pattern=QUANT_PATTERN)
    model: str = Field(DEFAULT_MODEL, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    fps: StrictInt | None = Field(None, ge=1, le=240)
    priority: Literal["normal", "high"] = "normal"
    engine_options: dict[OptionKey, OptionValue] = Field(default_factory=dict, max_length=32)
    # A preview frame every n denoising steps (0: none); the latest lands in
    # job.meta["h3r"]["preview_png"]. At most `steps` (checked by resolve).
    preview_every: StrictInt = Field(0, ge=0, le=1000)

    @field_validator("prompt")
    @classmethod
    def _prompt_has_text(cls, v: str) -> str:
        if "\x00" in v:  # C strings end there: the engine would see only the text before it
            raise ValueError("prompt contains a NUL character")
        if not v.strip():
            raise ValueError("prompt is only whitespace")
        return v

    @field_validator("negative_prompt")
    @classmethod
    def _negative_prompt_no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\x00" in v:
            raise ValueError("negative_prompt contains a NUL character")
        return v

    @field_validator("model")
    @classmethod
    def _model_not_path(cls, v: str) -> str:
        if ".." in v:
            raise ValueError("model names may not contain '..'")
        return v

    @classmethod
    def parse(cls, payload: object) -> "RenderJob":
        """Validate a payload (dict); raise JobValidationError listing every bad field."""
        if not isinstance(payload, dict):
            raise JobValidationError(
                [Problem("job", short(payload), "must be a JSON object of job fields "
                         f"({', '.join(cls.model_fields)}), not {_kind(payload)}", {"prompt": "..."})]
            )
        names = [k for k in payload if not isinstance(k, str)]
        if names:  # only a Python caller can do this (JSON names are text); pydantic's words would leak
            raise JobValidationError([Problem("job", short(k), "field names must be text: one of "
                                              + ", ".join(cls.model_fields), str(k)) for k in names])
        try:
            return cls.model_validate(payload)
        except ValidationError as e:
            raise JobValidationError(problems_from_pydantic(e, payload)) from None

    @property
    def resolved(self) -> bool:
        """True once every engine parameter is concrete (after `resolve`)."""
        return self.seed != "random" and None not in (
            self.negative_prompt, self.width, self.height, self.frames, self.steps,
            self.guidance, self.shift, self.sampler, self.quant, self.fps,
        )  # fmt: skip

    def payload(self) -> dict:
        """The JSON payload stored in the rq job's kwargs."""
        return self.model_dump(mode="json")

    def label(self) -> str:
        """Short human description for tables and rq's job description."""
        p = self.prompt if len(self.prompt) <= 40 else self.prompt[:37] + "..."
        return (
            f"{self.model}/{self.quant} {self.width}x{self.height}x{self.frames} "
            f"steps={self.steps} cfg={self.guidance} seed={self.seed} {p!r}"
        )


def _kind(v: object) -> str:
    """How a JSON reader would name the type of v."""
    names = {list: "a list", tuple: "a list", str: "a text", bool: "a boolean", int: "a number", float: "a number",
             type(None): "null", bytes: "bytes"}
    return names.get(type(v), f"a {type(v).__name__}")
