"""Issue 48: why do the training map's short D 64 causal rows run at 0.99x SDPA's step in one
record and 0.73-0.84x in the next? In those records stage 6 + 8's step had fast rounds and rounds
1.3-1.8x slower, while SDPA's rounds agreed (results/logs/2026-11-29-95ec2fa-h200/README.md).

At each such row this times, on the same inputs:
  - host: wall time per step of back-to-back steps (lib.timing.time_host) and the GPU time of
    one, for both sides: a step whose host time reaches its GPU time leaves the GPU waiting;
  - the map's way (lib.timing.time_interleaved, GPU not held: host time the GPU waits for counts)
    and the same with the GPU held until the step is queued (its kernels' time), 9 rounds each;
    every round's median is printed.

    python3 experiments/train_step_rounds/probe.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import sdpa_call, time_host, time_interleaved  # noqa: E402
from stages import autograd  # noqa: E402

# (B, H, Hkv, S, D): the map's rows that moved, and a row that did not (B16 H16/4 S1024)
ROWS = [(32, 16, 16, 512, 64), (32, 16, 4, 512, 64), (16, 16, 16, 1024, 64), (16, 16, 4, 1024, 64)]
ROUNDS = 9


def step_call(forward, leaves, dout):
    def step():
        for t in leaves:
            t.grad = None
        forward().backward(dout)
    return step


def main():
    for B, H, Hkv, S, D in ROWS:
        q, k, v = make_qkv(B, H, S, D, Hkv=Hkv, dtype=torch.bfloat16)
        dout = torch.randn_like(q)
        ours = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        theirs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        fns = {"stage 6 + 8": step_call(lambda: autograd.attention(*ours, forward=6, causal=True), ours, dout),
               "SDPA default": step_call(sdpa_call(*theirs, causal=True), theirs, dout)}
        name = f"B{B} H{H}/{Hkv} S{S} D{D} causal"
        for side, fn in fns.items():
            h = time_host(fn, calls=200)
            print(f"{name} {side:13s} host {h.host_us:7.1f} µs a step back to back, GPU {h.gpu_us:7.1f} µs "
                  f"(host/GPU {h.host_us / h.gpu_us:.2f})", flush=True)
        for hold in (False, True):
            t = time_interleaved(fns, rounds=ROUNDS, budget_s=0.6, min_runs=18, max_runs=90, hold=hold)
            for side, r in t.items():
                print(f"{name} {'held    ' if hold else 'not held'} {side:13s} median {r.median_us:7.1f} µs, rounds "
                      + " ".join(f"{m:.0f}" for m in r.round_medians_us), flush=True)
            print(f"{name} {'held    ' if hold else 'not held'} SDPA's step / stage 6 + 8's: "
                  f"{t['SDPA default'].median_us / t['stage 6 + 8'].median_us:.2f}x", flush=True)


if __name__ == "__main__":
    main()
