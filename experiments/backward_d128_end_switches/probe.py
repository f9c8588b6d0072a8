"""Stage 8 at D 128 with SCALE_AT_END (the softmax scale on dK and dQ once, not on every score of dS)
and EPILOGUE_SMEM (dK and dV stored through shared memory in 16-byte pieces) on, each alone and
both, against the stage's build (both off at S 8192), beside SDPA's default backward (cuDNN), in
interleaved rounds on the same tensors; gradients checked against float64 before and after timing,
dV compared bit for bit (SCALE_AT_END rounds dK differently at D 128: scripts/backward_bench.py's
ab_rows with exact False).

    python3 experiments/backward_d128_end_switches/probe.py [--rounds 9]
"""
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_probe  # noqa: E402

# (B, H, S, D, causal[, dtype]): the backward record's D 128 rows (bf16, fp16), then the training
# map's D 128 rows at S 2048 and 8192 (MHA, 16k tokens)
ROWS = [(4, 16, 8192, 128, False), (4, 16, 8192, 128, True), (4, 16, 8192, 128, False, torch.float16),
        (4, 16, 8192, 128, True, torch.float16), (8, 16, 2048, 128, False), (8, 16, 2048, 128, True),
        (2, 32, 8192, 128, False)]
BUILDS = {"build": {}, "scale_at_end=1": {"scale_at_end": 1}, "epilogue_smem=1": {"epilogue_smem": 1},
          "both": {"scale_at_end": 1, "epilogue_smem": 1}}


if __name__ == "__main__":
    sys.exit(ab_probe(__doc__, ROWS, lambda D: BUILDS, exact=lambda D: False))
