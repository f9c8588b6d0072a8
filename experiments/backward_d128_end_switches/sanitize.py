"""Stage 8's build at D 96 and 128, now with SCALE_AT_END and EPILOGUE_SMEM on, under compute-sanitizer:
full and causal calls (both alignments) at key and query counts that cut the last block, grouped
heads, both dtypes, a window with sinks; each against float64 autograd (experiments/model_variants'
loop). On an H100/H200:
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --kernel-name kns=attention_backward \\
            python3 experiments/backward_d128_end_switches/sanitize.py || break
    done
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model_variants"))
from sanitize_backward import run  # noqa: E402  (the same loop; it exits without an H100/H200)

CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, dtype, variants, stage 8's switches (none: the stage's build)
    ((2, 4, 2, 333, 517, 128), False, torch.bfloat16, {}, {}),
    ((1, 4, 4, 190, 190, 128), True, torch.float16, {}, {}),
    ((2, 4, 1, 1000, 300, 128), "bottom_right", torch.bfloat16, {}, {}),
    ((1, 6, 3, 250, 700, 96), False, torch.float16, {}, {}),
    ((1, 4, 2, 300, 450, 128), True, torch.bfloat16, {"window": (60, 0), "sinks": True}, {}),
]
run(CASES, "stage 8 backward at D 96/128 with SCALE_AT_END and EPILOGUE_SMEM: all match the reference", wgmma=1)
