"""Where the e4m3 cache's decoding time goes (issue 50 item 2): the KV_FP8 build as the launcher
picks it (FP8_RULE's switches: the bf16 widening without its multiply, fold, KV_FP8_FOLD; 16-byte
staging loads, wide, KV_FP8_WIDE) and beside it each switch turned the other way and other tiles
and blocks per SM, against stage 6 on the same cache in bf16 and SDPA's default, same interleaved
rounds. Rows: H32/8 Sq1, B 8 and 64, Sk 4096 and 16384, D 64 and 128, bf16 Q.
    python3 experiments/fp8_kv_decode/probe.py
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]
import stages.stage6 as s6  # noqa: E402
import stages.stage6_kv_fp8 as f8  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_output, sdpa  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402

VARIANTS = {  # label: attention() keywords of the e4m3 call (earlier forms: the logs h200_probe_*.log)
    128: {"rule (fold, wide)": {}, "neither": {"fp8_switches": {"fold": False, "wide": False}},
          "fold": {"fp8_switches": {"wide": False}}, "wide": {"fp8_switches": {"fold": False}},
          "1/SM staged 8": {"tiles": (64, 2, 1), "blocks_per_sm": 1}},
    64: {"rule (fold)": {}, "neither": {"fp8_switches": {"fold": False}},
         "fold, wide": {"fp8_switches": {"wide": True}},
         "128x2 staged 8, 1/SM": {"tiles": (128, 2, 1), "blocks_per_sm": 1}}}
for D in (128, 64):
    for B, Sk in ((8, 16384), (64, 4096), (64, 16384)):
        q, k, v = make_qkv(B, 32, 1, D, Sk=Sk, Hkv=8, dtype=torch.bfloat16)
        (k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
        k16, v16 = f8.dequantized(k8, kd, torch.bfloat16), f8.dequantized(v8, vd, torch.bfloat16)
        fns = {"sdpa": sdpa_call(q, k16, v16), "bf16": lambda: s6.attention(q, k16, v16)}
        k64, v64 = f8.dequantized(k8[:1], kd[:1]), f8.dequantized(v8[:1], vd[:1])  # entry 0 in float64
        base = sdpa(q[:1], k64.to(q.dtype), v64.to(q.dtype))
        for label, kw in VARIANTS[D].items():
            try:
                out = s6.attention(q, k8, v8, k_descale=kd, v_descale=vd, **kw)
                c = check_output(out[:1], q[:1], k64, v64, sdpa_out=base)
                if not c.passed:
                    print(f"  D{D} {label}: FAILED the error rule: {c.summary()}", flush=True)
                fns[f"fp8 {label}"] = (lambda kw=kw: s6.attention(q, k8, v8, k_descale=kd, v_descale=vd, **kw))
            except Exception as e:  # a choice that does not fit this head dim
                print(f"  D{D} {label}: {type(e).__name__}: {str(e)[:120]}")
        times = time_interleaved(fns, rounds=5, budget_s=0.3)
        gb = 2 * B * 8 * Sk * D / 1e9  # the e4m3 cache's bytes (K and V)
        line = "  ".join(f"{n} {times[n].median_us:.1f}" for n in fns)
        best = min(times[n].median_us for n in fns if n.startswith("fp8"))
        print(f"D{D} B{B} Sk{Sk}: {line}  | best fp8 {times['sdpa'].median_us / best:.2f}x SDPA, "
              f"{gb / best * 1e6 / 1e3:.2f} TB/s of e4m3; bf16 {2 * gb / times['bf16'].median_us * 1e3:.2f} TB/s",
              flush=True)
        del q, k, v, k8, v8, k16, v16, k64, v64, fns
        torch.cuda.empty_cache()
