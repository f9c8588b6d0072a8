"""Issue 21's decoding rows still under SDPA's default (the map at 96a000a: B64 H32/8 Sk1024 D64
0.981x, five more within 0.5-1%) all stream the cache. cuDNN decodes them with 4 blocks per SM
at D64 (Nsight Compute, results/logs/2026-11-26-s36call2), stage 6 with 2 (shares_sms; 128-key
tiles): at B64 H32/8 that is 512 work tiles on 264 slots, two waves. Here stage 6 as called
against blocks of one consumer with 64-key tiles, two or three per SM (BLOCKS_PER_SM; 3 x 75 KB
of ring fits), and SDPA's default, each in pairs with stage 6 as called, in both orders.
Predicted: three per SM at B64 H32/8 Sk1024 D64 (396 slots: 1.3 waves) 2-5% faster; level where
the rows are many key tiles long (Sk 4096-32768), whose waves' rounding matters less."""
import torch

from lib.inputs import make_qkv
from lib.reference import check_output
from lib.timing import sdpa_call, time_interleaved
from stages import stage6 as s6

VARIANTS = {"3/SM 64x4": {"pack_gqa": True, "blocks_per_sm": 3, "tiles": (64, 4, 1)},
            "3/SM 64x2": {"pack_gqa": True, "blocks_per_sm": 3, "tiles": (64, 2, 1)},
            "2/SM 64x4": {"pack_gqa": True, "blocks_per_sm": 2, "tiles": (64, 4, 1)}}
for B, H, Hk, Sk, D in [(64, 32, 8, 1024, 64), (64, 32, 8, 4096, 64), (8, 32, 8, 32768, 64), (64, 8, 1, 32768, 64),
                        (64, 32, 8, 1024, 128)]:
    q, k, v = make_qkv(B, H, 1, D, Sk=Sk, Hkv=Hk, dtype=torch.bfloat16)
    fns = {"as called": lambda: s6.attention(q, k, v), "SDPA": sdpa_call(q, k, v, causal=False)}
    for name, kw in VARIANTS.items():
        try:
            ok = check_output(s6.attention(q, k, v, **kw), q, k, v).passed
        except Exception as e:  # a variant the shape does not allow
            print(f"B{B} H{H}/{Hk} Sk{Sk} D{D} {name}: {type(e).__name__}: {e}"[:200], flush=True)
            continue
        fns[name] = (lambda kw=kw: s6.attention(q, k, v, **kw)) if ok else None
        if not ok:
            print(f"B{B} H{H}/{Hk} Sk{Sk} D{D} {name}: CHECK FAILED", flush=True)
    bytes_kv = 2 * B * Hk * Sk * D * 2
    for name in [n for n in fns if n != "as called" and fns[n] is not None]:
        for order in (("as called", name), (name, "as called")):
            t = time_interleaved({n: fns[n] for n in order}, budget_s=0.3)
            a, b = t["as called"], t[name]
            print(f"B{B} H{H}/{Hk} Sk{Sk} D{D} {name}, {order[0]} first: as called {a.median_us:,.1f} µs "
                  f"({bytes_kv / a.median_us / 1e3:,.0f} GB/s), {name} {b.median_us:,.1f} µs: "
                  f"{a.median_us / b.median_us:.3f}x as called", flush=True)
