"""Bench helper, run with the reference Python (torch + diffusers): the medium DiT.

    python bench/torch_dit.py OUT_DIR THREADS REPEATS

Builds diffusers' WanTransformer3DModel from MEDIUM with seeded random weights,
saves it as OUT_DIR/transformer/{config.json, diffusion_pytorch_model.safetensors}
(the layout h3render's converter reads), saves the probe input as OUT_DIR/probe.npz,
times the fp32 forward on THREADS torch threads (one warm-up, then REPEATS) and
prints one JSON line: {"params", "tokens", "seconds": [...], "torch": version}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# ~34M parameters; latent (16, 4, 64, 64) with patch (1, 2, 2) -> 4*32*32 = 4096
# tokens would be slow for the 2-core reference machine, so (16, 4, 32, 32): 1024.
MEDIUM = {
    "attention_head_dim": 128, "num_attention_heads": 4, "num_layers": 8, "ffn_dim": 2048,
    "freq_dim": 256, "in_channels": 16, "out_channels": 16, "text_dim": 512,
    "patch_size": [1, 2, 2], "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6, "rope_max_seq_len": 1024,
}
LATENT = (16, 4, 32, 32)
TEXT_LEN = 128


def main(out: Path, threads: int, repeats: int) -> None:
    import numpy as np
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = WanTransformer3DModel(**MEDIUM).eval()
    with torch.no_grad():  # the default init leaves some layers at zero; make every weight matter
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    model.save_pretrained(out / "transformer", safe_serialization=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1,) + LATENT).astype(np.float32)
    ctx = rng.standard_normal((1, TEXT_LEN, MEDIUM["text_dim"])).astype(np.float32)
    t = np.array([500.0], np.float32)
    np.savez(out / "probe.npz", x=x[0], context=ctx[0], timestep=t)
    xt, ct, tt = torch.from_numpy(x), torch.from_numpy(ctx), torch.from_numpy(t)
    times = []
    with torch.inference_mode():
        ref = model(xt, tt, ct, return_dict=False)[0]
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(xt, tt, ct, return_dict=False)
            times.append(time.perf_counter() - t0)
    np.save(out / "torch_out.npy", ref[0].numpy())
    params = sum(p.numel() for p in model.parameters())
    tokens = LATENT[1] * (LATENT[2] // 2) * (LATENT[3] // 2)
    print(json.dumps({"params": params, "tokens": tokens, "seconds": times, "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
