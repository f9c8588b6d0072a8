"""Stage 8's causal backward with its key blocks handed out longest first across heads
(LONGEST_FIRST 1) against head by head (0), beside SDPA's default backward, in interleaved rounds
on the same tensors. Before timing, at every row: dK and dV of the two orders must be bitwise
equal (each block computes the same sums whichever order blocks start in; only dQ's float32
additions change order), and both orders' gradients pass the error rule against float64 on a
slice (two heads, or one K/V head's group).

    python3 experiments/backward_longest_first/probe.py [--rounds 7]
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

# (B, H, Hkv, S, D): the backward record's rows, then the training map's short causal ones, and a
# row whose heads leave the last section part-full (H 6 at S 8192 D 128: sections of 4 heads)
ROWS = [(16, 16, 16, 2048, 64), (4, 16, 16, 8192, 128), (32, 16, 16, 512, 64), (16, 16, 16, 1024, 64),
        (16, 32, 32, 1024, 128), (16, 32, 8, 1024, 128), (1, 6, 6, 8192, 128)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    print(f"{'shape':34s} {'hd by hd':>10s} {'longest':>10s} {'gain':>6s} {'SDPA':>9s} "
          f"{'SDPA/hbh':>8s} {'SDPA/lf':>8s}  rounds (head by head | longest first)", flush=True)
    for B, H, Hkv, S, D in ROWS:
        for causal in (True, False) if H == 16 and S in (2048, 8192) else (True,):
            q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, Hkv=Hkv)
            out, lse = forward(q, k, v, causal)
            dout = torch.randn_like(q)
            grads = {lf: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, longest_first=lf)
                     for lf in (0, 1)}
            for name, x, y in zip("qkv", grads[0], grads[1]):
                if name != "q":
                    assert torch.equal(x, y), f"d{name} differs between the orders at {B, H, Hkv, S, D, causal}"
                else:
                    assert (x.float() - y.float()).abs().max().item() <= 2e-2 * x.float().abs().max().item()
            h, hk = (2, 2) if H == Hkv else (H // Hkv, 1)
            small = [t[:1, :h].contiguous() for t in (q, dout)]
            kv = [t[:1, :hk].contiguous() for t in (k, v)]
            out_s, lse_s = forward(small[0], *kv, causal)
            for lf in (0, 1):
                g = stage8.attention_backward(small[0], *kv, out_s, small[1], lse_s, causal=causal, longest_first=lf)
                bad = [n for n, c in check_gradients(g, small[0], *kv, small[1], causal=causal).items() if not c.passed]
                assert not bad, (lf, bad)
            t = time_builds(q, k, v, out, dout, lse, causal, {0: {"longest_first": 0}, 1: {"longest_first": 1}},
                            rounds=a.rounds)
            print(ab_line(f"B{B} H{H}/{Hkv} S{S} D{D} {'causal' if causal else 'full'}", t, 0, 1), flush=True)


if __name__ == "__main__":
    main()
