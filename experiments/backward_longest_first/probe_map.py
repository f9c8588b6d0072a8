"""LONGEST_FIRST at every causal row it would change before the stage turns it on: the training
map's causal rows (S 512 … 16384 at B·S = 16k, D 64 with 16 heads and D 128 with 32, one K/V head
per query head and 4:1) and the backward record's two causal shapes. Each row: dK and dV of both
orders compared bit for bit, then both builds timed in 5 interleaved rounds with SDPA's default
backward (scripts/backward_bench.py's time_builds, ab_line). The float64 check of the longest-first
build is the GPU test's (tests/test_backward.py) and probe_gqa.py's; here the orders must agree.
Runs on a tree with `longest_first_605fcbf.patch` applied, or on one whose stage has the switch.

    python3 experiments/backward_longest_first/probe_map.py
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from backward_bench import SHAPES, TRAIN_GROUP, TRAIN_HEADS, ab_line, forward_with_lse, time_builds  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.results import SWEEP_SEQS, SWEEP_TOKENS  # noqa: E402
from stages import stage6, stage8  # noqa: E402

BUILDS = {"head by head": {"longest_first": 0}, "longest first": {"longest_first": 1}}


def rows():
    """(B, H, Hkv, S, D), causal: the training map's, then the backward record's."""
    out = [(SWEEP_TOKENS // S, H, Hkv, S, D) for D, H in TRAIN_HEADS.items() for S in SWEEP_SEQS
           for Hkv in (H, H // TRAIN_GROUP)]
    return out + [(B, H, H, S, D) for B, H, S, D in SHAPES]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 8's Hopper build (sm_90a), so it needs an H100 or H200 and none was found\n")
    if "LONGEST_FIRST" not in stage8.WGMMA_SWITCHES:
        ap.exit(2, f"{ap.prog}: LONGEST_FIRST is not in this tree's stage 8: "
                   "git apply experiments/backward_longest_first/longest_first_605fcbf.patch first\n")
    ok = True
    print(f"{'row (bf16, causal): other build':34s} {'base':>10s} {'other':>10s} {'b/o':>6s} {'SDPA':>9s} {'S/b':>8s} "
          f"{'S/o':>8s}  rounds (base | other)", flush=True)
    for B, H, Hkv, S, D in rows():
        q, k, v = make_qkv(B, H, S, D, Hkv=Hkv, dtype=torch.bfloat16, seed=torch.randint(0, 2**31 - 1, ()).item())
        dout = torch.randn_like(q)
        out, lse = forward_with_lse(q, k, v, True, stage6)
        g = {n: stage8.attention_backward(q, k, v, out, dout, lse, causal=True, **kw) for n, kw in BUILDS.items()}
        same = all(torch.equal(g["head by head"][i], g["longest first"][i]) for i in (1, 2))
        ok &= same
        t = time_builds(q, k, v, out, dout, lse, True, BUILDS, rounds=5, budget_s=1.0)
        print(ab_line(f"B{B} H{H}/{Hkv} S{S} D{D}: longest first", t, "head by head", "longest first")
              + ("" if same else "  dK/dV DIFFER"), flush=True)
        del q, k, v, dout, out, lse, g
    print("dK and dV bit-equal at every row" if ok else "A CHECK FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
