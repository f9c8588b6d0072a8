"""Stage 7 at D64 with its row sums by P·V (three consumers, 128-key tiles): ring depth and Q
buffers against the default (128, 3, 3) in the same interleaved rounds, each checked first.
fp8_tiles.py compares the widths without the row sums; with them the consumers' softmaxes are
shorter, so the ring may now run dry sooner (depth 4) or have a stage to spare (depth 2).
Predicted (not measured): within 2% either way."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage7 as s7

OPTIONS = {"(128, 3, 3) default": {}, "(128, 2, 3)": {"tiles": (128, 2, 3)}, "(128, 4, 3)": {"tiles": (128, 4, 3)},
           "(128, 3, 3), one Q buffer": {"q_stages": 1}}
B, H, S, D = 16, 16, 2048, 64
sms = torch.cuda.get_device_properties(0).multi_processor_count
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
        build = s7.emulation_of(B, H, S, S, D, causal, sms, tiles=opts.get("tiles"))
        ok[name] = fp8.check_on_emulation(fn(), *prepared, causal=causal, **build)["passed"]
        fns[name] = fn
    t = time_interleaved(fns, budget_s=0.5)
    base = t["(128, 3, 3) default"].median_us
    for name in OPTIONS:
        us = t[name].median_us
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} {name}: {us:,.1f} µs, "
              f"{attention_flops(B, H, S, S, D, causal) / us / 1e6:.0f} TFLOPS, {base / us:.3f}x default; "
              f"check {'pass' if ok[name] else 'FAIL'}", flush=True)
