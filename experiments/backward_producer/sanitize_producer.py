"""Stage 8's dK/dV kernel with a producer warpgroup (PRODUCER) under compute-sanitizer: a few
calls at odd shapes (lengths no multiple of 64, Sq ≠ Sk, GQA, both causal alignments, a row of
many query blocks so that the rings and the mbarriers' phases wrap), both head dims, one and two
warpgroups that multiply, dQ in turns, and the variants; each checked against float64 autograd of
lib.reference (check_gradients). The pattern of experiments/model_variants/sanitize_backward.py.
Run on an H100/H200 as
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --kernel-name kns=attention_backward \
            python3 experiments/backward_producer/sanitize_producer.py || break
    done
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model_variants"))
from sanitize_backward import run  # noqa: E402  (the same loop; it exits without an H100/H200)

CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, dtype, variants, stage 8's switches (producer=1 added)
    ((2, 4, 2, 300, 1000, 64), "bottom_right", torch.bfloat16, {}, {}),
    ((2, 4, 2, 1000, 300, 128), True, torch.float16, {}, {}),
    ((1, 8, 2, 333, 333, 128), False, torch.bfloat16, {}, {"warpgroups": 1}),
    ((2, 8, 4, 257, 700, 64), True, torch.float16, {}, {"warpgroups": 2}),
    ((1, 4, 1, 450, 200, 64), "bottom_right", torch.bfloat16, {}, {"warpgroups": 2, "dq_turns": 1}),
    ((1, 2, 2, 1500, 130, 128), "bottom_right", torch.bfloat16, {}, {}),  # 24 steps per key block
    ((2, 4, 2, 300, 500, 128), "bottom_right", torch.float16, {"window": (40, 0), "softcap": 5.0}, {}),
    ((1, 4, 2, 200, 450, 64), True, torch.bfloat16, {"window": (10, 3), "softcap": 30.0, "sinks": True}, {}),
]
run(CASES, "stage 8 backward with a producer warpgroup: all match the reference", producer=1)
