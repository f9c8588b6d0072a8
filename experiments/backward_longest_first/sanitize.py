"""Stage 8 with LONGEST_FIRST under compute-sanitizer: causal calls (both alignments) at odd shapes,
grouped heads, sections left part-full, both head dims; each against float64 autograd
(experiments/model_variants' loop). On an H100/H200:
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --kernel-name kns=attention_backward \\
            python3 experiments/backward_longest_first/sanitize.py || break
    done
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model_variants"))
from sanitize_backward import run  # noqa: E402  (the same loop; it exits without an H100/H200)

CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, dtype, variants, stage 8's switches (longest_first=1 added)
    ((2, 4, 2, 300, 1000, 64), "bottom_right", torch.bfloat16, {}, {}),
    ((2, 4, 2, 1000, 300, 128), True, torch.float16, {}, {}),
    ((1, 6, 3, 777, 777, 128), "bottom_right", torch.bfloat16, {}, {}),
    ((3, 5, 5, 200, 200, 64), True, torch.float16, {}, {}),
    ((1, 4, 1, 500, 500, 64), True, torch.bfloat16, {"softcap": 30.0}, {}),
]
run(CASES, "stage 8 backward with LONGEST_FIRST: all match the reference", wgmma=1, longest_first=1)
