"""Build and run the C unit tests in tests/c (quant blocks, dot kernels, matmul).

- host build with AddressSanitizer + UndefinedBehaviorSanitizer (the AVX2 path
  on x86-64 hosts that have it);
- aarch64 builds with aarch64-linux-gnu-gcc, run under qemu-aarch64: NEON with
  dotprod (armv8.2-a+dotprod) and plain NEON (armv8-a).

Each build needs its tools (Debian: gcc, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross, qemu-user);
when one is missing the test is skipped and says why, both as the skip reason
and as a warning in pytest's summary, so `make test` shows it.
Takes ~20 s (ASan build and run; qemu runs ~5 s each).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
SOURCES = [ROOT / "tests" / "c" / "test_quant.c"] + [
    CSRC / f for f in ("quant.c", "types.c", "errors.c", "threads.c", "ops.c", "gguf.c")
]
# The flags the library is built with that change results (CMakeLists.txt).
COMMON = ["-std=gnu11", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Wextra",
          "-Wno-unused-parameter", f"-I{CSRC}"]


def _skip(reason: str) -> None:
    warnings.warn(reason, UserWarning, stacklevel=2)
    pytest.skip(reason)


def _build_and_run(cc: list[str], flags: list[str], exe: Path, runner: list[str], env=None) -> str:
    build = subprocess.run(
        cc + COMMON + flags + [str(s) for s in SOURCES] + ["-o", str(exe), "-lm", "-lpthread"],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, f"build failed:\n{build.stderr}"
    assert "warning" not in build.stderr, build.stderr
    run = subprocess.run(runner + [str(exe)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **(env or {})})
    print(run.stdout)
    assert run.returncode == 0, f"C tests failed (rc {run.returncode}):\n{run.stdout}\n{run.stderr}"
    assert run.stdout.strip().splitlines()[-1].endswith(" 0 failed"), run.stdout
    return run.stdout


def _compiles(cc: str, flags: list[str], source: str, out: str) -> bool:
    """Whether cc takes these flags on a small source from stdin (a probe before a build)."""
    probe = subprocess.run([cc, *flags, "-x", "c", "-", "-o", out], input=source,
                           capture_output=True, text=True, timeout=60)
    return probe.returncode == 0


def _cpu_has(flag: str) -> bool:
    try:
        return f" {flag}" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_c_units_under_asan_ubsan(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        _skip("no C compiler (cc/gcc) on PATH: the ASan/UBSan C tests did not run")
    if not _compiles(cc, ["-fsanitize=address,undefined"], "int main(void){return 0;}", str(tmp_path / "p")):
        _skip(f"{cc} cannot link -fsanitize=address,undefined (libasan/libubsan missing): "
              f"the sanitizer C tests did not run")
    arch = ["-mavx2", "-mfma", "-mf16c"] if _cpu_has("avx2") and _cpu_has("fma") else []
    out = _build_and_run(
        [cc], ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
               "-fno-sanitize-recover=all"] + arch,
        tmp_path / "test_quant_asan", [],
        env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1"},
    )
    if arch:
        assert "SIMD variant: avx2" in out


def test_c_units_native(tmp_path):
    """The kernels the library is built with (-march=native: AVX-512 VNNI GEMV where the CPU has it)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        _skip("no C compiler (cc/gcc) on PATH: the native-build C tests did not run")
    if not _compiles(cc, ["-march=native"], "int main(void){return 0;}", str(tmp_path / "p")):
        _skip(f"{cc} does not take -march=native: the native-build C tests did not run")
    _build_and_run([cc], ["-O2", "-march=native"], tmp_path / "test_quant_native", [])


@pytest.mark.parametrize("march,variant", [("armv8.2-a+dotprod", "neon-dotprod"), ("armv8-a", "neon")])
def test_c_units_aarch64_under_qemu(tmp_path, march, variant):
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if not cc or not qemu:
        missing = " and ".join(n for n, p in (("aarch64-linux-gnu-gcc", cc), ("qemu-aarch64", qemu)) if not p)
        _skip(f"{missing} not installed (Debian packages gcc-aarch64-linux-gnu, qemu-user): "
              f"the NEON ({variant}) C tests did not run")
    if not _compiles(cc, ["-E"], "#include <stdio.h>\n", os.devnull):
        _skip("aarch64-linux-gnu-gcc has no C library headers (Debian package libc6-dev-arm64-cross, "
              f"a recommendation apt skips with --no-install-recommends): the NEON ({variant}) C tests did not run")
    out = _build_and_run([cc], ["-O2", "-static", f"-march={march}"], tmp_path / f"test_quant_{variant}",
                         [qemu, "-cpu", "max"])
    assert f"SIMD variant: {variant}" in out
