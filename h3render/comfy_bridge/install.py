"""Write the small custom-node package ComfyUI loads: COMFYUI_DIR/custom_nodes/h3render/.

It holds one __init__.py that imports the nodes from the installed h3render, so
upgrading h3render upgrades the nodes; nothing of h3render is copied. The file
carries a marker line, and an existing folder without it is never overwritten.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "h3render"
MARKER = "# written by `h3render comfyui install`"

SHIM = f'''{MARKER}; safe to delete, or to rewrite with the same command.
"""h3render nodes for ComfyUI: H3 Render (queued), H3 Sweep (overnight), H3 Sweep Results.

The nodes live in the h3render package, which must be installed into the Python
that runs ComfyUI (see h3render's docs/COMFYUI.md).
"""

import sys

try:
    from h3render.comfy_bridge.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
except ModuleNotFoundError as e:
    if not (e.name or "").startswith("h3render"):
        raise
    raise ImportError(
        f"h3render is not installed in the Python that runs ComfyUI ({{sys.executable}}): "
        f"run `{{sys.executable}} -m pip install h3render`, then restart ComfyUI"
    ) from e

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
'''


class InstallError(ValueError):
    """COMFYUI_DIR is not a ComfyUI checkout, or the target folder is someone else's."""


@dataclass
class Installed:
    path: Path  # the custom-node folder
    replaced: bool  # an earlier shim was rewritten
    python_check: str | None = None  # result of importing the nodes' package with --python


def looks_like_comfyui(d: Path) -> bool:
    return (d / "main.py").is_file() and ((d / "comfy").is_dir() or (d / "custom_nodes").is_dir())


def install(comfy_dir: Path, force: bool = False) -> Installed:
    """Write COMFYUI_DIR/custom_nodes/h3render/__init__.py; raises InstallError naming the problem."""
    comfy_dir = Path(comfy_dir).expanduser()
    if not comfy_dir.is_dir():
        raise InstallError(f"COMFYUI_DIR={str(comfy_dir)!r}: no such directory")
    if not looks_like_comfyui(comfy_dir):
        raise InstallError(f"COMFYUI_DIR={str(comfy_dir)!r}: not a ComfyUI folder (expected main.py next to "
                           "comfy/ or custom_nodes/); give the folder you start ComfyUI from")
    target = comfy_dir / "custom_nodes" / PACKAGE
    init = target / "__init__.py"
    replaced = False
    if target.exists():
        ours = init.is_file() and init.read_text(errors="replace").startswith(MARKER)
        if not ours and not force:
            raise InstallError(f"{target} exists and was not written by h3render; move it away, or pass "
                               "--force to overwrite its __init__.py")
        replaced = True
    target.mkdir(parents=True, exist_ok=True)
    tmp = init.with_name(f".__init__.py.{os.getpid()}.tmp")
    tmp.write_text(SHIM)
    os.replace(tmp, init)
    return Installed(target, replaced)


def check_python(python: str, cwd: Path | None = None) -> str:
    """Import the nodes' package with ComfyUI's Python, from `cwd` (ComfyUI's folder, so a
    source tree in the caller's folder cannot stand in); 'ok <version> <where>' or the error."""
    code = ("import importlib.metadata as m, os, h3render, h3render.comfy_bridge.client\n"
            "try:\n    v = m.version('h3render')\nexcept m.PackageNotFoundError:\n    v = 'from a source tree'\n"
            "print('ok', v, os.path.dirname(h3render.__file__))")
    try:
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run {python}: {e}"
    if p.returncode == 0:
        return p.stdout.strip()
    return (p.stderr.strip().splitlines() or ["failed"])[-1]
