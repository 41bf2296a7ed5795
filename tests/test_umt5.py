"""UMT5 text encoder (csrc/umt5.c) against transformers' UMT5EncoderModel.

References come from tools/fixtures/fixtures_umt5.py: two tiny random encoders
(tests/fixtures/umt5_a, umt5_b) that differ in every shape, and their float32
last_hidden_state for id sequences of 1, 7 and 33 tokens (33 is past both
max_distances, so the logarithmic position buckets saturate), plus one run made
the way the Wan pipeline makes it (ids padded with an attention mask).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, rel_err

from h3render.engine.binding import Engine
from h3render.engine.exceptions import InvalidRequestError, ModelFileError, UnsupportedError

NAMES = ("umt5_a", "umt5_b")
CASES = ("len1", "len7", "len33")

# Tolerances (relative error = max abs error / max |reference|):
# F32 weights: the engine and torch differ only in summation order and libm
# (tanh, exp, rsqrt); measured <= 9e-7, so 1e-4 leaves room for other CPUs.
TOL_F32 = 1e-4
# F16 weights (embedding, projections, and in umt5_b the bias tables): each
# weight is rounded to 11 significant bits (2^-11 ~ 5e-4 relative) and the
# errors add up over the layers; measured up to 1.3e-3 (umt5_a, 33 tokens).
# This is the rounding of the weights themselves, not the engine: against a
# reference run with the same rounded weights the f16 path is within TOL_F32
# (test_f16_path_matches_rounded_weights).
TOL_F16 = 2e-3
TOLS = {"f32": TOL_F32, "f16": TOL_F16}


@pytest.fixture(scope="module")
def references() -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for name in NAMES:
        with np.load(FIXTURES / name / "reference.npz") as z:
            out[name] = {k: z[k] for k in z.files}
    return out


@pytest.fixture(scope="module")
def engines(converted_models):
    """(name, threads) -> Engine over the converted fixture (f32 and f16 text encoders)."""
    cache: dict[tuple[str, int], Engine] = {}

    def get(name: str, threads: int = 1) -> Engine:
        key = (name, threads)
        if key not in cache:
            cache[key] = Engine(converted_models(name), threads=threads)
        return cache[key]

    yield get
    for e in cache.values():
        e.close()


def _encode(engine: Engine, ids: np.ndarray, quant: str) -> np.ndarray:
    out = engine.encode_text(ids, quant=quant)
    text_len = engine.info()["text_len"]
    assert out.shape == (text_len, int(out.shape[1])), out.shape
    n = len(ids)
    # Wan's pipeline pads the encoder output to text_len with zero rows.
    assert np.all(out[n:] == 0.0), "rows past the real tokens must be exactly zero"
    return out[:n]


@pytest.mark.parametrize("quant", ["f32", "f16"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", NAMES)
def test_matches_transformers(engines, references, name, case, quant):
    ref = references[name]
    ids = ref[f"ids_{case}"]
    expected = ref[f"out_{case}"]
    got = _encode(engines(name), ids, quant)
    err = rel_err(got, expected)
    print(f"{name} {case} {quant}: rel_err {err:.3g}")
    assert err <= TOLS[quant], f"{name} {case} {quant}: rel_err {err:.3g} > {TOLS[quant]}"


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", NAMES)
def test_f16_path_matches_rounded_weights(engines, references, name, case):
    """The f16 text encoder against transformers run with the same weights rounded to
    float16 (as the converter stores them): what remains is arithmetic, not weight
    rounding, so the F32 tolerance applies. This catches an F16 decoding bug (of the
    embedding or, in umt5_b, of the bias tables) that TOL_F16 could hide."""
    ref = references[name]
    got = _encode(engines(name), ref[f"ids_{case}"], "f16")
    err = rel_err(got, ref[f"out16_{case}"])
    print(f"{name} {case} f16 vs rounded-weight reference: rel_err {err:.3g}")
    assert err <= TOL_F32


@pytest.mark.parametrize("name", NAMES)
def test_padded_pipeline_run(engines, references, name):
    """The engine encodes only the n real tokens; transformers ran the padded, masked
    batch as WanPipeline does. Its first n rows must match, the rest are zeros."""
    ref = references[name]
    n = int(ref["padded_n"])
    assert int(ref["padded_mask"].sum()) == n
    got = _encode(engines(name), ref["padded_ids"][:n], "f32")
    err = rel_err(got, ref["padded_out"][:n])
    print(f"{name} padded: rel_err {err:.3g}")
    assert err <= TOL_F32


@pytest.mark.parametrize("quant", ["f32", "f16"])
@pytest.mark.parametrize("name", NAMES)
def test_thread_count_does_not_change_bits(engines, references, name, quant):
    ids = references[name]["ids_len33"]
    one = engines(name, 1).encode_text(ids, quant=quant)
    two = engines(name, 2).encode_text(ids, quant=quant)
    assert one.tobytes() == two.tobytes(), "1 and 2 threads must give byte-identical output"


def test_taps_name_every_stage(engines, references):
    """Taps: embedding rows exactly as stored, one per block, and the final output."""
    from safetensors.numpy import load_file

    name = "umt5_b"
    ref = references[name]
    ids = ref["ids_len7"]
    weights = load_file(FIXTURES / name / "text_encoder" / "model.safetensors")
    n_layers = sum(1 for k in weights if k.endswith("layer.0.layer_norm.weight"))
    d_model = weights["shared.weight"].shape[1]
    seen: dict[str, np.ndarray] = {}
    engine = engines(name)
    engine.set_tap(lambda stage, data: seen.__setitem__(stage, data))
    try:
        out = _encode(engine, ids, "f32")
    finally:
        engine.set_tap(None)
    expected = ["umt5.embed"] + [f"umt5.block.{i}" for i in range(n_layers)] + ["umt5.final"]
    assert list(seen) == expected
    for stage, data in seen.items():
        assert data.shape == (len(ids) * d_model,), stage
    # The F32 embedding is a plain row gather: exact.
    assert np.array_equal(seen["umt5.embed"].reshape(len(ids), d_model), weights["shared.weight"][ids])
    assert np.array_equal(seen["umt5.final"].reshape(len(ids), d_model), out)


@pytest.mark.parametrize("bad", [-1, "vocab", 1 << 30])
def test_id_outside_vocabulary_is_rejected(engines, references, bad):
    ref = references["umt5_a"]
    vocab = int(ref["vocab_size"])
    bad_id = vocab if bad == "vocab" else bad
    ids = np.array([3, bad_id, 5], np.int32)
    with pytest.raises(InvalidRequestError) as info:
        engines("umt5_a").encode_text(ids, quant="f32")
    msg = str(info.value)
    print(msg)
    assert str(bad_id) in msg and str(vocab) in msg and "vocab" in msg, msg
    # The engine stays usable after a rejected request.
    assert engines("umt5_a").encode_text(ref["ids_len1"], quant="f32").shape[1] > 0


# ---------------------------------------------------------------- bad model files


def _rewrite_gguf(src: Path, dst: Path, *, drop: str | None = None,
                  reshape: tuple[str, tuple[int, ...]] | None = None,
                  set_int: tuple[str, int] | None = None) -> None:
    """Copy a GGUF file with gguf-py, dropping a tensor, truncating one to a new
    numpy shape, or overriding an int64 metadata value."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture",):
            continue
        value = field.contents()
        vtype = field.types[0]
        if set_int and key == set_int[0]:
            value = set_int[1]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype, field.types[-1])
        else:
            writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        if t.name == drop:
            continue
        data = np.array(t.data)
        if reshape and t.name == reshape[0]:
            shape = reshape[1]
            data = data.reshape(-1)[: int(np.prod(shape))].reshape(shape)
        writer.add_tensor(t.name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


BAD_FILES = {
    "missing tensor": (
        dict(drop="encoder.block.1.layer.1.DenseReluDense.wo.weight"),
        ModelFileError, ["encoder.block.1.layer.1.DenseReluDense.wo.weight"],
    ),
    "wrong shape": (
        dict(reshape=("encoder.block.0.layer.0.SelfAttention.q.weight", (31, 32))),
        ModelFileError, ["encoder.block.0.layer.0.SelfAttention.q.weight"],
    ),
    "wrong bias table": (
        dict(reshape=("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                      (31, 4))),
        ModelFileError, ["relative_attention_bias"],
    ),
    "buckets too few": (
        dict(set_int=("h3r.relative_attention_num_buckets", 2)),
        ModelFileError, ["relative_attention_num_buckets", "2"],
    ),
    "max distance within exact buckets": (
        dict(set_int=("h3r.relative_attention_max_distance", 8)),
        ModelFileError, ["relative_attention_max_distance", "8"],
    ),
    "zero layers": (
        dict(set_int=("h3r.num_layers", 0)),
        ModelFileError, ["num_layers", "0"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_inconsistent_model_file_is_rejected(converted_models, tmp_path, case):
    """Every config value and tensor shape is checked at load; the message names the
    file and the tensor or key (umt5_a: D 32, H*Dh 32, 32 buckets x 4 heads)."""
    mutation, error, words = BAD_FILES[case]
    src = converted_models("umt5_a")
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    target = dst / "text_encoder-f32.gguf"
    target.unlink()
    _rewrite_gguf(src / "text_encoder-f32.gguf", target, **mutation)
    with pytest.raises((error, UnsupportedError)) as info:
        with Engine(dst, threads=1) as engine:
            engine.encode_text(np.array([1, 2, 3], np.int32), quant="f32")
    msg = str(info.value)
    print(f"{case}: {msg}")
    assert isinstance(info.value, error), f"{type(info.value).__name__}: {msg}"
    assert "text_encoder-f32.gguf" in msg, msg
    for word in words:
        assert word in msg, msg
