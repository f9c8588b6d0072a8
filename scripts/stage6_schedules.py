"""Stage 6 on the GPU, idea by idea: every schedule of stages/stage6.py (the FlashAttention-3
ablation: no warp specialization → + producer warpgroup → + setmaxnreg → + ping-pong →
+ intra-warpgroup overlap) and every tile choice, at the standard shape of each head dim,
next to SDPA's default and FLASH backends on the same inputs, all of one shape and mask timed
in the same interleaved rounds (lib.timing.time_interleaved: every variant and both SDPA
backends once per round, five rounds; each row keeps its round medians, which the notebook
draws as error bars); then one block's timeline (clock64 stamps per warpgroup) of every
schedule and of the overlap without ping-pong, for the notebook's Gantt charts. Each variant
is checked against the reference on an odd shape before it is timed.

    python scripts/stage6_schedules.py             # print
    python scripts/stage6_schedules.py --record    # and store under "stage6" in results/<gpu>.json
    python scripts/stage6_schedules.py --pick      # the default schedule per head dim, by PICK_RULE

Schedules that differ by a few percent cannot be told apart by one timing each (the same kernel
timed repeatedly in one run differed by up to 8.5% on the H100), so --pick times the candidates of
each head dim in interleaved rounds and compares medians over the rounds.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import plots  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import attention_flops, check_attention  # noqa: E402
from lib.timing import sdpa_call, time_cuda, time_interleaved  # noqa: E402

# (B, H, S, D, dtype): the throughput and long shapes; bf16 at the long shape with the defaults only
SHAPES = [(16, 16, 2048, 64, torch.float16), (4, 16, 8192, 128, torch.float16), (4, 16, 8192, 128, torch.bfloat16)]


# --pick: the candidates for each head dim's default, and the rule, fixed before measuring.
PICK_CANDIDATES = {64: ["+ setmaxnreg", "+ intra-warpgroup overlap", "+ work queue", "work queue without ping-pong"],
                   128: ["+ intra-warpgroup overlap", "+ work queue"]}
PICK_ROUNDS = 5
PICK_RULE = ("the candidate with the lowest geometric mean of its full and causal times (each the median "
             f"over {PICK_ROUNDS} interleaved rounds) at the head dim's standard fp16 shape; the current "
             "default stays unless another is more than 1% faster by that mean")


def pick() -> dict:
    """Time each head dim's candidates in interleaved rounds; return {D: {"pick", "rows"}}."""
    import statistics
    found = {}
    for B, H, S, D, dtype in SHAPES:
        if dtype != torch.float16:
            continue
        names = PICK_CANDIDATES[D]
        times = {(n, c): [] for n in names for c in (False, True)}
        q, k, v = make_qkv(B, H, S, D, dtype=dtype)
        for name in names:  # checked (odd shape, both masks) and compiled before any timing
            fn = lambda q, k, v, causal=False, name=name: s6.attention(q, k, v, causal=causal, schedule=name)  # noqa: E731
            for c in (False, True):
                assert check_attention(fn, 2, 3, 300, 517, D, dtype=dtype, causal=c).passed, (name, c)
        for r in range(PICK_ROUNDS):
            for name in names:
                for c in (False, True):
                    times[name, c].append(time_cuda(lambda: s6.attention(q, k, v, causal=c, schedule=name),
                                                    budget_s=0.3).median_us)
            print(f"D{D}: round {r + 1}/{PICK_ROUNDS} timed", flush=True)
        rows = []
        for name in names:
            full, causal = (statistics.median(times[name, c]) for c in (False, True))
            rows.append({"schedule": name, "full_us": full, "causal_us": causal,
                         "geomean_us": (full * causal) ** 0.5, "rounds": [times[name, False], times[name, True]]})
        current = next(r for r in rows if r["schedule"] == s6.default_schedule(D))
        best = min(rows, key=lambda r: r["geomean_us"])
        choice = best if best["geomean_us"] < 0.99 * current["geomean_us"] else current
        for r in rows:
            print(f"  D{D} {r['schedule']:30s} full {r['full_us']:9,.1f} µs  causal {r['causal_us']:9,.1f} µs  "
                  f"geomean {r['geomean_us']:9,.1f}{'  <- pick' if r is choice else ''}")
        found[D] = {"pick": choice["schedule"], "rows": rows, "shape": [B, H, S, D]}
        del q, k, v
    return found


def variants():
    for name in s6.SCHEDULES:
        yield "schedule", name, {"schedule": name}
    for name in s6.VARIANTS:
        yield "variant", name, {"schedule": name}
    for t in s6.CHOICES:
        yield "tiles", str(t), {"tiles": t}
    for e in (0, 2, 3, 4):
        yield "exp2_poly", f"{e}/8 of exp2 by polynomial", {"exp2_poly": e}
    for r in (-1, 0, 8):
        yield "rescale", {-1: "O rescaled every tile", 0: "O rescaled when a max grew"}.get(
            r, f"O rescaled past 2^{r} growth"), {"lazy_rescale": r}


def timeline(D: int = 128) -> dict:
    """clock64 stamps of block (0, 0) at B4 H16 S8192 (a full grid, so the block shares its SM's
    neighbours' memory traffic as in the benchmark): per warpgroup and tile, when its operands
    were there (0), S was ready (1), the softmax done (2) and P·V done (3); the producer's
    stamp 0 is when it issued the tile's copies."""
    cons = s6.TILES[D][2]
    n = (1 + cons) * s6.TIMELINE_TILES * s6.TIMELINE_EVENTS
    out = {}
    q, k, v = make_qkv(4, 16, 8192, D, dtype=torch.float16)
    for name in [*s6.SCHEDULES, "overlap without ping-pong"]:
        tl = torch.zeros(n, dtype=torch.int64, device="cuda")
        for _ in range(3):  # warm: the last run's stamps are kept
            tl.zero_()
            s6.attention(q, k, v, schedule=name, timeline=tl)
        torch.cuda.synchronize()
        out[name] = tl.view(1 + cons, s6.TIMELINE_TILES, s6.TIMELINE_EVENTS).tolist()
    return {"D": D, "B": 4, "H": 16, "S": 8192, "consumers": cons, "stamps": out,
            "events": ["operands in (producer: copies issued)", "S ready", "softmax done", "P·V done"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--record", action="store_true", help="store the rows in results/<gpu>.json")
    ap.add_argument("--quick", action="store_true", help="schedules only, full mask only")
    ap.add_argument("--pick", action="store_true", help="only time the default candidates (PICK_CANDIDATES) "
                    "in interleaved rounds and print the pick; with OUT set, also write OUT/stage6_pick.json")
    a = ap.parse_args()
    if a.pick:
        print("rule:", PICK_RULE)
        found = pick()
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "stage6_pick.json").write_text(json.dumps({"rule": PICK_RULE, "heads": found}))
        return 0
    rows, ok = [], True
    for B, H, S, D, dtype in SHAPES:
        q, k, v = make_qkv(B, H, S, D, dtype=dtype)
        for causal in ((False,) if a.quick else (False, True)):
            flops = attention_flops(B, H, S, S, D, causal)
            fns, meta = {}, {}
            for kind, label, kw in variants():
                if (a.quick and kind not in ("schedule", "variant")) or (kind == "tiles" and not s6.fits(D, kw["tiles"])):
                    continue
                if dtype != torch.float16 and not (kind == "schedule" and label == s6.default_schedule(D)):
                    continue
                if kind == "tiles" and kw["tiles"][2] == 1:
                    kw = {**kw, "schedule": s6.DECODE_SCHEDULE}  # one consumer: nobody to take turns with
                fn = lambda q, k, v, causal=False, kw=kw: s6.attention(q, k, v, causal=causal, **kw)  # noqa: E731
                passed = all(check_attention(fn, 2, 3, 300, 517, D, dtype=dtype, causal=c).passed
                             for c in (False, True))
                fns[f"{kind}: {label}"] = lambda fn=fn: fn(q, k, v, causal=causal)
                meta[f"{kind}: {label}"] = (kind, label, passed)
            fns["sdpa"], fns["flash"] = sdpa_call(q, k, v, causal=causal), sdpa_call(q, k, v, causal=causal, backend="flash")
            t0 = time.time()
            times = time_interleaved(fns, budget_s=0.3)
            t_sd, t_sf = times["sdpa"].median_us, times["flash"].median_us
            print(f"B{B} H{H} S{S} D{D} {str(dtype)[6:]} {'causal' if causal else 'full'}: SDPA default {t_sd:,.1f} µs "
                  f"({flops / t_sd / 1e6:.0f} TFLOPS), FLASH {t_sf:,.1f} µs ({flops / t_sf / 1e6:.0f}); "
                  f"{len(fns)} timed in {time.time() - t0:.0f} s", flush=True)
            for name, (kind, label, passed) in meta.items():
                t = times[name]
                row = {"kind": kind, "variant": label, "B": B, "H": H, "S": S, "D": D, "causal": causal,
                       "dtype": str(dtype)[6:], "us": t.median_us, "us_rounds": t.round_medians_us,
                       "tflops": flops / t.median_us / 1e6, "sdpa_us": t_sd, "sdpa_us_rounds": times["sdpa"].round_medians_us,
                       "sdpa_flash_us": t_sf, "passed": passed,
                       "default": (kind == "schedule" and label == s6.default_schedule(D))}
                ok &= passed
                rows.append(row)
                spread = max(t.round_medians_us) / min(t.round_medians_us) - 1
                print(f"  {kind:8s} {label:28s} {t.median_us:10,.1f} µs (rounds ±{100 * spread:.1f}%) "
                      f"{row['tflops']:6.1f} TFLOPS {t_sd / t.median_us:5.2f}× SDPA {t_sf / t.median_us:5.2f}× FLASH "
                      f"{'pass' if passed else 'FAIL'}", flush=True)
        del q, k, v
    tl = timeline()
    print("timeline (block (0, 0), B4 H16 S8192 D128; clock64 cycles):")
    print(plots.timeline_summary(tl))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "stage6_timeline.json").write_text(json.dumps(tl))
    if a.record:
        env = R.capture_env()
        path = R.save_extra(env["gpu"], "stage6", {"env": env, "sha256": R.stage_sha256(s6.INFO),
                                                   "rows": rows, "timeline": tl})
        print(f"recorded in {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
