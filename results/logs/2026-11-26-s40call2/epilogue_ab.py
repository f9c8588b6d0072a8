"""Stage 6's epilogue as committed (stmatrix into the Q buffer, O zeroed only where a work tile's
rows see no key) against the sources before it (`before`: the working tree with
stage6_epilogue.patch reverted, copied to /tmp/before by gpu_call.sh and imported as a module of
its own), in pairs in both orders; each pair's outputs compared bit for bit first.

Predicted (Nsight Compute at D64 causal S512, call 1: the epilogue 191 instructions a work tile
per warp, 6.5% of the consumers' stall samples; about 80 of them go): 1-3% at D64 causal S 512
and 1024, where work tiles are 1-8 key tiles; less at S 2048 and at D128; level at the long
shape and at B1 H8 S512 (their launches keep the plain stores: one Q buffer, or one work tile
per block)."""
import importlib.util
import sys

import torch

from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage6 as after

spec = importlib.util.spec_from_file_location("stage6_before", "/tmp/before/stage6_before.py")
before = importlib.util.module_from_spec(spec)
sys.modules["stage6_before"] = before
spec.loader.exec_module(before)
assert before.SOURCE.name == "stage6_before.cu" and before.SOURCE.read_text() != after.SOURCE.read_text()

for B, H, Hk, S, D, causal in [(32, 16, 16, 512, 64, True), (32, 16, 4, 512, 64, True), (16, 16, 16, 1024, 64, True),
                               (32, 16, 16, 512, 64, False), (16, 16, 16, 1024, 64, False),
                               (8, 16, 16, 2048, 64, True), (32, 32, 32, 512, 128, True),
                               (32, 32, 32, 512, 128, False), (2, 32, 32, 8192, 128, False), (1, 8, 8, 512, 64, False)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, Hkv=Hk)
    fns = {"before": lambda: before.attention(q, k, v, causal=causal),
           "after": lambda: after.attention(q, k, v, causal=causal)}
    same = torch.equal(fns["before"](), fns["after"]())
    for order in (("before", "after"), ("after", "before")):
        t = time_interleaved({n: fns[n] for n in order}, budget_s=0.5)
        a, b = t["before"], t["after"]
        rounds = ", ".join(f"{x / y:.3f}" for x, y in zip(a.round_medians_us, b.round_medians_us))
        print(f"B{B} H{H}/{Hk} S{S} D{D} {'causal' if causal else 'full'} order {order[0]} first: before "
              f"{a.median_us:,.1f} µs, after {b.median_us:,.1f} µs: {a.median_us / b.median_us:.3f}x "
              f"(rounds {rounds}); same bits {same}", flush=True)
