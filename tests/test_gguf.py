"""GGUF reader (csrc/gguf.c) against gguf-py, and a fuzz test of its validation.

Files are written with gguf-py's GGUFWriter; what our reader returns (metadata
of every value type, tensor names, types, dims and data bytes) must agree with
gguf-py's GGUFReader. The fuzz test then feeds the reader a few hundred broken
files: random byte flips, targeted corruptions of each header field (counts,
string and array lengths, value types, n_dims, dims, tensor types, offsets,
alignment, duplicates) and truncations at every header length plus sampled
data lengths. Each must be rejected with a message naming the file (or, where
the mutation is harmless, accepted), and none may crash: the files are checked
in a child process so a crash fails the test with the offending file saved
under tests/_artifacts/gguf_fuzz/.
"""

from __future__ import annotations

import ctypes as C
import json
import os
import random
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter

import gguf_fuzz_child
from gguf_fuzz_child import core_lib, last_error

ERR_IO, ERR_FORMAT = -1, -2
ARTIFACTS = Path(__file__).parent / "_artifacts" / "gguf_fuzz"

# ---------------------------------------------------------------- writing files

V = GGUFValueType
METADATA: list[tuple[str, object, GGUFValueType, GGUFValueType | None]] = [
    ("k.u8", 200, V.UINT8, None),
    ("k.i8", -100, V.INT8, None),
    ("k.u16", 60000, V.UINT16, None),
    ("k.i16", -30000, V.INT16, None),
    ("k.u32", 4_000_000_000, V.UINT32, None),
    ("k.i32", -2_000_000_000, V.INT32, None),
    ("k.u64", 2**63 - 5, V.UINT64, None),
    ("k.i64", -(2**62), V.INT64, None),
    ("k.f32", 0.1, V.FLOAT32, None),
    ("k.f64", 1e-300, V.FLOAT64, None),
    ("k.bt", True, V.BOOL, None),
    ("k.bf", False, V.BOOL, None),
    ("k.str", "Wan 2.1 — ünïcode", V.STRING, None),
    ("k.empty", "", V.STRING, None),
    ("k.ai", [3, -1, 4, 1, 5], V.ARRAY, V.INT32),
    ("k.au", [2**40, 7], V.ARRAY, V.UINT64),
    ("k.af", [0.5, -2.25, 1e-3], V.ARRAY, V.FLOAT64),
    ("k.af32", [0.1, 3.0], V.ARRAY, V.FLOAT32),
    ("k.as", ["a", "bc", ""], V.ARRAY, V.STRING),
    ("k.huge", 2**64 - 1, V.UINT64, None),
]


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w.a": rng.standard_normal((3, 5)).astype(np.float32),
        "w.b": rng.standard_normal((4, 6)).astype(np.float16),
        "w.c": rng.standard_normal(7).astype(np.float32),
        "w.d": rng.standard_normal((2, 3, 5)).astype(np.float32),
        "w.e": rng.standard_normal((1, 2, 1, 3)).astype(np.float16),
    }


def write_gguf(path: Path, *, alignment: int | None = None, endian=GGUFEndian.LITTLE,
               metadata=METADATA, arrays: dict[str, np.ndarray] | None = None) -> Path:
    w = GGUFWriter(str(path), "h3r-test", endianess=endian)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, val, vt, sub in metadata:
        w.add_key_value(key, val, vt, sub)
    for name, arr in (tensors() if arrays is None else arrays).items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class Gguf:
    """Our reader, through the test exports."""

    def __init__(self, path: Path):
        self.lib = core_lib()
        self.path = path
        h = C.c_void_p()
        rc = self.lib.h3r_test_gguf_open(str(path).encode(), C.byref(h))
        assert rc == 0, last_error()
        self.h = h

    def close(self):
        self.lib.h3r_test_gguf_close(self.h)

    def tensors(self) -> dict[str, tuple[int, int, tuple[int, ...], bytes]]:
        out = {}
        for i in range(self.lib.h3r_test_gguf_n_tensors(self.h)):
            name, typ, nd = C.c_char_p(), C.c_int(), C.c_int()
            ne = (C.c_int64 * 4)()
            data, nbytes = C.c_void_p(), C.c_uint64()
            rc = self.lib.h3r_test_gguf_tensor(self.h, i, C.byref(name), C.byref(typ), C.byref(nd), ne,
                                               C.byref(data), C.byref(nbytes))
            assert rc == 0, last_error()
            out[name.value.decode()] = (typ.value, nd.value, tuple(ne), C.string_at(data.value, nbytes.value),
                                        data.value)
        return out

    def call(self, fn: str, key: str, *out):
        return getattr(self.lib, f"h3r_test_gguf_{fn}")(self.h, key.encode(), *out)

    def int(self, key):
        v = C.c_int64()
        rc = self.call("get_int", key, C.byref(v))
        return (rc, v.value if rc == 0 else last_error())

    def float(self, key):
        v = C.c_double()
        rc = self.call("get_float", key, C.byref(v))
        return (rc, v.value if rc == 0 else last_error())

    def bool(self, key):
        v = C.c_int()
        rc = self.call("get_bool", key, C.byref(v))
        return (rc, bool(v.value) if rc == 0 else last_error())

    def str(self, key):
        p, n = C.c_void_p(), C.c_uint64()
        rc = self.call("get_str", key, C.byref(p), C.byref(n))
        return (rc, C.string_at(p.value, n.value).decode() if rc == 0 else last_error())

    def array(self, key, kind: str, max_n: int = 16):
        n = C.c_int()
        buf = np.zeros(max_n, np.int64 if kind == "int" else np.float64)
        rc = self.call(f"get_{kind}_array", key, buf.ctypes.data, max_n, C.byref(n))
        return (rc, buf[: n.value].tolist() if rc == 0 else last_error())


@pytest.fixture
def valid(tmp_path) -> Path:
    return write_gguf(tmp_path / "valid.gguf")


# ---------------------------------------------------------------- agreement with gguf-py

def test_reader_agrees_with_gguf_py(valid):
    ref = GGUFReader(str(valid))
    g = Gguf(valid)
    try:
        ours = g.tensors()
        assert sorted(ours) == sorted(t.name for t in ref.tensors)
        first = ref.tensors[0]
        file_base = ours[first.name][4] - first.data_offset   # address of file byte 0 in our mapping
        for t in ref.tensors:
            typ, nd, ne, data, addr = ours[t.name]
            assert typ == int(t.tensor_type), t.name
            assert nd == len(t.shape), t.name
            assert ne[:nd] == tuple(int(s) for s in t.shape) and all(x == 1 for x in ne[nd:]), t.name
            assert data == t.data.tobytes(), f"{t.name}: data bytes differ"
            assert addr - file_base == t.data_offset, f"{t.name}: data at another file offset than gguf-py's"
            assert t.data_offset % 32 == 0
            assert g.lib.h3r_test_gguf_find(g.h, t.name.encode()) >= 0
        assert g.lib.h3r_test_gguf_find(g.h, b"w.zz") == -1
        # numpy shapes round-trip: ne is the reversed numpy shape
        for name, arr in tensors().items():
            typ, nd, ne, data, _ = ours[name]
            assert tuple(reversed(ne[:nd])) == arr.shape
            assert data == arr.tobytes()

        for key, val, vt, sub in METADATA:
            field = ref.fields[key]
            assert field.types[0] == vt, key
            if key == "k.huge":
                continue  # does not fit int64: checked in test_metadata_type_errors
            want = field.contents()
            if vt in (V.FLOAT32, V.FLOAT64):
                got = g.float(key)
            elif vt == V.BOOL:
                got = g.bool(key)
            elif vt == V.STRING:
                got = g.str(key)
            elif vt == V.ARRAY and sub == V.STRING:
                assert g.lib.h3r_test_gguf_has_key(g.h, key.encode()) == 1
                continue  # string arrays are validated but have no getter
            elif vt == V.ARRAY:
                got = g.array(key, "float" if sub in (V.FLOAT32, V.FLOAT64) else "int")
            else:
                got = g.int(key)
            assert got[0] == 0, got[1]
            assert got[1] == want, f"{key}: ours {got[1]!r}, gguf-py {want!r}"
        assert g.lib.h3r_test_gguf_has_key(g.h, b"general.architecture") == 1
        assert g.str("general.architecture") == (0, "h3r-test")
        assert g.lib.h3r_test_gguf_has_key(g.h, b"k.nope") == 0
    finally:
        g.close()


def test_getter_conversions(valid):
    g = Gguf(valid)
    try:
        assert g.float("k.i32") == (0, -2_000_000_000.0)       # integers read as numbers
        assert g.array("k.ai", "float") == (0, [3.0, -1.0, 4.0, 1.0, 5.0])
        n = C.c_int()
        assert g.call("get_int_array", "k.ai", None, 0, C.byref(n)) == 0   # NULL out: count query
        assert n.value == 5
    finally:
        g.close()


def test_metadata_type_errors(valid):
    g = Gguf(valid)
    try:
        cases = [
            (g.int("k.str"), ["k.str", "string", "integer"]),
            (g.int("k.missing"), ["k.missing", "missing"]),
            (g.int("k.huge"), ["k.huge", "int64"]),
            (g.float("k.str"), ["k.str", "number"]),
            (g.bool("k.u8"), ["k.u8", "uint8", "bool"]),
            (g.str("k.f32"), ["k.f32", "float32", "string"]),
            (g.array("k.ai", "int", max_n=4), ["k.ai", "5 elements", "at most 4"]),
            (g.array("k.as", "int"), ["k.as", "array of string"]),
            (g.array("k.u8", "float"), ["k.u8", "uint8"]),
        ]
        for (rc, msg), words in cases:
            assert rc == ERR_FORMAT, msg
            assert str(valid) in msg, msg
            for w in words:
                assert w in msg, f"{w!r} not in {msg!r}"
    finally:
        g.close()


def test_get_tensor_checks_shape(valid):
    g = Gguf(valid)
    idx = C.c_int()
    try:
        assert g.lib.h3r_test_gguf_get_tensor(g.h, b"w.a", 5, 3, 1, 1, C.byref(idx)) == 0
        assert idx.value == g.lib.h3r_test_gguf_find(g.h, b"w.a")
        assert g.lib.h3r_test_gguf_get_tensor(g.h, b"w.d", -1, 3, -1, -1, C.byref(idx)) == 0
        assert g.lib.h3r_test_gguf_get_tensor(g.h, b"w.a", 3, 5, 1, 1, C.byref(idx)) == ERR_FORMAT
        msg = last_error()
        assert "'w.a'" in msg and "[5, 3, 1, 1]" in msg and "[3, 5, 1, 1]" in msg and str(valid) in msg, msg
        assert g.lib.h3r_test_gguf_get_tensor(g.h, b"w.nope", -1, -1, -1, -1, C.byref(idx)) == ERR_FORMAT
        assert "'w.nope' is missing" in last_error()
    finally:
        g.close()


def test_custom_alignment_and_version2(tmp_path):
    p = write_gguf(tmp_path / "a64.gguf", alignment=64)
    g = Gguf(p)
    try:
        ref = GGUFReader(str(p))
        for t in ref.tensors:
            assert t.data_offset % 64 == 0
        assert {n: v[3] for n, v in g.tensors().items()} == {t.name: t.data.tobytes() for t in ref.tensors}
        assert g.int("general.alignment") == (0, 64)
    finally:
        g.close()
    data = bytearray(p.read_bytes())
    data[4:8] = struct.pack("<I", 2)       # v2 has the same little-endian layout
    (tmp_path / "v2.gguf").write_bytes(data)
    assert gguf_fuzz_child.check_file(tmp_path / "v2.gguf") == (0, "")


def test_rejections_name_file_and_problem(tmp_path, valid):
    data = valid.read_bytes()
    fields, header_end = walk(data)

    def mutated(name: str, fn) -> tuple[int, str]:
        b = bytearray(data)
        fn(b)
        p = tmp_path / name
        p.write_bytes(bytes(b))
        rc, msg = gguf_fuzz_child.check_file(p)
        assert str(p) in msg, msg
        return rc, msg

    def put(kind, idx, value, nth=0):
        f = [f for f in fields if f.kind == kind and (idx < 0 or f.index == idx)][nth]
        return lambda b: b.__setitem__(slice(f.off, f.off + f.size), value.to_bytes(f.size, "little"))

    last = max(GGUFReader(str(valid)).tensors, key=lambda t: t.data_offset)
    cases = [
        ("trunc.gguf", lambda b: b.__delitem__(slice(last.data_offset + 4, None)),
         ["tensor 'w.e' data", "runs past end of file"]),
        ("ndims.gguf", put("n_dims", 1, 5), ["n_dims 5", "allowed 1..4"]),
        ("ne0.gguf", put("ne", 2, 0), ["'w.c'", "ne[0] = 0"]),
        ("type.gguf", put("ttype", 0, 4), ["'w.a'", "unknown type 4"]),
        ("q8.gguf", put("ttype", 0, 8), ["'w.a'", "q8_0", "whole number of blocks"]),
        ("align.gguf", put("offset", 1, 33), ["'w.b'", "offset 33", "alignment 32"]),
        ("overlap.gguf", put("offset", 1, 0), ["overlap"]),
        ("dupname.gguf", lambda b: b.__setitem__(
            slice(*name_span(data, fields, 1)), b"w.a"), ["duplicate tensor name 'w.a'"]),
        ("dupkey.gguf", lambda b: b.__setitem__(
            slice(*key_span(data, fields, "k.i8")), b"k.u8"), ["duplicate metadata key 'k.u8'"]),
        ("magic.gguf", lambda b: b.__setitem__(slice(0, 4), b"GGML"), ["not a GGUF file"]),
        ("v1.gguf", put("version", -1, 1), ["version 1"]),
        ("v4.gguf", put("version", -1, 4), ["version 4"]),
        ("ntensors.gguf", put("n_tensors", -1, 2**40), ["tensor count 1099511627776"]),
        ("strlen.gguf", put("str_len", -1, 2**63), ["length 9223372036854775808"]),
        ("vtype.gguf", put("value_type", 3, 13), ["unknown value type 13"]),
        ("nested.gguf", put("arr_type", -1, 9), ["array of element type 9"]),
        ("arrlen.gguf", put("arr_len", -1, 2**61), ["claims 2305843009213693952"]),
        ("bool.gguf", lambda b: b.__setitem__(bool_offset(fields), 2), ["bool with value 2"]),
    ]
    for name, fn, words in cases:
        rc, msg = mutated(name, fn)
        assert rc == ERR_FORMAT, f"{name}: rc {rc}, {msg}"
        for w in words:
            assert w in msg, f"{name}: {w!r} not in {msg!r}"

    rc, msg = gguf_fuzz_child.check_file(tmp_path / "absent.gguf")
    assert rc == ERR_IO and "absent.gguf" in msg and "No such file" in msg, msg
    (tmp_path / "empty.gguf").write_bytes(b"")
    rc, msg = gguf_fuzz_child.check_file(tmp_path / "empty.gguf")
    assert rc == ERR_FORMAT and "truncated" in msg, msg
    rc, msg = gguf_fuzz_child.check_file(tmp_path)
    assert rc == ERR_IO and "not a regular file" in msg, msg


def test_big_endian_rejected(tmp_path):
    p = write_gguf(tmp_path / "be.gguf", endian=GGUFEndian.BIG,
                   arrays={"w.a": tensors()["w.a"]})
    rc, msg = gguf_fuzz_child.check_file(p)
    assert rc == ERR_FORMAT and "big-endian" in msg and str(p) in msg, msg


# ---------------------------------------------------------------- header walker

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass
class Field:
    kind: str       # magic, version, n_tensors, n_kv, key_len, value_type, str_len, arr_type,
                    # arr_len, arr_str_len, value, alignment, name_len, n_dims, ne, ttype, offset
    off: int
    size: int
    index: int      # kv or tensor index, -1 for the header
    vtype: int = -1


def walk(data: bytes) -> tuple[list[Field], int]:
    """Every field of a valid little-endian GGUF header with its byte position."""
    fields: list[Field] = []
    pos = 0

    def take(kind: str, size: int, index: int = -1, vtype: int = -1) -> int:
        nonlocal pos
        fields.append(Field(kind, pos, size, index, vtype))
        pos += size
        return int.from_bytes(data[pos - size:pos], "little")

    take("magic", 4)
    take("version", 4)
    nt = take("n_tensors", 8)
    nkv = take("n_kv", 8)
    for i in range(nkv):
        n = take("key_len", 8, i)
        key = data[pos:pos + n]
        pos += n
        t = take("value_type", 4, i)
        if t == 8:
            n = take("str_len", 8, i)
            pos += n
        elif t == 9:
            et = take("arr_type", 4, i)
            n = take("arr_len", 8, i)
            if et == 8:
                for _ in range(n):
                    m = take("arr_str_len", 8, i)
                    pos += m
            else:
                pos += n * SIZES[et]
        else:
            take("alignment" if key == b"general.alignment" else "value", SIZES[t], i, t)
    for i in range(nt):
        n = take("name_len", 8, i)  # not `pos += take(...)`: take moves pos
        pos += n
        nd = take("n_dims", 4, i)
        for _ in range(nd):
            take("ne", 8, i)
        take("ttype", 4, i)
        take("offset", 8, i)
    return fields, pos


def name_span(data: bytes, fields: list[Field], tensor: int) -> tuple[int, int]:
    f = next(f for f in fields if f.kind == "name_len" and f.index == tensor)
    return f.off + 8, f.off + 8 + int.from_bytes(data[f.off:f.off + 8], "little")


def key_span(data: bytes, fields: list[Field], key: str) -> tuple[int, int]:
    for f in fields:
        if f.kind == "key_len":
            n = int.from_bytes(data[f.off:f.off + 8], "little")
            if data[f.off + 8:f.off + 8 + n] == key.encode():
                return f.off + 8, f.off + 8 + n
    raise KeyError(key)


def bool_offset(fields: list[Field]) -> int:
    return next(f.off for f in fields if f.kind == "value" and f.vtype == 7)


# ---------------------------------------------------------------- fuzz

@dataclass
class Case:
    name: str
    data: bytes
    expect: str     # "reject", "accept" or "any" (harmless or undecidable mutation)


def fuzz_cases(base: bytes, data_start: int, data_end: int, seed: int = 1234) -> list[Case]:
    """Deterministic mutations of a valid file; data_end = end of the last tensor's bytes."""
    rnd = random.Random(seed)
    fields, header_end = walk(base)
    size = len(base)
    cases: list[Case] = []

    def set_field(f: Field, value: int) -> bytes:
        b = bytearray(base)
        b[f.off:f.off + f.size] = (value % (1 << (8 * f.size))).to_bytes(f.size, "little")
        return bytes(b)

    # 1. Targeted: values that must be rejected, then near-misses that may pass.
    big = [2**64 - 1, 2**63, 2**62 + 3, size, size * 2]
    must = {
        "magic": [0, 0x46554746],
        "version": [0, 1, 4, 0x03000000, 2**32 - 1],
        "n_tensors": big + [2**31],
        "n_kv": big,
        "key_len": big,
        "str_len": big,
        "arr_str_len": big,
        "name_len": big,
        "value_type": [13, 255, 2**32 - 1],
        "arr_type": [9, 13, 2**31],
        "arr_len": big,
        "alignment": [0, 3, 48, 2**31],
        "n_dims": [0, 5, 2**32 - 1],
        "ne": [0, 2**63, 2**64 - 1, 2**62, size],
        "ttype": [4, 5, 39, 40, 2**31],
        "offset": [2**64 - 32, 2**63, ((size // 32) + 1) * 32],
    }
    maybe = {k: ["+1", "-1", "x2"] for k in must}
    maybe["offset"] = ["+1", "+32", "-32", "x2"]
    maybe["ttype"] = [0, 1, 8, 14, 30]
    maybe["value_type"] = list(range(13))
    for f in fields:
        cur = int.from_bytes(base[f.off:f.off + f.size], "little")
        for v in must.get(f.kind, []):
            if f.kind == "ttype" and v == 8:
                continue
            cases.append(Case(f"{f.kind}{f.index}@{f.off}={v}", set_field(f, v), "reject"))
        for v in maybe.get(f.kind, []):
            nv = {"+1": cur + 1, "-1": cur - 1, "x2": cur * 2, "+32": cur + 32, "-32": cur - 32}.get(v, v)
            expect = "reject" if (f.kind == "offset" and v == "+1") else "any"
            cases.append(Case(f"{f.kind}{f.index}@{f.off}:{v}", set_field(f, nv), expect))
    # Structural: duplicate names and keys, overlapping tensors, bad bool.
    b = bytearray(base)
    s, e = name_span(base, fields, 2)
    b[s:e] = b"w.b"
    cases.append(Case("dup-name", bytes(b), "reject"))
    b = bytearray(base)
    s, e = key_span(base, fields, "k.i8")
    b[s:e] = b"k.u8"
    cases.append(Case("dup-key", bytes(b), "reject"))
    offs = [f for f in fields if f.kind == "offset"]
    cases.append(Case("overlap", set_field(offs[3], int.from_bytes(base[offs[2].off:offs[2].off + 8], "little")),
                      "reject"))
    b = bytearray(base)
    b[bool_offset(fields)] = 2
    cases.append(Case("bool=2", bytes(b), "reject"))

    # 2. Random byte flips: in the header (anything may happen), in tensor data (harmless).
    for i in range(200):
        b = bytearray(base)
        for _ in range(rnd.randint(1, 3)):
            b[rnd.randrange(header_end)] = rnd.randrange(256)
        cases.append(Case(f"flip-header-{i}", bytes(b), "any"))
    for i in range(40):
        b = bytearray(base)
        for _ in range(rnd.randint(1, 8)):
            b[rnd.randrange(data_start, data_end)] = rnd.randrange(256)
        cases.append(Case(f"flip-data-{i}", bytes(b), "accept"))

    # 3. Truncation: every length through the header and padding, a sample of data lengths.
    lengths = list(range(0, data_start + 1)) + sorted(rnd.sample(range(data_start + 1, size), 60)) + [size]
    for n in lengths:
        cases.append(Case(f"truncate-{n}", base[:n], "accept" if n >= data_end else "reject"))
    cases.append(Case("appended", base + b"\0" * 100, "accept"))
    return cases


def test_fuzz_mutated_and_truncated_files(tmp_path, valid):
    cases = []
    # Two bases: the default alignment, and general.alignment = 64 (whose value is fuzzed too).
    for seed, path in ((1234, valid), (99, write_gguf(tmp_path / "a64.gguf", alignment=64))):
        base = path.read_bytes()
        ref = GGUFReader(str(path))
        data_start = min(t.data_offset for t in ref.tensors)
        data_end = max(t.data_offset + t.n_bytes for t in ref.tensors)
        cases += [Case(f"{path.stem}:{c.name}", c.data, c.expect) for c in fuzz_cases(base, data_start, data_end, seed)]
    files = []
    d = tmp_path / "fuzz"
    d.mkdir()
    for i, c in enumerate(cases):
        p = d / f"{i:05d}.gguf"
        p.write_bytes(c.data)
        files.append(p)
    manifest = tmp_path / "manifest.txt"
    manifest.write_text("\n".join(str(p) for p in files) + "\n")

    child = Path(gguf_fuzz_child.__file__)
    proc = subprocess.run([sys.executable, str(child), str(manifest)], capture_output=True, text=True,
                          env=dict(os.environ), cwd=child.parent, timeout=600)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or len(results) != len(cases):
        bad = len(results)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        saved = ARTIFACTS / f"crash-{cases[bad].name.replace('/', '_')}.gguf" if bad < len(cases) else None
        if saved:
            shutil.copy(files[bad], saved)
        pytest.fail(f"fuzz child exited with {proc.returncode} after {bad}/{len(cases)} files; "
                    f"offending case {cases[bad].name if saved else '?'} saved to {saved}\n"
                    f"stderr tail:\n{proc.stderr[-3000:]}")

    counts = {"rejected": 0, "accepted": 0}
    failures = []
    for c, p, r in zip(cases, files, results):
        if r["rc"] == 0:
            counts["accepted"] += 1
            if c.expect == "reject":
                failures.append(f"{c.name}: accepted, expected a rejection")
        else:
            counts["rejected"] += 1
            if c.expect == "accept":
                failures.append(f"{c.name}: rejected ({r['msg']}), expected acceptance")
            if r["rc"] not in (ERR_FORMAT, ERR_IO) or not r["msg"] or str(p) not in r["msg"]:
                failures.append(f"{c.name}: rc {r['rc']}, message {r['msg']!r} does not name the file")
    by_expect = {k: sum(c.expect == k for c in cases) for k in ("reject", "accept", "any")}
    print(f"GGUF fuzz: {len(cases)} files ({by_expect}); rejected {counts['rejected']}, "
          f"accepted {counts['accepted']}")
    assert not failures, "\n".join(failures[:20])
    assert by_expect["reject"] >= 300
