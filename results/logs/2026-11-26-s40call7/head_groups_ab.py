"""Causal work handed out longest first across groups of heads (head_groups=True: every head's
heaviest query block of a group of heads whose K and V fill a quarter of the L2, then every
head's next, ...) against the per-head order (head_groups=False: each head's query blocks,
heaviest first, one head after another), same build, in pairs in both orders; outputs compared bit
for bit first.

Predicted (Nsight Compute at D64 causal S512, call 1: the SMs' busy cycles spread over 113-131k,
about one heavy work tile, and the kernel ends with the last SM): 2-5% at D64 causal S 512-1024,
where work tiles run 1-4 and 1-8 key tiles; about as much at D128 S 512-1024; less at S 2048
(more work tiles per SM, 3 consumers at D64)."""
import torch

from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage6 as s6

for B, H, Hk, S, D in [(32, 16, 16, 512, 64), (32, 16, 4, 512, 64), (16, 16, 16, 1024, 64), (16, 16, 4, 1024, 64),
                       (8, 16, 16, 2048, 64), (32, 32, 32, 512, 128), (32, 32, 8, 512, 128), (16, 32, 32, 1024, 128),
                       (8, 32, 32, 2048, 128)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, Hkv=Hk)
    fns = {"per head": lambda: s6.attention(q, k, v, causal=True, head_groups=False),
           "head groups": lambda: s6.attention(q, k, v, causal=True, head_groups=True)}
    same = torch.equal(fns["per head"](), fns["head groups"]())
    key = next(k for k in s6._plans if k[0] == q.shape and k[-1] is True)
    group = int(s6._plans[key].args[-1])
    for order in (("per head", "head groups"), ("head groups", "per head")):
        t = time_interleaved({n: fns[n] for n in order}, budget_s=0.4)
        a, b = t["per head"], t["head groups"]
        rounds = ", ".join(f"{x / y:.3f}" for x, y in zip(a.round_medians_us, b.round_medians_us))
        print(f"B{B} H{H}/{Hk} S{S} D{D} causal, groups of {group} of {B * H} heads, order {order[0]} first: per head "
              f"{a.median_us:,.1f} µs, head groups {b.median_us:,.1f} µs: {a.median_us / b.median_us:.3f}x "
              f"(rounds {rounds}); same bits {same}", flush=True)
