"""Does the timing's L2 flush cost the decoding rows a fixed time of its own? lib.timing.flush_l2
zeroes a buffer twice the L2's size before each timed run, which leaves L2 full of dirty lines; the
timed kernel's reads then evict them, and their write-back to HBM shares the kernel's bandwidth.
This probe times FP8 decoding (stages/stage7_decode, the launcher's plan) and SDPA's default on the
same cache in bf16 (the fp8_decode entry's two calls), in the same interleaved rounds, with three
flushes in turn:

    zero        lib.timing's flush (the records' method): the buffer zeroed;
    zero+read   the same, then a second buffer of the same size read (summed), so that the dirty
                lines are written back before the timed run starts and L2 holds clean lines;
    none        no flush (a cache smaller than L2 is then read from L2 in part).

    python3 experiments/l2_flush_writeback/probe.py [--rows B,Sk ...] [--out rows.json]
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
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from scripts.shape_map import fp8_checked  # noqa: E402

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    print("needs an H100 or H200 and none was found", file=sys.stderr)
    sys.exit(2)

H, HKV, D = 32, 8, 128
ROWS = [(B, Sk) for B in (1, 8, 64) for Sk in (1024, 4096, 16384, 32768)]
_zero_flush = T.flush_l2
_read_buffer = None


def zero_and_read():
    """lib.timing's flush, then a read of as many bytes again: the dirty lines leave L2 before the run."""
    global _read_buffer
    _zero_flush()
    if _read_buffer is None:
        _read_buffer = torch.ones(T._flush_buffer.numel() // 4, dtype=torch.float32, device="cuda")
    _read_buffer.sum()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", help="B,Sk each (default: the fp8_decode entry's rows)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    rows = [tuple(int(x) for x in r.split(",")) for r in a.rows] if a.rows else ROWS
    out = []
    for B, Sk in rows:
        q, k, v = make_qkv(B, H, 1, D, Sk=Sk, Hkv=HKV, dtype=torch.bfloat16)
        (k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
        del k, v
        k16, v16 = f8.dequantized(k8, kd, torch.bfloat16), f8.dequantized(v8, vd, torch.bfloat16)
        idx = torch.tensor(sorted({0, B // 2, B - 1}), device=q.device)
        ok = fp8_checked(d7.attention(q, k8, v8, k_descale=kd, v_descale=vd)[idx], q[idx],
                         f8.dequantized(k8[idx], kd[idx]), f8.dequantized(v8[idx], vd[idx]))
        fns = {"sdpa": T.sdpa_call(q, k16, v16), "e4m3": lambda: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd)}
        line = [f"B{B} Sk{Sk}: {'pass' if ok else 'FAIL'}"]
        for mode in ("zero", "zero+read", "none"):
            T.flush_l2 = zero_and_read if mode == "zero+read" else _zero_flush
            t = T.time_interleaved(fns, rounds=5, budget_s=0.25, flush=mode != "none")
            s, e = t["sdpa"].median_us, t["e4m3"].median_us
            line.append(f"{mode}: SDPA {s:7.1f} µs, e4m3 {e:7.1f} µs, {s / e:4.2f}x")
            out.append({"B": B, "H": H, "Hkv": HKV, "Sk": Sk, "D": D, "flush": mode, "sdpa_us": s, "us": e,
                        "sdpa_rounds": t["sdpa"].round_medians_us, "rounds": t["e4m3"].round_medians_us,
                        "passed": ok})
        T.flush_l2 = _zero_flush
        print("  |  ".join(line), flush=True)
        del q, k8, v8, k16, v16, fns
        torch.cuda.empty_cache()
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "rows": out}, indent=1))
    return 0 if all(r["passed"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
