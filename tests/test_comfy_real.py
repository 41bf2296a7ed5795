"""A real ComfyUI server loads the h3render nodes and runs the example API workflows.

Runs only when given a ComfyUI checkout and the Python it runs with (h3render must be
installed into that Python; see docs/COMFYUI.md for the whole setup):

    H3RENDER_COMFYUI_DIR=/path/to/ComfyUI H3RENDER_COMFYUI_PYTHON=/path/to/venv/bin/python \
        pytest tests/test_comfy_real.py -s

It installs the custom node (`h3render comfyui install`, which writes
custom_nodes/h3render/ in that checkout), starts a real Redis and a real worker, starts
`main.py --cpu` on a free loopback port with its output and temp folders in a temp dir,
then POSTs examples/comfyui/render_api.json (H3 Render -> PreviewImage + SaveVideo)
and sweep_api.json (H3 Sweep -> H3 Sweep Results -> PreviewImage) to /prompt, polls
/history/<id>, and checks that every output file exists. Takes about 1-2 minutes
(ComfyUI imports torch at start).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from redis_fixture import free_port
from h3render.worker.health import Readings

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "comfyui"
CLI = "import sys; from h3render.cli import main; sys.argv[0] = 'h3render'; main()"
START_TIMEOUT_S = 300  # torch import and ComfyUI's start on 2 busy cores
RUN_TIMEOUT_S = 300


def _comfy_setup() -> tuple[Path, str]:
    d = os.environ.get("H3RENDER_COMFYUI_DIR")
    if not d:
        pytest.skip("set H3RENDER_COMFYUI_DIR to a ComfyUI checkout (and H3RENDER_COMFYUI_PYTHON to its "
                    "Python, with h3render installed) to run the real-ComfyUI check; see docs/COMFYUI.md")
    comfy = Path(d)
    if not (comfy / "main.py").is_file():
        pytest.skip(f"H3RENDER_COMFYUI_DIR={d!r} has no main.py: not a ComfyUI checkout")
    py = os.environ.get("H3RENDER_COMFYUI_PYTHON") or next(
        (str(p) for p in (comfy / "venv/bin/python", comfy / ".venv/bin/python") if p.is_file()), None)
    if py is None:
        pytest.skip("set H3RENDER_COMFYUI_PYTHON to the Python that runs ComfyUI (none found in "
                    f"{comfy}/venv or {comfy}/.venv)")
    return comfy, py


def _get(url: str, timeout: float = 10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _post(url: str, doc: dict):
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"POST {url}: {e.code} {e.read().decode(errors='replace')}") from None


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def _run_prompt(base: str, workflow: dict, log: Path) -> dict:
    res = _post(f"{base}/prompt", {"prompt": workflow, "client_id": "h3render-test"})
    assert not res.get("node_errors"), res
    pid = res["prompt_id"]
    end = time.time() + RUN_TIMEOUT_S
    while time.time() < end:
        hist = _get(f"{base}/history/{pid}")
        entry = hist.get(pid)
        if entry and entry.get("status", {}).get("completed") is not None and (
                entry["status"]["completed"] or entry["status"].get("status_str") == "error"):
            assert entry["status"]["status_str"] == "success", (
                json.dumps(entry["status"], indent=1)[-3000:] + "\n" + log.read_text()[-3000:])
            return entry
        time.sleep(0.5)
    raise AssertionError(f"prompt {pid} did not finish in {RUN_TIMEOUT_S} s\n{log.read_text()[-3000:]}")


def _files(entry: dict, node: str, dirs: dict[str, Path]) -> list[Path]:
    out = entry["outputs"].get(node) or {}
    items = [i for key in ("images", "videos", "gifs") for i in out.get(key, [])]
    return [dirs[i.get("type", "output")] / i.get("subfolder", "") / i["filename"] for i in items]


def test_real_comfyui_runs_the_example_workflows(h3_settings, tmp_path):
    comfy, py = _comfy_setup()
    readings = tmp_path / "readings.json"
    readings.write_text(Readings(platform="test").model_dump_json())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(H3RENDER_HOME=str(h3_settings.home), H3RENDER_REDIS_URL=h3_settings.redis_url)
    # ComfyUI runs its own installed h3render (no PYTHONPATH); the worker runs this tree's
    worker_env = {**env, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                  "H3RENDER_GATE_POLL_S": "1", "H3RENDER_ENABLE_TEST_TRIGGERS": "1",
                  "H3RENDER_TEST_READINGS": str(readings)}

    from h3render.cli import COMMANDS

    # `h3render comfyui install`; the command's own group until the CLI registers the name
    cmd = [CLI, "comfyui"] if "comfyui" in COMMANDS else ["from h3render.cli.comfyui import comfyui; comfyui()"]
    inst = subprocess.run([sys.executable, "-c", *cmd, "install", str(comfy), "--python", py, "--json"],
                          env=worker_env, capture_output=True, text=True, timeout=180)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    installed = json.loads(inst.stdout)
    where = subprocess.run([py, "-c", "import h3render; print(h3render.__file__)"], cwd=comfy, env=env,
                           capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, f"h3render is not installed in {py}: {where.stderr[-1000:]}"
    print(f"installed {installed['path']}; ComfyUI's Python imports {where.stdout.strip()}")

    port = free_port()
    # ComfyUI puts its temp files (PreviewImage's) in <--temp-directory>/temp
    dirs = {"output": tmp_path / "output", "temp": tmp_path / "tmp" / "temp", "input": tmp_path / "input"}
    for d in dirs.values():
        d.mkdir(parents=True)
    log = tmp_path / "comfyui.log"
    worker = subprocess.Popen([sys.executable, "-c", CLI, "worker"], env=worker_env,
                              stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT)
    server = subprocess.Popen(
        [py, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
         "--output-directory", str(dirs["output"]), "--temp-directory", str(tmp_path / "tmp"),
         "--input-directory", str(dirs["input"])],
        cwd=comfy, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        info = None
        while time.time() - t0 < START_TIMEOUT_S:
            assert server.poll() is None, f"ComfyUI exited with {server.returncode}\n{log.read_text()[-3000:]}"
            try:
                info = _get(f"{base}/object_info")
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)
        assert info is not None, f"ComfyUI did not answer in {START_TIMEOUT_S} s\n{log.read_text()[-3000:]}"
        print(f"ComfyUI answered after {time.time() - t0:.0f} s")
        for name in ("H3Render", "H3Sweep", "H3SweepResults"):
            assert name in info, f"{name} not loaded\n{log.read_text()[-3000:]}"
        assert "IMPORT FAILED" not in log.read_text()
        video_type = info["H3Render"]["output"][1]
        assert "tiny-wan" in info["H3Render"]["input"]["required"]["model"][0]

        render = json.loads((EXAMPLES / "render_api.json").read_text())
        if video_type != "VIDEO":  # an older ComfyUI: the video output is the mp4 path
            render.pop("3")
        t1 = time.time()
        entry = _run_prompt(base, render, log)
        print(f"render workflow: {time.time() - t1:.1f} s, outputs {entry['outputs']}")
        previews = _files(entry, "2", dirs)
        assert previews and all(p.is_file() and p.stat().st_size > 0 for p in previews), previews
        assert len(previews) == render["1"]["inputs"]["frames"]  # one preview per frame
        if "3" in render:
            videos = _files(entry, "3", dirs)
            assert len(videos) == 1 and videos[0].is_file() and videos[0].stat().st_size > 0, videos

        sweep = json.loads((EXAMPLES / "sweep_api.json").read_text())
        t1 = time.time()
        entry = _run_prompt(base, sweep, log)
        print(f"sweep workflow: {time.time() - t1:.1f} s, outputs {entry['outputs']}")
        sheets = _files(entry, "3", dirs)
        frames = _files(entry, "4", dirs)
        assert len(sheets) == 1 and sheets[0].is_file(), sheets
        assert len(frames) == int(sweep["1"]["inputs"]["frames"]) and all(f.is_file() for f in frames), frames
    finally:
        _stop(server)
        _stop(worker)
