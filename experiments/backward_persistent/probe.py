"""Stage 8 with PERSISTENT (one block per SM walking work tiles i, i + grid, …, as cuDNN's backward
kernel runs) against a block per tile, beside SDPA's default backward, in interleaved rounds on
the same tensors: the backward record's rows, the training map's short rows, and D 96. Each row's
dK and dV bitwise equal between the two, and both builds' gradients against float64 on a slice.

    python3 experiments/backward_persistent/probe.py [--rounds 7]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_line, check_heads, forward_with_lse, time_builds  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
from stages import stage5, stage6, stage8  # noqa: E402

ROWS = [(16, 16, 16, 2048, 64, False), (16, 16, 16, 2048, 64, True), (4, 16, 16, 8192, 128, False),
        (4, 16, 16, 8192, 128, True), (32, 16, 16, 512, 64, True), (16, 16, 16, 1024, 64, False),
        (16, 32, 32, 1024, 128, True), (32, 32, 8, 512, 128, False), (4, 16, 16, 4096, 96, False)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    print(f"{'row (bf16)':34s} {'per tile':>10s} {'persist':>10s} {'gain':>6s} {'SDPA':>9s} {'SDPA/pt':>8s} "
          f"{'SDPA/ps':>8s}  rounds (a block per tile | persistent)", flush=True)
    for B, H, Hkv, S, D, causal in ROWS:
        fwd = stage5 if D in (64, 128) else stage6
        q, k, v = make_qkv(B, H, S, D, Hkv=Hkv, dtype=torch.bfloat16)
        dout = torch.randn_like(q)
        hq, hk = check_heads(H, Hkv)  # two heads, or one K/V head's group
        sl = [t[:1, :hq].contiguous() for t in (q, dout)]
        kv = [t[:1, :hk].contiguous() for t in (k, v)]
        out_s, lse_s = forward_with_lse(sl[0], *kv, causal, fwd)
        for p in (0, 1):
            gr = stage8.attention_backward(sl[0], *kv, out_s, sl[1], lse_s, causal=causal, persistent=p)
            bad = [n for n, c in check_gradients(gr, sl[0], *kv, sl[1], causal=causal).items() if not c.passed]
            assert not bad, (B, H, Hkv, S, D, causal, p, bad)
        out, lse = forward_with_lse(q, k, v, causal, fwd)
        g0, g1 = (stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, persistent=p) for p in (0, 1))
        assert torch.equal(g0[1], g1[1]) and torch.equal(g0[2], g1[2]), "dK or dV differ"
        gap = (g0[0].float() - g1[0].float()).abs().max().item()  # dQ: the same sums, added in another order
        assert gap <= 2 ** -6 * g0[0].float().abs().max().item() + 1e-6, f"dQ differs by {gap}"
        t = time_builds(q, k, v, out, dout, lse, causal, {0: {"persistent": 0}, 1: {"persistent": 1}}, rounds=a.rounds)
        print(ab_line(f"B{B} H{H}/{Hkv} S{S} D{D} {'causal' if causal else 'full'}", t, 0, 1), flush=True)
        del q, k, v, dout, out, lse


if __name__ == "__main__":
    main()
