"""Stage 8 with ROWS80 (80 queries a step, D 96/128) under compute-sanitizer: full and causal calls
(both alignments) at row counts that are and are not multiples of 80, grouped heads, both dtypes;
each against float64 autograd (experiments/model_variants' loop). On an H100/H200:
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --kernel-name kns=attention_backward \\
            python3 experiments/backward_rows80/sanitize.py || break
    done
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model_variants"))
from sanitize_backward import run  # noqa: E402  (the same loop; it exits without an H100/H200)

ROWS80 = {"rows80": 1, "dk_last": 0, "prep_early": 0}
CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, dtype, variants, stage 8's switches
    ((2, 4, 2, 333, 517, 128), False, torch.bfloat16, {}, ROWS80),
    ((1, 4, 4, 160, 160, 128), True, torch.float16, {}, ROWS80),
    ((2, 4, 1, 1000, 300, 128), "bottom_right", torch.bfloat16, {}, ROWS80),
    ((1, 6, 3, 250, 700, 96), False, torch.float16, {}, ROWS80),
]
run(CASES, "stage 8 backward with ROWS80: all match the reference", wgmma=1)
