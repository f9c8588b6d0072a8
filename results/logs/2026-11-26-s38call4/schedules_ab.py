"""Call 3's schedules again (options_ab.py there), twice the timing per callable, to settle
whether stage 7 should run without ping-pong: in call 3 "work queue without ping-pong" ran 1.034x
the default at D64 full and 1.033x at D128 causal, "overlap without ping-pong" 1.029x at D128
full, each once. A rule is adopted only if this run repeats it."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage7 as s7

OPTIONS = {"default": {},
           "+ persistent blocks": {"schedule": "+ persistent blocks"}, "+ work queue": {"schedule": "+ work queue"},
           "work queue without ping-pong": {"schedule": "work queue without ping-pong"},
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
        t = time_interleaved(fns, budget_s=0.6)
        base = t["default"].median_us
        flops = attention_flops(B, H, S, S, D, causal)
        for name in OPTIONS:
            us = t[name].median_us
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} {name}: {us:,.1f} µs, "
                  f"{flops / us / 1e6:.0f} TFLOPS, {base / us:.3f}x default; check {'pass' if ok[name] else 'FAIL'}",
                  flush=True)
