"""Model directories in a temporary H3RENDER_HOME: names, listing, on-demand conversion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES
from h3render import paths
from h3render.engine import models
from h3render.engine.exceptions import ConvertError, InvalidRequestError, ModelFileError, ModelNotFoundError

H3RENDER = [sys.executable, "-c", "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"]
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("H3RENDER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_paths_follow_env_and_create_nothing(home):
    assert paths.home() == home
    assert paths.models_dir() == home / "models"
    assert paths.renders_dir() == home / "renders"
    assert paths.tune_dir() == home / "tune"
    assert paths.redis_dir() == home / "redis"
    assert not home.exists()  # reading a path has no side effect
    assert paths.models_dir(ensure=True).is_dir()


@pytest.mark.parametrize("bad", ["../x", "a/b", "/etc", "", ".hidden", "-x", "a..b", "x" * 65, "a b", "a\\b"])
def test_names_are_never_paths(bad):
    with pytest.raises(InvalidRequestError, match=r"is not a model name"):
        models.validate_name(bad)
    with pytest.raises(InvalidRequestError):
        models.resolve_model(bad)


@pytest.mark.parametrize("good", ["tiny-wan", "Wan2.1-T2V-1.3B", "m_1"])
def test_good_names(good):
    assert models.validate_name(good) == good


def test_install_list_resolve(home):
    # dit_a holds only a transformer/: the converter writes transformer-f32.gguf.
    path = models.install_pipeline(FIXTURES / "dit_a", "dit-a", ["f32"])
    assert path == home / "models" / "dit-a"
    assert (path / "transformer-f32.gguf").is_file()
    assert json.loads((path / "model.json").read_text())["name"] == "dit-a"
    assert [p.name for p in (home / "models").iterdir()] == ["dit-a"]  # no temp dir left

    listed = {m.name: m for m in models.list_models()}
    entry = listed["dit-a"]
    assert entry.installed and entry.quants == ["f32"] and entry.components == {"transformer": ["f32"]}
    assert entry.size_bytes == (path / "transformer-f32.gguf").stat().st_size + (path / "model.json").stat().st_size
    assert not entry.has_tokenizer
    if models.BUILTIN["tiny-wan"].is_dir():
        assert not listed["tiny-wan"].installed and listed["tiny-wan"].builtin

    assert models.resolve_model("dit-a") == path
    assert models.resolve_model_arg("dit-a") == path
    assert models.resolve_model_arg(str(path)) == path
    with pytest.raises(ModelNotFoundError, match=r"model='nope' is not installed .*available: dit-a"):
        models.resolve_model("nope")


def test_directory_arguments(home, tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        models.resolve_model_arg(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelFileError, match="is not a model directory"):
        models.resolve_model_arg(str(empty))


def test_failed_install_leaves_nothing(home, tmp_path):
    src = tmp_path / "broken" / "transformer"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"\x01\x00")  # truncated header
    with pytest.raises(ConvertError):
        models.install_pipeline(src.parent, "broken", ["f32"])
    assert list((home / "models").iterdir()) == []


def test_builtin_converted_on_first_use(home):
    """tiny-wan ships as a diffusers pipeline and is converted the first time it is named."""
    src = models.BUILTIN["tiny-wan"]
    assert src.is_dir(), f"package data {src} missing (made by tools/fixtures/fixtures_pipeline.py)"
    assert not (home / "models" / "tiny-wan").exists()
    path = models.resolve_model("tiny-wan")
    assert path == home / "models" / "tiny-wan"
    files = sorted(p.name for p in path.iterdir())
    for name in ("transformer-f32.gguf", "transformer-f16.gguf", "text_encoder-f32.gguf", "vae-f32.gguf",
                 "tokenizer.json", "model.json"):  # fmt: skip
        assert name in files, files
    assert [p.name for p in (home / "models").iterdir()] == ["tiny-wan"]
    stamp = (path / "transformer-f32.gguf").stat().st_mtime_ns
    assert models.resolve_model("tiny-wan") == path  # second use: no conversion
    assert (path / "transformer-f32.gguf").stat().st_mtime_ns == stamp
    entry = {m.name: m for m in models.list_models()}["tiny-wan"]
    assert entry.installed and entry.builtin and entry.has_tokenizer and set(entry.quants) == {"f32", "f16"}


def test_models_command_lists(home):
    models.install_pipeline(FIXTURES / "dit_a", "dit-a", ["f32"])
    env = {**os.environ, "H3RENDER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([*H3RENDER, "models", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = {m["name"]: m for m in json.loads(out.stdout)}
    assert listed["dit-a"]["installed"] and listed["dit-a"]["quants"] == ["f32"]
    table = subprocess.run([*H3RENDER, "models"], capture_output=True, text=True, env={**env, "COLUMNS": "200"}, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "dit-a" in table.stdout and "installed" in table.stdout


def test_tokenizer_matches_wan_pipeline(converted_models):
    """Ids equal what diffusers' WanPipeline tokenizer produced for the fixture prompts."""
    import numpy as np

    from h3render.engine.binding import Engine
    from h3render.engine.tokenize import load_tokenizer

    ref = np.load(FIXTURES / "pipeline" / "reference.npz")
    model = converted_models("tiny-wan")
    with Engine(model, 1) as engine:
        text_len = engine.info()["text_len"]
    tok = load_tokenizer(model, text_len)
    prompt, negative = str(ref["prompt"]), str(ref["negative_prompt"])
    assert tok.encode(prompt).dtype == np.int32
    assert tok.encode(prompt).tolist() == ref["prompt_ids"].tolist()
    assert tok.encode(negative).tolist() == ref["negative_ids"].tolist()

    eos = int(ref["prompt_ids"][-1])  # </s>, appended by the post-processor
    # prompt_clean: whitespace runs collapse, ends strip, HTML entities unescape (twice).
    messy = "  " + prompt.replace(" ", " \n\t ").replace(",", "&amp;#44;") + " "
    assert tok.encode(messy).tolist() == ref["prompt_ids"].tolist()
    assert tok.encode("").tolist() == [eos]
    # Truncation keeps room for </s>: text_len ids, the prompt's first text_len-1, then </s>.
    full = tok.encode(prompt)[:-1].tolist()
    long = tok.encode(" ".join([prompt] * 4)).tolist()
    assert len(long) == text_len and long[-1] == eos
    assert long[:-1] == (full * 4)[: text_len - 1]


def test_convert_command(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "H3RENDER_HOME": str(tmp_path / "home")}
    dst = tmp_path / "dit-a"
    ok = subprocess.run([*H3RENDER, "convert", FIXTURES / "dit_a", dst, "--quant", "f32,f16"],
                        capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(dst)
    assert {"transformer-f32.gguf", "transformer-f16.gguf", "model.json"} <= {p.name for p in dst.iterdir()}
    assert models.describe(dst).quants == ["f16", "f32"]

    bad = subprocess.run([*H3RENDER, "convert", FIXTURES / "dit_a", tmp_path / "x", "--quant", "f32,q4"],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert bad.returncode == 2
    assert "q4 not supported; choose from f32, f16" in " ".join(bad.stderr.split()), bad.stderr
    assert not (tmp_path / "x").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    bad_src = subprocess.run([*H3RENDER, "convert", empty, tmp_path / "y"], capture_output=True, text=True,
                             env=env, timeout=120)  # fmt: skip
    assert bad_src.returncode == 2
    assert "none of transformer, text_encoder, vae found" in " ".join(bad_src.stderr.split()), bad_src.stderr


def test_h3_snapshot_is_a_model_dir_of_kind_h3(home, tmp_path):
    """An H3 snapshot (FL2VA/) placed or symlinked in the models dir resolves by name and lists as kind h3."""
    from test_h3_inspect import make_snapshot

    snap = tmp_path / "downloads" / "MiniMax-H3"
    make_snapshot(snap)
    assert models.is_model_dir(snap) and models.model_kind(snap) == "h3"
    assert models.resolve_model_arg(str(snap)) == snap  # the CLI takes the folder itself
    (home / "models").mkdir(parents=True)
    (home / "models" / "MiniMax-H3").symlink_to(snap, target_is_directory=True)
    assert models.resolve_model("MiniMax-H3") == home / "models" / "MiniMax-H3"
    entry = {m.name: m for m in models.list_models()}["MiniMax-H3"]
    assert entry.kind == "h3" and entry.installed and entry.quants == ["bf16", "int8", "int8-row"]
    assert entry.has_tokenizer and list(entry.components) == ["FL2VA"]
    on_disk = sum(f.stat().st_size for f in snap.rglob("*") if f.is_file())
    assert entry.size_bytes == on_disk > 0
    # a folder that is neither kind says what a model directory is
    with pytest.raises(ModelFileError, match="FL2VA"):
        models.resolve_model_arg(str(tmp_path / "downloads"))
    env = {**os.environ, "H3RENDER_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    out = subprocess.run([*H3RENDER, "models", "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    listed = {m["name"]: m for m in json.loads(out.stdout)}
    assert listed["MiniMax-H3"]["kind"] == "h3" and listed["tiny-wan"]["kind"] == "gguf"
    table = subprocess.run([*H3RENDER, "models"], capture_output=True, text=True, env=env, timeout=120)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "MiniMax-H3" in line)
    assert " h3 " in row and "int8-row" in row, table.stdout


# ---------------------------------------------------------------- broken files


@pytest.fixture
def broken_f16(converted_models, home):
    """tiny-wan at f32, f16 and q8_0 installed, then its f16 DiT truncated (a file that
    broke after it was converted: a full disk, a copy cut short)."""
    import shutil

    src = converted_models("tiny-wan", ("f32", "f16", "q8_0"))
    dst = paths.models_dir(ensure=True) / "cut"
    shutil.copytree(src, dst)
    f = dst / "transformer-f16.gguf"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size - 1000)
    return dst


def test_a_broken_file_disables_its_own_level_only(broken_f16):
    entry = models.describe(broken_f16)
    assert sorted(entry.quants) == ["f16", "f32", "q8_0"]
    assert sorted(entry.usable_quants) == ["f32", "q8_0"]
    assert set(entry.unusable) == {"f16"}
    assert "transformer-f16.gguf" in entry.unusable["f16"] and "past end of file" in entry.unusable["f16"]
    with pytest.raises(ModelFileError, match=r"quant=f16 of model 'cut' is unusable: .*transformer-f16\.gguf"):
        models.check_level(broken_f16, "f16")
    models.check_level(broken_f16, "q8_0")  # the other levels still render
    models.check_level(broken_f16, "f32")


def test_models_lists_usable_levels_and_why_the_others_are_not(broken_f16):
    out = subprocess.run([*H3RENDER, "models"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "H3RENDER_HOME": str(broken_f16.parents[1])})
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.strip().startswith("cut "))
    assert "f32, q8_0" in row and "1 level(s) unusable" in row
    assert str(broken_f16) in row  # stdout is a pipe: the row stays one line, never wrapped at 80 columns
    assert any(line.startswith("unusable: cut f16: ") and "transformer-f16.gguf" in line
               and "[offset" in line for line in out.stdout.splitlines())
