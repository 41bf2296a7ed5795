"""The demo model's analytic detector and evaluation (h3render.engine.eval_demo).

The detector is checked on clips whose attributes are known (h3render.demo_data),
clean and degraded the way a generated clip is (blur, noise, colour shift). The
engine part renders a small subset of the held-out prompts with the shipped
demo model (about 10 s).
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from h3render import demo_data as dd
from h3render.engine import eval_demo as ev
from h3render.engine.builtin import ALL_QUANTS

DEMO_MODEL = "shapes-wan"


def _clips(seed: int, n: int):
    rng = np.random.default_rng(seed)
    specs = [dd.sample_spec(rng, two_shape_prob=0.0) for _ in range(n)]
    return specs, [dd.render_clip(s) for s in specs]


def _blur(v: np.ndarray, passes: int) -> np.ndarray:
    """Separable [1 2 1]/4 blur, `passes` times, edges replicated (a soft decoder)."""
    for _ in range(passes):
        for axis in (1, 2):
            p = np.concatenate([np.take(v, [0], axis), v, np.take(v, [-1], axis)], axis)
            n = v.shape[axis]
            v = (np.take(p, range(0, n), axis) + 2 * np.take(p, range(1, n + 1), axis)
                 + np.take(p, range(2, n + 2), axis)) / 4
    return v


def test_detector_is_exact_on_ground_truth_clips():
    specs, clips = _clips(10, 200)
    for spec, clip in zip(specs, clips):
        u8 = (clip * 255 + 0.5).astype(np.uint8)
        for video in (clip, u8):  # float and uint8 input
            det = ev.detect(video)
            assert ev.score(spec, det) == {"color": True, "direction": True, "shape": True}, \
                (spec.caption, det)
            assert det.background == spec.background
            assert det.found_frames == 9
            # rigid motion: consecutive masks overlap almost fully once aligned
            assert det.consistency > 0.8, (spec.caption, det.consistency)
        vx, vy = det.velocity
        dx, dy = dd.DIRECTION_VECTORS[spec.main.direction]
        speed = dd.SPEED_VALUES[spec.main.speed] * 32
        # 0.25 px/frame: the half-coverage mask moves in whole pixels
        assert abs(vx - dx * speed) < 0.25 and abs(vy - dy * speed) < 0.25


# Degraded clips: what a small decoder produces. The detector must stay near-exact
# on them, or a model's accuracy would measure the detector instead.
DEGRADED_MIN_ACCURACY = 0.97


def test_detector_tolerates_blur_noise_and_colour_shift():
    specs, clips = _clips(11, 150)
    rng = np.random.default_rng(0)
    hits = {a: 0 for a in ev.ATTRIBUTES}
    for spec, clip in zip(specs, clips):
        v = _blur(clip, 2)
        v = v + rng.normal(0, 0.04, v.shape) + rng.normal(0, 0.05, (1, 1, 1, 3))
        det = ev.detect(np.clip(v, 0, 1).astype(np.float32))
        for a, ok in ev.score(spec, det).items():
            hits[a] += ok
    acc = {a: h / len(specs) for a, h in hits.items()}
    assert min(acc.values()) >= DEGRADED_MIN_ACCURACY, acc


def test_static_and_empty_clips():
    spec = dd.sample_spec(np.random.default_rng(0), two_shape_prob=0.0)
    still = np.repeat(dd.render_clip(spec)[:1], 9, axis=0)
    det = ev.detect(still)
    assert det.direction == "none" and det.color == spec.main.color
    assert det.consistency > 0.99
    empty = np.full((9, 32, 32, 3), 0.5, np.float32)
    det = ev.detect(empty)
    assert (det.color, det.direction, det.shape, det.found_frames) == (None, None, None, 0)
    assert det.background == "gray"


def test_flicker_lowers_consistency():
    spec = dd.sample_spec(np.random.default_rng(1), two_shape_prob=0.0)
    clip = dd.render_clip(spec)
    flicker = clip.copy()
    bg = np.asarray(dd.BACKGROUNDS[spec.background], np.float32)
    flicker[1::2] = bg  # the object vanishes every other frame
    assert ev.detect(flicker).consistency < 0.6 < ev.detect(clip).consistency


@pytest.mark.parametrize("bad, what", [
    (np.zeros((9, 32, 32)), "shape"), (np.zeros((9, 32, 32, 4)), "shape"),
    (np.zeros((9, 32, 32, 3), np.int64), "dtype"),
])  # fmt: skip
def test_bad_video_is_named(bad, what):
    with pytest.raises(ValueError, match=what):
        ev.detect(bad)


def _read_png(path) -> np.ndarray:
    with Image.open(path) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        return np.asarray(im.convert("RGB"))


def test_png_reads_back_identically_and_leaves_no_temp(tmp_path):
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    path = tmp_path / "random.png"
    ev.write_png(path, img[:, ::-1])  # a non-contiguous view is written as it reads
    np.testing.assert_array_equal(_read_png(path), img[:, ::-1])
    assert [p.name for p in tmp_path.iterdir()] == ["random.png"]


@pytest.mark.parametrize("bad", [
    np.zeros((8, 8, 4), np.uint8), np.full((8, 8, 3), 0.5), np.zeros((8, 8), np.uint8),
])  # fmt: skip
def test_png_refuses_what_is_not_an_rgb_image(tmp_path, bad):
    path = tmp_path / "bad.png"
    with pytest.raises(ValueError, match=r"bad\.png: image must be uint8 \(height, width, 3\), got"):
        ev.write_png(path, bad)
    assert not list(tmp_path.iterdir())


def test_contact_sheet_has_one_row_per_prompt(tmp_path):
    specs, clips = _clips(12, 5)
    u8 = [(c * 255 + 0.5).astype(np.uint8) for c in clips]
    rep, marks = ev.evaluate_clips(specs, u8, "gt")
    assert rep.accuracy == {"color": 1.0, "direction": 1.0, "shape": 1.0} and not rep.failures
    sheet = ev.contact_sheet(u8, marks, scale=2, gap=2)
    path = tmp_path / "sheet.png"
    ev.write_png(path, sheet)
    img = _read_png(path)
    assert img.shape == (5 * (64 + 2) + 2, 21 + 2 + 9 * (64 + 2), 3)
    np.testing.assert_array_equal(img, sheet)
    # row 3, frame 4, scaled 2x, sits where the layout says
    y, x = 2 + 3 * 66, 21 + 2 + 4 * 66
    np.testing.assert_array_equal(img[y:y + 64:2, x:x + 64:2], u8[3][4])
    assert tuple(img[y + 1, 1]) == (40, 170, 60)  # all attributes detected: green marks


@pytest.fixture(scope="module")
def demo_model(converted_models):
    from pathlib import Path

    src = Path(__file__).parents[1] / "h3render" / "data" / DEMO_MODEL
    if not src.is_dir():
        pytest.skip(f"demo model {DEMO_MODEL} is not in h3render/data (train it with tools/train/)")
    return converted_models(DEMO_MODEL, ALL_QUANTS)


# A subset of 12 held-out prompts, at every quant level. The full evaluation
# (`h3render eval-demo`, >= 100 prompts) is what the figures come from;
# here one miss in 12 per attribute is allowed for colour and direction, and
# three for shape (the full-run thresholds: 90%, 85%, 70%).
SUBSET = 12
SUBSET_MIN_HITS = {"color": 11, "direction": 10, "shape": 8}


@pytest.mark.parametrize("quant", ALL_QUANTS)
def test_demo_model_follows_held_out_prompts(demo_model, quant, tmp_path):
    reports = ev.evaluate(demo_model, [quant], n=SUBSET, threads=2, sheet_dir=tmp_path)
    rep = reports[0]
    hits = {a: round(rep.accuracy[a] * SUBSET) for a in ev.ATTRIBUTES}
    print(f"{quant}: hits {hits} of {SUBSET}, consistency {rep.consistency:.2f}, {rep.seconds:.1f}s")
    for a, need in SUBSET_MIN_HITS.items():
        assert hits[a] >= need, (a, hits, rep.failures)
    assert (tmp_path / f"contact-{quant}.png").stat().st_size > 1000


def test_cli_bad_input_exits_2(tmp_path):
    from click.testing import CliRunner

    from h3render.cli.eval_demo import eval_demo

    runner = CliRunner()
    res = runner.invoke(eval_demo, ["--model", str(tmp_path / "nope"), "-n", "0"])
    assert res.exit_code == 2 and "--prompts=0" in res.output
    res = runner.invoke(eval_demo, ["--model", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "--model" in res.output and "does not exist" in res.output


def test_cli_unknown_quant_exits_2(demo_model, tmp_path):
    from click.testing import CliRunner

    from h3render.cli.eval_demo import eval_demo

    res = CliRunner().invoke(eval_demo, ["--model", str(demo_model), "--quant", "q3_x", "-n", "1",
                                         "--out", str(tmp_path)])
    assert res.exit_code == 2 and "q3_x" in res.output and "f32" in res.output


def test_demo_model_patches_all_its_frames_at_once(demo_model):
    """Its DiT patches all 9 latent frames together (patch (9, 2, 2)): valid lengths are 9k."""
    from h3render.engine.binding import Engine, GenerateRequest
    from h3render.engine.exceptions import InvalidRequestError
    from h3render.engine.limits import EngineLimits, LimitError, check_frames

    with Engine(demo_model, 1) as eng:
        info = eng.info()
        assert info["patch_size"][0] == info["defaults"]["frames"] == 9
        assert info["frame_rule"] == {"multiple": 9, "offset": 0}
        for frames in (10, 5):
            req = GenerateRequest(width=32, height=32, frames=frames, steps=1, seed=0, prompt_ids=[1])
            with pytest.raises(InvalidRequestError, match=rf"frames={frames} must be a positive multiple of 9 \(nearest: 9 or 18\)"):
                eng.generate(req)
    rule = EngineLimits.from_info(info).frame_rule
    with pytest.raises(LimitError, match=r"^frames=10 is not a multiple of 9; nearest valid: 9 or 18$"):
        check_frames(10, rule)
