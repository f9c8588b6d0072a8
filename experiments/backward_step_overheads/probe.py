"""Stage 8's step with dSᵀ stored by stmatrix (DS_STMATRIX), with lse (and at D 64 δ) read into
registers and the step's first query row worked out before the waits for Sᵀ and dPᵀ (PREP_EARLY),
and both, each against the stage's build, beside SDPA's default backward (cuDNN), in interleaved
rounds on the same tensors; gradients checked against float64 before and after timing, dK and dV
compared bit for bit (scripts/backward_bench.py's ab_rows).

    python3 experiments/backward_step_overheads/probe.py [--rounds 9]
"""
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import ab_probe  # noqa: E402

# (B, H, S, D, causal): the backward record's four rows, then the training map's shortest D 64 rows
ROWS = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (4, 16, 8192, 128, False), (4, 16, 8192, 128, True),
        (32, 16, 512, 64, False), (32, 16, 512, 64, True), (16, 16, 1024, 128, False)]
BUILDS = {  # the first is the stage's build (its switches unsaid)
    64: {"build": {}, "ds_stmatrix": {"ds_stmatrix": 1}, "prep_early=1": {"prep_early": 1},
         "prep_early=2": {"prep_early": 2}, "prep_early=2+ds_stmatrix": {"prep_early": 2, "ds_stmatrix": 1}},
    128: {"build": {}, "ds_stmatrix": {"ds_stmatrix": 1}, "prep_early=1": {"prep_early": 1},
          "prep_early=1+ds_stmatrix": {"prep_early": 1, "ds_stmatrix": 1}},
}
# The first run (h200_d31ad79.log) timed OVERLAP at D 64, alone and with DS_STMATRIX or DK_LAST, instead
# of PREP_EARLY: 0.981-0.994x the stage's build (that form: git show d31ad79:experiments/backward_step_overheads/probe.py).


if __name__ == "__main__":
    sys.exit(ab_probe(__doc__, ROWS, lambda D: BUILDS[D]))
