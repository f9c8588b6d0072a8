"""Stage 7's launch rule (the work queue without ping-pong wherever work tiles outnumber the SMs)
at shapes outside the standard ones, against what stage 6's rule picks there, same rounds:
D64 causal S8192, where stage 6 in bf16 found one block per work tile faster than its queue,
and D128 S2048 full and causal."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.timing import time_interleaved
from stages import stage6 as s6, stage7 as s7

sms = torch.cuda.get_device_properties(0).multi_processor_count
for B, H, S, D, causal in [(4, 16, 8192, 64, True), (16, 16, 2048, 128, False), (16, 16, 2048, 128, True)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    prepared = fp8.prepare(q, k, v)
    q8, k8, v8, qd, kd, vd = prepared
    vt = fp8.v_for_pv(v8)
    code = causal_mode(causal, S, S, s7.INFO)
    ch = s7.choose(B, H, S, S, D, causal, sms)
    stage6_pick = s6.call_schedule(D, causal, S, ch["work"], sms)
    fns = {}
    for name, sched in (("rule: " + ch["schedule"], None), ("stage 6's pick: " + stage6_pick, stage6_pick)):
        fn = (lambda sched=sched: s7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                             out_dtype=torch.bfloat16, schedule=sched))
        assert fp8.check_on_emulation(fn(), *prepared, causal=causal, key_tile=ch["tiles"][0])["passed"], name
        fns[name] = fn
    t = time_interleaved(fns, budget_s=0.4)
    a, b = (t[n].median_us for n in fns)
    print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: " + ", ".join(f"{n} {t[n].median_us:,.1f} µs" for n in fns)
          + f"; rule {b / a:.3f}x", flush=True)
