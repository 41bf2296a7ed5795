"""`h3render demo` (what `make demo` runs): embedded Redis, an 8-job sweep, a burst worker, results."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from h3render.cli.demo import DEMO_PROMPTS, DEMO_SEEDS
from h3render.cli.eval_demo import THRESHOLDS
from h3render.engine.binding import Engine
from h3render.engine.builtin import DEFAULT_MODEL
from h3render.engine.eval_demo import ATTRIBUTES
from h3render.engine.video import probe
from redis_fixture import free_port

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"]


def run(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_demo_runs_the_overnight_story(tmp_path):
    """About 15 s: starts its own embedded redis-server (on a free port) and stops it after."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "H3RENDER_REDIS_URL"}
    env.update(H3RENDER_HOME=str(home), H3RENDER_REDIS_PORT=str(free_port()), PYTHONPATH=str(ROOT),
               COLUMNS="200")
    try:
        proc = run("demo", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "8 jobs over 4 prompts x 2 seeds" in proc.stdout
        assert "8/8 done (8 finished)" in proc.stdout

        # The embedded server runs with AOF under $H3RENDER_HOME/redis and outlives the demo,
        # which says so and how to stop it.
        left = next(line for line in proc.stdout.splitlines() if line.startswith("left running: "))
        assert "embedded redis-server (pid " in left and "`h3render redis stop`" in left
        status = run("redis", "status", env=env)
        assert status.returncode == 0, status.stderr
        assert (home / "redis" / "redis.conf").read_text().count("appendonly yes") == 1

        sweep_id = next(w for w in proc.stdout.split() if w.startswith("s-")).rstrip(":")
        st = run("status", sweep_id, "--json", env=env)
        data = json.loads(st.stdout)
        assert [j["state"] for j in data["jobs"]] == ["finished"] * 8

        with Engine(home / "models" / DEFAULT_MODEL, 1) as engine:
            d = engine.info()["defaults"]
        jobs = sorted(p for p in (home / "renders" / sweep_id).iterdir() if p.is_dir())
        assert len(jobs) == 8
        for job in jobs:
            assert {p.name for p in job.iterdir()} >= {"video.mp4", "poster.png", "meta.json"}
            got = probe(job / "video.mp4")
            assert (got.frames, got.width, got.height) == (d["frames"], d["width"], d["height"])
        metas = [json.loads((job / "meta.json").read_text()) for job in jobs]
        assert {m["sweep_id"] for m in metas} == {sweep_id}
        assert sorted((m["parameters"]["prompt"], m["parameters"]["seed"]) for m in metas) == sorted(
            (p, s) for p in DEMO_PROMPTS for s in DEMO_SEEDS)
        assert all(m["timings_s"]["denoise"] > 0 and m["peak_rss"] > 0 for m in metas)

        # The detector's tally and the contact sheet: one row per job.
        tally = next(line for line in proc.stdout.splitlines() if line.startswith("prompts followed"))
        print(DEFAULT_MODEL, tally)
        hits = {a: int(tally.split(f"{a} ")[1].split("/")[0]) for a in ATTRIBUTES}
        assert all(f"{a} {hits[a]}/8" in tally for a in ATTRIBUTES), tally
        if DEFAULT_MODEL == "shapes-wan":  # the demo model follows its prompts, as eval-demo requires
            need = {a: math.ceil(THRESHOLDS[a] * 8) for a in ATTRIBUTES}  # colour 8, direction 7, shape 6
            assert all(hits[a] >= need[a] for a in ATTRIBUTES), (tally, need)
        sheet = home / "renders" / sweep_id / "contact.png"
        from PIL import Image

        with Image.open(sheet) as im:
            assert im.height > 8 * d["height"] and im.width > d["frames"] * d["width"]
        rows = (sheet.parent / "contact.txt").read_text().splitlines()[1:]
        assert [r.split(None, 5)[5] for r in rows] == [p for p in sorted(DEMO_PROMPTS) for _ in DEMO_SEEDS]
    finally:
        run("redis", "stop", env=env, timeout=60)
