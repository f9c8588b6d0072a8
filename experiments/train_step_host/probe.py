"""Issue 48, item 3: where does a training step through autograd spend host time? A step is
stage 6's forward + stage 8's backward through autograd (torch.autograd.grad of the output), timed
with lib.timing.time_host (wall time per call of back-to-back calls, GPU time beside it) against
SDPA's step on the same tensors; then cProfile of many back-to-back steps, the top functions by
their own time and cumulative time.

    python3 experiments/train_step_host/probe.py [--profile]
"""
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import time_host  # noqa: E402
from functools import partial  # noqa: E402

from stages import autograd, stage6  # noqa: E402

train_attention = partial(autograd.attention, forward=6)  # stage 6 forward, stage 8 backward

SHAPES = [(1, 8, 512, 64), (8, 16, 1024, 64), (4, 16, 2048, 128)]


def step_fn(attn, q, k, v, do):
    def step():
        return torch.autograd.grad(attn(q, k, v), (q, k, v), do)
    return step


def sdpa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def main():
    print(f"{'shape':22s} {'stage6 host':>11s} {'gpu':>8s} {'sdpa host':>10s} {'gpu':>8s} {'fwd host':>9s} {'sdpa fwd':>9s}")
    for B, H, S, D in SHAPES:
        q, k, v = (t.requires_grad_() for t in make_qkv(B, H, S, D, dtype=torch.bfloat16))
        do = torch.randn_like(q)
        ours = time_host(step_fn(train_attention, q, k, v, do))
        base = time_host(step_fn(sdpa, q, k, v, do))
        with torch.no_grad():
            f_ours = time_host(lambda: stage6.attention(q, k, v))
            f_base = time_host(lambda: sdpa(q, k, v))
        print(f"B{B} H{H} S{S} D{D}".ljust(22) + f"{ours.host_us:11.1f} {ours.gpu_us:8.1f} {base.host_us:10.1f} "
              f"{base.gpu_us:8.1f} {f_ours.host_us:9.1f} {f_base.host_us:9.1f}")
    if "--profile" in sys.argv:
        q, k, v = (t.requires_grad_() for t in make_qkv(1, 8, 512, 64, dtype=torch.bfloat16))
        do = torch.randn_like(q)
        step = step_fn(train_attention, q, k, v, do)
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            step()
        torch.cuda.synchronize()
        prof.disable()
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(28)
            print(s.getvalue()[-6000:])


if __name__ == "__main__":
    main()
