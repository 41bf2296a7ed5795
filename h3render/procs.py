"""Process liveness on this host, shared by the embedded Redis and the worker lock."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True if `pid` runs on this host. A zombie counts as gone: one of our own
    children is reaped here; another process's zombie (no init reaped it, as in
    a container) is recognised from /proc where there is one."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True
