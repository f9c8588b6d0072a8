"""One e4m3-cache decoding call (and, with --bf16, stage 6 on the same cache in bf16) for Nsight
Compute: B64 H32/8 Sq1 Sk16384 D128, the row where the e4m3 build ran 0.81x SDPA (README, Measured).
Warm-up calls first (the build compiled and loaded), then the call to profile, marked by NVTX.
    ncu --clock-control none -k regex:attention --nvtx --nvtx-include "profiled/" \
        --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis \
        -o fp8_b64 python3 experiments/fp8_kv_decode/profile_one.py
SourceCounters' stall samples per SASS instruction tell the widening warps' waits (LDS, STS,
PRMT/F2FP, SYNCS on k_empty/k_staged) from the consumer's (wgmma waits, k_full).
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]
import stages.stage6 as s6  # noqa: E402
import stages.stage6_kv_fp8 as f8  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402

q, k, v = make_qkv(64, 32, 1, 128, Sk=16384, Hkv=8, dtype=torch.bfloat16)
(k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
bf16 = "--bf16" in sys.argv
if bf16:
    k, v = f8.dequantized(k8, kd, torch.bfloat16), f8.dequantized(v8, vd, torch.bfloat16)
call = (lambda: s6.attention(q, k, v)) if bf16 else (lambda: s6.attention(q, k8, v8, k_descale=kd, v_descale=vd))
for _ in range(3):
    call()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("profiled")
call()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("profiled one", "bf16" if bf16 else "e4m3", "call")
