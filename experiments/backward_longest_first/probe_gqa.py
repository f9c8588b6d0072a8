"""LONGEST_FIRST again, at the rows it was not tried at: the training map's grouped-heads (4:1) D 64
causal rows still under SDPA's step at a7283cb, where stage 8's dK/dV kernel takes 1.13x as long as
with one K/V head per query head (experiments/train_step_parts): a quarter of the blocks, each four
times as long, uneven under the causal mask. Beside them the same rows with as many K/V heads as
query heads. Each row: dK and dV of both orders compared bit for bit, the longest-first build's
gradients checked against float64 on one K/V group (before and after timing), both builds timed in
7 interleaved rounds with SDPA's default backward (scripts/backward_bench.py's time_builds, ab_line).
Ran on a tree with `longest_first_605fcbf.patch` applied; since bf75975 the stage has the switch.

    python3 experiments/backward_longest_first/probe_gqa.py
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from backward_bench import ab_line, forward_with_lse, time_builds  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
from stages import stage6, stage8  # noqa: E402

ROWS = [(4, 16, 4, 4096, 64), (2, 16, 4, 8192, 64), (32, 16, 4, 512, 64), (4, 16, 16, 4096, 64),
        (2, 16, 16, 8192, 64), (16, 32, 8, 1024, 128)]  # (B, H, Hkv, S, D), causal; the last: the first A/B's
BUILDS = {"head by head": {"longest_first": 0}, "longest first": {"longest_first": 1}}


def passes(H, Hkv, S, D, seed) -> bool:
    g = H // Hkv
    q, k, v = make_qkv(1, g, S, D, Hkv=1, dtype=torch.bfloat16, seed=seed)
    dout = torch.randn_like(q)
    out, lse = forward_with_lse(q, k, v, True, stage6)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=True, longest_first=1)
    return all(c.passed for c in check_gradients(grads, q, k, v, dout, causal=True).values())


def run(doc: str, rows, rounds: int = 7, budget_s: float = 2.0, float64: bool = True) -> int:
    """Each causal row (B, H, Hkv, S, D), bf16: dK and dV of both orders compared bit for bit, then both
    builds timed in `rounds` interleaved rounds with SDPA's default backward; float64: the longest-
    first build also checked against float64 on one K/V group before and after timing."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 8's Hopper build (sm_90a), so it needs an H100 or H200 and none was found\n")
    if "LONGEST_FIRST" not in stage8.WGMMA_SWITCHES:
        ap.exit(2, f"{ap.prog}: LONGEST_FIRST is not in this tree's stage 8: "
                   "git apply experiments/backward_longest_first/longest_first_605fcbf.patch first\n")
    ok = True
    print(f"{'row (bf16, causal): other build':34s} {'base':>10s} {'other':>10s} {'b/o':>6s} {'SDPA':>9s} {'S/b':>8s} "
          f"{'S/o':>8s}  rounds (base | other)", flush=True)
    for B, H, Hkv, S, D in rows:
        seed = torch.randint(0, 2**31 - 1, ()).item()
        ok &= not float64 or passes(H, Hkv, S, D, seed)
        q, k, v = make_qkv(B, H, S, D, Hkv=Hkv, dtype=torch.bfloat16, seed=seed)
        dout = torch.randn_like(q)
        out, lse = forward_with_lse(q, k, v, True, stage6)
        g = {n: stage8.attention_backward(q, k, v, out, dout, lse, causal=True, **kw) for n, kw in BUILDS.items()}
        same = all(torch.equal(g["head by head"][i], g["longest first"][i]) for i in (1, 2))
        ok &= same
        t = time_builds(q, k, v, out, dout, lse, True, BUILDS, rounds=rounds, budget_s=budget_s)
        print(ab_line(f"B{B} H{H}/{Hkv} S{S} D{D}: longest first", t, "head by head", "longest first")
              + ("" if same else "  dK/dV DIFFER"), flush=True)
        del q, k, v, dout, out, lse, g
        ok &= not float64 or passes(H, Hkv, S, D, seed + 1)
    print(("gradients pass, " if float64 else "") + "dK and dV bit-equal" if ok else "A CHECK FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run(__doc__, ROWS))
