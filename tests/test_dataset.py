"""The demo model's procedural clips (h3render.demo_data): deterministic, as described."""

from __future__ import annotations

import numpy as np
import pytest

from h3render import demo_data as dd


def test_same_seed_same_clips_byte_identical():
    a = [next(it) for it in [dd.training_specs(11)] for _ in range(20)]
    b = [next(it) for it in [dd.training_specs(11)] for _ in range(20)]
    assert a == b
    assert [s.caption for s in a] == [s.caption for s in b]
    va = np.stack([dd.render_clip(s) for s in a])
    vb = np.stack([dd.render_clip(s) for s in b])
    assert va.tobytes() == vb.tobytes()
    other = [next(it) for it in [dd.training_specs(12)] for _ in range(20)]
    assert other != a


def _words(caption: str) -> str:
    return " " + caption.replace(",", " ") + " "


def test_captions_name_every_attribute_with_a_synonym():
    rng = np.random.default_rng(0)
    for _ in range(300):
        spec = dd.sample_spec(rng, two_shape_prob=0.5)
        text = _words(spec.caption)
        for o in spec.objects:
            assert any(f" {w} " in text for w in dd.COLOR_WORDS[o.color]), spec.caption
            assert any(f" {w} " in text for w in dd.SHAPE_WORDS[o.shape]), spec.caption
            assert any(f" {w} " in text for w in dd.DIRECTION_WORDS[o.direction]), spec.caption
            assert any(f" {w} " in text for w in dd.SPEED_WORDS[o.speed]), spec.caption
        assert any(f" {w} " in text for w in dd.BACKGROUND_WORDS[spec.background]), spec.caption


def test_synonyms_are_used():
    rng = np.random.default_rng(1)
    text = " ".join(_words(dd.sample_spec(rng).caption) for _ in range(400))
    for syns in dd.COLOR_WORDS.values():
        assert sum(f" {w} " in text for w in syns) == len(syns)


def test_rendered_clip_matches_its_spec():
    """Colour, background, position and motion of every frame follow the spec exactly."""
    rng = np.random.default_rng(2)
    for _ in range(40):
        spec = dd.sample_spec(rng, two_shape_prob=0.0)
        o = spec.main
        v = dd.render_clip(spec, 32, 32, 9)
        assert v.shape == (9, 32, 32, 3) and v.dtype == np.float32
        bg = np.asarray(dd.BACKGROUNDS[spec.background], np.float32)
        fg = np.asarray(dd.COLORS[o.color], np.float32)
        # the shape never touches the border: every border pixel is background
        for edge in (v[:, 0], v[:, -1], v[:, :, 0], v[:, :, -1]):
            np.testing.assert_allclose(edge, np.broadcast_to(bg, edge.shape), atol=1e-6)
        # fully covered pixels have exactly the object's colour
        full = np.all(np.abs(v - fg) < 1e-6, axis=-1)
        assert full.sum(axis=(1, 2)).min() > 20
        # the coverage-weighted centre moves by the spec's speed in its direction
        cov = np.tensordot(v - bg, fg - bg, axes=([-1], [0])) / float((fg - bg) @ (fg - bg))
        ys, xs = np.mgrid[0:32, 0:32] + 0.5
        cx = (cov * xs).sum(axis=(1, 2)) / cov.sum(axis=(1, 2))
        cy = (cov * ys).sum(axis=(1, 2)) / cov.sum(axis=(1, 2))
        dx, dy = dd.DIRECTION_VECTORS[o.direction]
        step = dd.SPEED_VALUES[o.speed] * 32
        # 0.2 px: anti-aliasing with 4x4 sub-pixels quantises the centre slightly;
        # the triangle's area centre sits 1/6 of its height below the box centre
        want_x = o.x0 * 32 + dx * step * np.arange(9)
        want_y = o.y0 * 32 + dy * step * np.arange(9) + (o.size * 32 / 6 if o.shape == "triangle" else 0)
        np.testing.assert_allclose(cx, want_x, atol=0.2)
        np.testing.assert_allclose(cy, want_y, atol=0.2)


def test_two_shape_clips_have_distinct_colours():
    rng = np.random.default_rng(4)
    specs = [dd.sample_spec(rng, two_shape_prob=1.0) for _ in range(50)]
    assert all(len(s.objects) == 2 and s.objects[0].color != s.objects[1].color for s in specs)
    assert all(" and " in s.caption for s in specs)


def test_heldout_prompts_are_balanced_and_never_trained_on():
    held = dd.heldout_specs(120)
    assert len(held) == 120 and len({s.caption for s in held}) == 120
    assert all(len(s.objects) == 1 for s in held)
    for attr, values in (("color", dd.COLORS), ("shape", dd.SHAPES), ("direction", dd.DIRECTIONS)):
        counts = {v: sum(getattr(s.main, attr) == v for s in held) for v in values}
        # one balanced pass of 72 combinations, then 48 of a reshuffled pass
        assert min(counts.values()) >= 72 // len(values), (attr, counts)
    assert dd.heldout_specs(120) == held  # deterministic
    captions = {s.caption for s in held}
    it = dd.training_specs(1234)
    assert not any(next(it).caption in captions for _ in range(3000))


@pytest.mark.parametrize("kwargs, field", [
    (dict(width=0), "width"), (dict(height=-3), "height"), (dict(frames=2.5), "frames"),
])  # fmt: skip
def test_bad_render_arguments_name_the_field(kwargs, field):
    spec = dd.sample_spec(np.random.default_rng(0))
    with pytest.raises(ValueError, match=field):
        dd.render_clip(spec, **{**dict(width=32, height=32, frames=9), **kwargs})


def test_unknown_shape_is_named():
    spec = dd.sample_spec(np.random.default_rng(0))
    bad = dd.ClipSpec(spec.background, (dd.ShapeSpec("hexagon", "red", "left", "slow", 0.3, 0.5, 0.5),))
    with pytest.raises(ValueError, match="hexagon"):
        dd.render_clip(bad)


def test_a_caption_fixes_its_clip_up_to_the_jitter():
    """Single-shape paths are centred in the frame: start within JITTER of the centred start."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        o = dd.sample_spec(rng, two_shape_prob=0.0).main
        dx, dy = dd.DIRECTION_VECTORS[o.direction]
        half_travel = dd.SPEED_VALUES[o.speed] * 8 / 2
        assert abs(o.x0 - (0.5 - dx * half_travel)) <= dd.JITTER + 1e-9
        assert abs(o.y0 - (0.5 - dy * half_travel)) <= dd.JITTER + 1e-9
        assert dd.SIZE_RANGE[0] <= o.size <= dd.SIZE_RANGE[1]


def test_two_shape_clips_move_in_separate_lanes():
    rng = np.random.default_rng(6)
    for _ in range(100):
        a, b = dd.sample_spec(rng, two_shape_prob=1.0).objects
        # across its own motion each path is LANE off centre, the first on the low side
        across = [o.y0 if dd.DIRECTION_VECTORS[o.direction][1] == 0 else o.x0 for o in (a, b)]
        assert abs(across[0] - (0.5 - dd.LANE)) <= dd.JITTER + 1e-9
        assert abs(across[1] - (0.5 + dd.LANE)) <= dd.JITTER + 1e-9


def test_parse_caption_reads_back_the_first_shape():
    rng = np.random.default_rng(7)
    for _ in range(300):
        spec = dd.sample_spec(rng, two_shape_prob=0.3)
        o = spec.main
        assert dd.parse_caption(spec.caption) == {"color": o.color, "shape": o.shape, "direction": o.direction}
    assert dd.parse_caption("A lighthouse at dusk") == {"color": None, "shape": None, "direction": None}
