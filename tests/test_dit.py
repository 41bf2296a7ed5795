"""Wan 2.1 DiT forward (csrc/wan_dit.c) against diffusers' WanTransformer3DModel.

Fixtures (tools/fixtures/fixtures_dit.py): dit_a is one latent frame, square,
patch (1, 2, 2), affine norm2; dit_b is four frames, non-square (4, 6, 10),
patch (2, 1, 2), three heads, no norm2. reference.npz holds the diffusers
float32 output and its named intermediate stages.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from h3render.engine.binding import Engine
from h3render.engine.convert import convert_pipeline
from h3render.engine.exceptions import EngineError, InvalidRequestError, ModelFileError
from conftest import FIXTURES, rel_err

CONFIGS = ("dit_a", "dit_b")

# F32: the engine and torch both compute in float32 but reduce in different
# orders (blocked matmul, online-softmax attention, double-accumulated norms);
# measured ~3e-7, the bound is 1e-4.
TOL_F32 = 1e-4
# F16: every 2-D weight of >= 1024 elements is rounded to half (rel. 2^-11
# per weight); measured 7e-5 (dit_a) and 2.4e-4 (dit_b); the bound.
TOL_F16 = 2e-3
# Intermediate stages at F32, same reasoning as TOL_F32.
TOL_STAGE_F32 = 1e-4


def _reference(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


def _forward(model_dir: Path, quant: str, ref: dict, threads: int = 1, taps: dict | None = None):
    with Engine(model_dir, threads) as eng:
        if taps is not None:
            eng.set_tap(lambda name, data: taps.__setitem__(name, data))
        return eng.dit_forward(quant, ref["x"], float(ref["t"][0]), ref["context"])


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("quant, tol", [("f32", TOL_F32), ("f16", TOL_F16)])
def test_output_matches_diffusers(converted_models, name, quant, tol):
    ref = _reference(name)
    out = _forward(converted_models(name), quant, ref)
    err = rel_err(out, ref["out"])
    print(f"{name} {quant}: rel_err {err:.3g} (tolerance {tol})")
    assert out.shape == ref["out"].shape
    assert np.all(np.isfinite(out))
    assert err <= tol


@pytest.mark.parametrize("name", CONFIGS)
def test_stages_match_diffusers(converted_models, name):
    """Every tapped stage at F32 matches the diffusers hook of the same stage."""
    ref = _reference(name)
    taps: dict[str, np.ndarray] = {}
    out = _forward(converted_models(name), "f32", ref, taps=taps)
    n_blocks = sum(1 for k in ref if k.startswith("block_"))
    pairs = {
        "dit.patch_embed": "patch_embed",
        "dit.temb": "temb",
        "dit.timestep_proj": "timestep_proj",
        "dit.context": "context_embed",
        **{f"dit.block.{i}": f"block_{i}" for i in range(n_blocks)},
    }
    for tap, key in pairs.items():
        assert tap in taps, f"stage {tap} was not tapped; got {sorted(taps)}"
        err = rel_err(taps[tap], ref[key].ravel())
        print(f"{name} {tap}: rel_err {err:.3g}")
        assert err <= TOL_STAGE_F32, f"{tap}: rel_err {err:.3g}"
    np.testing.assert_array_equal(taps["dit.out"], out.ravel())
    assert f"dit.block.{n_blocks}" not in taps


@pytest.mark.parametrize("quant", ["f32", "f16"])
def test_thread_count_does_not_change_bytes(converted_models, quant):
    ref = _reference("dit_b")
    one = _forward(converted_models("dit_b"), quant, ref, threads=1)
    two = _forward(converted_models("dit_b"), quant, ref, threads=2)
    assert one.tobytes() == two.tobytes()


def test_bad_inputs_are_named(converted_models):
    ref = _reference("dit_b")  # patch (2, 1, 2), in_channels 4
    with Engine(converted_models("dit_b"), 1) as eng:
        with pytest.raises(InvalidRequestError, match="in_channels = 4"):
            eng.dit_forward("f32", ref["x"][:3], 500.0, ref["context"])
        with pytest.raises(InvalidRequestError, match=r"frames \(T\) = 3 .*patch size 2"):
            eng.dit_forward("f32", ref["x"][:, :3], 500.0, ref["context"])
        with pytest.raises(InvalidRequestError, match=r"width \(X\) = 9 .*patch size 2"):
            eng.dit_forward("f32", ref["x"][..., :9], 500.0, ref["context"])


def _edited_source(tmp_path: Path, name: str, edit) -> Path:
    """A copy of fixture `name` whose transformer state dict went through edit(dict)."""
    from safetensors.numpy import load_file, save_file

    src = tmp_path / f"{name}-src"
    shutil.copytree(FIXTURES / name / "transformer", src / "transformer")
    st = src / "transformer" / "diffusion_pytorch_model.safetensors"
    tensors = load_file(st)
    edit(tensors)
    save_file(tensors, st)
    return src


def _open_and_run(model_dir: Path, ref: dict) -> None:
    with Engine(model_dir, 1) as eng:
        eng.dit_forward("f32", ref["x"], float(ref["t"][0]), ref["context"])


def test_wrong_tensor_shape_is_named(tmp_path):
    bad = "blocks.1.ffn.net.2.weight"

    def edit(t):
        t[bad] = np.ascontiguousarray(t[bad][:, :-1])  # (D, F) -> (D, F - 1)

    dst = tmp_path / "model"
    convert_pipeline(_edited_source(tmp_path, "dit_a", edit), dst, quants=["f32"])
    with pytest.raises(ModelFileError) as exc:
        _open_and_run(dst, _reference("dit_a"))
    print(exc.value.message)
    assert bad in exc.value.message
    assert "transformer-f32.gguf" in exc.value.message


def test_missing_tensor_is_named(tmp_path):
    gone = "blocks.0.attn2.norm_k.weight"
    dst = tmp_path / "model"
    convert_pipeline(_edited_source(tmp_path, "dit_a", lambda t: t.pop(gone)), dst, quants=["f32"])
    with pytest.raises(ModelFileError, match=f"'{gone}' is missing"):
        _open_and_run(dst, _reference("dit_a"))


def test_bad_config_value_is_named(tmp_path):
    src = _edited_source(tmp_path, "dit_a", lambda t: None)
    cfg_path = src / "transformer" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["attention_head_dim"] = 11  # odd: rope rotates pairs
    cfg_path.write_text(json.dumps(cfg))
    dst = tmp_path / "model"
    convert_pipeline(src, dst, quants=["f32"])
    with pytest.raises(EngineError, match="attention_head_dim = 11"):
        _open_and_run(dst, _reference("dit_a"))
