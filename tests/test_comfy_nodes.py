"""ComfyUI bridge contracts without ComfyUI: node INPUT_TYPES/RETURN_TYPES, widget parsing,
contact sheets, the install command. Fast (no Redis, no worker).

`FakeComfy` stands in for the three ComfyUI/torch names nodes.py uses. It copies
ComfyUI's own functions (comfy/model_management.py, comfy/utils.py; see
docs/COMFYUI.md for the version checked): the interrupt flag is read and cleared
under a lock and raises InterruptProcessingException; the progress bar takes
update_absolute(value, total, preview), preview being ComfyUI's PreviewImageTuple
(format, PIL image, max size; comfy_execution/progress.py), and comfy.cli_args.args
has ComfyUI's default preview_size. torch.from_numpy returns the array itself, so
tests see exactly what a node returns. tests/test_comfy_real.py runs the same
nodes inside a real ComfyUI. test_comfy_queue.py imports these helpers.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from h3render.comfy_bridge import inputs, sheet, spec
from h3render.comfy_bridge.errors import BridgeInputError
from h3render.engine.builtin import DEFAULT_MODEL
from h3render.queue.errors import JobValidationError



class InterruptProcessingException(Exception):
    pass


class FakeComfy:
    """Installs fake `torch`, `comfy`, `comfy.utils`, `comfy.model_management` modules."""

    def __init__(self):
        self.progress: list[tuple[int, int]] = []  # every update_absolute(value, total)
        self.bars: list[int] = []  # totals of the ProgressBars created
        self.previews: list[tuple[int, tuple]] = []  # (value, preview tuple) of updates that carried one
        self._flag = False
        self._lock = threading.Lock()
        self.interrupt_when = None  # callable(progress list) -> bool, polled by the interrupt check

    def interrupt(self) -> None:
        with self._lock:
            self._flag = True

    def modules(self) -> dict[str, types.ModuleType]:
        fake = self

        class ProgressBar:
            def __init__(self, total, node_id=None):
                self.total, self.current = total, 0
                fake.bars.append(total)

            def update_absolute(self, value, total=None, preview=None):
                if total is not None:
                    self.total = total
                self.current = min(value, self.total)
                fake.progress.append((value, self.total))
                if preview is not None:
                    fake.previews.append((value, preview))

            def update(self, value):
                self.update_absolute(self.current + value)

        def throw_exception_if_processing_interrupted():
            if fake.interrupt_when is not None and fake.interrupt_when(fake.progress):
                fake.interrupt_when = None
                fake.interrupt()
            with fake._lock:
                if fake._flag:
                    fake._flag = False
                    raise InterruptProcessingException()

        torch = types.ModuleType("torch")
        torch.from_numpy = lambda a: a
        comfy = types.ModuleType("comfy")
        utils = types.ModuleType("comfy.utils")
        utils.ProgressBar = ProgressBar
        mm = types.ModuleType("comfy.model_management")
        mm.InterruptProcessingException = InterruptProcessingException
        mm.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted
        cli_args = types.ModuleType("comfy.cli_args")
        cli_args.args = types.SimpleNamespace(preview_size=512)  # ComfyUI's --preview-size default
        comfy.utils, comfy.model_management, comfy.cli_args = utils, mm, cli_args
        return {"torch": torch, "comfy": comfy, "comfy.utils": utils, "comfy.model_management": mm,
                "comfy.cli_args": cli_args}


def load_nodes(monkeypatch, fake: FakeComfy):
    """Import h3render.comfy_bridge.nodes afresh against the fakes (no comfy_api: no VIDEO type)."""
    for name, mod in fake.modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    for name in ("comfy_api", "comfy_api.input_impl", "comfy_api.latest"):
        monkeypatch.setitem(sys.modules, name, None)  # import of these raises ImportError
    monkeypatch.delitem(sys.modules, "h3render.comfy_bridge.nodes", raising=False)
    nodes = importlib.import_module("h3render.comfy_bridge.nodes")
    monkeypatch.delitem(sys.modules, "h3render.comfy_bridge.nodes", raising=False)
    return nodes


@pytest.fixture
def fake_comfy():
    return FakeComfy()


@pytest.fixture
def nodes(monkeypatch, fake_comfy, tmp_path):
    monkeypatch.setenv("H3RENDER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("H3RENDER_REDIS_URL", "redis://127.0.0.1:9/0")  # nothing listens: dropdowns fall back
    return load_nodes(monkeypatch, fake_comfy)


# ---------------------------------------------------------------- node contracts


RENDER_FIELDS = ["prompt", "negative_prompt", "seed", "width", "height", "frames", "steps", "guidance",
                 "quant", "model", "timeout"]


def test_classic_api_mappings(nodes):
    assert set(nodes.NODE_CLASS_MAPPINGS) == {"H3Render", "H3Sweep", "H3SweepResults"}
    assert nodes.NODE_DISPLAY_NAME_MAPPINGS == {
        "H3Render": "H3 Render (queued)", "H3Sweep": "H3 Sweep (overnight)", "H3SweepResults": "H3 Sweep Results"}
    for name, cls in nodes.NODE_CLASS_MAPPINGS.items():
        assert callable(getattr(cls(), cls.FUNCTION)), name
        assert len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES), name
        assert isinstance(cls.CATEGORY, str) and cls.CATEGORY
        req = cls.INPUT_TYPES()["required"]
        for field, widget in req.items():  # every widget is (TYPE, opts) or ([choices], opts)
            assert isinstance(widget, tuple) and len(widget) == 2 and isinstance(widget[1], dict), (name, field)
            assert isinstance(widget[0], (str, list)), (name, field)
            if isinstance(widget[0], list):
                assert widget[1]["default"] in widget[0], (name, field)
            elif widget[0] in ("INT", "FLOAT"):
                assert widget[1]["min"] <= widget[1]["default"] <= widget[1]["max"], (name, field)


def test_render_node_shape(nodes):
    cls = nodes.H3Render
    req = cls.INPUT_TYPES()["required"]
    assert list(req) == RENDER_FIELDS  # the order
    assert req["prompt"][0] == "STRING" and req["prompt"][1]["multiline"]
    assert req["seed"][0] == "INT" and req["seed"][1]["max"] == 2**63 - 1
    assert [req[k][0] for k in ("width", "height", "frames", "steps")] == ["INT"] * 4
    assert req["guidance"][0] == "FLOAT"
    assert "tiny-wan" in req["model"][0]  # the built-in model, with Redis down
    assert req["quant"][0][0] == "default" and {"f32", "f16"} <= set(req["quant"][0])
    # optional: a preview every n steps into the progress display (old workflows without it keep working)
    (kind, opts), = cls.INPUT_TYPES()["optional"].values()
    assert list(cls.INPUT_TYPES()["optional"]) == ["preview_every"] and kind == "INT"
    assert (opts["min"], opts["default"], opts["max"]) == (0, 1, 1000)
    # outside a ComfyUI with VideoFromFile the video is the mp4 path
    assert cls.RETURN_TYPES == ("IMAGE", "STRING", "STRING")
    assert cls.RETURN_NAMES == ("frames", "video", "job_id")
    assert not getattr(cls, "OUTPUT_NODE", False) and not hasattr(cls, "IS_CHANGED")


def test_video_return_type_follows_comfy():
    assert spec.render_return_types(True) == ("IMAGE", "VIDEO", "STRING")
    assert spec.render_return_types(False) == ("IMAGE", "STRING", "STRING")


def test_sweep_node_shape_and_is_changed(nodes):
    cls = nodes.H3Sweep
    req = cls.INPUT_TYPES()["required"]
    assert list(req) == ["prompts", "negative_prompts", "seed", "width", "height", "frames", "steps", "guidance",
                         "quant", "model", "preview"]
    assert all(req[k][0] == "STRING" for k in ("seed", "width", "height", "frames", "steps", "guidance", "quant"))
    assert req["preview"][0] == "BOOLEAN"
    assert cls.OUTPUT_NODE is True
    assert cls.RETURN_TYPES == ("STRING", "INT", "FLOAT", "STRING")
    assert cls.RETURN_NAMES == ("sweep_id", "jobs", "estimate_s", "dashboard_url")
    # deliberate: the same graph queued twice enqueues twice (ComfyUI re-runs a node
    # whose IS_CHANGED differs from the last run)
    a, b = cls.IS_CHANGED(prompts="x", seed="1-2"), cls.IS_CHANGED(prompts="x", seed="1-2")
    assert a != b


def test_results_node_shape(nodes):
    cls = nodes.H3SweepResults
    req = cls.INPUT_TYPES()["required"]
    assert list(req) == ["sweep_id", "wait", "timeout", "job_index", "columns", "tile_size"]
    assert cls.RETURN_TYPES == ("IMAGE", "IMAGE", "STRING")
    assert cls.RETURN_NAMES == ("contact_sheet", "frames", "summary")
    # no sweep id (linked input, unknown until run) or Redis down: run the node
    assert cls.IS_CHANGED(sweep_id="", wait=False) != cls.IS_CHANGED(sweep_id="", wait=False)


def test_render_node_fails_fast_when_redis_is_down(nodes, fake_comfy):
    import time

    from h3render.comfy_bridge.errors import RedisDownError

    t0 = time.monotonic()
    with pytest.raises(RedisDownError) as e:
        nodes.H3Render().render("a fox", "", 1, 64, 64, 17, 2, -1.0, "default", "tiny-wan", 600)
    assert time.monotonic() - t0 < 10  # a refused connection, not the 600 s timeout
    assert "h3render worker" in str(e.value) and "H3RENDER_REDIS_URL" in str(e.value)


def test_embedded_redis_not_running_is_reported(monkeypatch, tmp_path):
    from h3render.comfy_bridge.client import Bridge
    from h3render.comfy_bridge.errors import RedisDownError
    from h3render.settings import Settings
    from redis_fixture import free_port

    monkeypatch.delenv("H3RENDER_REDIS_URL", raising=False)
    settings = Settings(redis_url=None, home=tmp_path, redis_port=free_port())
    with pytest.raises(RedisDownError, match="not running"):
        Bridge.connect(settings)
    assert not (tmp_path / "redis").exists()  # connecting never starts a server


# ---------------------------------------------------------------- widget values -> payloads


def test_render_payload_defaults_are_omitted():
    p = inputs.render_payload(prompt="a fox", negative_prompt="  ", seed=7, width=0, height=64, frames=0,
                              steps=3, guidance=-1.0, quant="default", model="tiny-wan")
    assert p == {"prompt": "a fox", "model": "tiny-wan", "seed": 7, "height": 64, "steps": 3}
    p = inputs.render_payload(prompt="a fox", negative_prompt="blur", seed=0, width=32, height=48, frames=5,
                              steps=1, guidance=0.0, quant="f16", model="m")
    assert p == {"prompt": "a fox", "model": "m", "seed": 0, "negative_prompt": "blur", "width": 32,
                 "height": 48, "frames": 5, "steps": 1, "guidance": 0.0, "quant": "f16"}
    p = inputs.render_payload(prompt="a fox", negative_prompt="", seed=0, width=0, height=0, frames=0,
                              steps=0, guidance=-1.0, quant="default", model="m", preview_every=2)
    assert p == {"prompt": "a fox", "model": "m", "seed": 0, "preview_every": 2}  # 0 (none) is omitted


def test_sweep_grid_from_text():
    fixed, axes = inputs.sweep_grid(model="tiny-wan", quant="f32, f16", prompts="a fox\n\n  a lighthouse, at dusk \n",
                                    negative_prompts="", seed="1-8", width="64", height="", frames="",
                                    steps="2,3", guidance="4.5, 5.5")
    assert fixed == {"model": "tiny-wan", "width": 64}
    assert axes == {"prompt": ["a fox", "a lighthouse, at dusk"], "quant": ["f32", "f16"], "seed": list(range(1, 9)),
                    "steps": [2, 3], "guidance": [4.5, 5.5]}


@pytest.mark.parametrize("field,text", [("seed", "1-x"), ("steps", "8-2"), ("guidance", "4.5,,5")])
def test_sweep_grid_bad_axis_names_the_field(field, text):
    kw = dict(model="tiny-wan", quant="", prompts="p", negative_prompts="", seed="1", width="", height="",
              frames="", steps="", guidance="")
    kw[field] = text
    with pytest.raises(JobValidationError) as e:
        inputs.sweep_grid(**kw)
    assert e.value.problems[0].field == field


def test_sweep_grid_needs_a_prompt():
    with pytest.raises(JobValidationError, match="prompts"):
        inputs.sweep_grid(model="m", quant="", prompts=" \n ", negative_prompts="", seed="1", width="",
                          height="", frames="", steps="", guidance="")


def test_merge_choices():
    models, quants = inputs.merge_choices(
        {"wan-1.3b": {"quant_levels": ["q8_0", "q4_0"]}, "broken": None},
        [("tiny-wan", ["f32", "f16"]), ("wan-1.3b", ["f16"])])
    assert models == ["wan-1.3b", "broken", "tiny-wan", DEFAULT_MODEL]
    assert quants == ["default", "q8_0", "q4_0", "f32", "f16"]
    assert inputs.merge_choices({}, []) == ([DEFAULT_MODEL], ["default"])


# ---------------------------------------------------------------- contact sheet


def test_contact_sheet_grid_places_each_poster():
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255)]
    tiles = [sheet.Tile([f"seed={i % 3}", f"steps={i // 3}"], np.full((40, 60, 3), c, np.uint8))
             for i, c in enumerate(colours)]
    tiles[4] = sheet.Tile(["seed=1", "steps=1"], None, ["failed", "boom"])
    img = sheet.contact_sheet(tiles, axis_sizes=[2, 3], title="s-1")
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    # columns = size of the last axis (3): two rows of three cells
    lh = sheet._line_height(sheet._font())
    cell_w = max(60, sheet.MIN_CELL_W) + 2 * sheet.PAD
    cell_h = 40 + 2 * lh + 2 * sheet.PAD
    top = lh + sheet.PAD
    assert img.shape[:2] == (top + 2 * cell_h, 3 * cell_w)
    for i, c in enumerate(colours):
        x = (i % 3) * cell_w + sheet.PAD + (cell_w - 2 * sheet.PAD) // 2  # centre of the poster
        y = top + (i // 3) * cell_h + sheet.PAD + 20
        want = sheet.MISSING if i == 4 else c
        assert tuple(img[y, x]) == want, (i, tuple(img[y, x]))
    # the label rows under the posters hold text (not just background)
    label_band = img[top + sheet.PAD + 40: top + cell_h, :cell_w]
    assert (label_band != sheet.BACKGROUND).any()


def test_contact_sheet_scales_large_posters_and_labels():
    tiles = [sheet.Tile(["prompt=" + "x" * 200], np.zeros((512, 1024, 3), np.uint8))]
    img = sheet.contact_sheet(tiles, max_side=128)
    assert img.shape[1] == 128 + 2 * sheet.PAD
    assert sheet.axis_labels({"prompt": "y" * 100, "seed": 3}, ["prompt", "seed"], 20) == ["prompt=" + "y" * 10 + "...",
                                                                                           "seed=3"]
    assert sheet.auto_columns(10, [5, 2]) == 2 and sheet.auto_columns(10, [40]) == 4 and sheet.auto_columns(0, []) == 1
    with pytest.raises(ValueError, match="max_side"):
        sheet.contact_sheet(tiles, max_side=0)


# ---------------------------------------------------------------- install


def _cli(*args):
    from h3render.cli.comfyui import comfyui

    return CliRunner().invoke(comfyui, list(map(str, args)))


@pytest.fixture
def comfy_dir(tmp_path):
    d = tmp_path / "ComfyUI"
    (d / "comfy").mkdir(parents=True)
    (d / "custom_nodes").mkdir()
    (d / "main.py").write_text("# not really ComfyUI\n")
    return d


def test_install_writes_the_custom_node_package(comfy_dir):
    res = _cli("install", comfy_dir, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    init = comfy_dir / "custom_nodes" / "h3render" / "__init__.py"
    assert out == {"path": str(init.parent), "replaced": False, "python_check": None}
    text = init.read_text()
    assert "from h3render.comfy_bridge.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS" in text
    compile(text, str(init), "exec")
    # a second install rewrites its own file
    res = _cli("install", comfy_dir)
    assert res.exit_code == 0 and "rewrote" in res.output


def test_install_refuses_what_is_not_comfyui(tmp_path, comfy_dir):
    res = _cli("install", tmp_path / "nope")
    assert res.exit_code == 2 and "no such directory" in res.output
    res = _cli("install", tmp_path)
    assert res.exit_code == 2 and "not a ComfyUI folder" in res.output
    foreign = comfy_dir / "custom_nodes" / "h3render"
    foreign.mkdir()
    (foreign / "__init__.py").write_text("# someone else's\n")
    res = _cli("install", comfy_dir)
    assert res.exit_code == 2 and "not written by h3render" in res.output
    assert (foreign / "__init__.py").read_text() == "# someone else's\n"
    assert _cli("install", comfy_dir, "--force").exit_code == 0


def test_install_checks_comfyuis_python(comfy_dir):
    res = _cli("install", comfy_dir, "--python", sys.executable, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["python_check"].startswith("ok ")
    res = _cli("install", comfy_dir, "--python", "/nonexistent/python")
    assert res.exit_code == 1 and "cannot" in res.output


def test_installed_shim_loads_the_nodes_or_says_what_to_install(comfy_dir, monkeypatch, fake_comfy):
    assert _cli("install", comfy_dir).exit_code == 0
    init = comfy_dir / "custom_nodes" / "h3render" / "__init__.py"
    # as ComfyUI loads it: a module from the file, with the nodes importable
    for name, mod in fake_comfy.modules().items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "h3render.comfy_bridge.nodes", raising=False)
    ns: dict = {"__name__": "custom_nodes.h3render"}
    exec(compile(init.read_text(), str(init), "exec"), ns)
    assert set(ns["NODE_CLASS_MAPPINGS"]) == {"H3Render", "H3Sweep", "H3SweepResults"}
    monkeypatch.delitem(sys.modules, "h3render.comfy_bridge.nodes", raising=False)
    # a ComfyUI Python without h3render: the error says which Python and what to run
    code = ("import sys; sys.modules['h3render'] = None; "
            f"exec(compile(open({str(init)!r}).read(), 'shim', 'exec'), {{'__name__': 'x'}})")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "h3render is not installed in the Python that runs ComfyUI" in p.stderr
    assert "-m pip install h3render" in p.stderr


# ---------------------------------------------------------------- example workflows


EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "comfyui"


def _widget_names(inputs_spec: dict) -> list[str]:
    """Widget order in a UI workflow's widgets_values: each widget, plus ComfyUI's extra
    'control_after_generate' value after an INT that has one."""
    names = []
    for name, (kind, opts) in inputs_spec["required"].items():
        if kind in ("IMAGE", "VIDEO"):
            continue
        names.append(name)
        if opts.get("control_after_generate"):
            names.append("<control_after_generate>")
    return names


@pytest.mark.parametrize("name", ["render", "sweep"])
def test_example_ui_and_api_workflows_agree(nodes, name):
    """The UI-format example is the API-format one as the editor saves it: same nodes, same
    links, and widget values in INPUT_TYPES order equal to the API inputs."""
    api = json.loads((EXAMPLES / f"{name}_api.json").read_text())
    ui = json.loads((EXAMPLES / f"{name}_ui.json").read_text())
    links = {l[0]: l for l in ui["links"]}
    assert {str(n["id"]): n["type"] for n in ui["nodes"]} == {k: v["class_type"] for k, v in api.items()}
    for n in ui["nodes"]:
        node_api = api[str(n["id"])]["inputs"]
        for inp in n["inputs"]:  # links: [id, from node, from slot, to node, to slot, type]
            link = links[inp["link"]]
            assert node_api[inp["name"]] == [str(link[1]), link[2]] and link[3] == n["id"], (n["type"], inp)
        cls = nodes.NODE_CLASS_MAPPINGS.get(n["type"])
        if cls is None:  # ComfyUI's own nodes: check the widget values we rely on
            assert n["type"] in ("PreviewImage", "SaveVideo")
            if n["type"] == "SaveVideo":
                assert n["widgets_values"] == [node_api["filename_prefix"], node_api["format"], node_api["codec"]]
            continue
        names = _widget_names(cls.INPUT_TYPES())
        assert len(names) == len(n["widgets_values"]), n["type"]
        spec_inputs = cls.INPUT_TYPES()["required"]
        for wname, value in zip(names, n["widgets_values"]):
            if wname.startswith("<"):
                assert value in ("fixed", "increment", "decrement", "randomize")
            elif isinstance(node_api[wname], list):  # linked in the API format: widget keeps a default
                assert value == spec_inputs[wname][1]["default"], wname
            else:
                assert node_api[wname] == value, (n["type"], wname)
        assert set(node_api) == set(spec_inputs), n["type"]  # every input given, none unknown
