"""Speculative decoding at batch 1 (issue 50, item 1): several new queries (Sq 2-16) against a
long cache, causal aligned bottom-right (each query sees the cache and the drafts before it).
Stage 6 packed a group's queries into one block but never split a causal call's keys, so B1
H32/8 ran 8 blocks on 132 SMs. stages/stage6_decoding.splits_causal now lets packed bottom-right
calls split. This times, in the same interleaved rounds, stage 6 as it now plans (split), stage 6
with splits=1 (the plan before), and SDPA's default backend with SDPA's own bottom-right mask
(attn_mask=causal_lower_right(Sq, Sk)), after checking stage 6's output against the float64
reference.

    python3 experiments/spec_decode_splits/probe.py
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_output  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
import stages.stage6 as s6  # noqa: E402

SHAPES = [(1, 32, 8, Sq, Sk, D) for D in (128, 64) for Sk in (8192, 32768) for Sq in (2, 4, 8, 16)]


def main():
    from torch.nn.attention.bias import causal_lower_right
    print(f"{'shape':30s} {'splits':>6s} {'stage 6':>10s} {'unsplit':>10s} {'SDPA':>10s} {'x SDPA':>7s} {'x unsplit':>9s}")
    for B, H, Hkv, Sq, Sk, D in SHAPES:
        q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16)
        c = check_output(s6.attention(q, k, v, causal="bottom_right"), q, k, v, causal="bottom_right")
        assert c.passed, c.summary()
        mask = causal_lower_right(Sq, Sk)
        fns = {"stage 6": lambda: s6.attention(q, k, v, causal="bottom_right"),
               "unsplit": lambda: s6.attention(q, k, v, causal="bottom_right", splits=1),
               "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)}
        t = {n: r.median_us for n, r in time_interleaved(fns, budget_s=0.3).items()}
        n = s6.choose(B, H, Hkv, Sq, Sk, D, 2, torch.cuda.get_device_properties(0).multi_processor_count)["splits"]
        print(f"B{B} H{H}/{Hkv} Sq{Sq} Sk{Sk} D{D}".ljust(30) + f" {n:6d} {t['stage 6']:10.1f} {t['unsplit']:10.1f} "
              f"{t['SDPA']:10.1f} {t['SDPA'] / t['stage 6']:7.2f} {t['unsplit'] / t['stage 6']:9.2f}", flush=True)


if __name__ == "__main__":
    main()
