"""Inspect an H3 snapshot without loading it: safetensors headers, shard index, bytes per component.

An H3 model directory is the Hugging Face snapshot h3.c reads:

    <dir>/FL2VA/                     prompt and first/last-frame model (required)
        transformer/config.json
        transformer/model.safetensors.index.json + model-0000N-of-0000M.safetensors
        text_encoder/*.safetensors   (optionally indexed too)
        video_vae/source/*.safetensors
        audio_vae/*.safetensors
        tokenizer/tokenizer.json
    <dir>/Ref2VA/                    ordered-reference model (optional, same layout;
                                     h3.c uses it when its transformer index exists)

For every shard the header length is checked against the file size first
(`8 + header + the last tensor's end` must equal the file's bytes: a shorter
file is a truncated download), then the header is read with the `safetensors`
package. With an index, every shard it names must exist and hold the tensors it
maps there. Each problem names the file. Only headers are read: a 37 GiB DiT is
inspected in milliseconds.
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from h3render.engine.exceptions import ModelFileError

VARIANTS = ("FL2VA", "Ref2VA")
COMPONENTS = ("text_encoder", "transformer", "video_vae", "audio_vae")
COMPONENT_DIRS = {"text_encoder": "text_encoder", "transformer": "transformer",
                  "video_vae": "video_vae/source", "audio_vae": "audio_vae"}
REQUIRED_FILES = ("transformer/config.json", "tokenizer/tokenizer.json")  # per variant, as h3_load_dir checks
INDEX_SUFFIX = ".safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit


class Problem(BaseModel):
    """One defect that stops h3.c or corrupts its output; `file` is the file to fix."""

    model_config = ConfigDict(frozen=True)
    kind: str  # truncated_shard, bad_header, missing_shard, broken_index, missing_file, missing_dir, no_weights
    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


class Shard(BaseModel):
    model_config = ConfigDict(frozen=True)
    file: str
    file_bytes: int
    tensor_bytes: int
    tensors: int


class Component(BaseModel):
    """One folder of weights (e.g. FL2VA/transformer) and what its headers say."""

    variant: str
    name: str
    path: str
    indexed: bool = False
    shards: list[Shard] = Field(default_factory=list)
    dtypes: dict[str, int] = Field(default_factory=dict)  # dtype -> tensor count

    @property
    def file_bytes(self) -> int:
        return sum(s.file_bytes for s in self.shards)

    @property
    def tensor_bytes(self) -> int:
        return sum(s.tensor_bytes for s in self.shards)

    @property
    def tensors(self) -> int:
        return sum(s.tensors for s in self.shards)


class InspectReport(BaseModel):
    root: str
    components: list[Component] = Field(default_factory=list)
    problems: list[Problem] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def component(self, variant: str, name: str) -> Component | None:
        return next((c for c in self.components if c.variant == variant and c.name == name), None)

    def dit_bytes(self, variant: str = "FL2VA") -> int:
        """Tensor bytes of a variant's DiT (the input of the memory estimate)."""
        c = self.component(variant, "transformer")
        return c.tensor_bytes if c else 0

    def bytes_by_component(self) -> dict[str, int]:
        """'FL2VA/transformer' -> bytes on disk."""
        return {f"{c.variant}/{c.name}": c.file_bytes for c in self.components}

    def to_json(self) -> dict:
        return {
            "root": self.root,
            "ok": self.ok,
            "components": [
                {"variant": c.variant, "name": c.name, "path": c.path, "indexed": c.indexed, "files": len(c.shards),
                 "tensors": c.tensors, "file_bytes": c.file_bytes, "tensor_bytes": c.tensor_bytes,
                 "dtypes": c.dtypes}
                for c in self.components
            ],
            "problems": [p.model_dump() for p in self.problems],
            "warnings": list(self.warnings),
        }


class ModelInspectError(ModelFileError):
    """The snapshot has problems; `report` holds them all."""

    def __init__(self, report: InspectReport):
        self.report = report
        super().__init__(f"{report.root}: " + "; ".join(str(p) for p in report.problems))


class _ShardError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


# ---------------------------------------------------------------- one shard


def check_shard_size(path: Path) -> tuple[int, dict]:
    """Header length and data extent vs the file size; returns (file bytes, header dict).

    The layout is: u64 little-endian N, N bytes of JSON, then the tensor data;
    each tensor's data_offsets are relative to the data start. Raises
    _ShardError naming expected and actual sizes.
    """
    size = path.stat().st_size
    if size < 8:
        raise _ShardError("truncated_shard", f"{size} bytes is shorter than the 8-byte header length")
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise _ShardError("truncated_shard", f"header length {n} runs past the end of the file "
                                                 f"({size} bytes; truncated download?)")
        if n > MAX_HEADER_BYTES:
            raise _ShardError("bad_header", f"header length {n} exceeds the safetensors limit {MAX_HEADER_BYTES}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _ShardError("bad_header", f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _ShardError("bad_header", "header is not a JSON object")
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        offs = t.get("data_offsets") if isinstance(t, dict) else None
        if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)
                or not 0 <= offs[0] <= offs[1]):
            raise _ShardError("bad_header", f"tensor {name!r} has bad data_offsets {offs!r}")
        end = max(end, offs[1])
    expected = 8 + n + end
    if size < expected:
        raise _ShardError("truncated_shard", f"truncated: the header says the data ends at byte {expected} "
                                             f"but the file has {size} bytes ({expected - size} missing)")
    if size > expected:
        raise _ShardError("bad_header", f"{size - expected} bytes after the last tensor (file {size} bytes, "
                                        f"header says {expected})")
    return size, header


def read_shard(path: Path) -> tuple[Shard, dict[str, str]]:
    """Check one shard and read its header with the safetensors package.

    Returns the Shard and {tensor name: dtype}. Raises _ShardError.
    """
    from safetensors import SafetensorError, safe_open

    size, header = check_shard_size(path)
    tensor_bytes = sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items() if k != "__metadata__")
    try:
        with safe_open(str(path), framework="numpy") as f:
            names = list(f.keys())
            dtypes = {k: str(f.get_slice(k).get_dtype()) for k in names}
    except SafetensorError as exc:
        raise _ShardError("bad_header", f"safetensors cannot read the header: {exc}") from None
    except OSError as exc:
        raise _ShardError("bad_header", f"cannot read: {exc}") from None
    if set(names) != {k for k in header if k != "__metadata__"}:
        raise _ShardError("bad_header", "the safetensors package and the raw header disagree on the tensor names")
    return Shard(file=path.name, file_bytes=size, tensor_bytes=tensor_bytes, tensors=len(names)), dtypes


# ---------------------------------------------------------------- one component


def _rel(root: Path, p: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def inspect_component(root: Path, variant: str, name: str, report: InspectReport, required: bool) -> None:
    """Read every shard of one component folder (and its index) into the report."""
    folder = root / variant / COMPONENT_DIRS[name]
    label = f"{variant}/{COMPONENT_DIRS[name]}"
    if not folder.is_dir():
        if required:
            report.problems.append(Problem(kind="missing_dir", file=label, message="folder is missing"))
        else:
            report.warnings.append(f"{label}: folder is missing; {variant} renders will fail")
        return
    comp = Component(variant=variant, name=name, path=label)
    report.components.append(comp)
    files = sorted(p for p in folder.iterdir() if p.name.endswith(".safetensors") and not p.name.startswith("."))
    indexes = sorted(folder.glob("*" + INDEX_SUFFIX))
    dtypes: Counter[str] = Counter()
    names_by_shard: dict[str, set[str]] = {}
    for path in files:
        try:
            shard, tdt = read_shard(path)
        except _ShardError as exc:
            report.problems.append(Problem(kind=exc.kind, file=_rel(root, path), message=str(exc)))
            continue
        except OSError as exc:
            report.problems.append(Problem(kind="bad_header", file=_rel(root, path), message=f"cannot read: {exc}"))
            continue
        comp.shards.append(shard)
        dtypes.update(tdt.values())
        names_by_shard[path.name] = set(tdt)
    comp.dtypes = dict(sorted(dtypes.items()))

    for index in indexes:
        comp.indexed = True
        _check_index(root, index, files, names_by_shard, report)
    if len(indexes) > 1:
        report.warnings.append(f"{label}: {len(indexes)} index files; h3.c loads every shard in the folder")
    if not files and not any(p.kind == "missing_shard" for p in report.problems if p.file.startswith(label)):
        report.problems.append(Problem(kind="no_weights", file=label, message="no .safetensors files"))
    if name == "transformer" and not indexes and files:
        report.warnings.append(f"{label}: no model.safetensors.index.json, so a missing shard cannot be detected"
                               + ("; h3.c uses Ref2VA only when this index exists" if variant == "Ref2VA" else ""))


def _check_index(root: Path, index: Path, files: list[Path], names_by_shard: dict[str, set[str]],
                 report: InspectReport) -> None:
    """Check an index against the shards: every shard it names exists and holds the tensors it maps."""
    rel = _rel(root, index)
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        report.problems.append(Problem(kind="broken_index", file=rel, message=f"not valid JSON ({exc})"))
        return
    wmap = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        report.problems.append(Problem(kind="broken_index", file=rel,
                                       message="has no weight_map object mapping tensor names to shard files"))
        return
    expected: dict[str, list[str]] = {}
    for tensor, shard in wmap.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors") or os.sep in shard or shard.startswith("."):
            report.problems.append(Problem(kind="broken_index", file=rel,
                                           message=f"weight_map[{tensor!r}] = {shard!r} is not a shard file name"))
            return
        expected.setdefault(shard, []).append(tensor)
    present = {p.name for p in files}
    for shard in sorted(expected):
        if shard not in present:
            report.problems.append(Problem(
                kind="missing_shard", file=_rel(root, index.parent / shard),
                message=f"missing: {rel} maps {len(expected[shard])} tensors to it",
            ))
            continue
        have = names_by_shard.get(shard)
        if have is None:
            continue  # the shard itself is broken and already reported
        absent = [t for t in expected[shard] if t not in have]
        if absent:
            report.problems.append(Problem(
                kind="broken_index", file=rel,
                message=f"maps {len(absent)} tensors to {shard} that its header does not have "
                        f"(first: {absent[0]!r})",
            ))
    for shard in sorted(present - set(expected)):
        report.warnings.append(f"{_rel(root, index.parent / shard)}: not named by {rel}; "
                               "h3.c loads every .safetensors in the folder")
    mapped = set(wmap)
    for shard, names in sorted(names_by_shard.items()):
        extra = names - mapped
        if extra and shard in expected:
            report.warnings.append(f"{_rel(root, index.parent / shard)}: {len(extra)} tensors not in {rel}")
    total = data.get("metadata", {}).get("total_size") if isinstance(data.get("metadata"), dict) else None
    if isinstance(total, int) and not any(s not in names_by_shard for s in expected):
        got = 0
        for shard in expected:
            p = index.parent / shard
            try:
                _, header = check_shard_size(p)
            except (_ShardError, OSError):
                return
            got += sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items() if k != "__metadata__")
        if got != total:
            report.warnings.append(f"{rel}: metadata.total_size is {total} but the shards hold {got} tensor bytes")


# ---------------------------------------------------------------- the snapshot


def inspect_model_dir(root: str | os.PathLike) -> InspectReport:
    """Inspect an H3 snapshot; never raises for a defect in it (see report.problems)."""
    root = Path(root)
    report = InspectReport(root=str(root))
    if not root.is_dir():
        report.problems.append(Problem(kind="missing_dir", file=str(root), message="is not a directory"))
        return report
    if not (root / "FL2VA").is_dir():
        hint = ""
        if (root / "transformer").is_dir():
            hint = "; this looks like one variant's folder: pass its parent, the snapshot root"
        report.problems.append(Problem(kind="missing_dir", file="FL2VA",
                                       message=f"not an H3 snapshot: no FL2VA/ folder in {root}{hint}"))
        return report
    for variant in VARIANTS:
        vdir = root / variant
        if not vdir.is_dir():
            if variant == "Ref2VA":
                report.warnings.append("Ref2VA/ is absent: prompt and first/last-frame renders only (no references)")
            continue
        required = variant == "FL2VA"
        for rel in REQUIRED_FILES:
            if not (vdir / rel).is_file():
                if required:
                    report.problems.append(Problem(kind="missing_file", file=f"{variant}/{rel}",
                                                   message="required by h3.c and missing"))
                else:
                    report.warnings.append(f"{variant}/{rel}: missing; {variant} renders will fail")
        for name in COMPONENTS:
            inspect_component(root, variant, name, report, required=required)
    return report


def check_model_dir(root: str | os.PathLike) -> InspectReport:
    """inspect_model_dir, raising ModelInspectError when the snapshot has any problem."""
    report = inspect_model_dir(root)
    if not report.ok:
        raise ModelInspectError(report)
    return report
