"""Stage 8 at D 64 with DQ_TURN_ARRIVE (the warpgroup whose turn at dQ it is not only arrives at the
dSᵀ exchange, instead of waiting there for the other's stores) against the stage's build, beside
SDPA's default backward, in interleaved rounds on the same tensors. First, at odd shapes (GQA,
Sq != Sk, both causal alignments, several seeds) both builds' gradients against float64 autograd,
and dK and dV of the two builds bitwise equal at every timed row.

    python3 experiments/backward_turn_arrive/probe.py [--rounds 7] [--check-only]
    compute-sanitizer --tool synccheck python3 experiments/backward_turn_arrive/probe.py --check-only
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
from lib.timing import sdpa_backward_call, time_interleaved  # noqa: E402
from stages import stage5, stage8  # noqa: E402

ODD = [((1, 4, 2, 200, 333, 64), "bottom_right"), ((2, 3, 3, 257, 257, 64), True), ((1, 6, 2, 130, 77, 64), False),
       ((1, 2, 2, 1000, 1000, 64), True)]
ROWS = [(16, 16, 16, 2048, False), (16, 16, 16, 2048, True), (32, 16, 16, 512, True), (16, 16, 16, 1024, False),
        (16, 16, 4, 1024, True)]  # B, H, Hkv, S, causal at D 64


def forward(q, k, v, causal):
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    return stage5.attention(q, k, v, causal=causal, lse=lse), lse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--check-only", action="store_true")
    a = ap.parse_args()
    for (B, H, Hk, Sq, Sk, D), causal in ODD:
        for seed in range(3):
            q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=torch.bfloat16, device="cuda", seed=seed)
            dout = torch.randn_like(q)
            out, lse = forward(q, k, v, causal)
            for ta in (0, 1):
                g = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, dq_turn_arrive=ta)
                bad = [f"{n}: {c.summary()}" for n, c in check_gradients(g, q, k, v, dout, causal=causal).items()
                       if not c.passed]
                assert not bad, ((B, H, Hk, Sq, Sk, D), causal, seed, ta, bad)
    print(f"gradients pass against float64 at {len(ODD)} odd shapes x 3 seeds, both builds", flush=True)
    if a.check_only:
        return
    print(f"{'row (D 64, bf16)':28s} {'stage':>8s} {'arrive':>8s} {'gain':>6s} {'SDPA':>8s} {'SDPA/st':>8s} "
          f"{'SDPA/ar':>8s}  rounds (stage | arrive)", flush=True)
    for B, H, Hkv, S, causal in ROWS:
        q, k, v = make_qkv(B, H, S, 64, Hkv=Hkv, dtype=torch.bfloat16)
        dout = torch.randn_like(q)
        out, lse = forward(q, k, v, causal)
        g0, g1 = (stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, dq_turn_arrive=t) for t in (0, 1))
        assert torch.equal(g0[1], g1[1]) and torch.equal(g0[2], g1[2]), "dK or dV differ"
        calls = {t: (lambda t=t: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, dq_turn_arrive=t))
                 for t in (0, 1)}
        calls["sdpa"] = sdpa_backward_call(q, k, v, dout, causal=causal)
        t = time_interleaved(calls, rounds=a.rounds, budget_s=2.0)
        x, y, s = t[0].median_us, t[1].median_us, t["sdpa"].median_us
        print(f"B{B} H{H}/{Hkv} S{S} {'causal' if causal else 'full':6s}      {x:8,.0f} {y:8,.0f} {x / y:6.3f} {s:8,.0f} "
              f"{s / x:8.3f} {s / y:8.3f}  {[round(r) for r in t[0].round_medians_us]} | "
              f"{[round(r) for r in t[1].round_medians_us]}", flush=True)


if __name__ == "__main__":
    main()
