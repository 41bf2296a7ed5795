"""The engine ABI as a caller sees it: open, info, request validation, errors, callbacks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from h3render.engine.binding import ABI_VERSION, MIN_ABI_VERSION, Engine, GenerateRequest, load_library
from h3render.engine.exceptions import (
    EngineCanceled,
    InvalidRequestError,
    ModelFileError,
    ModelNotFoundError,
    UnsupportedError,
)


@pytest.fixture(scope="module")
def tiny(converted_models):
    return converted_models("tiny-wan", ("f32", "f16"))


@pytest.fixture(scope="module")
def engine(tiny):
    with Engine(tiny, threads=2) as e:
        yield e


def small_request(engine: Engine, **kw) -> GenerateRequest:
    info = engine.info()
    mult = info["size_multiple"]
    base = dict(width=mult * 2, height=mult * 2, frames=5, steps=2, seed=7, prompt_ids=[5, 6, 1],
                negative_ids=[1], guidance=4.0, quant="f32")
    base.update(kw)
    return GenerateRequest(**base)


def test_info_describes_model_and_rules(engine):
    info = engine.info()
    assert info["engine"] == "h3render-cpu"
    # the library's own version; an ABI 1 library (no estimate) still renders
    assert info["abi"] == load_library().h3r_abi_version()
    assert MIN_ABI_VERSION <= info["abi"] <= ABI_VERSION
    assert info["quant_levels"] == ["f32", "f16"]
    assert info["frame_rule"] == {"multiple": 4, "offset": 1}
    assert info["size_multiple"] == 16
    assert info["prompt"] == "token_ids"
    assert info["vae_stride"] == [4, 8, 8]
    assert set(info["weight_bytes"]) == {"f32", "f16"}
    # f16 files are smaller than f32 ones
    assert info["weight_bytes"]["f16"] < info["weight_bytes"]["f32"]
    assert all(info["components"].values())
    # the pipeline's text defaults come through too (jobs and `run` use them)
    assert info["defaults"]["negative_prompt"] == "blurry, static, low quality, dark"
    assert info["defaults"]["sampler"] == "unipc"


def test_open_missing_dir_names_it(tmp_path):
    with pytest.raises(ModelNotFoundError, match="nope"):
        Engine(tmp_path / "nope")


def test_open_empty_dir_says_what_is_expected(tmp_path):
    with pytest.raises(ModelNotFoundError, match="transformer-<quant>.gguf"):
        Engine(tmp_path)


def test_open_truncated_file_names_the_file(tiny, tmp_path):
    """A broken file is set aside at open: its own level is unusable, naming it; the rest render."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny, broken)
    vae = broken / "vae-f16.gguf"
    data = vae.read_bytes()
    vae.write_bytes(data[: len(data) // 2])
    with Engine(broken) as eng:
        info = eng.info()
        assert info["quant_levels"] == ["f32"]
        assert "vae-f16.gguf" in info["unusable_levels"]["f16"]
        assert [b["file"] for b in info["broken_files"]] == ["vae-f16.gguf"]
        with pytest.raises(ModelFileError, match=r"quant=f16 of model .* is unusable: .*vae-f16\.gguf"):
            eng.generate(small_request(eng, quant="f16"))
        frames = []
        eng.generate(small_request(eng, quant="f32"), on_frame=lambda k, i, rgb: frames.append(i) if k == 0 else None)
        assert frames
    for f in broken.glob("*.gguf"):  # nothing usable left: open fails naming a file
        if f.name != "vae-f16.gguf":
            f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(ModelFileError, match=r"\.gguf"):
        Engine(broken)


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("width", 40, "width=40 must be a positive multiple of 16 \\(nearest: 48\\)"),
        ("height", 0, "height=0"),
        ("frames", 6, "frames=6 must be 4k\\+1 \\(nearest: 5 or 9\\)"),
        ("steps", 0, "steps=0"),
        ("guidance", float("nan"), "guidance=nan"),
        ("shift", -1.0, "shift=-1"),
        ("quant", "q3_x", "quant=q3_x is not available .* available: f32, f16"),
    ],
)
def test_bad_request_fields_are_named(engine, field, value, needle):
    with pytest.raises((InvalidRequestError, UnsupportedError), match=needle):
        engine.generate(small_request(engine, **{field: value}))


def test_unknown_engine_option_is_refused(engine):
    with pytest.raises(InvalidRequestError, match="'colour' is not known"):
        engine.generate(small_request(engine, options={"colour": "red"}))


def test_crash_trigger_needs_the_test_switch(engine, monkeypatch):
    monkeypatch.delenv("H3RENDER_ENABLE_TEST_TRIGGERS", raising=False)
    with pytest.raises(InvalidRequestError, match="H3RENDER_ENABLE_TEST_TRIGGERS=1"):
        engine.generate(small_request(engine, options={"test_crash_at_step": 1}))


def test_crash_trigger_kills_the_process_when_enabled(tiny):
    """The worker's crash test relies on this: the process dies with SIGSEGV."""
    code = (
        "from h3render.engine.binding import Engine, GenerateRequest\n"
        f"e = Engine({str(tiny)!r}, threads=1)\n"
        "e.generate(GenerateRequest(width=32, height=32, frames=5, steps=3, prompt_ids=[5, 1],"
        " guidance=1.0, quant='f32', options={'test_crash_at_step': 1}))\n"
        "print('survived')\n"
    )
    env = dict(os.environ, H3RENDER_ENABLE_TEST_TRIGGERS="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == -11, (proc.returncode, proc.stdout, proc.stderr)
    assert "survived" not in proc.stdout


def test_progress_and_frames(engine):
    events, frames = [], []
    req = small_request(engine, steps=3)
    engine.generate(req, on_progress=lambda p, d, t: events.append((p, d, t)),
                    on_frame=lambda kind, i, f: frames.append((kind, i, f.shape, f.dtype)))
    denoise = [e for e in events if e[0] == "denoise"]
    assert denoise[-1] == ("denoise", 3, 3)
    assert [d for _, d, _ in denoise] == [0, 1, 2, 3]
    assert any(e[0] == "encode" for e in events) and any(e[0] == "decode" for e in events)
    assert [i for _, i, _, _ in frames] == list(range(5))
    assert all(kind == 0 and shape == (32, 32, 3) and dt == np.uint8 for kind, _, shape, dt in frames)


def test_cancel_from_progress_stops_within_one_step(engine):
    seen = []

    def progress(phase, done, total):
        seen.append((phase, done))
        return phase == "denoise" and done == 1

    with pytest.raises(EngineCanceled, match="canceled"):
        engine.generate(small_request(engine, steps=5), on_progress=progress)
    assert seen[-1] == ("denoise", 1)


def test_exception_in_callback_cancels_and_is_reraised(engine):
    def progress(phase, done, total):
        if phase == "denoise" and done == 1:
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        engine.generate(small_request(engine), on_progress=progress)


def test_previews_arrive_per_step(engine):
    kinds = []
    engine.generate(small_request(engine, steps=3, preview_every=1),
                    on_frame=lambda kind, i, f: kinds.append((kind, i)))
    previews = [i for kind, i in kinds if kind == 1]
    assert previews == [0, 1, 2]


def test_init_latents_size_is_checked(engine):
    req = small_request(engine, init_latents=np.zeros(10, np.float32))
    with pytest.raises(InvalidRequestError, match="init_latents has 10 values"):
        engine.generate(req)


def test_engine_usable_after_errors(engine):
    with pytest.raises(InvalidRequestError):
        engine.generate(small_request(engine, width=17))
    frames = []
    engine.generate(small_request(engine), on_frame=lambda k, i, f: frames.append(f))
    assert len(frames) == 5
