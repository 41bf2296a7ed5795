"""How well the demo VAE reconstructs held-out clips, measured by the analytic detector.

The detector's accuracy on VAE reconstructions bounds what the whole model can
reach. Prints accuracy per attribute and the mean absolute error, and writes a
contact sheet (original row, then reconstruction row) when given a path.

  python tools/train/check_vae.py <pipeline dir or its vae/ dir> [n] [sheet.png]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch
    from diffusers import AutoencoderKLWan

    from h3render import demo_data as dd
    from h3render.engine import eval_demo as ev

    src = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 48
    vae = AutoencoderKLWan.from_pretrained(src / "vae" if (src / "vae").is_dir() else src).eval()
    specs = dd.heldout_specs(n)
    clips = [dd.render_clip(s) for s in specs]
    x = torch.from_numpy(np.stack(clips).transpose(0, 4, 1, 2, 3).copy()) * 2 - 1
    with torch.no_grad():
        y = torch.cat([vae.decode(vae.encode(x[i:i + 8]).latent_dist.mode()).sample
                       for i in range(0, n, 8)])
    rec = ((y.clamp(-1, 1) + 1) / 2).numpy().transpose(0, 2, 3, 4, 1)
    u8 = [(np.clip(r, 0, 1) * 255 + 0.5).astype(np.uint8) for r in rec]
    rep, marks = ev.evaluate_clips(specs, u8, "vae")
    print(f"vae reconstructions of {n} held-out clips: accuracy {rep.accuracy}, "
          f"consistency {rep.consistency:.3f}, mean |err| {np.abs(rec - np.stack(clips)).mean():.4f}")
    for f in rep.failures[:10]:
        print("  ", f)
    if len(sys.argv) > 3:
        rows = []
        for c, r in zip(clips[:16], u8[:16]):
            rows += [(c * 255 + 0.5).astype(np.uint8), r]
        ev.write_png(Path(sys.argv[3]), ev.contact_sheet(rows, scale=3))


if __name__ == "__main__":
    main()
