"""Stage 7's work queue with stage 6's tail order (its last two waves of causal work tiles handed
out longest first) against the plain order, kernel alone (stage7.forward on prepared inputs), in
pairs in both orders; outputs compared bit for bit. Stage 6 gained 1.035-1.083x at D64 causal
S512-2048 and 1.009-1.030x at D128 with it (call 9). Predicted: about as much at stage 7's D64
causal S2048 (2,816 work tiles of 1-11 key tiles), 1-2% at D128 causal S8192 (4,096 work tiles,
more per SM)."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage7 as s7

for B, H, S, D in [(16, 16, 2048, 64), (4, 16, 8192, 128), (32, 16, 512, 64), (16, 16, 1024, 64), (8, 16, 2048, 128)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
    vt = fp8.v_for_pv(v8)
    code = causal_mode(True, S, S, s7.INFO)
    fns = {w: (lambda w=w: s7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                      out_dtype=torch.bfloat16, tail_waves=w)) for w in (0, 2)}
    same = torch.equal(fns[0](), fns[2]())
    flops = attention_flops(B, H, S, S, D, True)
    for order in ((0, 2), (2, 0)):
        t = time_interleaved({n: fns[n] for n in order}, budget_s=0.5)
        a, b = t[0], t[2]
        print(f"B{B} H{H} S{S} D{D} causal, {'plain' if order[0] == 0 else 'tail'} first: plain {a.median_us:,.1f} µs "
              f"({flops / a.median_us / 1e6:.0f} TFLOPS), tail {b.median_us:,.1f} µs ({flops / b.median_us / 1e6:.0f} TFLOPS): "
              f"{a.median_us / b.median_us:.3f}x; same bits {same}", flush=True)
