"""Stage 7 with stage7_half_max.patch (HALF_MAX: each key tile's first half of columns takes its
exponentials against the row max over that half and the tiles before, while the second half's
max is still being reduced by its shuffles; rows whose second half raises the max get their first
half scaled down by 2^(m1 - max) before the cast) against the build without, kernel alone
(stage7.forward on prepared inputs), in pairs in both orders; the two outputs compared first.

Why: at D64 the exponential unit sets the pace (Nsight Compute, results/logs/2026-11-26-s39call14:
MUFU 68% busy, 36% of the stall samples on MUFU.EX2, 0.85 eligible warps per scheduler), and each
tile's exponentials wait for the whole row's max: 32 FMNMX and two dependent shuffles. Predicted:
2-5% at B16 H16 S2048 D64, level or a little at D128 (more tensor-bound), level at B1 H8 S512 D64."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage7 as s7


def run(args, half):
    if s7.HALF_MAX[args[-1]] != half:
        s7.HALF_MAX[args[-1]] = half
        s7.config.cache_clear()
    q8, k8, vt, qd, kd, vd, S, code, D = args
    return s7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5, out_dtype=torch.bfloat16)


for B, H, S, D, causal in [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (4, 16, 8192, 128, False),
                           (4, 16, 8192, 128, True), (8, 16, 2048, 128, False), (1, 8, 512, 64, False)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
    args = (q8, k8, fp8.v_for_pv(v8), qd, kd, vd, S, causal_mode(causal, S, S, s7.INFO), D)
    fns = {name: (lambda h=h: run(args, h)) for name, h in (("without", False), ("half max", True))}
    diff = float((fns["without"]().float() - fns["half max"]().float()).abs().max())
    flops = attention_flops(B, H, S, S, D, causal)
    for order in (("without", "half max"), ("half max", "without")):
        t = time_interleaved({n: fns[n] for n in order}, budget_s=0.5)
        a, b = t["without"], t["half max"]
        rounds = ", ".join(f"{x / y:.3f}" for x, y in zip(a.round_medians_us, b.round_medians_us))
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} order {order[0]} first: without "
              f"{a.median_us:,.1f} µs ({flops / a.median_us / 1e6:.0f} TFLOPS), half max {b.median_us:,.1f} µs "
              f"({flops / b.median_us / 1e6:.0f} TFLOPS): {a.median_us / b.median_us:.3f}x (rounds {rounds}); "
              f"max |diff| {diff:.2e}", flush=True)
