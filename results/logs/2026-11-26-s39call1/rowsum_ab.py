"""Stage 7's ROW_SUM_MMA (each row's sum of P from P·V, through a row of ones under Vᵀ) against
the default in the same interleaved rounds, at the standard shapes, each variant checked
against its emulation first (l of the rounded P where the row sums come from P·V). Also with
one and two eighths of the exponentials on the FMA pipes, which lost 4-13% in session 38
(-s38call3) while the FADDs of the row sums shared those pipes' issue slots.

Predicted (not measured): at D64, where the exponential unit sets the pace and the FADDs are
13% of the instructions (Nsight Compute, -s38call4), 1-4%; at D128, 0-2%."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage7 as s7

OPTIONS = {"default": {}, "row sums by P·V": {"row_sum_mma": True},
           "row sums by P·V + exp2 poly 1/8": {"row_sum_mma": True, "exp2_poly": 1},
           "row sums by P·V + exp2 poly 2/8": {"row_sum_mma": True, "exp2_poly": 2}}
for B, H, S, D in [(16, 16, 2048, 64), (4, 16, 8192, 128)]:
    for causal in (False, True):
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        prepared = fp8.prepare(q, k, v)
        q8, k8, v8, qd, kd, vd = prepared
        vt = fp8.v_for_pv(v8)
        code = causal_mode(causal, S, S, s7.INFO)
        fns, ok = {}, {}
        for name, opts in OPTIONS.items():
            fn = (lambda opts=opts: s7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                               out_dtype=torch.bfloat16, **opts))
            c = fp8.check_on_emulation(fn(), *prepared, causal=causal, key_tile=s7.TILES[D][0],
                                       sum_rounded=opts.get("row_sum_mma", False))
            ok[name] = f"{'pass' if c['passed'] else 'FAIL'} (worst {c['worst']:.2f}, rmse {c['rmse_ratio']:.2f})"
            fns[name] = fn
        t = time_interleaved(fns, budget_s=0.5)
        base = t["default"].median_us
        flops = attention_flops(B, H, S, S, D, causal)
        for name in OPTIONS:
            us = t[name].median_us
            rounds = ", ".join(f"{base_r / r:.3f}" for base_r, r in zip(t["default"].round_medians_us, t[name].round_medians_us))
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} {name}: {us:,.1f} µs, "
                  f"{flops / us / 1e6:.0f} TFLOPS, {base / us:.3f}x default (rounds {rounds}); check {ok[name]}",
                  flush=True)
