"""The split bottom-right path under compute-sanitizer: a few speculative-decoding calls at odd
lengths, packed and (one consumer, one query block) unpacked, split several ways (with the
combine in the block and as a kernel), each checked against the float64 reference. Run as
    compute-sanitizer --tool memcheck|racecheck|synccheck --kernel-name kns=attention \
        python3 experiments/spec_decode_splits/sanitize.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_output  # noqa: E402
import stages.stage6 as s6  # noqa: E402

for B, H, Hkv, Sq, Sk, D in [(1, 32, 8, 7, 4097, 128), (2, 5, 1, 3, 777, 64), (1, 8, 1, 8, 1000, 64),
                             (1, 32, 8, 16, 2049, 64), (1, 8, 1, 16, 3001, 128), (1, 8, 1, 37, 1500, 64)]:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16, seed=Sq)
    for opts in ({}, {"splits": 3}, {"splits": 1000}, {"splits": 3, "combine_in_block": False},
                 {"blocks_per_sm": 1, "splits": 5}, {"pack_gqa": False, "splits": 4}):
        out = s6.attention(q, k, v, causal="bottom_right", **opts)
        c = check_output(out, q, k, v, causal="bottom_right")
        assert c.passed, (B, H, Hkv, Sq, Sk, D, opts, c.summary())
torch.cuda.synchronize()
print("split bottom-right calls: all match the reference")
