"""Files a person can trust: a job folder is whole or absent, whatever kills the render.

Real redis-server, a real long-running `h3render worker`, its render processes,
the real engine (tiny model) and the real ffmpeg.

    kill -9        the render process (its pid from meta h3r "pid") at a random moment
                   of its run, at a random denoising step, or in its last moments
                   (decode, write, publish), in turn:
                   afterwards no temporary file or staging folder anywhere under
                   renders/, every job folder holds a whole video.mp4, poster.png and
                   meta.json, and every killed job ran again to the end (or failed
                   with a reason)
    worker start   stale staging folders (their render process is dead) are swept;
                   a live render's is kept
    publish        the job folder appears by one rename and replaces an earlier
                   attempt's failure record; a failure record is meta.json alone

Takes 1 to 2 minutes on 2 shared cores with the suite's 4 kills (each attempt spawns a fresh Python).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image
from rq.job import JobStatus

from faults.harness import (SMALL, fetch, h3meta, run_cli, start_worker, stop, temp_files,
                            wait_for)
from h3render.engine.video import probe
from h3render.queue.enqueue import enqueue
from h3render.worker import staging

# Kills in the suite: each waits for its job's retry in a fresh render process, ~15-30 s apiece
# on 2 busy cores. tests/faults/test_worker_kills.py makes 10 render kills with the same temp-file
# check; `make faults` runs this one with H3RENDER_FILE_KILLS=10 to spread them over every phase.
KILLS = int(os.environ.get("H3RENDER_FILE_KILLS", "4"))
STEPS = 40
JOB = {**SMALL, "steps": STEPS}
OUTPUTS = {"video.mp4", "poster.png", "meta.json"}
TAIL = ("decoding", "writing", "finished")
# meta state as the kill found it; "queued" with a pid is the render's start (admission)
PHASE = {"queued": "admission", "loading": "load", "encoding": "encode", "denoising": "denoise",
         "decoding": "decode", "writing": "write", "finished": "after publish"}

pytestmark = pytest.mark.slow


def _done(r, jid: str):
    st = fetch(r, jid).get_status()
    return st if st in (JobStatus.FINISHED, JobStatus.FAILED) else None


def _whole(folder: Path, jid: str) -> bool:
    """video.mp4, poster.png and meta.json, each complete, and nothing else."""
    if {p.name for p in folder.iterdir()} != OUTPUTS:
        return False
    doc = json.loads((folder / "meta.json").read_text())
    with Image.open(folder / "poster.png") as im:
        im.verify()
    return doc["job_id"] == jid and probe(folder / "video.mp4").frames == SMALL["frames"]


def test_kill_9_of_the_render_leaves_no_temp_file_and_no_half_folder(worker_env, redis_conn,
                                                                     h3_settings, fault_table):
    seed = int(os.environ.get("H3RENDER_FAULT_SEED") or time.time())
    rng = random.Random(seed)
    renders = h3_settings.renders_dir()
    p = start_worker(worker_env)
    trials: list[dict] = []
    try:
        # one undisturbed job: how long a render runs from its pid appearing to its end
        cal = enqueue(redis_conn, JOB, h3_settings).job_ids[0]
        wait_for(lambda: _done(redis_conn, cal), 120, "the calibration job")
        m = h3meta(redis_conn, cal)
        run_s = m["finished_at"] - m["started_at"]
        tail_s = m["timings"].get("decode", 0) + m["timings"].get("write", 0)
        i = 0
        while sum(t["killed"] for t in trials) < KILLS and i < 3 * KILLS:  # a render may end first
            i += 1
            jid = enqueue(redis_conn, JOB, h3_settings).job_ids[0]
            pid = wait_for(lambda: h3meta(redis_conn, jid).get("pid"), 120, "the render's pid")
            if i % 3 == 0:  # anywhere in the run (mostly admission: the tiny model renders fast)
                time.sleep(rng.uniform(0, run_s))
            elif i % 3 == 1:  # at a random denoising step
                k = rng.randint(1, STEPS - 1)
                wait_for(lambda: (h3meta(redis_conn, jid).get("step") or 0) >= k
                         or h3meta(redis_conn, jid).get("state") in TAIL, 120, f"step {k}",
                         every=0.002)
            else:  # in its last moments, where the files are written: decode, write, publish
                wait_for(lambda: h3meta(redis_conn, jid).get("state") in TAIL, 120, "the decode",
                         every=0.002)
                time.sleep(rng.uniform(0, tail_s))
            before = PHASE.get(h3meta(redis_conn, jid).get("state"), "?")
            try:
                os.kill(pid, signal.SIGKILL)
                killed = True
            except ProcessLookupError:
                killed = False
            trials.append({"job": jid, "killed": killed, "state": before})
            wait_for(lambda: _done(redis_conn, jid), 120, f"job {jid} to end after the kill")
    except AssertionError as e:
        out = stop(p)
        job = fetch(redis_conn, trials[-1]["job"]) if trials else None
        raise AssertionError(f"{e}\ntrials: {trials}\nlast job: "
                             f"{job and (job.get_status(), job.retries_left, job.meta)}\n"
                             f"worker output:\n{out[-6000:]}") from None
    finally:
        out = stop(p)
    leftovers = temp_files(renders)
    held = lost = 0
    for t in trials:
        job = fetch(redis_conn, t["job"])
        m = job.meta["h3r"]
        t["status"], t["attempt"] = job.get_status().value, m.get("attempt")
        folder = Path(m["output_dir"]) if m.get("output_dir") else None
        if job.get_status() == JobStatus.FINISHED:
            ok = folder == renders / time.strftime("%Y-%m-%d") / t["job"] and _whole(folder, t["job"])
            ok = ok and (not t["killed"] or m["attempt"] >= 2 or t["state"] == "after publish")
        else:
            ok = bool(m.get("error"))
        lost += not ok
        held += ok and not leftovers
    states = sorted({t["state"] for t in trials if t["killed"]})
    print(f"seed {seed}; render {run_s:.2f} s; trials:",
          [t["state"] + ("" if t["killed"] else " (had ended)") for t in trials])
    assert not leftovers, leftovers
    kills = sum(t["killed"] for t in trials)
    assert kills >= KILLS, trials
    row = fault_table("files", "kill -9 of the render process at a random moment", tried=len(trials),
                      held=held, lost=lost,
                      bound="0 temp files under renders/, every job folder whole, each job reran",
                      note=f"{kills} killed, in {', '.join(states)}; "
                           f"{len(leftovers)} leftovers; seed {seed}")
    assert row.ok, (trials, out[-3000:])


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_worker_start_sweeps_stale_staging(worker_env, redis_conn, h3_settings, fault_table):
    renders = h3_settings.renders_dir()
    final = renders / "s-old" / "j-killed"
    stale = staging.new_staging(final, 1, pid=_dead_pid())
    (stale / ".video.123.abcd.tmp.mp4").write_bytes(b"\0" * 1000)  # what ffmpeg was writing
    (stale / "poster.png").write_bytes(b"half")
    replaced = staging.staging_root(final.parent) / f"j-other.2.{_dead_pid()}.old"  # set aside
    replaced.mkdir()
    live = staging.new_staging(renders / "s-live" / "j-running", 1, pid=os.getpid())
    out = run_cli(worker_env, "worker", "--burst")
    assert out.returncode == 0, out.stdout + out.stderr
    assert not stale.exists() and not replaced.exists()
    assert not (renders / "s-old" / staging.STAGING).exists()  # emptied parents go too
    assert live.is_dir()  # this test process is alive: its staging stays
    staging.discard(live)
    assert not temp_files(renders), temp_files(renders)
    row = fault_table("files", "stale staging swept at worker start", tried=2, held=2, lost=0,
                      bound="dead renders' staging removed, a live render's kept",
                      note="killed attempt with a half mp4, and a replaced folder")
    assert row.ok


def test_publish_replaces_a_failure_record_in_one_rename(tmp_path, fault_table):
    final = tmp_path / "renders" / "s-1" / "j-1"
    assert staging.publish_failure(final, 1, {"state": "failed", "error": "boom"}) == final
    assert sorted(p.name for p in final.iterdir()) == ["meta.json"]
    assert json.loads((final / "meta.json").read_text())["error"] == "boom"
    s = staging.new_staging(final, 2)
    for name in OUTPUTS:
        (s / name).write_text(name)
    ino = s.stat().st_ino
    staging.publish(s, final)
    assert final.stat().st_ino == ino  # the staging folder itself, renamed: no copy
    assert {p.name for p in final.iterdir()} == OUTPUTS
    assert (final / "meta.json").read_text() == "meta.json"
    assert not temp_files(tmp_path), temp_files(tmp_path)
    staging.remove_failure_record(final)  # a whole job folder is not a failure record
    assert final.is_dir()
    row = fault_table("files", "publish replaces a failure record", tried=1, held=1, lost=0,
                      bound="job folder by one rename; failure record is meta.json alone")
    assert row.ok
