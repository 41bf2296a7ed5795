"""The job model: static rules, engine limits, and fuzzing that every invalid payload explains itself."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3render.queue.errors import JobValidationError
from h3render.queue.job import RENDER_FUNC, JobPhase, RenderJob
from h3render.queue.contract import resolve
from h3render.queue.rules import FIELDS, SPECS

# The limits a Wan engine publishes (h3r_info_json); the tiny model's shape.
INFO = {
    "quant_levels": ["f32", "f16", "q8_0", "q4_0"],
    "size_multiple": 16,
    "frame_rule": {"multiple": 4, "offset": 1},
    "max_pixels": 0,
    "defaults": {"width": 64, "height": 48, "frames": 5, "steps": 4, "quant": "f16", "guidance": 5.0},
    "vae_stride": [4, 8, 8],
    "patch_size": [1, 2, 2],
    "fps": 16,
}


def problems(payload, info=None):
    with pytest.raises(JobValidationError) as e:
        job = RenderJob.parse(payload)
        if info is not None:
            resolve(job, info)
    return {p.field: p for p in e.value.problems}


def test_minimal_job_resolves_to_model_defaults_and_draws_seed():
    job = resolve(RenderJob.parse({"prompt": "a fox"}), INFO, random.Random(7))
    assert job.resolved
    assert (job.width, job.height, job.frames, job.steps, job.quant) == (64, 48, 5, 4, "f16")
    assert isinstance(job.seed, int) and 0 <= job.seed < 2**32
    assert job.payload()["seed"] == job.seed  # recorded in the payload, reproducible
    again = resolve(RenderJob.parse(job.payload()), INFO)  # a resolved payload is a fixed point
    assert again == job


def test_errors_name_field_value_rule_and_nearest():
    p = problems({"prompt": "x", "steps": 8.5, "seed": -3, "sampler": "eular", "widht": 64})
    assert (p["steps"].value, p["steps"].nearest) == (8.5, 8)
    assert "integer" in p["steps"].rule
    assert p["seed"].nearest == 0
    assert p["sampler"].nearest == "euler"
    assert p["widht"].nearest == "width" and "unknown field" in p["widht"].rule
    text = str(JobValidationError(list(p.values())))
    assert "steps=8.5: must be an integer in [1, 1000]; nearest valid: 8" in text


def test_engine_limits_give_both_neighbours():
    p = problems({"prompt": "x", "width": 100, "frames": 20, "quant": "q5_0"}, INFO)
    assert p["width"].nearest == "96 or 112" and "multiple of 16" in p["width"].rule
    assert p["frames"].nearest == "17 or 21" and "4k+1" in p["frames"].rule
    assert p["quant"].nearest == "q4_0"  # nearest in precision among the model's levels
    assert problems({"prompt": "x", "quant": "q6_k"}, INFO)["quant"].nearest == "q8_0"
    capped = dict(INFO, max_pixels=64 * 64)
    p = problems({"prompt": "x", "width": 128, "height": 128}, capped)
    assert p["width*height"].nearest == "64x64"


def test_model_is_a_name_never_a_path():
    for bad in ("../etc", "/abs/path", "a/b", ".hidden"):
        assert "model" in problems({"prompt": "x", "model": bad})


def test_engine_options_are_typed_and_safe_for_the_c_option_string():
    job = RenderJob.parse({"prompt": "x", "engine_options": {"threads_dit": 4, "tile": True, "mode": "fast"}})
    assert job.engine_options == {"threads_dit": 4, "tile": True, "mode": "fast"}
    p = problems({"prompt": "x", "engine_options": {"Bad-Key": 1, "mode": "a=b;c"}})
    assert p["engine_options.Bad-Key (name)"].nearest == "bad_key"
    assert p["engine_options.mode"].nearest == "a_b_c"


def test_states_are_one_enum_with_terminal_ones():
    assert {s.value for s in JobPhase if s.terminal} == {"finished", "failed", "canceled"}
    assert RENDER_FUNC == "h3render.worker.render.render_job"


# ---- fuzzing --------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
)
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                           max_leaves=6)
field_names = st.sampled_from(FIELDS + ("widht", "seeds", "prompt_", "")) | st.text(max_size=12)
payloads = st.dictionaries(field_names, json_values, max_size=8) | st.fixed_dictionaries(
    {"prompt": st.text(max_size=20)},
    optional={f: json_values | st.integers(-5, 5000) | st.floats(-10, 200) for f in FIELDS if f != "prompt"},
)
NUMERIC = ("seed", "width", "height", "frames", "steps", "guidance", "shift", "fps", "preview_every")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads)
def test_fuzz_every_invalid_payload_is_explained(payload):
    """Never an exception other than JobValidationError; each problem has field, rule and a
    nearest valid value that, put in place of the bad one, satisfies that field's rule."""
    try:
        job = RenderJob.parse(payload)
    except JobValidationError as e:
        assert e.problems, "an error with no problems"
        for p in e.problems:
            assert p.field and p.rule, p
            assert str(p).startswith(f"{p.field}="), p
            if p.field == "prompt" and not (isinstance(payload.get("prompt"), str) and payload["prompt"].strip()):
                continue  # a missing or blank prompt has no nearest text; the rule says what is required
            assert p.nearest is not None, f"no nearest valid value for {p}"
            if p.field in NUMERIC + ("sampler", "priority", "quant", "model"):
                fixed = {"prompt": "x", p.field: p.nearest}
                RenderJob.parse(fixed)  # the suggestion itself must be valid
        return
    # Accepted: then it must survive resolve, or be refused with engine-limit problems only.
    try:
        resolve(job, INFO)
    except JobValidationError as e:
        assert all(p.field in ("width", "height", "frames", "quant", "width*height", "preview_every")
                   for p in e.problems), e
        assert all(p.nearest is not None for p in e.problems), e


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["--seed", "--width", "--height", "--frames", "--steps", "--guidance", "--shift",
                         "--sampler", "--quant", "--model", "--fps", "--priority", "--option"]),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
        | st.integers(-10, 10**6).map(str) | st.floats(allow_nan=True).map(str),
        max_size=5,
    )
)
def test_fuzz_cli_enqueue_never_crashes(flags):
    """Invalid flags give exit code 2 and a message; nothing reaches Redis (static rules first)."""
    from click.testing import CliRunner

    from h3render.cli.jobs import enqueue

    args = ["--prompt", "a fox"]
    for k, v in flags.items():
        args += [k, v]
    result = CliRunner().invoke(enqueue, args + ["--json"], env={"H3RENDER_REDIS_URL": "redis://127.0.0.1:1/0"})
    # exit 0 is impossible here: Redis is unreachable (port 1), so a valid payload ends in exit 1
    assert result.exit_code in (1, 2), (args, result.output, result.exception)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    assert result.output.strip(), "no message"
    if result.exit_code == 1:
        assert "does not answer" in result.output, result.output  # valid job, unreachable Redis
