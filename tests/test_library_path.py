"""The engine library is found from a source checkout too (make demo runs there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_checkout_on_sys_path_still_loads_the_installed_library():
    """`python -c` from the repository root imports the checkout's h3render, which has no
    compiled library; the binding must then use the one `pip install .` installed."""
    if (ROOT / "h3render" / "engine" / "libh3render.so").exists():
        pytest.skip("a development build sits in the checkout, so the fallback is not exercised")
    env = {k: v for k, v in os.environ.items() if k not in ("H3RENDER_LIB", "PYTHONPATH")}
    code = ("import h3render.engine.binding as b; print(b.__file__); print(b.library_path()); "
            "b.load_library(); print('loaded')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    module, lib, loaded = proc.stdout.split()
    assert Path(module).is_relative_to(ROOT)          # the checkout's module was imported
    assert not Path(lib).is_relative_to(ROOT / "h3render")  # the installed library was found
    assert loaded == "loaded"
