"""Stage 8 with MASK_SPLIT under compute-sanitizer: causal (both alignments), full and windowed calls
at odd shapes, both head dims; each against float64 autograd (experiments/model_variants' loop). On
an H100/H200:
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --kernel-name kns=attention_backward \\
            python3 experiments/backward_mask_split/sanitize.py || break
    done
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model_variants"))
from sanitize_backward import run  # noqa: E402  (the same loop; it exits without an H100/H200)

CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, dtype, variants, stage 8's switches (mask_split=1 added)
    ((2, 4, 2, 300, 1000, 64), "bottom_right", torch.bfloat16, {}, {}),
    ((2, 4, 2, 1000, 300, 128), True, torch.float16, {}, {}),
    ((1, 8, 2, 333, 333, 64), False, torch.bfloat16, {}, {}),
    ((1, 4, 2, 200, 450, 128), True, torch.bfloat16, {"window": (40, 3)}, {}),
    ((1, 4, 1, 500, 500, 64), False, torch.float16, {"window": (70, 70)}, {}),
]
run(CASES, "stage 8 backward with MASK_SPLIT: all match the reference", wgmma=1, mask_split=1)
