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

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_line, forward_with_lse as forward, time_builds  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
from stages import stage8  # noqa: E402

ODD = [((1, 4, 2, 200, 333, 64), "bottom_right"), ((2, 3, 3, 257, 257, 64), True), ((1, 6, 2, 130, 77, 64), False),
       ((1, 2, 2, 1000, 1000, 64), True)]
ROWS = [(16, 16, 16, 2048, False), (16, 16, 16, 2048, True), (32, 16, 16, 512, True), (16, 16, 16, 1024, False),
        (16, 16, 4, 1024, True)]  # B, H, Hkv, S, causal at D 64


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
    print(f"{'row (D 64, bf16)':34s} {'stage':>10s} {'arrive':>10s} {'gain':>6s} {'SDPA':>9s} {'SDPA/st':>8s} "
          f"{'SDPA/ar':>8s}  rounds (stage | arrive)", flush=True)
    for B, H, Hkv, S, causal in ROWS:
        q, k, v = make_qkv(B, H, S, 64, Hkv=Hkv, dtype=torch.bfloat16)
        dout = torch.randn_like(q)
        out, lse = forward(q, k, v, causal)
        g0, g1 = (stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, dq_turn_arrive=t) for t in (0, 1))
        assert torch.equal(g0[1], g1[1]) and torch.equal(g0[2], g1[2]), "dK or dV differ"
        t = time_builds(q, k, v, out, dout, lse, causal, {0: {}, 1: {"dq_turn_arrive": 1}}, rounds=a.rounds)
        print(ab_line(f"B{B} H{H}/{Hkv} S{S} {'causal' if causal else 'full'}", t, 0, 1), flush=True)


if __name__ == "__main__":
    main()
