"""What one block of stage 8's dK/dV kernel costs beyond its steps. Three calls with the same work
(Sq·Sk fixed, full attention) split into 4, 2 and 1 times as many key blocks, each walking 1/4, 1/2
and all of the query steps: B33 H8 (264 heads, so that every call's blocks fill whole waves of the
132 SMs) at (Sq, Sk) = (2048, 2048), (4096, 1024), (8192, 512). With T = waves × (steps · s + X),
X (a block's cost beyond its steps: its start, K and V, the first loads, dK and dV out) is the
difference of the first and last calls over the difference of their waves. SDPA's default
backward (cuDNN's persistent kernel) in the same rounds; each shape's gradients checked on a slice
against float64 autograd first.

    python3 experiments/backward_block_cost/probe.py [--rounds 5]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import forward_with_lse as forward, time_builds  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
from stages import stage8  # noqa: E402

B, H, SMS = 33, 8, 132
SHAPES = [(2048, 2048), (4096, 1024), (8192, 512)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    for D in (64, 128):
        keys = stage8.config(D, wgmma=1)["block_n"]
        got = []
        for Sq, Sk in SHAPES:
            q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, dtype=torch.bfloat16)
            dout = torch.randn_like(q)
            sl = [t[:1, :2].contiguous() for t in (q, k, v, dout)]
            out_s, lse_s = forward(*sl[:3], False)
            g = stage8.attention_backward(*sl[:3], out_s, sl[3], lse_s, causal=False)
            bad = [n for n, c in check_gradients(g, *sl[:3], sl[3], causal=False).items() if not c.passed]
            assert not bad, (D, Sq, Sk, bad)
            out, lse = forward(q, k, v, False)
            t = time_builds(q, k, v, out, dout, lse, False, {"stage 8": {}}, rounds=a.rounds)
            blocks, steps = B * H * (Sk // keys), Sq // 64
            got.append((blocks / SMS, t["stage 8"].median_us, t["SDPA default"].median_us))
            print(f"D{D} Sq{Sq} Sk{Sk}: {blocks} blocks ({blocks / SMS:.0f} waves) of {steps} steps: stage 8 "
                  f"{t['stage 8'].median_us:9,.1f} µs, SDPA default {t['SDPA default'].median_us:9,.1f} µs "
                  f"({t['SDPA default'].median_us / t['stage 8'].median_us:.3f}x)", flush=True)
            del q, k, v, dout, out, lse
        (w1, t1, c1), (w3, t3, c3) = got[0], got[-1]
        x = (t1 - t3) / (w1 - w3)
        print(f"D{D}: a block's cost beyond its steps X = {x:.2f} µs; at {w1:.0f} waves that is {w1 * x / t1:.1%} "
              f"of stage 8's {t1:,.0f} µs; cuDNN's time changes by {c1 / c3:.3f}x over the same three splits", flush=True)


if __name__ == "__main__":
    main()
