"""Stage 6 with stage6_pack.patch (PACK_IN_SOFTMAX: the previous P·V waited for between a tile's
row maxima and its exponentials, P's bf16 packs interleaved with MUFU.EX2) against the build
without, in pairs in both orders, at the shape map's lowest prefill rows (D64 causal S 512 and
1024, 0.93x SDPA in the record), D64 full S 512 and causal S 2048, D128 causal S 512 and the
long D128 shape; each pair's outputs compared bit for bit first.
Predicted: 1-3% at D64 (the packs are 5% of the executed instructions at D64 causal S 512,
results/logs/2026-11-26-s34call2), level at D128."""
import torch

from lib.inputs import make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage6 as s6


def call(q, k, v, causal, pack):
    if s6.PACK_IN_SOFTMAX != pack:
        s6.PACK_IN_SOFTMAX = pack
        s6.config.cache_clear()  # config is cached; the plan key carries the switch
    return s6.attention(q, k, v, causal=causal)


for B, H, Hk, S, D, causal in [(32, 16, 16, 512, 64, True), (32, 16, 4, 512, 64, True), (16, 16, 16, 1024, 64, True),
                               (32, 16, 16, 512, 64, False), (8, 16, 16, 2048, 64, True),
                               (32, 32, 32, 512, 128, True), (2, 32, 32, 8192, 128, False)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, Hkv=Hk)
    fns = {name: (lambda pk=pk: call(q, k, v, causal, pk)) for name, pk in (("without", False), ("pack", True))}
    same = torch.equal(fns["without"](), fns["pack"]())
    flops = attention_flops(B, H, S, S, D, causal)
    for order in (("without", "pack"), ("pack", "without")):
        t = time_interleaved({n: fns[n] for n in order}, budget_s=0.5)
        a, b = t["without"], t["pack"]
        rounds = ", ".join(f"{x / y:.3f}" for x, y in zip(a.round_medians_us, b.round_medians_us))
        print(f"B{B} H{H}/{Hk} S{S} D{D} {'causal' if causal else 'full'} order {order[0]} first: without "
              f"{a.median_us:,.1f} µs, pack {b.median_us:,.1f} µs: {a.median_us / b.median_us:.3f}x "
              f"(rounds {rounds}); same bits {same}", flush=True)
