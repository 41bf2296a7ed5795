"""Memory estimate for h3.c jobs (h3render.engine.h3.estimate) at the documented configurations.

Figures from h3.c's issue/README: the BF16 DiT is about 37 GiB; dit_layers
keeps that fraction of the 50 blocks; SSD streaming keeps about 2 GiB; the
per-step preview VAE adds about 10 GiB. Token counts are checked against the
row counts the README quotes (at most 2,048 rows at 512x512; "2835-row" at
864x480, both for 22 frames).
"""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from h3render.engine.h3.estimate import (
    ACTIVATION_BYTES_PER_TOKEN,
    GIB,
    H3MemoryEstimate,
    dit_bytes_from_info,
    estimate_h3_memory,
    latent_frames,
    video_tokens,
)
from h3render.engine.h3.inspect import inspect_model_dir
from h3render.engine.h3.options import validate_h3_options

DIT_BF16 = 37 * GIB  # "The DiT is about 37 GiB in BF16"


def est(options=None, width=512, height=512, frames=22, quant=None, preview=None, dit=DIT_BF16) -> H3MemoryEstimate:
    req, _ = validate_h3_options(options or {}, width, height, frames, quant=quant)
    return estimate_h3_memory(dit, req, preview=preview)


@pytest.mark.parametrize("layers", [50, 45, 40, 35])
def test_dit_scales_with_layers(layers):
    assert est({"dit_layers": layers}).dit == DIT_BF16 * layers // 50


def test_documented_dit_figures():
    assert est().dit == 37 * GIB
    assert abs(est({"dit_layers": 45}).dit / GIB - 33.3) < 0.01  # 37 * 45/50
    assert abs(est({"dit_layers": 40}).dit / GIB - 29.6) < 0.01


@pytest.mark.parametrize("layers", [50, 40])
def test_ssd_streaming_keeps_about_2_gib(layers):
    e = est({"ssd_streaming": True, "dit_layers": layers}, quant="bf16")
    assert e.dit == 2 * GIB  # README: 2.0 GiB at 512 square, 2.1 GiB at 864x480


def test_preview_adds_10_gib():
    base, prev = est(), est({"preview_denoise": True})
    assert prev.preview_vae == 10 * GIB and base.preview_vae == 0
    assert prev.total - base.total == 10 * GIB
    assert est(preview=True).total == prev.total  # preview_every from the job asks for it too


def test_total_is_the_sum_of_its_terms():
    e = est({"dit_layers": 45, "preview_denoise": True}, width=864, height=480, frames=56)
    assert e.total == e.dit + e.activations + e.preview_vae + e.media + e.overhead
    assert e.as_meta()["bytes"] == e.total
    assert e.media == 864 * 480 * 56 * 15  # float32 + uint8 RGB per pixel per frame


def test_tokens_match_readme_row_counts():
    assert latent_frames(22) == 7 and latent_frames(39) == 12 and latent_frames(362) == 107
    assert video_tokens(512, 512, 22) == 16 * 16 * 7 == 1792 <= 2048  # "up to 2,048" at 512-class
    assert video_tokens(864, 480, 22) == 2835  # README: "the 2835-row tile" at 864x480
    assert video_tokens(512, 512, 23) == video_tokens(512, 512, 39)  # frames round up first


def test_render_size_shrinks_activations_not_media():
    full = est(width=512, height=512)
    small = est({"render_width": 320, "render_height": 320}, width=512, height=512)
    assert small.activations == 10 * 10 * 7 * ACTIVATION_BYTES_PER_TOKEN
    assert full.activations == 1792 * ACTIVATION_BYTES_PER_TOKEN
    assert small.media == full.media  # frames are upscaled to the output size before delivery


def test_documented_configurations_ordering():
    """Lowest-memory run < balanced < exact < exact with previews, at 512x512x22."""
    low = est({"ssd_streaming": True}, quant="bf16")
    balanced = est({"dit_layers": 45, "denoise_reuse": 2})
    exact = est()
    show = est({"preview_denoise": True})
    assert low.total < balanced.total < exact.total < show.total
    assert low.total < 5 * GIB  # README: ~2 GiB DiT plus headroom for the rest
    assert 37 * GIB < exact.total < 40 * GIB


def test_dit_bytes_from_bridge_info_and_inspect(tmp_path):
    info = {"components": {"fl2va_transformer": {"tensor_bytes": 123, "bytes": 130}},
            "weight_bytes": {"bf16": 99}}
    assert dit_bytes_from_info(info) == 123
    assert dit_bytes_from_info({"weight_bytes": {"bf16": 99, "int8": 99}}) == 99
    # a snapshot's DiT bytes as `models inspect` reads them
    t = tmp_path / "FL2VA" / "transformer"
    t.mkdir(parents=True)
    save_file({"w": np.zeros((64, 32), np.float32)}, str(t / "model.safetensors"))
    report = inspect_model_dir(tmp_path)
    assert report.dit_bytes() == 64 * 32 * 4
    req, _ = validate_h3_options({"dit_layers": 40}, 512, 512, 22)
    assert estimate_h3_memory(report.dit_bytes(), req).dit == 64 * 32 * 4 * 40 // 50


def test_negative_dit_bytes_rejected():
    req, _ = validate_h3_options({}, 512, 512, 22)
    with pytest.raises(ValueError, match="dit_bytes=-1"):
        estimate_h3_memory(-1, req)
