"""One call of a stage at a standard shape, for a profiler to look at (repository root):

    ncu --section SpeedOfLight -k regex:attention python -m lib.one_call 2 throughput
"""
import argparse

import torch

import stages
from lib.bench import STANDARD_SHAPES
from lib.inputs import make_qkv
from lib.simulator import HAS_GPU

ap = argparse.ArgumentParser(prog="python -m lib.one_call", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
ap.add_argument("stage", type=int, choices=stages.NUMBERS)
ap.add_argument("shape", choices=[s[0] for s in STANDARD_SHAPES])
ap.add_argument("--causal", action="store_true")
ap.add_argument("--no-swizzle", action="store_true", help="stage 5 with plain shared-memory rows")
ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
a = ap.parse_args()
if not HAS_GPU:
    ap.exit(2, f"{ap.prog}: runs a kernel for a profiler, so it needs a CUDA GPU and none "
               "was found\n")
_, B, H, S, D = next(s for s in STANDARD_SHAPES if s[0] == a.shape)
q, k, v = make_qkv(B, H, S, D, dtype=getattr(torch, a.dtype))
kw = {"swizzle": False} if a.no_swizzle else {}
stages.get(a.stage).attention(q, k, v, causal=a.causal, **kw)
torch.cuda.synchronize()
