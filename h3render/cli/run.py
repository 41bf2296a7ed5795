"""`h3render run`: render one video now, in this process, with no queue.

The command parses options, then `execute` does the work in four steps that
`h3render demo` reuses unchanged: resolve the model, open the engine, build and
validate the request against the engine's info, render frame by frame into
the mp4 / PNG / poster writers with a progress bar per phase.
Exit codes: 0 ok, 1 engine or I/O failure, 2 bad usage or input.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from h3render.engine.builtin import DEFAULT_MODEL
from h3render.engine.exceptions import ConvertError, EngineError, InvalidRequestError, ModelNotFoundError

# Used only when the engine's info has no "defaults" entry for a field.
FALLBACK_DEFAULTS: dict[str, Any] = {
    "width": 832, "height": 480, "frames": 81, "steps": 50,
    "guidance": 5.0, "shift": 3.0, "sampler": "unipc", "negative_prompt": "",
}  # fmt: skip
PHASE_LABELS = {"load": "loading", "encode": "text encoder", "denoise": "denoising", "decode": "VAE decode"}
SEED_MAX = 2**64 - 1


class RunParams(BaseModel):
    """What a render asks for; None means "the model's default"."""

    model: str
    prompt: str
    output: Path
    negative_prompt: str | None = None
    seed: int | None = None
    width: int | None = None
    height: int | None = None
    frames: int | None = None
    steps: int | None = None
    guidance: float | None = None
    shift: float | None = None
    sampler: str | None = None
    quant: str | None = None
    threads: int = 0
    frames_dir: Path | None = None
    poster: Path | None = None
    init_latents: Path | None = None


class BadInput(Exception):
    """Input the user can fix; exit code 2."""


def default_poster(output: Path) -> Path:
    """out.mp4 -> out.png beside it."""
    return output.with_suffix(".png")


def resolve(params: RunParams) -> Path:
    """The model directory for --model (a directory or an installed/built-in name)."""
    from h3render.engine.models import resolve_model_arg

    try:
        return resolve_model_arg(params.model)
    except ConvertError:
        raise
    except (ModelNotFoundError, InvalidRequestError) as exc:
        raise BadInput(f"--model: {exc}") from exc
    except EngineError as exc:  # a directory that is not a model directory
        raise BadInput(f"--model: {exc}") from exc


def model_defaults(model_dir: Path) -> dict[str, Any]:
    """Pipeline defaults the converter recorded in model.json (negative prompt, sampler, ...)."""
    try:
        pipeline = json.loads((Path(model_dir) / "model.json").read_text()).get("pipeline")
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: v for k, v in pipeline.items() if k in FALLBACK_DEFAULTS} if isinstance(pipeline, dict) else {}


def build_request(engine, params: RunParams):
    """A GenerateRequest from params and the engine's info; raises BadInput naming the option."""
    from h3render.engine.binding import SAMPLERS, GenerateRequest
    from h3render.engine.limits import EngineLimits, check_request

    info = engine.info()
    defaults = {**FALLBACK_DEFAULTS, **model_defaults(engine.model_dir), **(info.get("defaults") or {})}

    def pick(name: str):
        value = getattr(params, name)
        return defaults.get(name) if value is None else value

    width, height, frames, steps = pick("width"), pick("height"), pick("frames"), pick("steps")
    try:
        width, height, frames = check_request(width, height, frames, EngineLimits.from_info(info))
    except InvalidRequestError as exc:
        raise BadInput(str(exc)) from exc
    if not isinstance(steps, int) or steps < 1:
        raise BadInput(f"steps={steps} must be an integer >= 1")
    guidance, shift = float(pick("guidance")), float(pick("shift"))
    if not np.isfinite(guidance) or guidance < 0:
        raise BadInput(f"guidance={guidance} must be a finite number >= 0 (<= 1 disables the negative prompt)")
    if not np.isfinite(shift) or shift <= 0:
        raise BadInput(f"shift={shift} must be a finite number > 0")
    sampler = str(pick("sampler"))
    if sampler not in SAMPLERS:
        raise BadInput(f"sampler={sampler!r} is not supported; choose from {', '.join(SAMPLERS)}")
    levels = list(info.get("quant_levels") or [])
    quant = params.quant or defaults.get("quant") or ("f16" if "f16" in levels else (levels or ["f32"])[0])
    if levels and quant not in levels:
        raise BadInput(f"quant={quant!r} is not available for this model; available: {', '.join(levels)}")
    seed = secrets.randbelow(2**32) if params.seed is None else params.seed
    if not 0 <= seed <= SEED_MAX:
        raise BadInput(f"seed={seed} must be in [0, 2^64-1]")

    prompt, negative = params.prompt, pick("negative_prompt") or ""
    req = GenerateRequest(
        width=width, height=height, frames=frames, steps=steps, seed=seed,
        guidance=guidance, shift=shift, sampler=sampler, quant=quant, threads=params.threads,
        prompt=prompt, negative_prompt=negative,
    )  # fmt: skip
    if info.get("prompt", "token_ids") == "token_ids":
        from h3render.engine.tokenize import load_tokenizer

        tok = load_tokenizer(engine.model_dir, int(info["text_len"]))
        req.prompt_ids = tok.encode(prompt).tolist()
        req.negative_ids = tok.encode(negative).tolist()
    if params.init_latents is not None:
        req.init_latents = load_init_latents(params.init_latents, engine.latent_shape(width, height, frames))
    return req


def load_init_latents(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """Initial noise from a .npy file, shaped (C, T', H', W') like diffusers' latents[0]."""
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise BadInput(f"--init-latents {path}: cannot read a .npy array: {exc}") from exc
    if arr.shape == (1, *shape):
        arr = arr[0]  # accept diffusers' latents with the batch axis too
    if arr.shape != tuple(shape):
        raise BadInput(
            f"--init-latents {path}: shape {arr.shape} does not match this render's latents "
            f"(C, T', H', W') = {tuple(shape)}"
        )
    if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.isfinite(arr)):
        raise BadInput(f"--init-latents {path}: must be finite floats, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float32)


def render(engine, req, params: RunParams, console: Console) -> dict[str, Path]:
    """Run the engine with a progress bar per phase, writing outputs as frames arrive."""
    from h3render.engine.binding import FRAME_FINAL
    from h3render.engine.video import RenderOutputs

    info = engine.info()
    outputs = RenderOutputs(
        width=req.width, height=req.height, total=req.frames, fps=float(info.get("fps", 16)),
        video=params.output, frames_dir=params.frames_dir,
        poster=params.poster or default_poster(params.output),
    )  # fmt: skip
    columns = (TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with outputs, Progress(*columns, console=console, transient=False) as bar:
        tasks: dict[str, Any] = {}

        def on_progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(PHASE_LABELS.get(phase, phase), total=max(total, 1))
            bar.update(tasks[phase], completed=done, total=max(total, 1))

        def on_frame(kind: int, index: int, rgb: np.ndarray) -> None:
            if kind == FRAME_FINAL:
                outputs.add(index, rgb)

        engine.generate(req, on_progress=on_progress, on_frame=on_frame)
        return outputs.close()


def execute(params: RunParams, console: Console | None = None, as_json: bool = False) -> int:
    """Resolve, open, validate, render; print the outputs. Returns the exit code."""
    from h3render.engine.binding import Engine
    from h3render.engine.video import VideoError

    err = console or Console(stderr=True)
    try:
        model_dir = resolve(params)
        with Engine(model_dir, params.threads) as engine:
            req = build_request(engine, params)
            started = time.monotonic()
            written = render(engine, req, params, err)
    except BadInput as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    except InvalidRequestError as exc:  # the engine itself refused the request
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    except (EngineError, ConvertError, VideoError, OSError) as exc:
        err.print(f"[bold red]render failed:[/] {exc}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:  # the engine stopped within a step; partial files were removed
        err.print("[bold red]canceled[/]", highlight=False)
        return 130
    elapsed = time.monotonic() - started
    summary = {
        "model": str(model_dir), "seed": req.seed, "width": req.width, "height": req.height,
        "frames": req.frames, "steps": req.steps, "sampler": req.sampler, "quant": req.quant,
        "seconds": round(elapsed, 3), **{k: str(v) for k, v in written.items()},
    }  # fmt: skip
    if as_json:
        click.echo(json.dumps(summary))
    else:
        err.print(
            f"rendered {req.frames} frames {req.width}x{req.height} in {elapsed:.1f} s "
            f"(seed {req.seed}, {req.steps} {req.sampler} steps, {req.quant})",
            highlight=False,
        )
        for key in ("video", "poster", "frames_dir"):
            if key in written:
                click.echo(f"{key:<10} {written[key]}")
    return 0


@click.command()
@click.option("--model", "model", default=DEFAULT_MODEL, show_default=True, metavar="DIR|NAME",
              help="Model directory, or the name of an installed or built-in model.")
@click.option("--prompt", required=True, help="What to render.")
@click.option("--negative-prompt", default=None, help="What to steer away from (with guidance > 1).")
@click.option("--seed", type=click.IntRange(0, SEED_MAX), default=None, help="RNG seed; random if omitted.")
@click.option("--width", type=int, default=None, help="Width in pixels (model default).")
@click.option("--height", type=int, default=None, help="Height in pixels (model default).")
@click.option("--frames", type=int, default=None, help="Frame count (Wan: 4k+1).")
@click.option("--steps", type=click.IntRange(1, 1000), default=None, help="Denoising steps.")
@click.option("--guidance", type=float, default=None, help="Classifier-free guidance scale.")
@click.option("--shift", type=float, default=None, help="Flow shift of the sigma schedule.")
@click.option("--sampler", type=click.Choice(["euler", "unipc"]), default=None)
@click.option("--quant", default=None, help="Quant level of the DiT weights (f32, f16, ...).")
@click.option("--threads", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Worker threads; 0 uses every CPU.")
@click.option("--frames-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also write every frame as PNG into this directory.")
@click.option("--poster", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Poster (middle frame) PNG; default OUT with .png.")
@click.option("--init-latents", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Initial noise (C, T', H', W') as .npy instead of the seed's.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Output mp4.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def run(as_json: bool, **options: Any) -> None:
    """Render one video from a prompt now, in this process."""
    params = RunParams(**options)
    if params.output.suffix.lower() != ".mp4":
        raise click.BadParameter(f"{params.output} must end in .mp4", param_hint="'-o' / '--output'")
    sys.exit(execute(params, as_json=as_json))
