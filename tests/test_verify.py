"""Verify mode: the float64 reference against diffusers, and the engine against it.

h3render/engine/reference.py is checked against the diffusers fixtures first
(so the reference itself is trusted), then verify_dit and `h3render verify` on a
good model (every stage passes) and on converted models with one block's weight
altered through gguf-py (the first failing stage is that block).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from h3render.cli.verify import verify as verify_cmd
from h3render.engine.convert import convert_pipeline
from h3render.engine.reference import ReferenceDiT
from h3render.engine.verify import COMPUTE_TOL, F16_TOL, tolerance_for, verify_dit
from conftest import FIXTURES, rel_err

# The reference is float64; diffusers ran in float32. Measured <= 2e-6 on both
# fixtures (the float32 rounding of torch's own sums).
REF_VS_DIFFUSERS_TOL = 1e-5


def _reference(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


def _stage_names(n_blocks: int) -> list[str]:
    return ["dit.patch_embed", "dit.temb", "dit.timestep_proj", "dit.context",
            *[f"dit.block.{i}" for i in range(n_blocks)], "dit.out"]


@pytest.mark.parametrize("name", ["dit_a", "dit_b"])
def test_reference_matches_diffusers(converted_models, name):
    ref = _reference(name)
    stages: dict[str, np.ndarray] = {}
    model = ReferenceDiT(converted_models(name) / "transformer-f32.gguf")
    out = model.forward(ref["x"], float(ref["t"][0]), ref["context"],
                        tap=lambda n, a: stages.__setitem__(n, a))
    n_blocks = model.config.num_layers
    assert list(stages) == _stage_names(n_blocks)
    pairs = {"dit.patch_embed": "patch_embed", "dit.temb": "temb",
             "dit.timestep_proj": "timestep_proj", "dit.context": "context_embed",
             **{f"dit.block.{i}": f"block_{i}" for i in range(n_blocks)}, "dit.out": "out"}
    for stage, key in pairs.items():
        err = rel_err(stages[stage].reshape(ref[key].shape), ref[key])
        print(f"{name} {stage}: rel_err {err:.3g}")
        assert err <= REF_VS_DIFFUSERS_TOL, stage
    np.testing.assert_array_equal(stages["dit.out"], out)


def test_reference_reads_diffusers_folder_like_the_f32_file(converted_models):
    """F32 conversion is exact, so both weight sources give the same float64 bits."""
    ref = _reference("dit_b")
    args = (ref["x"], float(ref["t"][0]), ref["context"])
    from_gguf = ReferenceDiT(converted_models("dit_b") / "transformer-f32.gguf").forward(*args)
    from_src = ReferenceDiT(FIXTURES / "dit_b").forward(*args)
    np.testing.assert_array_equal(from_gguf, from_src)


@pytest.mark.parametrize("quant", ["f32", "f16"])
def test_good_model_passes_every_stage(converted_models, quant):
    result = verify_dit(converted_models("dit_b"), quant, threads=2)
    assert [s.name for s in result.stages] == _stage_names(2)
    for s in result.stages:
        print(f"{quant} {s.name}: {s.rel_err:.3g} (tol {s.tolerance})")
    assert result.ok and result.first_failure is None
    assert all(s.tolerance == (COMPUTE_TOL if quant == "f32" else F16_TOL) for s in result.stages)
    assert result.reference.endswith("transformer-f32.gguf")


def test_tolerances_follow_the_weight_source():
    assert tolerance_for("f32", same_weights=True) == COMPUTE_TOL
    assert tolerance_for("f16", same_weights=True) == COMPUTE_TOL
    assert tolerance_for("f16", same_weights=False) == F16_TOL


def _corrupt(path: Path, tensor: str) -> None:
    """Transpose one square weight in place, a plausible converter bug, via gguf-py."""
    from gguf import GGUFReader

    reader = GGUFReader(path, "r+")
    t = next(t for t in reader.tensors if t.name == tensor)
    assert t.data.shape[0] == t.data.shape[1], "pick a square weight"
    t.data[...] = np.ascontiguousarray(t.data.T)
    reader.data.flush()
    del reader


@pytest.fixture
def model_a(tmp_path) -> Path:
    """A private conversion of dit_a (3 blocks) that a test may damage."""
    dst = tmp_path / "dit_a"
    convert_pipeline(FIXTURES / "dit_a", dst, quants=["f32", "f16"])
    return dst


def test_corrupted_f16_block_is_located(model_a):
    _corrupt(model_a / "transformer-f16.gguf", "blocks.1.attn1.to_v.weight")
    result = verify_dit(model_a, "f16", threads=1)
    for s in result.stages:
        print(f"{s.name}: {s.rel_err:.3g} (tol {s.tolerance})")
    assert result.first_failure == "dit.block.1"
    assert all(s.ok for s in result.stages[: result.stages.index(
        next(s for s in result.stages if s.name == "dit.block.1"))])
    assert verify_dit(model_a, "f32", threads=1).ok  # the f32 file is untouched


def test_corrupted_f32_block_is_located_against_the_source(model_a):
    _corrupt(model_a / "transformer-f32.gguf", "blocks.2.attn2.to_out.0.weight")
    located = verify_dit(model_a, "f32", threads=1, source=FIXTURES / "dit_a")
    assert located.first_failure == "dit.block.2"
    assert [s.ok for s in located.stages[:6]] == [True] * 6  # embedders, blocks 0 and 1
    # Without the source both sides read the same damaged file: nothing to see.
    assert verify_dit(model_a, "f32", threads=1).ok


def test_cli_good_model(converted_models):
    runner = CliRunner()
    res = runner.invoke(verify_cmd, ["--model", str(converted_models("dit_a")), "--threads", "1"])
    print(res.output)
    assert res.exit_code == 0
    assert "f32: all 8 stages within" in res.output and "f16: all 8 stages within" in res.output

    res = runner.invoke(verify_cmd, ["--model", str(converted_models("dit_a")), "--quant", "f16",
                                     "--json"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert doc["ok"] is True and [r["quant"] for r in doc["results"]] == ["f16"]
    assert [s["name"] for s in doc["results"][0]["stages"]] == _stage_names(3)


def test_cli_corrupted_model_exits_1_naming_the_block(model_a):
    _corrupt(model_a / "transformer-f16.gguf", "blocks.1.attn1.to_v.weight")
    res = CliRunner().invoke(verify_cmd, ["--model", str(model_a), "--quant", "f16", "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["results"][0]["first_failure"] == "dit.block.1"
    res = CliRunner().invoke(verify_cmd, ["--model", str(model_a), "--quant", "f16"])
    assert res.exit_code == 1
    assert "first stage over tolerance: dit.block.1" in res.output


def test_cli_bad_input_exits_2(converted_models, tmp_path):
    runner = CliRunner()
    res = runner.invoke(verify_cmd, ["--model", str(converted_models("dit_a")), "--quant", "q8_0"])
    assert res.exit_code == 2 and "q8_0 not in this model" in res.output
    res = runner.invoke(verify_cmd, ["--model", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and "does not exist" in res.output
    src = tmp_path / "other"
    shutil.copytree(FIXTURES / "dit_b", src)
    res = runner.invoke(verify_cmd, ["--model", str(converted_models("dit_a")), "--source", str(src)])
    assert res.exit_code == 2 and "different models" in res.output
