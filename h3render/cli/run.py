"""`h3render run`: render one video now, in this process, with no queue.

The command parses options, then `execute` does the work in four steps: resolve the
model, open the engine, check the job and build the request through the job contract
(h3render.queue.contract: the same defaults, validation and request a queued job gets,
so one seed renders the same frames here and on a worker), render frame by frame into
the mp4 / PNG / poster writers with a progress bar per phase.
Exit codes: 0 ok, 1 engine or I/O failure, 2 bad usage or input.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from h3render.engine.builtin import DEFAULT_MODEL
from h3render.engine.exceptions import (ConvertError, EngineError, InvalidRequestError, ModelFileError,
                                        ModelNotFoundError)
from h3render.queue.errors import JobValidationError, Problem
from h3render.cli.console import console as make_console

PHASE_LABELS = {"load": "loading", "encode": "text encoder", "denoise": "denoising", "decode": "VAE decode"}


class RunParams(BaseModel):
    """What a render asks for: the job's fields as given (the contract fills the model's defaults
    and checks them, h3render.queue.contract) and where its outputs go."""

    model: str
    fields: dict[str, Any]
    output: Path
    threads: int = 0
    frames_dir: Path | None = None
    poster: Path | None = None
    init_latents: Path | None = None


class BadInput(Exception):
    """Input the user can fix; exit code 2."""


def default_poster(output: Path) -> Path:
    """out.mp4 -> out.png beside it."""
    return output.with_suffix(".png")


def model_name(arg: str) -> str:
    """The job's model name for --model DIR|NAME: the directory's own name (made a valid name)."""
    from h3render.queue.rules import SPECS

    name = Path(arg).name
    return name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) and ".." not in name \
        else SPECS["model"].nearest(name)


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


def check_level(info: dict, fields: dict[str, Any], model_dir: Path) -> None:
    """A quant level asked for whose files broke is a model failure (exit 1), not bad input:
    ModelFileError naming the file, as the engine would at render time."""
    why = (info.get("unusable_levels") or {}).get(fields.get("quant"))
    if why:
        raise ModelFileError(f"quant level {fields['quant']!r} of {model_dir} cannot render: {why}")


def prepare(engine, params: RunParams):
    """(resolved job, warnings, GenerateRequest) through the job contract, the same path a
    queued job takes; raises JobValidationError listing every problem of both layers."""
    from h3render.queue import contract
    from h3render.queue.engine_info import with_model_facts

    name = model_name(params.model)
    info = with_model_facts(name, engine.info(), engine.model_dir)
    check_level(info, params.fields, engine.model_dir)
    checked = contract.check({**params.fields, "model": name}, lambda _model: info)
    job = checked.job
    init = None
    if params.init_latents is not None:
        init = load_init_latents(params.init_latents, engine.latent_shape(job.width, job.height, job.frames))
    return job, checked.warnings, contract.request(job, info, engine.model_dir, params.threads, init)


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


def render(engine, req, fps: float, params: RunParams, console: Console) -> dict[str, Path]:
    """Run the engine with a progress bar per phase, writing outputs as frames arrive."""
    from h3render.engine.binding import FRAME_FINAL
    from h3render.engine.video import RenderOutputs

    outputs = RenderOutputs(
        width=req.width, height=req.height, total=req.frames, fps=fps,
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

    err = console or make_console(stderr=True)
    problems = [] if params.output.suffix.lower() == ".mp4" else [
        Problem("--output", str(params.output), "must end in .mp4", str(params.output.with_suffix(".mp4")))]
    try:
        model_dir = resolve(params)
        with Engine(model_dir, params.threads) as engine:
            try:
                job, warnings, req = prepare(engine, params)
            except JobValidationError as e:
                raise JobValidationError(problems + e.problems) from None
            if problems:
                raise JobValidationError(problems)
            for w in warnings:
                err.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
            started = time.monotonic()
            written = render(engine, req, float(job.fps), params, err)
    except JobValidationError as exc:
        err.print("[bold red]error:[/] invalid job:\n" + "\n".join(f"  {escape(str(p))}" for p in exc.problems),
                  highlight=False, soft_wrap=True)
        return 2
    except BadInput as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    except InvalidRequestError as exc:  # the engine itself refused the request
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    except (EngineError, ConvertError, VideoError, OSError) as exc:
        err.print(f"[bold red]render failed:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:  # the engine stopped within a step; partial files were removed
        err.print("[bold red]canceled[/]", highlight=False)
        return 130
    elapsed = time.monotonic() - started
    summary = {
        "model": str(model_dir), "seed": req.seed, "width": req.width, "height": req.height,
        "frames": req.frames, "steps": req.steps, "sampler": req.sampler, "quant": req.quant,
        "seconds": round(elapsed, 3), "warnings": warnings, **{k: str(v) for k, v in written.items()},
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
@click.option("--prompt", required=True, help="What to render ('-': read it from stdin).")
@click.option("--negative-prompt", default=None, help="What to steer away from (with guidance > 1).")
@click.option("--seed", default=None, help="RNG seed, 0 to 2^63-1; random if omitted (and printed).")
@click.option("--width", default=None, help="Width in pixels (model default).")
@click.option("--height", default=None, help="Height in pixels (model default).")
@click.option("--frames", default=None, help="Frame count (Wan: 4k+1).")
@click.option("--steps", default=None, help="Denoising steps.")
@click.option("--guidance", default=None, help="Classifier-free guidance scale.")
@click.option("--shift", default=None, help="Flow shift of the sigma schedule.")
@click.option("--sampler", default=None, help="unipc or euler (model default).")
@click.option("--quant", default=None, help="Quant level of the DiT weights (f32, f16, ...; default f16).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="Engine option (repeatable).")
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
def run(as_json: bool, model: str, prompt: str, options: tuple[str, ...], threads: int, frames_dir: Path | None,
        poster: Path | None, init_latents: Path | None, output: Path, **flags: str | None) -> None:
    """Render one video from a prompt now, in this process (checked as `enqueue` checks a job)."""
    from h3render.cli.jobs import lenient, parse_options, prompt_arg

    fields: dict[str, Any] = {"prompt": prompt_arg(prompt)}
    fields.update({k: lenient(k, v) for k, v in flags.items() if v is not None})
    try:
        if options:
            fields["engine_options"] = parse_options(options)
    except JobValidationError as e:
        click.echo("error: invalid job:\n" + "\n".join(f"  {p}" for p in e.problems), err=True)
        sys.exit(2)
    params = RunParams(model=model, fields=fields, output=output, threads=threads, frames_dir=frames_dir,
                       poster=poster, init_latents=init_latents)
    sys.exit(execute(params, as_json=as_json))
