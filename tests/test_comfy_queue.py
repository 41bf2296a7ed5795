"""The ComfyUI nodes against a real Redis (tests/redis_fixture.py) and a real burst worker
(`h3render worker --burst` subprocess, rq SpawnWorker, the real engine, the built-in
tiny model). The nodes run as ComfyUI would call them, with ComfyUI's progress bar
and interrupt check replaced by the stand-ins in test_comfy_nodes.py.

Slow-ish: about a minute on 2 cores (every job spawns a fresh Python process).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import psnr
from test_comfy_nodes import FakeComfy, InterruptProcessingException, load_nodes

from h3render.comfy_bridge import client, sheet
from h3render.comfy_bridge.errors import BridgeInputError, JobFailedError, NoWorkerError
from h3render.engine.video import probe
from h3render.queue.enqueue import queue
from h3render.queue.status import job_preview as status_preview
from h3render.queue.status import job_status, recent_job_ids
from h3render.worker.health import Readings

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CLI = "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"
# H3 Render widget values: 64x64, 17 frames, 3 steps on tiny-wan (a step takes a few ms)
RENDER = dict(prompt="a red ball", negative_prompt="", seed=5, width=64, height=64, frames=17, steps=3,
              guidance=-1.0, quant="default", model="tiny-wan", timeout=300)
# The mp4 against the lossless poster PNG of the same (middle) frame. H.264 crf 18 with
# yuv420p on the tiny model's noise-like frames: tests/test_cli_run.py measured RGB 25.1 dB
# and luma 36.9 dB, and <= 16.8 / 29.4 dB for a wrong frame or swapped channels. Measured
# here: RGB 24.8 dB, luma 36.6 dB. Same floors, same reason.
MP4_VS_PNG_MIN_PSNR_DB = 22.0
MP4_VS_PNG_MIN_LUMA_PSNR_DB = 33.0
LUMA = np.array([0.299, 0.587, 0.114])


@pytest.fixture
def env(h3_settings, tmp_path, monkeypatch):
    """Worker environment (this test's Redis and home, normal readings so the gate stays
    open on a busy machine) and the same variables for the nodes in this process."""
    readings = tmp_path / "readings.json"
    readings.write_text(Readings(platform="test").model_dump_json())
    e = dict(os.environ)
    e.update(PYTHONPATH=str(REPO) + os.pathsep + e.get("PYTHONPATH", ""), H3RENDER_HOME=str(h3_settings.home),
             H3RENDER_REDIS_URL=h3_settings.redis_url, H3RENDER_GATE_POLL_S="1",
             H3RENDER_ENABLE_TEST_TRIGGERS="1", H3RENDER_TEST_READINGS=str(readings))
    monkeypatch.setenv("H3RENDER_COMFY_POLL_S", "0.02")
    monkeypatch.setenv("H3RENDER_COMFY_WORKER_GRACE_S", "20")  # a burst worker needs a few s to start here
    return e


@pytest.fixture
def fake():
    return FakeComfy()


@pytest.fixture
def nodes(monkeypatch, fake, env):
    return load_nodes(monkeypatch, fake)


def start_worker(env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CLI, "worker", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(pred, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def call_with_burst_worker(fn, env, redis_conn, settings, timeout: float = 180):
    """Run fn (a node call that enqueues then waits) in a thread; once its job is on the
    queue, run a burst worker. Returns (fn's result or exception, worker output)."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    wait_for(lambda: queue(redis_conn, settings).count > 0 or not t.is_alive(), 60, "the node to enqueue")
    p = start_worker(env, "--burst")
    t.join(timeout)
    assert not t.is_alive(), "the node did not return"
    log, _ = p.communicate(timeout=timeout)
    return out, log


# ---------------------------------------------------------------- H3 Render


def test_render_returns_frames_video_and_job_id(nodes, fake, env, redis_conn, h3_settings):
    out, log = call_with_burst_worker(lambda: nodes.H3Render().render(**RENDER), env, redis_conn, h3_settings)
    assert "error" not in out, f"{out.get('error')!r}\n{log}"
    frames, video, job_id = out["value"]
    assert frames.shape == (17, 64, 64, 3) and frames.dtype == np.float32  # [F, H, W, 3]
    assert 0.0 <= frames.min() and frames.max() <= 1.0 and frames.std() > 0.01
    # the video is a playable H.264 mp4 of the same clip, in the worker's renders folder
    row = job_status(redis_conn, job_id)
    assert row.state == "finished" and video == str(Path(row.output_dir) / "video.mp4")
    assert Path(video).parent == h3_settings.renders_dir() / Path(video).parent.parent.name / job_id
    v = probe(Path(video))
    assert (v.codec, v.pix_fmt, v.width, v.height, v.frames) == ("h264", "yuv420p", 64, 64, 17)
    poster = np.asarray(Image.open(Path(video).parent / "poster.png").convert("RGB"), np.float64)
    mid = frames[17 // 2].astype(np.float64) * 255.0
    rgb, luma = psnr(mid, poster), psnr(mid @ LUMA, poster @ LUMA)
    assert rgb >= MP4_VS_PNG_MIN_PSNR_DB and luma >= MP4_VS_PNG_MIN_LUMA_PSNR_DB, (rgb, luma)
    # the progress bar followed the engine's denoising steps up to the last
    values = [v for v, _ in fake.progress]
    assert values and values == sorted(values) and values[-1] == 3 and {t for _, t in fake.progress} == {3}
    # the node asks for a preview every step (its default) and hands each new one to the bar in
    # ComfyUI's preview form: ("PNG", PIL image, max size)
    assert fake.previews, "no preview reached the progress bar"
    for value, (fmt, img, max_size) in fake.previews:
        assert fmt == "PNG" and isinstance(img, Image.Image) and img.size == (64, 64) and max_size == 512
        assert 1 <= value <= 3
    print(f"mp4 vs poster: RGB {rgb:.1f} dB, luma {luma:.1f} dB; progress updates {fake.progress}; "
          f"previews at {[v for v, _ in fake.previews]}")


def test_previews_reach_the_progress_hook_as_pil_images(env, redis_conn, h3_settings):
    """The plain layer: a real worker writes the latest preview (a small PNG) into the job's
    meta at most once per step; Bridge.wait decodes each new one and passes it to the hook."""
    seen: list[tuple[int, int, Image.Image]] = []
    hooks = client.Hooks(progress=lambda d, t, preview=None: preview is not None and seen.append((d, t, preview)))
    bridge = client.Bridge.connect()
    steps = 40  # a few ms each on tiny-wan: the poller sees several previews, not necessarily all
    payload = {"prompt": "a red ball", "model": "tiny-wan", "seed": 3, "width": 64, "height": 64, "frames": 17, "steps": steps,
               "preview_every": 1}
    out, log = call_with_burst_worker(lambda: bridge.render(payload, 300, hooks), env, redis_conn, h3_settings)
    assert "error" not in out, f"{out.get('error')!r}\n{log}"
    result = out["value"]
    assert seen, "no preview reached the hook"
    for done, total, img in seen:
        assert total == steps and 1 <= done <= steps and img.mode == "RGB" and img.size == (64, 64)
    # the last preview is the one after the last step; meta keeps only the latest
    meta = job_status(redis_conn, result.job_id)
    assert meta.preview_step == steps
    step, png = status_preview(redis_conn, result.job_id)
    last = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), np.float64)
    assert step == steps and np.array_equal(last, np.asarray(seen[-1][2], np.float64))
    # After the last step the flow model's x0 estimate is the final latent, so the preview is
    # frame 0 of the video up to the mp4's loss: the same PSNR floors as mp4 vs poster PNG above.
    first = result.frames[0].astype(np.float64) * 255.0
    rgb, luma = psnr(first, last), psnr(first @ LUMA, last @ LUMA)
    assert rgb >= MP4_VS_PNG_MIN_PSNR_DB and luma >= MP4_VS_PNG_MIN_LUMA_PSNR_DB, (rgb, luma)
    print(f"{len(seen)} previews seen at steps {[d for d, _, _ in seen]}; last vs mp4 frame 0: "
          f"RGB {rgb:.1f} dB, luma {luma:.1f} dB")


def test_failed_job_raises_the_workers_reason(env, redis_conn, h3_settings):
    from h3render.queue.engine_info import local_info, publish_engine_info

    bridge = client.Bridge.connect()
    payload = {"prompt": "a red ball", "model": "tiny-wan", "width": 64, "height": 64, "frames": 5, "steps": 2,
               "engine_options": {"no_such_option": 1}}
    with pytest.raises(BridgeInputError, match="no_such_option"):  # refused at enqueue: no engine has it
        bridge.render(payload, 300)
    # A worker of another build says its engine has the option, so the job is queued; this worker's
    # engine refuses it, and the node raises the worker's reason.
    info = local_info("tiny-wan")
    publish_engine_info(redis_conn, "tiny-wan", {**info, "options": {**info["options"], "no_such_option": ""}})
    out, log = call_with_burst_worker(lambda: bridge.render(payload, 300), env, redis_conn, h3_settings)
    e = out.get("error")
    assert isinstance(e, JobFailedError), (out, log)
    assert "'no_such_option' is not known" in str(e) and e.job_id in str(e)
    assert job_status(redis_conn, e.job_id).state == "failed"  # not retried: no rq retry for node jobs


def test_bad_widget_value_names_the_field(nodes, env, redis_conn, h3_settings):
    with pytest.raises(BridgeInputError) as e:
        nodes.H3Render().render(**{**RENDER, "frames": 20})
    assert "frames=20" in str(e.value) and "4k+1" in str(e.value)
    assert queue(redis_conn, h3_settings).count == 0  # nothing was enqueued


def test_no_worker_fails_fast_and_cancels_its_job(nodes, env, redis_conn, monkeypatch):
    monkeypatch.setenv("H3RENDER_COMFY_WORKER_GRACE_S", "1")
    t0 = time.monotonic()
    with pytest.raises(NoWorkerError) as e:
        nodes.H3Render().render(**RENDER)  # timeout 300 s
    took = time.monotonic() - t0
    assert took < 10, took  # the grace (1 s) plus one worker check, not the node's timeout
    assert "`h3render worker`" in str(e.value)
    job_id = str(e.value).split("job ")[1].split()[0]
    assert job_status(redis_conn, job_id).state == "canceled"  # it will not render later


def test_interrupt_mid_render_cancels_the_job_within_one_step(nodes, fake, env, redis_conn, h3_settings):
    steps = 400
    fake.interrupt_when = lambda progress: any(v >= 5 for v, _ in progress)  # the user presses Cancel
    render = nodes.H3Render()
    out, log = call_with_burst_worker(lambda: render.render(**{**RENDER, "steps": steps}), env, redis_conn,
                                      h3_settings)
    assert isinstance(out.get("error"), InterruptProcessingException), (out, log)  # re-raised unchanged
    # the node's Bridge is gone with the call; read the job back from the queue
    (job_id,) = recent_job_ids(redis_conn, h3_settings)
    row = job_status(redis_conn, job_id)
    assert row.state == "canceled", row
    # The step read right after the cancel key was set is recorded by the bridge (see
    # the unit-level check below); here: the job stopped long before its last step.
    assert row.step is not None and 5 <= row.step < steps, row


def test_interrupt_cancel_record_is_within_one_step(env, redis_conn, h3_settings):
    """Same through the client, which records the step seen right after the cancel request.

    The render task writes the step to meta, then reads the cancel key, at every step;
    the step read after the key was set is >= the step in meta when it was set, so the
    engine can complete at most one more step before its callback sees the key.
    """
    fake = FakeComfy()
    fake.interrupt_when = lambda progress: any(v >= 5 for v, _ in progress)
    bridge = client.Bridge.connect()
    hooks = client.Hooks(progress=lambda d, t, preview=None: fake.progress.append((d, t)),
                         check_interrupt=fake.modules()["comfy.model_management"].throw_exception_if_processing_interrupted)
    payload = {"prompt": "a red ball", "model": "tiny-wan", "width": 64, "height": 64, "frames": 17, "steps": 400}
    out, log = call_with_burst_worker(lambda: bridge.render(payload, 300, hooks), env, redis_conn, h3_settings)
    assert isinstance(out.get("error"), InterruptProcessingException), (out, log)
    rec = bridge.last_cancel
    assert rec is not None and rec.final_state == "canceled", rec
    assert rec.final_step <= rec.step_at_request + 1, rec
    assert rec.seconds < bridge.bridge.cancel_wait_s
    print(f"cancel: {rec}")


# ---------------------------------------------------------------- sweeps


def test_sweep_returns_at_once_then_results_show_the_grid(nodes, fake, env, redis_conn, h3_settings):
    t0 = time.monotonic()
    res = nodes.H3Sweep().sweep(prompts="a red ball", negative_prompts="", seed="1-3", width="64", height="64",
                                frames="5", steps="1,2", guidance="", quant="", model="tiny-wan", preview=False)
    took = time.monotonic() - t0
    sweep_id, jobs, estimate_s, url = res["result"]
    assert took < 5, took  # no worker is running: it enqueued and returned
    assert sweep_id.startswith("s-") and jobs == 6 and estimate_s > 0 and url.endswith(f"/sweeps/{sweep_id}")
    assert "no worker is running now" in res["ui"]["text"][0]
    results = nodes.H3SweepResults()
    # before any worker: placeholders, a summary of queued jobs, a one-frame placeholder for frames
    sheet0, frames0, summary0 = results.results(sweep_id, False, 10, 0, 0, 128)
    assert "queued 6" in summary0 and frames0.shape[0] == 1
    changed0 = nodes.H3SweepResults.IS_CHANGED(sweep_id=sweep_id, wait=True)
    assert changed0 == nodes.H3SweepResults.IS_CHANGED(sweep_id=sweep_id, wait=True)  # cached while idle

    log = subprocess.run([sys.executable, "-c", CLI, "worker", "--burst"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert log.returncode == 0, log.stdout + log.stderr
    assert nodes.H3SweepResults.IS_CHANGED(sweep_id=sweep_id, wait=True) != changed0  # re-runs once jobs moved

    img, frames, summary = results.results(sweep_id, True, 60, 4, 0, 128)
    assert "6 finished" in summary and "failed 0" in summary, summary
    assert img.shape[0] == 1 and img.dtype == np.float32 and 0 <= img.min() and img.max() <= 1
    # frames of job 4 in sweep order (seed outer, steps inner): seed 3, steps 1
    assert frames.shape == (5, 64, 64, 3) and frames.dtype == np.float32
    view = client.Bridge.connect().sweep_view(sweep_id)
    assert [e.values for e in view.entries] == [{"seed": s, "steps": n} for s in (1, 2, 3) for n in (1, 2)]
    assert view.entries[4].values == {"seed": 3, "steps": 1}
    # the grid: one column per value of the last axis (steps: 2), three rows (seed); each
    # cell shows that job's poster (64x64, not scaled at tile_size 128)
    lh = sheet._line_height(sheet._font())
    cell_w, cell_h, top = sheet.MIN_CELL_W + 2 * sheet.PAD, 64 + 2 * lh + 2 * sheet.PAD, lh + sheet.PAD
    grid = np.rint(img[0] * 255).astype(np.uint8)
    assert grid.shape == (top + 3 * cell_h, 2 * cell_w, 3)
    for i, e in enumerate(view.entries):
        x = (i % 2) * cell_w + sheet.PAD + (cell_w - 2 * sheet.PAD - 64) // 2
        y = top + (i // 2) * cell_h + sheet.PAD
        poster = np.asarray(Image.open(e.output_dir / "poster.png").convert("RGB"))
        assert np.array_equal(grid[y:y + 64, x:x + 64], poster), f"cell {i} is not job {e.job_id}'s poster"
