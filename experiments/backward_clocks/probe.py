"""Do stage 8's backward and SDPA's default (cuDNN) backward run at the same SM clock under
sustained load? Each side runs back to back for a few seconds (no L2 flush, as a training loop
runs it) while `nvidia-smi -lms 100` samples the SM clock and the board's power; sides alternate,
twice each. Printed per side and turn: the median time per call (CUDA events around each call),
the median SM clock and power over the turn's samples, and time × clock (cycles per call, in
millions), which a clock difference cannot move.

Why: under Nsight Compute (each kernel alone, after idle) stage 8's D 128 causal backward kernels
took 0.97x cuDNN's time (results/logs/2026-11-29-ef48932-h200/ncu-d128c.log), in the timed
record 0.89x. A kernel that draws more power per unit of work runs at lower clocks once the
board is at its power limit.

    python3 experiments/backward_clocks/probe.py [--seconds 3]
"""
import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import sdpa_backward_call  # noqa: E402
from stages import stage5, stage8  # noqa: E402

ROWS = [(4, 16, 8192, 128, True), (16, 16, 2048, 64, False)]


def sustained(fn, seconds):
    """Run fn back to back for `seconds`, sampling nvidia-smi; (median µs, median MHz, median W)."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    times, t_end = [], time.time() + seconds
    while time.time() < t_end:  # batches of 10 calls queued back to back, one wait per batch
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(10)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        ev[-1][1].synchronize()
        times += [a.elapsed_time(b) * 1e3 for a, b in ev]
    smi.terminate()
    out, _ = smi.communicate()
    samples = [tuple(float(x) for x in line.split(",")) for line in out.strip().splitlines()[2:] if line.strip()]
    return statistics.median(times), statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    print(f"{'row':30s} {'side':8s} {'turn':>4s} {'us/call':>9s} {'SM MHz':>7s} {'W':>6s} {'Mcycles':>8s}", flush=True)
    for B, H, S, D, causal in ROWS:
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        dout = torch.randn_like(q)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
        out = stage5.attention(q, k, v, causal=causal, lse=lse)
        sides = {"stage 8": lambda: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal),
                 "cuDNN": sdpa_backward_call(q, k, v, dout, causal=causal)}
        for fn in sides.values():
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        for turn in range(2):
            for name, fn in sides.items():
                us, mhz, w = sustained(fn, a.seconds)
                print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full':6s}    {name:8s} {turn:4d} {us:9,.0f} "
                      f"{mhz:7.0f} {w:6.0f} {us * mhz / 1e6:8.2f}", flush=True)


if __name__ == "__main__":
    main()
