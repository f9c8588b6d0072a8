"""Issue 21: split-KV's combine kernel launched with programmatic dependent launch (PDL_COMBINE,
the default now) against the same launch without it, and SDPA's default backend, in the same
interleaved rounds (L2 flushed before each run, as the shape map times), at every decoding
row of the shape map whose partial rows go to the combine kernel (Sq 1, and two of Sq 4).
Each output checked against SDPA first. Predicted (not measured): about a microsecond saved
per call, the gap between the two kernels: 1.05-1.1x at the 11-15 µs rows, little at the
40-65 µs ones."""
import statistics

import torch
import torch.nn.functional as F

from lib.inputs import make_qkv
from lib.timing import sdpa_call, time_interleaved
from stages import stage6 as s6

ROWS = [(1, 32, 8, 1, 4096, 128), (1, 32, 8, 1, 32768, 128), (1, 8, 1, 1, 1024, 128), (1, 8, 1, 1, 4096, 128),
        (1, 8, 1, 1, 32768, 128), (8, 8, 1, 1, 1024, 128), (8, 8, 1, 1, 4096, 128), (8, 8, 1, 1, 32768, 128),
        (1, 8, 1, 1, 4096, 64), (1, 8, 1, 1, 32768, 64), (8, 8, 1, 1, 4096, 64), (8, 8, 1, 1, 32768, 64),
        (1, 8, 1, 4, 1024, 64), (8, 8, 1, 4, 1024, 128)]
gains = []
for B, H, Hkv, Sq, Sk, D in ROWS:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    fns = {}
    for name, pdl in (("PDL", True), ("no PDL", False)):
        fn = (lambda pdl=pdl: s6.attention(q, k, v, pdl=pdl))
        err = float((fn().float() - ref.float()).abs().max())
        assert err < 2e-2, (B, H, Hkv, Sq, Sk, D, name, err)
        fns[name] = fn
    fns["SDPA default"] = sdpa_call(q, k, v)
    t = time_interleaved(fns, budget_s=0.3)
    sd, on, off = (t[n].median_us for n in ("SDPA default", "PDL", "no PDL"))
    gains.append(off / on)
    print(f"B{B} H{H}/{Hkv} Sq{Sq} Sk{Sk} D{D}: PDL {on:.1f} µs ({sd / on:.3f}x SDPA), without {off:.1f} µs "
          f"({sd / off:.3f}x SDPA), SDPA {sd:.1f} µs; PDL {off / on:.3f}x without "
          f"(rounds {', '.join(f'{b / a:.3f}' for a, b in zip(t['PDL'].round_medians_us, t['no PDL'].round_medians_us))})",
          flush=True)
print(f"PDL over without: median {statistics.median(gains):.3f}x, range {min(gains):.3f}-{max(gains):.3f}x over {len(gains)} rows")
