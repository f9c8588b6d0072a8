"""FP8 decoding with register widening (stages/stage7_decode.py) against SDPA's default on the same
cache in bf16, stage 6's e4m3 build (KV_FP8) and stage 6 on the bf16 cache, in the same interleaved
rounds; and the kernel's tiles (CHUNK, STAGES, WARPS) and split counts side by side. Each variant's
output is checked against the float64 reference of the dequantized cache (three entries) first.

    python3 experiments/fp8_decode_registers/probe.py [--quick] [--out rows.json]
    python3 experiments/fp8_decode_registers/probe.py --grid     # the small caches: tiles x splits
    python3 experiments/fp8_decode_registers/probe.py --rule     # plan_launch against 1eedebf's rule
    python3 experiments/fp8_decode_registers/probe.py --grid --tiles 32,2,2 32,2,4 --rows 64,1024 8,4096

--grid times every (tiles, splits) of GRID_TILES and GRID_SPLITS that leaves each warp a chunk at
every row of the fp8_decode entry, and at a one-chunk cache (Sk 32) for the floor of a launch. --rule times plan_launch's
launch at the same rows against 1eedebf's (TILES, plan_splits, the last block merging), each of
the .cu's switches flipped, and the last-block merge in place of the cluster's. --tiles and --rows
narrow --grid to other tiles (CHUNK,STAGES,WARPS) and some of its rows (B,Sk).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
import stages.stage6_kv_fp8 as f8  # noqa: E402
import stages.stage7_decode as d7  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402
from scripts.shape_map import fp8_checked  # noqa: E402

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    print("needs an H100 or H200 and none was found", file=sys.stderr)
    sys.exit(2)

ROWS = [(B, Sk) for B in (1, 8, 64) for Sk in (1024, 4096, 16384, 32768)]
QUICK = [(1, 16384), (8, 16384), (64, 4096)]
H, HKV = 32, 8
GRID_ROWS = [(1, 32)] + ROWS
GRID_TILES = [(32, 2, 8), (32, 2, 4), (32, 3, 4), (16, 2, 8)]
GRID_SPLITS = (1, 2, 4, 8, 16)
ON_BY_DEFAULT = ("IDLE_ACCUMULATORS", "WHOLE_CHUNK_COPIES", "PACKED_ROWS", "HOISTED_ADDRESSES")  # the .cu's switches that are on
VARIANTS = {128: [(32, 2, 8), (32, 3, 4), (16, 4, 8)],
            64: [(32, 2, 8), (32, 3, 4), (32, 3, 8)]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--rule", action="store_true")
    ap.add_argument("--D", type=int, nargs="+", default=[128])
    ap.add_argument("--tiles", nargs="+", help="--grid's tiles instead of GRID_TILES: CHUNK,STAGES,WARPS each")
    ap.add_argument("--rows", nargs="+", help="--grid's rows instead of GRID_ROWS: B,Sk each")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    sms = s6._sm_count(torch.device("cuda"))
    rows, t0 = [], time.time()
    grid_tiles = [tuple(int(x) for x in t.split(",")) for t in a.tiles] if a.tiles else GRID_TILES
    grid_rows = [tuple(int(x) for x in r.split(",")) for r in a.rows] if a.rows else GRID_ROWS
    for D in a.D:
        for B, Sk in (grid_rows if a.grid or a.rule else QUICK if a.quick else ROWS):
            q, k, v = make_qkv(B, H, 1, D, Sk=Sk, Hkv=HKV, dtype=torch.bfloat16)
            (k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
            del k, v
            k16, v16 = f8.dequantized(k8, kd, torch.bfloat16), f8.dequantized(v8, vd, torch.bfloat16)
            idx = torch.tensor(sorted({0, B // 2, B - 1}), device=q.device)
            k64, v64 = f8.dequantized(k8[idx], kd[idx]), f8.dequantized(v8[idx], vd[idx])
            planned_tiles, planned = d7.plan_launch(B, HKV, Sk, D, sms)
            fns = {"sdpa": sdpa_call(q, k16, v16),
                   "s6 e4m3": lambda: s6.attention(q, k8, v8, k_descale=kd, v_descale=vd),
                   "s6 bf16": lambda: s6.attention(q, k16, v16)}
            if a.grid or a.rule:
                fns["regs planned"] = lambda: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd)
                for off in (*((n,) for n in ON_BY_DEFAULT), ON_BY_DEFAULT):  # each idea off, then both
                    fns[f"regs planned, {'+'.join(off)} off"] = (lambda off=off: d7.attention(
                        q, k8, v8, k_descale=kd, v_descale=vd, switches=tuple((n, 0) for n in off)))
                if 1 < planned <= d7.CLUSTER_MAX:
                    fns["regs planned, last-block merge"] = lambda: d7.attention(
                        q, k8, v8, k_descale=kd, v_descale=vd, tiles=planned_tiles, splits=planned, cluster_merge=False)
            if a.rule:
                fns["regs planned, SPLIT_S_CHAIN on"] = lambda: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd,
                                                                             switches=(("SPLIT_S_CHAIN", 1),))
                fns["regs planned, 3 stages"] = lambda: d7.attention(
                    q, k8, v8, k_descale=kd, v_descale=vd, tiles=(planned_tiles[0], 3, planned_tiles[2]), splits=planned)
                old = d7.plan_splits(B, HKV, Sk, D, d7.TILES[D], sms)  # 1eedebf's rule: TILES, last-block merge
                fns["regs 1eedebf's launch rule"] = lambda: d7.attention(
                    q, k8, v8, k_descale=kd, v_descale=vd, tiles=d7.TILES[D], splits=old, cluster_merge=False)
            if a.grid:
                for t in grid_tiles:
                    for n in GRID_SPLITS:
                        if n == 1 or -(-Sk // t[0]) >= n * t[2]:  # every warp of every split a chunk
                            fns[f"regs {t} splits {n}"] = (lambda t=t, n=n: d7.attention(
                                q, k8, v8, k_descale=kd, v_descale=vd, tiles=t, splits=n))
            else:
                for t in VARIANTS[D]:
                    fns[f"regs {t}"] = (lambda t=t: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd, tiles=t))
                fns["regs bf16 products"] = lambda: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd,
                                                                 f16_products=False)
                for n in sorted({max(1, planned // 2), 2 * planned} - {planned}):
                    if n <= d7.MAX_SPLITS:
                        fns[f"regs splits {n}"] = (lambda n=n: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd,
                                                                            splits=n))
            passed = {}
            for name, fn in list(fns.items()):
                if name.startswith(("regs", "s6 e4m3")):
                    try:
                        passed[name] = fp8_checked(fn()[idx], q[idx], k64, v64)
                    except Exception as e:  # noqa: BLE001 (a variant that cannot launch: say so, time the rest)
                        print(f"  {name}: {type(e).__name__}: {e}", flush=True)
                        del fns[name]
            times = time_interleaved(fns, rounds=5, budget_s=0.1 if a.grid else 0.25)  # --rule: 0.25
            base = times["sdpa"].median_us
            gb = 2 * B * HKV * Sk * D / 1e9  # e4m3 bytes of K and V
            print(f"D{D} B{B} Sk{Sk} (planned splits {planned}; SDPA {base:,.1f} µs)  ({time.time() - t0:.0f} s)", flush=True)
            for name, t in times.items():
                us = t.median_us
                print(f"  {name:52s} {us:10,.1f} µs  {base / us:5.2f}x SDPA  {gb / us * 1e6 / 1e3:5.2f} TB/s of e4m3  "
                      f"{'' if name not in passed else ('pass' if passed[name] else 'FAIL')}", flush=True)
                rows.append({"D": D, "B": B, "Sk": Sk, "name": name, "us": us, "rounds": t.round_medians_us,
                             "sdpa_us": base, "passed": passed.get(name)})
            if B == 1 and Sk == 1024 and not (a.grid or a.rule):  # host time per call against the GPU's (lib.timing.time_host)
                from lib.timing import time_host
                for name in ("sdpa", "s6 e4m3", f"regs {d7.TILES[D]}"):
                    h = time_host(fns[name])
                    print(f"  host {name:17s} {h.host_us:8.1f} µs a call, GPU {h.gpu_us:8.1f} µs", flush=True)
            del q, k8, v8, k16, v16, k64, v64, fns
            torch.cuda.empty_cache()
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "rows": rows}, indent=1))
    return 0 if all(r["passed"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
