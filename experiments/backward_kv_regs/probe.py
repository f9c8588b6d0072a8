"""Stage 8's D 64 step with K and V held in registers as the A operands of Sᵀ = K·Qᵀ and
dPᵀ = V·dOᵀ (KV_REGS 1; 2: K alone), and with lse read while the products run (PREP_EARLY 3, also
at D 128, where PREP_EARLY 1 reads it before they are issued), each against the stage's build,
beside SDPA's default backward (cuDNN), in interleaved rounds on the same tensors; gradients
checked against float64 before and after timing, dK and dV compared bit for bit
(scripts/backward_bench.py's ab_rows).

    python3 experiments/backward_kv_regs/probe.py [--rounds 9]
"""
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_probe  # noqa: E402

# (B, H, S, D, causal[, dtype]): the backward record's D 64 rows in both dtypes, the training map's
# shortest D 64 rows, a long D 64 row; then D 128 rows for PREP_EARLY 3
ROWS = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (16, 16, 2048, 64, False, torch.float16),
        (16, 16, 2048, 64, True, torch.float16), (32, 16, 512, 64, False), (32, 16, 512, 64, True),
        (4, 16, 8192, 64, False),
        (16, 16, 1024, 128, False), (4, 16, 8192, 128, False), (4, 16, 8192, 128, False, torch.float16),
        (4, 16, 8192, 128, True, torch.float16)]
BUILDS = {  # the first is the stage's build (its switches unsaid)
    64: {"build": {}, "kv_regs=1": {"kv_regs": 1}, "kv_regs=2": {"kv_regs": 2}, "prep_early=3": {"prep_early": 3},
         "kv_regs=1+prep_early=3": {"kv_regs": 1, "prep_early": 3}},
    128: {"build": {}, "prep_early=3": {"prep_early": 3}},
}


if __name__ == "__main__":
    sys.exit(ab_probe(__doc__, ROWS, lambda D: BUILDS[D]))
