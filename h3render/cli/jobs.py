"""`h3render enqueue | sweep | status | cancel | retry`: thin commands over h3render.queue.

Numbers are taken as text and converted leniently, so a bad value reaches the job
model and comes back with the field, the rule and the nearest valid value (exit 2)
instead of a bare "not a valid integer".
"""

from __future__ import annotations

from collections.abc import Callable

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from h3render.engine.builtin import DEFAULT_MODEL
from h3render.queue.errors import (JobValidationError, NotFoundError, NotStoredError, Problem, QueueError,
                                   QueueInputError)
from h3render.queue.rules import short
from h3render.cli.console import console as make_console

INT_FIELDS = ("seed", "width", "height", "frames", "steps", "fps", "preview_every")
FLOAT_FIELDS = ("guidance", "shift")
TEXT_FIELDS = ("prompt", "negative_prompt", "sampler", "quant", "model", "priority")


# ---- shared plumbing ---------------------------------------------------------------------------


def handle_errors(fn):
    """Map queue errors to exit codes with a message: input 2, everything else 1. Never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        as_json = kwargs.get("as_json", False)
        try:
            return fn(*args, **kwargs)
        except JobValidationError as e:
            head = getattr(e, "heading", "invalid job")  # capacity.DoesNotFitError: "does not fit any machine"
            _fail(e.to_dict() if as_json else f"{head}:\n" + "\n".join(f"  {p}" for p in e.problems), 2, as_json)
        except (QueueInputError, NotFoundError) as e:
            _fail({"error": str(e)} if as_json else str(e), 2, as_json)
        except NotStoredError as e:  # Redis could not persist: nothing was queued
            _fail({**e.to_dict(), "message": str(e)} if as_json else str(e), 1, as_json)
        except QueueError as e:
            _fail({"error": str(e)} if as_json else str(e), 1, as_json)
        except (click.exceptions.Exit, click.ClickException, KeyboardInterrupt):
            raise
        except Exception as e:  # a bug or an unexpected failure: say what, exit 1
            _fail({"error": f"{type(e).__name__}: {e}"} if as_json else f"error: {type(e).__name__}: {e}", 1, as_json)

    return wrapper


def _fail(message: Any, code: int, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(message))
    else:
        click.echo(message, err=True)
    sys.exit(code)


def _settings():
    from h3render.settings import Settings

    return Settings()


def _redis(settings):
    from h3render.queue.connection import get_redis

    return get_redis(settings)


def lenient(name: str, text: str | None) -> Any:
    """Flag text to the type the field wants when it reads as one; else the text itself."""
    if text is None:
        return None
    t = text.strip()
    if name in INT_FIELDS:
        if name == "seed" and t == "random":
            return t
        try:
            return int(t)
        except ValueError:
            try:
                return float(t)  # 30.0 or 1e3: the model names the rule and rounds
            except ValueError:
                return text
    if name in FLOAT_FIELDS:
        try:
            return float(t)
        except ValueError:
            return text
    return text


def parse_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """--option key=value (repeatable) -> engine_options; true/false/numbers are typed."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise JobValidationError([Problem("--option", pair, "must be key=value", f"{pair.strip() or 'key'}=1")])
        k, v = pair.split("=", 1)
        low = v.strip().lower()
        if low in ("true", "false"):
            out[k.strip()] = low == "true"
            continue
        try:
            out[k.strip()] = int(v)
        except ValueError:
            try:
                out[k.strip()] = float(v)
            except ValueError:
                out[k.strip()] = v
    return out


STDIN = "-"


def read_stdin(what: str) -> str:
    """All of stdin, for the option `what` given as '-'; a terminal gets a line saying how to end it."""
    if sys.stdin is None:
        raise QueueInputError(f"{what} -: there is no stdin to read")
    if sys.stdin.isatty():
        click.echo(f"reading {what} from stdin (end with Ctrl-D)", err=True)
    try:
        return sys.stdin.read()
    except (OSError, UnicodeDecodeError) as e:
        raise QueueInputError(f"{what} -: cannot read stdin: {e}") from None


def prompt_arg(text: str | None) -> str | None:
    """--prompt's value: '-' reads the prompt from stdin (its surrounding whitespace dropped)."""
    return read_stdin("--prompt").strip() if text == STDIN else text


def fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


# ---- enqueue -----------------------------------------------------------------------------------

_job_options = [
    click.option("--negative-prompt", "negative_prompt", default=None, help="default: the model's"),
    click.option("--seed", default=None, help='non-negative integer or "random" (default; drawn and recorded now)'),
    click.option("--width", default=None),
    click.option("--height", default=None),
    click.option("--frames", default=None, help="Wan: 4k+1"),
    click.option("--steps", default=None),
    click.option("--guidance", default=None),
    click.option("--shift", default=None),
    click.option("--sampler", default=None, help="unipc or euler"),
    click.option("--quant", default=None, help="quant level of the DiT (f16, q8_0, ...)"),
    click.option("--model", default=None, help=f"model name (default {DEFAULT_MODEL})"),
    click.option("--fps", default=None),
    click.option("--preview-every", "preview_every", default=None,
                 help="a preview frame every n denoising steps into the job's meta (0: none, the default)"),
]


def job_options(fn):
    for opt in reversed(_job_options):
        fn = opt(fn)
    return fn


@click.command()
@click.option("--prompt", default=None, help="what to render (required unless --file has it; '-': stdin)")
@job_options
@click.option("--priority", default=None, help="normal or high (high goes to the front of the queue)")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="engine-specific option")
@click.option("--file", "json_file", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="a JSON object of job fields ('-': stdin); flags given as well override its fields")
@click.option("--wait", is_flag=True, help="show a live progress bar until the job ends")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@handle_errors
def enqueue(prompt: str | None, options: tuple[str, ...], json_file: str | None, wait: bool, as_json: bool,
            **fields: str | None) -> None:
    """Queue one render and print its job id."""
    from h3render.queue.enqueue import enqueue as do_enqueue
    from h3render.queue.job import RenderJob

    if json_file == STDIN and prompt == STDIN:
        raise QueueInputError("--file - and --prompt - both read stdin: give one of them another source")
    payload: dict[str, Any] = {}
    if json_file is not None:
        loaded = read_job_file(json_file)
        if not isinstance(loaded, dict):
            RenderJob.parse(loaded)  # refuses a list, a text, null ... as field "job"
        payload.update(loaded)
    if prompt is not None:
        payload["prompt"] = prompt_arg(prompt)
    payload.update({k: lenient(k, v) for k, v in fields.items() if v is not None})
    if options:
        payload["engine_options"] = parse_options(options)
    # Both layers of validation need the engine's info, which is in Redis: every problem in one answer.
    settings = _settings()
    r = _redis(settings)
    res = do_enqueue(r, payload, settings)
    job_id = res.job_ids[0]
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "estimate_s": round(res.seconds, 1), "warnings": res.warnings,
                               "stored": res.stored}))
    else:
        click.echo(job_id)
        click.echo(f"estimated run time {fmt_s(res.seconds)} ({res.time_source})", err=True)
        for w in res.warnings:
            click.echo(f"warning: {w}", err=True)
    if wait:
        sys.exit(wait_for(r, [job_id], quiet=as_json, settings=settings))


def read_job_file(path: str) -> Any:
    """The JSON value in `path` ('-': stdin); JobValidationError on field "job" if it is not JSON."""
    try:
        text = read_stdin("--file") if path == STDIN else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise QueueInputError(f"--file {path!r}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise JobValidationError([Problem("job", short(text),
                                          f"--file must hold a JSON object of job fields: {e}",
                                          {"prompt": "..."})]) from None


NO_WORKER_CHECK_S = 1.0  # how often a wait asks whether any worker serves the queue
NO_WORKER_HINT = ("no h3render worker is running for queue {queue!r}: nothing renders until one starts. "
                  "Start one with `h3render worker` (in another terminal or on another machine with the same "
                  "Redis). Still waiting; Ctrl-C stops waiting and leaves the job queued.")


def wait_for(r, job_ids: list[str], quiet: bool = False, poll_s: float = 0.5,
             give_up: Callable[[], bool] | None = None, settings=None) -> int:
    """Progress bar until every job ends (or give_up() says no one will run them);
    0 if all finished, 1 otherwise.

    With `settings` (and no give_up: a caller with a worker of its own knows better), a wait
    with no live worker says so on stderr at once, naming the command that starts one, and
    goes on waiting; a worker that appears later is announced too."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from h3render.queue.job import JobPhase
    from h3render.queue.status import job_rows

    n = len(job_ids)
    hint = give_up is None and settings is not None
    checked_at, alone = float("-inf"), False
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), disable=quiet, transient=False) as progress:
        task = progress.add_task("queued", total=1000, info="")
        while True:
            rows = job_rows(r, job_ids)
            done = [row for row in rows if JobPhase(row.state).terminal]
            if n == 1 and rows:
                row = rows[0]
                step = f"step {row.step}/{row.steps}" if row.step is not None and row.steps else ""
                info = " ".join(x for x in (step, f"ETA {fmt_s(row.eta_s)}" if row.eta_s is not None else "") if x)
                progress.update(task, description=row.state, completed=int(1000 * (row.progress or 0)), info=info)
            else:
                frac = sum((row.progress or 0) if not JobPhase(row.state).terminal else 1 for row in rows) / max(n, 1)
                progress.update(task, description=f"{len(done)}/{n} done", completed=int(1000 * frac), info="")
            if len(done) == len(rows) or (give_up is not None and give_up()):
                break
            if hint and time.monotonic() - checked_at >= NO_WORKER_CHECK_S:
                checked_at = time.monotonic()
                alone = _say_who_works(r, settings, alone)
            time.sleep(poll_s)
    for row in rows:
        if not quiet:
            where = row.output_dir or row.error or ""
            click.echo(f"{row.id} {row.state} {where}")
    return 0 if all(row.state == JobPhase.finished.value for row in rows) else 1


def _say_who_works(r, settings, alone: bool) -> bool:
    """Say on stderr when the queue loses its last live worker or gains one; True while none is alive."""
    import redis

    from h3render.queue.workers import live_workers

    try:
        names = [w.name for w in live_workers(r, settings)]
    except redis.RedisError:  # the wait itself reports a Redis that is gone
        return alone
    if not names and not alone:
        click.echo("warning: " + NO_WORKER_HINT.format(queue=settings.queue_name), err=True)
    elif names and alone:
        click.echo(f"worker {names[0]} is running: waiting for the job", err=True)
    return not names


# ---- sweep -------------------------------------------------------------------------------------

_AXIS_FLAGS = ("seed", "steps", "quant", "guidance", "shift", "sampler", "model", "width", "height", "frames", "fps")


def sweep_options(fn):
    for name in reversed(_AXIS_FLAGS):
        fn = click.option(f"--{name}", name, multiple=True, help=None)(fn)
    fn = click.option("--negative-prompt", "negative_prompt", multiple=True)(fn)
    fn = click.option("--prompt", "prompt", multiple=True,
                      help="repeat for several prompts ('-': one prompt per line of stdin)")(fn)
    return fn


@click.command()
@click.option("--file", "toml_file", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="TOML file with the axes ('-': stdin)")
@sweep_options
@click.option("--preview", is_flag=True, help="render every combination small and short first")
@click.option("--preview-every", "preview_every", default=None,
              help="a preview frame every n denoising steps into each job's meta (0: none)")
@click.option("--priority", default=None)
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE")
@click.option("--dry-run", is_flag=True, help="validate and estimate; enqueue nothing")
@click.option("--wait", is_flag=True, help="progress bar until every job ends")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def sweep(toml_file, preview, preview_every, priority, options, dry_run, wait, as_json, **axes_flags) -> None:
    """Queue a grid of renders: --seed 1-8 --steps 20,30 --quant q8_0,q4_0 --prompt A --prompt B."""
    from h3render.queue import sweep as sw
    from h3render.queue.enqueue import distinct_warnings, enqueue_sweep_planned, plan

    fixed: dict[str, Any] = {}
    axes: dict[str, list[Any]] = {}
    prompts = axes_flags.get("prompt") or ()
    if toml_file == STDIN and STDIN in prompts:
        raise QueueInputError("--file - and --prompt - both read stdin: give one of them another source")
    if STDIN in prompts:  # each non-blank line of stdin is one prompt, in place of the '-'
        lines = [ln.strip() for ln in read_stdin("--prompt").splitlines() if ln.strip()]
        if not lines:
            raise JobValidationError([Problem("prompt", "-", "read from stdin, which held no non-blank line: "
                                              "give one prompt per line", None)])
        axes_flags["prompt"] = tuple(p for t in prompts for p in (lines if t == STDIN else [t]))
    if toml_file:
        try:
            text = read_stdin("--file") if toml_file == STDIN else Path(toml_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or e
            raise QueueInputError(f"--file {toml_file!r}: cannot read it: {why}") from None
        fixed, axes, file_preview = sw.from_toml(text, f"--file {'stdin' if toml_file == STDIN else toml_file}")
        preview = preview or file_preview
    flag_fixed, flag_axes = sw.from_flags({k: v for k, v in axes_flags.items() if v})
    for k in flag_fixed:
        axes.pop(k, None)
    for k in flag_axes:
        fixed.pop(k, None)
    fixed.update(flag_fixed)
    axes.update(flag_axes)
    if priority is not None:
        fixed["priority"] = priority
    if preview_every is not None:
        fixed["preview_every"] = lenient("preview_every", preview_every)
    if options:
        fixed["engine_options"] = parse_options(options)
    settings = _settings()
    r = _redis(settings)
    planned = plan(r, sw.expand(fixed, axes), settings, preview=preview)
    total = sum(p.seconds for p in planned)
    summary = {"jobs": len(planned), "preview_jobs": sum(1 for p in planned if p.preview_of),
               "axes": {k: len(v) for k, v in axes.items()}, "estimate_s": round(total, 1),
               "estimate_source": ", ".join(sorted({p.time_source for p in planned})),
               "warnings": distinct_warnings(planned)}
    if not as_json:
        for w in summary["warnings"]:
            click.echo(f"warning: {w}", err=True)
    if dry_run:
        click.echo(json.dumps(summary) if as_json else
                   f"dry run: {summary['jobs']} jobs, estimated {fmt_s(total)} ({summary['estimate_source']})")
        return
    res = enqueue_sweep_planned(r, planned, fixed, axes, settings, preview)
    if as_json:
        click.echo(json.dumps({"sweep_id": res.sweep_id, **summary, "warnings": res.warnings,
                               "stored": res.stored}))
    else:
        for w in res.warnings:
            if w not in summary["warnings"]:  # what the write itself said (durability)
                click.echo(f"warning: {w}", err=True)
        click.echo(res.sweep_id)
        pv = f" ({summary['preview_jobs']} previews first)" if preview else ""
        click.echo(f"{len(res.job_ids)} jobs{pv}, estimated total {fmt_s(total)} ({summary['estimate_source']})",
                   err=True)
    if wait:
        sys.exit(wait_for(r, res.job_ids, quiet=as_json, settings=settings))


# ---- status ------------------------------------------------------------------------------------


@click.command()
@click.argument("ident", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", is_flag=True, help="refresh until the job or sweep ends (Ctrl-C to leave)")
@click.option("--interval", default=2.0, type=float, show_default=True, help="seconds between refreshes")
@click.option("--limit", default=50, type=click.IntRange(min=1), show_default=True,
              help="jobs shown (of a sweep: abandoned, running and failed first)")
@click.option("--page", default=None, type=click.IntRange(min=0),
              help="of a sweep: page N (from 0) of --limit jobs in run order")
@click.option("--state", "states", multiple=True, metavar="STATE",
              help="of a sweep: only jobs in this state (repeatable): queued, denoising, failed, ...")
@click.option("--all", "all_rows", is_flag=True, help="of a sweep: every job")
@handle_errors
def status(ident: str | None, as_json: bool, watch: bool, interval: float, limit: int, page: int | None,
           states: tuple[str, ...], all_rows: bool) -> None:
    """Jobs with state, progress, ETA and output (failed: the reason); a job or sweep id narrows it;
    worker health last. A sweep shows its counts and --limit jobs; --page, --state or --all for others."""
    from rich.live import Live

    from h3render.queue import status as st
    from h3render.queue import sweepstatus
    from h3render.queue.job import JobPhase

    known = [p.value for p in JobPhase]
    for s_ in states:
        if s_ not in known:
            import difflib

            close = difflib.get_close_matches(s_, known, n=1, cutoff=0.0)
            raise QueueInputError(f"--state {s_!r}: not a job state; states: {', '.join(known)}"
                                  + (f" (nearest: {close[0]})" if close else ""))
    settings = _settings()
    r = _redis(settings)
    kind = st.find(r, ident) if ident else None

    def snapshot() -> dict[str, Any]:
        if kind == "job":
            rows = [st.job_status(r, ident)]
            data: dict[str, Any] = {"job": rows[0].to_dict()}
        elif kind == "sweep":
            sw = sweepstatus.sweep_state(r, ident)
            ids = sweepstatus.pick(sw, None if all_rows else limit, page, list(states) or None)
            rows = [j.row for j in sweepstatus.page_rows(r, sw, ids)]
            matching = sum(1 for v in sw.states.values() if not states or v in states)
            data = {"sweep_id": ident, "record": sw.record, "summary": sw.summary,
                    "shown": {"jobs": len(rows), "of": matching, "page": page, "limit": None if all_rows else limit,
                              "states": list(states)}}
        else:
            rows = st.job_rows(r, st.recent_job_ids(r, settings, limit))
            data = {"summary": st.summarize(rows)}
        data["jobs"] = [row.to_dict() for row in rows]
        data["workers"] = st.worker_health(r)
        data["_rows"] = rows
        return data

    def finished(data) -> bool:
        if kind == "sweep":
            return data["summary"]["done"] >= data["summary"]["jobs"]
        return kind is not None and all(JobPhase(row.state).terminal for row in data["_rows"])

    if as_json:
        while True:
            data = snapshot()
            rows = data.pop("_rows")
            click.echo(json.dumps(data, default=str))
            if not watch or finished({**data, "_rows": rows}):
                return
            time.sleep(interval)
    console = make_console()
    if not watch:
        console.print(render_status(snapshot(), kind))
        return
    with Live(render_status(snapshot(), kind), console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(interval)
            data = snapshot()
            live.update(render_status(data, kind))
            if finished(data):
                return


PLAIN_ROWS = 200  # more rows than this print as plain aligned text
STATE_COLORS = {"finished": "green", "failed": "red", "canceled": "yellow", "queued": "dim", "abandoned": "magenta"}


def output_or_reason(row) -> str:
    """The status table's last-but-one column: the reason of a failed, canceled or abandoned
    job, the folder of a finished one, the last error of one queued again."""
    if row.state in ("failed", "canceled", "abandoned"):
        return row.error or "no reason recorded"
    if row.state == "finished":
        return row.output_dir or ""
    return f"last error: {row.error}" if row.error else ""


def render_status(data: dict[str, Any], kind: str | None):
    """A rich renderable: the job table, a summary line and one health line per worker."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from h3render.queue.status import health_line

    cols = ("job", "state", "progress", "ETA", "output / reason", "parameters")
    cells = []
    for row in data["_rows"]:
        prog = f"{row.step}/{row.steps}" if row.step is not None and row.steps else (
            f"{100 * row.progress:.0f}%" if row.progress is not None else "-")
        state = row.state + (" (preview)" if row.preview else "")
        cells.append((row.id, state, prog, fmt_s(row.eta_s), output_or_reason(row), row.label))
    if len(cells) > PLAIN_ROWS:  # rich lays out a table of thousands of rows in seconds
        widths = [max(len(c[i]) for c in [cols, *cells]) for i in range(len(cols) - 1)]
        lines = ["  ".join(c[i].ljust(w) for i, w in enumerate(widths)) + "  " + c[-1] for c in [cols, *cells]]
        parts: list[Any] = [Text("\n".join(lines), no_wrap=True, overflow="ignore")]
    else:
        table = Table(show_lines=False, pad_edge=False)
        for col in cols:
            table.add_column(col, overflow="fold")
        for c in cells:
            table.add_row(c[0], Text(c[1], style=STATE_COLORS.get(c[1].split(" ")[0], "cyan")), *c[2:])
        parts = [table]
    shown = data.get("shown")
    if shown and shown["jobs"] < shown["of"]:
        how = (f"page {shown['page']} of {shown['limit']} in run order" if shown["page"] is not None
               else "abandoned, running and failed first")
        parts.append(Text(f"showing {shown['jobs']} of {shown['of']} jobs ({how}); "
                          "--all for every job, --page N for run order, --state S to filter", style="dim"))
    summary = data.get("summary")
    if summary:
        states = ", ".join(f"{v} {k}" for k, v in sorted(summary["states"].items()))
        head = f"sweep {data['sweep_id']}: " if kind == "sweep" else ""
        parts.append(Text(f"{head}{summary['done']}/{summary['jobs']} done ({states}); "
                          f"remaining ~{fmt_s(summary['remaining_s'])}"))
    workers = data.get("workers") or []
    parts += [Text(health_line(w)) for w in workers] or [Text("no worker has published health (none running?)")]
    return Group(*parts)


# ---- cancel / retry ----------------------------------------------------------------------------


def _report(outcome, verb: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(outcome.to_dict()))
    else:
        for job_id in outcome.done:
            click.echo(f"{verb} {job_id}")
        for job_id, why in outcome.skipped.items():
            click.echo(f"skipped {job_id}: {why}", err=True)


@click.command()
@click.argument("job_id", required=False)
@click.option("--sweep", "sweep_id", default=None, help="cancel every job of this sweep")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def cancel(job_id: str | None, sweep_id: str | None, as_json: bool) -> None:
    """Stop a job within one step (or before it starts); it ends canceled, not failed."""
    from h3render.queue import control

    if bool(job_id) == bool(sweep_id):
        raise QueueInputError("give exactly one of JOB_ID or --sweep ID")
    r = _redis(_settings())
    outcome = control.cancel_sweep(r, sweep_id) if sweep_id else control.cancel(r, job_id)
    _report(outcome, "cancel requested for", as_json)
    if job_id and not outcome.done:
        sys.exit(1)


@click.command()
@click.argument("job_id", required=False)
@click.option("--sweep", "sweep_id", default=None, help="retry the jobs of this sweep")
@click.option("--failed", "failed_only", is_flag=True, help="only failed jobs, not canceled ones")
@click.option("--json", "as_json", is_flag=True)
@handle_errors
def retry(job_id: str | None, sweep_id: str | None, failed_only: bool, as_json: bool) -> None:
    """Requeue a failed or canceled job, or those of a sweep."""
    from h3render.queue import control

    if bool(job_id) == bool(sweep_id):
        raise QueueInputError("give exactly one of JOB_ID or --sweep ID")
    settings = _settings()
    r = _redis(settings)
    if sweep_id:
        outcome = control.retry_sweep(r, sweep_id, settings, failed_only)
    else:
        outcome = control.retry(r, job_id, settings, failed_only)
    _report(outcome, "requeued", as_json)
    if job_id and not outcome.done:
        sys.exit(1)
