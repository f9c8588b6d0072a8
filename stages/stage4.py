"""Stage 4 — fused attention with larger tiles (WMMA), CUDA C++ through NVRTC.

Stage 3's kernel (stages/stage4.cu) with bigger blocks: BLOCK_Q query rows (4 or 8 warps of
16 rows) against BLOCK_K-key tiles, and up to LOADS_IN_FLIGHT loads in flight per thread in
the (now larger) K/V copy, all chosen per head dim from measurements (TILES below;
`scripts/tile_sweep.py` measures every choice, the notebook shows them). Only the tiles that
need a mask (the last; the diagonal when causal) check each key. The tiles outgrow
the 48 KB of static shared memory, so they live in dynamic shared memory, opted in beyond
48 KB. The per-row softmax state (max, sum, rescale factor, 1/l) never leaves registers:
warp shuffles carry it to the lanes that hold the row's output.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from lib import nvrtc
from lib.inputs import StageInfo, causal_from_mask, sdpa_causal

SOURCE = Path(__file__).with_suffix(".cu")
# The (BLOCK_Q, BLOCK_K, LOADS_IN_FLIGHT) the kernel is built with, per head dim: the fastest
# choice of the tile sweep (scripts/tile_sweep.py, every entry of CHOICES at B16 H16 S2048 D64
# and B4 H16 S8192 D128, fp16, full and causal) among those that spill nothing. The sweep at
# fde1bf8 measured (128, 64, 4) 1.11x (full) and 1.07x (causal) the speed of the former D 64
# default (64, 64, 16), and (64, 64, 16) 1.14x / 1.13x that of the former D 128 default
# (64, 32, 32); the loads in flight changed nothing measurable at either (within 0.3%), so the
# fewest that tie are kept at D 64. The notebook reads the latest sweep and says whether these
# are still the fastest.
TILES = {64: (128, 64, 4), 128: (64, 64, 16)}
CHOICES = [(bq, bk, f) for bq in (64, 128) for bk in (32, 64) for f in (4, 32)] + \
    [(64, 64, 16)]

INFO = StageInfo(
    number=4,
    slug="large_tiles",
    title="Fused, larger tiles",
    adds="Blocks of 64–128 query rows (4–8 warps) and 64-key tiles chosen per head dim, in "
         "dynamic shared memory beyond 48 KB, with the softmax state kept in registers.",
    backend="nvrtc",
    min_cc=(8, 0),
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),
    sources=("stages/stage4.py", "stages/stage4.cu", "stages/attention.cuh"),
    # the notebook's section 2 at D 64 (it prints its own figure next to this one)
    prediction={"speedup": (1.11, 1.18),
                "basis": "stage 3 ÷ stage 4 in instructions per row and key, per warp and key "
                         "(SASS of NVRTC 13.0, the H100 machine's), and shared-memory bytes per "
                         "row and key"},
    gqa=True,
    causal_alignments=("top_left", "bottom_right"),
    # Since the row strides became kernel arguments, ptxas spills 4 bytes in one variant
    # (bfloat16, D128, sm_90a, 168 registers); the offline test allows that much.
    extra={"spill_bytes_allowed": {128: 8}},
)


def smem_bytes(head_dim: int, block_q: int, block_k: int, item: int = 2) -> int:
    """Dynamic shared memory of one block: the largest member of the .cu file's `Tiles` (Q; or
    K, V, S and P of a step; or O), with the same padding. The kernel checks it at compile time."""
    ld, ld_o, ld_s, ld_p = head_dim + 8, head_dim + 4, block_q + 16, block_q + 24
    step = 2 * block_k * ld * item + block_k * ld_s * 4 + block_k * ld_p * item
    return max(block_q * ld * item, step, block_q * ld_o * 4)


@lru_cache(maxsize=None)  # attention() asks on every call: made once
def config(head_dim: int, tiles: tuple[int, int, int] | None = None) -> dict:
    """Launch settings for one choice of (BLOCK_Q, BLOCK_K, LOADS_IN_FLIGHT): block_q,
    threads, shared memory and defines."""
    bq, bk, in_flight = tiles or TILES[head_dim]
    smem = smem_bytes(head_dim, bq, bk)
    return {"block_q": bq, "threads": 32 * bq // 16, "smem": smem,
            "defines": (("BLOCK_Q", bq), ("BLOCK_K", bk), ("SMEM_BYTES", smem),
                        ("LOADS_IN_FLIGHT", in_flight))}


def compile_for(arch: str, dtype=torch.float16, head_dim: int = 64, tiles=None,
                packed: bool = True) -> dict:
    """The stage's kernel compiled for `arch` without a GPU, for lib.sass: the build contiguous
    inputs run (row strides the constant D), or with packed=False the one for any row stride."""
    cfg = config(head_dim, tiles and tuple(tiles))
    return {f"stage{INFO.number} {str(dtype)[6:]} D{head_dim}":
            nvrtc.compile_stage(SOURCE, arch=arch, dtype=dtype, head_dim=head_dim,
                                defines=dict(cfg["defines"] + (nvrtc.PACKED_ROWS if packed else ())))}


def attention(q, k, v, *, causal=False, scale=None, attn_mask=None, is_causal=None, enable_gqa=True, tiles=None):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True) for q [B, H, Sq, D], k/v [B, H_kv, Sk, D] with H a multiple of H_kv, read in
    place with their strides; output a new contiguous tensor in q's dtype. `tiles` = (BLOCK_Q, BLOCK_K,
    LOADS_IN_FLIGHT) overrides the per-head-dim choice (one of CHOICES), for measuring the
    alternatives.
    `causal` may also name the alignment, "top_left" or "bottom_right", and `attn_mask` may be
    SDPA's causal bias, causal_upper_left(Sq, Sk) or causal_lower_right(Sq, Sk)
    (lib.inputs.causal_mode)."""
    causal = sdpa_causal(q, k, causal, is_causal, enable_gqa)  # SDPA's keywords
    causal = causal_from_mask(causal, attn_mask, q, k, INFO)
    if tiles is not None and tuple(tiles) not in CHOICES:
        raise ValueError(f"tiles must be one of {CHOICES}, got {tiles}")
    D = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() == 4 else None
    cfg = config(D if D in TILES else 64, tiles and tuple(tiles))
    return nvrtc.launch_fused(INFO, SOURCE, q, k, v, causal=causal, scale=scale, **cfg)
