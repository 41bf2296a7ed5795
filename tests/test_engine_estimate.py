"""The engine's own memory estimate (h3r_estimate_json, Engine.estimate_memory).

1. Against real renders: each case renders in a fresh subprocess, so the
   process's peak resident set belongs to that one render. The child reads its
   peak RSS after importing the binding and loading the library (its
   baseline: the interpreter, numpy, the engine's code), then opens the engine,
   estimates, renders and reads its peak RSS again. The estimate plus that
   baseline must lie within ESTIMATE_TOLERANCE of the peak, for three sizes of
   each built-in model. Run with -s to see the table.
2. The estimate follows the allocations: the forward's scratch with the token
   count, the video with the frames, the weights with the quant level, the
   per-thread tiles with the thread count, the negative pass with guidance.
3. A request generate refuses is refused by the estimate with the same
   exception and the same message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from h3render.engine.binding import Engine, GenerateRequest
from h3render.engine.exceptions import EngineError

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024**2
# The bound: estimate + process baseline within 20% of the measured peak.
ESTIMATE_TOLERANCE = 0.20
STEPS = 2
THREADS = 2
PROMPT = [3, 4, 5]
NEGATIVE = [1, 2]

# (model, width, height, frames): three sizes of each built-in model, each on
# its frame rule (tiny-wan 4k+1, shapes-wan 9k; Engine.info()["frame_rule"]).
CASES = [
    ("tiny-wan", 64, 64, 17),
    ("tiny-wan", 128, 128, 33),
    ("tiny-wan", 256, 256, 17),
    ("shapes-wan", 32, 32, 9),
    ("shapes-wan", 64, 64, 18),
    ("shapes-wan", 128, 128, 9),
]

# The child's peak RSS is its VmHWM where /proc has it: on Linux ru_maxrss
# carries the parent's resident set across fork and exec (a child of a 200 MB
# process starts at 200 MB), so it would measure pytest, not the render.
CHILD = r"""
import json, resource, sys
from h3render.engine.binding import Engine, GenerateRequest, load_library

def peak_rss():
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
    except (OSError, StopIteration):
        kb = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kb

load_library()
baseline = peak_rss()
args = json.loads(sys.argv[1])
req = GenerateRequest(**args["request"])
frames = []
with Engine(args["model"], threads=args["threads"]) as engine:
    est = engine.estimate_memory(req)
    engine.generate(req, on_frame=lambda kind, index, rgb: frames.append(index) and None)
peak = peak_rss()
print(json.dumps({"baseline": baseline, "peak": peak, "estimate": est, "frames": len(frames)}))
"""


@pytest.fixture(scope="module")
def models(converted_models):
    return {name: converted_models(name, ("f32", "f16")) for name in ("tiny-wan", "shapes-wan")}


def request(width: int, height: int, frames: int, **kw) -> GenerateRequest:
    base = dict(width=width, height=height, frames=frames, steps=STEPS, seed=5, prompt_ids=PROMPT,
                negative_ids=NEGATIVE, guidance=4.0, quant="f16", threads=THREADS)
    base.update(kw)
    return GenerateRequest(**base)


def render_in_child(model_dir: Path, req: GenerateRequest) -> dict:
    """Baseline and peak RSS of one render in a fresh interpreter, and the estimate it made."""
    args = {"model": str(model_dir), "threads": THREADS,
            "request": {k: getattr(req, k) for k in ("width", "height", "frames", "steps", "seed",
                                                     "prompt_ids", "negative_ids", "guidance", "quant",
                                                     "threads")}}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_estimate_is_within_tolerance_of_peak_rss(models):
    rows, bad = [], []
    for name, w, h, f in CASES:
        out = render_in_child(models[name], request(w, h, f))
        est, base, peak = out["estimate"], out["baseline"], out["peak"]
        assert out["frames"] == f
        predicted = est["total"] + base
        err = predicted / peak - 1
        rows.append(f"{name:<10} {w:>3}x{h:<3}x{f:<3} {base / MiB:8.1f} {est['weights'] / MiB:8.2f} "
                    f"{est['encode'] / MiB:7.2f} {est['denoise'] / MiB:7.2f} {est['decode'] / MiB:7.2f} "
                    f"{est['total'] / MiB:7.2f} {(peak - base) / MiB:7.2f} {predicted / MiB:8.1f} "
                    f"{peak / MiB:8.1f} {err:+7.1%}")
        if abs(err) > ESTIMATE_TOLERANCE:
            bad.append(rows[-1])
    head = (f"{'model':<10} {'size':<11} {'baseline':>8} {'weights':>8} {'encode':>7} {'denoise':>7} "
            f"{'decode':>7} {'engine':>7} {'rss-base':>7} {'predict':>8} {'peak':>8} {'error':>7}")
    table = "\n".join([f"MiB; {STEPS} steps, {THREADS} threads, f16, guidance 4", head, *rows])
    print("\n" + table)
    assert not bad, f"estimate + baseline off the peak RSS by more than {ESTIMATE_TOLERANCE:.0%}:\n{table}"


@pytest.fixture(scope="module")
def tiny(models):
    with Engine(models["tiny-wan"], threads=THREADS) as e:
        yield e


def test_estimate_adds_up(tiny):
    est = tiny.estimate_memory(request(128, 128, 17))
    assert est["total"] == est["weights"] + max(est["encode"], est["denoise"], est["decode"])
    files = est["files"]
    assert set(files) == {"transformer", "text_encoder", "vae"}
    assert files["transformer"]["file"] == "transformer-f16.gguf"
    assert est["weights"] == sum(f["read"] for f in files.values())
    # the converted VAE keeps its encoder, which a render never reads
    assert files["vae"]["read"] < files["vae"]["bytes"]
    assert all(f["read"] <= f["bytes"] for f in files.values())
    assert sum(f["bytes"] for f in files.values()) == tiny.info()["weight_bytes"]["f16"]
    parts = est["parts"]
    assert est["decode"] == parts["buffers"] + parts["sampler"] + parts["video"] + parts["vae_decode"]
    assert est["denoise"] == parts["buffers"] + parts["sampler"] + max(parts["dit_forward"], parts["preview"])
    assert est["encode"] == parts["buffers"] + parts["text_encoder"]
    assert est["threads"] == THREADS
    # the decoded video is (3, F, H, W) float32
    assert parts["video"] == 3 * 17 * 128 * 128 * 4


def test_estimate_grows_with_the_allocations(tiny):
    small = tiny.estimate_memory(request(128, 128, 17))
    # twice the width and the height: four times the tokens, and the forward's
    # scratch, mostly (tokens, dim) blocks, nearly four times as large; the parts
    # that do not scale (the FFN's 256-row tile, the context, the timestep
    # vectors) weigh less the larger the grid
    big = tiny.estimate_memory(request(256, 256, 17))
    huge = tiny.estimate_memory(request(512, 512, 17))
    assert big["tokens"] == 4 * small["tokens"] and huge["tokens"] == 4 * big["tokens"]
    r1 = big["parts"]["dit_forward"] / small["parts"]["dit_forward"]
    r2 = huge["parts"]["dit_forward"] / big["parts"]["dit_forward"]
    assert 3.0 < r1 < r2 <= 4.0, (r1, r2)
    assert big["parts"]["video"] == 4 * small["parts"]["video"]
    # twice the latent frames: the video doubles less one frame; the VAE's working set,
    # sized from one chunk, does not grow with the frames
    longer = tiny.estimate_memory(request(128, 128, 33))
    assert longer["parts"]["video"] * 17 == small["parts"]["video"] * 33
    assert longer["parts"]["vae_decode"] - small["parts"]["vae_decode"] < small["parts"]["vae_decode"] / 10
    # no negative pass below guidance 1: no second context or prediction, no negative encode
    single = tiny.estimate_memory(request(128, 128, 17, guidance=1.0))
    assert single["parts"]["buffers"] < small["parts"]["buffers"]
    # f32 weights are about twice the f16 ones
    assert tiny.estimate_memory(request(128, 128, 17, quant="f32"))["weights"] > 1.5 * small["weights"]
    # per-thread matmul tiles: more threads, more scratch
    one = tiny.estimate_memory(request(128, 128, 17, threads=1))
    four = tiny.estimate_memory(request(128, 128, 17, threads=4))
    assert one["threads"] == 1 and four["threads"] == 4
    assert four["parts"]["dit_forward"] > one["parts"]["dit_forward"]
    # previews decode one frame during the denoise phase
    assert small["parts"]["preview"] == 0
    assert tiny.estimate_memory(request(128, 128, 17, preview_every=1))["parts"]["preview"] > 0
    # a longer prompt, a larger text encoder pass
    longer_prompt = tiny.estimate_memory(request(128, 128, 17, prompt_ids=list(range(2, 14))))
    assert longer_prompt["parts"]["text_encoder"] > small["parts"]["text_encoder"]


BAD = {
    "width": dict(width=100),
    "frames": dict(frames=16),
    "steps": dict(steps=0),
    "guidance": dict(guidance=-1.0),
    "quant": dict(quant="q3_x"),
    "unknown engine option": dict(options={"nope": 1}),
    "prompt longer than text_len": dict(prompt_ids=list(range(2, 40))),
    "token id outside the vocabulary": dict(prompt_ids=[3, 100000]),
    "negative token id": dict(negative_ids=[-1]),
    "token grid past the rope table": dict(width=16 * 1025),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_request_gets_the_same_error_as_generate(tiny, case):
    req = request(**{"width": 64, "height": 64, "frames": 17, **BAD[case]})
    with pytest.raises(EngineError) as from_estimate:
        tiny.estimate_memory(req)
    with pytest.raises(EngineError) as from_generate:
        tiny.generate(req)
    assert type(from_estimate.value) is type(from_generate.value)
    assert str(from_estimate.value) == str(from_generate.value)
    print(f"{case}: {type(from_estimate.value).__name__}: {from_estimate.value}")
