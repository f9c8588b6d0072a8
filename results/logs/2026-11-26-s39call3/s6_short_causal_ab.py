"""Issue 21's four prefill rows under 0.95x (D64 causal S 512 and 1024, B·S = 16k, MHA and GQA
4:1): stage 6's short causal tiles (SHORT_TILES: (128, 4, 2) with the work queue without
ping-pong, three Q buffers) against other rings and key widths of the same launch, and SDPA's
default backend, in the same interleaved rounds; each output checked against SDPA first.
64-key tiles halve the masked half-tile on the diagonal that every consumer 0 computes; a
shallower ring frees shared memory it does not use. Predicted (not measured): 64-key tiles
lose to their doubled per-tile costs; the rings within 1%."""
import torch
import torch.nn.functional as F

from lib.inputs import make_qkv
from lib.timing import sdpa_call, time_interleaved
from stages import stage6 as s6

SCHED = "work queue without ping-pong"
VARIANTS = {"default": {}, "(64, 4, 2)": {"tiles": (64, 4, 2), "schedule": SCHED},
            "(128, 3, 2)": {"tiles": (128, 3, 2), "schedule": SCHED},
            "(128, 2, 2)": {"tiles": (128, 2, 2), "schedule": SCHED}}
for B, S in ((32, 512), (16, 1024)):
    for Hkv in (16, 4):
        q, k, v = make_qkv(B, 16, S, 64, Hkv=Hkv, dtype=torch.bfloat16)
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        fns = {}
        for name, opts in VARIANTS.items():
            fn = (lambda opts=opts: s6.attention(q, k, v, causal=True, **opts))
            err = float((fn().float() - ref.float()).abs().max())
            assert err < 2e-2, (name, err)
            fns[name] = fn
        fns["SDPA default"] = sdpa_call(q, k, v, causal=True)
        t = time_interleaved(fns, budget_s=0.4)
        sd = t["SDPA default"].median_us
        base = t["default"].median_us
        for name in VARIANTS:
            us = t[name].median_us
            print(f"B{B} H16/{Hkv} S{S} D64 causal {name}: {us:.1f} µs, {sd / us:.3f}x SDPA ({sd:.1f}), "
                  f"{base / us:.3f}x stage 6's default", flush=True)
