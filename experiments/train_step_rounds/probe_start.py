"""Issue 48: are the training map's slow rounds tied to the start of its run? In the maps at
8f913ca and 6ae9eeb the S 512 D 64 causal rows, the map's second and fourth, had rounds 1.2-1.4x
slower than their others while SDPA's agreed; later rows did not. This measures the map's first
eight rows (scripts/backward_bench.py's measure_train_row: checks, seven interleaved rounds, the
GPU not held) twice in one process, the first pass right after the process starts, and prints each
row's rounds for both sides.

    python3 experiments/train_step_rounds/probe_start.py
"""
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "scripts")]
from backward_bench import measure_train_row, train_shapes  # noqa: E402

ROWS = 8


def main() -> int:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("probe_start.py: times stage 6's forward and stage 8's backward, so it needs an H100 or H200 "
              "and none was found", file=sys.stderr)
        return 2
    t0 = time.time()
    for rep in (1, 2):
        for shape in train_shapes()[:ROWS]:
            r = measure_train_row(shape)
            print(f"pass {rep} [{time.time() - t0:5.1f} s] B{r['B']} H{r['H']}/{r['Hkv']} S{r['S']} D{r['D']} "
                  f"{'causal' if r['causal'] else 'full  '}: {r['vs_sdpa']:.2f}x; stage 6 + 8 rounds "
                  + " ".join(f"{x:.0f}" for x in r["round_medians_us"]) + "; SDPA "
                  + " ".join(f"{x:.0f}" for x in r["sdpa_round_medians_us"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
