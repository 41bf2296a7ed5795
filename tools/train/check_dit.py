"""Where a trained demo DiT fails: one-step denoising vs sampling from pure noise.

For held-out prompts, (1) noises the clips' latents to s and decodes the DiT's
x0 estimate x_t - s v; (2) samples from pure noise with a plain Euler loop (shift
3, with and without guidance). Both are scored by the analytic detector. Good
x0 estimates with poor samples point at the high-noise regime (layout), not at
the VAE or the engine.

  python tools/train/check_dit.py <pipeline dir> [n]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    from diffusers import WanPipeline

    import train_demo as T
    from h3render import demo_data as dd
    from h3render.engine import eval_demo as ev

    pipe = WanPipeline.from_pretrained(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    vae, dit, te, tok = pipe.vae, pipe.transformer, pipe.text_encoder, pipe.tokenizer
    specs = dd.heldout_specs(n)
    x = torch.from_numpy(np.stack([dd.render_clip(s) for s in specs]).transpose(0, 4, 1, 2, 3).copy()) * 2 - 1
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    gen = torch.Generator().manual_seed(0)

    def score(z, label):
        y = vae.decode(z * std + mean).sample
        rec = ((y.clamp(-1, 1) + 1) / 2).numpy().transpose(0, 2, 3, 4, 1)
        rep, _ = ev.evaluate_clips(specs, [(np.clip(r, 0, 1) * 255 + 0.5).astype(np.uint8) for r in rec], label)
        print(f"{label:28s} {rep.accuracy} consistency {rep.consistency:.2f}", flush=True)

    with torch.no_grad():
        z = (vae.encode(x).latent_dist.mode() - mean) / std
        ctx = T.encode_text(tok, te, [s.caption for s in specs])
        unc = T.encode_text(tok, te, [""] * n)
        for s in (0.3, 0.6, 0.8, 0.95):
            xt = (1 - s) * z + s * torch.randn(z.shape, generator=gen)
            v = dit(hidden_states=xt, timestep=torch.full((n,), s * 1000.0), encoder_hidden_states=ctx,
                    return_dict=False)[0]
            score(xt - s * v, f"x0 estimate at s={s}")
        for g in (1.0, 4.0):
            xs = torch.randn(z.shape, generator=gen)
            u = torch.linspace(1, 0, 21)
            sig = T.FLOW_SHIFT * u / (1 + (T.FLOW_SHIFT - 1) * u)
            for i in range(20):
                t = torch.full((n,), float(sig[i]) * 1000)
                v = dit(hidden_states=xs, timestep=t, encoder_hidden_states=ctx, return_dict=False)[0]
                if g != 1.0:
                    vu = dit(hidden_states=xs, timestep=t, encoder_hidden_states=unc, return_dict=False)[0]
                    v = vu + g * (v - vu)
                xs = xs + (sig[i + 1] - sig[i]) * v
            score(xs, f"euler 20 steps, guidance {g}")


if __name__ == "__main__":
    main()
