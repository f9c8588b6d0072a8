"""Experiment (issue 21): short prompts in blocks of one consumer, two or three per SM.

Decoding gained from two blocks per SM (stage 6's shares_sms; results/logs/2026-11-26-e2d106f-h100):
while one block starts or ends, the other streams. Short prompts have the same trouble in
another form: at S 512 a work tile of 128 query rows has 1-4 key tiles, and the persistent
launch's fixed costs per work tile (the wait for Q, the diagonal tile's masking, O's stores)
are a large share of it. Two consumers in one block take turns only inside a work tile; blocks
of one consumer (64 rows, no ping-pong), two or three per SM, are scheduled by the hardware:
one block's softmax and epilogue run while the other's products are in the tensor cores, and a
block that ends frees its SM share at once.

Predicted: at D64 causal S 512-1024 (the map's lowest rows, 0.92-0.94x SDPA), level or better
than the persistent two-consumer launch if the fixed costs per work tile are what it loses to;
at S 2048 and full attention, slower (each block reads K and V for 64 rows instead of 128: twice
the K/V traffic per query row, which the persistent blocks of 128-192 rows do not pay).

Measured (results/logs/2026-11-26-e7d7c94-h100): no, slower at every row. Blocks of one consumer ran
0.71-0.86x of as called at D128 and 0.74-0.99x at D64 (three per SM with 64-key tiles the best of them:
0.93-1.00x of as called at D64 causal, 0.84-0.93x full), so stage 6 keeps its persistent
launches for prompts.

This times, at the recorded map's prefill rows with S <= 2048 (bf16), stage 6 as it is called
against blocks of one consumer with two or three per SM (BLOCKS_PER_SM), SDPA default and FLASH
in the same interleaved rounds; each variant checked against the float64 reference before and
after timing. Logs only (--out): nothing is recorded.

    python experiments/prefill_blocks/prefill_blocks_ab.py --out prefill_blocks.json
"""
import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import results as R  # noqa: E402

_spec = importlib.util.spec_from_file_location("shape_map_script", ROOT / "scripts" / "shape_map.py")
shape_map = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shape_map)

# (tiles, blocks per SM) per head dim: one consumer, rings that fit two or three times in an SM
BLOCKS = {64: [((128, 2, 1), 2), ((64, 4, 1), 2), ((64, 4, 1), 3)], 128: [((64, 2, 1), 2)]}
MAX_S = 2048


def variants(D):
    out = [({"variant": "as called"}, None)]
    for tiles, blocks in BLOCKS[D]:
        out.append(({"variant": f"{blocks} blocks/SM {tiles}"},
                    {"tiles": tiles, "schedule": s6.DECODE_SCHEDULE, "pack_gqa": False, "splits": 1,
                     "blocks_per_sm": blocks}))
    return out


def shapes(record):
    rows = [r for r in record["shape_map"]["rows"]
            if r["part"] == "prefill" and r["dtype"] == "bfloat16" and r["Sq"] <= MAX_S]
    return [{k: r[k] for k in ("B", "H", "Hkv", "Sq", "Sk", "D", "dtype", "causal")} | {
        "part": "prefill blocks", "recorded_vs_sdpa": r["vs_sdpa"]} for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every row, with the env, as JSON")
    ap.add_argument("--budget-s", type=float, default=0.3, help="seconds of timing per callable and shape")
    ap.add_argument("--limit", type=int, default=None, help="only the first N shapes (a smoke run)")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 6 (sm_90a), so it needs an H100 or H200 and none was found\n")
    env = R.capture_env()
    todo = shapes(R.load(R.results_path(env["gpu"])))[:a.limit]
    return shape_map.run_variant_shapes(todo, lambda row: variants(row["D"]), a.budget_s, a.out, env)


if __name__ == "__main__":
    sys.exit(main())
