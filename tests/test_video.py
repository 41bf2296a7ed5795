"""Video outputs: mp4 through the real ffmpeg, PNG frames and poster, atomic writes, probe."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from conftest import psnr
from h3render.engine.video import (
    Mp4Writer,
    RenderOutputs,
    VideoError,
    frame_name,
    parse_probe,
    probe,
    read_frames,
)

# H.264 at crf 18 is lossy. Luma alone (a grey clip) comes back at 47 dB here; 42 dB
# leaves room for other x264 builds. yuv420p also halves chroma resolution, which on
# this saturated colour clip caps PSNR near 36 dB even at crf 0 (measured 34.9 at crf 18).
MP4_GREY_MIN_PSNR_DB = 42.0
MP4_COLOUR_MIN_PSNR_DB = 32.0


def clip(frames: int, height: int, width: int) -> np.ndarray:
    """A smooth moving gradient (what video codecs are built for), (F, H, W, 3) uint8."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    out = np.empty((frames, height, width, 3), np.uint8)
    for f in range(frames):
        out[f, ..., 0] = 127.5 + 127.5 * np.sin((x + 3 * f) / width * 2 * np.pi)
        out[f, ..., 1] = 127.5 + 127.5 * np.cos((y - 2 * f) / height * 2 * np.pi)
        out[f, ..., 2] = 127.5 + 127.5 * np.sin((x + y + 4 * f) / (width + height) * 2 * np.pi)
    return out


def test_round_trip_mp4_png_poster(tmp_path):
    frames = clip(9, 48, 80)
    out = RenderOutputs(
        width=80, height=48, total=9, fps=16,
        video=tmp_path / "v.mp4", frames_dir=tmp_path / "frames", poster=tmp_path / "poster.png",
    )  # fmt: skip
    for i, f in enumerate(frames):
        out.add(i, f)
    written = out.close()
    assert written == {"video": tmp_path / "v.mp4", "poster": tmp_path / "poster.png", "frames_dir": tmp_path / "frames"}

    info = probe(tmp_path / "v.mp4")
    assert (info.codec, info.pix_fmt, info.width, info.height, info.frames) == ("h264", "yuv420p", 80, 48, 9)
    assert info.fps == 16.0

    decoded = read_frames(tmp_path / "v.mp4")
    assert decoded.shape == frames.shape
    quality = psnr(decoded, frames)
    print(f"mp4 round trip PSNR (colour) {quality:.1f} dB")
    assert quality >= MP4_COLOUR_MIN_PSNR_DB

    # PNG is lossless: frames and poster (the middle frame, index total // 2) come back exactly.
    names = sorted(p.name for p in (tmp_path / "frames").iterdir())
    assert names == [frame_name(i) for i in range(9)]
    for i in range(9):
        assert np.array_equal(np.asarray(Image.open(tmp_path / "frames" / frame_name(i))), frames[i])
    assert np.array_equal(np.asarray(Image.open(tmp_path / "poster.png")), frames[4])
    assert not [p for p in tmp_path.rglob(".*tmp*")], "temporary files left behind"


def test_mp4_luma_quality(tmp_path):
    grey = np.repeat(clip(9, 48, 80)[..., :1], 3, axis=-1)
    with Mp4Writer(tmp_path / "grey.mp4", 80, 48, 16) as w:
        for f in grey:
            w.write(f)
    quality = psnr(read_frames(tmp_path / "grey.mp4"), grey)
    print(f"mp4 round trip PSNR (grey) {quality:.1f} dB")
    assert quality >= MP4_GREY_MIN_PSNR_DB


def test_failed_render_leaves_nothing(tmp_path):
    frames = clip(5, 32, 32)
    with pytest.raises(RuntimeError, match="engine failed"):
        with RenderOutputs(
            width=32, height=32, total=5, fps=16,
            video=tmp_path / "v.mp4", frames_dir=tmp_path / "frames", poster=tmp_path / "p.png",
        ) as out:  # fmt: skip
            for i in range(3):
                out.add(i, frames[i])
            raise RuntimeError("engine failed")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["frames"]  # the (empty) dir only


def test_missing_frames_is_an_error(tmp_path):
    out = RenderOutputs(width=32, height=32, total=5, fps=16, video=tmp_path / "v.mp4")
    for i, f in enumerate(clip(4, 32, 32)):
        out.add(i, f)
    with pytest.raises(VideoError, match="4 frames, expected 5"):
        out.close()
    assert list(tmp_path.iterdir()) == []


def test_bad_frames_are_rejected(tmp_path):
    out = RenderOutputs(width=32, height=32, total=3, fps=16, poster=tmp_path / "p.png")
    with pytest.raises(ValueError, match=r"uint8 \(height, width, 3\) = \(32, 32, 3\), got uint8 \(32, 30, 3\)"):
        out.add(0, np.zeros((32, 30, 3), np.uint8))
    with pytest.raises(ValueError, match="float32"):
        out.add(0, np.zeros((32, 32, 3), np.float32))
    with pytest.raises(ValueError, match="out of order: expected 0"):
        out.add(1, np.zeros((32, 32, 3), np.uint8))
    out.abort()
    with pytest.raises(ValueError, match="even width and height"):
        Mp4Writer(tmp_path / "odd.mp4", 33, 32, 16)


def test_existing_file_replaced_only_on_success(tmp_path):
    target = tmp_path / "v.mp4"
    target.write_bytes(b"old")
    w = Mp4Writer(target, 32, 32, 8)
    w.write(clip(1, 32, 32)[0])
    assert target.read_bytes() == b"old"  # still the old file while encoding
    w.close()
    assert probe(target).frames == 1


def test_probe_errors(tmp_path):
    with pytest.raises(VideoError, match="no such file"):
        probe(tmp_path / "missing.mp4")
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(VideoError, match="ffmpeg cannot read it"):
        probe(bad)


# A real log of `ffmpeg -i v.mp4 -map 0:v:0 -c copy -f null -` (ffmpeg 7), trimmed.
FFMPEG_LOG = """\
Input #0, mov,mp4,m4a,3gp,3g2,mj2, from 'v.mp4':
  Duration: 00:00:01.06, start: 0.000000, bitrate: 23 kb/s
  Stream #0:0[0x1](und): Video: h264 (High) (avc1 / 0x31637661), yuv420p(progressive), 64x48 [SAR 1:1 DAR 4:3], 15 kb/s, 16 fps, 16 tbr, 16384 tbn (default)
Stream mapping:
  Stream #0:0 -> #0:0 (copy)
Output #0, null, to 'pipe:':
  Stream #0:0(und): Video: h264 (High) (avc1 / 0x31637661), yuv420p(progressive), 64x48 [SAR 1:1 DAR 4:3], q=2-31, 15 kb/s, 16 fps, 16 tbr, 16384 tbn (default)
frame=    8 fps=0.0 q=-1.0 size=N/A time=00:00:00.43 bitrate=N/A speed=5.7e+03x\r\
frame=   17 fps=0.0 q=-1.0 Lsize=N/A time=00:00:00.93 bitrate=N/A speed=5.79e+03x elapsed=0:00:00.00
"""


def test_parse_probe_recorded_log():
    info = parse_probe(FFMPEG_LOG)
    assert info.model_dump() == {
        "codec": "h264", "pix_fmt": "yuv420p", "width": 64, "height": 48, "fps": 16.0, "frames": 17,
    }  # fmt: skip
    with pytest.raises(ValueError, match="no video stream"):
        parse_probe("Input #0, wav, from 'a.wav':\n  Stream #0:0: Audio: pcm_s16le\n")


def test_library_writer_hides_a_full_disk_which_is_why_ours_stays(capfd):
    """imageio_ffmpeg.write_frames returns normally when ffmpeg fails (see video.py's top):
    the day it raises, Mp4Writer can be replaced by it."""
    import imageio_ffmpeg

    gen = imageio_ffmpeg.write_frames("/dev/full", (32, 32), output_params=["-f", "mp4"], macro_block_size=1)
    gen.send(None)
    for f in clip(3, 32, 32):
        gen.send(f.tobytes())
    gen.close()  # no exception, although nothing could be written
    assert "No space left on device" in capfd.readouterr().err  # only in our own stderr


def test_ffmpeg_full_disk_log_names_the_errno():
    import errno

    from h3render.engine.video import _log_errno

    log = "[out#0/mp4 @ 0x5] Could not write header (incorrect codec parameters ?): No space left on device"
    assert _log_errno(log) == errno.ENOSPC
    assert _log_errno("Disk quota exceeded") == errno.EDQUOT and _log_errno("Invalid argument") is None
