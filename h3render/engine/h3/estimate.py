"""Peak unified memory of one h3.c render, for admission. Pure functions.

    total = DiT resident + activations + preview VAE + media + overhead

DiT resident   the FL2VA transformer's tensor bytes (from `models inspect` or
               the bridge's info "components") times dit_layers/50: h3.c keeps
               only the retained blocks. With ssd_streaming it keeps two blocks
               and streams the rest: about 2 GiB (README: 2.0 GiB at 512x512,
               2.1 GiB at 864x480), whatever dit_layers is. The int8 paths
               measured a lower peak (25.9 vs 36.4 GiB) but quantize from BF16
               blocks at load, so the estimate stays at BF16 size.
activations    DiT sequence length times ACTIVATION_BYTES_PER_TOKEN. Tokens:
               (W/32)*(H/32) per latent frame (VAE 16x, patch 2), and
               latent_t = 2 + 5*(frames-5)/17 latent frames.
preview VAE    about 10 GiB resident while previews are on (README, --show).
media          the decoded video as float32 and uint8 RGB (5 bytes per pixel
               per frame) while frames are delivered.
overhead       Metal runtime, text conditioning, latents: OVERHEAD_BYTES.

The phases do not all coexist (h3.c loads and frees encoder, DiT and VAEs in
turn), so the sum is an upper bound: admission may start fewer jobs than would
fit, never more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from h3render.engine.h3.options import FRAME_MULTIPLE, FRAME_OFFSET, H3Options, H3Request, align_frames

GIB = 1 << 30
FULL_DIT_LAYERS = 50
SSD_STREAMING_BYTES = 2 * GIB
PREVIEW_VAE_BYTES = 10 * GIB
# Hidden size 5376 in BF16 (10752 B per row vector) times ~24 row vectors live
# per token in a block (QKV 3, attention output 1, the 14336-wide SwiGLU
# intermediate ~5.3, residual, bypass, norms and F32 latents/velocities ~15).
# An assumption to calibrate against H3_PROFILE peaks, stated here in one place.
ACTIVATION_BYTES_PER_TOKEN = 24 * 5376 * 2
MEDIA_BYTES_PER_PIXEL = 3 * 4 + 3  # float32 RGB decoded + uint8 RGB delivered
OVERHEAD_BYTES = 1 * GIB
TOKEN_PIXELS = 32  # VAE spatial 16 x patch 2


class H3MemoryEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)
    dit: int
    activations: int
    preview_vae: int
    media: int
    overhead: int

    @property
    def total(self) -> int:
        return self.dit + self.activations + self.preview_vae + self.media + self.overhead

    def as_meta(self) -> dict[str, int]:
        return {"bytes": self.total, "dit": self.dit, "activations": self.activations,
                "preview_vae": self.preview_vae, "media": self.media, "overhead": self.overhead}


def latent_frames(frames: int) -> int:
    """h3.c's video latent frames for a (rounded) frame count: 2 + 5n for 5 + 17n frames."""
    f = align_frames(frames)
    return 2 + 5 * ((f - FRAME_OFFSET) // FRAME_MULTIPLE)


def video_tokens(width: int, height: int, frames: int) -> int:
    """DiT video tokens: (W/32) * (H/32) per latent frame."""
    return (width // TOKEN_PIXELS) * (height // TOKEN_PIXELS) * latent_frames(frames)


def dit_resident_bytes(dit_bytes: int, options: H3Options) -> int:
    """DiT weights resident while denoising (see the module doc)."""
    if options.ssd_streaming:
        return SSD_STREAMING_BYTES
    return dit_bytes * options.dit_layers // FULL_DIT_LAYERS


def estimate_h3_memory(dit_bytes: int, request: H3Request, preview: bool | None = None) -> H3MemoryEstimate:
    """Peak bytes of one validated h3.c render.

    dit_bytes: tensor bytes of the FL2VA DiT. preview: previews on (default:
    the request's preview_denoise option; pass True when the job asks for
    per-step previews through preview_every).
    """
    if dit_bytes < 0:
        raise ValueError(f"dit_bytes={dit_bytes} must be >= 0")
    opts = request.options
    rw = opts.render_width or request.width  # the model runs at the internal canvas
    rh = opts.render_height or request.height
    on = opts.preview_denoise if preview is None else bool(preview)
    return H3MemoryEstimate(
        dit=dit_resident_bytes(dit_bytes, opts),
        activations=video_tokens(rw, rh, request.frames) * ACTIVATION_BYTES_PER_TOKEN,
        preview_vae=PREVIEW_VAE_BYTES if on else 0,
        media=request.width * request.height * request.frames * MEDIA_BYTES_PER_PIXEL,
        overhead=OVERHEAD_BYTES,
    )


def dit_bytes_from_info(info: Mapping[str, Any]) -> int:
    """The FL2VA DiT's tensor bytes from the bridge's info JSON (h3r_info_json)."""
    comp = (info.get("components") or {}).get("fl2va_transformer") or {}
    if isinstance(comp, Mapping) and comp.get("tensor_bytes"):
        return int(comp["tensor_bytes"])
    wb = info.get("weight_bytes") or {}
    return int(max(wb.values())) if wb else 0
