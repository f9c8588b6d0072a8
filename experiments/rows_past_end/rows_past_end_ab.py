"""Experiment (issues 21 and 25): the last query block's consumers that have no row, skipped.

A block holds 64·CONSUMERS query rows, 192 at D64 (three consumers). When the sequence length is
no multiple of that, the last query block of each head has consumers whose 64 rows all lie past
the end: one of three at S 512, 2048 and 8192, two of three at S 1024 and 4096. Until now they ran
every product on the zero rows the copy engine fills in, and the stores dropped the results.
Counted: at S 512 and 1024 that is 11% of the rows a call computes (1 of 9 and 2 of 18 consumer
rows), at S 2048 3%, S 4096 3%, S 8192 0.8%; D128's blocks of 128 rows divide every grid length,
so nothing there. SKIP_ROWS_PAST_END (stages/stage6.cu and stage7.cu, at my_tiles) gives such a
consumer no key tile: it passes the ring's buffers on, and the block's other consumers have the
tensor cores and the exp2 unit to themselves.

Predicted: at D64 S 512-1024 up to 11% faster (a last block with one or two consumers left is
not free: its remaining consumers' own chain of products and exponentials sets its time, which
the other consumers hid before), 2-3% at S 2048-4096, level at D128 and at S >= 8192.

Measured (results/logs/2026-11-26-daf7855-h100, before lib.timing settled its
batches): stage 6 1.024-1.035x at D64 causal S 2048-4096 (work queue, one block per work tile),
1.005-1.008x at S 8192-16384 causal; level (0.997-1.016x) at every full row, whose persistent
blocks walk a fixed stride that gives each SM the same query block every time, and at every row
with no idle consumer (D64 causal S 512-1024, D128). Stage 7, whose queue hands the saved time to
other tiles: 1.015x at B16 H16 S2048 D64, 1.034x causal, 1.008x at B8 S4096, 1.034x and 1.094x at
B32 S1024 full and causal. With --parts queue (2026-11-26-c3dea5d-h100): the work queue against as
called at D64 full, 1.010-1.029x at S 512-1024, 0.994-1.000x at S 2048-8192 and 0.98x at S 16384.

Stage 6: the recorded shape map's prefill rows (bf16; all of D64's, and D128's at S 512 and
8192 as controls), the call as it is and with skip_past_end=False, each round ordered
skip, without, without, skip (a callable's place in a round can move its time,
results/logs/2026-11-26-9fc6491-h100), SDPA default and FLASH in the same rounds; each variant
checked against the float64 reference before and after. Stage 7: issue 25's shapes and two more D64
lengths, the kernel on prepared e4m3 inputs, the same order, checked against lib.fp8's emulation.
Logs only (--out).

    python experiments/rows_past_end/rows_past_end_ab.py --out rows_past_end.json [--parts stage6 stage7]
"""
import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import fp8  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import causal_mode, make_qkv  # noqa: E402
from lib.reference import attention_flops  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
from stages import stage7  # noqa: E402

_spec = importlib.util.spec_from_file_location("shape_map_script", ROOT / "scripts" / "shape_map.py")
shape_map = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shape_map)

# each variant twice a round, mirrored: skip, without, without, skip
ORDER = [("skip 1", None), ("without 1", {"skip_past_end": False}), ("without 2", {"skip_past_end": False}),
         ("skip 2", None)]
# --parts queue: stage 6's full attention at D64 as called (persistent blocks: a fixed stride of
# work tiles, which hands each SM the same query block every time when the query blocks per head
# divide 132, so the blocks whose last query block got lighter only wait longer at the end) against
# the work queue, which hands the next tile to whichever block is free. Same names as ORDER's, so
# that pair() reads both: "skip" the call as it is, "without" the queue.
ORDER_QUEUE = [("skip 1", None), ("without 1", {"schedule": "+ work queue"}), ("without 2", {"schedule": "+ work queue"}),
               ("skip 2", None)]
# stage 7: (B, H, S, D, causal)
FP8_SHAPES = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True), (8, 16, 4096, 64, False), (32, 16, 1024, 64, False),
              (32, 16, 1024, 64, True), (4, 16, 8192, 128, False)]


def idle_consumers(S: int, consumers: int) -> int:
    """Consumers of the last query block whose rows all lie past S."""
    return (64 * consumers - (S % (64 * consumers) or 64 * consumers)) // 64


def pair(us: dict) -> tuple[float, float]:
    """Each variant's time: the geometric mean of its two places' medians."""
    return (us["skip 1"] * us["skip 2"]) ** 0.5, (us["without 1"] * us["without 2"]) ** 0.5


def stage6_rows(record, out, env, order=ORDER, queue=False) -> tuple[list, bool]:
    """The recorded map's prefill rows (bf16), each round in `order`; queue: only D64's full rows,
    as called (persistent blocks, fixed stride) against the work queue (ORDER_QUEUE)."""
    todo = [r for r in record["shape_map"]["rows"] if r["part"] == "prefill" and r["dtype"] == "bfloat16"
            and ((r["D"] == 64 and not r["causal"]) if queue else (r["D"] == 64 or r["Sq"] in (512, 8192)))]
    got, ok = [], True
    for i, r in enumerate(todo):
        row = {k: r[k] for k in ("part", "B", "H", "Hkv", "Sq", "Sk", "D", "dtype", "causal")}
        these = shape_map.measure_variants(row, [({"variant": n}, o) for n, o in order])
        us = {t["variant"]: t["us"] for t in these}
        skip, without = pair(us)
        ok &= all(t["passed"] for t in these)
        consumers = these[0]["tiles"][2]
        res = {**row, "idle_consumers_last_block": idle_consumers(row["Sq"], consumers), "consumers": consumers,
               "skip_us": skip, "without_us": without, "without_over_skip": without / skip,
               "sdpa_us": these[0]["sdpa_us"], "skip_vs_sdpa": these[0]["sdpa_us"] / skip,
               "without_vs_sdpa": these[0]["sdpa_us"] / without, "recorded_vs_sdpa": r["vs_sdpa"],
               "passed": all(t["passed"] for t in these), "variants": these}
        got.append(res)
        print(f"[{i + 1}/{len(todo)}] stage 6 B{row['B']} H{row['H']}/{row['Hkv']} S{row['Sq']} D{row['D']} "
              f"{'causal' if row['causal'] else 'full'} ({res['idle_consumers_last_block']} of {consumers} idle): "
              f"without/skip {res['without_over_skip']:.3f}; SDPA {res['sdpa_us']:.1f} µs, skip "
              f"{res['skip_vs_sdpa']:.3f}x, without {res['without_vs_sdpa']:.3f}x (recorded {r['vs_sdpa']:.3f}x); "
              f"{'pass' if res['passed'] else 'FAIL'}", flush=True)
        if out:
            out.write_text(json.dumps({"env": env, "rows": got}, indent=1))
    return got, ok


def stage7_rows(budget_s, out, env, done) -> tuple[list, bool]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    got, ok = [], True
    for B, H, S, D, causal in FP8_SHAPES:
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
        vt = fp8.v_for_pv(v8)
        code = causal_mode(causal, S, S, stage7.INFO)
        fns = {n: (lambda o=o: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5, **(o or {})))
               for n, o in ORDER}
        build = stage7.emulation_of(B, H, S, S, D, causal, sms)
        checks = [fp8.check_on_emulation(fns[n](), q8, k8, v8, qd, kd, vd, causal=causal, **build)["passed"]
                  for n in ("skip 1", "without 1")]
        t = time_interleaved(fns, budget_s=budget_s)
        us = {n: x.median_us for n, x in t.items()}
        skip, without = pair(us)
        s6_us = time_interleaved({"stage 6": lambda: s6.attention(q, k, v, causal=causal)},
                                 budget_s=budget_s)["stage 6"].median_us
        checks += [fp8.check_on_emulation(fns[n](), q8, k8, v8, qd, kd, vd, causal=causal, **build)["passed"]
                   for n in ("skip 1", "without 1")]
        flops = attention_flops(B, H, S, S, D, causal)
        consumers = stage7.choose(B, H, S, S, D, causal, sms)["tiles"][2]
        res = {"B": B, "H": H, "S": S, "D": D, "causal": causal, "consumers": consumers,
               "idle_consumers_last_block": idle_consumers(S, consumers), "places_us": us, "skip_us": skip,
               "without_us": without, "without_over_skip": without / skip, "tflops_skip": flops / skip / 1e6,
               "tflops_without": flops / without / 1e6, "stage6_us": s6_us, "skip_vs_stage6": s6_us / skip,
               "without_vs_stage6": s6_us / without, "passed": all(checks),
               "round_medians_us": {n: x.round_medians_us for n, x in t.items()}}
        ok &= res["passed"]
        got.append(res)
        print(f"stage 7 B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} ({res['idle_consumers_last_block']} of "
              f"{consumers} idle): without/skip {res['without_over_skip']:.3f}; {res['tflops_skip']:.0f} TFLOPS "
              f"against {res['tflops_without']:.0f}; {res['skip_vs_stage6']:.3f}x stage 6 as it is now (rounds of "
              f"its own); {'pass' if res['passed'] else 'FAIL'}", flush=True)
        if out:
            out.write_text(json.dumps({"env": env, "rows": done + got}, indent=1))
        del q, k, v, q8, k8, v8, vt
    return got, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every row, with the env, as JSON")
    ap.add_argument("--budget-s", type=float, default=0.4, help="seconds of timing per callable (stage 7)")
    ap.add_argument("--parts", nargs="+", choices=("stage6", "stage7", "queue"), default=["stage6", "stage7"],
                    help="queue: stage 6's full D64 rows as called against the work queue (without/skip is then "
                         "the queue's time over the call's)")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stages 6 and 7 (sm_90a), so it needs an H100 or H200 and none was found\n")
    env = R.capture_env()
    rows, ok = [], True
    if "stage6" in a.parts:
        got, good = stage6_rows(R.load(R.results_path(env["gpu"])), a.out, env)
        rows, ok = rows + got, ok and good
    if "queue" in a.parts:
        got, good = stage6_rows(R.load(R.results_path(env["gpu"])), a.out, env, ORDER_QUEUE, queue=True)
        rows, ok = rows + [dict(r, part="queue") for r in got], ok and good
    if "stage7" in a.parts:
        got, good = stage7_rows(a.budget_s, a.out, env, rows)
        rows, ok = rows + got, ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
