"""Stage 0 — the scalar baseline, in numba.cuda.

One GPU thread computes one query row of attention with plain loops and float32 math:

    out[i, :] = sum_j  softmax_j(q[i]·k[j] · scale) · v[j, :]

softmax done the obvious, numerically stable way in two passes over the keys: first the row's
largest score (so that exp() never overflows), then each score again, its exponential, their
sum and the weighted sum of the value rows. Nothing is shared between threads, no tile is
kept on chip and no tensor core is used: every later stage is measured against this.

Causal attention follows SDPA's rule (query i sees keys j <= i), so a causal row simply stops
its loops early; any Sq and Sk work because every thread owns whole rows. Grouped-query inputs
(k, v with H / group heads) work too: query head h reads K/V head h // group.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from lib import simulator
from lib.inputs import StageInfo, causal_from_mask, causal_mode, new_output, sdpa_causal, trivial_output, validate

cuda = simulator.numba_cuda()
float32 = np.float32

INFO = StageInfo(
    number=0,
    slug="scalar",
    title="Scalar baseline (numba.cuda)",
    adds="One thread per query row, plain loops, float32 math, a two-pass softmax: "
         "correct and slow, the yardstick for every later stage.",
    backend="numba",
    min_cc=(7, 5),  # the oldest GPU the CUDA 13 toolkit under numba-cuda still targets
    dtypes=(torch.float16, torch.bfloat16, torch.float32),
    head_dims=range(1, 257),
    sources=("stages/stage0.py",),
    gqa=True,
    prediction={"tflops": (0.668, 34.5),
                "basis": "no reuse (every load from HBM) to the FP32 roofline (4/6 of the FP32 "
                         "rate counts)"},
    notes="Reads contiguous copies of q, k and v (numba's arrays are views of whole "
          "[B·H, S, D] blocks): inputs with other strides are copied first. The CUDA C++ "
          "stages read them in place.",
    # for offline inspection (lib.sass): the kernel and the signature a float16 call compiles
    extra={"numba_kernels": {"attention_rows": "void(float16[:, :, ::1], float16[:, :, ::1], "
                             "float16[:, :, ::1], float16[:, :, ::1], float32, boolean, "
                             "int32)"}},
)

MAX_HEAD_DIM = 256     # size of each thread's output accumulator
THREADS_PER_BLOCK = 128


@cuda.jit
def attention_rows(q, k, v, out, scale, causal, group):
    """q, out: [B*H, Sq, D]; k, v: [B*H/group, Sk, D]. Thread r computes row r of the flattened
    [B*H*Sq] rows."""
    r = cuda.grid(1)
    if r >= q.shape[0] * q.shape[1]:
        return
    bh = r // q.shape[1]
    i = r % q.shape[1]
    kv = bh // group  # (b, h) -> K/V head (b, h // group): b·H + h over group is b·H_kv + h // group
    n_keys = k.shape[1]
    if causal:
        n_keys = min(i + 1, n_keys)

    # Two passes over the keys, each computing every score q[i]·k[j]·scale afresh:
    # pass 0 finds the row's largest score, so that exp() below never overflows;
    # pass 1 sums exp(score - max) and the value rows weighted by it.
    row_max = float32(-math.inf)
    row_sum = float32(0)
    acc = cuda.local.array(MAX_HEAD_DIM, float32)
    for c in range(q.shape[2]):
        acc[c] = float32(0)
    for pass_ in range(2):
        for j in range(n_keys):
            s = float32(0)
            for c in range(q.shape[2]):
                s += float32(q[bh, i, c]) * float32(k[kv, j, c])
            s *= scale
            if pass_ == 0:
                row_max = max(row_max, s)
            else:
                p = math.exp(s - row_max)
                row_sum += p
                for c in range(q.shape[2]):
                    acc[c] += p * float32(v[kv, j, c])

    for c in range(q.shape[2]):
        out[bh, i, c] = acc[c] / row_sum


def attention(q, k, v, *, causal=False, scale=None, attn_mask=None, is_causal=None, enable_gqa=True):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True) for q [B, H, Sq, D], k/v [B, H_kv, Sk, D] with H a multiple of H_kv; output
    a new contiguous tensor in q's dtype. attn_mask=causal_upper_left(Sq, Sk) is causal=True;
    the bottom-right alignment (causal_lower_right) with Sq != Sk is refused (stages 2–6)."""
    causal = sdpa_causal(q, k, causal, is_causal, enable_gqa)  # SDPA's keywords
    causal = causal_from_mask(causal, attn_mask, q, k, INFO)
    scale = validate(q, k, v, causal=causal, scale=scale, info=INFO)
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    causal = causal_mode(causal, Sq, Sk, INFO) != 0
    if (trivial := trivial_output(q, k)) is not None:  # nothing to compute
        return trivial
    out_dtype = q.dtype
    # Under no_grad a tensor may still require grad, and numba's array interface refuses those:
    # validate() has refused them with grad mode on, so what is left is inference.
    q, k, v = q.detach(), k.detach(), v.detach()
    if q.dtype == torch.bfloat16:  # numpy and numba have no bfloat16: read float32 copies
        q, k, v = q.float(), k.float(), v.float()
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # no copy if already contiguous
    out = new_output(q)
    views = (q.view(B * H, Sq, D), k.view(B * Hk, Sk, D), v.view(B * Hk, Sk, D),
             out.view(B * H, Sq, D))
    blocks = (B * H * Sq + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
    args = (float32(scale), causal, np.int32(H // Hk))
    if simulator.SIMULATOR:  # numpy views of the CPU tensors: the simulator writes into out
        attention_rows[blocks, THREADS_PER_BLOCK](*(t.numpy() for t in views), *args)
    else:
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        arrays = [cuda.as_cuda_array(t, sync=False) for t in views]
        attention_rows[blocks, THREADS_PER_BLOCK, stream](*arrays, *args)
    return out.to(out_dtype)  # no copy unless the input was bfloat16
