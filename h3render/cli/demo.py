"""`h3render demo`: the overnight story in miniature.

It starts (or reuses) the embedded Redis, queues a sweep of 8 jobs over two axes
with the default model, drains the queue with a burst worker while a progress
bar runs, then prints the results table and the folder the videos are in.
Everything goes through the same package API as `sweep`, `worker` and `status`.

Last, it checks the videos the way `h3render eval-demo` does: the analytic
detector reads each clip's colour, direction and shape, compares them with what
the prompt names, and a contact sheet (contact.png beside the videos: one row
per job, a green or red mark per attribute, then the frames) shows the result.
"""

from __future__ import annotations

import subprocess
import sys

import click

# In the demo model's vocabulary (h3render.demo_data): every shape, colour and
# direction it can check appears in at least one prompt.
DEMO_PROMPTS = (
    "a red circle moving left slowly over a black background",
    "a blue square quickly sliding up on a white backdrop",
    "gray background, a yellow triangle drifting right gently",
    "a green disc gliding down rapidly against a dark backdrop",
)
DEMO_SEEDS = (1, 2)
# A worker started by the demo exits 2 when another worker of this host holds
# the lock; then that worker renders the sweep and the demo only waits.
WORKER_LOCKED = 2


@click.command()
def demo() -> None:
    """Queue an 8-job sweep with the built-in model, render it, show the results."""
    from h3render.cli.console import console as make_console
    from h3render.cli.jobs import render_status, wait_for
    from h3render.engine.models import DEFAULT_MODEL
    from h3render.queue import status as st
    from h3render.queue.connection import get_redis
    from h3render.queue.enqueue import enqueue_sweep
    from h3render.queue.errors import QueueError
    from h3render.settings import Settings

    console = make_console()
    settings = Settings()
    try:
        r = get_redis(settings)
    except QueueError as exc:
        console.print(f"[red]error:[/] {exc}")
        sys.exit(1)
    where = settings.redis_url or "the embedded redis-server (h3render redis status)"
    console.print(f"Redis: {where}")

    fixed = {"model": DEFAULT_MODEL}
    axes = {"prompt": list(DEMO_PROMPTS), "seed": list(DEMO_SEEDS)}
    try:
        result = enqueue_sweep(r, fixed, axes, settings)
    except QueueError as exc:
        console.print(f"[red]error:[/] {exc}")
        sys.exit(2)
    console.print(
        f"sweep {result.sweep_id}: {len(result.job_ids)} jobs over "
        f"{len(DEMO_PROMPTS)} prompts x {len(DEMO_SEEDS)} seeds, estimated {result.seconds:.0f} s"
    )

    worker = subprocess.Popen(
        [sys.executable, "-c", "from h3render.cli import main; main()", "worker", "--burst",
         "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL,
    )
    try:
        # A burst worker leaves once nothing is runnable; jobs it failed wait for
        # their retry (rq's scheduler), which the next `h3render worker` takes up.
        code = wait_for(r, result.job_ids, give_up=lambda: worker.poll() not in (None, WORKER_LOCKED))
    finally:
        if worker.poll() is None:
            worker.wait(timeout=120)
    if worker.returncode not in (0, WORKER_LOCKED):
        console.print(f"[red]the burst worker exited with code {worker.returncode}[/]")
        code = code or 1

    sweep = st.sweep_status(r, result.sweep_id)
    data = {"sweep_id": result.sweep_id, "record": sweep["record"], "summary": sweep["summary"],
            "workers": st.worker_health(r), "_rows": sweep["rows"]}
    console.print(render_status(data, "sweep"))
    from pathlib import Path

    videos = sorted(Path(row.output_dir) / "video.mp4" for row in sweep["rows"]
                    if row.output_dir and (Path(row.output_dir) / "video.mp4").is_file())
    if videos:
        console.print(f"{len(videos)} videos in {videos[0].parent.parent}")
        check_prompts(console, videos)
    if code:
        console.print(f"[yellow]{len(result.job_ids) - len(videos)} jobs did not finish; "
                      f"`h3render status {result.sweep_id}` says why, `h3render worker` runs what is left[/]")
    say_what_is_left_running(console, settings)
    sys.exit(code)


def say_what_is_left_running(console, settings) -> None:
    """The embedded redis-server outlives the demo on purpose (the next command reuses the
    queue and its results): say so, with how to stop it."""
    if settings.redis_url:
        return
    from h3render.queue.redis_server import embedded

    server = embedded(settings)
    pid = server.read_pid()
    if pid is None:
        return
    console.print(f"left running: the embedded redis-server (pid {pid}, 127.0.0.1:{server.port}, data in "
                  f"{server.dir}), which keeps the queue and its results for the next command; "
                  "stop it with `h3render redis stop`", markup=False, highlight=False, soft_wrap=True)


def check_prompts(console, videos: list) -> None:
    """Detect each video's colour, direction and shape; print the tally, write contact.png.

    Rows go by prompt, then seed; contact.txt beside the sheet lists each row's prompt,
    seed and what the detector saw.
    """
    import json

    from h3render.engine.eval_demo import ATTRIBUTES, check_prompt, contact_sheet, write_png
    from h3render.engine.video import read_frames

    jobs = []
    for video in videos:
        params = json.loads((video.parent / "meta.json").read_text())["parameters"]
        jobs.append((str(params["prompt"]), int(params["seed"]), video))
    jobs.sort(key=lambda j: (j[0], j[1]))
    rows, marks = [], []
    for prompt, _seed, video in jobs:
        clip = read_frames(video)
        rows.append(clip)
        marks.append(check_prompt(prompt, clip))
    if len({r.shape for r in rows}) != 1:
        return  # a sweep of several sizes has no one grid
    folder = videos[0].parent.parent
    write_png(folder / "contact.png", contact_sheet(rows, marks, scale=max(1, 96 // rows[0].shape[1])))
    word = {True: "yes", False: "NO", None: "-"}
    (folder / "contact.txt").write_text("row  seed  " + "  ".join(ATTRIBUTES) + "  prompt\n" + "".join(
        f"{i:3d}  {seed:4d}  " + "  ".join(f"{word[m[a]]:>{len(a)}}" for a in ATTRIBUTES) + f"  {prompt}\n"
        for i, ((prompt, seed, _), m) in enumerate(zip(jobs, marks))))
    named = {a: [m[a] for m in marks if m[a] is not None] for a in ATTRIBUTES}
    tally = ", ".join(f"{a} {sum(v)}/{len(v)}" for a, v in named.items() if v)
    console.print(f"prompts followed (analytic detector): {tally or 'no prompt names a checkable attribute'}")
    console.print(f"contact sheet: {folder / 'contact.png'} (rows: {folder / 'contact.txt'})")
