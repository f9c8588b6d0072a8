"""Stage 2 — fused attention with the online softmax (WMMA), CUDA C++ through NVRTC.

One kernel (stages/stage2.cu) per (batch·head, 32-query tile) streams K and V through shared
memory in 32-key tiles, computes both matrix products on tensor cores and keeps a running
max and sum per query row (the online softmax), rescaling the partial output whenever the
max grows. The score matrix never leaves the chip; fully masked causal tiles are skipped.
The softmax is done simply: one thread per row, with a block-wide barrier between steps.
"""
from __future__ import annotations

from pathlib import Path

import torch

from lib import nvrtc
from lib.inputs import StageInfo, causal_from_mask, sdpa_causal

SOURCE = Path(__file__).with_suffix(".cu")
BLOCK_Q, THREADS = 32, 64  # as in the .cu file

INFO = StageInfo(
    number=2,
    slug="fused",
    title="Fused, online softmax",
    adds="One kernel: K/V tiles streamed through shared memory, the online softmax (running "
         "max and sum, O rescaled), so S and P never reach global memory.",
    backend="nvrtc",
    min_cc=(8, 0),
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),
    sources=("stages/stage2.py", "stages/stage2.cu", "stages/attention.cuh"),
    gqa=True,
    causal_alignments=("top_left", "bottom_right"),
    prediction={"tflops": (118.6, 740.0),
                "basis": "issue slots per K/V tile counted from the SASS (low) to the "
                         "tensor-core roofline (high)"},
    # With its fragments loaded by ldmatrix (attention.cuh's load_fragment), the bfloat16 D128
    # build for sm_80 keeps one 4-byte value on the stack (168 registers; one LDL per K/V tile);
    # the sm_90 builds spill nothing. The offline test allows that much.
    extra={"spill_bytes_allowed": {128: 8}},
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
