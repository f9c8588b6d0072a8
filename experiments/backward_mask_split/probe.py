"""Stage 8 with MASK_SPLIT (a step whose tile no mask edge cuts computes its exponentials without
the per-score compares and selects; FlashAttention-3 gives the masked steps a loop of their own)
against the build without it, beside SDPA's default backward (cuDNN), in interleaved rounds on the same
tensors; gradients checked against float64 before and after timing, dK and dV compared bit for bit
(scripts/backward_bench.py's ab_rows).

    python3 experiments/backward_mask_split/probe.py [--rounds 7]
"""
import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_rows  # noqa: E402

# (B, H, S, D, causal): the backward record's four rows, then the training map's shortest rows,
# where a step's exponentials weigh most beside its products (D 64) and the diagonal cuts most steps
ROWS = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (4, 16, 8192, 128, False), (4, 16, 8192, 128, True),
        (32, 16, 512, 64, False), (32, 16, 512, 64, True), (32, 32, 512, 128, True)]
BUILDS = {"build": {"mask_split": 0}, "mask_split": {"mask_split": 1}}  # "build": without it


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    return 0 if ab_rows(ROWS, lambda D: BUILDS, ap.parse_args().rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
