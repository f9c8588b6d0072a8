"""Experiment: what the last partial wave of work tiles costs, measured by counting heads.

At S8192 D128 full attention, stages 6 and 7 cut each head into 64 work tiles of 128 query rows,
all of the same length, and run them on one persistent block per SM (stage 6: a fixed stride;
stage 7: its work queue). With H heads at B1 there are 64·H work tiles: at H 33, 2,112 tiles,
16 whole waves on 132 SMs; at H 31, 1,984 tiles, 15 waves and 4 tiles. If a partial wave costs a
whole wave (its SMs wait for the few that still work), H 31 takes as long as H 33; if it cost
only its tiles, H 31 would take 1,984 / 2,112 = 0.94 of H 33's time. So the time per head at each
H tells how much of the last wave is idle, with no change to any kernel.

Predicted, from queue_tail_probe.py's per-SM record of stage 7 (every SM at the same pace
within 1%): the time follows the whole waves, ceil(64·H / SMs), for stage 6 (bf16) and for
stage 7 without TAIL_SPLIT; stage 7 with it follows the tiles, 64·H / SMs, plus the pieces'
cost. Each kernel's heads are timed in the same interleaved rounds (each H once, then the
rounds again in reverse order; the geometric mean of the two), checked against the reference
(SDPA in bf16, for stage 6) or the emulation (stage 7) first. Logs only (--out): nothing is recorded.

    python experiments/wave_tail/wave_tail.py --out wave_tail.json [--heads 31 32 33 34 35]
"""
import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lib import fp8  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
from stages import stage6, stage7  # noqa: E402

S, D = 8192, 128


def kernels(q, k, v, sms) -> dict:
    """name -> (call, check): stage 6 in bf16, stage 7's kernel on prepared e4m3 inputs with and
    without the split tail."""
    q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
    vt = fp8.v_for_pv(v8)
    fp8_call = {split: (lambda split=split: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=0, scale=D ** -0.5,
                                                           tail_split=split)) for split in (False, True)}

    def check6():  # against SDPA in bf16 (a float64 reference of S8192 would need 2 GB per head)
        out = stage6.attention(q, k, v)
        return bool((out.float() - F.scaled_dot_product_attention(q, k, v).float()).abs().max() <= 2e-2)

    def check7(split):
        build = stage7.emulation_of(1, q.shape[1], S, S, D, False, sms)
        return fp8.check_on_emulation(fp8_call[split](), q8, k8, v8, qd, kd, vd, **build)["passed"]
    return {"stage 6 (bf16)": (lambda: stage6.attention(q, k, v), check6),
            "stage 7, tail not split": (fp8_call[False], lambda: check7(False)),
            "stage 7, tail split": (fp8_call[True], lambda: check7(True))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every timing, with the env, as JSON")
    ap.add_argument("--heads", nargs="+", type=int, default=[31, 32, 33, 34, 35], help="head counts at B1")
    ap.add_argument("--budget-s", type=float, default=0.3, help="seconds of timing per callable (default 0.3)")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: runs stages 6 and 7 (sm_90a), so it needs an H100 or H200 and none was found\n")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    calls, ok = {}, True
    for H in a.heads:
        q, k, v = make_qkv(1, H, S, D, dtype=torch.bfloat16)
        for name, (call, chk) in kernels(q, k, v, sms).items():
            passed = chk()
            ok &= passed
            calls[(name, H)] = (call, passed, (q, k, v))
    names = list(dict.fromkeys(n for n, _ in calls))
    rows = []
    for name in names:
        fns = {f"H{H} {i}": calls[(name, H)][0] for i, hs in ((1, a.heads), (2, a.heads[::-1])) for H in hs}
        t = time_interleaved(fns, budget_s=a.budget_s)
        base = None
        for H in a.heads:
            us = math.sqrt(t[f"H{H} 1"].median_us * t[f"H{H} 2"].median_us)
            work = 64 * H
            row = {"kernel": name, "B": 1, "H": H, "S": S, "D": D, "work": work, "waves": work / sms,
                   "whole_waves": -(-work // sms), "us": us, "us_per_head": us / H, "passed": calls[(name, H)][1]}
            rows.append(row)
            base = base or row
            print(f"{name}: H{H}, {work} work tiles = {work / sms:.2f} waves ({row['whole_waves']} begun): {us:,.1f} µs, "
                  f"{us / base['us']:.3f}x H{base['H']} (tiles {work / base['work']:.3f}x, begun waves "
                  f"{row['whole_waves'] / base['whole_waves']:.3f}x); {'pass' if row['passed'] else 'FAIL'}", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "budget_s": a.budget_s, "sms": sms, "rows": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
