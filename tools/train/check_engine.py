"""Render the same prompt with diffusers' WanPipeline and with the C engine; compare.

For a trained demo pipeline (diffusers layout): converts it (f32, f16), renders
a few prompts from identical initial latents with both, and prints the largest
frame difference in 8-bit levels and the latents' relative error. Run with the
reference environment (torch, diffusers) and the engine library built:

  H3RENDER_LIB=<build>/libh3render.so python tools/train/check_engine.py h3render/data/shapes-wan
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROMPTS = ["a red circle moving left slowly over a black background",
           "gray backdrop, a quickly gliding azure box heading up"]


def main() -> None:
    import json

    import torch
    from diffusers import WanPipeline

    from h3render.engine.binding import Engine, GenerateRequest
    from h3render.engine.convert import convert_pipeline
    from h3render.engine.tokenize import load_tokenizer

    src = Path(sys.argv[1])
    d = json.loads((src / "h3render.json").read_text())
    pipe = WanPipeline.from_pretrained(src)
    pipe.set_progress_bar_config(disable=True)
    W, H, F, steps, g = d["width"], d["height"], d["frames"], d["steps"], d["guidance"]
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "m"
        convert_pipeline(src, dst, quants=["f32", "f16"])
        with Engine(dst, 2) as eng:
            tok = load_tokenizer(dst, int(eng.info()["text_len"]))
            for k, prompt in enumerate(PROMPTS):
                shape = eng.latent_shape(W, H, F)
                init = torch.randn((1, *shape), generator=torch.Generator().manual_seed(k))
                with torch.no_grad():
                    ref = pipe(prompt=prompt, negative_prompt=d["negative_prompt"], height=H, width=W,
                               num_frames=F, num_inference_steps=steps, guidance_scale=g,
                               max_sequence_length=d["text_len"], latents=init.clone(),
                               output_type="np").frames[0]
                ref8 = np.round(np.clip(ref, 0, 1) * 255).astype(np.int32)
                for quant in ("f32", "f16"):
                    frames: list[np.ndarray] = []
                    req = GenerateRequest(
                        width=W, height=H, frames=F, steps=steps, guidance=g, shift=d["shift"],
                        sampler=d["sampler"], quant=quant, prompt=prompt,
                        negative_prompt=d["negative_prompt"], prompt_ids=tok.encode(prompt).tolist(),
                        negative_ids=tok.encode(d["negative_prompt"]).tolist(),
                        init_latents=init[0].numpy(),
                    )  # fmt: skip
                    eng.generate(req, on_frame=lambda kind, i, rgb: frames.append(rgb) if kind == 0 else None)
                    got = np.stack(frames).astype(np.int32)
                    diff = np.abs(got - ref8)
                    print(f"{prompt!r} {quant}: frames {got.shape}, max |engine - diffusers| "
                          f"{diff.max()} levels, mean {diff.mean():.3f}")


if __name__ == "__main__":
    main()
