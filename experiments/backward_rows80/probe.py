"""Stage 8's D 128 step with 80 queries instead of 64 (ROWS80: FlashAttention-3's full-attention
tile, dQᵀ = Kᵀ·dSᵀ, one buffer of dQ tiles), against the stage's build and against a 64-row build
with the same other switches (DK_LAST and PREP_EARLY off, which ROWS80 needs to fit 240 registers
without serializing its wgmma), beside SDPA's default backward (cuDNN), in interleaved rounds on the
same tensors; every build's gradients checked against float64 before and after timing
(scripts/backward_bench.py's ab_rows; the 80-row build sums in another order, so no bit comparison).

    python3 experiments/backward_rows80/probe.py [--rounds 9]
"""
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_probe  # noqa: E402

# (B, H, S, D, causal[, dtype]): the backward record's D 128 rows (bf16, fp16), then the training
# map's D 128 full rows at S 512, 1024 and 2048 (16k tokens)
ROWS = [(4, 16, 8192, 128, False), (4, 16, 8192, 128, False, torch.float16), (4, 16, 8192, 128, True),
        (4, 16, 8192, 128, True, torch.float16), (32, 16, 512, 128, False), (16, 16, 1024, 128, False),
        (8, 16, 2048, 128, False)]
SAME_SWITCHES = {"dk_last": 0, "prep_early": 0}
BUILDS = {"build": {}, "64 rows, dk_last=0 prep_early=0": SAME_SWITCHES, "rows80": {"rows80": 1, **SAME_SWITCHES}}


if __name__ == "__main__":
    sys.exit(ab_probe(__doc__, ROWS, lambda D: BUILDS, exact=lambda D: None))
