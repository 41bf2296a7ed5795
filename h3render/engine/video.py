"""Write a render's frames to disk: an H.264 mp4, PNG frames and a poster.

Frames arrive one at a time (the engine's frame callback) and go straight to an
ffmpeg process (the binary shipped by imageio-ffmpeg), so a long video never
sits in memory. Every file is written under a temporary name in its final
directory and renamed only when the whole render succeeded: a reader never
sees a half-written video, and a failed render leaves nothing behind.
`close(fsync=True)` also flushes each file to the disk before it is renamed.
(The render task goes one step further: it points RenderOutputs at a staging
folder of its own and publishes the whole job folder by one rename,
h3render.worker.staging.)

A full disk is reported as such: an OSError with errno ENOSPC (or EDQUOT) from
Python's own writes, a VideoError whose `errno` is ENOSPC/EDQUOT when ffmpeg
said so in its log.

`probe` reads a video back (codec, pixel format, size, fps, frame count) by
running the same ffmpeg; `parse_probe` is the pure parser of its log.
"""

# Why Mp4Writer drives ffmpeg itself rather than through imageio_ffmpeg.write_frames
# (the same package's streaming writer, which we use for its ffmpeg binary and for
# read_frames): write_frames leaves ffmpeg's stderr on our own process's stderr and
# never looks at its exit status, so a failed encode ends without an exception. Fed
# a full disk (/dev/full) it returns normally (tests/test_video.py pins this). We
# need that failure raised, with ffmpeg's own words in it (the job's error) and the
# errno it names (ENOSPC/EDQUOT send the job back to the queue), and we need the
# file under a temporary name, flushed (fsync) and renamed only on success, which
# write_frames, writing to the final path, does not do either.

from __future__ import annotations

import errno as _errno
import os
import re
import subprocess
import tempfile
import uuid
from pathlib import Path

import imageio_ffmpeg
import numpy as np
from PIL import Image
from pydantic import BaseModel

DEFAULT_CRF = 18  # x264 constant rate factor: visually lossless for generated video


class VideoError(RuntimeError):
    """ffmpeg failed to write or read a video; the message carries its log.

    `errno` is set when the log names an OS error the caller acts on: ENOSPC
    ("No space left on device") or EDQUOT ("Disk quota exceeded")."""

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno


_LOG_ERRNOS = {os.strerror(_errno.ENOSPC): _errno.ENOSPC, os.strerror(_errno.EDQUOT): _errno.EDQUOT}


def _log_errno(text: str) -> int | None:
    return next((code for msg, code in _LOG_ERRNOS.items() if msg in text), None)


def fsync_file(path: Path) -> None:
    """Flush a written file's data to the disk (before it is renamed into place)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ffmpeg_exe() -> str:
    return imageio_ffmpeg.get_ffmpeg_exe()


def _temp_name(final: Path) -> Path:
    """A unique temporary sibling of `final`, keeping its suffix."""
    return final.with_name(f".{final.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp{final.suffix}")


def _as_frame(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    frame = np.asarray(rgb)
    if frame.dtype != np.uint8 or frame.shape != (height, width, 3):
        raise ValueError(
            f"frame must be uint8 (height, width, 3) = ({height}, {width}, 3), "
            f"got {frame.dtype} {frame.shape}"
        )
    return np.ascontiguousarray(frame)


# ---------------------------------------------------------------------------
# mp4
# ---------------------------------------------------------------------------


class Mp4Writer:
    """Streams RGB frames into an H.264 yuv420p mp4 through ffmpeg.

    The file appears at `path` only after `close()` succeeds; `abort()` (or an
    exception inside a `with` block) removes the partial file.
    """

    def __init__(self, path: Path, width: int, height: int, fps: float, crf: int = DEFAULT_CRF):
        if width < 2 or height < 2 or width % 2 or height % 2:
            raise ValueError(f"H.264 yuv420p needs even width and height >= 2, got {width}x{height}")
        if not fps > 0:
            raise ValueError(f"fps={fps} must be positive")
        self.path, self.width, self.height, self.frames = Path(path), width, height, 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = _temp_name(self.path)
        self._log = tempfile.TemporaryFile()
        cmd = [
            ffmpeg_exe(), "-y", "-nostdin", "-hide_banner", "-loglevel", "error",
            "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", f"{fps}",
            "-i", "-", "-an", "-c:v", "libx264", "-preset", "medium", "-crf", str(crf),
            "-pix_fmt", "yuv420p", "-movflags", "+faststart", "-f", "mp4", str(self._tmp),
        ]  # fmt: skip
        self._proc: subprocess.Popen | None = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._log
        )

    def write(self, rgb: np.ndarray) -> None:
        """Append one (height, width, 3) uint8 frame."""
        frame = _as_frame(rgb, self.width, self.height)
        if self._proc is None or self._proc.stdin is None:
            raise VideoError(f"{self.path}: writer is closed")
        try:
            self._proc.stdin.write(frame.tobytes())
        except (BrokenPipeError, OSError) as exc:
            self._finish()
            text = self._log_text()
            self._cleanup()
            raise VideoError(f"{self.path}: ffmpeg stopped: {text}", _log_errno(text)) from exc
        self.frames += 1

    def close(self, fsync: bool = False) -> Path:
        """Finish encoding and rename the file into place; returns its path."""
        if self._proc is None:
            return self.path
        if self.frames == 0:
            self.abort()
            raise VideoError(f"{self.path}: no frames were written")
        rc = self._finish()
        if rc != 0:
            text = self._log_text()
            self._cleanup()
            raise VideoError(f"{self.path}: ffmpeg exited with {rc}: {text}", _log_errno(text))
        try:
            if fsync:
                fsync_file(self._tmp)
            os.replace(self._tmp, self.path)
        except OSError:
            self._cleanup()
            raise
        self._log.close()
        return self.path

    def abort(self) -> None:
        """Stop ffmpeg and delete the partial file."""
        if self._proc is not None:
            self._proc.kill()
            self._finish()
        self._cleanup()

    def _finish(self) -> int:
        proc, self._proc = self._proc, None
        if proc is None:
            return -1
        try:
            if proc.stdin:
                proc.stdin.close()
        except OSError:
            pass
        return proc.wait()

    def _cleanup(self) -> None:
        self._tmp.unlink(missing_ok=True)
        if not self._log.closed:
            self._log.close()

    def _log_text(self) -> str:
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace").strip()[-2000:]

    def __del__(self) -> None:  # never leave ffmpeg running or a temp file behind
        if getattr(self, "_proc", None) is not None:
            try:
                self.abort()
            except Exception:
                pass

    def __enter__(self) -> "Mp4Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# ---------------------------------------------------------------------------
# PNG frames and poster
# ---------------------------------------------------------------------------


def write_png(path: Path, rgb: np.ndarray) -> Path:
    """Write one RGB frame as PNG under a temporary name, then rename it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(path)
    try:
        Image.fromarray(np.asarray(rgb, dtype=np.uint8), "RGB").save(tmp, format="PNG")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def frame_name(index: int) -> str:
    return f"frame_{index:05d}.png"


class RenderOutputs:
    """Everything one render writes, fed frame by frame in order.

    video: mp4 path (or None); frames_dir: PNG per frame (or None); poster: PNG
    of the middle frame, index total // 2 (or None). Nothing appears under a
    final name until `close()`; `abort()` removes every temporary file.
    """

    def __init__(
        self,
        *,
        width: int,
        height: int,
        total: int,
        fps: float,
        video: Path | None = None,
        frames_dir: Path | None = None,
        poster: Path | None = None,
        crf: int = DEFAULT_CRF,
    ):
        if total < 1:
            raise ValueError(f"total={total} frames must be at least 1")
        self.width, self.height, self.total, self.count = width, height, total, 0
        self.video, self.frames_dir, self.poster = video, frames_dir, poster
        self._pending: list[tuple[Path, Path]] = []  # (temporary, final)
        self._mp4 = Mp4Writer(video, width, height, fps, crf) if video is not None else None
        if frames_dir is not None:
            Path(frames_dir).mkdir(parents=True, exist_ok=True)

    def add(self, index: int, rgb: np.ndarray) -> None:
        """Take output frame `index`; frames must arrive as 0, 1, 2, ..."""
        if index != self.count or index >= self.total:
            raise ValueError(f"frame index {index} out of order: expected {self.count} of {self.total}")
        frame = _as_frame(rgb, self.width, self.height)
        if self._mp4 is not None:
            self._mp4.write(frame)
        if self.frames_dir is not None:
            self._stage_png(Path(self.frames_dir) / frame_name(index), frame)
        if self.poster is not None and index == self.total // 2:
            self._stage_png(Path(self.poster), frame)
        self.count += 1

    def _stage_png(self, final: Path, frame: np.ndarray) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_name(final)
        self._pending.append((tmp, final))
        Image.fromarray(frame, "RGB").save(tmp, format="PNG")

    def close(self, fsync: bool = False) -> dict[str, Path]:
        """Check all frames arrived, finish the mp4, rename everything into place
        (after flushing each file to the disk when `fsync`)."""
        if self.count != self.total:
            self.abort()
            raise VideoError(f"render produced {self.count} frames, expected {self.total}")
        written: dict[str, Path] = {}
        placed: list[Path] = []  # a close that fails half way takes back what it renamed
        try:
            if self._mp4 is not None:
                written["video"] = self._mp4.close(fsync=fsync)
                placed.append(written["video"])
            if fsync:
                for tmp, _ in self._pending:
                    fsync_file(tmp)
            for tmp, final in self._pending:
                os.replace(tmp, final)
                placed.append(final)
        except BaseException:
            self.abort()
            for f in placed:
                f.unlink(missing_ok=True)
            raise
        self._pending.clear()
        if self.poster is not None:
            written["poster"] = Path(self.poster)
        if self.frames_dir is not None:
            written["frames_dir"] = Path(self.frames_dir)
        return written

    def abort(self) -> None:
        if self._mp4 is not None:
            self._mp4.abort()
        for tmp, _ in self._pending:
            tmp.unlink(missing_ok=True)
        self._pending.clear()

    def __enter__(self) -> "RenderOutputs":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


# ---------------------------------------------------------------------------
# probe
# ---------------------------------------------------------------------------


class VideoProbe(BaseModel):
    """What ffmpeg reports about a video's first video stream."""

    codec: str
    pix_fmt: str
    width: int
    height: int
    fps: float | None
    frames: int


_STREAM = re.compile(
    r"Stream #0:\d+\S*: Video: (?P<codec>\w+)[^,]*, (?P<pix_fmt>\w+)(?:\([^)]*\))?, "
    r"(?P<w>\d+)x(?P<h>\d+)(?P<rest>.*)"
)
_FPS = re.compile(r"(?P<fps>\d+(?:\.\d+)?) fps")
_FRAMES = re.compile(r"frame=\s*(\d+)")


def parse_probe(log: str) -> VideoProbe:
    """Parse the log of `ffmpeg -i FILE -map 0:v:0 -c copy -f null -`.

    The first video stream line gives codec, pixel format and size; the last
    progress line gives the number of frames copied. Raises ValueError when
    either is missing.
    """
    stream = _STREAM.search(log)
    counts = _FRAMES.findall(log)
    if stream is None or not counts:
        raise ValueError(f"no video stream or frame count in ffmpeg output: {log[-500:]!r}")
    fps = _FPS.search(stream.group("rest"))
    return VideoProbe(
        codec=stream.group("codec"),
        pix_fmt=stream.group("pix_fmt"),
        width=int(stream.group("w")),
        height=int(stream.group("h")),
        fps=float(fps.group("fps")) if fps else None,
        frames=int(counts[-1]),
    )


def probe(path: Path) -> VideoProbe:
    """Read back codec, pixel format, size, fps and frame count of a video file."""
    path = Path(path)
    if not path.is_file():
        raise VideoError(f"{path}: no such file")
    cmd = [ffmpeg_exe(), "-nostdin", "-hide_banner", "-i", str(path), "-map", "0:v:0", "-c", "copy", "-f", "null", "-"]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        raise VideoError(f"{path}: ffmpeg cannot read it: {proc.stderr.strip()[-1000:]}")
    try:
        return parse_probe(proc.stderr)
    except ValueError as exc:
        raise VideoError(f"{path}: {exc}") from exc


def read_frames(path: Path) -> np.ndarray:
    """Decode a whole (small) video to (frames, height, width, 3) uint8, for tests and checks."""
    gen = imageio_ffmpeg.read_frames(str(path))
    meta = next(gen)
    width, height = meta["size"]
    frames = [np.frombuffer(b, np.uint8).reshape(height, width, 3) for b in gen]
    return np.stack(frames) if frames else np.zeros((0, height, width, 3), np.uint8)
