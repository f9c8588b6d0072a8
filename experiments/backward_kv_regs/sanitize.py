"""Stage 8 with KV_REGS 1 (D 64) and PREP_EARLY 3 under compute-sanitizer: causal (both
alignments), full and windowed calls at odd shapes, grouped heads, a softcap; each against float64
autograd (experiments/model_variants' loop). On an H100/H200:
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --kernel-name kns=attention_backward \\
            python3 experiments/backward_kv_regs/sanitize.py || break
    done
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model_variants"))
from sanitize_backward import run  # noqa: E402  (the same loop; it exits without an H100/H200)

CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, dtype, variants, stage 8's switches
    ((2, 4, 2, 300, 1000, 64), "bottom_right", torch.bfloat16, {}, {"kv_regs": 1}),
    ((1, 8, 2, 333, 333, 64), False, torch.float16, {"softcap": 30.0}, {"kv_regs": 1, "prep_early": 3}),
    ((3, 5, 5, 200, 200, 64), True, torch.bfloat16, {"window": (70, 70)}, {"kv_regs": 2}),
    ((2, 4, 2, 1000, 300, 128), True, torch.float16, {}, {"prep_early": 3}),
    ((1, 4, 2, 200, 450, 128), False, torch.bfloat16, {}, {"prep_early": 3}),
]
run(CASES, "stage 8 backward with KV_REGS and PREP_EARLY 3: all match the reference", wgmma=1)
