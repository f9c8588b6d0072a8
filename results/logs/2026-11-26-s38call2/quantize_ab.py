"""Stage 7's quantization before (six launches: an amax and a cast per tensor, grid y = batch·K/V
heads; quantize_before.cu, the source at e5be860, launched as stage7.quantize launched it) and
after (two launches for the three tensors, blocks numbered along x), same rounds, same inputs,
at fp8_bench's shapes (bf16). Both outputs are compared byte for byte before timing."""
from pathlib import Path

import numpy as np
import torch

from lib import fp8, nvrtc
from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage6 as s6, stage7 as s7

OLD = Path(__file__).with_name("quantize_before.cu")


def quantize_before(q, k, v):
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    kern = nvrtc.stage_kernels(OLD, ("fp8_amax", "fp8_cast", "fp8_cast_vt"), q.dtype, D)
    ts = [t.contiguous() for t in (q, k, v)]
    slabs = B * Hk
    amax = torch.zeros(3, slabs, dtype=torch.int32, device=q.device)
    descale = torch.empty(3, B, Hk, dtype=torch.float32, device=q.device)
    for i, t in enumerate(ts):
        per_slab = t.numel() // slabs
        blocks = max(1, min(-(-per_slab // (8 * 256)), -(-4 * s6._sm_count(q.device) // slabs)))
        nvrtc.launch_prepared(kern["fp8_amax"], nvrtc.launch_config((blocks, slabs, 1), (256, 1, 1)),
                              (t.data_ptr(), amax[i].data_ptr(), np.int64(per_slab)))
    out = []
    for i, t in enumerate(ts[:2]):
        x8 = torch.empty(t.shape, dtype=fp8.E4M3, device=q.device)
        n = t.numel()
        nvrtc.launch_prepared(kern["fp8_cast"], nvrtc.launch_config((-(-n // (8 * 256)), 1, 1), (256, 1, 1)),
                              (t.data_ptr(), amax[i].data_ptr(), descale[i].data_ptr(), x8.data_ptr(),
                               np.int64(n // slabs), np.int64(n)))
        out.append(x8)
    sk_pad = -(-Sk // 32) * 32
    vt = torch.empty((B, Hk, D, sk_pad), dtype=fp8.E4M3, device=q.device)
    nvrtc.launch_prepared(kern["fp8_cast_vt"], nvrtc.launch_config((sk_pad // 32, slabs, 1), (256, 1, 1)),
                          (ts[2].data_ptr(), amax[2].data_ptr(), descale[2].data_ptr(), vt.data_ptr(),
                           np.int32(Sk), np.int32(sk_pad)))
    return (*out, vt, descale[0], descale[1], descale[2])


for B, H, S, D in [(1, 8, 512, 64), (16, 16, 2048, 64), (4, 16, 8192, 128)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    a, b = quantize_before(q, k, v), s7.quantize(q, k, v)
    same = all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) if x.dtype == fp8.E4M3 else torch.equal(x, y)
               for x, y in zip(a, b))
    t = time_interleaved({"before (6 launches)": lambda: quantize_before(q, k, v),
                          "after (2 launches)": lambda: s7.quantize(q, k, v)}, budget_s=0.4)
    old, new = t["before (6 launches)"].median_us, t["after (2 launches)"].median_us
    print(f"B{B} H{H} S{S} D{D}: before {old:,.1f} µs, after {new:,.1f} µs ({old / new:.2f}x); "
          f"same bytes: {same}", flush=True)
