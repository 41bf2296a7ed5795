"""`h3render run` end to end: a subprocess, the real C engine, real ffmpeg, files read back.

Renders the built-in tiny random Wan pipeline (h3render/data/tiny-wan) converted once per
session. Each render takes a few seconds on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import psnr
from h3render.engine.binding import Engine
from h3render.engine.video import frame_name, probe, read_frames

ROOT = Path(__file__).resolve().parents[1]
H3RENDER = [sys.executable, "-c", "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"]
PROMPT = "a red circle moving left over a blue background"
# The mp4 holds the same frames as the PNGs, through H.264 crf 18 and yuv420p (chroma at
# half resolution). The tiny random model's 3-step frames are noise-like, the hardest case
# for a codec. Measured on this render: RGB 25.1 dB, luma 36.9 dB; with the frames
# reversed or shifted by one, R and B swapped, or rows flipped: RGB <= 16.8 dB, luma
# <= 29.4 dB. These floors sit between the two.
MP4_VS_PNG_MIN_PSNR_DB = 22.0
MP4_VS_PNG_MIN_LUMA_PSNR_DB = 33.0
LUMA = np.array([0.299, 0.587, 0.114])  # BT.601 weights, as ffmpeg's rgb -> yuv420p


def h3render(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "H3RENDER_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    return subprocess.run([*H3RENDER, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def model(converted_models):
    return converted_models("tiny-wan")


@pytest.fixture(scope="module")
def info(model):
    with Engine(model, 1) as engine:
        info = engine.info()
    # The messages below are Wan's rules; the tiny model keeps Wan's VAE strides and patch.
    assert info["frame_rule"] == {"multiple": 4, "offset": 1} and info["size_multiple"] == 16, info
    return info


@pytest.fixture(scope="module")
def size(info):
    """A small non-square render: (width, height, frames)."""
    return 48, 32, 9


@pytest.fixture(scope="module")
def baseline(model, size, tmp_path_factory):
    """One full render through the CLI; returns (dir, completed process, summary)."""
    out = tmp_path_factory.mktemp("run")
    width, height, frames = size
    proc = h3render(
        "run", "--model", model, "--prompt", PROMPT, "--seed", 7, "--width", width, "--height", height,
        "--frames", frames, "--steps", 3, "--threads", 2, "--frames-dir", out / "frames",
        "-o", out / "out.mp4", "--json", home=out / "home",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out, proc, json.loads(proc.stdout)


def pngs(folder: Path, n: int) -> np.ndarray:
    return np.stack([np.asarray(Image.open(folder / frame_name(i))) for i in range(n)])


def test_run_writes_mp4_frames_and_poster(baseline, size):
    out, proc, summary = baseline
    width, height, frames = size
    assert summary["video"] == str(out / "out.mp4") and summary["poster"] == str(out / "out.png")
    assert (summary["width"], summary["height"], summary["frames"], summary["seed"]) == (width, height, frames, 7)

    video = probe(out / "out.mp4")
    assert (video.codec, video.pix_fmt) == ("h264", "yuv420p")
    assert (video.frames, video.width, video.height) == (frames, width, height)

    png = pngs(out / "frames", frames)
    assert png.shape == (frames, height, width, 3)
    assert sorted(p.name for p in (out / "frames").iterdir()) == [frame_name(i) for i in range(frames)]
    assert np.array_equal(np.asarray(Image.open(out / "out.png")), png[frames // 2])  # poster = middle frame
    assert png.std() > 1.0, "frames are flat: nothing was rendered"

    decoded = read_frames(out / "out.mp4")
    quality, luma = psnr(decoded, png), psnr(decoded @ LUMA, png @ LUMA)
    print(f"mp4 vs PNG frames: {quality:.1f} dB RGB, {luma:.1f} dB luma")
    assert quality >= MP4_VS_PNG_MIN_PSNR_DB and luma >= MP4_VS_PNG_MIN_LUMA_PSNR_DB
    assert "denois" in proc.stderr  # the progress bar showed the denoising phase
    assert not [p for p in out.rglob(".*tmp*")], "temporary files left behind"


def test_same_seed_same_frames_any_thread_count(baseline, model, size, tmp_path):
    out, _, _ = baseline
    width, height, frames = size
    proc = h3render(
        "run", "--model", model, "--prompt", PROMPT, "--seed", 7, "--width", width, "--height", height,
        "--frames", frames, "--steps", 3, "--threads", 1, "--frames-dir", tmp_path / "frames",
        "-o", tmp_path / "again.mp4", home=tmp_path / "home",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for i in range(frames):
        a = (out / "frames" / frame_name(i)).read_bytes()
        assert a == (tmp_path / "frames" / frame_name(i)).read_bytes(), f"frame {i} differs between 2 and 1 threads"
    assert f"video      {tmp_path / 'again.mp4'}" in proc.stdout  # plain output names the files


def test_init_latents_replace_the_seed(baseline, model, size, tmp_path):
    out, _, _ = baseline
    width, height, frames = size
    with Engine(model, 1) as engine:
        shape = engine.latent_shape(width, height, frames)
    noise = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "noise.npy", noise)
    rendered = []
    for seed in (1, 2):
        d = tmp_path / f"seed{seed}"
        proc = h3render(
            "run", "--model", model, "--prompt", PROMPT, "--seed", seed, "--width", width, "--height", height,
            "--frames", frames, "--steps", 3, "--init-latents", tmp_path / "noise.npy",
            "--frames-dir", d, "-o", d / "v.mp4", home=tmp_path / "home",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        rendered.append(pngs(d, frames))
    assert np.array_equal(rendered[0], rendered[1]), "with --init-latents the seed must not matter"
    assert not np.array_equal(rendered[0], pngs(out / "frames", frames)), "--init-latents was ignored"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--frames", "20"], "frames=20: is not 4k+1; nearest valid: '17 or 21'"),
        (["--width", "100"], "width=100: is not a multiple of 16; nearest valid: '96 or 112'"),
        (["--height", "0"], "height=0: must be an integer in [1, 16384] (pixels); nearest valid: 16"),
        (["--quant", "q9"], "quant='q9': must be one of the quant levels of model"),
        (["--model", "nope"], "model='nope' is not installed"),
        (["--model", "../nope"], "does not exist"),
        (["--sampler", "ddim"], "sampler='ddim': must be one of unipc, euler"),
        (["--steps", "0"], "steps=0: must be an integer in [1, 1000]; nearest valid: 1"),
        (["-o", "out.avi"], "must end in .mp4"),
        (["--init-latents", "WRONG"], "does not match this render's latents (C, T', H', W')"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_bad_input_exits_2(model, tmp_path, args, message):
    np.save(tmp_path / "wrong.npy", np.zeros((1, 2, 3), np.float32))
    args = [str(tmp_path / "wrong.npy") if a == "WRONG" else a for a in args]
    base = {"--model": str(model), "-o": str(tmp_path / "out.mp4"), "--width": "48", "--height": "32",
            "--frames": "9", "--steps": "2"}  # fmt: skip
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    flat = [x for kv in base.items() for x in kv]
    proc = h3render("run", "--prompt", PROMPT, *flat, home=tmp_path / "home")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert message in " ".join(proc.stderr.split()), proc.stderr
    assert not list(tmp_path.glob("out*")), "nothing is written on bad input"


def test_engine_failure_exits_1(model, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(model, broken)
    gguf = broken / "transformer-f32.gguf"
    gguf.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])  # truncated weights
    proc = h3render("run", "--model", broken, "--prompt", PROMPT, "--quant", "f32", "-o", tmp_path / "o.mp4",
                    home=tmp_path / "home")  # fmt: skip
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "render failed" in proc.stderr and "transformer-f32.gguf" in proc.stderr, proc.stderr
    assert not (tmp_path / "o.mp4").exists()
