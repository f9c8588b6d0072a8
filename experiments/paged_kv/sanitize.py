"""Stage 6's paged KV cache (issue 50) under compute-sanitizer: decoding (packed, split, two blocks per
SM, blocks without a producer), speculative decoding and a prefill (two consumers, the work queue)
against caches of 16- to 256-key pages, shuffled, with garbage ids past each entry's used pages (and
one used id out of range: read as zeros by the copy engine, no fault), each checked against the
float64 reference of the gathered keys where the ids are valid. Run on an H100/H200 as
    compute-sanitizer --tool memcheck|racecheck|synccheck --kernel-name kns=attention \
        python3 experiments/paged_kv/sanitize.py
"""
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_output  # noqa: E402
import stages.stage6 as s6  # noqa: E402
from test_stage6_paged import paged_cache  # noqa: E402

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    sys.exit("needs an H100 or H200 and none was found")

CASES = [  # (B, H, Hkv, Sq, Sk, D), page size, causal, options
    ((3, 32, 8, 1, 1000, 128), 16, False, {}),                             # packed, split, two blocks per SM
    ((3, 32, 8, 1, 1000, 128), 256, False, {"splits": 3, "combine_in_block": False}),
    ((4, 8, 1, 1, 300, 64), 32, False, {}),                                # D64: blocks without a producer
    ((2, 8, 1, 1, 4097, 64), 64, False, {"splits": 7}),
    ((2, 32, 8, 4, 2000, 128), 128, "bottom_right", {}),                   # speculative decoding
    ((2, 16, 4, 16, 777, 64), 16, "bottom_right", {"pack_gqa": False, "splits": 4}),
    ((2, 16, 4, 600, 900, 128), 16, "bottom_right", {}),                   # prefill against a cache
    ((2, 16, 16, 520, 520, 64), 64, False, {}),                            # three consumers
    ((3, 32, 8, 1, 1000, 128), 32, False, {"page_ids_ahead": 1, "splits": 5}),  # ids one tile ahead (paged-fast)
    ((2, 32, 8, 1, 3000, 128), 16, False, {"page_ids_ahead": 8}),          # ids more tiles ahead than a split has
]
g = random.Random(50)
for (B, H, Hkv, Sq, Sk, D), ps, causal, opts in CASES:
    cap = -(-Sk // ps) * ps
    lens = ([cap, 1, ps + 3, 0] * B)[:B]
    q, k, v = make_qkv(B, H, Sq, D, Sk=cap, Hkv=Hkv, dtype=torch.bfloat16, seed=Sq + Sk)
    kc, vc, table = paged_cache(k, v, lens, ps, generator=g)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=table, **opts)
    for b, n in enumerate(lens):
        if n == 0:
            assert bool((out[b] == 0).all()), (b, "no key: zeros")
            continue
        c = check_output(out[b:b + 1], q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=causal)
        assert c.passed, ((B, H, Hkv, Sq, Sk, D), ps, causal, sorted(opts), b, c.summary())
    bad = table.clone()
    bad[0, 0] = kc.shape[0] + 12345  # a used id out of range: zeros read, no fault (a wrong result, by contract)
    s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=bad, **opts)
torch.cuda.synchronize()
print("paged calls: all match the reference; an out-of-range id read no memory")
