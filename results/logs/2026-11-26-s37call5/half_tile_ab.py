"""(Kept as GPU call 5 of session 37 ran it, from scripts/ at b0f0259, with stage 6 as
half_last_tile.patch beside it changed it; neither is in the tree any more. Measured, same
rounds, bf16: D64 causal S 512 1.010-1.011x, S 1024 1.002-1.009x, S 2048 1.017-1.021x, S 4096
0.99-1.00x; full attention, where no tile is halved, 0.980-0.997x. Below the prediction: consumer
0 finishes early, but a work tile ends with consumer 1, whose diagonal tile is whole. The run
stopped at the first D128 row: its reference check, on a smaller shape, gets 176-key tiles, which
refuse half_last.)

Experiment (issue 21): a consumer's last key tile computed 64 keys wide where its upper 64
keys are all masked for the consumer's rows (stage 6's HALF_LAST_TILE, option half_last).

With a causal mask and two consumers of 64 rows over a tile of 128 keys, consumer 0's rows end
64 keys before the diagonal tile does: half of that tile's products and exponentials make
scores the mask then zeroes. At S 512 a 128-row work tile has 1-4 key tiles, so consumer 0
spends 2 of its 10 tile-products per head on masked scores (20%), consumer 1 none; at S 1024,
4 of 36 (11%). The last tile of a sequence that ends 64 keys or less into a tile is the same
case for every consumer, with or without a mask.

Predicted: at D64 causal S 512 (the map's lowest rows, 0.93x SDPA) 3-6% faster, S 1024 2-3%,
S 2048-4096 about 1%: the work saved is consumer 0's, and the tensor cores and MUFU are each
busy about 30% of the time there (Nsight Compute, results/logs/2026-11-26-s34call4), so less
work shortens the consumers' chains rather than a shared unit's queue. Full attention at
powers of two: no tile is halved, 1.00x. At D128 short prompts the half tile needs the carried
P·V off (the build has no room for both): the pair is timed against the call as it is and
against the carried P·V alone switched off.

This times, at the recorded map's prefill rows with S <= 4096 (bf16) and two odd lengths, stage
6 as it is called against the same call with the half last tile, SDPA default and FLASH in
the same interleaved rounds; each variant checked against the float64 reference before and
after timing. Logs only (--out): nothing is recorded.

    python scripts/half_tile_ab.py --out half_tile.json
"""
import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import results as R  # noqa: E402

_spec = importlib.util.spec_from_file_location("shape_map_script", ROOT / "scripts" / "shape_map.py")
shape_map = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shape_map)

MAX_S = 4096
# lengths that end 64 keys into a tile (every consumer's last tile is half), at B·S about 16k
ODD = [dict(B=16, H=16, Hkv=16, Sq=960, Sk=960, D=64, causal=c) for c in (False, True)] + [
    dict(B=8, H=32, Hkv=8, Sq=1984, Sk=1984, D=128, causal=c) for c in (False, True)]


def variants(row):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ch = s6.choose(row["B"], row["H"], row["Hkv"], row["Sq"], row["Sk"], row["D"], row["causal"], sms)
    built = dict(s6.config(row["D"], ch["tiles"], ch["schedule"], pack_gqa=ch["pack_gqa"],
                           q_stages=ch["q_stages"])["defines"])
    sw = s6.ALL_SCHEDULES[ch["schedule"]]
    if not s6.halves_last_tile(ch["tiles"], sw, False):
        return []  # a build without room for it (176-key tiles, no overlap)
    out = [({"variant": "as called"}, None),
           ({"variant": "half last tile"}, {"half_last": True, "carry_pv": False})]
    if built["CARRY_PV"]:
        out.append(({"variant": "no carried P·V"}, {"carry_pv": False}))
    return out


def shapes(record):
    rows = [r for r in record["shape_map"]["rows"]
            if r["part"] == "prefill" and r["dtype"] == "bfloat16" and r["Sq"] <= MAX_S]
    keep = ("B", "H", "Hkv", "Sq", "Sk", "D", "dtype", "causal")
    return ([{k: r[k] for k in keep} | {"part": "half tile", "recorded_vs_sdpa": r["vs_sdpa"]} for r in rows]
            + [r | {"dtype": "bfloat16", "part": "half tile"} for r in ODD])


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
    return shape_map.run_variant_shapes(todo, variants, a.budget_s, a.out, env)


if __name__ == "__main__":
    sys.exit(main())
