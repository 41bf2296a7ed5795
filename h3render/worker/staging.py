"""A render's files: one staging folder per attempt, published as the job folder by one rename.

    renders/<group>/.staging/<host>/<job id>.<attempt>.<pid>/   one attempt's files as it runs
    renders/<group>/<job id>/                                    the job folder: whole, or absent

The render task writes video.mp4, poster.png and meta.json into its staging folder
(each flushed to the disk), then `publish` renames the folder to the job folder: a
reader sees all three files or none, and no temporary name ever appears in a job
folder. The staging folder sits under the job's group folder, so the rename never
crosses a file system. A job folder that already exists (an earlier attempt's
failure record) is first renamed aside into staging, then removed.

A failed job's folder holds meta.json with the reason and nothing else
(`publish_failure`); a canceled job has no folder. When the disk is too full for
even that, there is no folder and the reason is in the job's record only.

A killed render leaves its staging folder behind. `sweep_staging` removes every
staging folder of this host whose render process is gone (its pid is dead, or
now belongs to a process started after the folder last changed); the worker
calls it at start and every render task at its start, so a retry finds no stale
attempt of its own job or of any other. Folder names carry ".staging", one of
the markers by which leftovers are recognised (tests/faults/harness.TEMP_MARKERS).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
from collections.abc import Iterable
from pathlib import Path

STAGING = ".staging"
_OLD = "old"  # suffix of a replaced job folder waiting to be removed


def host_tag(host: str | None = None) -> str:
    """This host's folder name under .staging (pids are only meaningful per host)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", host or socket.gethostname()) or "host"


def staging_root(group_dir: Path, host: str | None = None) -> Path:
    return Path(group_dir) / STAGING / host_tag(host)


def new_staging(final: Path, attempt: int, pid: int | None = None) -> Path:
    """Create the empty staging folder of one attempt at `final` (the job folder)."""
    final = Path(final)
    d = staging_root(final.parent) / f"{final.name}.{int(attempt)}.{pid or os.getpid()}"
    for _ in range(5):  # another render's cleanup may remove an empty parent meanwhile
        try:
            d.mkdir(parents=True)
            return d
        except FileNotFoundError:
            continue
        except FileExistsError:
            shutil.rmtree(d, ignore_errors=True)  # our own pid: a leftover of this very process
    d.mkdir(parents=True)
    return d


def fsync_dir(d: Path) -> None:
    """Make a folder's entries (renames, new files) durable; a no-op where folders
    cannot be opened or flushed."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_json(path: Path, doc: dict) -> None:
    """Write a JSON file in a staging folder (private to this attempt) and flush it."""
    text = json.dumps(doc, indent=2, sort_keys=True, default=str)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def publish(staging: Path, final: Path) -> Path:
    """Rename the staging folder to the job folder `final`, replacing an earlier one."""
    staging, final = Path(staging), Path(final)
    fsync_dir(staging)
    old = staging.with_name(f"{staging.name}.{_OLD}")
    replaced = False
    try:
        os.rename(final, old)
        replaced = True
    except FileNotFoundError:
        pass
    try:
        os.rename(staging, final)
    except OSError:
        if replaced:
            os.rename(old, final)
        raise
    fsync_dir(final.parent)
    if replaced:
        shutil.rmtree(old, ignore_errors=True)
    _remove_empty_parents(staging)
    return final


def discard(staging: Path | None) -> None:
    """Remove an attempt's staging folder (failure, cancel)."""
    if staging is None:
        return
    shutil.rmtree(staging, ignore_errors=True)
    _remove_empty_parents(Path(staging))


def publish_failure(final: Path, attempt: int, doc: dict) -> Path | None:
    """The job folder of a failed job: meta.json with the reason, nothing else. None
    when it could not be written (a full disk); the reason stays in the job's record."""
    staging = None
    try:
        staging = new_staging(final, attempt)
        write_json(staging / "meta.json", doc)
        return publish(staging, final)
    except (OSError, ValueError):  # ValueError: a path the OS cannot take (never from our ids)
        discard(staging)
        return None


def remove_failure_record(final: Path) -> None:
    """Remove a job folder that holds only an earlier failure's meta.json (the job is now
    canceled, and a canceled job has no folder)."""
    final = Path(final)
    try:
        names = {p.name for p in final.iterdir()}
    except OSError:
        return
    if names == {"meta.json"}:
        shutil.rmtree(final, ignore_errors=True)


def _remove_empty_parents(staging: Path) -> None:
    for d in (staging.parent, staging.parent.parent):  # .staging/<host>, .staging
        try:
            d.rmdir()
        except OSError:
            return


def _pid_of(name: str) -> int | None:
    parts = name.split(".")
    if parts and parts[-1] == _OLD:
        parts = parts[:-1]
    if len(parts) < 3 or not parts[-1].isdigit():
        return None
    return int(parts[-1])


def _owner_alive(pid: int, folder: Path) -> bool:
    """Whether the process that made `folder` still runs. A live pid started after the
    folder last changed is another process that got the dead owner's pid."""
    from h3render.procs import pid_alive

    if pid == os.getpid():
        return True
    if not pid_alive(pid):
        return False
    try:
        import psutil

        return psutil.Process(pid).create_time() <= folder.stat().st_mtime + 1.0
    except Exception:  # noqa: BLE001 - no psutil answer: trust the pid
        return True


def sweep_staging(renders_dir: Path, live_pids: Iterable[int] | None = None,
                  host: str | None = None) -> list[Path]:
    """Remove this host's staging folders whose render process is gone; returns them.

    live_pids: the render pids to keep (any other folder is stale); None judges each
    folder by its pid on this host (see `_owner_alive`)."""
    renders_dir = Path(renders_dir)
    keep = None if live_pids is None else set(live_pids)
    removed: list[Path] = []
    try:
        groups = [g for g in renders_dir.iterdir() if not g.name.startswith(".")]
    except OSError:
        return removed
    for group in groups:
        root = staging_root(group, host)
        try:
            entries = list(root.iterdir())
        except OSError:
            continue
        for s in entries:
            pid = _pid_of(s.name)
            if pid is None:
                continue  # not a name this module makes: leave it alone
            alive = (pid in keep) if keep is not None else _owner_alive(pid, s)
            if alive:
                continue
            shutil.rmtree(s, ignore_errors=True)
            if s.exists():  # a file created meanwhile (an orphaned ffmpeg finishing)
                shutil.rmtree(s, ignore_errors=True)
            removed.append(s)
        for d in (root, root.parent):
            try:
                d.rmdir()
            except OSError:
                break
    return removed
