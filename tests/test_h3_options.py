"""h3.c options and limits (h3render.engine.h3.options): every rule from h3.c's header/README.

Each invalid case checks that the error names the field, the value, the rule
and the nearest valid value, and that every problem of a request is reported
in one error.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3render.engine.exceptions import InvalidRequestError
from h3render.engine.h3.options import (
    MAX_FRAMES,
    MIN_FRAMES,
    H3OptionsError,
    align_frames,
    frames_for_seconds,
    validate_h3_options,
)


def ok(options=None, width=512, height=512, frames=22, quant=None, steps=None):
    return validate_h3_options(options or {}, width, height, frames, quant=quant, steps=steps)


def problems(options=None, width=512, height=512, frames=22, quant=None, steps=None):
    with pytest.raises(H3OptionsError) as info:
        validate_h3_options(options or {}, width, height, frames, quant=quant, steps=steps)
    assert isinstance(info.value, InvalidRequestError)  # the CLI and queue map it to "bad input"
    return {p.field: p for p in info.value.problems}, str(info.value)


# ---------------------------------------------------------------- valid requests


def test_defaults_and_documented_presets_pass():
    req, warnings = ok()
    assert (req.width, req.height, req.frames, req.quant) == (512, 512, 22, "int8")
    assert req.options.dit_layers == 50 and req.options.denoise_reuse == 1 and warnings == []
    assert req.engine_options() == {}
    # README presets: balanced, aggressive internal canvas, core reuse, SSD streaming
    for opts, quant in [
        ({"dit_layers": 45, "denoise_reuse": 2}, "int8"),
        ({"dit_layers": 45, "denoise_reuse": 2, "token_reduction": True}, "int8"),
        ({"render_width": 320, "render_height": 320, "dit_layers": 40, "denoise_reuse": 3}, "int8"),
        ({"dit_layers": 45, "core_reuse": 4}, "bf16"),
        ({"ssd_streaming": True}, "bf16"),
        ({"ssd_streaming": True}, "int8"),
        ({"core_reuse": 6, "preview_denoise": True}, "int8-row"),
    ]:
        req, _ = ok(opts, quant=quant, steps=20)
        assert req.quant == quant
        for k, v in opts.items():
            assert getattr(req.options, k) == v


def test_limits_at_their_edges_pass():
    ok(width=1344, height=768)  # the released landscape limit, exactly 768*1344 pixels
    ok(width=768, height=1344)
    ok(width=32, height=32)
    ok({"dit_layers": 35, "core_reuse": 6, "denoise_reuse": 1})
    ok({"dit_layers": 50, "denoise_reuse": 3})
    ok(frames=MAX_FRAMES, steps=1000)
    ok(steps=2)


def test_values_normalized_from_text_and_alias():
    req, _ = ok({"dit_layers": "45", "token_reduction": "true", "ssd_streaming": 0, "preview_denoise": "on"},
                quant="int8_row")
    assert req.quant == "int8-row"
    assert req.engine_options() == {"dit_layers": 45, "preview_denoise": True, "ssd_streaming": False,
                                    "token_reduction": True}
    assert req.job_updates() == {"frames": 22, "quant": "int8-row", "engine_options": req.engine_options()}


# ---------------------------------------------------------------- frames


@pytest.mark.parametrize("asked,got", [(1, 22), (5, 22), (21, 22), (23, 39), (39, 39), (40, 56), (240, 243),
                                       (361, 362)])
def test_frames_round_up_with_a_warning(asked, got):
    req, warnings = ok(frames=asked)
    assert req.frames == got
    if asked == got:
        assert warnings == []
    else:
        assert len(warnings) == 1 and f"frames={asked} rounded up to {got}" in warnings[0]
        assert "17n+5" in warnings[0] and "24 fps" in warnings[0]
        assert req.job_updates()["frames"] == got


@given(st.integers(min_value=1, max_value=MAX_FRAMES))
def test_align_frames_is_the_smallest_valid_count_not_below(frames):
    a = align_frames(frames)
    assert (a - 5) % 17 == 0 and MIN_FRAMES <= a <= MAX_FRAMES and a >= frames
    assert a == MIN_FRAMES or a - 17 < frames  # nothing valid in between


def test_seconds_convert_like_h3c():
    assert frames_for_seconds(10) == 243  # README: --seconds 10 gives 243 frames
    assert frames_for_seconds(1) == 39


@pytest.mark.parametrize("frames,why,nearest", [(363, "above h3.c's maximum 362", (362,)),
                                                (0, "below 1", (22,)), ("22", "not an integer", (22,))])
def test_bad_frames_rejected(frames, why, nearest):
    found, text = problems(frames=frames)
    p = found["frames"]
    assert why in text and p.nearest == nearest


# ---------------------------------------------------------------- size


@pytest.mark.parametrize("width,height,field,nearest", [
    (500, 512, "width", (480, 512)),
    (512, 100, "height", (96, 128)),
    (16, 512, "width", (32,)),
])
def test_size_must_be_multiples_of_32(width, height, field, nearest):
    found, text = problems(width=width, height=height)
    p = found[field]
    assert p.value == (width if field == "width" else height) and p.nearest == nearest
    assert "multiple of 32" in text or "minimum 32" in text


def test_pixel_limit_suggests_a_same_aspect_size():
    found, text = problems(width=1344, height=1024)
    p = found["width*height"]
    assert "1376256 pixels" in str(p.value) and "1032192" in p.rule
    w, h = map(int, p.nearest[0].split("x"))
    assert w * h <= 768 * 1344 and w % 32 == 0 and h % 32 == 0
    assert abs(w / h - 1344 / 1024) < 0.05


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("key,value,nearest", [
    ("dit_layers", 34, (35,)), ("dit_layers", 51, (50,)),
    ("denoise_reuse", 0, (1,)), ("denoise_reuse", 4, (3,)),
    ("core_reuse", 0, (1,)), ("core_reuse", 7, (6,)),
])
def test_option_ranges(key, value, nearest):
    found, text = problems({key: value})
    p = found[f"engine_options.{key}"]
    assert p.value == value and p.nearest == nearest
    assert f"engine_options.{key}={value} is outside" in text


def test_core_reuse_excludes_denoise_reuse():
    found, text = problems({"core_reuse": 4, "denoise_reuse": 2})
    p = found["engine_options.core_reuse"]
    assert p.nearest == (1,) and "denoise_reuse=2" in text and "mutually exclusive" in text
    ok({"core_reuse": 4, "denoise_reuse": 1})
    ok({"core_reuse": 1, "denoise_reuse": 2})


def test_ssd_streaming_excludes_int8_row():
    found, text = problems({"ssd_streaming": True}, quant="int8-row")
    assert "engine_options.ssd_streaming" in found and "quant=int8-row" in text
    assert found["engine_options.ssd_streaming"].nearest == (False,)
    ok({"ssd_streaming": False}, quant="int8-row")


@pytest.mark.parametrize("opts,field,why,nearest", [
    ({"render_width": 384}, "engine_options.render_width", "without render_height", ("384x384",)),
    ({"render_height": 320}, "engine_options.render_height", "without render_width", ("320x320",)),
    ({"render_width": 384, "render_height": 320}, "engine_options.render_width*render_height",
     "does not have the output's aspect", ("384x384",)),  # ties go to the larger canvas
    ({"render_width": 640, "render_height": 640}, "engine_options.render_width*render_height",
     "larger than the output", ("512x512",)),
    ({"render_width": 300, "render_height": 300}, "engine_options.render_width", "multiple of 32", (288, 320)),
    ({"render_width": 16, "render_height": 16}, "engine_options.render_width", "minimum 32", (32,)),
])
def test_render_size_rules(opts, field, why, nearest):
    found, text = problems(opts, width=512, height=512)
    assert field in found and why in text
    assert found[field].nearest == nearest


def test_render_size_valid_pairs():
    req, _ = ok({"render_width": 384, "render_height": 384}, width=512, height=512)
    assert (req.options.render_width, req.options.render_height) == (384, 384)
    ok({"render_width": 672, "render_height": 384}, width=1344, height=768)  # 7:4 at 1/2
    ok({"render_width": 0, "render_height": 0})  # both zero: the exact output canvas


def test_quant_levels():
    for q in ("bf16", "int8", "int8-row"):
        assert ok(quant=q)[0].quant == q
    found, text = problems(quant="f16")
    assert found["quant"].value == "f16" and "bf16, int8, int8-row" in text and found["quant"].nearest


def test_unknown_and_worker_only_options():
    found, text = problems({"dit_layer": 45, "output_path": "/etc/passwd", "bogus": 1})
    assert found["engine_options.dit_layer"].nearest == ("dit_layers",)
    assert "is not an h3.c option (known: denoise_reuse" in text
    assert "set by the worker" in str(found["engine_options.output_path"])
    assert found["engine_options.bogus"].nearest == ()


@pytest.mark.parametrize("key,value,why", [("dit_layers", True, "boolean, not an integer"),
                                           ("dit_layers", 45.5, "not an integer"),
                                           ("denoise_reuse", "two", "not an integer"),
                                           ("token_reduction", "maybe", "not a boolean"),
                                           ("ssd_streaming", 2, "not a boolean")])
def test_option_types(key, value, why):
    found, text = problems({key: value})
    assert f"engine_options.{key}" in found and why in text


def test_steps_range():
    found, _ = problems(steps=1)
    assert found["steps"].nearest == (2,)
    found, _ = problems(steps=1001)
    assert found["steps"].nearest == (1000,)


def test_every_problem_reported_at_once():
    found, text = problems({"core_reuse": 4, "denoise_reuse": 2, "ssd_streaming": True, "dit_layers": 60},
                           width=500, frames=400, quant="int8-row")
    assert set(found) == {"width", "frames", "engine_options.dit_layers", "engine_options.core_reuse",
                          "engine_options.ssd_streaming"}
    assert text.startswith("invalid h3.c request: ")


def test_readme_advice_is_a_warning_not_an_error():
    _, warnings = ok({"token_reduction": True, "dit_layers": 40, "denoise_reuse": 3})
    assert any("colour ringing" in w for w in warnings)
    _, warnings = ok({"token_reduction": True}, width=256, height=256)
    assert any("256x256" in w for w in warnings)
    _, warnings = ok({"denoise_reuse": 2}, steps=4)
    assert any("small step counts" in w for w in warnings)
