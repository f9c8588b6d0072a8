"""Do L2 eviction hints on the cache's copies shorten FP8 decoding (stages/stage7_decode)? The
switches EVICT_FIRST (an evict_first policy on every cp.async of K and V) and PREFETCH_256 (.L2::256B)
against the launcher's build, and SDPA's default on the same cache in bf16, in the same interleaved
rounds, at the fp8_decode entry's rows. Every variant's output is checked against the launcher's
bit for bit (the hints change no arithmetic), the launcher's against the float64 reference.

Two flushes before each timed run: `zero` (lib.timing's, the records' method: L2 left full of dirty
lines) and `zero+read` (then a read of as many bytes: L2 holds clean lines,
experiments/l2_flush_writeback). If the hint pays by keeping the dirty lines' write-back out of the
read, it pays under `zero` and not under `zero+read`.

    python3 experiments/fp8_decode_evict_first/probe.py [--rows B,Sk ...] [--out rows.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import lib.timing as T  # noqa: E402
import stages.stage6_kv_fp8 as f8  # noqa: E402
import stages.stage7_decode as d7  # noqa: E402
from experiments.l2_flush_writeback.probe import zero_and_read  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from scripts.shape_map import fp8_checked  # noqa: E402

H, HKV, D = 32, 8, 128
ROWS = [(B, Sk) for B in (1, 8, 64) for Sk in (1024, 4096, 16384, 32768)]
# "launcher": the hints as the launcher's rule sets them (stage7_decode.evict_first); the others fix them
VARIANTS = {"no hint": (("EVICT_FIRST", 0),), "evict_first": (("EVICT_FIRST", 1),),
            "prefetch_256": (("EVICT_FIRST", 0), ("PREFETCH_256", 1)),
            "both": (("EVICT_FIRST", 1), ("PREFETCH_256", 1)), "launcher": ()}
CLEAN = ("sdpa", "no hint", "evict_first")  # timed again with clean lines in L2
# --grid: tiles (CHUNK, STAGES, WARPS) and splits with evict_first, at the rows nearest 1.7x
GRID_ROWS = [(64, 1024), (8, 1024), (8, 4096)]
GRID_TILES = [(32, 2, 8), (32, 3, 8), (32, 2, 4), (32, 4, 4), (32, 6, 4), (32, 2, 2), (32, 3, 2), (32, 4, 2),
              (16, 4, 4), (16, 6, 4)]
GRID_SPLITS = (1, 2, 4)


def cache(B: int, Sk: int):
    """q (bf16), the e4m3 cache with its descales, and the same cache dequantized to bf16 (SDPA's)."""
    q, k, v = make_qkv(B, H, 1, D, Sk=Sk, Hkv=HKV, dtype=torch.bfloat16)
    (k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
    del k, v
    return q, k8, kd, v8, vd, f8.dequantized(k8, kd, torch.bfloat16), f8.dequantized(v8, vd, torch.bfloat16)


def checked(out, q, k8, kd, v8, vd) -> bool:
    """out against the float64 reference of the dequantized cache, at three batch entries."""
    idx = torch.tensor(sorted({0, q.shape[0] // 2, q.shape[0] - 1}), device=q.device)
    return fp8_checked(out[idx], q[idx], f8.dequantized(k8[idx], kd[idx]), f8.dequantized(v8[idx], vd[idx]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", help="B,Sk each (default: the fp8_decode entry's rows)")
    ap.add_argument("--grid", action="store_true", help="tiles x splits with evict_first (GRID_ROWS by default)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = [tuple(int(x) for x in r.split(",")) for r in a.rows] if a.rows else GRID_ROWS if a.grid else ROWS
    if a.grid:
        return grid(rows, a.out)
    zero = T.flush_l2
    out, ok_all = [], True
    for B, Sk in rows:
        q, k8, kd, v8, vd, k16, v16 = cache(B, Sk)
        fns = {"sdpa": T.sdpa_call(q, k16, v16)}
        for name, sw in VARIANTS.items():
            fns[name] = (lambda sw=sw: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd, switches=sw))
        base = fns["launcher"]()
        ok = checked(base, q, k8, kd, v8, vd)
        same = {name: torch.equal(fns[name](), base) for name in VARIANTS}
        ok &= all(same.values())
        row = {"B": B, "H": H, "Hkv": HKV, "Sq": 1, "Sk": Sk, "D": D, "passed": ok, "bitwise": same}
        for mode in ("zero", "zero+read"):
            T.flush_l2 = zero_and_read if mode == "zero+read" else zero
            pick = fns if mode == "zero" else {n: fns[n] for n in CLEAN}
            t = T.time_interleaved(pick, rounds=5, budget_s=0.25)
            row[mode] = {n: {"us": t[n].median_us, "rounds": t[n].round_medians_us} for n in pick}
        T.flush_l2 = zero
        z, c = row["zero"], row["zero+read"]
        print(f"B{B:2d} Sk{Sk:6d} {'pass' if ok else 'FAIL'}  zero: SDPA {z['sdpa']['us']:7.1f}  "
              + "  ".join(f"{n} {z[n]['us']:7.1f} ({z['sdpa']['us'] / z[n]['us']:.3f}x)" for n in VARIANTS)
              + f"  | zero+read: SDPA {c['sdpa']['us']:7.1f}  "
              + "  ".join(f"{n} {c[n]['us']:7.1f} ({c['sdpa']['us'] / c[n]['us']:.3f}x)" for n in CLEAN[1:]),
              flush=True)
        out.append(row)
        ok_all &= ok
        del q, k8, v8, k16, v16, fns, base
        torch.cuda.empty_cache()
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "rows": out}, indent=1))
    return 0 if ok_all else 1


def grid(rows, out_path) -> int:
    """Every (tiles, splits) of GRID_TILES x GRID_SPLITS that fits a block and leaves each warp a
    chunk, evict_first on, beside the launcher and SDPA, under the records' flush."""
    out, ok_all = [], True
    for B, Sk in rows:
        q, k8, kd, v8, vd, k16, v16 = cache(B, Sk)
        fns = {"sdpa": T.sdpa_call(q, k16, v16),
               "launcher": lambda: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd),
               "launcher, no hint": lambda: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd,
                                                         switches=(("EVICT_FIRST", 0),))}
        for t in GRID_TILES:
            for n in GRID_SPLITS:
                if d7.shared_bytes(D, t) <= d7.SMEM_MAX and -(-Sk // t[0]) >= n * t[2]:
                    fns[f"{t} splits {n}"] = (lambda t=t, n=n: d7.attention(
                        q, k8, v8, k_descale=kd, v_descale=vd, tiles=t, splits=n, switches=(("EVICT_FIRST", 1),)))
        base = fns["launcher"]()
        ok = checked(base, q, k8, kd, v8, vd)
        for name in list(fns)[2:]:  # the same sums in another order: each against the reference
            ok &= checked(fns[name](), q, k8, kd, v8, vd)
        t = T.time_interleaved(fns, rounds=5, budget_s=0.1)
        s = t["sdpa"].median_us
        print(f"B{B} Sk{Sk} {'pass' if ok else 'FAIL'}  SDPA {s:.1f} µs", flush=True)
        for name in sorted(fns, key=lambda n: t[n].median_us):
            print(f"  {name:28s} {t[name].median_us:8.1f} µs  {s / t[name].median_us:.3f}x SDPA", flush=True)
        out.append({"B": B, "H": H, "Hkv": HKV, "Sq": 1, "Sk": Sk, "D": D, "passed": ok,
                    "times": {n: {"us": t[n].median_us, "rounds": t[n].round_medians_us} for n in fns}})
        ok_all &= ok
        del q, k8, v8, k16, v16, fns, base
        torch.cuda.empty_cache()
    if out_path:
        out_path.write_text(json.dumps({"env": R.capture_env(), "rows": out}, indent=1))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
