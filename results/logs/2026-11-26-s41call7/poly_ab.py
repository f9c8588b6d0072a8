"""Stage 7's exponentials partly on the FMA pipes (exp2_poly: eighths of each tile's columns by
the degree-4 polynomial instead of MUFU.EX2) at small shares, against none, kernel alone
(stage7.forward on prepared inputs), all in the same interleaved rounds, both orders.

Half of them (exp2_poly 4) ran 10-22% slower (the stage 7 notebook, §8: the FMA pipes are not
idle in this softmax). At D64 the exponential unit is 68% busy and sets the pace (Nsight
Compute, results/logs/2026-11-26-s39call14); an eighth or a quarter moves 12.5% or 25% of its
work for about ten FMA-pipe instructions each. Predicted: an eighth 0-3% faster at D64, a quarter
level or slower; level or slower at D128 (more tensor-bound)."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage7 as s7

for B, H, S, D, causal, polys in [(16, 16, 2048, 64, False, (0, 1, 2)), (16, 16, 2048, 64, True, (0, 1, 2)),
                                  (4, 16, 8192, 128, False, (0, 1)), (4, 16, 8192, 128, True, (0, 1))]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
    vt = fp8.v_for_pv(v8)
    code = causal_mode(causal, S, S, s7.INFO)
    fns = {n: (lambda n=n: s7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                      out_dtype=torch.bfloat16, exp2_poly=n)) for n in polys}
    ref = fns[0]()
    diffs = {n: float((fns[n]().float() - ref.float()).abs().max()) for n in polys[1:]}
    flops = attention_flops(B, H, S, S, D, causal)
    for order in (polys, polys[::-1]):
        t = time_interleaved({n: fns[n] for n in order}, budget_s=0.5)
        base = t[0].median_us
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} order {order}: " + "; ".join(
            f"poly {n}/8 {t[n].median_us:,.1f} µs ({flops / t[n].median_us / 1e6:.0f} TFLOPS, {base / t[n].median_us:.3f}x"
            + (f", max |diff| {diffs[n]:.1e}" if n else "") + ")" for n in polys), flush=True)
