"""Quant levels end to end: conversion, renders per level, thread independence.

- `convert_pipeline(..., quants=[f32, f16, q8_0, q6_k, q4_0])` writes one
  transformer file per level with 2-D linear weights in that level's GGML type
  (Q6_K rows not a multiple of 256 fall back to Q8_0), norms and biases F32,
  and the text encoder and VAE at F16 only;
- renders of the tiny pipeline (h3render/data/tiny-wan) are byte-identical with
  1 and 2 threads at every level, and their PSNR against the F32 render is
  printed and held above a floor per level;
- tiny-wan's rows are 32 or 64 long, so its q6_k file is Q8_0 inside: a DiT of
  width 256 built here from random weights checks a real Q6_K forward against
  its F32 forward (and the other levels likewise).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES, psnr, rel_err
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

from h3render.engine.binding import Engine, GenerateRequest
from h3render.engine.convert import convert_pipeline

LEVELS = ("f32", "f16", "q8_0", "q6_k", "q4_0")
REF = np.load(FIXTURES / "pipeline" / "reference.npz")
CASE = "unipc_cfg"  # 6 UniPC steps with guidance 5 and a negative prompt: 12 DiT passes

# PSNR floors (dB) of the 48x32x9 tiny-wan frames against the F32 render, per level.
# The quant error enters every DiT pass and compounds over 12 passes; the floors
# sit ~5 dB under the measured values so a kernel or layout bug (tens of dB lost)
# fails while a change of summation order does not. Measured: f16 60.5,
# q8_0 41.6, q6_k 41.6 (Q8_0 inside, see above), q4_0 26.4.
PSNR_FLOOR_DB = {"f16": 55.0, "q8_0": 36.0, "q6_k": 36.0, "q4_0": 21.0}

# rel_err of one DiT forward of the width-256 model against its F32 forward.
# Weight rounding (f16 2^-11; q8_0 1/254, q6_k 1/64, q4_0 1/16 of a block max,
# relative) plus, for the block types, 8-bit activations (1/254); through one
# block of attention and FFN. Measured: f16 3.4e-4, q8_0 1.5e-2, q6_k 2.6e-2,
# q4_0 1.5e-1.
DIT_TOL = {"f16": 2e-3, "q8_0": 3e-2, "q6_k": 6e-2, "q4_0": 2.5e-1}


@pytest.fixture(scope="module")
def tiny(converted_models) -> Path:
    return converted_models("tiny-wan", LEVELS)


def _types(path: Path) -> dict[str, int]:
    return {t.name: int(t.tensor_type) for t in GGUFReader(path).tensors}


def test_converted_types_per_level(tiny):
    names = sorted(p.name for p in tiny.glob("*.gguf"))
    assert names == sorted(
        [f"transformer-{q}.gguf" for q in LEVELS]
        + ["text_encoder-f32.gguf", "text_encoder-f16.gguf", "vae-f32.gguf", "vae-f16.gguf"]
    )
    expect = {"q8_0": QT.Q8_0, "q6_k": QT.Q8_0, "q4_0": QT.Q4_0}  # q6_k: rows of 32/64
    for level, qt in expect.items():
        types = _types(tiny / f"transformer-{level}.gguf")
        assert types["blocks.0.attn1.to_q.weight"] == qt
        assert types["blocks.0.ffn.net.2.weight"] == qt  # (32, 64): rows of 64
        assert types["patch_embedding.weight"] == qt  # flattened conv (32, 8*1*2*2)
        assert types["blocks.0.attn1.to_q.bias"] == QT.F32
        assert types["blocks.0.norm2.weight"] == QT.F32
        assert types["scale_shift_table"] == QT.F32
    assert json.loads((tiny / "model.json").read_text())["quant_levels"] == sorted(LEVELS)


def _render(model: Path, quant: str, threads: int) -> np.ndarray:
    sampler, steps, guidance, shift, width, height, frames = REF[f"{CASE}_meta"]
    req = GenerateRequest(
        width=int(width), height=int(height), frames=int(frames), steps=int(steps),
        prompt_ids=REF["prompt_ids"].tolist(), negative_ids=REF["negative_ids"].tolist(),
        guidance=float(guidance), shift=float(shift), sampler="unipc", quant=quant,
        threads=threads, init_latents=REF[f"{CASE}_init"],
    )
    out: dict[int, np.ndarray] = {}

    def on_frame(kind, index, rgb):
        if kind == 0:
            out[index] = rgb

    with Engine(model, threads) as engine:
        engine.generate(req, on_frame=on_frame)
    return np.stack([out[i] for i in range(int(frames))])


@pytest.fixture(scope="module")
def f32_frames(tiny) -> np.ndarray:
    return _render(tiny, "f32", 2)


@pytest.mark.parametrize("level", LEVELS[1:])
def test_render_per_level(tiny, f32_frames, level):
    one, two = _render(tiny, level, 1), _render(tiny, level, 2)
    assert one.tobytes() == two.tobytes(), f"{level}: frames differ between 1 and 2 threads"
    db = psnr(two, f32_frames)
    print(f"tiny-wan {level}: frames PSNR vs f32 {db:.1f} dB (floor {PSNR_FLOOR_DB[level]} dB)")
    assert db >= PSNR_FLOOR_DB[level], f"{level}: PSNR {db:.1f} dB < {PSNR_FLOOR_DB[level]} dB"


def test_f32_render_thread_independent(tiny, f32_frames):
    assert _render(tiny, "f32", 1).tobytes() == f32_frames.tobytes()


# ---------------------------------------------------------------- width-256 DiT

WIDE = {"D": 256, "F": 512, "C": 16, "heads": 2}


def _wide_tensors(rng) -> dict[str, np.ndarray]:
    """Wan DiT tensors named as diffusers names them, D=256 (rows of 256 for Q6_K)."""
    D, F, C = WIDE["D"], WIDE["F"], WIDE["C"]
    P = C * 4
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (D, C, 1, 2, 2), "patch_embedding.bias": (D,),
        "condition_embedder.time_embedder.linear_1.weight": (D, D),
        "condition_embedder.time_embedder.linear_2.weight": (D, D),
        "condition_embedder.time_proj.weight": (6 * D, D),
        "condition_embedder.text_embedder.linear_1.weight": (D, D),
        "condition_embedder.text_embedder.linear_2.weight": (D, D),
        "scale_shift_table": (1, 2, D), "proj_out.weight": (P, D), "proj_out.bias": (P,),
    }
    for lin in ("time_embedder.linear_1", "time_embedder.linear_2", "time_proj",
                "text_embedder.linear_1", "text_embedder.linear_2"):
        n = shapes[f"condition_embedder.{lin}.weight"][0]
        shapes[f"condition_embedder.{lin}.bias"] = (n,)
    b = "blocks.0."
    for a in ("attn1", "attn2"):
        for proj in ("to_q", "to_k", "to_v", "to_out.0"):
            shapes[f"{b}{a}.{proj}.weight"] = (D, D)
            shapes[f"{b}{a}.{proj}.bias"] = (D,)
        shapes[f"{b}{a}.norm_q.weight"] = (D,)
        shapes[f"{b}{a}.norm_k.weight"] = (D,)
    shapes.update({f"{b}ffn.net.0.proj.weight": (F, D), f"{b}ffn.net.0.proj.bias": (F,),
                   f"{b}ffn.net.2.weight": (D, F), f"{b}ffn.net.2.bias": (D,),
                   f"{b}norm2.weight": (D,), f"{b}norm2.bias": (D,), f"{b}scale_shift_table": (1, 6, D)})
    out = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith("norm_q.weight") or name.endswith("norm_k.weight") or name.endswith("norm2.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 16
            out[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    from safetensors.numpy import save_file

    src = tmp_path_factory.mktemp("wide") / "wide-dit"
    (src / "transformer").mkdir(parents=True)
    save_file(_wide_tensors(np.random.default_rng(256)), str(src / "transformer" / "model.safetensors"))
    D, F, C = WIDE["D"], WIDE["F"], WIDE["C"]
    config = {"_class_name": "WanTransformer3DModel", "attention_head_dim": D // WIDE["heads"],
              "cross_attn_norm": True, "eps": 1e-6, "ffn_dim": F, "freq_dim": D, "in_channels": C,
              "num_attention_heads": WIDE["heads"], "num_layers": 1, "out_channels": C,
              "patch_size": [1, 2, 2], "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024,
              "text_dim": D, "added_kv_proj_dim": None, "image_dim": None, "pos_embed_seq_len": None}
    (src / "transformer" / "config.json").write_text(json.dumps(config))
    dst = src.parent / "model"
    convert_pipeline(src, dst, quants=list(LEVELS))
    return dst


def test_wide_dit_q6_k_is_q6_k(wide):
    types = _types(wide / "transformer-q6_k.gguf")
    assert types["blocks.0.attn1.to_q.weight"] == QT.Q6_K
    assert types["blocks.0.ffn.net.0.proj.weight"] == QT.Q6_K  # (512, 256)
    assert types["blocks.0.ffn.net.2.weight"] == QT.Q6_K  # (256, 512)
    assert types["patch_embedding.weight"] == QT.Q8_0  # rows of 64: the Q8_0 fallback


def test_wide_dit_forward_per_level(wide):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((WIDE["C"], 2, 8, 12)).astype(np.float32)  # 2*4*6 = 48 tokens
    ctx = rng.standard_normal((12, WIDE["D"])).astype(np.float32)
    outs = {}
    with Engine(wide, 2) as engine:
        for level in LEVELS:
            outs[level] = engine.dit_forward(level, x, 500.0, ctx)
    with Engine(wide, 1) as engine:
        for level in LEVELS:
            assert engine.dit_forward(level, x, 500.0, ctx).tobytes() == outs[level].tobytes(), level
    for level in LEVELS[1:]:
        err = rel_err(outs[level], outs["f32"])
        print(f"wide DiT {level}: forward rel_err vs f32 {err:.2e} (tolerance {DIT_TOL[level]})")
        assert err < DIT_TOL[level], f"{level}: {err:.3g}"


def test_prewarm_option(tiny, f32_frames):
    """options prewarm=1 reads the DiT weights in file order first; frames are unchanged."""
    sampler, steps, guidance, shift, width, height, frames = REF[f"{CASE}_meta"]
    base = dict(width=int(width), height=int(height), frames=int(frames), steps=int(steps),
                prompt_ids=REF["prompt_ids"].tolist(), negative_ids=REF["negative_ids"].tolist(),
                guidance=float(guidance), shift=float(shift), sampler="unipc", quant="f32", threads=2,
                init_latents=REF[f"{CASE}_init"])
    out: dict[int, np.ndarray] = {}
    with Engine(tiny, 2) as engine:
        engine.generate(GenerateRequest(**base, options={"prewarm": 1}),
                        on_frame=lambda kind, i, rgb: out.__setitem__(i, rgb) if kind == 0 else None)
        assert np.stack([out[i] for i in range(int(frames))]).tobytes() == f32_frames.tobytes()
        from h3render.engine.exceptions import EngineError

        with pytest.raises(EngineError, match="prewarm=2: allowed 0 or 1"):
            engine.generate(GenerateRequest(**base, options={"prewarm": 2}))
