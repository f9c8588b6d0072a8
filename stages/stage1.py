"""Stage 1 — unfused attention on tensor cores (WMMA), CUDA C++ through NVRTC.

The two matrix products move from stage 0's scalar loops to the tensor cores, in three
kernels (stages/stage1.cu): S = Q·Kᵀ to global memory in fp32, a row-wise softmax that
applies the scale and the causal mask and writes P, then O = P·V. The cost is the
materialised score matrix: 6 bytes per (query, key) pair, which for long sequences is far
more memory traffic than q, k, v and the output together — and may not fit on the GPU.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from lib import nvrtc
from lib.inputs import StageInfo, causal_from_mask, causal_mode, new_output, sdpa_causal, trivial_output, validate

SOURCE = Path(__file__).with_suffix(".cu")
KERNELS = ("attention_scores", "attention_softmax", "attention_pv")
TILE, THREADS, SOFTMAX_THREADS = 32, 128, 256  # as in stage1.cu

INFO = StageInfo(
    number=1,
    slug="unfused_wmma",
    title="Unfused, tensor cores (WMMA)",
    adds="Both matrix products on tensor cores (WMMA 16×16×16, fp32 accumulate), in three "
         "kernels that write the full score matrix S and probabilities P to global memory.",
    backend="nvrtc",
    min_cc=(8, 0),  # bfloat16 WMMA needs Ampere
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),
    sources=("stages/stage1.py", "stages/stage1.cu", "stages/attention.cuh"),
    gqa=True,
    prediction={"tflops": (62.8, 62.8),
                "basis": "the three kernels' HBM bytes (S and P round trips) at the copy "
                         "bandwidth, or their FLOPs at the matmul rate, whichever is larger"},
)


def compile_for(arch: str, dtype=torch.float16, head_dim: int = 64) -> dict:
    """The stage's kernels compiled for `arch` without a GPU, for lib.sass."""
    return {f"stage1 {str(dtype)[6:]} D{head_dim}":
            nvrtc.compile_stage(SOURCE, arch=arch, dtype=dtype, head_dim=head_dim)}


def padded(n: int) -> int:
    return (n + TILE - 1) // TILE * TILE


def workspace_bytes(B, H, Sq, Sk, dtype=torch.float16) -> int:
    """Global memory the intermediate S (fp32) and P (q's dtype) take."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return B * H * padded(Sq) * padded(Sk) * (4 + itemsize)


def attention(q, k, v, *, causal=False, scale=None, attn_mask=None, is_causal=None, enable_gqa=True):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True) for q [B, H, Sq, D], k/v [B, H_kv, Sk, D] with H a multiple of H_kv, read in
    place with their strides; output a new contiguous tensor in q's dtype.
    attn_mask=causal_upper_left(Sq, Sk) is causal=True; the bottom-right alignment
    (causal_lower_right) with Sq != Sk is refused (stages 2–6)."""
    causal = sdpa_causal(q, k, causal, is_causal, enable_gqa)  # SDPA's keywords
    causal = causal_from_mask(causal, attn_mask, q, k, INFO)
    scale = validate(q, k, v, causal=causal, scale=scale, info=INFO)
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    causal = causal_mode(causal, Sq, Sk, INFO) != 0
    if (trivial := trivial_output(q, k)) is not None:  # nothing to compute
        return trivial
    rows, cols = padded(Sq), padded(Sk)
    bh, group = B * H, H // Hk
    # (batch, head) folded into the grids' x dimension (stages/attention.cuh)
    nvrtc.check_grid_x("stage 1", max(rows, cols // TILE) * bh)
    nvrtc.check_grid("stage 1", **{"query tiles": rows // TILE})
    try:
        s = torch.empty(bh, rows, cols, device=q.device, dtype=torch.float32)
        p = torch.empty(bh, rows, cols, device=q.device, dtype=q.dtype)
    except torch.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info(q.device)
        raise MemoryError(
            f"stage 1 materialises the score matrix: S and P need "
            f"{workspace_bytes(B, H, Sq, Sk, q.dtype) / 2**30:,.1f} GiB for B{B} H{H} Sq{Sq} "
            f"Sk{Sk}, and the GPU has {free / 2**30:,.1f} of {total / 2**30:,.1f} GiB free; "
            "stage 2 never stores it") from None
    out = new_output(q)
    kern = nvrtc.stage_kernels(SOURCE, KERNELS, q.dtype, D)
    heads = (np.int32(H), np.int32(group))
    nvrtc.launch(kern["attention_scores"], (cols // TILE * bh, rows // TILE), THREADS,
                 q, k, s, np.int32(Sq), np.int32(Sk), *heads, *nvrtc.layout_args(q),
                 *nvrtc.layout_args(k))
    nvrtc.launch(kern["attention_softmax"], (rows * bh,), SOFTMAX_THREADS, s, p, np.int32(Sq),
                 np.int32(Sk), np.int32(cols), np.float32(scale * math.log2(math.e)),
                 np.int32(causal))
    del s  # back to torch's cache; the softmax kernel is queued on the same stream
    nvrtc.launch(kern["attention_pv"], (D // TILE * bh, rows // TILE), THREADS, p, v, out,
                 np.int32(Sq), np.int32(Sk), np.int32(cols), np.int32(causal), *heads,
                 *nvrtc.layout_args(v))
    return out
