"""ctypes binding to the engine library (csrc/h3render.h, ABI version 2).

Every exported function has its argtypes and restype declared here; every
non-zero return becomes a typed exception (h3render.engine.exceptions) carrying
the engine's own message. Python never mirrors a struct of an engine's
internals: the request struct below is our own ABI's, and engine information
comes back as JSON.
"""

from __future__ import annotations

import ctypes as C
import json
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from h3render.engine.exceptions import (
    EngineError,
    InvalidRequestError,
    LibraryNotFoundError,
    UnsupportedError,
    error_for_code,
)

ABI_VERSION = 2
# ABI 2 only added h3r_estimate_json: a library of ABI 1 still renders, and
# Engine.estimate_memory says it needs a rebuild.
MIN_ABI_VERSION = 1
SAMPLERS = {"unipc": 0, "euler": 1}
PHASES = {0: "load", 1: "encode", 2: "denoise", 3: "decode"}
FRAME_FINAL, FRAME_PREVIEW = 0, 1

PROGRESS_FN = C.CFUNCTYPE(C.c_int, C.c_void_p, C.c_int, C.c_int, C.c_int)
FRAME_FN = C.CFUNCTYPE(
    C.c_int, C.c_void_p, C.c_int, C.c_int, C.c_int, C.c_int, C.POINTER(C.c_uint8)
)
TAP_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_char_p, C.POINTER(C.c_float), C.c_int64)

_F32P = C.POINTER(C.c_float)
_I32P = C.POINTER(C.c_int32)


class _Request(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32),
        ("prompt", C.c_char_p),
        ("negative_prompt", C.c_char_p),
        ("prompt_ids", _I32P),
        ("n_prompt_ids", C.c_int32),
        ("negative_ids", _I32P),
        ("n_negative_ids", C.c_int32),
        ("seed", C.c_uint64),
        ("width", C.c_int32),
        ("height", C.c_int32),
        ("frames", C.c_int32),
        ("steps", C.c_int32),
        ("guidance", C.c_float),
        ("shift", C.c_float),
        ("sampler", C.c_int32),
        ("quant", C.c_char_p),
        ("threads", C.c_int32),
        ("init_latents", _F32P),
        ("n_init_latents", C.c_int64),
        ("out_latents", _F32P),
        ("n_out_latents", C.c_int64),
        ("preview_every", C.c_int32),
        ("options", C.c_char_p),
        ("on_progress", PROGRESS_FN),
        ("on_frame", FRAME_FN),
        ("user", C.c_void_p),
    ]


_lib_lock = threading.Lock()
_lib: C.CDLL | None = None


def library_path() -> Path:
    """Where the engine library is loaded from: $H3RENDER_LIB, else beside this file,
    else in the installed h3render distribution.

    The last case is a process started with `python -c` or `-m` from a source
    checkout (make demo, the worker's child processes): the current directory
    comes first on sys.path, so this module is the checkout's, which has no
    compiled library, while `pip install .` put one into site-packages.
    """
    env = os.environ.get("H3RENDER_LIB")
    if env:
        return Path(env)
    name = "libh3render" + (".dylib" if sys.platform == "darwin" else ".so")
    beside = Path(__file__).with_name(name)
    if beside.is_file():
        return beside
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("h3render")
    except PackageNotFoundError:
        return beside
    for f in dist.files or ():
        if f.name == name and f.parent.name == "engine":
            installed = Path(dist.locate_file(f))
            if installed.is_file():
                return installed
    return beside


def load_library() -> C.CDLL:
    """Load the engine once per process and declare every function's types."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not path.is_file():
            raise LibraryNotFoundError(
                f"engine library not found at {path}; install h3render with `pip install .` "
                "(which compiles csrc/) or set H3RENDER_LIB"
            )
        try:
            lib = C.CDLL(str(path))
        except OSError as exc:
            raise LibraryNotFoundError(f"cannot load engine library {path}: {exc}") from None
        # the version first: an older library lacks functions _declare names
        lib.h3r_abi_version.argtypes, lib.h3r_abi_version.restype = [], C.c_int
        abi = lib.h3r_abi_version()
        if not MIN_ABI_VERSION <= abi <= ABI_VERSION:
            raise LibraryNotFoundError(
                f"engine library {path} has ABI {abi}; this binding takes {MIN_ABI_VERSION} to "
                f"{ABI_VERSION} (rebuild it: `pip install .` compiles csrc/)"
            )
        _declare(lib, abi)
        _lib = lib
        return lib


def _declare(lib: C.CDLL, abi: int) -> None:
    P = C.c_void_p
    sig = {
        "h3r_abi_version": ([], C.c_int),
        "h3r_open": ([C.c_char_p, C.c_int, C.POINTER(P)], C.c_int),
        "h3r_close": ([P], None),
        "h3r_last_error": ([P], C.c_char_p),
        "h3r_info_json": ([P], C.c_char_p),
        "h3r_generate": ([P, C.POINTER(_Request)], C.c_int),
        "h3r_estimate_json": ([P, C.POINTER(_Request), C.POINTER(C.c_char_p)], C.c_int),
        "h3r_set_tap": ([P, TAP_FN, P], None),
        "h3r_encode_text": ([P, C.c_char_p, _I32P, C.c_int, _F32P, C.c_int64], C.c_int),
        "h3r_dit_forward": (
            [P, C.c_char_p, _F32P, C.c_int, C.c_int, C.c_int, C.c_int, C.c_float, _F32P,
             C.c_int, _F32P],
            C.c_int,
        ),
        "h3r_vae_decode": (
            [P, C.c_char_p, _F32P, C.c_int, C.c_int, C.c_int, C.c_int, _F32P, C.c_int64],
            C.c_int,
        ),
        "h3r_schedule": ([C.c_int, C.c_int, C.c_float, _F32P, _F32P], C.c_int),
    }
    if abi < 2:
        del sig["h3r_estimate_json"]
    for name, (argtypes, restype) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype


def last_error(engine: C.c_void_p | None = None) -> str:
    msg = load_library().h3r_last_error(engine)
    return msg.decode("utf-8", "replace") if msg else ""


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _ptr(a: np.ndarray | None, ctype=C.c_float):
    return None if a is None else a.ctypes.data_as(C.POINTER(ctype))


def schedule(sampler: str, steps: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Sigmas (steps+1,) and model timesteps (steps,) of a sampler."""
    lib = load_library()
    sigmas = np.zeros(steps + 1, np.float32)
    timesteps = np.zeros(steps, np.float32)
    rc = lib.h3r_schedule(_sampler_id(sampler), steps, shift, _ptr(sigmas), _ptr(timesteps))
    if rc != 0:
        raise error_for_code(rc, last_error(None))
    return sigmas, timesteps


def _sampler_id(sampler: str) -> int:
    try:
        return SAMPLERS[sampler]
    except KeyError:
        raise InvalidRequestError(
            f"sampler={sampler!r} is not supported; choose from {', '.join(SAMPLERS)}"
        ) from None


@dataclass
class GenerateRequest:
    """One render, in engine terms (the job model maps onto this)."""

    width: int
    height: int
    frames: int
    steps: int
    seed: int = 0
    prompt: str = ""
    negative_prompt: str = ""
    prompt_ids: list[int] | None = None
    negative_ids: list[int] | None = None
    guidance: float = 5.0
    shift: float = 3.0
    sampler: str = "unipc"
    quant: str = "f16"
    threads: int = 0
    init_latents: np.ndarray | None = None
    return_latents: bool = False
    preview_every: int = 0
    options: dict[str, str | int | float | bool] = field(default_factory=dict)


@dataclass
class GenerateResult:
    frames: int
    latents: np.ndarray | None = None


ProgressCallback = Callable[[str, int, int], bool | None]
FrameCallback = Callable[[int, int, np.ndarray], bool | None]  # kind, index, (H, W, 3) uint8


class Engine:
    """An open model directory. Not thread-safe: one render at a time."""

    def __init__(self, model_dir: str | os.PathLike, threads: int = 0):
        self._lib = load_library()
        self.model_dir = Path(model_dir)
        handle = C.c_void_p()
        rc = self._lib.h3r_open(str(self.model_dir).encode(), int(threads), C.byref(handle))
        if rc != 0:
            raise error_for_code(rc, last_error(None))
        self._h = handle
        self._tap_keepalive = None
        self._info: dict | None = None

    # -- lifetime
    def close(self) -> None:
        if getattr(self, "_h", None):
            self._lib.h3r_close(self._h)
            self._h = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise error_for_code(rc, self.last_error())

    def _handle(self) -> C.c_void_p:
        if not getattr(self, "_h", None):
            raise EngineError("engine is closed")
        return self._h

    def last_error(self) -> str:
        return last_error(self._h)

    # -- information
    def info(self) -> dict:
        if self._info is None:
            raw = self._lib.h3r_info_json(self._handle())
            if not raw:
                raise error_for_code(-8, self.last_error())
            self._info = json.loads(raw.decode())
        return self._info

    def latent_shape(self, width: int, height: int, frames: int) -> tuple[int, int, int, int]:
        info = self.info()
        st, sy, sx = info["vae_stride"]
        return (info["latent_channels"], (frames - 1) // st + 1, height // sy, width // sx)

    # -- components (verify mode, numerics tests)
    def set_tap(self, fn: Callable[[str, np.ndarray], None] | None) -> None:
        """fn(stage name, copy of its float32 output) after each stage; None removes it."""
        if fn is None:
            self._lib.h3r_set_tap(self._handle(), TAP_FN(), None)
            self._tap_keepalive = None
            return

        def tap(_user, name, data, n):
            fn(name.decode(), np.ctypeslib.as_array(data, shape=(n,)).copy())

        self._tap_keepalive = TAP_FN(tap)
        self._lib.h3r_set_tap(self._handle(), self._tap_keepalive, None)

    def encode_text(self, ids, quant: str | None = None) -> np.ndarray:
        """Token ids -> (text_len, text_dim); quant picks text_encoder-<quant>.gguf."""
        info = self.info()
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        out = np.zeros((info["text_len"], info["text_dim"]), np.float32)
        self._check(
            self._lib.h3r_encode_text(
                self._handle(), _q(quant), _ptr(ids, C.c_int32), len(ids), _ptr(out), out.size
            )
        )
        return out

    def dit_forward(self, quant: str, x: np.ndarray, timestep: float, context: np.ndarray) -> np.ndarray:
        x = _f32(x)
        context = _f32(context)
        if x.ndim != 4 or context.ndim != 2:
            raise InvalidRequestError(
                f"dit_forward wants x (C, T, H, W) and context (L, D); got {x.shape} and {context.shape}"
            )
        out = np.zeros_like(x)
        c, t, h, w = x.shape
        self._check(
            self._lib.h3r_dit_forward(
                self._handle(), quant.encode(), _ptr(x), c, t, h, w, float(timestep),
                _ptr(context), context.shape[0], _ptr(out),
            )
        )
        return out

    def vae_decode(self, z: np.ndarray, quant: str | None = None) -> np.ndarray:
        """De-normalised latents (C, T, H, W) -> video (3, F, H, W) in [-1, 1]."""
        z = _f32(z)
        if z.ndim != 4:
            raise InvalidRequestError(f"vae_decode wants z (C, T, H, W); got {z.shape}")
        c, t, h, w = z.shape
        info = self.info()
        st, sy, sx = info["vae_stride"]
        out = np.zeros((3, 1 + st * (t - 1), sy * h, sx * w), np.float32)
        self._check(
            self._lib.h3r_vae_decode(
                self._handle(), _q(quant), _ptr(z), c, t, h, w, _ptr(out), out.size
            )
        )
        return out

    # -- rendering
    def generate(
        self,
        req: GenerateRequest,
        on_progress: ProgressCallback | None = None,
        on_frame: FrameCallback | None = None,
    ) -> GenerateResult:
        """Render one video; frames arrive through on_frame as (H, W, 3) uint8.

        A callback returning True cancels (EngineCanceled is raised). An exception
        raised inside a callback cancels the render and is re-raised here.
        """
        pending: list[BaseException] = []

        def progress(_u, phase, done, total):
            if on_progress is None:
                return 0
            try:
                return 1 if on_progress(PHASES.get(phase, str(phase)), done, total) else 0
            except BaseException as exc:  # noqa: BLE001 - re-raised after the C call
                pending.append(exc)
                return 1

        def frame(_u, kind, index, width, height, rgb):
            if on_frame is None:
                return 0
            try:
                arr = np.ctypeslib.as_array(rgb, shape=(height, width, 3)).copy()
                return 1 if on_frame(kind, index, arr) else 0
            except BaseException as exc:  # noqa: BLE001
                pending.append(exc)
                return 1

        progress_cb = PROGRESS_FN(progress)
        frame_cb = FRAME_FN(frame)
        out_latents = None
        if req.return_latents:
            out_latents = np.zeros(self.latent_shape(req.width, req.height, req.frames), np.float32)
        r, _keep = _request_struct(req, out_latents)
        r.on_progress = progress_cb
        r.on_frame = frame_cb

        rc = self._lib.h3r_generate(self._handle(), C.byref(r))
        if pending:
            raise pending[0]
        self._check(rc)
        return GenerateResult(frames=req.frames, latents=out_latents)

    def estimate_memory(self, req: GenerateRequest) -> dict:
        """Peak bytes the engine would use to render `req`, without rendering it.

        The engine checks `req` as generate does (the same exception and message
        for a request generate would refuse) and sizes every buffer from the
        tables its allocations use. Returns a dict of ints:
        weights (mapped model pages the render reads), encode, denoise, decode
        (each phase's peak of allocated buffers), total = weights + max(phases),
        threads, tokens, and the "files" and "parts" breakdowns
        (csrc/h3render.h). The calling process's own memory is not included.
        """
        if self._lib.h3r_abi_version() < 2:
            raise UnsupportedError(
                f"engine library {library_path()} has ABI {self._lib.h3r_abi_version()}, which has no "
                "memory estimate (ABI 2); rebuild it: `pip install .` compiles csrc/"
            )
        r, _keep = _request_struct(req, None)
        out = C.c_char_p()
        self._check(self._lib.h3r_estimate_json(self._handle(), C.byref(r), C.byref(out)))
        return json.loads(out.value.decode())


def _request_struct(req: GenerateRequest, out_latents: np.ndarray | None) -> tuple[_Request, tuple]:
    """The C request for `req`, without callbacks, and the arrays it points into
    (keep them alive for as long as the struct is used)."""
    prompt_ids = np.ascontiguousarray(req.prompt_ids or [], np.int32)
    negative_ids = np.ascontiguousarray(req.negative_ids or [], np.int32)
    init = None if req.init_latents is None else _f32(req.init_latents)
    options = ";".join(f"{k}={_opt(v)}" for k, v in sorted(req.options.items()))

    r = _Request()
    r.struct_size = C.sizeof(_Request)
    r.prompt = req.prompt.encode()
    r.negative_prompt = req.negative_prompt.encode()
    r.prompt_ids = _ptr(prompt_ids, C.c_int32)
    r.n_prompt_ids = len(prompt_ids)
    r.negative_ids = _ptr(negative_ids, C.c_int32)
    r.n_negative_ids = len(negative_ids)
    r.seed = int(req.seed) & 0xFFFFFFFFFFFFFFFF
    r.width, r.height, r.frames, r.steps = req.width, req.height, req.frames, req.steps
    r.guidance, r.shift = req.guidance, req.shift
    r.sampler = _sampler_id(req.sampler)
    r.quant = req.quant.encode()
    r.threads = req.threads
    r.init_latents = _ptr(init)
    r.n_init_latents = 0 if init is None else init.size
    r.out_latents = _ptr(out_latents)
    r.n_out_latents = 0 if out_latents is None else out_latents.size
    r.preview_every = req.preview_every
    r.options = options.encode() if options else None
    r.user = None
    return r, (prompt_ids, negative_ids, init, out_latents)


def _q(quant: str | None) -> bytes | None:
    return None if quant is None else quant.encode()


def _opt(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    text = str(value)
    if ";" in text or "=" in text:
        raise InvalidRequestError(f"engine option value {text!r} may not contain ';' or '='")
    return text
