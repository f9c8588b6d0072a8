"""EARLY_S (each work tile's epilogue run under the next work tile's first S = Q·Kᵀ, O / l
packed to 16 bits before that S is issued) against the launch as called, in pairs in both
orders; each pair's outputs compared bit for bit first (at D128 short prompts the launch as
called carries its last P·V instead, CARRY_PV, which EARLY_S replaces: not the same order of
products, so checked against the reference instead).

Predicted (Nsight Compute at D64 causal S512, call 1: 6.5% of the consumers' stall samples in
the epilogue, 9.5% at a work tile's first S, both consumers waiting together): 3-6% at D64 causal
S 512 and 1024 (work tiles of 1-8 key tiles), less at D128 S 512-1024 where the carried P·V
already fills part of the gap (0-3%), and at S 2048 (0-2%)."""
import torch

from lib.inputs import make_qkv
from lib.reference import check_output
from lib.timing import time_interleaved
from stages import stage6 as s6

for B, H, Hk, S, D, causal in [(32, 16, 16, 512, 64, True), (32, 16, 4, 512, 64, True), (16, 16, 16, 1024, 64, True),
                               (16, 16, 4, 1024, 64, True), (32, 32, 32, 512, 128, True), (32, 32, 8, 512, 128, True),
                               (16, 32, 32, 1024, 128, True), (32, 32, 32, 512, 128, False), (16, 32, 32, 1024, 128, False),
                               (8, 32, 32, 2048, 128, True), (8, 32, 32, 2048, 128, False)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, Hkv=Hk)
    fns = {"as called": lambda: s6.attention(q, k, v, causal=causal),
           "early S": lambda: s6.attention(q, k, v, causal=causal, carry_pv=False, early_s=True)}
    a, b = fns["as called"](), fns["early S"]()
    same = torch.equal(a, b)
    ok = check_output(b, q, k, v, causal=causal).passed
    for order in (("as called", "early S"), ("early S", "as called")):
        t = time_interleaved({n: fns[n] for n in order}, budget_s=0.4)
        x, y = t["as called"], t["early S"]
        rounds = ", ".join(f"{u / w:.3f}" for u, w in zip(x.round_medians_us, y.round_medians_us))
        print(f"B{B} H{H}/{Hk} S{S} D{D} {'causal' if causal else 'full'} order {order[0]} first: as called "
              f"{x.median_us:,.1f} µs, early S {y.median_us:,.1f} µs: {x.median_us / y.median_us:.3f}x "
              f"(rounds {rounds}); same bits {same}, check {'passed' if ok else 'FAILED'}", flush=True)
