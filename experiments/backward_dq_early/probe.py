"""Issue 48: does issuing the dQ product before dV and dK are done (stage 8's DQ_EARLY switch)
speed up the stage's build, now that it has a producer warpgroup and the dSᵀ store's guard?
On the build before the producer it ran 0.93x (D 128 full) to 1.07x of the build without it
(results/nvidia-h200.json's backward variant "WGMMA, dQ issued before dV and dK are done").

At the backward record's standard rows (bf16), in interleaved rounds: the stage's build, the same
build with dq_early=1, and SDPA's default backward (cuDNN); stage 8's two builds' gradients checked
against float64 autograd on a slice before and after timing.

    python3 experiments/backward_dq_early/probe.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
from lib.timing import sdpa_backward_call, time_interleaved  # noqa: E402
from stages import stage6, stage8  # noqa: E402

ROWS = [(16, 16, 2048, 64), (4, 16, 8192, 128)]  # (B, H, S, D): the backward record's standard rows
BUILDS = {"stage's build": {}, "dq_early=1": {"dq_early": 1}}
ROUNDS = 7


def inputs(B, H, S, D, causal, seed=None):
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, seed=seed)
    dout = torch.randn_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    out = stage6.attention(q, k, v, causal=causal, lse=lse)
    return q, k, v, out, dout, lse


def check(S, D, causal, seed):
    """Every build's gradients on one batch entry and two heads, by the error rule."""
    q, k, v, out, dout, lse = inputs(1, 2, S, D, causal, seed)
    bad = []
    for name, kw in BUILDS.items():
        g = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw)
        bad += [f"{name} {n}" for n, c in check_gradients(g, q, k, v, dout, causal=causal).items() if not c.passed]
    return bad


def main():
    failed = False
    for B, H, S, D in ROWS:
        for causal in (False, True):
            name = f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}"
            bad = check(S, D, causal, seed=S + D + causal)
            q, k, v, out, dout, lse = inputs(B, H, S, D, causal)
            fns = {b: (lambda kw=kw: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw))
                   for b, kw in BUILDS.items()}
            fns["SDPA default"] = sdpa_backward_call(q, k, v, dout, causal=causal)
            t = time_interleaved(fns, rounds=ROUNDS, budget_s=2.0)
            bad += check(S, D, causal, seed=S + D + causal + 1)
            failed |= bool(bad)
            base = t["stage's build"].median_us
            print(f"{name}: stage's build {base:9.1f} µs; dq_early=1 {t['dq_early=1'].median_us:9.1f} µs "
                  f"({base / t['dq_early=1'].median_us:.3f}x the build's speed, rounds "
                  + " ".join(f"{a / b:.3f}" for a, b in zip(t["stage's build"].round_medians_us,
                                                           t["dq_early=1"].round_medians_us))
                  + f"); SDPA default {t['SDPA default'].median_us:9.1f} µs (build {t['SDPA default'].median_us / base:.3f}x, "
                  f"dq_early {t['SDPA default'].median_us / t['dq_early=1'].median_us:.3f}x its speed); "
                  f"gradients {'pass' if not bad else 'FAIL: ' + ', '.join(bad)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
