"""Issue 21: stage 6's split kernel launched with programmatic dependent launch too (PDL_KERNEL:
its launch and blocks' start overlap the end of the kernel before it, here the harness's L2
flush), against PDL on the combine kernel only (call 4's step) and no PDL, with SDPA's default
backend, same interleaved rounds, at the decoding rows still under SDPA after call 4 (unsplit,
or combined in the block), the latency shape and two prefill rows. Each output checked against
SDPA first. Predicted (not measured): under a microsecond saved, so 1.00-1.02x at the 60-200 µs
decoding rows, up to 1.05x at the 10 µs ones, nothing at the long prefill row."""
import statistics

import torch
import torch.nn.functional as F

from lib.inputs import make_qkv
from lib.timing import sdpa_call, time_interleaved
from stages import stage6 as s6

ROWS = [  # (B, H, H_kv, Sq, Sk, D, causal)
    (64, 32, 8, 1, 1024, 128, False), (64, 32, 8, 1, 32768, 128, False), (8, 32, 8, 1, 32768, 64, False),
    (64, 32, 8, 1, 1024, 64, False), (64, 32, 8, 1, 4096, 64, False), (64, 32, 8, 1, 32768, 64, False),
    (64, 8, 1, 1, 32768, 64, False), (8, 8, 1, 1, 4096, 64, False), (1, 8, 1, 1, 1024, 128, False),
    (1, 8, 8, 512, 512, 64, False), (32, 16, 16, 512, 512, 64, True), (4, 32, 32, 8192, 8192, 128, False)]
VARIANTS = {"PDL both": None, "PDL combine": "combine", "no PDL": False}
gains = []
for B, H, Hkv, Sq, Sk, D, causal in ROWS:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    fns = {}
    for name, pdl in VARIANTS.items():
        fn = (lambda pdl=pdl: s6.attention(q, k, v, causal=causal, pdl=pdl))
        err = float((fn().float() - ref.float()).abs().max())
        assert err < 2e-2, (B, H, Hkv, Sq, Sk, D, name, err)
        fns[name] = fn
    fns["SDPA default"] = sdpa_call(q, k, v, causal=causal)
    t = time_interleaved(fns, budget_s=0.3)
    sd = t["SDPA default"].median_us
    us = {n: t[n].median_us for n in VARIANTS}
    gains.append(us["PDL combine"] / us["PDL both"])
    print(f"B{B} H{H}/{Hkv} Sq{Sq} Sk{Sk} D{D}{' causal' if causal else ''}: "
          + ", ".join(f"{n} {u:.1f} µs ({sd / u:.3f}x SDPA)" for n, u in us.items())
          + f"; SDPA {sd:.1f} µs; both over combine only {us['PDL combine'] / us['PDL both']:.3f}x", flush=True)
print(f"PDL on the split kernel too, over the combine only: median {statistics.median(gains):.3f}x, "
      f"range {min(gains):.3f}-{max(gains):.3f}x over {len(gains)} rows")
