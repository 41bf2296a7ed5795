"""Train the demo model ("shapes-wan"): a tiny Wan 2.1 pipeline on procedural clips.

Needs torch, diffusers and transformers (the optional training extra; never
needed at run time). Everything is seeded, and step counts (not wall time) set
the budget, so a rerun reproduces the same losses up to floating point
non-associativity of the CPU kernels.

Stages
  1. tokenizer     WordLevel over the caption vocabulary of h3render.demo_data
                   (T5 style: lowercase, split on whitespace/punctuation, append </s>)
  2. vae           AutoencoderKLWan (Wan 2.1 classes) trained as a deterministic
                   autoencoder on clips: L1 + MSE reconstruction, a small L2 on the
                   latent, and noise added to the latent the decoder sees so it
                   tolerates imperfect samples. latents_mean / latents_std are then
                   measured on fresh clips and stored in the VAE config.
  3. dit + text    WanTransformer3DModel and UMT5EncoderModel trained jointly with
                   rectified flow (x_t = (1 - s) x0 + s eps, target eps - x0, timestep
                   1000 s, s drawn with the sampler's shift) on normalised latents
                   of clips encoded once; captions are redrawn (new synonyms and
                   templates) every time a clip is used, and 10% are dropped to ""
                   for classifier-free guidance.
  4. save          WanPipeline.save_pretrained (model_index.json, tokenizer/,
                   text_encoder/, transformer/, vae/, scheduler/) + h3render.json.

Run (about 55 minutes on 2 cores with the defaults):
  python tools/train/train_demo.py --out h3render/data/shapes-wan --log tools/train/shapes-wan.log
A smoke run: add --smoke (a few steps of each stage, output to --out).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from h3render import demo_data as dd  # noqa: E402

SEED = 1234
WIDTH = HEIGHT = 32
FRAMES = 9
TEXT_LEN = 24
FLOW_SHIFT = 3.0
Z_DIM = 4
DEFAULTS = dict(width=WIDTH, height=HEIGHT, frames=FRAMES, steps=20, guidance=4.0,
                shift=FLOW_SHIFT, sampler="unipc", negative_prompt="", fps=8, text_len=TEXT_LEN)

FG_WEIGHT = 10.0
SPECIAL = ["<pad>", "</s>", "<unk>"]


# ---- tokenizer -------------------------------------------------------------------------


def vocabulary() -> list[str]:
    """Every word a caption can contain (plus a few plain extras), specials first."""
    words: list[str] = []
    groups = [dd.COLOR_WORDS, dd.SHAPE_WORDS, dd.DIRECTION_WORDS, dd.SPEED_WORDS,
              dd.BACKGROUND_WORDS]
    pieces = ["a", "an", "and", "heading", "the", "of", "with", ",", ".", "!", "?"]
    pieces += list(dd.VERBS) + list(dd.SCENES) + list(dd.PREPOSITIONS)
    for g in groups:
        for syns in g.values():
            for s in syns:
                pieces += s.split()
    for w in pieces:
        if w not in words:
            words.append(w)
    return SPECIAL + words


def build_tokenizer():
    """The demo model's word-level tokenizer (the same builder as the test pipeline's)."""
    from h3render.engine.tokenize import word_level_tokenizer

    return word_level_tokenizer(vocabulary()[len(SPECIAL):])


# ---- models --------------------------------------------------------------------------------


def build_models():
    import torch
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(SEED)
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=Z_DIM, dim_mult=[1, 2], num_res_blocks=1,
        temperal_downsample=[False], scale_factor_spatial=2, scale_factor_temporal=1,
    )  # fmt: skip
    te_cfg = UMT5Config(
        vocab_size=len(vocabulary()), d_model=64, d_kv=16, num_heads=4, d_ff=128, num_layers=2,
        relative_attention_num_buckets=16, relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0,
        is_encoder_decoder=False, pad_token_id=0, eos_token_id=1,
    )
    text_encoder = UMT5EncoderModel(te_cfg)
    # One patch spans all FRAMES latent frames (the VAE keeps every frame), so a
    # token's patch embedding sees where the shape is at each frame: RoPE gives
    # attention only relative positions, and a DiT whose tokens are single frames
    # could not tell the first frame from the last in pure noise; at (1, 4, 4)
    # it drew static shapes (direction 8%, docs/DEMO_MODEL.md). The patch vector
    # (Z_DIM * FRAMES * 2 * 2 = 144) stays below the width (256): the flow target
    # carries the input's noise, which a narrower token cannot pass through.
    transformer = WanTransformer3DModel(
        patch_size=(FRAMES, 2, 2), num_attention_heads=8, attention_head_dim=32,
        in_channels=Z_DIM, out_channels=Z_DIM, text_dim=64, freq_dim=64, ffn_dim=512,
        num_layers=4, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
        rope_max_seq_len=1024,
    )  # fmt: skip
    return vae, text_encoder, transformer


# ---- data ------------------------------------------------------------------------------------


def clip_batch(specs, frames: int = FRAMES):
    """(B, 3, F, H, W) float tensor in [-1, 1] for a list of ClipSpecs."""
    import torch

    v = np.stack([dd.render_clip(s, WIDTH, HEIGHT, frames) for s in specs])  # (B, F, H, W, 3)
    return torch.from_numpy(v.transpose(0, 4, 1, 2, 3).copy()) * 2.0 - 1.0


class Log:
    """Loss log: one line per report, to stdout and a file."""

    def __init__(self, path: Path | None):
        self.f = open(path, "w") if path else None
        self.t0 = time.time()

    def __call__(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()


# ---- stage 2: VAE -----------------------------------------------------------------------------


def train_vae(vae, steps: int, batch: int, log: Log, frames: int) -> tuple[list[float], list[float]]:
    import torch

    gen = torch.Generator().manual_seed(SEED + 1)
    specs = dd.training_specs(SEED + 2, frames=FRAMES, two_shape_prob=0.3)
    opt = torch.optim.AdamW(vae.parameters(), lr=3e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / steps))))
    vae.train()
    run = 0.0
    for step in range(steps):
        # mostly short clips (first frame + one 4-frame chunk); every 4th step a whole
        # clip at half the batch, so the third chunk's causal caches are seen too
        long = step % 4 == 3
        x = clip_batch([next(specs) for _ in range(batch // 2 if long else batch)], FRAMES)
        x = x if long else x[:, :, :frames]
        z = vae.encode(x).latent_dist.mode()
        zn = z + 0.1 * z.detach().std() * torch.randn(z.shape, generator=gen)
        y = vae.decode(zn).sample
        # Shapes cover ~10% of the pixels: weight them FG_WEIGHT + 1 times, or the
        # VAE settles on a flat background for hundreds of steps.
        bg = x.flatten(2).median(dim=2).values[:, :, None, None, None]
        w = 1.0 + FG_WEIGHT * ((x - bg).abs().amax(dim=1, keepdim=True) > 0.1).float()
        rec = ((y - x).abs() * w).mean() / w.mean() + ((y - x) ** 2).mean()
        loss = rec + 1e-4 * (z ** 2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        sched.step()
        run = rec.item() if step == 0 else 0.9 * run + 0.1 * rec.item()
        if step % 10 == 0 or step == steps - 1:
            log(f"vae step {step:5d} rec {rec.item():.4f} (ema {run:.4f}) lr {sched.get_last_lr()[0]:.2e}")
    vae.eval()
    # latent statistics on fresh clips, per channel
    with torch.no_grad():
        zs = []
        for _ in range(4):
            x = clip_batch([next(specs) for _ in range(16)])
            zs.append(vae.encode(x).latent_dist.mode())
        z = torch.cat(zs)
        mean = z.mean(dim=(0, 2, 3, 4))
        std = z.std(dim=(0, 2, 3, 4))
    return [round(float(v), 5) for v in mean], [round(float(v), 5) for v in std]


# ---- stage 3: DiT + text encoder ----------------------------------------------------------------


def encode_text(tokenizer, text_encoder, captions: list[str]):
    """As WanPipeline._get_t5_prompt_embeds: encode, zero rows past each length, pad."""
    import torch

    enc = tokenizer(captions, padding="max_length", max_length=TEXT_LEN, truncation=True,
                    add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    ids, mask = enc.input_ids, enc.attention_mask
    h = text_encoder(ids, mask).last_hidden_state
    return h * mask[:, :, None].to(h.dtype)


def encode_dataset(vae, n: int, batch: int, log: Log, mean, std):
    """Encode n fresh clips once: normalised latents (n, C, T, Y, X) and their specs."""
    import torch

    specs_it = dd.training_specs(SEED + 3, frames=FRAMES, two_shape_prob=0.1)
    specs, lat = [], []
    m = torch.tensor(mean).view(1, -1, 1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        for i in range(0, n, batch):
            b = [next(specs_it) for _ in range(min(batch, n - i))]
            z = vae.encode(clip_batch(b)).latent_dist.mode()
            lat.append((z - m) / s)
            specs += b
            if (i // batch) % 20 == 0:
                log(f"encode {i + len(b)}/{n}")
    return torch.cat(lat), specs


def sample_sigmas(gen, n: int):
    """s = shift u / (1 + (shift - 1) u), u ~ U(0, 1): the sampler's shifted schedule."""
    import torch

    u = torch.rand(n, generator=gen)
    return FLOW_SHIFT * u / (1 + (FLOW_SHIFT - 1) * u)


def train_dit(transformer, text_encoder, tokenizer, latents, specs, steps: int, batch: int,
              log: Log, checkpoint=None, every: int = 0) -> None:
    import torch

    gen = torch.Generator().manual_seed(SEED + 4)
    rng = np.random.default_rng(SEED + 5)
    params = list(transformer.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, betas=(0.9, 0.99))
    warm = min(100, steps // 10 + 1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * i / steps))))
    transformer.train()
    text_encoder.train()
    n = latents.shape[0]
    run = 0.0
    for step in range(steps):
        idx = torch.randint(0, n, (batch,), generator=gen)
        x0 = latents[idx]
        caps = []
        for i in idx.tolist():
            sp = specs[i]
            c = dd.caption_for(rng, sp.background, sp.objects)
            while dd.is_heldout(c):
                c = dd.caption_for(rng, sp.background, sp.objects)
            caps.append("" if rng.random() < 0.1 else c)
        ctx = encode_text(tokenizer, text_encoder, caps)
        sig = sample_sigmas(gen, batch)
        eps = torch.randn(x0.shape, generator=gen)
        s5 = sig.view(-1, 1, 1, 1, 1)
        xt = (1 - s5) * x0 + s5 * eps
        pred = transformer(hidden_states=xt, timestep=sig * 1000, encoder_hidden_states=ctx,
                           return_dict=False)[0]
        loss = ((pred - (eps - x0)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        run = loss.item() if step == 0 else 0.98 * run + 0.02 * loss.item()
        if step % 25 == 0 or step == steps - 1:
            log(f"dit step {step:5d} loss {loss.item():.4f} (ema {run:.4f}) lr {sched.get_last_lr()[0]:.2e}")
        if every and checkpoint and (step + 1) % every == 0 and step + 1 < steps:
            transformer.eval()
            text_encoder.eval()
            checkpoint(step + 1)
            transformer.train()
            text_encoder.train()
            log(f"checkpoint at step {step + 1}")
    transformer.eval()
    text_encoder.eval()


# ---- stage 4: save --------------------------------------------------------------------------------


def save(out: Path, tokenizer, text_encoder, transformer, vae) -> None:
    from diffusers import UniPCMultistepScheduler, WanPipeline

    scheduler = UniPCMultistepScheduler(
        num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True,
        flow_shift=FLOW_SHIFT,
    )
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer,
                       vae=vae, scheduler=scheduler)
    if out.exists():
        shutil.rmtree(out)
    pipe.save_pretrained(out, safe_serialization=True)
    for f in sorted(out.rglob("*.json")):
        data = json.loads(f.read_text())
        f.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    (out / "h3render.json").write_text(json.dumps(DEFAULTS, indent=2, sort_keys=True) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log", type=Path, default=None)
    ap.add_argument("--vae-steps", type=int, default=1500)
    ap.add_argument("--vae-batch", type=int, default=8)
    ap.add_argument("--vae-frames", type=int, default=5, help="clip length the VAE trains on")
    ap.add_argument("--clips", type=int, default=8000, help="clips encoded for the DiT")
    ap.add_argument("--dit-steps", type=int, default=4000)
    ap.add_argument("--dit-batch", type=int, default=32)
    ap.add_argument("--vae-only", action="store_true",
                    help="stop after the VAE stage, saving it to OUT/vae (to iterate on later stages)")
    ap.add_argument("--vae-from", type=Path, default=None,
                    help="load the VAE saved by --vae-only instead of training it (same seeds)")
    ap.add_argument("--save-every", type=int, default=0,
                    help="also save the whole pipeline to OUT-step<N> every N DiT steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="a few steps of each stage")
    a = ap.parse_args()
    if a.smoke:
        a.vae_steps, a.clips, a.dit_steps = 3, 16, 3

    # Busy shared cores: spinning OpenMP workers made steps ~8x slower than passive waits.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    from transformers import PreTrainedTokenizerFast

    torch.set_num_threads(a.threads)
    torch.manual_seed(SEED)
    log = Log(a.log)
    shown = {k: (v.name if isinstance(v, Path) else v) for k, v in vars(a).items()}  # no machine paths
    log(f"args {shown} torch {torch.__version__}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(), pad_token="<pad>", eos_token="</s>",
        unk_token="<unk>", model_max_length=TEXT_LEN,
    )
    vae, text_encoder, transformer = build_models()
    for name, m in (("vae", vae), ("text_encoder", text_encoder), ("transformer", transformer)):
        log(f"{name}: {sum(p.numel() for p in m.parameters())} parameters")
    if a.vae_from:
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(a.vae_from).eval()
        mean, std = list(vae.config.latents_mean), list(vae.config.latents_std)
        log(f"vae loaded from {a.vae_from.name}")
    else:
        mean, std = train_vae(vae, a.vae_steps, a.vae_batch, log, a.vae_frames)
        vae.register_to_config(latents_mean=mean, latents_std=std)
    log(f"latents_mean {mean}")
    log(f"latents_std {std}")
    if a.vae_only:
        vae.save_pretrained(a.out / "vae", safe_serialization=True)
        log(f"vae saved to {a.out.name}/vae")
        return
    latents, specs = encode_dataset(vae, a.clips, 16, log, mean, std)
    log(f"latents {tuple(latents.shape)} std {latents.std().item():.3f}")
    def checkpoint(step: int) -> None:
        save(a.out.with_name(f"{a.out.name}-step{step}"), tokenizer, text_encoder, transformer, vae)

    train_dit(transformer, text_encoder, tokenizer, latents, specs, a.dit_steps, a.dit_batch, log,
              checkpoint, a.save_every)
    save(a.out, tokenizer, text_encoder, transformer, vae)
    size = sum(f.stat().st_size for f in a.out.rglob("*") if f.is_file())
    log(f"saved {a.out.name}: {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
