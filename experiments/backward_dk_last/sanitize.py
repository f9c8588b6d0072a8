"""Stage 8 with DK_LAST under compute-sanitizer: odd shapes (lengths no multiple of 64, Sq ≠ Sk,
GQA, both causal alignments, a row of many query blocks), both head dims, dQ in turns and one
warpgroup at D 64, a variant build; each against float64 autograd (experiments/model_variants'
loop). On an H100/H200:
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --kernel-name kns=attention_backward \\
            python3 experiments/backward_dk_last/sanitize.py || break
    done
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model_variants"))
from sanitize_backward import run  # noqa: E402  (the same loop; it exits without an H100/H200)

CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, dtype, variants, stage 8's switches (dk_last=1 added)
    ((2, 4, 2, 300, 1000, 64), "bottom_right", torch.bfloat16, {}, {}),
    ((2, 4, 2, 1000, 300, 128), True, torch.float16, {}, {}),
    ((1, 8, 2, 333, 333, 64), False, torch.bfloat16, {}, {"warpgroups": 1, "dq_turns": 0}),
    ((1, 2, 2, 1500, 130, 128), "bottom_right", torch.bfloat16, {}, {}),  # 24 steps per key block
    ((1, 4, 2, 200, 450, 64), True, torch.bfloat16, {"window": (10, 3), "softcap": 30.0}, {}),
]
run(CASES, "stage 8 backward with DK_LAST: all match the reference", wgmma=1, dk_last=1)
