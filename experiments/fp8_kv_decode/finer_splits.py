"""B1 and B8's long rows of the e4m3 cache run one block per SM (the splits planned for one block
per SM fill 128 of 132), and at B8 they are the slowest (0.93-0.97x SDPA at Sk 16384-32768 in the
record at 508bef9): one block's three widening warps feed one consumer. Do twice the splits on two
blocks per SM (fp8_shares_sms then holds: 256 blocks) run faster? Twice the splits on one block
per SM beside it, to tell the second block from the shorter splits. H32/8 Sq1 D128, bf16 Q, SDPA's
default on the same cache in bf16 as the yardstick, 7 interleaved rounds; each choice checked
against the float64 reference first.
    python3 experiments/fp8_kv_decode/finer_splits.py
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

sms = torch.cuda.get_device_properties(0).multi_processor_count
for B, Sk in ((1, 16384), (1, 32768), (8, 4096), (8, 16384), (8, 32768)):
    q, k, v = make_qkv(B, 32, 1, 128, Sk=Sk, Hkv=8, dtype=torch.bfloat16)
    (k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
    k16, v16 = f8.dequantized(k8, kd, torch.bfloat16), f8.dequantized(v8, vd, torch.bfloat16)
    n = s6.choose(B, 32, 8, 1, Sk, 128, 0, sms, kv_fp8=True)["splits"]
    choices = {"rule": {}, "2x splits, 2/SM": {"splits": 2 * n, "blocks_per_sm": 2},
               "2x splits, 1/SM": {"splits": 2 * n, "blocks_per_sm": 1}}
    k64, v64 = f8.dequantized(k8[:1], kd[:1]), f8.dequantized(v8[:1], vd[:1])
    base = sdpa(q[:1], k64.to(q.dtype), v64.to(q.dtype))
    fns = {"sdpa": sdpa_call(q, k16, v16)}
    for label, kw in choices.items():
        c = check_output(s6.attention(q, k8, v8, k_descale=kd, v_descale=vd, **kw)[:1], q[:1], k64, v64, sdpa_out=base)
        print(f"  B{B} Sk{Sk} {label}: {'pass' if c.passed else 'FAIL ' + c.summary()}", flush=True)
        fns[label] = (lambda kw=kw: s6.attention(q, k8, v8, k_descale=kd, v_descale=vd, **kw))
    t = time_interleaved(fns, rounds=7, budget_s=0.3)
    print(f"B{B} Sk{Sk} (rule: {n} splits): " + "  ".join(
        f"{lab} {t[lab].median_us:.1f} µs ({t['sdpa'].median_us / t[lab].median_us:.2f}x SDPA)" for lab in fns), flush=True)
    del q, k, v, k8, v8, k16, v16
    torch.cuda.empty_cache()
