"""The renders folder on a full disk: a clear reason, a clean folder, no retry storm.

renders/ is a symlink to a small tmpfs (the `tmpfs` fixture: needs root and mount),
so every byte a render writes, and every free byte the worker reads, is real.
Real redis-server, a real `h3render worker`, its render processes, the tiny
model, ffmpeg.

    full while writing   the disk fills while a job denoises: the write fails with
                         ENOSPC, the job goes back to the queue without spending a
                         retry, the disk gate keeps the worker from dequeuing it while
                         the disk stays full (no second attempt), and once space is
                         back it runs to the end
    short of the job     more than the margin is free but not the job's outputs on
                         top: admission waits (waiting_disk), then fails with the
                         figures; the job folder holds meta.json with the reason only
    larger than the disk the job's outputs plus the margin exceed the whole file
                         system: failed at once, not retryable

Takes about 50 s on 2 shared cores.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from rq.job import JobStatus

from faults.harness import SMALL, fetch, h3meta, start_worker, stop, temp_files, wait_for
from h3render.engine.video import probe
from h3render.queue.enqueue import enqueue
from h3render.settings import Settings
from h3render.worker.admission import output_bytes
from h3render.worker.health import DiskReading, Readings, decide

KiB, MiB, GiB = 1024, 1024**2, 1024**3
NEED = output_bytes(SMALL["width"], SMALL["height"], SMALL["frames"])  # ~1.2 MiB

pytestmark = pytest.mark.slow


def renders_on_tmpfs(tmpfs, settings: Settings, size: int) -> Path:
    fs = tmpfs(size)
    home = Path(settings.home)
    home.mkdir(parents=True, exist_ok=True)
    (home / "renders").symlink_to(fs, target_is_directory=True)
    return fs


def fill(fs: Path, leave: int = 0) -> Path:
    """Fill the file system with one file, then give back `leave` bytes (page-rounded)."""
    path = fs / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        chunk = b"\1" * (64 * KiB)
        while True:
            try:
                os.write(fd, chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        if leave:
            os.ftruncate(fd, max(os.fstat(fd).st_size - leave, 0))
    finally:
        os.close(fd)
    return path


def _job_folder(settings: Settings, jid: str) -> Path:
    return settings.renders_dir() / time.strftime("%Y-%m-%d") / jid


def test_disk_gate_rule():
    s = Settings(redis_url="redis://unused", gate_min_free_bytes=MiB)
    short = decide(Readings(disk=DiskReading(path="/r", free_bytes=MiB - 1, total_bytes=GiB)), s)
    assert not short.open and [r.code for r in short.reasons] == ["disk_free"]
    assert short.reasons[0].message == ("disk: 1024.0 KiB free under /r, below the 1.0 MiB margin "
                                        "(H3RENDER_GATE_MIN_FREE_BYTES)")
    assert decide(Readings(disk=DiskReading(path="/r", free_bytes=MiB, total_bytes=GiB)), s).open
    assert decide(Readings(), s).open  # no disk reading: no hold



def test_disk_full_while_writing_requeues_without_a_retry_storm(tmpfs, worker_env, redis_conn,
                                                                h3_settings, fault_table):
    fs = renders_on_tmpfs(tmpfs, h3_settings, 8 * MiB)
    margin = 512 * KiB
    env = {**worker_env, "H3RENDER_GATE_MIN_FREE_BYTES": str(margin)}
    jid = enqueue(redis_conn, {**SMALL, "steps": 400}, h3_settings).job_ids[0]
    p = start_worker(env)
    try:
        wait_for(lambda: (h3meta(redis_conn, jid).get("step") or 0) >= 2, 120, "denoising")
        filler = fill(fs)
        m = wait_for(lambda: (lambda m: (m.get("error") or "").startswith("disk full") and m)(
            h3meta(redis_conn, jid)), 120, "the disk-full failure")
        failed_at = time.time()
        # the disk stays full: the gate holds the worker, the job is not run again
        health = wait_for(lambda: (lambda d: d and not d["open"] and d)(json.loads(
            redis_conn.get(f"h3render:health:{socket.gethostname()}") or "null")), 30,
            "the disk gate to close")
        time.sleep(5)
        held_m = h3meta(redis_conn, jid)
        left_while_full = temp_files(h3_settings.renders_dir())
        folder_while_full = _job_folder(h3_settings, jid).exists()
        attempts_while_full = held_m["attempt"]
        waited = time.time() - failed_at
        filler.unlink()
        wait_for(lambda: fetch(redis_conn, jid).get_status() == JobStatus.FINISHED, 120,
                 "the job to finish once the disk has room")
    finally:
        out = stop(p)
    reason = m["error"]
    print("disk-full reason:", reason)
    print("gate while full:", health["state"])
    assert reason.startswith("disk full: ") and f"free under {h3_settings.renders_dir()}" in reason
    assert f"needs up to {NEED / MiB:.1f} MiB for its outputs plus the 512.0 KiB margin" in reason
    assert "back to the queue without spending a retry (1 of 5)" in reason
    assert m["state"] == "queued" and m["disk_full_requeues"] == 1
    assert "No space left on device" in m["write_error"] or "Errno 28" in m["write_error"]
    assert [r["code"] for r in health["reasons"]] == ["disk_free"], health
    assert attempts_while_full == 1, held_m  # no retry storm while the disk is full
    assert not left_while_full and not folder_while_full  # the failed attempt left nothing
    job = fetch(redis_conn, jid)
    done = job.meta["h3r"]
    assert done["attempt"] == 2 and job.retries_left == h3_settings.retry_max  # no retry spent
    folder = Path(done["output_dir"])
    assert folder == _job_folder(h3_settings, jid)
    assert {q.name for q in folder.iterdir()} == {"video.mp4", "poster.png", "meta.json"}
    assert probe(folder / "video.mp4").frames == SMALL["frames"]
    assert not temp_files(h3_settings.renders_dir()), temp_files(h3_settings.renders_dir())
    row = fault_table("disk", "renders/ fills up while a job writes (tmpfs)", tried=1, held=1, lost=0,
                      bound="clear reason, clean folder, no retry spent, no rerun until space is back",
                      note=f"1 attempt in {waited:.0f} s of full disk; then finished on attempt 2; "
                           f"retries left {job.retries_left}/{h3_settings.retry_max}")
    assert row.ok, out[-3000:]


def test_disk_short_of_the_job_waits_then_fails_with_meta_json_only(tmpfs, worker_env, redis_conn,
                                                                    h3_settings, fault_table):
    fs = renders_on_tmpfs(tmpfs, h3_settings, 4 * MiB)
    fill(fs, leave=int(1.5 * MiB))
    free = shutil.disk_usage(fs).free
    assert MiB <= free < NEED + MiB, free  # over the margin, under the job's need
    env = {**worker_env, "H3RENDER_GATE_MIN_FREE_BYTES": str(MiB), "H3RENDER_RETRY_MAX": "0",
           "H3RENDER_ADMISSION_WAIT_LIMIT_S": "2", "H3RENDER_ADMISSION_POLL_S": "0.5"}
    settings = h3_settings.model_copy(update={"retry_max": 0})
    jid = enqueue(redis_conn, SMALL, settings).job_ids[0]
    p = start_worker(env, "--burst")
    try:
        waiting = wait_for(lambda: (lambda m: m.get("state") == "waiting_disk" and m)(
            h3meta(redis_conn, jid)), 60, "meta state waiting_disk")
        p.wait(timeout=120)
    finally:
        out = stop(p)
    job = fetch(redis_conn, jid)
    m = job.meta["h3r"]
    print("waiting:", waiting["reason"])
    print("failed:", m["error"])
    assert job.get_status() == JobStatus.FAILED, (m, out[-2000:])
    assert waiting["reason"].startswith(f"waiting for disk space: needs up to {NEED / MiB:.1f} MiB "
                                        "for its outputs plus the 1.0 MiB margin, ")
    assert m["error"].startswith("not enough disk space: needs up to ")
    assert f"free under {h3_settings.renders_dir()}" in m["error"] and m["attempt"] == 1
    folder = _job_folder(h3_settings, jid)
    assert sorted(q.name for q in folder.iterdir()) == ["meta.json"]
    doc = json.loads((folder / "meta.json").read_text())
    assert doc["state"] == "failed" and doc["error"] == m["error"] and doc["job_id"] == jid
    assert not temp_files(h3_settings.renders_dir()), temp_files(h3_settings.renders_dir())
    row = fault_table("disk", "renders/ short of one job's outputs (tmpfs)", tried=1, held=1, lost=0,
                      bound="waits for space, then fails with the figures; folder: meta.json only",
                      note=f"{free / MiB:.1f} MiB free, job needs {NEED / MiB:.1f} MiB + 1.0 MiB margin")
    assert row.ok


def test_job_larger_than_the_disk_fails_at_once(tmpfs, worker_env, redis_conn, h3_settings,
                                                fault_table):
    renders_on_tmpfs(tmpfs, h3_settings, MiB)  # under the job's ~1.2 MiB
    env = {**worker_env, "H3RENDER_GATE_MIN_FREE_BYTES": "0", "H3RENDER_ADMISSION_POLL_S": "30"}
    jid = enqueue(redis_conn, SMALL, h3_settings).job_ids[0]
    p = start_worker(env, "--burst")
    try:
        p.wait(timeout=120)
    finally:
        out = stop(p)
    job = fetch(redis_conn, jid)
    m = job.meta["h3r"]
    print("failed:", m["error"])
    assert job.get_status() == JobStatus.FAILED and job.retries_left == 0, (m, out[-2000:])
    assert m["error"] == (f"does not fit the disk: needs up to {NEED / MiB:.1f} MiB for its outputs "
                          f"plus the 0 bytes margin, and the file system under "
                          f"{h3_settings.renders_dir()} holds 1.0 MiB in all")
    assert m["retryable"] is False and m["attempt"] == 1
    assert sorted(q.name for q in _job_folder(h3_settings, jid).iterdir()) == ["meta.json"]
    row = fault_table("disk", "job larger than the whole renders disk (tmpfs)", tried=1, held=1,
                      lost=0, bound="failed at once, not retryable, with the figures",
                      note=f"job {NEED / MiB:.1f} MiB, disk 1.0 MiB")
    assert row.ok
