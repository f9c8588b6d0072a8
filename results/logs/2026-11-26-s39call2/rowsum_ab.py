"""Call 1's comparison again, now that each P·V's row sums are moved into l in fp32
(take_row_sums): ROW_SUM_MMA against the build without, same interleaved rounds, at the standard
shapes, each checked against its own emulation first. Predicted: as call 1 (1.047x D64 full,
1.010x causal; 0.96-0.97x D128), less a little for the four instructions per tile it adds, and
now passing the emulation rule at D128 and D64 full."""
import torch

from lib import fp8
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage7 as s7

OPTIONS = {"without row sums by P·V": {"row_sum_mma": False}, "row sums by P·V": {"row_sum_mma": True}}
for B, H, S, D in [(16, 16, 2048, 64), (4, 16, 8192, 128), (1, 8, 512, 64)]:
    for causal in (False, True):
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        prepared = fp8.prepare(q, k, v)
        q8, k8, v8, qd, kd, vd = prepared
        vt = fp8.v_for_pv(v8)
        code = causal_mode(causal, S, S, s7.INFO)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        fns, ok = {}, {}
        for name, opts in OPTIONS.items():
            fn = (lambda opts=opts: s7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                               out_dtype=torch.bfloat16, **opts))
            c = fp8.check_on_emulation(fn(), *prepared, causal=causal, **s7.emulation_of(B, H, S, S, D, causal, sms, **opts))
            ok[name] = f"{'pass' if c['passed'] else 'FAIL'} (worst {c['worst']:.2f}, rmse {c['rmse_ratio']:.2f})"
            fns[name] = fn
        t = time_interleaved(fns, budget_s=0.5)
        base = t["without row sums by P·V"]
        flops = attention_flops(B, H, S, S, D, causal)
        for name in OPTIONS:
            x = t[name]
            rounds = ", ".join(f"{b / r:.3f}" for b, r in zip(base.round_medians_us, x.round_medians_us))
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} {name}: {x.median_us:,.1f} µs, "
                  f"{flops / x.median_us / 1e6:.0f} TFLOPS, {base.median_us / x.median_us:.3f}x without "
                  f"(rounds {rounds}); check {ok[name]}", flush=True)
