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
from lib.inputs import StageInfo, new_output, validate

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


def attention(q, k, v, *, causal=False, scale=None):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    for q [B, H, Sq, D], k/v [B, H, Sk, D]; output in q's dtype."""
    scale = validate(q, k, v, causal=causal, scale=scale, info=INFO)
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    nvrtc.check_grid("stage 1", **{"batch·heads": B * H})
    rows, cols = padded(Sq), padded(Sk)
    try:
        s = torch.empty(B * H, rows, cols, device=q.device, dtype=torch.float32)
        p = torch.empty(B * H, rows, cols, device=q.device, dtype=q.dtype)
    except torch.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info(q.device)
        raise MemoryError(
            f"stage 1 materialises the score matrix: S and P need "
            f"{workspace_bytes(B, H, Sq, Sk, q.dtype) / 2**30:,.1f} GiB for B{B} H{H} Sq{Sq} "
            f"Sk{Sk}, and the GPU has {free / 2**30:,.1f} of {total / 2**30:,.1f} GiB free; "
            "stage 2 never stores it") from None
    out = new_output(q)
    kern = nvrtc.stage_kernels(SOURCE, KERNELS, q.dtype, D)
    bh = B * H
    nvrtc.launch(kern["attention_scores"], (cols // TILE, rows // TILE, bh), THREADS,
                 q, k, s, np.int32(Sq), np.int32(Sk))
    nvrtc.launch(kern["attention_softmax"], (rows, bh), SOFTMAX_THREADS, s, p, np.int32(Sq),
                 np.int32(Sk), np.int32(cols), np.float32(scale * math.log2(math.e)),
                 np.int32(causal))
    del s  # back to torch's cache; the softmax kernel is queued on the same stream
    nvrtc.launch(kern["attention_pv"], (D // TILE, rows // TILE, bh), THREADS, p, v, out,
                 np.int32(Sq), np.int32(Sk), np.int32(cols), np.int32(causal))
    return out
