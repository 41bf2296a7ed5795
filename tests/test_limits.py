"""Render limits: every invalid width/height/frames names the rule and the nearest valid values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3render.engine.exceptions import InvalidRequestError
from h3render.engine.limits import (
    MAX_FRAMES,
    MAX_SIDE,
    EngineLimits,
    FrameRule,
    LimitError,
    check_frames,
    check_request,
    check_size,
    nearest_on_grid,
)

WAN = EngineLimits(size_multiple=16, frame_rule=FrameRule(multiple=4, offset=1))


def test_messages_name_field_value_rule_and_nearest():
    with pytest.raises(LimitError) as e:
        check_request(832, 480, 20, WAN)
    assert str(e.value) == "frames=20 is not 4k+1; nearest valid: 17 or 21"
    assert (e.value.field, e.value.value, e.value.nearest) == ("frames", 20, (17, 21))

    with pytest.raises(LimitError) as e:
        check_request(100, 480, 17, WAN)
    assert str(e.value) == "width=100 is not a multiple of 16; nearest valid: 96 or 112"

    with pytest.raises(LimitError) as e:
        check_request(832, 470, 17, WAN)
    assert str(e.value) == "height=470 is not a multiple of 16; nearest valid: 464 or 480"


def test_below_minimum_and_above_maximum():
    with pytest.raises(LimitError, match=r"^width=0 is below the minimum 16 \(a multiple of 16\); nearest valid: 16$"):
        check_request(0, 480, 17, WAN)
    with pytest.raises(LimitError, match=r"^frames=-3 is below the minimum 1 \(4k\+1\); nearest valid: 1$"):
        check_request(16, 16, -3, WAN)
    with pytest.raises(LimitError, match=rf"^height={MAX_SIDE + 5} is above the maximum {MAX_SIDE}"):
        check_request(16, MAX_SIDE + 5, 1, WAN)


def test_limit_error_is_an_invalid_request():
    # The CLI maps InvalidRequestError to exit code 2 and the worker to "bad job, no retry".
    with pytest.raises(InvalidRequestError):
        check_request(832, 480, 2, WAN)


def test_not_an_integer():
    for bad in (16.0, "16", True, None):
        with pytest.raises(LimitError, match="is not an integer"):
            check_size("width", bad, 16)


def test_valid_requests_pass_through():
    assert check_request(832, 480, 81, WAN) == (832, 480, 81)
    assert check_request(16, 16, 1, WAN) == (16, 16, 1)  # one frame: an image


def test_max_pixels_suggests_size_with_same_aspect():
    limits = EngineLimits(size_multiple=16, max_pixels=832 * 480)
    assert check_request(832, 480, 17, limits) == (832, 480, 17)
    with pytest.raises(LimitError) as e:
        check_request(1280, 720, 17, limits)
    assert e.value.field == "width*height"
    w, h = (int(v) for v in e.value.nearest[0].split("x"))
    assert w * h <= 832 * 480 and w % 16 == 0 and h % 16 == 0
    assert abs(w / h - 1280 / 720) < 0.1, (w, h)
    assert "exceeds max_pixels=399360" in str(e.value)


def test_from_info_reads_engine_json():
    info = {"size_multiple": 32, "frame_rule": {"multiple": 8, "offset": 0}, "max_pixels": 0}
    limits = EngineLimits.from_info(info)
    assert check_request(64, 32, 16, limits) == (64, 32, 16)
    with pytest.raises(LimitError, match=r"^frames=12 is not a multiple of 8; nearest valid: 8 or 16$"):
        check_request(64, 32, 12, limits)


@given(
    value=st.integers(-1000, 20000),
    multiple=st.integers(1, 64),
    offset=st.integers(0, 8),
)
def test_nearest_values_are_valid_and_closest(value, multiple, offset):
    rule = FrameRule(multiple=multiple, offset=offset)
    top = offset + multiple * ((MAX_FRAMES - offset) // multiple)
    nearest = nearest_on_grid(value, multiple, offset, rule.minimum, top)
    for v in nearest:
        assert check_frames(v, rule) == v  # every suggestion is itself valid
    if len(nearest) == 2:
        lo, hi = nearest
        assert lo < value < hi and hi - lo == multiple  # they bracket the value, nothing between
    try:
        check_frames(value, rule)
        assert nearest == (value,)
    except LimitError as exc:
        assert exc.nearest == nearest and value not in nearest
