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
