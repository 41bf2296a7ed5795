"""h3.c jobs at enqueue: a worker published the bridge's info in Redis, the queue validates against it.

No Metal and no h3.c here: the info dict below has the shape csrc/h3bridge/h3bridge.c's
build_info() writes (the same keys tests/test_h3_bridge.py reads back from the bridge
linked with the libh3 stand-in), published at h3render:engine:<model> as a worker does.
Validation is enqueue-side only: h3render.engine.h3.options runs before the generic
frame rule, its normalized values go into the stored payload, its warnings into meta.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rq.job import Job
from rq.serializers import JSONSerializer

from h3render.queue.engine_info import publish_engine_info
from h3render.queue.enqueue import enqueue, enqueue_sweep, queue
from h3render.queue.errors import JobValidationError
from h3render.queue.job import RenderJob

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30
MODEL = "MiniMax-H3"

# build_info() of the bridge (field order and values as h3bridge.c writes them; device and
# component figures of a 64 GiB M5 Max with the released snapshot).
H3_INFO = {
    "engine": "h3.c", "engine_version": "0.1", "abi": 1, "model": MODEL,
    "quant_levels": ["bf16", "int8", "int8-row"],
    "weight_bytes": {"bf16": 37 * GIB, "int8": 37 * GIB, "int8-row": 37 * GIB},
    "frame_rule": {"multiple": 17, "offset": 5}, "min_frames": 22, "max_frames": 362,
    "size_multiple": 32, "max_pixels": 768 * 1344, "fps": 24, "prompt": "text", "samplers": ["euler"],
    "steps_range": [2, 1000], "ignored_fields": ["guidance", "shift", "threads"],
    "options": ["denoise_reuse", "dit_layers", "core_reuse", "token_reduction", "render_width",
                "render_height", "ssd_streaming", "preview_denoise", "output_path"],
    "components": {
        "text_encoder": {"bytes": 8 * GIB, "tensor_bytes": 8 * GIB, "files": 2, "tensors": 400},
        "fl2va_transformer": {"bytes": 37 * GIB, "tensor_bytes": 37 * GIB, "files": 8, "tensors": 1500},
        "ref2va_transformer": {"bytes": 0, "tensor_bytes": 0, "files": 0, "tensors": 0},
        "video_vae": {"bytes": GIB, "tensor_bytes": GIB, "files": 1, "tensors": 300},
        "audio_vae": {"bytes": GIB // 2, "tensor_bytes": GIB // 2, "files": 1, "tensors": 100},
    },
    "device": {"name": "Apple M5 Max", "architecture": "applegpu_g17s", "physical_memory": 64 * GIB,
               "recommended_working_set": 48 * GIB, "max_buffer_length": 32 * GIB, "apple_gpu_family": 10,
               "metal4": True, "unified_memory": True},
    "defaults": {"width": 512, "height": 512, "frames": 22, "steps": 20, "sampler": "euler", "quant": "int8",
                 "denoise_reuse": 1, "dit_layers": 50, "core_reuse": 1, "token_reduction": 0,
                 "ssd_streaming": 0, "preview_denoise": 0},
}


@pytest.fixture
def r(redis_conn, h3_settings):
    publish_engine_info(redis_conn, MODEL, H3_INFO)
    return redis_conn


def stored(r, job_id) -> tuple[dict, dict]:
    job = Job.fetch(job_id, connection=r, serializer=JSONSerializer)
    return job.kwargs["job"], job.meta["h3r"]


def refused(r, settings, **fields) -> dict:
    """Enqueue an h3.c job that must be refused; its problems by field. Nothing is enqueued."""
    before = queue(r, settings).count
    with pytest.raises(JobValidationError) as e:
        enqueue(r, {"prompt": "a fox", "model": MODEL, **fields}, settings)
    assert queue(r, settings).count == before
    for p in e.value.problems:  # every problem names field, value and rule
        assert p.field and p.rule and str(p).startswith(f"{p.field}="), p
    return {p.field: p for p in e.value.problems}


def test_defaults_come_from_the_bridge_and_the_payload_is_complete(r, h3_settings):
    res = enqueue(r, {"prompt": "a fox", "model": MODEL}, h3_settings)
    payload, meta = stored(r, res.job_ids[0])
    assert (payload["width"], payload["height"], payload["frames"], payload["steps"]) == (512, 512, 22, 20)
    assert payload["quant"] == "int8" and payload["sampler"] == "euler" and payload["fps"] == 24
    assert payload["engine_options"] == {} and meta["warnings"] == [] and res.warnings == []
    assert RenderJob.parse(payload).resolved


def test_frames_round_up_to_17n_plus_5_with_a_warning_in_meta(r, h3_settings):
    res = enqueue(r, {"prompt": "a fox", "model": MODEL, "frames": 23}, h3_settings)
    payload, meta = stored(r, res.job_ids[0])
    assert payload["frames"] == 39  # the next 17n+5; the generic 17k+5 rule then passes
    (w,) = meta["warnings"]
    assert "frames=23 rounded up to 39" in w and res.warnings == [w]
    # a frame count h3.c takes as it is: no warning
    payload, meta = stored(r, enqueue(r, {"prompt": "a fox", "model": MODEL, "frames": 56}, h3_settings).job_ids[0])
    assert payload["frames"] == 56 and meta["warnings"] == []
    # 1..21 all become 22, the one-chunk minimum
    payload, _ = stored(r, enqueue(r, {"prompt": "a fox", "model": MODEL, "frames": 1}, h3_settings).job_ids[0])
    assert payload["frames"] == 22


def test_quant_int8_row_and_options_are_normalized_into_the_payload(r, h3_settings):
    assert RenderJob.parse({"prompt": "x", "quant": "int8-row"}).quant == "int8-row"  # the widened pattern
    res = enqueue(r, {"prompt": "a fox", "model": MODEL, "quant": "int8_row",
                      "engine_options": {"dit_layers": "45", "token_reduction": "true", "core_reuse": 4}},
                  h3_settings)
    payload, _ = stored(r, res.job_ids[0])
    assert payload["quant"] == "int8-row"  # alias resolved
    assert payload["engine_options"] == {"core_reuse": 4, "dit_layers": 45, "token_reduction": True}


@pytest.mark.parametrize("fields, field, nearest", [
    ({"width": 500}, "width", "480 or 512"),
    ({"height": 16}, "height", 32),
    ({"width": 1344, "height": 800}, "width*height", "1312x768"),
    ({"frames": 400}, "frames", 362),
    ({"steps": 1}, "steps", 2),
    ({"quant": "q8_0"}, "quant", None),
    ({"engine_options": {"dit_layers": 34}}, "engine_options.dit_layers", 35),
    ({"engine_options": {"dit_layers": 51}}, "engine_options.dit_layers", 50),
    ({"engine_options": {"denoise_reuse": 4}}, "engine_options.denoise_reuse", 3),
    ({"engine_options": {"core_reuse": 7}}, "engine_options.core_reuse", 6),
    ({"engine_options": {"core_reuse": 2, "denoise_reuse": 2}}, "engine_options.core_reuse", 1),
    ({"engine_options": {"render_width": 320}}, "engine_options.render_width", "320x320"),
    ({"engine_options": {"render_width": 320, "render_height": 192}}, "engine_options.render_width*render_height",
     "320x320"),
    ({"engine_options": {"render_width": 640, "render_height": 640}}, "engine_options.render_width*render_height",
     "512x512"),
    ({"engine_options": {"render_width": 300, "render_height": 300}}, "engine_options.render_width", "288 or 320"),
    ({"quant": "int8-row", "engine_options": {"ssd_streaming": True}}, "engine_options.ssd_streaming", False),
    ({"engine_options": {"output_path": "x.mp4"}}, "engine_options.output_path", None),
    ({"engine_options": {"dit_layer": 40}}, "engine_options.dit_layer", "dit_layers"),
    ({"sampler": "unipc"}, "sampler", "euler"),
    ({"preview_every": 21}, "preview_every", 20),
])
def test_every_invalid_h3_combination_is_refused_naming_the_fix(r, h3_settings, fields, field, nearest):
    p = refused(r, h3_settings, **fields)
    assert field in p, p
    if nearest is not None:
        assert p[field].nearest == nearest, p[field]
    if field == "quant":  # nearest by spelling among bf16, int8, int8-row
        assert p[field].nearest in ("bf16", "int8", "int8-row") and "bf16, int8, int8-row" in p[field].rule


def test_all_problems_of_one_job_are_listed_once(r, h3_settings):
    p = refused(r, h3_settings, width=500, frames=400,
                engine_options={"dit_layers": 60, "core_reuse": 3, "denoise_reuse": 2})
    assert set(p) == {"width", "frames", "engine_options.dit_layers", "engine_options.core_reuse"}
    # h3.c's rule, not the generic 17k+5 grid, speaks for frames
    assert "362" in p["frames"].rule and p["frames"].nearest == 362


def test_the_cpu_engine_keeps_its_own_frame_rule(r, h3_settings, monkeypatch):
    """Only an h3.c info triggers the h3 options: a Wan info refuses 23 frames (4k+1), and h3.c's
    dit_layers as an option the CPU engine does not have (issue 14: refused at enqueue, not in the worker)."""
    wan = {"engine": "h3render-cpu", "quant_levels": ["f16"], "size_multiple": 16,
           "frame_rule": {"multiple": 4, "offset": 1}, "max_pixels": 0, "samplers": ["unipc", "euler"],
           "defaults": {"width": 64, "height": 64, "frames": 5, "steps": 4}}
    publish_engine_info(r, "wan-like", wan)
    p = refused(r, h3_settings, model="wan-like", frames=23, engine_options={"dit_layers": 99})
    assert set(p) == {"frames", "engine_options.dit_layers"} and p["frames"].nearest == "21 or 25"
    assert "prewarm, test_crash_at_step" in p["engine_options.dit_layers"].rule


def test_sweep_preview_drops_the_internal_canvas_and_stays_valid(r, h3_settings):
    res = enqueue_sweep(r, {"prompt": "a fox", "model": MODEL, "frames": 30,
                            "engine_options": {"render_width": 320, "render_height": 320}},
                        {"seed": [1, 2]}, h3_settings, preview=True)
    assert len(res.job_ids) == 4 and len(res.preview_ids) == 2
    small, _ = stored(r, res.preview_ids[0])
    full, meta = stored(r, res.job_ids[-1])
    assert (small["width"], small["height"], small["frames"]) == (256, 256, 22)
    assert small["engine_options"] == {}  # 320x320 would exceed the 256x256 preview
    assert full["engine_options"] == {"render_height": 320, "render_width": 320} and full["frames"] == 39
    assert res.warnings == [meta["warnings"][0]]  # the rounding warning, once for the sweep


def test_cli_enqueue_prints_the_warning_and_refuses_with_exit_2(r, h3_settings):
    env = {**os.environ, "PYTHONPATH": str(REPO), "H3RENDER_REDIS_URL": h3_settings.redis_url,
           "H3RENDER_HOME": str(h3_settings.home)}
    cli = "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"
    ok = subprocess.run([sys.executable, "-c", cli, "enqueue", "--model", MODEL, "--prompt", "a fox",
                         "--frames", "23", "--quant", "int8-row", "--option", "dit_layers=45",
                         "--preview-every", "2"], env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "warning: frames=23 rounded up to 39" in ok.stderr
    payload, _ = stored(r, ok.stdout.strip())
    assert payload["preview_every"] == 2 and payload["engine_options"] == {"dit_layers": 45}
    bad = subprocess.run([sys.executable, "-c", cli, "enqueue", "--model", MODEL, "--prompt", "a fox", "--json",
                          "--quant", "int8-row", "--option", "ssd_streaming=true"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2, bad
    doc = json.loads(bad.stdout)
    (prob,) = doc["problems"]
    assert prob["field"] == "engine_options.ssd_streaming" and "int8-row" in prob["rule"]


def test_cli_sweep_dry_run_reports_the_warning_and_takes_preview_every(r, h3_settings):
    from click.testing import CliRunner

    from h3render.cli.jobs import sweep

    env = {"H3RENDER_REDIS_URL": h3_settings.redis_url, "H3RENDER_HOME": str(h3_settings.home)}
    res = CliRunner().invoke(sweep, ["--model", MODEL, "--prompt", "a fox", "--frames", "23", "--seed", "1-3",
                                     "--preview-every", "4", "--dry-run", "--json"], env=env)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["jobs"] == 3 and len(doc["warnings"]) == 1 and "rounded up to 39" in doc["warnings"][0]
    bad = CliRunner().invoke(sweep, ["--model", MODEL, "--prompt", "a fox", "--preview-every", "99",
                                     "--dry-run", "--json"], env=env)
    assert bad.exit_code == 2 and json.loads(bad.output)["problems"][0]["field"] == "preview_every"
