"""The nodes' contracts with ComfyUI: INPUT_TYPES, RETURN_TYPES and names. Plain data.

nodes.py builds its classes from these, and tests check them without ComfyUI.
Widget specs follow ComfyUI's classic API: ("INT", {"default", "min", "max", ...}),
a list of strings for a dropdown, ("STRING", {"multiline": True}) for text.
"""

from __future__ import annotations

from typing import Any

from h3render.engine.limits import MAX_FRAMES, MAX_SIDE
from h3render.queue.job import MAX_PROMPT_CHARS, SEED_MAX

CATEGORY = "h3render"
MAX_TIMEOUT_S = 7 * 24 * 3600
DEFAULT_PREVIEW_EVERY = 1  # H3 Render shows a preview after every denoising step unless told otherwise

DISPLAY_NAMES = {
    "H3Render": "H3 Render (queued)",
    "H3Sweep": "H3 Sweep (overnight)",
    "H3SweepResults": "H3 Sweep Results",
}

RENDER_RETURN_NAMES = ("frames", "video", "job_id")
SWEEP_RETURN_TYPES = ("STRING", "INT", "FLOAT", "STRING")
SWEEP_RETURN_NAMES = ("sweep_id", "jobs", "estimate_s", "dashboard_url")
RESULTS_RETURN_TYPES = ("IMAGE", "IMAGE", "STRING")
RESULTS_RETURN_NAMES = ("contact_sheet", "frames", "summary")


def render_return_types(has_video_type: bool) -> tuple[str, str, str]:
    """IMAGE frames, the video (ComfyUI's VIDEO when it has VideoFromFile, else the mp4
    path as STRING), the job id."""
    return ("IMAGE", "VIDEO" if has_video_type else "STRING", "STRING")


def _dropdown(options: list[str], tooltip: str) -> tuple[list[str], dict[str, Any]]:
    return (list(options), {"default": options[0], "tooltip": tooltip})


def _model_dropdown(models: list[str]) -> tuple[list[str], dict[str, Any]]:
    return _dropdown(models, "a model a worker published (or installed on this machine)")


def _text(default: str, tooltip: str, multiline: bool = False) -> tuple[str, dict[str, Any]]:
    return ("STRING", {"default": default, "multiline": multiline, "tooltip": tooltip})


def render_inputs(models: list[str], quants: list[str]) -> dict[str, Any]:
    """INPUT_TYPES of H3 Render: the job's fields in the issue's order, then the timeout.

    0 (sizes, steps) or a negative guidance means the model's default.
    """
    return {"required": {
        "prompt": ("STRING", {"default": "a red fox running through fresh snow", "multiline": True,
                              "tooltip": f"what to render (1-{MAX_PROMPT_CHARS} characters)"}),
        "negative_prompt": _text("", "what to avoid; empty: the model's default negative prompt", True),
        "seed": ("INT", {"default": 0, "min": 0, "max": SEED_MAX, "control_after_generate": True,
                         "tooltip": "noise seed; the same inputs render the same video"}),
        "width": ("INT", {"default": 0, "min": 0, "max": MAX_SIDE, "step": 16,
                          "tooltip": "pixels; 0: the model's default"}),
        "height": ("INT", {"default": 0, "min": 0, "max": MAX_SIDE, "step": 16,
                           "tooltip": "pixels; 0: the model's default"}),
        "frames": ("INT", {"default": 0, "min": 0, "max": MAX_FRAMES,
                           "tooltip": "frame count (Wan: 4k+1); 0: the model's default"}),
        "steps": ("INT", {"default": 0, "min": 0, "max": 1000,
                          "tooltip": "sampler steps; 0: the model's default"}),
        "guidance": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 50.0, "step": 0.1, "round": 0.01,
                               "tooltip": "classifier-free guidance; negative: the model's default"}),
        "quant": _dropdown(quants, "weight quant level; default: the model's"),
        "model": _model_dropdown(models),
        "timeout": ("INT", {"default": 3600, "min": 1, "max": MAX_TIMEOUT_S,
                            "tooltip": "seconds to wait for the job; then it is canceled and the node fails"}),
    }, "optional": {
        "preview_every": ("INT", {"default": DEFAULT_PREVIEW_EVERY, "min": 0, "max": 1000,
                                  "tooltip": "show a preview frame every n denoising steps in the progress "
                                             "display; 0: none. Each costs a one-frame VAE decode (h3.c: "
                                             "its preview VAE, about 10 GiB more memory)"}),
    }}


def sweep_inputs(models: list[str]) -> dict[str, Any]:
    """INPUT_TYPES of H3 Sweep: axes as text; one value is fixed, several make an axis."""
    axis = "a value, a list like 20,30 or a range like 1-8 / 1-9:2; empty: the model's default"
    return {"required": {
        "prompts": _text("a red fox running through fresh snow", "one prompt per line; several lines make an axis",
                         True),
        "negative_prompts": _text("", "one per line; empty: the model's default", True),
        "seed": _text("1-4", "seeds: " + axis.replace("; empty: the model's default", "")),
        "width": _text("", axis),
        "height": _text("", axis),
        "frames": _text("", axis),
        "steps": _text("", axis),
        "guidance": _text("", "e.g. 4.5, 5.5; empty: the model's default"),
        "quant": _text("", "e.g. q8_0, q4_0; empty: the model's default"),
        "model": _model_dropdown(models),
        "preview": ("BOOLEAN", {"default": False,
                                "tooltip": "render every combination small and short first, then the full versions"}),
    }}


def results_inputs() -> dict[str, Any]:
    """INPUT_TYPES of H3 Sweep Results."""
    return {"required": {
        "sweep_id": _text("", "the id H3 Sweep returned (s-...)"),
        "wait": ("BOOLEAN", {"default": False, "tooltip": "wait until every job of the sweep has ended"}),
        "timeout": ("INT", {"default": 3600, "min": 1, "max": MAX_TIMEOUT_S,
                            "tooltip": "seconds to wait when wait is on; then show what is there"}),
        "job_index": ("INT", {"default": 0, "min": 0, "max": 100_000,
                              "tooltip": "which job's frames to output (0 = first, in sweep order)"}),
        "columns": ("INT", {"default": 0, "min": 0, "max": 64,
                            "tooltip": "contact sheet columns; 0: one per value of the last axis"}),
        "tile_size": ("INT", {"default": 256, "min": 32, "max": 2048,
                              "tooltip": "longest side of one poster on the sheet, in pixels"}),
    }}
