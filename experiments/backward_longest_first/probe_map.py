"""LONGEST_FIRST at every causal row it would change before the stage turns it on: the training
map's causal rows (S 512 … 16384 at B·S = 16k, D 64 with 16 heads and D 128 with 32, one K/V head
per query head and 4:1) and the backward record's two causal shapes. Each row: dK and dV of both
orders compared bit for bit, then both builds timed in 5 interleaved rounds with SDPA's default
backward (scripts/backward_bench.py's time_builds, ab_line). The float64 check of the longest-first
build is the GPU test's (tests/test_backward.py) and probe_gqa.py's; here the orders must agree.
Runs on a tree with `longest_first_605fcbf.patch` applied, or on one whose stage has the switch.

    python3 experiments/backward_longest_first/probe_map.py
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(Path(__file__).resolve().parent)]
from backward_bench import SHAPES, TRAIN_GROUP, TRAIN_HEADS  # noqa: E402
from lib.results import SWEEP_SEQS, SWEEP_TOKENS  # noqa: E402
from probe_gqa import run  # noqa: E402  (the same A/B, without the float64 check)


def rows():
    """(B, H, Hkv, S, D), causal: the training map's, then the backward record's."""
    out = [(SWEEP_TOKENS // S, H, Hkv, S, D) for D, H in TRAIN_HEADS.items() for S in SWEEP_SEQS
           for Hkv in (H, H // TRAIN_GROUP)]
    return out + [(B, H, H, S, D) for B, H, S, D in SHAPES]


if __name__ == "__main__":
    sys.exit(run(__doc__, rows(), rounds=5, budget_s=1.0, float64=False))
