"""Stage 3 — fused attention with a warp-level softmax (WMMA), CUDA C++ through NVRTC.

Stage 2's kernel (stages/stage3.cu) with the softmax moved from one thread per row to the
warps: the warp that computed 16 rows of S (and owns their rows of O) runs their softmax too,
two neighbouring lanes per row, each over every other column, their max and sum combined
by a warp shuffle. Every lane of every warp works, and since a warp now touches
only its own rows, the block-wide barriers between the steps become warp-level ones; the
block meets only around the K/V tile all warps share.
"""
from __future__ import annotations

from pathlib import Path

import torch

from lib import nvrtc
from lib.inputs import StageInfo, causal_from_mask, sdpa_causal

SOURCE = Path(__file__).with_suffix(".cu")
BLOCK_Q, THREADS = 32, 64  # as in the .cu file

INFO = StageInfo(
    number=3,
    slug="warp_softmax",
    title="Fused, warp-level softmax",
    adds="The softmax runs on every warp (each owns its rows; max and sum by warp shuffles, "
         "rescaling spread over lanes), so the block-wide barriers between steps go.",
    backend="nvrtc",
    min_cc=(8, 0),
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),
    sources=("stages/stage3.py", "stages/stage3.cu", "stages/attention.cuh"),
    gqa=True,
    causal_alignments=("top_left", "bottom_right"),
    # At D 128 the kernel asks for 6 blocks per SM (168 registers a thread, stages/stage3.cu);
    # under that bound NVRTC 13.0 (the H100 machine's) spills 44 bytes of the bf16 build, one
    # value stored and reloaded per K/V tile; 13.5 spills nothing. The offline test allows it.
    extra={"spill_bytes_allowed": {128: 64}},
    prediction={"speedup": (1.22, 1.80),
                "basis": "instructions per tile from the SASS: issue-bound (low) to "
                         "latency-bound, the serial chain (high)"},
)


def compile_for(arch: str, dtype=torch.float16, head_dim: int = 64, packed: bool = True) -> dict:
    """The stage's kernel compiled for `arch` without a GPU, for lib.sass: the build contiguous
    inputs run (row strides the constant D), or with packed=False the one for any row stride."""
    return {f"stage{INFO.number} {str(dtype)[6:]} D{head_dim}":
            nvrtc.compile_stage(SOURCE, arch=arch, dtype=dtype, head_dim=head_dim,
                                defines=dict(nvrtc.PACKED_ROWS if packed else ()))}


def attention(q, k, v, *, causal=False, scale=None, attn_mask=None, is_causal=None, enable_gqa=True):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True) for q [B, H, Sq, D], k/v [B, H_kv, Sk, D] with H a multiple of H_kv, read in
    place with their strides; output a new contiguous tensor in q's dtype.
    `causal` may also name the alignment, "top_left" or "bottom_right", and `attn_mask` may be
    SDPA's causal bias, causal_upper_left(Sq, Sk) or causal_lower_right(Sq, Sk)
    (lib.inputs.causal_mode)."""
    causal = sdpa_causal(q, k, causal, is_causal, enable_gqa)  # SDPA's keywords
    causal = causal_from_mask(causal, attn_mask, q, k, INFO)
    return nvrtc.launch_fused(INFO, SOURCE, q, k, v, causal=causal, scale=scale,
                              block_q=BLOCK_Q, threads=THREADS)
