"""ctypes view of csrc/test_exports.h, and the child process of the GGUF fuzz test.

Imported by test_ops.py and test_gguf.py for `core_lib()`, which loads the engine
library (through h3render.engine.binding.load_library when present, else from
$H3RENDER_LIB or beside the installed package) and declares the test-only
h3r_test_* entry points. Those are NOT the stable ABI; only tests call them.

Run as a script, it is the fuzz child: `python gguf_fuzz_child.py MANIFEST`
reads one file path per line from MANIFEST, validates each with
h3r_test_gguf_check, and prints one JSON line per file
({"i", "rc", "msg"}), flushed, so that if the process crashes the parent knows
exactly which file did it (the first one without a line).
"""

from __future__ import annotations

import ctypes as C
import json
import os
import sys
from pathlib import Path

_lib: C.CDLL | None = None

_P = C.c_void_p
_I64 = C.c_int64

_SIGNATURES: dict[str, tuple[list, object]] = {
    "h3r_last_error": ([_P], C.c_char_p),
    "h3r_test_gguf_check": ([C.c_char_p], C.c_int),
    "h3r_test_gguf_open": ([C.c_char_p, C.POINTER(_P)], C.c_int),
    "h3r_test_gguf_close": ([_P], None),
    "h3r_test_gguf_n_tensors": ([_P], C.c_int),
    "h3r_test_gguf_tensor": (
        [_P, C.c_int, C.POINTER(C.c_char_p), C.POINTER(C.c_int), C.POINTER(C.c_int),
         C.POINTER(_I64), C.POINTER(_P), C.POINTER(C.c_uint64)],
        C.c_int,
    ),
    "h3r_test_gguf_find": ([_P, C.c_char_p], C.c_int),
    "h3r_test_gguf_get_tensor": ([_P, C.c_char_p, _I64, _I64, _I64, _I64, C.POINTER(C.c_int)], C.c_int),
    "h3r_test_gguf_has_key": ([_P, C.c_char_p], C.c_int),
    "h3r_test_gguf_get_int": ([_P, C.c_char_p, C.POINTER(_I64)], C.c_int),
    "h3r_test_gguf_get_float": ([_P, C.c_char_p, C.POINTER(C.c_double)], C.c_int),
    "h3r_test_gguf_get_bool": ([_P, C.c_char_p, C.POINTER(C.c_int)], C.c_int),
    "h3r_test_gguf_get_str": ([_P, C.c_char_p, C.POINTER(_P), C.POINTER(C.c_uint64)], C.c_int),
    "h3r_test_gguf_get_int_array": ([_P, C.c_char_p, _P, C.c_int, C.POINTER(C.c_int)], C.c_int),
    "h3r_test_gguf_get_float_array": ([_P, C.c_char_p, _P, C.c_int, C.POINTER(C.c_int)], C.c_int),
    "h3r_test_matmul": ([C.c_int, _P, _P, _P, C.c_int, _P, _I64, _I64, _I64], C.c_int),
    "h3r_test_attention": ([C.c_int, _P, _P, _P, _P, _I64, _I64, C.c_int, C.c_int, C.c_float, _P], C.c_int),
    "h3r_test_layernorm": ([_P, _I64, _I64, _P, _P, C.c_float], C.c_int),
    "h3r_test_rmsnorm": ([_P, _I64, _I64, _P, C.c_float], C.c_int),
    "h3r_test_activation": ([C.c_int, _P, _I64], C.c_int),
    "h3r_test_gelu_tanh": ([_P, _I64], C.c_int),
    "h3r_test_f16_to_f32": ([_P, _P, _I64], C.c_int),
    "h3r_test_f32_to_f16": ([_P, _P, _I64], C.c_int),
    "h3r_test_pool": ([C.c_int, C.c_int], C.c_int),
    "h3r_test_force_ref": ([C.c_int], C.c_int),
    "h3r_test_type_nbytes": ([C.c_int, _I64], C.c_uint64),
}


def _open_library() -> C.CDLL:
    try:
        from h3render.engine.binding import load_library
    except ImportError:
        load_library = None
    if load_library is not None:
        return load_library()
    env = os.environ.get("H3RENDER_LIB")
    if env:
        return C.CDLL(env)
    import h3render.engine

    return C.CDLL(str(Path(h3render.engine.__file__).with_name("libh3render.so")))


def core_lib() -> C.CDLL:
    """The engine library with every h3r_test_* function's argtypes/restype declared."""
    global _lib
    if _lib is None:
        lib = _open_library()
        for name, (args, res) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = res
        _lib = lib
    return _lib


def last_error() -> str:
    """This thread's last engine error message (h3r_last_error(NULL))."""
    return (core_lib().h3r_last_error(None) or b"").decode("utf-8", "replace")


def check_file(path: str | Path) -> tuple[int, str]:
    """(return code, message) of opening and validating one GGUF file."""
    rc = core_lib().h3r_test_gguf_check(str(path).encode())
    return rc, (last_error() if rc != 0 else "")


def main(argv: list[str]) -> int:
    files = Path(argv[1]).read_text().splitlines()
    out = sys.stdout
    for i, f in enumerate(files):
        rc, msg = check_file(f)
        out.write(json.dumps({"i": i, "rc": rc, "msg": msg}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
