"""Admission: the engine's memory estimate, the fit decision and its message, the model's
files checked before a job starts.

1. Pure admission over the real engine (tiny-wan converted at four levels): the estimate is
   the engine's plus the process overhead, the fit boundary, the hints (a lower quant level,
   a smaller size, nothing fits), a request the engine refuses.
2. Through a real worker (real redis-server, `h3render worker --burst`, its render process):
   the estimate recorded in a finished job's meta.json is within 20% of the peak RSS recorded
   with it; a job whose level's file was truncated after conversion (after it was enqueued)
   fails once, not retried, naming the file, while a job at another level of the same model
   finishes. About 20 s on 2 shared cores.
3. h3.c jobs (admit_h3).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from rq.job import JobStatus

from faults.harness import REPO, fetch, h3meta, start_worker, stop, wait_for, write_readings
from h3render.engine.binding import Engine, GenerateRequest
from h3render.engine.exceptions import InvalidRequestError, UnsupportedError
from h3render.worker.admission import (
    OVERHEAD_BYTES,
    GiB,
    MemoryEstimate,
    admit,
    engine_estimator,
    smaller_size,
)
from h3render.worker.health import Readings

LEVELS = ("f32", "f16", "q8_0", "q4_0")
ESTIMATE_TOLERANCE = 0.20  # the bound: estimate within 20% of the measured peak RSS
MiB = 1024**2


@pytest.fixture(scope="module")
def tiny(converted_models):
    with Engine(converted_models("tiny-wan", LEVELS), threads=2) as e:
        yield e


def request(**kw) -> GenerateRequest:
    base = dict(width=64, height=64, frames=17, steps=2, seed=1, prompt_ids=[3, 4, 5], negative_ids=[1, 2],
                guidance=4.0, quant="f16", threads=2)
    return GenerateRequest(**{**base, **kw})


def test_estimate_is_the_engines_plus_the_process_overhead(tiny):
    raw = tiny.estimate_memory(request())
    est = engine_estimator(tiny)(request())
    assert est == MemoryEstimate.from_engine(raw)
    assert est.total == raw["total"] + OVERHEAD_BYTES
    assert (est.weights, est.tokens) == (raw["weights"], raw["tokens"])
    meta = est.as_meta()
    assert meta["bytes"] == est.total and meta["source"] == "engine"


def test_fits_with_headroom(tiny):
    est = engine_estimator(tiny)
    need = est(request()).total
    # exactly at the headroom boundary it fits; a little less available does not
    assert admit(request(), est, LEVELS, int(need / 0.8) + 2, 0.2).fits
    assert not admit(request(), est, LEVELS, int(need / 0.8) - 2, 0.2).fits


def test_too_big_message_states_need_available_and_a_lower_quant(tiny):
    est = engine_estimator(tiny)
    job = request(quant="f32", width=256, height=256)
    need_q4 = est(replace(job, quant="q4_0")).total
    need_q8 = est(replace(job, quant="q8_0")).total
    assert need_q4 < need_q8 < est(replace(job, quant="f16")).total < est(job).total
    avail = int((need_q4 + 1) / 0.8) + 1  # room for q4_0 at full size, not q8_0, f16 or f32
    a = admit(job, est, LEVELS, avail, 0.2)
    assert not a.fits and a.need > a.usable
    assert a.message.startswith(f"needs {a.need / GiB:.1f} GiB, {avail / GiB:.1f} GiB available "
                                "(headroom 20%); try quant q4_0 or a smaller size such as "), a.message
    w, h = (int(v) for v in a.message.rsplit(" ", 1)[1].split("x"))
    assert w % 16 == 0 and h % 16 == 0 and w < 256 and h < 256 and w == h
    assert est(replace(job, width=w, height=h)).total <= a.usable
    assert smaller_size(job, est, a.usable) == (w, h)


def test_hopeless_job_says_so(tiny):
    a = admit(request(), engine_estimator(tiny), LEVELS, OVERHEAD_BYTES // 2, 0.2)
    assert not a.fits and "even the smallest size does not fit" in a.message


def test_a_request_the_engine_refuses_is_refused_by_the_estimate(tiny):
    with pytest.raises(UnsupportedError, match="quant=q2_k is not available for model tiny-wan"):
        admit(request(quant="q2_k"), engine_estimator(tiny), LEVELS, GiB, 0.2)
    with pytest.raises(InvalidRequestError, match="width"):
        admit(request(width=100), engine_estimator(tiny), LEVELS, GiB, 0.2)


# ---------------------------------------------------------------- through a real worker


@pytest.fixture
def worker_env(h3_settings, tmp_path):
    readings = tmp_path / "readings.json"
    write_readings(readings, Readings(platform="test"))
    e = dict(os.environ)
    e.update(PYTHONPATH=str(REPO) + os.pathsep + e.get("PYTHONPATH", ""), H3RENDER_HOME=str(h3_settings.home),
             H3RENDER_REDIS_URL=h3_settings.redis_url, H3RENDER_GATE_POLL_S="1",
             H3RENDER_RETRY_INTERVALS_S="[1, 1, 1]", H3RENDER_TEST_READINGS=str(readings))
    return e


def run_burst(env: dict, timeout: float = 120) -> str:
    p = start_worker(env, "--burst")
    try:
        p.wait(timeout=timeout)
    finally:
        out = stop(p)
    return out


@pytest.mark.slow
def test_a_worker_renders_estimate_is_within_20_percent_of_its_peak_rss(worker_env, redis_conn, h3_settings):
    import json

    from h3render.queue.enqueue import enqueue

    jid = enqueue(redis_conn, {"prompt": "a red ball", "model": "tiny-wan", "width": 64, "height": 64,
                               "frames": 17, "steps": 2}, h3_settings).job_ids[0]
    out = run_burst(worker_env)
    m = h3meta(redis_conn, jid)
    assert m.get("state") == "finished", (m, out[-3000:])
    doc = json.loads((Path(m["output_dir"]) / "meta.json").read_text())
    est, peak = doc["estimate"], doc["peak_rss"]
    err = est["bytes"] / peak - 1
    print(f"worker render tiny-wan 64x64x17: estimate {est['bytes'] / MiB:.1f} MiB "
          f"(engine {(est['bytes'] - est['overhead']) / MiB:.1f} + overhead {est['overhead'] / MiB:.0f}), "
          f"peak RSS {peak / MiB:.1f} MiB, error {err:+.1%}")
    assert est["source"] == "engine"
    assert abs(err) <= ESTIMATE_TOLERANCE, (est, peak)


@pytest.mark.slow
def test_a_file_broken_after_conversion_fails_the_job_naming_it_without_retry(worker_env, redis_conn, h3_settings,
                                                                              converted_models):
    from h3render.queue.enqueue import enqueue

    model = h3_settings.home / "models" / "brittle-wan"
    shutil.copytree(converted_models("tiny-wan", ("f32", "f16")), model)
    job = {"prompt": "a red ball", "model": "brittle-wan", "width": 64, "height": 64, "frames": 17, "steps": 2}
    broken = enqueue(redis_conn, {**job, "quant": "f16"}, h3_settings).job_ids[0]
    fine = enqueue(redis_conn, {**job, "quant": "f32"}, h3_settings).job_ids[0]
    victim = model / "transformer-f16.gguf"
    with open(victim, "r+b") as f:  # broken after conversion and after the job was accepted
        f.truncate(victim.stat().st_size // 2)
    out = run_burst(worker_env)
    m, rq_job = h3meta(redis_conn, broken), fetch(redis_conn, broken)
    print(f"broken level: {m.get('error')}")
    assert rq_job.get_status() == JobStatus.FAILED, (m, out[-3000:])
    assert "transformer-f16.gguf" in m["error"] and "quant=f16" in m["error"], m["error"]
    assert "reshape" not in m["error"]
    assert m["retryable"] is False and rq_job.retries_left == 0 and m["attempt"] == 1
    assert "engine" not in m  # failed before the render opened its engine
    assert fetch(redis_conn, fine).get_status() == JobStatus.FINISHED, h3meta(redis_conn, fine)


# ---------------------------------------------------------------- h3.c jobs (admit_h3)


H3_DIT = 37 * GiB  # the FL2VA DiT in BF16 (issue 8, h3.c's README)


def h3_admit(options=None, available_gib=64.0, quant="int8", width=512, height=512, frames=22, preview=None):
    from h3render.engine.h3.options import validate_h3_options
    from h3render.worker.admission import admit_h3

    req, _ = validate_h3_options(options or {}, width, height, frames, quant=quant)
    return admit_h3(req, H3_DIT, int(available_gib * GiB), 0.20, preview)


@pytest.mark.parametrize("options, quant, need_gib", [
    ({}, "int8", 38.5),  # exact: 37 GiB DiT + activations + media + 1 GiB
    ({"dit_layers": 45, "denoise_reuse": 2}, "int8", 34.8),  # README's balanced preset
    ({"dit_layers": 40}, "int8", 31.1),
    ({"ssd_streaming": True}, "bf16", 3.5),  # ~2 GiB resident DiT
    ({"preview_denoise": True}, "int8", 48.5),  # +10 GiB preview VAE
])
def test_h3_documented_configurations_on_a_64_gib_mac(options, quant, need_gib):
    """512x512x22 at the documented settings: need as docs/H3C.md states it; all fit 64 GiB
    free with 20% headroom (51.2 GiB usable)."""
    a = h3_admit(options, 64, quant)
    assert a.fits and a.usable == int(0.8 * 64 * GiB)
    assert f"needs {need_gib:.1f} GiB, 64.0 GiB available (headroom 20%)" == a.message


@pytest.mark.parametrize("options, quant, available, hint", [
    ({}, "int8", 48, "engine option dit_layers=45"),  # 38.5 > 38.4 usable: one notch of layers fits
    ({}, "int8", 40, "engine option dit_layers=40"),  # 32 usable: 45 layers (34.8) does not, 40 (31.1) does
    ({}, "int8", 16, "engine option ssd_streaming=true"),  # no layer count fits; streaming does
    ({}, "int8-row", 16, "engine option ssd_streaming=true with quant int8"),  # streaming excludes int8-row
    ({"preview_denoise": True}, "int8", 60, "previews off"),  # 48.5 > 48 usable; 38.5 without previews fits
    ({"ssd_streaming": True}, "bf16", 4, "a smaller size or fewer frames"),  # 3.5 > 3.2 usable: nothing left
])
def test_h3_too_big_names_need_available_and_the_first_fix_that_fits(options, quant, available, hint):
    a = h3_admit(options, available, quant)
    assert not a.fits and a.need > a.usable
    assert a.message.startswith(f"needs {a.need / GiB:.1f} GiB, {available:.1f} GiB available (headroom 20%); try ")
    assert a.suggestion.startswith("try " + hint), a.suggestion


def test_h3_preview_every_counts_as_previews_on():
    off, on = h3_admit(available_gib=64), h3_admit(available_gib=64, preview=True)
    assert on.need - off.need == 10 * GiB
