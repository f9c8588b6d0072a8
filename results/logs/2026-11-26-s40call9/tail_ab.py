"""The work queue handing only its last work tiles out longest first: the heads of the last
waves·SMs tiles, every one's heaviest query block, then every one's next, ...; before them heads
one after another as before (tail_waves: 1, 2, 4 waves of SMs). Each against the plain order
(tail_waves=0) in the same build, in pairs in both orders; outputs compared bit for bit.

Calls 7-8 ordered the whole queue so, in groups of heads, and gained at D64 causal with GQA 4:1
(+3.5% at S 512, +5.7% at S 1024, in groups of 400 and 200 heads) but lost where the groups were
many (-2% at MHA S 512 in groups of 100, -2.6 to -3.2% at D128): each group's light tiles run
together. Predicted: at D64 causal S 512-1024 most of the large groups' gain (the queue ends on
light tiles) without their loss, 2-5% with two waves, MHA and GQA alike; less at S 2048 and D128."""
import torch

from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage6 as s6

sms = torch.cuda.get_device_properties(0).multi_processor_count
for B, H, Hk, S, D in [(32, 16, 16, 512, 64), (32, 16, 4, 512, 64), (16, 16, 16, 1024, 64), (16, 16, 4, 1024, 64),
                       (8, 16, 16, 2048, 64), (32, 32, 32, 512, 128), (32, 32, 8, 512, 128), (16, 32, 32, 1024, 128),
                       (8, 32, 32, 2048, 128)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, Hkv=Hk)
    fns = {w: (lambda w=w: s6.attention(q, k, v, causal=True, tail_waves=w)) for w in (0, 1, 2, 4)}
    ref = fns[0]()
    same = all(torch.equal(ref, fns[w]()) for w in (1, 2, 4))
    plan = next(p for key, p in s6._plans.items() if key[0] == q.shape and key[-1] == 2)
    for w in (1, 2, 4):
        for order in ((0, w), (w, 0)):
            t = time_interleaved({n: fns[n] for n in order}, budget_s=0.3)
            a, b = t[0], t[w]
            print(f"B{B} H{H}/{Hk} S{S} D{D} causal, tail of {w} wave(s) (2 waves: {int(plan.args[-1])} of {B * H} heads), "
                  f"{'plain' if order[0] == 0 else 'tail'} first: plain {a.median_us:,.1f} µs, tail {b.median_us:,.1f} µs: "
                  f"{a.median_us / b.median_us:.3f}x; same bits {same}", flush=True)
