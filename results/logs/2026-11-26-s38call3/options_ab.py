"""Stage 7's other switches at the standard shapes, now that D128 runs 192-key tiles: a share of
the exponentials on the FMA pipes (exp2_poly 1 and 2 eighths; 4 was 15-20% slower in the
record), and the schedules (ping-pong of the products, of the softmax, none; fixed-stride
persistent blocks or the work queue), each against the default in the same interleaved rounds,
checked against the emulation first. Predicted (not measured): at D64, where the count says the
exponential unit sets the pace, one eighth on the FMA pipes could gain a few percent; at D128,
whose products and exponentials now take about as long per tile, nothing should."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage7 as s7

OPTIONS = {"default": {}, "exp2 poly 1/8": {"exp2_poly": 1}, "exp2 poly 2/8": {"exp2_poly": 2},
           "+ persistent blocks": {"schedule": "+ persistent blocks"}, "+ work queue": {"schedule": "+ work queue"},
           "work queue without ping-pong": {"schedule": "work queue without ping-pong"},
           "softmax ping-pong": {"schedule": "softmax ping-pong"},
           "overlap without ping-pong": {"schedule": "overlap without ping-pong"}}
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
            ok[name] = fp8.check_on_emulation(fn(), *prepared, causal=causal, key_tile=s7.TILES[D][0])["passed"]
            fns[name] = fn
        t = time_interleaved(fns, budget_s=0.3)
        base = t["default"].median_us
        flops = attention_flops(B, H, S, S, D, causal)
        for name in OPTIONS:
            us = t[name].median_us
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} {name}: {us:,.1f} µs, "
                  f"{flops / us / 1e6:.0f} TFLOPS, {base / us:.3f}x default; check {'pass' if ok[name] else 'FAIL'}",
                  flush=True)
