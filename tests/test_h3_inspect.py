"""`models inspect` on synthetic H3 snapshots with the real folder layout (small tensors).

The shards are written by this test: BF16 tensors with a hand-built header
(numpy has no bfloat16) and F32 ones with safetensors.numpy, so both writers
are covered. Expected byte counts are computed here from shapes and dtypes,
independently of the code under test.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from h3render.cli.models_inspect import inspect as inspect_cmd
from h3render.engine.exceptions import ModelFileError
from h3render.engine.h3.inspect import ModelInspectError, check_model_dir, inspect_model_dir

DTYPE_BYTES = {"BF16": 2, "F32": 4, "F16": 2}


def write_raw(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A safetensors file with zero data; returns its tensor bytes."""
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = int(np.prod(shape)) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(off))
    return off


def make_snapshot(root: Path, ref2va: bool = False) -> dict[str, int]:
    """FL2VA (and optionally Ref2VA) with a 2-shard indexed DiT; returns tensor bytes per component."""
    sizes: dict[str, int] = {}
    for variant in ("FL2VA", "Ref2VA") if ref2va else ("FL2VA",):
        v = root / variant
        (v / "transformer").mkdir(parents=True)
        (v / "transformer" / "config.json").write_text('{"num_layers": 2}')
        (v / "tokenizer").mkdir()
        (v / "tokenizer" / "tokenizer.json").write_text("{}")
        shards = {
            "model-00001-of-00002.safetensors": {"blocks.0.attn.qkv.weight": ("BF16", [48, 16]),
                                                 "blocks.0.mlp.fc1.weight": ("BF16", [32, 16])},
            "model-00002-of-00002.safetensors": {"blocks.1.attn.qkv.weight": ("BF16", [48, 16]),
                                                 "final.bias": ("F32", [16])},
        }
        total, wmap = 0, {}
        for fname, tensors in shards.items():
            total += write_raw(v / "transformer" / fname, tensors)
            wmap.update({t: fname for t in tensors})
        (v / "transformer" / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}))
        sizes[f"{variant}/transformer"] = total
        rng = np.random.default_rng(0)
        for comp, shape in (("text_encoder", (8, 4)), ("video_vae/source", (4, 4, 3)), ("audio_vae", (6,))):
            save_file({"w": rng.standard_normal(shape).astype(np.float32)},
                      str(_mk(v / comp) / "model.safetensors"))
            sizes[f"{variant}/{comp}"] = int(np.prod(shape)) * 4
    return sizes


def _mk(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def test_complete_snapshot(tmp_path):
    sizes = make_snapshot(tmp_path, ref2va=True)
    report = check_model_dir(tmp_path)
    assert report.ok and report.problems == [] and report.warnings == []
    by = {c.path: c for c in report.components}
    assert set(by) == set(sizes)
    for path, tensor_bytes in sizes.items():
        c = by[path]
        assert c.tensor_bytes == tensor_bytes, path
        files = list((tmp_path / path).glob("*.safetensors"))
        assert c.file_bytes == sum(f.stat().st_size for f in files)
    dit = by["FL2VA/transformer"]
    assert dit.indexed and len(dit.shards) == 2 and dit.tensors == 4
    assert dit.dtypes == {"BF16": 3, "F32": 1}
    assert report.dit_bytes() == sizes["FL2VA/transformer"] == (48 * 16 + 32 * 16) * 2 + 48 * 16 * 2 + 16 * 4
    assert report.bytes_by_component()["FL2VA/text_encoder"] == by["FL2VA/text_encoder"].file_bytes


def test_ref2va_is_optional(tmp_path):
    make_snapshot(tmp_path)
    report = inspect_model_dir(tmp_path)
    assert report.ok
    assert any("Ref2VA/ is absent" in w for w in report.warnings)


def test_truncated_shard_named_with_sizes(tmp_path):
    make_snapshot(tmp_path)
    shard = tmp_path / "FL2VA/transformer/model-00002-of-00002.safetensors"
    full = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-100])  # an interrupted download
    report = inspect_model_dir(tmp_path)
    assert [p.kind for p in report.problems] == ["truncated_shard"]
    p = report.problems[0]
    assert p.file == "FL2VA/transformer/model-00002-of-00002.safetensors"
    assert f"ends at byte {full}" in p.message and f"has {full - 100} bytes (100 missing)" in p.message
    with pytest.raises(ModelInspectError) as info:
        check_model_dir(tmp_path)
    assert isinstance(info.value, ModelFileError) and "model-00002-of-00002.safetensors" in str(info.value)


def test_truncated_inside_header(tmp_path):
    make_snapshot(tmp_path)
    shard = tmp_path / "FL2VA/text_encoder/model.safetensors"
    shard.write_bytes(shard.read_bytes()[:30])
    report = inspect_model_dir(tmp_path)
    assert [(p.kind, p.file) for p in report.problems] == [("truncated_shard", "FL2VA/text_encoder/model.safetensors")]
    assert "header length" in report.problems[0].message and "runs past the end" in report.problems[0].message


def test_missing_shard_named(tmp_path):
    make_snapshot(tmp_path)
    (tmp_path / "FL2VA/transformer/model-00001-of-00002.safetensors").unlink()
    report = inspect_model_dir(tmp_path)
    assert [(p.kind, p.file) for p in report.problems] == [
        ("missing_shard", "FL2VA/transformer/model-00001-of-00002.safetensors")]
    assert "model.safetensors.index.json maps 2 tensors to it" in report.problems[0].message


def test_broken_index_json(tmp_path):
    make_snapshot(tmp_path)
    index = tmp_path / "FL2VA/transformer/model.safetensors.index.json"
    index.write_text(index.read_text()[:-10])
    report = inspect_model_dir(tmp_path)
    assert [(p.kind, p.file) for p in report.problems] == [
        ("broken_index", "FL2VA/transformer/model.safetensors.index.json")]
    assert "not valid JSON" in report.problems[0].message


@pytest.mark.parametrize("mutate,why", [
    (lambda d: d.pop("weight_map"), "has no weight_map"),
    (lambda d: d["weight_map"].__setitem__("blocks.9.x", "model-00002-of-00002.safetensors"),
     "maps 1 tensors to model-00002-of-00002.safetensors that its header does not have (first: 'blocks.9.x')"),
    (lambda d: d["weight_map"].__setitem__("blocks.0.attn.qkv.weight", "../evil.safetensors"),
     "is not a shard file name"),
])
def test_broken_index_contents(tmp_path, mutate, why):
    make_snapshot(tmp_path)
    index = tmp_path / "FL2VA/transformer/model.safetensors.index.json"
    data = json.loads(index.read_text())
    mutate(data)
    index.write_text(json.dumps(data))
    report = inspect_model_dir(tmp_path)
    assert [p.kind for p in report.problems] == ["broken_index"]
    assert why in report.problems[0].message


def test_corrupt_header_json(tmp_path):
    make_snapshot(tmp_path)
    shard = tmp_path / "FL2VA/audio_vae/model.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[9] = ord("}")  # inside the JSON header
    shard.write_bytes(bytes(raw))
    report = inspect_model_dir(tmp_path)
    assert [(p.kind, p.file) for p in report.problems] == [("bad_header", "FL2VA/audio_vae/model.safetensors")]


def test_trailing_bytes_and_stale_shard(tmp_path):
    make_snapshot(tmp_path)
    te = tmp_path / "FL2VA/video_vae/source/model.safetensors"
    te.write_bytes(te.read_bytes() + b"\0" * 8)
    write_raw(tmp_path / "FL2VA/transformer/model-old.safetensors", {"x": ("F16", [4])})
    report = inspect_model_dir(tmp_path)
    assert [(p.kind, p.file) for p in report.problems] == [("bad_header", "FL2VA/video_vae/source/model.safetensors")]
    assert "8 bytes after the last tensor" in report.problems[0].message
    assert any("model-old.safetensors: not named by" in w for w in report.warnings)


def test_missing_required_pieces(tmp_path):
    make_snapshot(tmp_path)
    (tmp_path / "FL2VA/tokenizer/tokenizer.json").unlink()
    for f in (tmp_path / "FL2VA/audio_vae").iterdir():
        f.unlink()
    report = inspect_model_dir(tmp_path)
    assert {(p.kind, p.file) for p in report.problems} == {("missing_file", "FL2VA/tokenizer/tokenizer.json"),
                                                          ("no_weights", "FL2VA/audio_vae")}


def test_not_a_snapshot(tmp_path):
    make_snapshot(tmp_path)
    report = inspect_model_dir(tmp_path / "FL2VA")  # one level too deep
    assert [p.kind for p in report.problems] == ["missing_dir"]
    assert "pass its parent" in report.problems[0].message


def test_cli_table_json_and_exit_codes(tmp_path):
    sizes = make_snapshot(tmp_path)
    runner = CliRunner()
    res = runner.invoke(inspect_cmd, [str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["ok"] and {c["path"]: c["tensor_bytes"] for c in data["components"]} == sizes
    res = runner.invoke(inspect_cmd, [str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "FL2VA/transformer" in res.output and "ok" in res.output

    (tmp_path / "FL2VA/transformer/model-00002-of-00002.safetensors").unlink()
    res = runner.invoke(inspect_cmd, [str(tmp_path)], env={"COLUMNS": "200"})
    assert res.exit_code == 1 and "missing_shard" in res.output and "model-00002-of-00002" in res.output
    res = runner.invoke(inspect_cmd, [str(tmp_path / "nope")])
    assert res.exit_code == 2  # bad usage: no such directory
