"""The worker with the pieces wired in: models published at start, tuned thread counts,
preview frames in meta, and h3.c admission. Real redis-server, real `h3render worker`
processes and the real CPU engine (no Metal: h3.c jobs are followed up to the engine,
which the CPU library cannot run).

About 30-40 s on 2 cores (each job spawns a fresh Python process).
"""

from __future__ import annotations

import base64
import io
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rq.job import JobStatus

from test_h3_inspect import make_snapshot
from test_queue_h3 import H3_INFO
from test_worker_integration import SMALL, env, fetch, h3, run_worker, write_readings  # noqa: F401 - env is a fixture

from h3render.engine import tune
from h3render.queue.engine_info import publish_engine_info, published_info
from h3render.queue.enqueue import enqueue
from h3render.worker.health import MemoryReading, Readings
from h3render.worker.preview import MAX_SIDE, preview_png, preview_size

pytestmark = pytest.mark.slow
GIB = 1 << 30


def models_dir(settings) -> Path:
    d = Path(settings.home) / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---------------------------------------------------------------- models published at start


def test_worker_start_publishes_installed_models_and_skips_bad_ones(env, redis_conn, h3_settings,
                                                                    converted_models, tmp_path):
    models = models_dir(h3_settings)
    (models / "tiny-wan").symlink_to(converted_models("tiny-wan"), target_is_directory=True)
    broken = models / "broken"
    broken.mkdir()
    (broken / "transformer-f32.gguf").write_bytes(b"GGUF but not really" * 10)
    make_snapshot(tmp_path / "snap")  # an H3 snapshot: the CPU engine cannot open it
    (models / "MiniMax-H3").symlink_to(tmp_path / "snap", target_is_directory=True)

    out = run_worker(env, "--burst")  # empty queue: publish, then leave; exit 0 (run_worker checks)
    info = published_info(redis_conn, "tiny-wan")
    assert info is not None and info["quant_levels"] == ["f32", "f16"] and info["text_len"] > 0
    assert published_info(redis_conn, "broken") is None and published_info(redis_conn, "MiniMax-H3") is None
    assert "model tiny-wan: published" in out, out
    bad = next(line for line in out.splitlines() if "model broken: skipped:" in line)
    assert "transformer-f32.gguf" in bad, bad  # the engine's own message names the file
    assert "model MiniMax-H3: skipped:" in out, out
    print("\n".join(line for line in out.splitlines() if "model " in line))


# ---------------------------------------------------------------- threads and previews


def test_tuned_thread_count_and_previews_in_meta(env, redis_conn, h3_settings, monkeypatch):
    """A job whose model/quant was tuned runs with the stored count; one that was not, on all
    cores. preview_every=2 over 5 steps: previews after steps 2, 4 and 5; meta keeps the last."""
    monkeypatch.setenv("H3RENDER_HOME", str(h3_settings.home))  # tune.store writes under it
    best = tune.store("tiny-wan", "f32", [tune.Measurement(1, [0.4]), tune.Measurement(2, [0.6])], (16, 5, 8, 8))
    assert best == 1
    tuned = enqueue(redis_conn, {**SMALL, "quant": "f32", "steps": 5, "preview_every": 2}, h3_settings).job_ids[0]
    untuned = enqueue(redis_conn, {**SMALL, "quant": "f16"}, h3_settings).job_ids[0]
    run_worker(env, "--burst")

    m = h3(redis_conn, tuned)
    assert fetch(redis_conn, tuned).get_status() == JobStatus.FINISHED, m
    assert (m["threads"], m["threads_source"]) == (1, "tune")
    doc = json.loads((Path(m["output_dir"]) / "meta.json").read_text())
    assert doc["engine"]["threads"] == 1  # the engine's own pool size
    assert m["preview_step"] == 5 and m["step"] == 5
    png = base64.b64decode(m["preview_png"])
    img = Image.open(io.BytesIO(png))
    assert img.format == "PNG" and img.mode == "RGB" and img.size == (64, 64)  # <= 256: kept as it is

    m = h3(redis_conn, untuned)
    assert fetch(redis_conn, untuned).get_status() == JobStatus.FINISHED, m
    assert (m["threads"], m["threads_source"]) == (0, "all cores")
    doc = json.loads((Path(m["output_dir"]) / "meta.json").read_text())
    assert doc["engine"]["threads"] == os.cpu_count()
    assert "preview_png" not in m and "preview_step" not in m  # no previews asked


def test_preview_png_is_at_most_256_on_the_long_side():
    assert preview_size(640, 360) == (256, 144) and preview_size(360, 1280) == (72, 256)
    assert preview_size(64, 48) == (64, 48)  # never scaled up
    rgb = np.random.default_rng(0).integers(0, 256, (360, 640, 3), dtype=np.uint8)
    img = Image.open(io.BytesIO(preview_png(rgb)))
    assert img.size == (256, 144) and max(img.size) == MAX_SIDE
    # a flat colour stays that colour through the scaling
    flat = np.full((300, 500, 3), (200, 30, 90), np.uint8)
    assert np.array_equal(np.unique(np.asarray(Image.open(io.BytesIO(preview_png(flat)))).reshape(-1, 3), axis=0),
                          [[200, 30, 90]])
    with pytest.raises(ValueError, match="expected \\(H, W, 3\\)"):
        preview_png(np.zeros((4, 4), np.uint8))


# ---------------------------------------------------------------- h3.c admission


def sparse_dit(root: Path, dit_bytes: int) -> None:
    """Replace the snapshot's FL2VA DiT with one shard whose header declares dit_bytes of BF16
    and whose data is a hole in a sparse file: `models inspect` reads the real figure."""
    t = root / "FL2VA" / "transformer"
    for f in t.glob("*.safetensors*"):
        f.unlink()
    header = {"blocks.w": {"dtype": "BF16", "shape": [dit_bytes // 2], "data_offsets": [0, dit_bytes]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = t / "model.safetensors"
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + dit_bytes)


def test_h3_jobs_are_admitted_by_the_h3_estimate(env, redis_conn, h3_settings, tmp_path):
    """48 GiB available, 20% headroom: the exact path (38.5 GiB) is refused with the fix the
    estimate finds (dit_layers=45), dit_layers=45 (34.8 GiB) is admitted and goes on to the
    engine; a snapshot with a truncated shard fails naming the file before any engine runs."""
    models = models_dir(h3_settings)
    make_snapshot(tmp_path / "h3")
    sparse_dit(tmp_path / "h3", 37 * GIB)
    (models / "MiniMax-H3").symlink_to(tmp_path / "h3", target_is_directory=True)
    make_snapshot(tmp_path / "h3-bad")
    shard = tmp_path / "h3-bad" / "FL2VA" / "transformer" / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    (models / "H3-bad").symlink_to(tmp_path / "h3-bad", target_is_directory=True)
    for name in ("MiniMax-H3", "H3-bad"):  # as an h3.c worker publishes it; the CPU engine cannot
        publish_engine_info(redis_conn, name, {**H3_INFO, "model": name})
    write_readings(Path(env["_readings"]), Readings(platform="test",
                                                    memory=MemoryReading(available_bytes=48 * GIB)))
    env = {**env, "H3RENDER_ADMISSION_WAIT_LIMIT_S": "1", "H3RENDER_ADMISSION_POLL_S": "0.3",
           "H3RENDER_RETRY_MAX": "0"}
    once = h3_settings.model_copy(update={"retry_max": 0})
    job = {"prompt": "a fox", "model": "MiniMax-H3", "width": 512, "height": 512, "frames": 22, "steps": 20}
    exact = enqueue(redis_conn, job, once).job_ids[0]
    layers45 = enqueue(redis_conn, {**job, "engine_options": {"dit_layers": 45}}, once).job_ids[0]
    bad = enqueue(redis_conn, {**job, "model": "H3-bad"}, once).job_ids[0]
    run_worker(env, "--burst", timeout=180)

    m = h3(redis_conn, exact)
    assert fetch(redis_conn, exact).get_status() == JobStatus.FAILED
    assert m["error"] == ("not enough memory: needs 38.5 GiB, 48.0 GiB available (headroom 20%); "
                          "try engine option dit_layers=45"), m["error"]
    assert m["retryable"] is True and "engine" not in m
    assert m["estimate"]["dit"] == 37 * GIB and m["estimate"]["preview_vae"] == 0

    m = h3(redis_conn, layers45)
    assert m["admission"] == "needs 34.8 GiB, 48.0 GiB available (headroom 20%)", m
    assert m["estimate"]["dit"] == 37 * GIB * 45 // 50 and m["state"] == "failed"
    assert "cannot open the H3 snapshot 'MiniMax-H3'" in m["error"] and "docs/H3C.md" in m["error"]  # admitted;
    assert m["retryable"] is False  # the CPU library cannot run h3.c, and a retry would not change that
    print(f"dit_layers=45 after admission: {m['error']}")

    m = h3(redis_conn, bad)
    assert fetch(redis_conn, bad).get_status() == JobStatus.FAILED and m["retryable"] is False
    assert "has broken files" in m["error"] and "FL2VA/transformer/model-00002-of-00002.safetensors" in m["error"]
    assert "admission" not in m
