"""One job, three doors, the same frames: `h3render run`, the queue (`h3render enqueue` and a real
worker) and the ComfyUI H3 Render node (through the queue and a real worker) render identical
frames for the same prompt, seed and size, because all three take the job contract's defaults,
validation and engine request (h3render/queue/contract.py).

Real parts: the suite's private Redis, `h3render` subprocesses (run, enqueue, `worker --burst`
with rq's SpawnWorker and the C engine), ffmpeg. The node runs as ComfyUI would call it, with
ComfyUI's own modules (which cannot be installed here) replaced by test_comfy_nodes' stand-ins.
About 30 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from test_comfy_nodes import FakeComfy, load_nodes
from test_comfy_queue import call_with_burst_worker

from h3render.engine.video import frame_name, read_frames
from h3render.queue.status import job_status
from h3render.worker.health import Readings

ROOT = Path(__file__).resolve().parents[1]
CLI = "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"
# The node's widget values; 0 / -1 / "" / "default" leave a field to the model, as run and enqueue do.
NODE = dict(prompt="a red ball bouncing", negative_prompt="", seed=5, width=64, height=64, frames=17, steps=3,
            guidance=-1.0, quant="default", model="tiny-wan", timeout=300)
FLAGS = ["--model", "tiny-wan", "--prompt", NODE["prompt"], "--seed", "5", "--width", "64", "--height", "64",
         "--frames", "17", "--steps", "3"]


@pytest.fixture
def env(h3_settings, converted_models, tmp_path, monkeypatch):
    """This test's Redis and home (tiny-wan installed), normal readings so the worker's gate stays
    open on a busy machine, and the same for the node in this process."""
    models = h3_settings.home / "models"
    models.mkdir(parents=True)
    (models / "tiny-wan").symlink_to(converted_models("tiny-wan"), target_is_directory=True)
    readings = tmp_path / "readings.json"
    readings.write_text(Readings(platform="test").model_dump_json())
    e = dict(os.environ)
    e.update(PYTHONPATH=str(ROOT) + os.pathsep + e.get("PYTHONPATH", ""), H3RENDER_HOME=str(h3_settings.home),
             H3RENDER_REDIS_URL=h3_settings.redis_url, H3RENDER_GATE_POLL_S="1",
             H3RENDER_ENABLE_TEST_TRIGGERS="1", H3RENDER_TEST_READINGS=str(readings))
    monkeypatch.setenv("H3RENDER_COMFY_POLL_S", "0.02")
    monkeypatch.setenv("H3RENDER_COMFY_WORKER_GRACE_S", "20")
    return e


def cli(env: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def test_run_the_queue_and_the_node_render_identical_frames(env, redis_conn, h3_settings, monkeypatch, tmp_path):
    """Issue 14: `run` and the queue built their requests separately (f16 against f32 by default),
    so the same seed gave different videos. Now the three doors give byte-identical frames."""
    # -- h3render run, in this machine's process: the engine's frames as PNGs, and the mp4
    ran = cli(env, "run", *FLAGS, "--frames-dir", tmp_path / "run", "-o", tmp_path / "run.mp4", "--json")
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    engine_frames = np.stack([pixels(tmp_path / "run" / frame_name(i)) for i in range(17)])

    # -- h3render enqueue, rendered by a real burst worker
    queued = cli(env, "enqueue", *FLAGS)
    assert queued.returncode == 0, queued.stderr
    job_id = queued.stdout.split()[0]
    worker = cli(env, "worker", "--burst")
    assert worker.returncode == 0, worker.stdout[-2000:] + worker.stderr[-2000:]
    row = job_status(redis_conn, job_id)
    assert row.state == "finished", (row, worker.stderr[-2000:])
    queue_dir = Path(row.output_dir)

    # -- the ComfyUI node: enqueue, wait for a real burst worker, frames decoded from its mp4
    nodes = load_nodes(monkeypatch, FakeComfy())
    out, log = call_with_burst_worker(lambda: nodes.H3Render().render(**NODE), env, redis_conn, h3_settings)
    assert "error" not in out, f"{out.get('error')!r}\n{log}"
    node_frames, node_video, node_job = out["value"]
    node_dir = Path(job_status(redis_conn, node_job).output_dir)

    # the same resolved job behind all three (the node also asks for a preview every step, which
    # only shows in its progress display)
    params = [json.loads((d / "meta.json").read_text())["parameters"] for d in (queue_dir, node_dir)]
    assert params[1].pop("preview_every") == 1 and params[0].pop("preview_every") == 0
    assert params[0] == params[1], params
    for k in ("seed", "width", "height", "frames", "steps", "sampler", "quant"):
        assert summary[k] == params[0][k], (k, summary[k], params[0][k])
    assert summary["quant"] == "f16"

    # the frames: the engine's (lossless) middle frame is each door's poster, and the decoded videos are equal
    mid = 17 // 2
    assert np.array_equal(engine_frames[mid], pixels(tmp_path / "run.png"))
    assert np.array_equal(engine_frames[mid], pixels(queue_dir / "poster.png"))
    assert np.array_equal(engine_frames[mid], pixels(node_dir / "poster.png"))
    from_run, from_queue = read_frames(tmp_path / "run.mp4"), read_frames(queue_dir / "video.mp4")
    from_node = np.rint(np.asarray(node_frames, np.float64) * 255.0).astype(np.uint8)
    assert from_run.shape == (17, 64, 64, 3) and engine_frames.std() > 1.0
    assert np.array_equal(from_run, from_queue), "run and the queue decoded to different frames"
    assert np.array_equal(from_run, from_node), "run and the node decoded to different frames"
    same_file = (tmp_path / "run.mp4").read_bytes() == (queue_dir / "video.mp4").read_bytes()
    print(f"17 frames equal through run, queue ({job_id}) and node ({node_job}); mp4 files byte-equal: {same_file}")
