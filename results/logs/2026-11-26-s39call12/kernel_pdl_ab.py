"""Call 11 found stage 7's whole call at B4 H16 S8192 D128 level with PDL (1.001-1.002x in both
orders): call 8-10's 0.94-0.98x was the place in a round of seven callables. That call's PDL
was the cast's only (the rule, stage7.kernel_pdl, leaves a persistent launch without it). Here
the attention kernel forced to PDL too (pdl=True) against none, in both orders. Predicted:
level (a persistent launch of 2.6 ms has a microsecond to gain)."""
import torch

from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage7

B, H, S, D = 4, 16, 8192, 128
for causal in (False, True):
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    both = lambda: stage7.attention(q, k, v, causal=causal, pdl=True)  # noqa: E731
    none = lambda: stage7.attention(q, k, v, causal=causal, pdl=False)  # noqa: E731
    for order in (("PDL", "no PDL"), ("no PDL", "PDL")):
        t = time_interleaved({n: both if n == "PDL" else none for n in order}, budget_s=0.5)
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}, order {order[0]} then {order[1]}: "
              f"PDL on both kernels {t['PDL'].median_us:,.1f} µs, no PDL {t['no PDL'].median_us:,.1f} µs, "
              f"{t['no PDL'].median_us / t['PDL'].median_us:.3f}x", flush=True)
