"""Stage 6 decoding from an e4m3 KV cache (issue 50 item 2, KV_FP8) under compute-sanitizer: one block
per SM at D128 and D64, two blocks per SM at D64 and D128, split-KV with the combine in the last block and in its
kernel, speculative decoding (Sq 4, bottom-right), GQA groups 1, 4 and 8, lengths 0, 1 and odd, both
dtypes; each checked against the float64 reference of the dequantized cache. The producer's widening
warps write the ring with ordinary stores that the consumers' wgmma read after an mbarrier: racecheck
and synccheck look at that hand-over. Run on an H100/H200 as
    compute-sanitizer --tool memcheck|racecheck|synccheck --kernel-name kns=attention \
        python3 experiments/fp8_kv_decode/sanitize.py
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_output, sdpa  # noqa: E402
import stages.stage6 as s6  # noqa: E402
import stages.stage6_kv_fp8 as f8  # noqa: E402

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    print("needs an H100 or H200 and none was found", file=sys.stderr)
    sys.exit(2)

CASES = [  # (B, H, Hkv, Sq, Sk, D), dtype, causal, options
    ((3, 32, 8, 1, 1000, 128), torch.bfloat16, False, {}),                          # split, combine in the block
    ((3, 32, 8, 1, 1000, 128), torch.float16, False, {"splits": 3, "combine_in_block": False}),
    ((4, 8, 1, 1, 300, 64), torch.bfloat16, False, {}),                            # D64, one block per SM
    ((16, 32, 8, 1, 700, 64), torch.float16, False, {}),                           # D64, two blocks per SM
    ((48, 32, 8, 1, 333, 128), torch.float16, False, {}),                          # D128, two blocks per SM
    ((3, 32, 8, 1, 9001, 128), torch.bfloat16, False, {}),                         # twice the splits on two blocks per SM
    ((48, 32, 8, 1, 333, 128), torch.bfloat16, False, {"fp8_switches": {"fold": False, "wide": False}}),  # neither switch
    ((4, 32, 8, 1, 999, 128), torch.float16, False, {"fp8_switches": {"wide": False}}),  # 8-byte staging loads
    ((16, 32, 8, 1, 700, 64), torch.bfloat16, False, {"fp8_switches": {"fold": True, "wide": True}}),
    ((6, 32, 8, 1, 900, 128), torch.bfloat16, False, {"big": True}),  # descales too large to fold beside ones that fold
    ((2, 8, 8, 1, 4097, 64), torch.bfloat16, False, {"splits": 7}),
    ((2, 32, 8, 4, 2000, 128), torch.bfloat16, "bottom_right", {}),                # speculative decoding
    ((3, 16, 4, 4, 777, 64), torch.float16, "bottom_right", {"splits": 4}),
]
for (B, H, Hkv, Sq, Sk, D), dtype, causal, opts in CASES:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.float32, seed=Sq + Sk)
    (k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
    if opts.get("big"):  # KV_FP8_FOLD's other widening loop (stages/stage6.cu, folds)
        kd[0, 0], vd[1, 1], kd[2, 2] = 5000.0, 300.0, -3000.0
        opts = {}
    q = q.to(dtype)
    lens = ([Sk, 1, 0, Sk // 2 + 3] * B)[:B]
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = s6.attention(q, k8, v8, causal=causal, seqlens_k=seqlens, k_descale=kd, v_descale=vd, **opts)
    k64, v64 = f8.dequantized(k8, kd), f8.dequantized(v8, vd)
    for b, n in enumerate(lens):
        if n == 0:
            assert bool((out[b] == 0).all()), (b, "no key: zeros")
            continue
        kb, vb = k64[b:b + 1, :, :n], v64[b:b + 1, :, :n]
        base = sdpa(q[b:b + 1], kb.to(dtype), vb.to(dtype), causal=causal).nan_to_num(0.0)
        c = check_output(out[b:b + 1], q[b:b + 1], kb, vb, causal=causal, sdpa_out=base)
        assert c.passed, ((B, H, Hkv, Sq, Sk, D), dtype, causal, sorted(opts), b, c.summary())
torch.cuda.synchronize()
print("e4m3 cache calls: all match the reference of the dequantized cache")
