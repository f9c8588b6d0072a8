"""The softmax ping-pong (PINGPONG=2: the consumers take turns at their softmax, as cuDNN's Hopper
kernels do; its SASS at D64 causal S512 has named barriers inside the softmax, results/logs/
2026-11-26-s34call2) on the work queue, which stage 6 has measured only with one block per work
tile (slower there, results/logs/2026-11-25-fd50989-call2). Nsight Compute at D64 causal S512
(call 1) has both consumers of a block in the same phase at once: waiting together for their first
S, then both at their softmax. Turns at the softmax would put one consumer's exponentials beside
the other's products. Schedules made here for the experiment (not in stage6.py): the work queue
with softmax turns, with and without the overlap within a warpgroup; each against the launch as
called in pairs in both orders, checked against the reference first.
Predicted: 0-4% at D64 causal S 512-1024 with the overlap kept; without it slower (it is what
stage 6's first-order win was)."""
import torch

from lib.inputs import make_qkv
from lib.reference import check_output
from lib.timing import time_interleaved
from stages import stage6 as s6

s6.ALL_SCHEDULES["softmax turns, queue"] = dict(s6._FA3, PINGPONG=2, PERSISTENT=1, DYNAMIC_WORK=1)
s6.ALL_SCHEDULES["softmax turns, queue, no overlap"] = dict(s6._FA3, PINGPONG=2, INTRA_OVERLAP=0, PERSISTENT=1, DYNAMIC_WORK=1)

for B, H, Hk, S, D, causal, tiles, qs in [(32, 16, 16, 512, 64, True, (128, 4, 2), 3), (32, 16, 4, 512, 64, True, (128, 4, 2), 3),
                                          (16, 16, 16, 1024, 64, True, (128, 4, 2), 3), (32, 16, 16, 512, 64, False, (128, 4, 2), 3),
                                          (32, 32, 32, 512, 128, True, (128, 2, 2), 3)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, Hkv=Hk)
    fns = {"as called": lambda: s6.attention(q, k, v, causal=causal)}
    for name in ("softmax turns, queue", "softmax turns, queue, no overlap"):
        fn = (lambda name=name: s6.attention(q, k, v, causal=causal, schedule=name, tiles=tiles, q_stages=qs))
        c = check_output(fn(), q, k, v, causal=causal)
        print(f"B{B} H{H}/{Hk} S{S} D{D} {'causal' if causal else 'full'} {name}: check {'passed' if c.passed else 'FAILED ' + c.summary()}", flush=True)
        if c.passed:
            fns[name] = fn
    for name in [n for n in fns if n != "as called"]:
        for order in (("as called", name), (name, "as called")):
            t = time_interleaved({n: fns[n] for n in order}, budget_s=0.4)
            a, b = t["as called"], t[name]
            rounds = ", ".join(f"{x / y:.3f}" for x, y in zip(a.round_medians_us, b.round_medians_us))
            print(f"B{B} H{H}/{Hk} S{S} D{D} {'causal' if causal else 'full'} {name}, {order[0]} first: as called "
                  f"{a.median_us:,.1f} µs, {name} {b.median_us:,.1f} µs: {a.median_us / b.median_us:.3f}x (rounds {rounds})", flush=True)
