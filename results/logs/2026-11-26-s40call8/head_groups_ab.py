"""Call 7's head groups again, now mapped by the producer alone (the consumers decode the index it
publishes, as before: call 7's group decode in every thread made the builds with the carried P·V
spill), and with three group sizes: heads whose K and V fill 1/4, 1/16 and 1/64 of the L2. Each
against the per-head order in the same build, in pairs in both orders; outputs compared bit for
bit. Call 7 (quarter of the L2, decode in every thread): +1.4% and +4.5% at D64 causal S 512 and
1024 with 4 K/V heads, -3% and level with 16, -2.6% at S 2048, -2.5 to -4% at D128.
Predicted: the D64 GQA gains stay; smaller groups lose less where call 7 lost (a group's K and V
nearer the SMs' own L2 half)."""
import torch

from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage6 as s6

for B, H, Hk, S, D in [(32, 16, 16, 512, 64), (32, 16, 4, 512, 64), (16, 16, 16, 1024, 64), (16, 16, 4, 1024, 64),
                       (8, 16, 16, 2048, 64), (32, 32, 32, 512, 128), (32, 32, 8, 512, 128), (16, 32, 32, 1024, 128)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, Hkv=Hk)
    fns = {share: (lambda share=share: s6.attention(q, k, v, causal=True, head_groups=share)) for share in (0, 4, 16, 64)}
    ref = fns[0]()
    same = all(torch.equal(ref, fns[x]()) for x in (4, 16, 64))
    for share in (4, 16, 64):
        group = s6.head_group_for(True, True, S, D, H // Hk, s6._l2_bytes(q.device), share)
        for order in ((0, share), (share, 0)):
            t = time_interleaved({n: fns[n] for n in order}, budget_s=0.3)
            a, b = t[0], t[share]
            print(f"B{B} H{H}/{Hk} S{S} D{D} causal, 1/{share} of L2: groups of {group} of {B * H} heads, "
                  f"{'per head' if order[0] == 0 else 'groups'} first: per head {a.median_us:,.1f} µs, groups "
                  f"{b.median_us:,.1f} µs: {a.median_us / b.median_us:.3f}x; same bits {same}", flush=True)
