"""Admission: the memory estimate, the fit decision and its message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from h3render.worker.admission import (
    GiB,
    JobShape,
    ModelDims,
    admit,
    estimate_memory,
    model_dims,
    tokens,
    weight_bytes_on_disk,
)

FIX = Path(__file__).parent / "fixtures"
WAN13B = ModelDims()  # Wan 2.1 1.3B dims (the defaults)
LEVELS = {"f16": 3_000_000_000, "q8_0": 1_700_000_000, "q4_0": 1_000_000_000}


def test_tokens_follow_latent_grid_and_patch():
    # 832x480, 81 frames -> latent (21, 60, 104) -> patches (1,2,2) -> 21*30*52 tokens
    assert tokens(JobShape(width=832, height=480, frames=81), WAN13B) == 21 * 30 * 52


def test_estimate_grows_with_size_and_quant():
    small = estimate_memory(JobShape(width=480, height=272, frames=33), WAN13B, LEVELS["f16"])
    big = estimate_memory(JobShape(width=832, height=480, frames=81), WAN13B, LEVELS["f16"])
    assert small.total < big.total
    assert big.weights == LEVELS["f16"] and big.tokens == 32760
    # The DiT scratch alone: 3*N*D floats of hidden state at least
    assert big.denoise > 4 * 3 * 32760 * 1536
    # CFG off drops the unconditional latents and context
    nocfg = estimate_memory(JobShape(width=832, height=480, frames=81, guidance=1.0), WAN13B,
                            LEVELS["f16"])
    assert nocfg.denoise < big.denoise


def test_fits_with_headroom():
    shape = JobShape(width=480, height=272, frames=17, quant="q8_0")
    need = estimate_memory(shape, WAN13B, LEVELS["q8_0"]).total
    # exactly at the headroom boundary it fits; one byte less available does not
    avail = int(need / 0.8) + 2
    assert admit(shape, WAN13B, LEVELS, avail, 0.2).fits
    assert not admit(shape, WAN13B, LEVELS, int(need / 0.8) - 2, 0.2).fits


def test_too_big_message_states_need_available_and_a_lower_quant():
    shape = JobShape(width=832, height=480, frames=81, quant="f16")
    need_q4 = estimate_memory(shape, WAN13B, LEVELS["q4_0"]).total
    avail = int(need_q4 / 0.8) + GiB // 10  # room for q4_0, not f16 or q8_0
    a = admit(shape, WAN13B, LEVELS, avail, 0.2)
    assert not a.fits and a.need > a.usable
    need_gib = f"{a.need / GiB:.1f}"
    assert a.message.startswith(f"needs {need_gib} GiB, {avail / GiB:.1f} GiB available "
                                "(headroom 20%); try quant q4_0 or a smaller size such as ")
    w, h = (int(v) for v in a.message.rsplit(" ", 1)[1].split("x"))
    assert w % 16 == 0 and h % 16 == 0 and w < 832 and h < 480
    assert estimate_memory(shape.model_copy(update={"width": w, "height": h}), WAN13B,
                           LEVELS["f16"]).total <= a.usable


def test_hopeless_job_says_so():
    a = admit(JobShape(width=832, height=480, frames=81), WAN13B, LEVELS, GiB // 2, 0.2)
    assert not a.fits and "even the smallest size does not fit" in a.message


def test_unknown_quant_is_an_error():
    with pytest.raises(ValueError, match="quant='q2_k' is not among the model's levels"):
        admit(JobShape(width=64, height=64, frames=1, quant="q2_k"), WAN13B, LEVELS, GiB, 0.2)


def test_dims_and_weights_from_a_converted_model(tmp_path):
    from h3render.engine.convert import convert_pipeline

    src = tmp_path / "pipe"
    src.mkdir()
    shutil.copytree(FIX / "dit_a" / "transformer", src / "transformer")
    shutil.copytree(FIX / "vae_a" / "vae", src / "vae")
    dst = tmp_path / "model"
    convert_pipeline(src, dst, quants=["f32", "f16"])
    cfg = json.loads((src / "transformer" / "config.json").read_text())
    vcfg = json.loads((src / "vae" / "config.json").read_text())
    d = model_dims(dst)
    assert d.dim == cfg["num_attention_heads"] * cfg["attention_head_dim"]
    assert (d.ffn_dim, d.in_channels, d.patch, d.text_dim) == (
        cfg["ffn_dim"], cfg["in_channels"], tuple(cfg["patch_size"]), cfg["text_dim"])
    assert (d.vae_base_dim, d.vae_dim_mult) == (vcfg["base_dim"], tuple(vcfg["dim_mult"]))
    wb = weight_bytes_on_disk(dst)
    for q in ("f32", "f16"):
        assert wb[q] == (dst / f"transformer-{q}.gguf").stat().st_size + \
            (dst / f"vae-{q}.gguf").stat().st_size
    assert wb["f16"] < wb["f32"]


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
