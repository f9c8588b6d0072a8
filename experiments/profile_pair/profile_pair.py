"""One call of stage 6 (or 7) and one of SDPA's default backend at the same shape, for a
profiler to set side by side: every kernel between the two warm-ups' end and the profiler's stop.

    ncu --profile-from-start off --clock-control none --set full \\
        python experiments/profile_pair/profile_pair.py 32 16 16 512 512 64 --causal

Stage 7 runs on inputs already quantized and transposed (stage7.forward), so only its attention
kernel is profiled; SDPA gets the same inputs in 16 bits.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

from lib.inputs import causal_mode, make_qkv  # noqa: E402
from lib.ncu import run_for_profiler  # noqa: E402
from lib.timing import sdpa_call  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
for name in ("B", "H", "H_kv", "Sq", "Sk", "D"):
    ap.add_argument(name, type=int)
ap.add_argument("--causal", action="store_true")
ap.add_argument("--stage", type=int, default=6, choices=[6, 7])
ap.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
ap.add_argument("--no-sdpa", action="store_true", help="profile the stage alone")
a = ap.parse_args()
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    ap.exit(2, f"{ap.prog}: runs Hopper kernels for a profiler, so it needs an H100 or H200\n")
dtype = getattr(torch, a.dtype)
q, k, v = make_qkv(a.B, a.H, a.Sq, a.D, dtype=dtype, Sk=a.Sk, Hkv=a.H_kv)
if a.stage == 6:
    from stages import stage6
    stage = lambda: stage6.attention(q, k, v, causal=a.causal)  # noqa: E731
else:
    from lib import fp8
    from stages import stage7
    q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
    vt = fp8.v_for_pv(v8)
    code = causal_mode(a.causal, a.Sq, a.Sk, stage7.INFO)
    stage = lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=a.Sk, causal=code,  # noqa: E731
                                   scale=a.D ** -0.5, out_dtype=dtype)
run_for_profiler([stage] if a.no_sdpa else [stage, sdpa_call(q, k, v, causal=a.causal)])
print("profiled:", a)
