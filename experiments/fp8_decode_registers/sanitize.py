"""Small calls of stages/stage7_decode for compute-sanitizer (memcheck, racecheck, synccheck):
both head dims and dtypes, split and not (merged in a cluster and by the last block), Sq 4
bottom-right, seqlens_k with 0 and 1 and past a chunk, a strided cache, the .cu's switches off, its L2 hints on. Each output is checked against the float64 reference too."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import torch  # noqa: E402

import stages.stage7_decode as d7  # noqa: E402
from test_stage6_fp8_kv import check_fp8, fp8_inputs  # noqa: E402

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    print("needs an H100 or H200 and none was found", file=sys.stderr)
    sys.exit(2)

for D in (64, 128):
    for dtype in (torch.float16, torch.bfloat16):
        for B, H, Hk, Sq, Sk in ((3, 32, 8, 1, 700), (2, 16, 4, 4, 333)):
            q, k8, v8, kd, vd = fp8_inputs(B, H, Hk, Sq, Sk, D, dtype, 3)
            if Sq == 1:
                k8, v8 = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k8, v8))
            lens = [0, 1, 97][:B]
            seq = torch.tensor(lens, dtype=torch.int32, device=q.device)
            for causal in ((False,) if Sq == 1 else (False, "bottom_right")):
                for opts in ({}, {"splits": 1}, {"splits": 3}, {"splits": 3, "cluster_merge": False}, {"splits": 11},
                             {"tiles": (16, 4, 4)}, {"switches": tuple((n, 0) for n in d7.SWITCHES)},
                             {"switches": (("EVICT_FIRST", 1), ("PREFETCH_256", 1))}):
                    out = d7.attention(q, k8, v8, k_descale=kd, v_descale=vd, seqlens_k=seq, causal=causal, **opts)
                    check_fp8(out, q, k8, v8, kd, vd, lens, causal, f"D{D} {dtype} {causal} {opts}")
torch.cuda.synchronize()
print("sanitize calls done")
