"""Reading .safetensors sources in convert (h3render.engine.convert).

The files are untrusted input: each malformed header is refused by safetensors'
own parser before any data is read, as a ConvertError that names the file, and
leaves nothing in the destination. Valid files (F32, F16, BF16) convert to the
values they hold.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from h3render.engine.convert import convert_pipeline
from h3render.engine.exceptions import ConvertError


def _source(tmp_path: Path, payload: bytes) -> tuple[Path, Path]:
    src = tmp_path / "src"
    (src / "transformer").mkdir(parents=True)
    (src / "transformer" / "config.json").write_text("{}")
    st = src / "transformer" / "model.safetensors"
    st.write_bytes(payload)
    return src, st


def _file(header, data: bytes) -> bytes:
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def _t(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


MALFORMED = {
    "header is a list": _file([1, 2], b""),
    "entry is not a map": _file({"w.weight": [1, 2]}, b"\0" * 8),
    "no shape": _file({"w.weight": {"dtype": "F32", "data_offsets": [0, 8]}}, b"\0" * 8),
    "negative dim": _file({"w.weight": _t("F32", [-2], 0, 8)}, b"\0" * 8),
    "tensors overlap": _file({"a.weight": _t("F32", [2], 0, 8), "b.weight": _t("F32", [2], 4, 12)},
                             b"\0" * 12),
    "gap before data": _file({"w.weight": _t("F32", [1], 4, 8)}, b"\0" * 8),
    "bytes after data": _file({"w.weight": _t("F32", [2], 0, 8)}, b"\0" * 16),
    "data truncated": _file({"w.weight": _t("F32", [4], 0, 16)}, b"\0" * 8),
    "shape against offsets": _file({"w.weight": _t("F32", [3], 0, 8)}, b"\0" * 8),
    "header length past end": struct.pack("<Q", 10**12) + b"{}",
    "too short": b"\x01\x02",
    "not JSON": _file(b"{not json", b""),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_header_is_refused_naming_the_file(tmp_path, case):
    src, st = _source(tmp_path, MALFORMED[case])
    dst = tmp_path / "dst"
    with pytest.raises(ConvertError) as err:
        convert_pipeline(src, dst, quants=["f32"])
    assert str(st) in str(err.value) and "not a valid safetensors file" in str(err.value)
    assert not dst.exists() or not list(dst.iterdir())


def test_unsupported_dtype_is_named(tmp_path):
    src, st = _source(tmp_path, _file({"w.weight": _t("U8", [8], 0, 8)}, b"\0" * 8))
    with pytest.raises(ConvertError, match=r"tensor 'w.weight' has dtype U8; supported: F32, F16, BF16"):
        convert_pipeline(src, tmp_path / "dst", quants=["f32"])


def test_valid_tensors_convert_to_their_values(tmp_path):
    import gguf

    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    b = np.linspace(-1, 1, 4).astype(np.float16)
    c32 = np.array([1.0, -2.0, 0.15625, 2.0**70], np.float32)  # exact in bfloat16
    c = (c32.view(np.uint32) >> 16).astype("<u2")
    header = {"__metadata__": {"format": "pt"}, "a.bias": _t("F32", [2, 3], 0, 24),
              "b.bias": _t("F16", [4], 24, 32), "c.bias": _t("BF16", [4], 32, 40)}
    src, _ = _source(tmp_path, _file(header, a.tobytes() + b.tobytes() + c.tobytes()))
    report = convert_pipeline(src, tmp_path / "dst", quants=["f32"])
    assert set(report.files) == {"transformer-f32.gguf"}
    reader = gguf.GGUFReader(tmp_path / "dst" / "transformer-f32.gguf")
    got = {t.name: np.asarray(t.data, np.float32).reshape(-1) for t in reader.tensors}
    np.testing.assert_array_equal(got["a.bias"], a.reshape(-1))
    np.testing.assert_array_equal(got["b.bias"], b.astype(np.float32))
    np.testing.assert_array_equal(got["c.bias"], c32)


def test_a_source_changed_after_its_header_was_read_is_named(tmp_path):
    from h3render.engine import convert

    a = np.arange(4, dtype=np.float32)
    src, st = _source(tmp_path, _file({"w.bias": _t("F32", [4], 0, 16)}, a.tobytes()))
    (t,) = convert._read_safetensors_header(st)
    np.testing.assert_array_equal(convert._load(t), a)
    st.write_bytes(_file({"w.bias": _t("F32", [2], 0, 8)}, a[:2].tobytes()))  # replaced meanwhile
    with pytest.raises(ConvertError, match=rf"{st}: changed while being converted"):
        convert._load(t)
