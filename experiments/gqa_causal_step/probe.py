"""Why is the training step slow with grouped heads and the causal mask at short sequences? The
training map (H200, 2026-11-28, commit 18fd9ff) put stage 6 + 8's step at B32 H16/4 S512 D64
causal at 0.46x SDPA's (781 µs), where the same shape with 16 K/V heads ran at 0.71x (463 µs).
This times the step's parts apart, each against the MHA shape, in interleaved rounds: stage 6's
forward (with lse), stage 8's whole backward (lib.timing holds the GPU, so host time is not
counted), and the step through autograd without holding (what the map times).

    python3 experiments/gqa_causal_step/probe.py
"""
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
from stages import autograd, stage6, stage8  # noqa: E402

SHAPES = [(32, 16, 512, 64), (16, 16, 1024, 64), (8, 16, 2048, 64)]


def parts(B, H, Hkv, S, D, causal):
    q, k, v = make_qkv(B, H, S, D, Hkv=Hkv, dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = stage6.attention(q, k, v, causal=causal, lse=lse)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    attend = partial(autograd.attention, forward=6)

    def step():
        for t in leaves:
            t.grad = None
        attend(*leaves, causal=causal).backward(dout)
    return {"forward": lambda: stage6.attention(q, k, v, causal=causal, lse=lse),
            "backward": lambda: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal),
            "step": step}


def main():
    for B, H, S, D in SHAPES:
        for causal in (False, True):
            res = {}
            for Hkv in (H, H // 4):
                fns = parts(B, H, Hkv, S, D, causal)
                held = time_interleaved({k: fns[k] for k in ("forward", "backward")}, budget_s=0.4)
                free = time_interleaved({"step": fns["step"]}, budget_s=0.4, hold=False)
                res[Hkv] = {**{k: t.median_us for k, t in held.items()}, "step": free["step"].median_us}
            for Hkv, r in res.items():
                print(f"B{B} H{H}/{Hkv} S{S} D{D} {'causal' if causal else 'full  '}: forward {r['forward']:8.1f} µs, "
                      f"backward {r['backward']:8.1f} µs, step (not held) {r['step']:8.1f} µs", flush=True)


if __name__ == "__main__":
    main()
