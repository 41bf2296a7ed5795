"""Convert a diffusers-layout Wan 2.1 pipeline folder into an h3render model directory.

Source layout (as Wan-AI/Wan2.1-T2V-1.3B-Diffusers): ``transformer/``,
``text_encoder/``, ``vae/``, ``tokenizer/``, ``scheduler/``; each model folder has a
``config.json`` and one or more ``*.safetensors`` (sharded with an index or not).
Any component may be absent, so a folder holding only ``transformer/`` converts
too (the numerics tests use that).

Destination: one GGUF file per component and quant level,
``transformer-<quant>.gguf``, ``text_encoder-<tq>.gguf``, ``vae-<tq>.gguf``, plus
``tokenizer.json`` and ``model.json``. The text encoder and the VAE are small and
precision-sensitive, so they are written at F32 for the f32 level and F16 for
every other level (``tq``).

Inside each GGUF:
  - tensors keep their diffusers/transformers names;
  - every scalar or list in the component's config.json is stored as ``h3r.<key>``
    (int64, float64, bool, string, or arrays of int64/float64);
  - tensors of 3 or more dims named ``*.weight`` (convolutions) are flattened to
    2-D (dim0, prod(rest)), the layout a conv-as-matmul wants, and their original
    shape is stored as ``h3r.shape.<name>``;
  - pipeline values the C engine needs are stored as ``h3r.pipeline.<key>``.

Tensors are streamed one at a time from the safetensors files to the GGUF file,
so converting a large checkpoint does not need its size in memory.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from h3render.engine.exceptions import ConvertError

COMPONENTS: dict[str, str] = {
    "transformer": "wan_dit",
    "text_encoder": "umt5",
    "vae": "wan_vae",
}
QUANT_LEVELS = ("f32", "f16", "q8_0", "q6_k", "q4_0")
# Block-quantized levels (GGML layouts, see h3render/engine/quantize.py): only the
# transformer is quantized, and within it only 2-D linear weights.
QUANTIZED_LEVELS = ("q8_0", "q6_k", "q4_0")
QUANT_BLOCK = {"q8_0": 32, "q6_k": 256, "q4_0": 32}
QUANT_BLOCK_BYTES = {"q8_0": 34, "q6_k": 210, "q4_0": 18}
DEFAULT_TEXT_LEN = 512  # WanPipeline's max_sequence_length
DEFAULT_FPS = 16
# Below this many elements a weight stays F32: the saving is nil and the
# rounding lands on layers (embeddings of tiny vocabularies, biases tables)
# that are cheap to keep exact.
F16_MIN_ELEMENTS = 1024


@dataclass
class ConvertReport:
    dst: Path
    files: dict[str, int] = field(default_factory=dict)  # file name -> bytes


def component_quant(component: str, quant: str) -> str:
    """Quant level of the file a component is stored at for a requested level."""
    if component == "transformer":
        return quant
    return "f32" if quant == "f32" else "f16"


# ---------------------------------------------------------------- safetensors
# The files are read by safetensors.safe_open: its Rust parser checks the header of an
# untrusted file (length bound, JSON schema, dtypes, shapes against offsets, tensors
# that overlap or leave gaps, data that does not cover the file exactly) before any
# byte of data is touched, and maps the file instead of reading it. Its errors name no
# file, so each is re-raised as a ConvertError that does. One gap is ours to fill:
# safe_open's numpy framework cannot return BF16 (numpy has no bfloat16), so a BF16
# tensor is mapped from the byte offsets of the header safe_open has already checked.

_ST_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to f32 by shifting into the high half
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
}


@dataclass
class _SourceTensor:
    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    stamp: tuple[int, int]  # the file's (size, mtime_ns) when its header was checked
    data: tuple[int, int] | None = None  # BF16 only: absolute byte range of its data


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _open(path: Path):
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="np")
    except (SafetensorError, OSError) as exc:
        raise ConvertError(f"{path}: not a valid safetensors file: {exc}") from None


def _read_safetensors_header(path: Path) -> list[_SourceTensor]:
    """Tensor index of one .safetensors file, checked by safetensors itself."""
    stamp = _stamp(path)
    with _open(path) as f:
        tensors = []
        for name in f.keys():
            sl = f.get_slice(name)
            dtype, shape = sl.get_dtype(), tuple(int(d) for d in sl.get_shape())
            if dtype not in _ST_DTYPES:
                raise ConvertError(
                    f"{path}: tensor '{name}' has dtype {dtype}; supported: {', '.join(_ST_DTYPES)}"
                )
            tensors.append(_SourceTensor(name, path, dtype, shape, stamp))
    if any(t.dtype == "BF16" for t in tensors):
        with open(path, "rb") as fh:  # the header safe_open has just accepted
            (hlen,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(hlen))
        for t in tensors:
            if t.dtype == "BF16":
                begin, end = header[t.name]["data_offsets"]
                t.data = (8 + hlen + begin, 8 + hlen + end)
    return tensors


def _source_tensors(folder: Path) -> list[_SourceTensor]:
    files = sorted(folder.glob("*.safetensors"))
    index = next(iter(sorted(folder.glob("*.safetensors.index.json"))), None)
    if index is not None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConvertError(f"{index}: not a safetensors index ({exc})") from None
        files = []
        for shard in sorted(set(weight_map.values())):
            shard_path = folder / shard
            if not shard_path.is_file():
                raise ConvertError(f"{index}: shard '{shard}' is missing")
            files.append(shard_path)
    if not files:
        raise ConvertError(f"{folder}: no .safetensors files")
    tensors: dict[str, _SourceTensor] = {}
    for path in files:
        for t in _read_safetensors_header(path):
            if t.name in tensors:
                raise ConvertError(f"{path}: tensor '{t.name}' also in {tensors[t.name].path}")
            tensors[t.name] = t
    return [tensors[k] for k in sorted(tensors)]


def _load(t: _SourceTensor) -> np.ndarray:
    """One tensor as float32. The file must be the one whose header was checked: a file
    changed since then is refused, naming it, rather than read at stale offsets."""
    from safetensors import SafetensorError

    try:
        if _stamp(t.path) != t.stamp:
            raise ConvertError(f"{t.path}: changed while being converted; convert again")
        if t.data is not None:  # BF16: numpy has no bfloat16, so safe_open cannot return it
            begin, end = t.data
            mm = np.memmap(t.path, dtype=np.uint8, mode="r", offset=begin, shape=(end - begin,))
            u16 = np.frombuffer(mm, np.dtype("<u2")).reshape(t.shape)
            return (u16.astype(np.uint32) << 16).view(np.float32)
        with _open(t.path) as f:
            arr = f.get_tensor(t.name)
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise ConvertError(f"{t.path}: tensor '{t.name}' cannot be read: {exc}") from None
    return np.asarray(arr, dtype=np.float32)


# ---------------------------------------------------------------- GGUF writing


def _target_layout(t: _SourceTensor, quant: str) -> tuple[tuple[int, ...], str]:
    """Stored numpy shape and type name ("f32", "f16", "q8_0", "q6_k", "q4_0") of one tensor.

    At a quantized level a 2-D weight of >= F16_MIN_ELEMENTS whose rows are a whole
    number of blocks takes that level's type; Q6_K rows that are not a multiple of
    256 but are of 32 fall back to the more precise Q8_0 (as llama.cpp does); any
    other weight is stored F16, and norms, biases and small tensors stay F32.
    """
    shape = t.shape
    if t.name.endswith(".weight") and len(shape) >= 3:
        shape = (shape[0], int(np.prod(shape[1:])))
    if len(shape) > 4:
        raise ConvertError(f"{t.path}: tensor '{t.name}' has {len(shape)} dims; GGUF allows 4")
    numel = int(np.prod(shape))
    if (
        quant in ("f16",) + QUANTIZED_LEVELS
        and t.name.endswith(".weight")
        and len(shape) == 2
        and numel >= F16_MIN_ELEMENTS
    ):
        if quant in QUANTIZED_LEVELS:
            if shape[1] % QUANT_BLOCK[quant] == 0:
                return shape, quant
            if quant == "q6_k" and shape[1] % QUANT_BLOCK["q8_0"] == 0:
                return shape, "q8_0"
        return shape, "f16"
    return shape, "f32"


def _add_config(writer, config: dict, prefix: str = "h3r.") -> None:
    from gguf import GGUFValueType as VT

    for key, value in sorted(config.items()):
        if key.startswith("_") or value is None:
            continue
        name = prefix + key
        if isinstance(value, bool):
            writer.add_key_value(name, value, VT.BOOL)
        elif isinstance(value, int):
            writer.add_key_value(name, value, VT.INT64)
        elif isinstance(value, float):
            writer.add_key_value(name, value, VT.FLOAT64)
        elif isinstance(value, str):
            writer.add_key_value(name, value, VT.STRING)
        elif isinstance(value, (list, tuple)) and value:
            flat = list(_flatten(value))
            if all(isinstance(v, bool) for v in flat):
                writer.add_key_value(name, [int(v) for v in flat], VT.ARRAY, VT.INT64)
            elif all(isinstance(v, int) for v in flat):
                writer.add_key_value(name, flat, VT.ARRAY, VT.INT64)
            elif all(isinstance(v, (int, float)) for v in flat):
                writer.add_key_value(name, [float(v) for v in flat], VT.ARRAY, VT.FLOAT64)
            elif all(isinstance(v, str) for v in flat):
                writer.add_key_value(name, flat, VT.ARRAY, VT.STRING)
        # nested dicts carry nothing the engine reads


def _flatten(values) -> Iterator:
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flatten(v)
        else:
            yield v


def write_component(
    folder: Path, out_path: Path, arch: str, quant: str, name: str, pipeline: dict
) -> int:
    """Write one component's GGUF file atomically; returns its size in bytes."""
    import gguf
    from gguf import GGUFValueType as VT

    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ConvertError(f"{config_path}: missing") from None
    except json.JSONDecodeError as exc:
        raise ConvertError(f"{config_path}: not valid JSON: {exc}") from None
    tensors = _source_tensors(folder)

    tmp = out_path.with_name(out_path.name + ".tmp")
    writer = gguf.GGUFWriter(tmp, arch)
    writer.add_name(name)
    writer.add_key_value("h3r.quant", quant, VT.STRING)
    _add_config(writer, config)
    _add_config(writer, pipeline, prefix="h3r.pipeline.")
    layouts = []
    for t in tensors:
        shape, ttype = _target_layout(t, quant)
        if shape != t.shape:
            writer.add_key_value(f"h3r.shape.{t.name}", list(t.shape), VT.ARRAY, VT.INT64)
        if ttype in QUANTIZED_LEVELS:
            nbytes = shape[0] * (shape[1] // QUANT_BLOCK[ttype]) * QUANT_BLOCK_BYTES[ttype]
            raw = getattr(gguf.GGMLQuantizationType, ttype.upper())
            writer.add_tensor_info(t.name, shape, np.dtype(np.float32), nbytes, raw_dtype=raw)
            layouts.append((t, shape, ttype))
            continue
        dtype = np.dtype(np.float16 if ttype == "f16" else np.float32)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        writer.add_tensor_info(t.name, shape, dtype, nbytes)
        layouts.append((t, shape, dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    try:
        for t, shape, dtype in layouts:
            data = _load(t).reshape(shape)
            if not np.all(np.isfinite(data)):
                raise ConvertError(f"{t.path}: tensor '{t.name}' contains NaN or Inf")
            if isinstance(dtype, str):  # a quantized level: GGML blocks as bytes
                from h3render.engine.quantize import quantize

                writer.write_tensor_data(np.ascontiguousarray(quantize(data, dtype)))
                continue
            writer.write_tensor_data(np.ascontiguousarray(data.astype(dtype)))
    except BaseException:  # a source that fails half way leaves no temporary file
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    os.replace(tmp, out_path)
    return out_path.stat().st_size


def _pipeline_values(src: Path, text_len: int | None) -> dict:
    """Pipeline-level defaults: h3render.json if the source ships one, else Wan's."""
    values: dict = {"text_len": DEFAULT_TEXT_LEN, "fps": DEFAULT_FPS}
    extra = src / "h3render.json"
    if extra.is_file():
        values.update(json.loads(extra.read_text()))
    sched = src / "scheduler" / "scheduler_config.json"
    if sched.is_file():
        shift = json.loads(sched.read_text()).get("flow_shift") or json.loads(
            sched.read_text()
        ).get("shift")
        if shift is not None:
            values.setdefault("shift", float(shift))
    if text_len is not None:
        values["text_len"] = int(text_len)
    return values


def convert_pipeline(
    src: Path | str,
    dst: Path | str,
    quants: list[str] | tuple[str, ...] = ("f16",),
    *,
    name: str | None = None,
    text_len: int | None = None,
) -> ConvertReport:
    """Convert `src` (diffusers layout) into the model directory `dst`.

    Raises ConvertError naming the file and the problem when the source is
    unusable or a quant level is unknown.
    """
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise ConvertError(f"{src}: not a directory")
    quants = [q.strip().lower() for q in quants if q.strip()]
    for q in quants:
        if q not in QUANT_LEVELS:
            raise ConvertError(f"quant level '{q}' is not supported; choose from {', '.join(QUANT_LEVELS)}")
    if not quants:
        raise ConvertError(f"no quant level given; choose from {', '.join(QUANT_LEVELS)}")
    present = [c for c in COMPONENTS if (src / c).is_dir()]
    if not present:
        raise ConvertError(f"{src}: none of {', '.join(COMPONENTS)} found (is it a diffusers pipeline folder?)")

    name = name or src.name
    pipeline = _pipeline_values(src, text_len)
    dst.mkdir(parents=True, exist_ok=True)
    report = ConvertReport(dst)
    for component in present:
        for level in sorted({component_quant(component, q) for q in quants}):
            out = dst / f"{component}-{level}.gguf"
            report.files[out.name] = write_component(
                src / component, out, COMPONENTS[component], level, name, pipeline
            )

    tok = src / "tokenizer" / "tokenizer.json"
    if tok.is_file():
        shutil.copyfile(tok, dst / "tokenizer.json")
        report.files["tokenizer.json"] = tok.stat().st_size
    levels = sorted(
        {p.name[len("transformer-") : -len(".gguf")] for p in dst.glob("transformer-*.gguf")}
    )
    model = {
        "name": name,
        "architecture": "wan2.1",
        "quant_levels": levels,
        "pipeline": pipeline,
        "source": src.name,
    }
    tmp = dst / "model.json.tmp"
    tmp.write_text(json.dumps(model, indent=2) + "\n")
    os.replace(tmp, dst / "model.json")
    return report
