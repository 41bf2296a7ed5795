"""What the ComfyUI nodes do, in plain Python: enqueue, await, sweep, read a sweep back.

Built on h3render.queue (enqueue, status, cancel); no ComfyUI and no torch here.
ComfyUI's progress bar and interrupt check come in as `Hooks`, so tests drive the
same code with their own functions:

    Hooks.progress(done, total, preview)
                                  called when the job's step moves (and for sweeps,
                                  when the count of ended jobs moves); preview is the
                                  job's latest preview frame as a PIL image when a new
                                  one arrived (RenderJob.preview_every), else None
    Hooks.check_interrupt()       raises to stop; a render is then canceled in the
                                  queue and the exception re-raised unchanged

Waiting is polling job meta (h3render.queue.status) every `poll_s`. A render node
fails fast, instead of waiting out its timeout, when Redis does not answer
(before anything is enqueued) or when no worker is alive for `worker_grace_s`
while its job is still queued (the job is then canceled, so it does not render
later behind the user's back). Interactive renders are enqueued without rq
retries: ComfyUI shows the first failure at once, and the user re-queues.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import redis
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from h3render.comfy_bridge import inputs as inp
from h3render.comfy_bridge import sheet
from h3render.comfy_bridge.errors import (
    BridgeError,
    BridgeInputError,
    JobCanceledError,
    JobFailedError,
    JobTimeoutError,
    NoWorkerError,
    RedisDownError,
)
from h3render.queue import control, status, workers
from h3render.queue.connection import get_redis
from h3render.queue.engine_info import published_info, published_models
from h3render.queue.enqueue import enqueue, enqueue_sweep, queue
from h3render.queue.errors import JobValidationError, NotFoundError, RedisUnavailableError
from h3render.queue.job import JobPhase
from h3render.queue.sweep import AXES
from h3render.settings import Settings

START_HINT = ("start a worker on the machine that renders: `h3render worker` (it also starts the embedded "
              "Redis), or set H3RENDER_REDIS_URL in ComfyUI's environment to the Redis your workers use")
MAX_SHEET_TILES = 400  # a bigger sweep shows its first 400 jobs on the sheet (and says so)


class BridgeSettings(BaseSettings):
    """Knobs of the bridge, from H3RENDER_COMFY_* (the dashboard URL also from H3RENDER_DASHBOARD_URL)."""

    model_config = SettingsConfigDict(env_prefix="H3RENDER_COMFY_", extra="ignore", populate_by_name=True)

    dashboard_url: str = Field("http://127.0.0.1:9181", validation_alias=AliasChoices(
        "H3RENDER_DASHBOARD_URL", "H3RENDER_COMFY_DASHBOARD_URL", "dashboard_url"))
    poll_s: float = Field(0.1, gt=0, description="seconds between two reads of a job's progress")
    worker_grace_s: float = Field(5.0, ge=0, description="how long a queued job may see no live worker")
    worker_silence_s: float = Field(120.0, gt=0, description="a worker silent this long counts as dead")
    cancel_wait_s: float = Field(15.0, ge=0, description="after an interrupt, wait this long for the job to end")
    sweep_poll_s: float = Field(1.0, gt=0, description="seconds between two reads of a sweep's state")


def _noop_progress(done: int, total: int, preview: Any = None) -> None:
    return None


def _noop_interrupt() -> None:
    return None


@dataclass
class Hooks:
    progress: Callable[[int, int, Any], None] = _noop_progress  # (done, total, PIL image or None)
    check_interrupt: Callable[[], None] = _noop_interrupt


@dataclass
class CancelRecord:
    """What happened when an interrupt canceled a job (tests read it; ComfyUI's log shows it)."""

    job_id: str
    step_at_request: int | None  # the job's step read right after the cancel key was set
    final_step: int | None = None
    final_state: str | None = None
    seconds: float | None = None  # from the request to the job's end


@dataclass
class RenderResult:
    job_id: str
    output_dir: Path
    video: Path
    poster: Path
    meta: dict[str, Any]
    frames: np.ndarray  # (F, H, W, 3) float32 in 0..1, decoded from video.mp4


@dataclass
class SweepStarted:
    sweep_id: str
    jobs: int
    estimate_s: float
    estimate_source: str
    dashboard_url: str
    workers: int  # live workers when it was enqueued

    def summary(self) -> str:
        text = (f"sweep {self.sweep_id}: {self.jobs} jobs, estimated {format_seconds(self.estimate_s)} "
                f"({self.estimate_source}); {self.dashboard_url}")
        if self.workers == 0:
            text += f"\nno worker is running now: the jobs wait in the queue; {START_HINT}"
        return text


@dataclass
class SweepEntry:
    """One full (non-preview) job of a sweep, as the contact sheet shows it."""

    job_id: str
    state: str
    values: dict[str, Any]
    output_dir: Path | None
    error: str | None
    step: int | None
    steps: int | None


@dataclass
class SweepView:
    sweep_id: str
    axes: dict[str, list[Any]]
    summary: dict[str, Any]
    entries: list[SweepEntry]
    previews: int
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The STRING summary: counts (done, failed, running, ...), remaining time, failures."""
        s = self.summary
        states = s.get("states", {})
        order = [p.value for p in JobPhase]
        counts = ", ".join(f"{states[k]} {k}" for k in sorted(states, key=order.index))
        running = sum(v for k, v in states.items() if not JobPhase(k).terminal and k != JobPhase.queued.value)
        lines = [f"sweep {self.sweep_id}: {s.get('jobs', 0)} jobs ({self.previews} previews): {counts or 'none'}",
                 f"done {s.get('done', 0)}, failed {states.get('failed', 0)}, running {running}, "
                 f"queued {states.get('queued', 0)}; remaining ~{format_seconds(s.get('remaining_s', 0))}"]
        if self.timed_out:
            lines.append("stopped waiting: the node's timeout passed before the sweep ended")
        for e in self.entries:
            if e.state == JobPhase.failed.value:
                lines.append(f"failed {e.job_id}: {e.error or 'no reason recorded'}")
        return "\n".join(lines + self.notes)


def format_seconds(s: float) -> str:
    s = float(s or 0)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s // 3600:.0f} h {(s % 3600) / 60:.0f} min"


def load_frames(video: Path) -> np.ndarray:
    """A render's frames as (F, H, W, 3) float32 in 0..1, decoded from its mp4."""
    from h3render.engine.video import read_frames

    return read_frames(video).astype(np.float32) / np.float32(255.0)


def as_input_error(e: JobValidationError) -> BridgeInputError:
    return BridgeInputError("h3render refused the job:\n" + "\n".join(f"  {p}" for p in e.problems))


class Bridge:
    """One Redis connection and the settings the nodes use."""

    def __init__(self, r: redis.Redis, settings: Settings | None = None, bridge: BridgeSettings | None = None):
        self.r = r
        self.settings = settings or Settings()
        self.bridge = bridge or BridgeSettings()
        self.last_cancel: CancelRecord | None = None

    @classmethod
    def connect(cls, settings: Settings | None = None, bridge: BridgeSettings | None = None) -> "Bridge":
        """Connect without starting anything; RedisDownError says what to start."""
        settings = settings or Settings()
        try:
            r = get_redis(settings, start=False)
        except RedisUnavailableError as e:
            raise RedisDownError(f"h3render cannot reach its Redis: {e}. To render, {START_HINT}.") from None
        return cls(r, settings, bridge)

    # ------------------------------------------------------------ workers and choices

    def live_workers(self) -> list[str]:
        """Names of rq workers on our queue that sent a heartbeat within worker_silence_s
        (h3render.queue.workers, the queue's own answer to "is anyone rendering?")."""
        return [w.name for w in workers.live_workers(self.r, self.settings, self.bridge.worker_silence_s)]

    def published(self) -> dict[str, dict | None]:
        """model -> Engine.info() that workers published."""
        return {m: published_info(self.r, m) for m in published_models(self.r)}

    # ------------------------------------------------------------ one render

    def submit(self, payload: dict[str, Any]) -> str:
        """Validate and enqueue one job (no rq retries); its id."""
        once = self.settings.model_copy(update={"retry_max": 0})
        try:
            return enqueue(self.r, payload, once).job_ids[0]
        except JobValidationError as e:
            raise as_input_error(e) from None

    def wait(self, job_id: str, timeout_s: float, hooks: Hooks | None = None) -> status.JobRow:
        """Poll the job until it ends; its finished row. Raises JobFailedError (the worker's
        reason), JobCanceledError, NoWorkerError, JobTimeoutError; an exception from
        hooks.check_interrupt cancels the job and propagates unchanged."""
        hooks = hooks or Hooks()
        t0 = time.monotonic()
        last_progress: tuple[int, int] | None = None
        last_preview: int | None = None
        no_worker_since: float | None = None
        next_worker_check = 0.0
        while True:
            try:
                hooks.check_interrupt()
            except BaseException:
                self.cancel_and_wait(job_id)
                raise
            try:
                row = status.job_status(self.r, job_id)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                raise BridgeError(f"lost the connection to Redis while waiting for job {job_id}: {e}") from None
            image = None
            if row.preview_step is not None and row.preview_step != last_preview:
                last_preview = row.preview_step
                image = self.preview_image(job_id)
            # The engine hands over step i's preview just before it reports step i as
            # done, so a new preview may be one step ahead of the recorded step.
            done = max(row.step or 0, row.preview_step or 0) if row.step is not None else None
            if done is not None and row.steps and ((done, row.steps) != last_progress or image is not None):
                last_progress = (done, row.steps)
                hooks.progress(done, row.steps, image)
            state = JobPhase(row.state)
            if state == JobPhase.finished:
                return row
            if state == JobPhase.failed:
                raise JobFailedError(job_id, row.error or "no reason recorded (see `h3render status " + job_id + "`)")
            if state == JobPhase.canceled:
                raise JobCanceledError(f"h3render job {job_id} was canceled ({row.error or 'from outside ComfyUI'})")
            now = time.monotonic()
            if state == JobPhase.queued and now >= next_worker_check:
                next_worker_check = now + 1.0
                if self.live_workers():
                    no_worker_since = None
                elif no_worker_since is None:
                    no_worker_since = now
                elif now - no_worker_since >= self.bridge.worker_grace_s:
                    control.cancel(self.r, job_id)
                    raise NoWorkerError(f"no h3render worker is running for queue {self.settings.queue_name!r} "
                                        f"(waited {self.bridge.worker_grace_s:g} s); job {job_id} was canceled. "
                                        f"To render, {START_HINT}.")
            elif state != JobPhase.queued:
                no_worker_since = None
            if now - t0 >= timeout_s:
                self.cancel_and_wait(job_id)
                raise JobTimeoutError(f"h3render job {job_id} did not finish within the node's timeout of "
                                      f"{timeout_s:g} s (state: {row.state}); it was canceled")
            time.sleep(self.bridge.poll_s)

    def preview_image(self, job_id: str):
        """The job's latest preview frame as an RGB PIL image, or None (none yet, or unreadable)."""
        from PIL import Image, UnidentifiedImageError

        try:
            found = status.job_preview(self.r, job_id)
        except (redis.RedisError, NotFoundError):
            return None
        if found is None:
            return None
        try:
            with Image.open(io.BytesIO(found[1])) as im:
                return im.convert("RGB")
        except (OSError, UnidentifiedImageError):
            return None

    def cancel_and_wait(self, job_id: str) -> CancelRecord:
        """Cancel the job in the queue and wait (at most cancel_wait_s) for it to end."""
        t0 = time.monotonic()
        try:
            control.cancel(self.r, job_id)
            record = CancelRecord(job_id, status.job_status(self.r, job_id).step)
        except (redis.RedisError, NotFoundError) as e:
            record = CancelRecord(job_id, None, final_state=f"cancel failed: {e}")
            self.last_cancel = record
            return record
        self.last_cancel = record
        while True:
            row = status.job_status(self.r, job_id)
            if JobPhase(row.state).terminal or time.monotonic() - t0 >= self.bridge.cancel_wait_s:
                record.final_step, record.final_state = row.step, row.state
                record.seconds = time.monotonic() - t0
                return record
            time.sleep(self.bridge.poll_s)

    def render(self, payload: dict[str, Any], timeout_s: float, hooks: Hooks | None = None) -> RenderResult:
        """Enqueue one job, wait for it, and read its outputs back."""
        job_id = self.submit(payload)
        row = self.wait(job_id, timeout_s, hooks)
        out = Path(row.output_dir or "")
        video, poster = out / "video.mp4", out / "poster.png"
        if not row.output_dir or not video.is_file():
            raise BridgeError(f"h3render job {job_id} finished but {video} is missing: this ComfyUI must see the "
                              f"worker's renders folder (same machine or a shared H3RENDER_HOME)")
        meta_path = out / "meta.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        return RenderResult(job_id, out, video, poster, meta, load_frames(video))

    # ------------------------------------------------------------ sweeps

    def start_sweep(self, fixed: dict[str, Any], axes: dict[str, list[Any]], preview: bool) -> SweepStarted:
        """Enqueue a whole sweep and return at once."""
        try:
            res = enqueue_sweep(self.r, fixed, axes, self.settings, preview=preview)
        except JobValidationError as e:
            raise as_input_error(e) from None
        url = self.bridge.dashboard_url.rstrip("/") + f"/sweeps/{res.sweep_id}"
        return SweepStarted(res.sweep_id, len(res.job_ids), res.seconds, res.time_source, url,
                            len(self.live_workers()))

    def sweep_view(self, sweep_id: str) -> SweepView:
        """The sweep's record and every full job with its axis values and state."""
        try:
            st = status.sweep_status(self.r, sweep_id)
        except NotFoundError as e:
            raise BridgeInputError(f"sweep_id={sweep_id!r}: {e}; give the id H3 Sweep returned (s-...)") from None
        axes = {k: list(v) for k, v in (st["record"].get("axes") or {}).items()}
        entries, previews = [], 0
        for row in st["rows"]:
            if row.preview:
                previews += 1
                continue
            try:
                params = status.fetch_job(self.r, row.id).kwargs.get("job") or {}
            except NotFoundError:
                params = {}
            entries.append(SweepEntry(row.id, row.state, {k: params.get(k) for k in axes},
                                      Path(row.output_dir) if row.output_dir else None, row.error,
                                      row.step, row.steps))
        return SweepView(sweep_id, axes, st["summary"], entries, previews)

    def sweep_results(self, sweep_id: str, wait: bool, timeout_s: float, hooks: Hooks | None = None) -> SweepView:
        """The sweep now, or (wait) once every job has ended or timeout_s passed.
        An interrupt stops the waiting only: the sweep keeps running."""
        hooks = hooks or Hooks()
        t0 = time.monotonic()
        while True:
            hooks.check_interrupt()
            view = self.sweep_view(sweep_id)
            done, total = view.summary.get("done", 0), view.summary.get("jobs", 0)
            hooks.progress(done, max(total, 1))
            if not wait or done >= total:
                return view
            if time.monotonic() - t0 >= timeout_s:
                view.timed_out = True
                return view
            time.sleep(self.bridge.sweep_poll_s)

    def fingerprint(self, sweep_id: str) -> str:
        """Changes whenever any job of the sweep changes state (ComfyUI's IS_CHANGED)."""
        st = status.sweep_status(self.r, sweep_id)
        return json.dumps([(row.id, row.state) for row in st["rows"]])


# ---------------------------------------------------------------- outputs of the results node


def sweep_sheet(view: SweepView, columns: int, tile_size: int) -> np.ndarray:
    """Contact sheet (H, W, 3) uint8 of a sweep: each job's poster labelled with its axis values."""
    ordered = [a for a in AXES if a in view.axes] + [a for a in view.axes if a not in AXES]  # the sweep's order
    names = [a for a in ordered if len(view.axes[a]) > 1] or ordered
    tiles = []
    for e in view.entries[:MAX_SHEET_TILES]:
        poster = e.output_dir / "poster.png" if e.output_dir else None
        image = _read_png(poster) if e.state == JobPhase.finished.value and poster and poster.is_file() else None
        tiles.append(sheet.Tile(sheet.axis_labels(e.values, names), image, _state_note(e)))
    if len(view.entries) > MAX_SHEET_TILES:
        view.notes.append(f"the sheet shows the first {MAX_SHEET_TILES} of {len(view.entries)} jobs")
    title = f"{view.sweep_id}: {view.summary.get('done', 0)}/{view.summary.get('jobs', 0)} done"
    return sheet.contact_sheet(tiles, columns, tile_size, [len(view.axes[a]) for a in names], title)


def job_frames(view: SweepView, job_index: int) -> np.ndarray:
    """(F, H, W, 3) float32 frames of the chosen full job; a one-frame placeholder naming its state
    when it has no video yet. Raises BridgeInputError when job_index is out of range."""
    n = len(view.entries)
    if not 0 <= job_index < n:
        raise BridgeInputError(f"job_index={job_index}: sweep {view.sweep_id} has {n} jobs; "
                               f"allowed: 0..{max(n - 1, 0)}")
    e = view.entries[job_index]
    video = e.output_dir / "video.mp4" if e.output_dir else None
    if e.state == JobPhase.finished.value and video and video.is_file():
        return load_frames(video)
    img = sheet.placeholder([e.job_id] + _state_note(e) + sheet.axis_labels(e.values, list(view.axes)))
    return img[None].astype(np.float32) / np.float32(255.0)


def _state_note(e: SweepEntry) -> list[str]:
    if e.state == JobPhase.finished.value:
        return ["finished (no poster)"]
    if e.state == JobPhase.failed.value:
        return ["failed", (e.error or "")[:120]]
    if e.step is not None and e.steps:
        return [e.state, f"step {e.step}/{e.steps}"]
    return [e.state]


def _read_png(path: Path) -> np.ndarray | None:
    from PIL import Image

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except OSError:
        return None


# ---------------------------------------------------------------- dropdowns


def node_choices(settings: Settings | None = None) -> tuple[list[str], list[str]]:
    """(models, quants) for the dropdowns: what workers published, then models on this
    machine. Never raises: with Redis down the local models (and the built-in) remain."""
    published: dict[str, dict | None] = {}
    try:
        published = Bridge.connect(settings).published()
    except (BridgeError, redis.RedisError, OSError, ValueError):
        pass
    local: list[tuple[str, list[str]]] = []
    try:
        from h3render.engine.models import BUILTIN_QUANTS, list_models

        for m in list_models():
            local.append((m.name, list(m.quants) or list(BUILTIN_QUANTS.get(m.name, ()))))
    except Exception:  # noqa: BLE001 - a broken models dir must not break ComfyUI's node list
        pass
    return inp.merge_choices(published, local)
