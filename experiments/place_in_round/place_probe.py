"""Experiment (the method): does a callable's place in an interleaved round move its time?

lib.timing.time_interleaved runs each round's callables one after another, each a batch of runs.
The H100 runs long shapes at its power limit, and its clocks follow the power of the last tens of
milliseconds: a batch that follows a callable drawing less power (SDPA's FLASH backend, twice as
slow at long shapes) may start at higher clocks. Stage 7's time moved 7-9% with its place
beside stage 6 (results/logs/2026-11-26-9fc6491-h100); results/logs/2026-11-26-daf7855-h100 saw the
first place of a round ~5% faster than the other three at B2 H32 S8192 D128 (stage 6 against itself,
experiments/rows_past_end/rows_past_end_ab.py). The recorded rows time stage 6 first, then SDPA
default, then FLASH.

Measured (results/logs/2026-11-26-c3dea5d-h100 and 2026-11-26-5533c7f-h100, before the
rounds rotated): yes. Without a settle, SDPA default over stage 6 at B2 H32 S8192 D128 was
1.12-1.26x full and 1.12-1.19x causal in the three orders where stage 6 follows FLASH (across
rounds), 0.91-1.05x where SDPA does; at B8 H16 S2048 D64 and B16 H32 S1024 D128 all six orders
agreed within 0.4%. With 50 ms of settle, 1.02-1.11x full and 1.04-1.14x causal in no order's
favour; 150 ms, 0.99-1.17x and 1.00-1.13x: the bias went, the run-to-run spread at that shape
stays. Hence lib.timing.SETTLE_MS = 50 (and, since, each round starting one callable further on,
so the order given here is only the first round's).

This times stage 6 and SDPA default (and FLASH) at a few shapes in each order of the three, the
same inputs, and prints SDPA default over stage 6 for each order; with --settle-ms, each batch of
runs after that many milliseconds of the callable's own untimed runs (lib.timing.SETTLE_MS). Predicted: at D128 S8192 the
ratio with stage 6 first (after FLASH's batch) exceeds the others by a few percent; at short
shapes (below the power limit) every order agrees. Logs only (--out).

    python experiments/place_in_round/place_probe.py --out place.json
    python experiments/place_in_round/place_probe.py --settle-ms 0 50 150 --shapes 2 --out settle.json
"""
import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib import timing as lib_timing  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402

SHAPES = [(2, 32, 8192, 128, False), (2, 32, 8192, 128, True), (8, 16, 2048, 64, False), (16, 32, 1024, 128, False)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every timing, with the env, as JSON")
    ap.add_argument("--budget-s", type=float, default=0.3, help="seconds of timing per callable (default 0.3)")
    ap.add_argument("--settle-ms", nargs="+", type=float, default=[None],
                    help="untimed milliseconds before each batch (default: lib.timing.SETTLE_MS)")
    ap.add_argument("--shapes", type=int, default=len(SHAPES), help="only the first N shapes")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 6 (sm_90a), so it needs an H100 or H200 and none was found\n")
    rows = []
    for (B, H, S, D, causal), settle in itertools.product(SHAPES[:a.shapes], a.settle_ms):
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        fns = {"stage 6": lambda: s6.attention(q, k, v, causal=causal), "sdpa": sdpa_call(q, k, v, causal=causal),
               "flash": sdpa_call(q, k, v, causal=causal, backend="flash")}
        for order in itertools.permutations(fns):
            t = time_interleaved({n: fns[n] for n in order}, budget_s=a.budget_s, settle_ms=settle)
            us = {n: x.median_us for n, x in t.items()}
            rows.append({"B": B, "H": H, "S": S, "D": D, "causal": causal, "order": list(order), "us": us,
                         "settle_ms": lib_timing.SETTLE_MS if settle is None else settle,
                         "sdpa_over_stage6": us["sdpa"] / us["stage 6"]})
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} settle {rows[-1]['settle_ms']:g} ms, "
                  f"order {', '.join(order)}: "
                  f"SDPA/stage 6 {us['sdpa'] / us['stage 6']:.3f} (stage 6 {us['stage 6']:.1f} µs, SDPA "
                  f"{us['sdpa']:.1f}, FLASH {us['flash']:.1f})", flush=True)
        if a.out:
            a.out.write_text(json.dumps({"env": R.capture_env(), "budget_s": a.budget_s, "rows": rows}, indent=1))
        del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
