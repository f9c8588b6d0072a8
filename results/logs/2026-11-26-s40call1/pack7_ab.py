"""Stage 7's PACK_IN_SOFTMAX against the build without, kernel alone (stage7.forward on prepared
inputs), timed in pairs in both orders; each build's output compared bit for bit first.

The change: in the key-tile loop the previous P·V is waited for between the tile's row maxima
and its exponentials, so P's casts to e4m3 (F2FP, 32 a tile per thread at D64, 48 at D128 with
the byte packing) are interleaved with the MUFU.EX2 stream instead of running after it.
Predicted (Nsight Compute, results/logs/2026-11-26-s39call14: exponential unit 68% busy at D64,
the casts 7.6% of the instructions, all after the last exponential): 2-5% at B16 H16 S2048 D64,
0-2% at D128 S8192 (tensor-bound, the casts a smaller share); level at B1 H8 S512 D64 (blocks of
one consumer, nobody to fill the unit's gaps)."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage7 as s7

for B, H, S, D in [(16, 16, 2048, 64), (4, 16, 8192, 128), (1, 8, 512, 64)]:
    for causal in (False, True):
        if B == 1 and causal:
            continue
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
        vt = fp8.v_for_pv(v8)
        code = causal_mode(causal, S, S, s7.INFO)
        fns = {name: (lambda pk=pk: s7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                               out_dtype=torch.bfloat16, pack_in_softmax=pk))
               for name, pk in (("without", False), ("pack", True))}
        same = torch.equal(fns["without"](), fns["pack"]())
        flops = attention_flops(B, H, S, S, D, causal)
        for order in (("without", "pack"), ("pack", "without")):
            t = time_interleaved({n: fns[n] for n in order}, budget_s=0.5)
            a, b = t["without"], t["pack"]
            rounds = ", ".join(f"{x / y:.3f}" for x, y in zip(a.round_medians_us, b.round_medians_us))
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} order {order[0]} first: without "
                  f"{a.median_us:,.1f} µs ({flops / a.median_us / 1e6:.0f} TFLOPS), pack {b.median_us:,.1f} µs "
                  f"({flops / b.median_us / 1e6:.0f} TFLOPS): {a.median_us / b.median_us:.3f}x (rounds {rounds}); "
                  f"same bits {same}", flush=True)
