"""Two stages/stage7_decode calls for Nsight Compute, each in its own NVTX range after warm-up:
B64 H32/8 Sq1 Sk16384 D128 ("b64": the cache's bytes bind), B1 Sk1024 ("b1") and B8 Sk4096 ("b8"),
two rows short of their goals. bf16 Q, the launcher's rule.

    ncu --clock-control none -k regex:decode_e4m3 --nvtx --nvtx-include "b64/" --nvtx-include "b1/" \\
        --set full -o d7 python3 experiments/fp8_decode_registers/profile_one.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import stages.stage6_kv_fp8 as f8  # noqa: E402
import stages.stage7_decode as d7  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    print("needs an H100 or H200 and none was found", file=sys.stderr)
    sys.exit(2)

CALLS = (("b64", 64, 16384, {}), ("b1", 1, 1024, {}), ("b8", 8, 4096, {}), ("b64s", 64, 1024, {}),
         ("b8s", 8, 1024, {}), ("b8s2", 8, 1024, {"splits": 2}), ("floor", 1, 32, {}))
for name, B, Sk, opts in (c for c in CALLS if len(sys.argv) < 2 or c[0] in sys.argv[1:]):
    q, k, v = make_qkv(B, 32, 1, 128, Sk=Sk, Hkv=8, dtype=torch.bfloat16)
    (k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
    for _ in range(3):
        d7.attention(q, k8, v8, k_descale=kd, v_descale=vd, **opts)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(name)
    d7.attention(q, k8, v8, k_descale=kd, v_descale=vd, **opts)
    torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
print("profiled")
