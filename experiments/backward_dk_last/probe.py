"""Stage 8 with DK_LAST (FlashAttention-3's order of products: dK's issued after dQ's, so that the
tensor core runs dK while the warps store the dQ tile) against the build without it, beside SDPA's
default backward (cuDNN), in interleaved rounds on the same tensors. Each row's builds are checked
against float64 autograd on a slice before and after timing (scripts/backward_bench.py's check),
and dK, dV of the two builds compared bit for bit on the timed tensors.

    python3 experiments/backward_dk_last/probe.py [--rounds 7]

--sdp-ahead times, at D 64's rows only, DK_LAST with the next step's Sᵀ and dPᵀ issued behind dK
(SDP_AHEAD, a switch of sdp_ahead.patch, which must be applied: git apply
experiments/backward_dk_last/sdp_ahead.patch).
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_line, check, forward_with_lse, time_builds  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from stages import stage6, stage8  # noqa: E402

# (B, H, S, D, causal): the backward record's four rows, then the training map's D 128 MHA rows at
# S 512 and 1024, where its steps trail SDPA's most
ROWS = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (4, 16, 8192, 128, False), (4, 16, 8192, 128, True),
        (32, 32, 512, 128, False), (16, 32, 1024, 128, True)]
BUILDS = {"build": {"dk_last": 0}, "dk_last": {"dk_last": 1}}  # "build": the stage's before DK_LAST
BUILDS_D64 = {**BUILDS, "dk_last+overlap": {"dk_last": 1, "overlap": 1}}  # D 64's build has no OVERLAP
BUILDS_AHEAD = {**BUILDS, "dk_last+sdp_ahead": {"dk_last": 1, "sdp_ahead": 1}}  # --sdp-ahead, D 64


def passes(builds, B, H, S, D, causal, seed) -> bool:
    return all(c.passed for kw in builds.values()
               for c in check(B, H, S, D, causal, torch.bfloat16, seed, stage6, **kw).values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sdp-ahead", action="store_true", help="D 64's rows with SDP_AHEAD (sdp_ahead.patch applied)")
    a = ap.parse_args()
    ok = True
    print(f"{'row (bf16): other build':34s} {'build':>10s} {'other':>10s} {'b/o':>6s} {'SDPA':>9s} {'S/b':>8s} "
          f"{'S/o':>8s}  rounds (build | other)", flush=True)
    for B, H, S, D, causal in ROWS:
        if a.sdp_ahead and D != 64:
            continue
        builds = BUILDS_AHEAD if a.sdp_ahead else BUILDS_D64 if D == 64 else BUILDS
        seed = torch.randint(0, 2**31 - 1, ()).item()
        ok &= passes(builds, B, H, S, D, causal, seed)
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, seed=seed)
        dout = torch.randn_like(q)
        out, lse = forward_with_lse(q, k, v, causal, stage6)
        g = {name: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw) for name, kw in builds.items()}
        same = all(torch.equal(g["build"][i], x[i]) for x in g.values() for i in (1, 2))
        ok &= same
        t = time_builds(q, k, v, out, dout, lse, causal, builds, rounds=a.rounds)
        for name in list(builds)[1:]:
            print(ab_line(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: {name}", t, "build", name)
                  + ("" if same else "  dK/dV DIFFER"), flush=True)
        del q, k, v, dout, out, lse, g
        ok &= passes(builds, B, H, S, D, causal, seed + 1)
    print("gradients pass, dK and dV bit-equal" if ok else "A CHECK FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
