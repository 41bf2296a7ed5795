"""Thread tuning (h3render/engine/tune.py, h3render/cli/tune.py): policy, storage, a real run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from h3render.cli.tune import tune as tune_cmd
from h3render.engine import tune as T


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("H3RENDER_HOME", str(tmp_path))
    return tmp_path


def test_pick_best_fastest_and_ties_to_fewer_threads():
    ms = [T.Measurement(1, [1.0, 1.1, 0.9]), T.Measurement(2, [0.52]), T.Measurement(4, [0.40]),
          T.Measurement(8, [0.395])]
    assert T.pick_best(ms) == 4  # 8 is faster by 1.25%: within the 2% tie, fewer threads win
    assert T.pick_best(ms, tie=0.0) == 8
    assert T.pick_best([T.Measurement(3, [2.0])]) == 3
    with pytest.raises(ValueError):
        T.pick_best([])


def test_default_thread_counts():
    assert T.default_thread_counts(1) == [1]
    assert T.default_thread_counts(2) == [1, 2]
    assert T.default_thread_counts(12) == [1, 2, 4, 8, 9, 12]


def test_store_and_best_threads(home):
    assert T.best_threads("m", "q8_0") is None
    assert T.store("m", "q8_0", [T.Measurement(1, [1.0]), T.Measurement(2, [0.6])], (16, 1, 4, 4)) == 2
    T.store("m", "f16", [T.Measurement(1, [1.0]), T.Measurement(2, [1.5])], (16, 1, 4, 4))
    assert T.best_threads("m", "q8_0") == 2 and T.best_threads("m", "f16") == 1
    assert T.best_threads("m", "q4_0") is None
    assert T.best_threads("m", "q8_0", machine="another-machine") is None
    data = json.loads(T.tune_file().read_text())
    assert data["machine"] == T.machine_key() and T.tune_file().parent == home / "tune"
    assert data["entries"]["m/q8_0"]["seconds"] == {"1": 1.0, "2": 0.6}


def test_corrupt_tune_file_reads_as_untuned(home):
    T.tune_file().parent.mkdir(parents=True)
    T.tune_file().write_text("{not json")
    assert T.best_threads("m", "q8_0") is None


def test_tune_command_on_tiny_model(home, converted_models):
    """Takes ~2 s: 2 thread counts x 2 timed DiT passes of tiny-wan at 64x64x5."""
    model = converted_models("tiny-wan", ("f32", "q8_0"))
    result = CliRunner().invoke(tune_cmd, ["--model", str(model), "--quant", "q8_0", "--threads", "1,2",
                                           "--size", "64x64x5", "--repeats", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["threads"] in (1, 2) and set(out["seconds"]) == {"1", "2"}
    assert T.best_threads(model.name, "q8_0") == out["threads"]


def test_tune_command_bad_input(home, converted_models):
    model = converted_models("tiny-wan", ("f32", "q8_0"))
    r = CliRunner().invoke(tune_cmd, ["--model", str(model), "--quant", "q8_0", "--threads", "0,2"])
    assert r.exit_code == 2 and "every count must be >= 1" in r.output
    r = CliRunner().invoke(tune_cmd, ["--model", str(model), "--quant", "q8_0", "--size", "64x64"])
    assert r.exit_code == 2 and "WIDTHxHEIGHTxFRAMES" in r.output
    r = CliRunner().invoke(tune_cmd, ["--model", str(model), "--quant", "q5_1", "--threads", "1",
                                      "--size", "64x64x5"])
    assert r.exit_code == 2 and "q5_1" in r.output
