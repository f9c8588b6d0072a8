"""Session 34, call 15: the four prefill rows still under 0.95x SDPA (D64 causal S512-1024, bf16,
B·S = 16k, 16 and 4 K/V heads), against the launch as chosen at f098bb7 ((128, 4, 2), three Q
buffers, the work queue without ping-pong), in the same interleaved rounds: the carried P·V, the
work queue with ping-pong, and an eighth or a quarter of the exponentials on the FMA pipes
(EXP2_POLY_EIGHTHS; MUFU instructions held 15% of the consumers' samples at S512 in call 2's
profile, mostly waiting). Logs only. Outputs checked against the float64 reference first."""
import torch
import stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import check_output
from lib.timing import sdpa_call, time_interleaved

for B, H, Hk, S in [(32, 16, 16, 512), (32, 16, 4, 512), (16, 16, 16, 1024), (16, 16, 4, 1024)]:
    q, k, v = make_qkv(B, H, S, 64, Hkv=Hk, dtype=torch.bfloat16)
    fns = {"as chosen": lambda: s6.attention(q, k, v, causal=True),
           "carry": lambda: s6.attention(q, k, v, causal=True, carry_pv=True),
           "queue pp": lambda: s6.attention(q, k, v, causal=True, schedule="+ work queue", tiles=(128, 4, 2), q_stages=3),
           "poly 1/8": lambda: s6.attention(q, k, v, causal=True, exp2_poly=1),
           "poly 2/8": lambda: s6.attention(q, k, v, causal=True, exp2_poly=2)}
    ok = {n: check_output(f(), q, k, v, causal=True).passed for n, f in fns.items()}
    t = time_interleaved({**fns, "SDPA": sdpa_call(q, k, v, causal=True)}, budget_s=0.4)
    us = {n: x.median_us for n, x in t.items()}
    base = us["as chosen"]
    print(f"B{B} H{H}/{Hk} S{S} D64 causal: " + ", ".join(f"{n} {us[n]:.1f} ({base / us[n]:.3f}x{'' if ok[n] else ' FAIL'})" for n in fns)
          + f"; SDPA {us['SDPA']:.1f} -> as chosen {us['SDPA'] / base:.3f}x", flush=True)
