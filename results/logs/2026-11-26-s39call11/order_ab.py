"""Is call 10's 0.95x for stage 7's whole call with PDL at B4 H16 S8192 D128 the order of the
rounds? The H100 draws up to its 700 W limit there (call 1's smi.csv), and in call 10 the two
kernel-only entries, both launched without PDL, differed by 3% (2,234 against 2,307 µs) with
only their place in the round between them. Here the whole call with and without PDL in both
orders, each pair timed alone, full and causal. Predicted: if it is the order, whichever runs
first in the round is faster by a few percent whatever its launch."""
import torch

from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage7

B, H, S, D = 4, 16, 8192, 128
for causal in (False, True):
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    pdl = lambda: stage7.attention(q, k, v, causal=causal)  # noqa: E731
    none = lambda: stage7.attention(q, k, v, causal=causal, pdl=False)  # noqa: E731
    for order in (("PDL", "no PDL"), ("no PDL", "PDL")):
        fns = {n: pdl if n == "PDL" else none for n in order}
        t = time_interleaved(fns, budget_s=0.5)
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}, order {order[0]} then {order[1]}: "
              f"PDL {t['PDL'].median_us:,.1f} µs, no PDL {t['no PDL'].median_us:,.1f} µs, "
              f"PDL {t['no PDL'].median_us / t['PDL'].median_us:.3f}x no PDL", flush=True)
