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
VARIANTS = {"launcher": (), "evict_first": (("EVICT_FIRST", 1),), "prefetch_256": (("PREFETCH_256", 1),),
            "both": (("EVICT_FIRST", 1), ("PREFETCH_256", 1))}
CLEAN = ("sdpa", "launcher", "evict_first")  # timed again with clean lines in L2


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", help="B,Sk each (default: the fp8_decode entry's rows)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = [tuple(int(x) for x in r.split(",")) for r in a.rows] if a.rows else ROWS
    zero = T.flush_l2
    out, ok_all = [], True
    for B, Sk in rows:
        q, k, v = make_qkv(B, H, 1, D, Sk=Sk, Hkv=HKV, dtype=torch.bfloat16)
        (k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
        del k, v
        k16, v16 = f8.dequantized(k8, kd, torch.bfloat16), f8.dequantized(v8, vd, torch.bfloat16)
        fns = {"sdpa": T.sdpa_call(q, k16, v16)}
        for name, sw in VARIANTS.items():
            fns[name] = (lambda sw=sw: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd, switches=sw))
        base = fns["launcher"]()
        idx = torch.tensor(sorted({0, B // 2, B - 1}), device=q.device)
        ok = fp8_checked(base[idx], q[idx], f8.dequantized(k8[idx], kd[idx]), f8.dequantized(v8[idx], vd[idx]))
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
              + f"  | zero+read: SDPA {c['sdpa']['us']:7.1f}  launcher {c['launcher']['us']:7.1f} "
              f"({c['sdpa']['us'] / c['launcher']['us']:.3f}x)  evict_first {c['evict_first']['us']:7.1f} "
              f"({c['sdpa']['us'] / c['evict_first']['us']:.3f}x)", flush=True)
        out.append(row)
        ok_all &= ok
        del q, k8, v8, k16, v16, fns, base
        torch.cuda.empty_cache()
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "rows": out}, indent=1))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
