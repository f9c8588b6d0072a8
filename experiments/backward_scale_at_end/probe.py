"""Stage 8 with SCALE_AT_END (dS = P ∘ (dP − δ) without the softmax scale, which dK's accumulators take
once before their store and the postprocess once per element of dQ: one multiply a score less every
step) against the build without it, beside SDPA's default backward (cuDNN), in interleaved rounds on
the same tensors; gradients checked against float64 before and after timing, dV compared bit for bit,
and dK too at D 64, whose scale 2⁻³ leaves every rounding where it was (scripts/backward_bench.py's
ab_rows).

    python3 experiments/backward_scale_at_end/probe.py [--rounds 7]
"""
import argparse
import math
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_rows  # noqa: E402

# (B, H, S, D, causal): the backward record's four rows, then the training map's shortest MHA rows,
# where it runs under SDPA's step
ROWS = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (4, 16, 8192, 128, False), (4, 16, 8192, 128, True),
        (32, 16, 512, 64, False), (32, 16, 512, 64, True), (32, 32, 512, 128, False), (32, 32, 512, 128, True),
        (16, 16, 1024, 64, False)]
BUILDS = {"build": {"scale_at_end": 0}, "scale_at_end": {"scale_at_end": 1}}  # "build": without it


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    exact = lambda D: math.log2(D ** -0.5).is_integer()  # noqa: E731
    return 0 if ab_rows(ROWS, lambda D: BUILDS, ap.parse_args().rounds, exact=exact) else 1


if __name__ == "__main__":
    sys.exit(main())
