"""Admission: will this job fit in memory now? Estimate, compare, explain.

Pure functions, except `model_dims`/`weight_bytes_on_disk`, which read a model
directory's GGUF headers and file sizes. h3.c jobs (an H3 snapshot) use
`admit_h3` over h3render.engine.h3.estimate instead; see the end of the file.

The estimate is the peak resident set of one render, phase by phase:

    weights   every GGUF file the render maps (transformer-<quant>, text encoder,
              VAE), counted whole: they are mmapped and all pages get touched
    encode    UMT5 hidden states: text_len x d_model x ~12 live f32 buffers
    denoise   latents x, v, v_uncond and sampler history (f32), the two contexts,
              and one DiT forward's scratch block exactly as wan_dit.c sizes it:
                N*P + 3*N*D + 2*max(N,L)*D + L*D + R*F + N*Dh + Fq + 9D + N*Po floats
              with N = T'/pt * H'/py * W'/px tokens (latent T' = (F-1)/4+1,
              H' = H/8, W' = W/8), plus per-thread matmul tiles
    decode    the decoded video (3, F, H, W) f32, and the VAE's working set: per
              decoder stage, ~4 live feature maps of (c, 4 frames, h, w) plus the
              causal-conv caches (2 frames per conv) at that stage's resolution
    overhead  the Python process, numpy, ffmpeg pipe: a fixed 256 MiB

peak = weights + max(encode, denoise, decode) + overhead. It is deliberately a
little high; tests compare it with the measured peak RSS of real renders.

`output_bytes` bounds what a render writes to disk (the disk side of admission).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from h3render.engine.h3.estimate import estimate_h3_memory

GiB = 1024**3
MiB = 1024**2
F32 = 4
OVERHEAD_BYTES = 256 * MiB
META_ALLOWANCE_BYTES = 1 * MiB  # meta.json (health samples, step times) and file system slack
WAN_FFN_ROWS = 256  # wan_dit.c: FFN hidden rows computed at once
MM_JB = 8  # ops.c: weight rows per matmul tile


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelDims(_Model):
    """The sizes the estimate needs, from the GGUF h3r.* metadata (defaults: Wan 2.1 1.3B)."""

    dim: int = 1536  # heads * head_dim
    head_dim: int = 128
    ffn_dim: int = 8960
    in_channels: int = 16
    out_channels: int = 16
    patch: tuple[int, int, int] = (1, 2, 2)
    freq_dim: int = 256
    text_len: int = 512
    text_dim: int = 4096
    vae_base_dim: int = 96
    vae_dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    vae_num_res_blocks: int = 2
    vae_stride: tuple[int, int, int] = (4, 8, 8)


class JobShape(_Model):
    width: int
    height: int
    frames: int
    guidance: float = 5.0
    quant: str = "f16"
    threads: int = 1


class MemoryEstimate(_Model):
    weights: int
    encode: int
    denoise: int
    decode: int
    overhead: int = OVERHEAD_BYTES
    tokens: int

    @property
    def total(self) -> int:
        return self.weights + max(self.encode, self.denoise, self.decode) + self.overhead

    def as_meta(self) -> dict:
        return {"bytes": self.total, "weights": self.weights, "encode": self.encode,
                "denoise": self.denoise, "decode": self.decode, "overhead": self.overhead,
                "tokens": self.tokens}


class Admission(_Model):
    fits: bool
    need: int
    available: int
    usable: int  # available minus headroom
    headroom: float
    message: str
    suggestion: str = ""


def latent_grid(shape: JobShape, dims: ModelDims) -> tuple[int, int, int]:
    st, sy, sx = dims.vae_stride
    return (shape.frames - 1) // st + 1, shape.height // sy, shape.width // sx


def tokens(shape: JobShape, dims: ModelDims) -> int:
    t, y, x = latent_grid(shape, dims)
    pt, py, px = dims.patch
    return max(t // pt, 1) * max(y // py, 1) * max(x // px, 1)


def estimate_memory(shape: JobShape, dims: ModelDims, weight_bytes: int) -> MemoryEstimate:
    """Peak bytes of one render; see the module doc for each term."""
    t, y, x = latent_grid(shape, dims)
    pt, py, px = dims.patch
    n_lat = dims.in_channels * t * y * x
    cfg = shape.guidance > 1.0
    N = tokens(shape, dims)
    D, F, L = dims.dim, dims.ffn_dim, dims.text_len
    P = dims.in_channels * pt * py * px
    Po = dims.out_channels * pt * py * px
    R = min(N, WAN_FFN_ROWS)
    scratch = (N * P + 3 * N * D + 2 * max(N, L) * D + L * D + R * F + N * dims.head_dim
               + dims.freq_dim + 9 * D + N * Po)
    tiles = max(shape.threads, 1) * MM_JB * max(D, F)
    latents = n_lat * (2 + (1 if cfg else 0) + 4)  # x, v, v_uncond, sampler history (UniPC)
    contexts = L * D * (2 if cfg else 1)
    denoise = F32 * (scratch + tiles + latents + contexts)

    encode = F32 * (L * dims.text_dim * 12 + contexts)

    frames = 1 + dims.vae_stride[0] * (t - 1)
    H, W = y * dims.vae_stride[1], x * dims.vae_stride[2]
    video = F32 * 3 * frames * H * W + 3 * H * W
    mults = list(dims.vae_dim_mult)
    n_stages = len(mults)
    vae_ws = 0
    for i, m in enumerate(reversed(mults)):  # decoder: deepest stage first
        c = dims.vae_base_dim * m
        scale = 2 ** (n_stages - 1 - i)
        hw = max(H // scale, 1) * max(W // scale, 1)
        convs = 2 * (dims.vae_num_res_blocks + 1) + 1
        live = 4 * c * 4 * hw  # ~4 feature maps of 4 frames
        cache = convs * c * 2 * hw  # 2 cached frames per causal conv
        vae_ws = max(vae_ws, live) + cache
    decode = video + F32 * (vae_ws + n_lat)

    return MemoryEstimate(weights=weight_bytes, encode=encode, denoise=denoise, decode=decode,
                          tokens=N)


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def admit(shape: JobShape, dims: ModelDims, weight_bytes: dict[str, int], available: int,
          headroom: float) -> Admission:
    """Whether the job fits `available` bytes keeping `headroom` (a fraction) free.

    `weight_bytes` maps each quant level the model has to its mapped bytes; when the
    job does not fit, the message suggests the largest lower quant level that would,
    else a smaller size at the job's quant level (keeping the aspect ratio, on the
    size grid of the VAE stride x patch)."""
    if shape.quant not in weight_bytes:
        raise ValueError(f"quant={shape.quant!r} is not among the model's levels "
                         f"{sorted(weight_bytes)}")
    est = estimate_memory(shape, dims, weight_bytes[shape.quant])
    usable = int(available * (1.0 - headroom))
    need = est.total
    head = f"headroom {headroom:.0%}"
    if need <= usable:
        return Admission(fits=True, need=need, available=available, usable=usable,
                         headroom=headroom,
                         message=f"needs {_gib(need)}, {_gib(available)} available ({head})")
    hints = []
    lower = sorted(((q, wb) for q, wb in weight_bytes.items() if wb < weight_bytes[shape.quant]),
                   key=lambda kv: -kv[1])
    for q, wb in lower:  # the best quality lower level that fits at full size
        if estimate_memory(shape.model_copy(update={"quant": q}), dims, wb).total <= usable:
            hints.append(f"quant {q}")
            break
    size = smaller_size(shape, dims, weight_bytes[shape.quant], usable)
    if size:
        hints.append(f"a smaller size such as {size[0]}x{size[1]}")
    elif not hints and lower:
        q, wb = lower[-1]
        size = smaller_size(shape, dims, wb, usable)
        if size:
            hints.append(f"quant {q} at a smaller size such as {size[0]}x{size[1]}")
    if not hints:
        hints.append("a machine with more free memory (even the smallest size does not fit)")
    suggestion = "try " + " or ".join(hints)
    return Admission(fits=False, need=need, available=available, usable=usable,
                     headroom=headroom, suggestion=suggestion,
                     message=f"needs {_gib(need)}, {_gib(available)} available ({head}); "
                             f"{suggestion}")


def smaller_size(shape: JobShape, dims: ModelDims, weight_bytes: int,
                 usable: int) -> tuple[int, int] | None:
    """The largest (width, height) with the job's aspect ratio that fits, or None."""
    grid = dims.vae_stride[1] * max(dims.patch[1], dims.patch[2])
    for k in range(1, 64):
        f = 1.0 - k / 64.0
        w = max(grid, int(shape.width * f) // grid * grid)
        h = max(grid, int(shape.height * f) // grid * grid)
        if (w, h) == (shape.width, shape.height):
            continue
        est = estimate_memory(shape.model_copy(update={"width": w, "height": h}), dims,
                              weight_bytes)
        if est.total <= usable:
            return w, h
    return None


# ---------------------------------------------------------------- disk


def output_bytes(width: int, height: int, frames: int) -> int:
    """An upper bound of the bytes one render writes: video.mp4, poster.png, meta.json.

    The mp4 is counted as raw RGB24 (3 bytes a pixel a frame): H.264 yuv420p at the
    crf we use stays well under raw yuv420p (1.5 bytes), even for noise. The poster
    is one raw RGB frame plus 1% for PNG's row filters and zlib framing."""
    px = width * height
    return frames * px * 3 + px * 3 * 101 // 100 + META_ALLOWANCE_BYTES


# ---------------------------------------------------------------- model directory


def weight_bytes_on_disk(model_dir: Path) -> dict[str, int]:
    """quant -> bytes of transformer-<quant>.gguf plus the text encoder and VAE the
    engine would pair with it (same quant if present, else the smallest file)."""
    model_dir = Path(model_dir)
    files = {f.name: f.stat().st_size for f in model_dir.glob("*.gguf")}

    def pick(component: str, quant: str) -> int:
        same = files.get(f"{component}-{quant}.gguf")
        if same is not None:
            return same
        sizes = [s for n, s in files.items() if n.startswith(component + "-")]
        return min(sizes) if sizes else 0

    out = {}
    for name, size in files.items():
        if name.startswith("transformer-"):
            q = name.removeprefix("transformer-").removesuffix(".gguf")
            out[q] = size + pick("text_encoder", q) + pick("vae", q)
    return out


def model_dims(model_dir: Path, quant: str | None = None) -> ModelDims:
    """ModelDims from the h3r.* metadata of transformer-/vae-/text_encoder-*.gguf."""
    from gguf import GGUFReader

    model_dir = Path(model_dir)
    found: dict = {}

    def meta(prefix: str) -> dict:
        files = sorted(model_dir.glob(f"{prefix}-*.gguf"))
        if quant and (model_dir / f"{prefix}-{quant}.gguf").exists():
            files = [model_dir / f"{prefix}-{quant}.gguf"]
        if not files:
            return {}
        r = GGUFReader(files[0], "r")
        out = {}
        for name, field in r.fields.items():
            if name.startswith("h3r.") and not name.startswith("h3r.shape."):
                v = field.contents()
                out[name[4:]] = v
        return out

    dit = meta("transformer")
    if dit:
        heads, hd = int(dit.get("num_attention_heads", 12)), int(dit.get("attention_head_dim", 128))
        found.update(dim=heads * hd, head_dim=hd, ffn_dim=int(dit["ffn_dim"]),
                     in_channels=int(dit["in_channels"]),
                     out_channels=int(dit.get("out_channels") or dit["in_channels"]),
                     patch=tuple(int(p) for p in dit["patch_size"]),
                     freq_dim=int(dit.get("freq_dim", 256)), text_dim=int(dit["text_dim"]))
        if "pipeline.text_len" in dit:
            found["text_len"] = int(dit["pipeline.text_len"])
    te = meta("text_encoder")
    if te.get("d_model"):
        found["text_dim"] = int(te["d_model"])
    vae = meta("vae")
    if vae:
        found.update(vae_base_dim=int(vae.get("decoder_base_dim") or vae.get("base_dim", 96)),
                     vae_dim_mult=tuple(int(m) for m in vae.get("dim_mult", (1, 2, 4, 4))),
                     vae_num_res_blocks=int(vae.get("num_res_blocks", 2)))
        st = int(vae.get("scale_factor_temporal", 4))
        ss = int(vae.get("scale_factor_spatial", 8))
        found["vae_stride"] = (st, ss, ss)
    return ModelDims(**found)


def dims_from_info(info: dict, base: ModelDims) -> ModelDims:
    """Override dims with what Engine.info() reports (text_len, strides, patch)."""
    upd = {}
    if info.get("text_len"):
        upd["text_len"] = int(info["text_len"])
    if info.get("vae_stride"):
        upd["vae_stride"] = tuple(int(v) for v in info["vae_stride"])
    if info.get("patch_size"):
        upd["patch"] = tuple(int(v) for v in info["patch_size"])
    if info.get("latent_channels"):
        upd["in_channels"] = int(info["latent_channels"])
    return base.model_copy(update=upd)


# ---------------------------------------------------------------- h3.c jobs


def admit_h3(request, dit_bytes: int, available: int, headroom: float,
             preview: bool | None = None) -> Admission:
    """Whether an h3.c job fits `available` bytes keeping `headroom` free.

    request: a validated h3render.engine.h3.options.H3Request; dit_bytes: the FL2VA
    DiT's tensor bytes (`models inspect`); preview: previews on (None: the request's
    preview_denoise). The estimate is h3render.engine.h3.estimate.estimate_h3_memory.
    When the job does not fit, the message suggests the first single change, in order
    of lost quality, that would: previews off, dit_layers 45, 40, 35, then
    ssd_streaming (with quant int8 when the job asked for int8-row, which SSD
    streaming excludes).
    """
    est = estimate_h3_memory(dit_bytes, request, preview=preview)
    usable = int(available * (1.0 - headroom))
    need = est.total
    head = f"headroom {headroom:.0%}"
    if need <= usable:
        return Admission(fits=True, need=need, available=available, usable=usable, headroom=headroom,
                         message=f"needs {_gib(need)}, {_gib(available)} available ({head})")
    opts = request.options
    on = opts.preview_denoise if preview is None else bool(preview)
    tries: list[tuple[str, dict, bool]] = []  # (hint, option updates, previews on)
    if on:
        tries.append(("previews off (preview_every=0, preview_denoise=false)", {"preview_denoise": False}, False))
    if not opts.ssd_streaming:
        for layers in (45, 40, 35):
            if layers < opts.dit_layers:
                tries.append((f"engine option dit_layers={layers}", {"dit_layers": layers}, on))
        hint = "engine option ssd_streaming=true"
        tries.append((hint + (" with quant int8" if request.quant == "int8-row" else ""),
                      {"ssd_streaming": True}, on))
    hints = []
    for hint, upd, prev in tries:
        cand = request.model_copy(update={"options": opts.model_copy(update=upd)})
        if estimate_h3_memory(dit_bytes, cand, preview=prev).total <= usable:
            hints.append(hint)
            break
    if not hints:
        hints.append("a smaller size or fewer frames with ssd_streaming=true, or a machine with more free memory")
    suggestion = "try " + hints[0]
    return Admission(fits=False, need=need, available=available, usable=usable, headroom=headroom,
                     suggestion=suggestion,
                     message=f"needs {_gib(need)}, {_gib(available)} available ({head}); {suggestion}")
