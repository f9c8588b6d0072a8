"""Stage 8 with DK_LAST (FlashAttention-3's order of products: dK's issued after dQ's, so that the
tensor core runs dK while the warps store the dQ tile) against the build without it, beside SDPA's
default backward (cuDNN), in interleaved rounds on the same tensors. Each row's builds are checked
against float64 autograd on a slice before and after timing (scripts/backward_bench.py's ab_rows),
and dK, dV of the two builds compared bit for bit on the timed tensors.

    python3 experiments/backward_dk_last/probe.py [--rounds 7]

--sdp-ahead times, at D 64's rows only, DK_LAST with the next step's Sᵀ and dPᵀ issued behind dK
(SDP_AHEAD, a switch of sdp_ahead.patch, which must be applied: git apply
experiments/backward_dk_last/sdp_ahead.patch).
"""
import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_rows  # noqa: E402

# (B, H, S, D, causal): the backward record's four rows, then the training map's D 128 MHA rows at
# S 512 and 1024, where its steps trail SDPA's most
ROWS = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (4, 16, 8192, 128, False), (4, 16, 8192, 128, True),
        (32, 32, 512, 128, False), (16, 32, 1024, 128, True)]
BUILDS = {"build": {"dk_last": 0}, "dk_last": {"dk_last": 1}}  # "build": the stage's before DK_LAST
BUILDS_D64 = {**BUILDS, "dk_last+overlap": {"dk_last": 1, "overlap": 1}}  # D 64's build has no OVERLAP
BUILDS_AHEAD = {**BUILDS, "dk_last+sdp_ahead": {"dk_last": 1, "sdp_ahead": 1}}  # --sdp-ahead, D 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sdp-ahead", action="store_true", help="D 64's rows with SDP_AHEAD (sdp_ahead.patch applied)")
    a = ap.parse_args()
    if a.sdp_ahead:
        return 0 if ab_rows([r for r in ROWS if r[3] == 64], lambda D: BUILDS_AHEAD, a.rounds) else 1
    return 0 if ab_rows(ROWS, lambda D: BUILDS_D64 if D == 64 else BUILDS, a.rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
