"""Model directories: listing, name resolution and the built-in default model.

A model lives in $H3RENDER_HOME/models/<name>/:

    transformer-<quant>.gguf   one per quant level (f32, f16, ...)
    text_encoder-<quant>.gguf  UMT5 encoder
    vae-<quant>.gguf           Wan VAE decoder
    tokenizer.json             for h3render.engine.tokenize
    model.json                 {"name", "architecture", "quant_levels", "pipeline", "source"}

(the converter, h3render.engine.convert, writes all of these).

A model directory may instead be an H3 snapshot for the h3.c bridge (kind "h3";
docs/H3C.md): the Hugging Face folder with FL2VA/ (and optionally Ref2VA/),
placed or symlinked at $H3RENDER_HOME/models/<name>. Its quant levels are h3.c's
(bf16, int8, int8-row); `h3render models inspect DIR` checks its files.

Jobs name a model; they never pass a path (`resolve_model` accepts only a
plain name). The CLI may also take a directory (`resolve_model_arg`).

The built-in models (h3render.engine.builtin) ship as diffusers-layout pipelines
in the package data (h3render/data/<name>) and are converted into the models
directory the first time they are used: into a temporary sibling directory, then
renamed, so a crash or a concurrent first use never leaves a half model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

from pydantic import BaseModel

from h3render import paths
from h3render.engine.exceptions import InvalidRequestError, ModelFileError, ModelNotFoundError

from h3render.engine.builtin import BUILTIN, BUILTIN_QUANTS, DATA_DIR, DEFAULT_MODEL  # noqa: F401
MODEL_FILE = "model.json"
COMPONENTS = ("transformer", "text_encoder", "vae")
H3_MARKER = "FL2VA"  # an H3 snapshot's required variant folder
H3_VARIANTS = ("FL2VA", "Ref2VA")
H3_QUANTS = ("bf16", "int8", "int8-row")  # the bridge's levels (csrc/h3bridge/h3bridge.c)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_GGUF = re.compile(r"^(?P<component>transformer|text_encoder|vae)-(?P<quant>[a-z0-9_]+)\.gguf$")


class ModelEntry(BaseModel):
    """One model as seen on disk (or a built-in one not converted yet)."""

    name: str
    path: Path
    installed: bool
    kind: str = "gguf"  # "gguf" (the CPU engine's converted files) or "h3" (an H3 snapshot for h3.c)
    builtin: bool = False
    quants: list[str] = []  # quant levels of the transformer files
    components: dict[str, list[str]] = {}  # component -> quant levels present
    has_tokenizer: bool = False
    size_bytes: int = 0
    source: str | None = None
    # quant level -> why it cannot render (a file the engine could not load): every other
    # level stands alone and stays usable (csrc/engine.c sets broken files aside)
    unusable: dict[str, str] = {}

    @property
    def usable_quants(self) -> list[str]:
        return [q for q in self.quants if q not in self.unusable]


def validate_name(name: str) -> str:
    """Check a model name (never a path); raise InvalidRequestError naming the rule."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise InvalidRequestError(
            f"model={name!r} is not a model name: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (a name, not a path)"
        )
    return name


def describe(path: Path, name: str | None = None) -> ModelEntry:
    """What a model directory holds: quant levels per component, tokenizer, size."""
    path = Path(path)
    if is_h3_dir(path):
        return _describe_h3(path, name)
    components: dict[str, list[str]] = {}
    size = 0
    for f in sorted(path.iterdir()) if path.is_dir() else []:
        if not f.is_file():
            continue
        size += f.stat().st_size
        m = _GGUF.match(f.name)
        if m:
            components.setdefault(m["component"], []).append(m["quant"])
    meta = _read_meta(path)
    name = name or str(meta.get("name") or path.name)
    unusable = level_problems(path, components.get("transformer", [])) if components.get("transformer") else {}
    return ModelEntry(
        name=name,
        path=path,
        installed="transformer" in components,
        builtin=name in BUILTIN,
        quants=components.get("transformer", []),
        components=components,
        has_tokenizer=(path / "tokenizer.json").is_file(),
        size_bytes=size,
        source=meta.get("source"),
        unusable=unusable,
    )


def level_problems(path: Path, quants: list[str]) -> dict[str, str]:
    """quant level -> why it cannot render, as the engine sees the files now.

    The engine opens every file (headers, tensor table, sizes against the file) and sets
    a broken one aside with its message; a level whose own DiT, text encoder or VAE file
    is broken is unusable (info "unusable_levels"), and every other level stays usable."""
    from h3render.engine.binding import Engine
    from h3render.engine.exceptions import EngineError

    try:
        with Engine(path, threads=1) as eng:
            info = eng.info()
    except EngineError as e:
        return {q: e.message for q in quants}
    unusable = dict(info.get("unusable_levels") or {})
    return {q: unusable[q] for q in quants if q in unusable}


def check_level(path: Path, quant: str) -> None:
    """Raise ModelFileError naming the file when `quant` of the model at `path` cannot render
    (the worker calls this before it admits a job: a file that broke after conversion
    fails the job at once, without a retry)."""
    problem = level_problems(Path(path), [quant]).get(quant)
    if problem:
        raise ModelFileError(f"quant={quant} of model {Path(path).name!r} is unusable: {problem}")


def _describe_h3(path: Path, name: str | None) -> ModelEntry:
    """An H3 snapshot: h3.c's quant levels, variants present (as components), bytes on disk.

    Only directory entries are read (no safetensors header; `models inspect` does that).
    """
    size = 0
    for root, _dirs, files in os.walk(path):  # HF snapshots hold symlinks to blobs: stat follows them
        for f in files:
            try:
                size += os.stat(os.path.join(root, f)).st_size
            except OSError:
                pass  # a dangling link; `models inspect` names it
    variants = [v for v in H3_VARIANTS if (path / v).is_dir()]
    return ModelEntry(
        name=name or path.name,
        path=path,
        installed=True,
        kind="h3",
        quants=list(H3_QUANTS),
        components={v: list(H3_QUANTS) for v in variants},
        has_tokenizer=(path / H3_MARKER / "tokenizer" / "tokenizer.json").is_file(),
        size_bytes=size,
        source=None,
    )


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / MODEL_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def is_h3_dir(path: Path) -> bool:
    """An H3 snapshot for the h3.c bridge: a directory with an FL2VA/ folder."""
    return (Path(path) / H3_MARKER).is_dir()


def is_gguf_dir(path: Path) -> bool:
    """A directory with at least one transformer-<quant>.gguf (the CPU engine's layout)."""
    path = Path(path)
    return path.is_dir() and any(_GGUF.match(f.name) and f.name.startswith("transformer-") for f in path.iterdir())


def model_kind(path: Path) -> str | None:
    """"gguf", "h3" or None (not a model directory)."""
    if is_gguf_dir(path):
        return "gguf"
    if is_h3_dir(path):
        return "h3"
    return None


def is_model_dir(path: Path) -> bool:
    """A model directory of either kind: transformer-<quant>.gguf files, or an H3 snapshot (FL2VA/)."""
    return model_kind(path) is not None


def list_models(include_builtin: bool = True) -> list[ModelEntry]:
    """Installed models under the models dir, plus built-ins not converted yet."""
    root = paths.models_dir()
    found: dict[str, ModelEntry] = {}
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.name.startswith(".") or not _NAME.match(d.name) or not is_model_dir(d):
                continue
            found[d.name] = describe(d, name=d.name)
    if include_builtin:
        for name, src in BUILTIN.items():
            if name not in found and src.is_dir():
                found[name] = ModelEntry(name=name, path=root / name, installed=False, builtin=True, source=str(src))
    return [found[k] for k in sorted(found)]


def resolve_model(name: str) -> Path:
    """The directory of the model called `name`, converting a built-in on first use."""
    validate_name(name)
    path = paths.models_dir() / name
    if is_model_dir(path):
        return path
    if name in BUILTIN:
        return ensure_builtin(name)
    known = [m.name for m in list_models()]
    raise ModelNotFoundError(
        f"model={name!r} is not installed in {paths.models_dir()}; "
        f"available: {', '.join(known) or 'none'} (convert one with `h3render convert SRC DST`)"
    )


def resolve_model_arg(arg: str) -> Path:
    """For the CLI: a model directory if `arg` is one (or looks like a path), else a name."""
    path = Path(arg).expanduser()
    if is_model_dir(path):
        return path
    looks_like_path = "/" in arg or os.sep in arg or arg.startswith((".", "~"))
    if looks_like_path or not _NAME.match(arg):
        if not path.is_dir():
            raise ModelNotFoundError(f"model directory {path} does not exist")
        raise ModelFileError(
            f"{path} is not a model directory: it has no transformer-<quant>.gguf "
            "(convert a diffusers pipeline with `h3render convert SRC DST`) and no FL2VA/ folder "
            "(an H3 snapshot for h3.c; see docs/H3C.md)"
        )
    return resolve_model(arg)


def ensure_builtin(name: str = DEFAULT_MODEL) -> Path:
    """Convert a built-in model into the models dir if it is not there yet; its path."""
    validate_name(name)
    if name not in BUILTIN:
        raise ModelNotFoundError(f"model={name!r} is not a built-in model; built-in: {', '.join(BUILTIN)}")
    dst = paths.models_dir() / name
    if is_model_dir(dst):
        return dst
    src = BUILTIN[name]
    if not src.is_dir():
        raise ModelNotFoundError(f"built-in model {name!r} is missing from the package data ({src})")
    return install_pipeline(src, name, BUILTIN_QUANTS[name])


def install_pipeline(src: Path, name: str, quants: tuple[str, ...] | list[str]) -> Path:
    """Convert a diffusers-layout pipeline into models/<name>, atomically.

    Converts into a temporary directory beside the target and renames it. If
    another process installed the same name meanwhile, its copy wins and ours
    is discarded. Raises ConvertError (from the converter) on a bad source.
    """
    from h3render.engine.convert import convert_pipeline

    validate_name(name)
    root = paths.models_dir(ensure=True)
    dst = root / name
    tmp = root / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        convert_pipeline(Path(src), tmp, quants=list(quants), name=name)
        try:
            os.rename(tmp, dst)
        except OSError as exc:
            if not is_model_dir(dst):  # else another process installed it first: use theirs
                raise ModelFileError(
                    f"{dst} exists and is not a model directory ({exc.strerror}); remove it and retry"
                ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst
