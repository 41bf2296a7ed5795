"""Where h3render keeps its data: one home directory, four subdirectories.

    $H3RENDER_HOME/
        models/   <name>/ GGUF per quant level, tokenizer.json, model.json
        renders/  <sweep id or date>/<job id>/ video.mp4 poster.png meta.json
        tune/     measured best thread counts
        redis/    the embedded redis-server's AOF, config, pid and log

H3RENDER_HOME comes from the environment, else the platform's user data
directory (~/.local/share/h3render on Linux). Every function reads the
environment when called and creates nothing unless asked (`ensure=True`), so
importing this module has no side effects and tests can point it at a temp dir.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

HOME_ENV = "H3RENDER_HOME"


def home(*, ensure: bool = False) -> Path:
    """The h3render home directory: $H3RENDER_HOME, else the user data dir."""
    value = os.environ.get(HOME_ENV, "").strip()
    root = Path(value).expanduser() if value else Path(platformdirs.user_data_dir("h3render"))
    return _maybe_make(root, ensure)


def models_dir(*, ensure: bool = False) -> Path:
    """Converted models, one directory per model name."""
    return _maybe_make(home() / "models", ensure)


def renders_dir(*, ensure: bool = False) -> Path:
    """Finished renders: videos, posters, frames and their metadata."""
    return _maybe_make(home() / "renders", ensure)


def tune_dir(*, ensure: bool = False) -> Path:
    """Measured best thread counts per machine, model and quant level."""
    return _maybe_make(home() / "tune", ensure)


def redis_dir(*, ensure: bool = False) -> Path:
    """State of the embedded redis-server (AOF, config, pid, log)."""
    return _maybe_make(home() / "redis", ensure)


def _maybe_make(path: Path, ensure: bool) -> Path:
    if ensure:
        path.mkdir(parents=True, exist_ok=True)
    return path
