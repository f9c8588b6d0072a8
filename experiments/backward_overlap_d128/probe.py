"""Stage 8 at D 128 with and without OVERLAP (each product its own commit group, the exponentials
computed while the next product runs), against the build as called, in interleaved rounds on the
same tensors: does the default earn its place? (The H100 record's variant table showed the build
without it 1.06x faster at D 128 full and 0.95x causal.) Gradients checked for both builds.

    python3 experiments/backward_overlap_d128/probe.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
from stages import stage5, stage8  # noqa: E402


def main():
    print(f"{'shape':28s} {'as built µs':>12s} {'overlap=0 µs':>13s} {'as built / overlap=0':>21s}  rounds (as built | overlap=0)")
    for B, H, S, D in ((4, 16, 8192, 128), (16, 16, 2048, 128)):
        for causal in (False, True):
            q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
            lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
            out = stage5.attention(q, k, v, causal=causal, lse=lse)
            dout = torch.randn_like(q)
            calls = {"built": lambda: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal),
                     "no_overlap": lambda: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, overlap=0)}
            small = [t[:1, :2] for t in (q, k, v, dout)]
            lse_s = torch.empty(small[0].shape[:3], dtype=torch.float32, device="cuda")
            out_s = stage5.attention(*small[:3], causal=causal, lse=lse_s)
            for name, kw in (("built", {}), ("no_overlap", {"overlap": 0})):
                g = stage8.attention_backward(*small[:3], out_s, small[3], lse_s, causal=causal, **kw)
                bad = [n for n, c in check_gradients(g, *small[:3], small[3], causal=causal).items() if not c.passed]
                assert not bad, (name, bad)
            t = time_interleaved(calls, rounds=7)
            a, b = t["built"], t["no_overlap"]
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full':6s} {a.median_us:12,.0f} {b.median_us:13,.0f} "
                  f"{b.median_us / a.median_us:21.3f}  {[round(x) for x in a.round_medians_us]} | {[round(x) for x in b.round_medians_us]}")


if __name__ == "__main__":
    main()
