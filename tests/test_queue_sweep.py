"""Sweep expansion, ordering, preview versions, TOML files and the time model (pure functions)."""

from __future__ import annotations

import pytest

from h3render.queue import estimate as est
from h3render.queue.errors import JobValidationError
from h3render.queue.job import RenderJob
from h3render.queue.sweep import expand, from_flags, from_toml, parse_axis, preview_version
from h3render.queue.contract import resolve
from h3render.settings import Settings

from test_queue_job import INFO


def test_axis_syntax():
    assert parse_axis("seed", "1-8") == list(range(1, 9))
    assert parse_axis("seed", "1-9:2,20") == [1, 3, 5, 7, 9, 20]
    assert parse_axis("seed", "random,5") == ["random", 5]
    assert parse_axis("guidance", "4.5,5.5") == [4.5, 5.5]
    assert parse_axis("quant", "q8_0,q4_0") == ["q8_0", "q4_0"]
    assert parse_axis("prompt", "a, b, c") == ["a, b, c"]  # prompts are never split on commas
    with pytest.raises(JobValidationError) as e:
        parse_axis("seed", "8-1")
    assert e.value.problems[0].nearest == "1-8"
    with pytest.raises(JobValidationError) as e:
        parse_axis("steps", "20,x30")
    assert (e.value.problems[0].field, e.value.problems[0].nearest) == ("steps", 30)


def test_issue_grid_is_128_jobs_with_model_and_quant_outermost():
    fixed, axes = from_flags({"seed": ["1-8"], "steps": ["20,30"], "quant": ["q8_0,q4_0"],
                              "guidance": ["4.5,5.5"], "prompt": ["A", "B"]})
    jobs = expand(fixed, axes)
    assert len(jobs) == 8 * 2 * 2 * 2 * 2
    # one switch of quant level in the whole sweep: each level's jobs are neighbours
    assert [j["quant"] for j in jobs] == ["q8_0"] * 64 + ["q4_0"] * 64
    assert len({tuple(sorted(j.items())) for j in jobs}) == len(jobs)


def test_single_value_flag_is_fixed_not_an_axis():
    fixed, axes = from_flags({"prompt": ["A"], "steps": ["20"], "seed": ["1,2"]})
    assert fixed == {"prompt": "A", "steps": 20} and axes == {"seed": [1, 2]}


def test_toml_file_same_axes():
    fixed, axes, preview = from_toml(
        'prompt = ["a fox", "a lighthouse"]\nseed = "1-4"\nsteps = [20, 30]\nwidth = 64\npreview = true\n'
    )
    assert fixed == {"width": 64} and preview is True
    assert axes == {"prompt": ["a fox", "a lighthouse"], "seed": [1, 2, 3, 4], "steps": [20, 30]}
    with pytest.raises(JobValidationError) as e:
        from_toml("stepz = [1, 2]\n")
    assert (e.value.problems[0].field, e.value.problems[0].nearest) == ("stepz", "steps")
    with pytest.raises(JobValidationError):
        from_toml("prompt = [\n")


def test_preview_is_small_short_and_valid():
    full = resolve(RenderJob.parse({"prompt": "x", "width": 832, "height": 480, "frames": 81}), INFO)
    small = preview_version(full, INFO)
    assert (small.width, small.height, small.frames) == (416, 240, 5)
    assert resolve(small, INFO) == small  # still valid for the engine
    tiny = resolve(RenderJob.parse({"prompt": "x", "width": 16, "height": 16, "frames": 1}), INFO)
    assert (preview_version(tiny, INFO).width, preview_version(tiny, INFO).frames) == (16, 1)


def test_time_model_default_and_fitted():
    s = Settings(est_step_s_per_ktoken=0.5, est_load_s=5.0, est_decode_s_per_frame=0.5)
    job = resolve(RenderJob.parse({"prompt": "x", "width": 64, "height": 48, "frames": 5, "steps": 4,
                                   "guidance": 5.0}), INFO)
    # T'=2, H'=6, W'=8 -> tokens 2*3*4 = 24; cfg doubles; 4 steps
    assert est.dit_tokens(job, INFO) == 24
    tm = est.default_model(s)
    assert est.job_seconds(job, INFO, tm) == pytest.approx(5.0 + 4 * 2 * 0.024 * 0.5 + 5 * 0.5)
    samples = [est.sample_from(job.payload(), {"timings": {"load": 1.0, "encode": 1.0, "denoise": 0.96,
                                                           "decode": 1.0}}, None)] * 3
    fitted = est.fit(samples, INFO, tm)
    assert fitted.source == "measured from 3 jobs"
    assert fitted.step_s_per_ktoken == pytest.approx(0.96 / (4 * 2 * 0.024))
    assert (fitted.load_s, fitted.decode_s_per_frame) == (2.0, pytest.approx(0.2))
    # no timings in meta: the whole run counts as denoising (the safe side)
    only_total = est.sample_from(job.payload(), {}, 10.0)
    assert only_total.denoise_s == 10.0
    assert est.fit([], INFO, tm) is tm


def test_timeout_has_margin_admission_wait_and_floor():
    s = Settings(job_timeout_margin=3.0, job_timeout_min_s=600, admission_wait_limit_s=1800)
    assert est.timeout_for(10, s) == 1830
    assert est.timeout_for(10_000, s) == 31_800
    assert est.timeout_for(0, Settings(admission_wait_limit_s=0)) == 600  # never rq's 180 s
