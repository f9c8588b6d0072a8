"""One backward of stage 8 (and, unless --no-sdpa, one of SDPA's default backend) at a shape, for
a profiler: every kernel between the warm-ups' end and the profiler's stop. The WGMMA build's
switches are arguments, so each build can be profiled on its own.

    ncu --profile-from-start off --clock-control none --set full \\
        python experiments/profile_backward/profile_backward.py 2 16 4096 128 --warpgroups 2 --dq-atomics 1
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

from lib.inputs import make_qkv  # noqa: E402
from lib.ncu import run_for_profiler  # noqa: E402
from lib.timing import sdpa_backward_call  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
for name in ("B", "H", "S", "D"):
    ap.add_argument(name, type=int)
ap.add_argument("--causal", action="store_true")
ap.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
ap.add_argument("--warpgroups", type=int, default=None)
ap.add_argument("--dq-atomics", type=int, default=None)
ap.add_argument("--dq-bulk", type=int, default=None)
ap.add_argument("--tma-loads", type=int, default=None)
ap.add_argument("--no-sdpa", action="store_true", help="profile stage 8 alone")
a = ap.parse_args()
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    ap.exit(2, f"{ap.prog}: runs Hopper kernels for a profiler, so it needs an H100 or H200\n")
from stages import stage5, stage8  # noqa: E402

q, k, v = make_qkv(a.B, a.H, a.S, a.D, dtype=getattr(torch, a.dtype))
dout = torch.randn_like(q)
lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
out = stage5.attention(q, k, v, causal=a.causal, lse=lse)
calls = [lambda: stage8.attention_backward(q, k, v, out, dout, lse, causal=a.causal, wgmma=1,
                                           warpgroups=a.warpgroups, dq_atomics=a.dq_atomics,
                                           dq_bulk=a.dq_bulk, tma_loads=a.tma_loads)]
if not a.no_sdpa:
    calls.append(sdpa_backward_call(q, k, v, dout, causal=a.causal))
run_for_profiler(calls)
print("profiled:", a)
