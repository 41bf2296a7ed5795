"""The ComfyUI nodes (classic API). The only module of h3render that imports ComfyUI or torch.

    H3Render        enqueue one job, wait for it; IMAGE frames, VIDEO (or the mp4 path), job id;
                    the job's preview frames appear in the node's progress display
    H3Sweep         enqueue a sweep and return at once (output node; runs on every queueing)
    H3SweepResults  contact sheet of a sweep, one job's frames, a summary

The work is done by h3render.comfy_bridge.client; this module only turns widget
values into calls, passes ComfyUI's progress bar and interrupt check in as hooks,
and converts numpy arrays to torch tensors.

Caching (ComfyUI re-runs a node only when its inputs or IS_CHANGED change):
  - H3Render has no IS_CHANGED: a render is a pure function of its inputs, so the
    same graph queued twice renders once (change the seed to render again).
  - H3Sweep's IS_CHANGED is a fresh value each time: queueing the same graph twice
    enqueues the sweep twice, deliberately. The node is an action; mute or bypass it
    to keep it from firing.
  - H3SweepResults' IS_CHANGED is the states of the sweep's jobs: it re-runs as the
    sweep progresses and is cached once nothing changes.
"""

from __future__ import annotations

import uuid

import comfy.model_management
import comfy.utils
import numpy as np
import torch

from h3render.comfy_bridge import client, inputs, spec
from h3render.queue.errors import JobValidationError

try:  # ComfyUI's VIDEO type, where this ComfyUI has it
    from comfy_api.input_impl import VideoFromFile
except ImportError:
    try:
        from comfy_api.latest import InputImpl

        VideoFromFile = InputImpl.VideoFromFile
    except (ImportError, AttributeError):
        VideoFromFile = None


try:  # the size ComfyUI scales previews to (its --preview-size), as its latent previews do
    from comfy.cli_args import args as _comfy_args

    PREVIEW_MAX_SIZE = int(getattr(_comfy_args, "preview_size", 512))
except ImportError:
    PREVIEW_MAX_SIZE = 512


def _hooks() -> client.Hooks:
    bar = {"pbar": None}

    def progress(done: int, total: int, preview=None) -> None:
        if bar["pbar"] is None:
            bar["pbar"] = comfy.utils.ProgressBar(total)
        # ComfyUI's preview tuple (comfy_execution.progress.PreviewImageTuple): (format, PIL image, max size)
        bar["pbar"].update_absolute(done, total, ("PNG", preview, PREVIEW_MAX_SIZE) if preview is not None else None)

    return client.Hooks(progress=progress,
                        check_interrupt=comfy.model_management.throw_exception_if_processing_interrupted)


def _image(frames: np.ndarray) -> torch.Tensor:
    """(F, H, W, 3) float32 in 0..1, as ComfyUI's IMAGE."""
    return torch.from_numpy(np.ascontiguousarray(frames, dtype=np.float32))


class H3Render:
    """Hand a render to the h3render queue and wait for its frames."""

    CATEGORY = spec.CATEGORY
    FUNCTION = "render"
    RETURN_TYPES = spec.render_return_types(VideoFromFile is not None)
    RETURN_NAMES = spec.RENDER_RETURN_NAMES
    DESCRIPTION = ("Renders on an h3render worker (its own process, outside ComfyUI) and waits for the video. "
                   "Cancel stops the job within one engine step.")

    @classmethod
    def INPUT_TYPES(cls):
        return spec.render_inputs(*client.node_choices())

    def render(self, prompt, negative_prompt, seed, width, height, frames, steps, guidance, quant, model, timeout,
               preview_every=spec.DEFAULT_PREVIEW_EVERY):
        payload = inputs.render_payload(prompt=prompt, negative_prompt=negative_prompt, seed=seed, width=width,
                                        height=height, frames=frames, steps=steps, guidance=guidance,
                                        quant=quant, model=model, preview_every=preview_every)
        bridge = client.Bridge.connect()
        result = bridge.render(payload, float(timeout), _hooks())
        video = VideoFromFile(str(result.video)) if VideoFromFile is not None else str(result.video)
        return (_image(result.frames), video, result.job_id)


class H3Sweep:
    """Enqueue an overnight sweep without blocking ComfyUI."""

    CATEGORY = spec.CATEGORY
    FUNCTION = "sweep"
    OUTPUT_NODE = True
    RETURN_TYPES = spec.SWEEP_RETURN_TYPES
    RETURN_NAMES = spec.SWEEP_RETURN_NAMES
    DESCRIPTION = ("Enqueues every combination of the axes and returns at once. Every queueing of the graph "
                   "enqueues a new sweep.")

    @classmethod
    def INPUT_TYPES(cls):
        models, _ = client.node_choices()
        return spec.sweep_inputs(models)

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return uuid.uuid4().hex  # never equal: each queueing enqueues (see the module doc)

    def sweep(self, prompts, negative_prompts, seed, width, height, frames, steps, guidance, quant, model, preview):
        try:
            fixed, axes = inputs.sweep_grid(model=model, quant=quant, prompts=prompts,
                                            negative_prompts=negative_prompts, seed=seed, width=width,
                                            height=height, frames=frames, steps=steps, guidance=guidance)
        except JobValidationError as e:
            raise client.as_input_error(e) from None
        started = client.Bridge.connect().start_sweep(fixed, axes, bool(preview))
        return {"ui": {"text": [started.summary()]},
                "result": (started.sweep_id, started.jobs, float(started.estimate_s), started.dashboard_url)}


class H3SweepResults:
    """Bring a sweep back into the graph: a labelled contact sheet, one job's frames, a summary."""

    CATEGORY = spec.CATEGORY
    FUNCTION = "results"
    RETURN_TYPES = spec.RESULTS_RETURN_TYPES
    RETURN_NAMES = spec.RESULTS_RETURN_NAMES
    DESCRIPTION = "Contact sheet of a sweep's posters labelled with the axis values; waits for the sweep if asked."

    @classmethod
    def INPUT_TYPES(cls):
        return spec.results_inputs()

    @classmethod
    def IS_CHANGED(cls, sweep_id=None, wait=False, **kwargs):
        if not sweep_id:
            return uuid.uuid4().hex  # linked from H3Sweep: the id is known only when it runs
        try:
            return f"{bool(wait)}:" + client.Bridge.connect().fingerprint(sweep_id.strip())
        except Exception:  # noqa: BLE001 - let the node run and show the real error
            return uuid.uuid4().hex

    def results(self, sweep_id, wait, timeout, job_index, columns, tile_size):
        bridge = client.Bridge.connect()
        view = bridge.sweep_results(sweep_id.strip(), bool(wait), float(timeout), _hooks())
        sheet = client.sweep_sheet(view, int(columns), int(tile_size))
        frames = client.job_frames(view, int(job_index))
        return (_image(sheet[None].astype(np.float32) / np.float32(255.0)), _image(frames), view.text())


NODE_CLASS_MAPPINGS = {"H3Render": H3Render, "H3Sweep": H3Sweep, "H3SweepResults": H3SweepResults}
NODE_DISPLAY_NAME_MAPPINGS = dict(spec.DISPLAY_NAMES)
