"""Experiment (issue 21): how much the L2 fetches from memory for each copy-engine request.

A tensor map says, besides the box and the swizzle, how the L2 promotes a TMA request: fetch only
the sectors asked for (none, cuda.core's default and stage 6's until now), or round each miss up
to 64, 128 or 256 bytes. CUTLASS encodes its maps with 128 bytes, so FlashAttention-3's and
cuDNN's Hopper kernels read with it; stage 6 never set it. The decoding rows still under SDPA
are the ones that stream K and V at 2.7-2.9 TB/s where cuDNN reads 2.75-3.06 (Nsight Compute,
results/logs/2026-11-26-96dd84c-h100: stage 6 waits on memory, 0.2 instructions issued per cycle per
scheduler), so how the L2 asks the memory for lines is a place the last percent may be.

Predicted: at the streaming decoding rows (B8-B64, Sk 4k-32k), 128 or 256 bytes gain 1-3%; at the
short rows and at prefill (K and V read once from memory, then many times from the L2) nothing
beyond the noise. Stage 8's backward, which borrows stage 6's tensor_map, is not touched.

Measured (results/logs/2026-11-26-3525efe-h100, at 3525efe, where stage 6 had the `l2_promotion`
option; the option was not kept, and this script runs only at that commit): no. Against none, same
rounds, every variant checked: decoding 0.978-1.021x (median 1.00x with 128 and 256 bytes, Sq 1 and 4),
prompts of S <= 2048 0.985-1.010x, and S >= 4096 slower: 0.93-1.00x with 128 bytes (median
0.98x), 0.89-1.00x with 256 (median 0.95x; B1 H32 S16384 D128 full 7,759 µs against 6,909).

This times, at the recorded map's rows (decoding Sq 1 and Sq 4, prefill; bf16), stage 6 as it is
called against the same call with l2_promotion 128 and 256, with SDPA default and FLASH in the
same interleaved rounds; every variant checked against the float64 reference before and after
timing. Logs only (--out): nothing is recorded.

    python experiments/l2_promotion/l2_promotion_ab.py --out l2_promotion.json [--parts decode1 decode4 prefill]
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

PARTS = {"decode1": ("decode", 1), "decode4": ("decode", 4), "prefill": ("prefill", None)}


def variants(promotions):
    """(fields, options): as called (stage6.L2_PROMOTION), then each other promotion."""
    out = [({"variant": f"as called ({s6.L2_PROMOTION} B)"}, None)]
    out += [({"variant": f"L2 promotion {p} B"}, {"l2_promotion": p}) for p in promotions if p != s6.L2_PROMOTION]
    return out


def shapes(record, parts):
    keep = []
    for name in parts:
        part, sq = PARTS[name]
        keep += [r for r in record["shape_map"]["rows"] if r["part"] == part and r["dtype"] == "bfloat16"
                 and (sq is None or r["Sq"] == sq)]
    return [{k: r[k] for k in ("part", "B", "H", "Hkv", "Sq", "Sk", "D", "dtype", "causal")}
            | {"recorded_vs_sdpa": r["vs_sdpa"]} for r in keep]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every row, with the env, as JSON")
    ap.add_argument("--budget-s", type=float, default=0.3, help="seconds of timing per callable and shape")
    ap.add_argument("--limit", type=int, default=None, help="only the first N shapes (a smoke run)")
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS),
                    help="which rows of the recorded map: decoding with Sq 1, with Sq 4, prefill")
    ap.add_argument("--promotions", nargs="+", type=int, choices=(0, 64, 128, 256), default=[0, 128, 256],
                    help="bytes the L2 fetches per request, each a variant beside the call as it is")
    a = ap.parse_args()
    if not hasattr(s6, "L2_PROMOTIONS"):
        ap.exit(2, f"{ap.prog}: needs stage 6's l2_promotion option, which was not kept: run it at commit 3525efe, "
                   "where results/logs/2026-11-26-3525efe-h100 was made\n")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 6 (sm_90a), so it needs an H100 or H200 and none was found\n")
    env = R.capture_env()
    todo = shapes(R.load(R.results_path(env["gpu"])), a.parts)[:a.limit]
    return shape_map.run_variant_shapes(todo, lambda row: variants(a.promotions), a.budget_s, a.out, env)


if __name__ == "__main__":
    sys.exit(main())
