"""Stage 6 against SDPA at the shapes models run, on the GPU:

- prefill: S 512 … 16384 at B·S = 16k tokens, D64 with H16 and D128 with H32, MHA and GQA 4:1,
  full and causal;
- decoding: Sq 1 (one new token) and 4 (speculative decoding) against caches of Sk 1k … 32k,
  B 1 … 64, GQA 32/8 and 8/1, D128 and D64;
- the decoding waterfall: at a few decode shapes, the prefill build (one block per query head,
  the keys in one block), + split-KV, packed GQA alone, both with the combine kernel, and both
  with the combine in each work tile's last block where its rule takes it (stage 6's choice);
- (--parts schedules) stage 6's launches at short prefill, S 512 … 2048: one block per work
  tile against persistent blocks (fixed stride, or a work queue with and without ping-pong for
  causal), each with the head dim's tiles and with 128-key tiles, one Q buffer or two, each
  work tile's last P·V carried into the next (CARRY_PV, where the rule puts it) and not;
- (--parts timeline) block 0's measured timeline at S 512 (persistent blocks, one Q buffer and
  two): per consumer, how long each work tile took and the gap before the next one's first S.

Every row is checked against the float64 reference first (on batch 0 when the whole batch's
float64 copy would be too big), then timed with SDPA's default and FLASH backends on the same
inputs in interleaved rounds (lib.timing.time_interleaved: L2 flushed, GPU held). Ratios are
SDPA's time over stage 6's (> 1: stage 6 faster).

    python scripts/shape_map.py                  # print
    python scripts/shape_map.py --record         # and store under "shape_map" in results/<gpu>.json
    python scripts/shape_map.py --quick          # a few rows of each part (a smoke run)
    python scripts/shape_map.py --record --resume  # finish a recorded run that was cut short
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import attention_flops, check_output  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402

TOKENS = 16384
PREFILL_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
PREFILL_HEADS = {64: 16, 128: 32}   # query heads per head dim (the grid)
DECODE_SQ = (1, 4)
DECODE_SK = (1024, 4096, 32768)
DECODE_B = (1, 8, 64)
DECODE_GROUPS = ((32, 8), (8, 1))   # (query heads, K/V heads)
# (B, H, Hkv, Sq, Sk, D): the waterfall's decode shapes
WATERFALL_SHAPES = [(1, 32, 8, 1, 4096, 128), (8, 32, 8, 1, 4096, 128), (32, 32, 8, 1, 8192, 128),
                    (1, 8, 1, 4, 32768, 128), (1, 8, 1, 1, 32768, 128)]
WATERFALL = [("prefill build", {"pack_gqa": False, "splits": 1}),
             ("+ split-KV", {"pack_gqa": False}),
             ("packed GQA alone", {"pack_gqa": True, "splits": 1}),
             ("split-KV + packed GQA", {"combine_in_block": False}),
             ("+ combine in the last block", {})]
# short prefill (B·S = 16k, MHA): the launches that differ in what happens between work tiles
SCHEDULE_SEQS = (512, 1024, 2048, 8192)
SCHEDULE_TILES = {64: [((128, 2, 3), 2), ((128, 2, 2), 2)], 128: [((176, 2, 2), 1), ((128, 2, 2), 2)]}


SHORT_NAMES = {"+ persistent blocks": "persistent", "+ work queue": "queue",
               "work queue without ping-pong": "queue no pp"}


def schedule_variants(D, causal):
    """(name, attention options) for the schedules part: the one-block-per-work-tile launch, then
    per tile choice (with its Q buffers; O leaves as stores_by_tma says) the persistent
    launches: a fixed stride for full attention, the work queue with and without ping-pong for
    causal; each of these also with CARRY_PV on where carries_pv allows it. (The
    softmax ping-pong, PINGPONG=2, measured slower at every one of these shapes in
    results/logs/2026-11-25-fd50989-call2; S issued a key tile ahead of its softmax, tried at
    18b9a4f, 20-35% slower in -18b9a4f-call3, was taken out again.)"""
    out = [("one block per work tile", {"schedule": s6.default_schedule(D), "q_stages": 1})]
    scheds = ["work queue without ping-pong", "+ work queue"] if causal else ["+ persistent blocks"]
    for tiles, qs in SCHEDULE_TILES[D]:
        for sched in scheds:
            name = f"{SHORT_NAMES[sched]} {tiles[0]}x{tiles[1]}x{tiles[2]} q{qs}"
            out.append((name, {"schedule": sched, "tiles": tiles, "q_stages": qs}))
            sw = s6.ALL_SCHEDULES[sched]
            if not (tiles[2] == 3 and sw["DYNAMIC_WORK"]):  # carries_pv's exceptions; one Q buffer stores O itself
                out.append((name + " carry", {"schedule": sched, "tiles": tiles, "q_stages": qs, "carry_pv": True}))
    return out


# the latency shape, B1 H8 S512 D64 fp16: 8 heads × 3 blocks of 192 rows = 24 work tiles (and
# the same at D128)
LATENCY_SHAPES = [(1, 8, 8, 512, 512, 64), (1, 8, 8, 512, 512, 128)]
LATENCY_VARIANTS = [("stage 6's choice", {}),
                    ("two consumers", {"tiles": (128, 2, 2)}),
                    ("one consumer", {"tiles": (128, 4, 1), "schedule": s6.DECODE_SCHEDULE}),
                    ("one consumer, 3 stages", {"tiles": (128, 3, 1), "schedule": s6.DECODE_SCHEDULE}),
                    ("split 2", {"splits": 2}),
                    ("split 4", {"splits": 4}),
                    ("two consumers, split 2", {"tiles": (128, 2, 2), "splits": 2}),
                    ("one consumer, split 2", {"tiles": (128, 4, 1), "schedule": s6.DECODE_SCHEDULE, "splits": 2}),
                    ("softmax ping-pong", {"schedule": "softmax ping-pong"}),
                    ("two consumers, softmax ping-pong", {"tiles": (128, 2, 2), "schedule": "softmax ping-pong"})]


def timeline_rows():
    """(D, H, tiles, Q buffers, causal, schedule) of the timelines at S 512, B32: persistent
    blocks walk ~30 work tiles of 4 key tiles each; causal, the work queue hands out work tiles
    of 1-4 key tiles."""
    yield 64, PREFILL_HEADS[64], (128, 2, 3), 2, False, "+ persistent blocks"
    yield 128, PREFILL_HEADS[128], (128, 2, 2), 2, False, "+ persistent blocks"
    for tiles, sched in (((128, 2, 3), "work queue without ping-pong"), ((128, 2, 2), "work queue without ping-pong"),
                         ((128, 2, 2), "work queue, softmax ping-pong")):
        yield 64, PREFILL_HEADS[64], tiles, 2, True, sched


def measure_timeline(D, H, tiles, qs, causal=False, schedule="+ persistent blocks"):
    """Block 0's stamps (stages/stage6.cu: STAMP, by ring position) and, for full attention
    (every work tile the same length), per consumer each work tile's span (first S issued →
    last P·V done) and the gap from one work tile's last P·V to the next one's first S, in
    clocks."""
    S, B = 512, TOKENS // 512
    n = (1 + tiles[2]) * s6.TIMELINE_TILES * s6.TIMELINE_EVENTS
    tl = torch.zeros(n, dtype=torch.int64, device="cuda")
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    opts = dict(schedule=schedule, tiles=tiles, q_stages=qs, causal=causal)
    s6.attention(q, k, v, **opts)  # compiled and planned
    s6.attention(q, k, v, timeline=tl, **opts)
    torch.cuda.synchronize()
    t = tl.view(1 + tiles[2], s6.TIMELINE_TILES, s6.TIMELINE_EVENTS).cpu().tolist()
    per = -(-S // tiles[0])  # key tiles per work tile
    t0 = min(x for x in t[0][0] if x > 0)
    out = {"D": D, "tiles": list(tiles), "q_stages": qs, "causal": causal, "schedule": schedule,
           "key_tiles_per_work": None if causal else per, "consumers": []}
    for c in range(1, 1 + tiles[2]):
        spans, gaps = [], []
        for w in range(0 if causal else s6.TIMELINE_TILES // per):
            first, last = t[c][w * per][0], t[c][w * per + per - 1][3]
            spans.append(last - first)
            if w:
                gaps.append(first - t[c][w * per - 1][3])
        out["consumers"].append({"span_clk": spans, "gap_clk": gaps})
    out["stamps"] = [[[x - t0 if x else 0 for x in ev] for ev in role] for role in t]
    return out
CHECK_ELEMENTS = 1 << 27  # above this many input elements, the float64 check runs on batch 0


def prefill_rows(dtypes, quick):
    for dtype in dtypes:
        for D, H in PREFILL_HEADS.items():
            for S in (PREFILL_SEQS[:2] if quick else PREFILL_SEQS):
                for Hkv in (H, H // 4):
                    for causal in (False, True):
                        yield {"part": "prefill", "B": TOKENS // S, "H": H, "Hkv": Hkv, "Sq": S, "Sk": S,
                               "D": D, "dtype": dtype, "causal": causal}


def decode_rows(dtypes, quick):
    for dtype in dtypes:
        for D in (128, 64):
            for H, Hkv in DECODE_GROUPS:
                for B in (DECODE_B[:1] if quick else DECODE_B):
                    for Sk in (DECODE_SK[1:2] if quick else DECODE_SK):
                        for Sq in DECODE_SQ:
                            yield {"part": "decode", "B": B, "H": H, "Hkv": Hkv, "Sq": Sq, "Sk": Sk,
                                   "D": D, "dtype": dtype, "causal": False}


def _check(fn, q, k, v, causal):
    if q.numel() + 2 * k.numel() > CHECK_ELEMENTS and q.shape[0] > 1:
        q, k, v = q[:1], k[:1], v[:1]
    c = check_output(fn(q, k, v), q, k, v, causal=causal)
    return c


def measure(row, opts=None, budget_s=0.3):
    """Check, then time stage 6 (with `opts`) and both SDPA backends in turns; fill `row`."""
    B, H, Hkv, Sq, Sk, D = (row[x] for x in ("B", "H", "Hkv", "Sq", "Sk", "D"))
    dtype = getattr(torch, row["dtype"])
    causal = row["causal"]
    opts = opts or {}
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype)
    fn = lambda q, k, v: s6.attention(q, k, v, causal=causal, **opts)  # noqa: E731
    c = _check(fn, q, k, v, causal)
    ch = s6.choose(B, H, Hkv, Sq, Sk, D, causal, torch.cuda.get_device_properties(0).multi_processor_count,
                   splits=opts.get("splits"), pack_gqa=opts.get("pack_gqa"), schedule=opts.get("schedule"),
                   tiles=opts.get("tiles"))
    built = dict(s6.config(D, ch["tiles"], ch["schedule"], pack_gqa=ch["pack_gqa"], q_stages=opts.get("q_stages"),
                           carry_pv=opts.get("carry_pv"))["defines"])
    q_stages = opts.get("q_stages") or built["Q_STAGES"]
    tma_store = bool(built["O_TMA_STORE"] if opts.get("tma_store") is None else opts["tma_store"])
    times = time_interleaved({"stage": lambda: fn(q, k, v),
                              "sdpa": sdpa_call(q, k, v, causal=causal),
                              "flash": sdpa_call(q, k, v, causal=causal, backend="flash")}, budget_s=budget_s)
    again = _check(fn, q, k, v, causal)  # and again after the timing loop
    t = times["stage"].median_us
    sd = times["sdpa"].median_us if "sdpa" in times else None
    sf = times["flash"].median_us if "flash" in times else None
    flops = attention_flops(B, H, Sq, Sk, D, causal)
    moved = 2 * (2 * B * H * Sq * D + 2 * B * Hkv * Sk * D)  # bytes: Q and O, K and V, once each
    row.update(us=t, sdpa_us=sd, sdpa_flash_us=sf, tflops=flops / t / 1e6, gbps=moved / t / 1e3,
               vs_sdpa=sd / t if sd else None, vs_flash=sf / t if sf else None,
               max_abs_err=max(c.max_abs_err, again.max_abs_err), passed=c.passed and again.passed,
               splits=ch["splits"], packed=ch["pack_gqa"], tiles=list(ch["tiles"]), schedule=ch["schedule"], q_stages=q_stages, tma_store=tma_store,
               carry_pv=bool(built["CARRY_PV"]),
               stage_round_medians_us=times["stage"].round_medians_us)
    del q, k, v
    return row


def resumable_rows(data, plan, sha) -> list:
    """The rows of a recorded run cut short (shape_map_partial) that --resume keeps: only when it
    had the same plan (its row count, and each kept row's part and shape) and stage 6's current
    sources; else none."""
    part = (data or {}).get("shape_map_partial")
    if not part or part.get("of") != len(plan) or part.get("sha256") != sha:
        return []
    keys = ("part", "variant", "B", "H", "Hkv", "Sq", "Sk", "D", "dtype", "causal")
    same = all(all(r.get(k) == p.get(k) for k in keys) for r, (p, _) in zip(part["rows"], plan))
    return part["rows"] if same else []


def _fmt(row) -> str:
    vs = lambda x: f"{x:5.2f}x" if x else "  n/a"  # noqa: E731
    return (f"{row['part']:8s} {row.get('variant', ''):22s} B{row['B']:<3d} H{row['H']}/{row['Hkv']:<3d} "
            f"Sq{row['Sq']:<6d} Sk{row['Sk']:<6d} D{row['D']} {row['dtype']:8s} "
            f"{'causal' if row['causal'] else 'full  '} {row['us']:10.1f} us  {vs(row['vs_sdpa'])} SDPA  "
            f"{vs(row['vs_flash'])} FLASH  splits {row['splits']:<3d} {'packed' if row['packed'] else '      '} "
            f"{'pass' if row['passed'] else 'FAIL'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--record", action="store_true", help='store under "shape_map" in results/<gpu>.json')
    ap.add_argument("--quick", action="store_true", help="a few rows of each part")
    ap.add_argument("--resume", action="store_true",
                    help="with --record: keep the rows of a run cut short (shape_map_partial) when it had this "
                         "plan and stage 6's sources, and measure only the rest")
    ap.add_argument("--head-dims", nargs="+", type=int, default=[64, 128], choices=[64, 128],
                    help="the schedules part's head dims")
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float16"], choices=["float16", "bfloat16"])
    ap.add_argument("--seqs", nargs="+", type=int, default=list(SCHEDULE_SEQS),
                    help="the schedules part's sequence lengths (B·S = 16k)")
    ap.add_argument("--parts", nargs="+", default=["decode", "waterfall", "prefill"],
                        choices=["decode", "waterfall", "prefill", "schedules", "latency", "timeline"],
                    help="schedules, latency, timeline: stage 6's launches at short prefill (not in the default set)")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("shape_map.py times stage 6, which runs on sm_90 GPUs (H100/H200) only", file=sys.stderr)
        return 2
    plan = []
    if "decode" in a.parts:
        plan += [(r, None) for r in decode_rows(a.dtype, a.quick)]
    if "waterfall" in a.parts:
        for B, H, Hkv, Sq, Sk, D in (WATERFALL_SHAPES[:1] if a.quick else WATERFALL_SHAPES):
            for name, opts in WATERFALL:
                plan.append(({"part": "waterfall", "variant": name, "B": B, "H": H, "Hkv": Hkv, "Sq": Sq,
                              "Sk": Sk, "D": D, "dtype": "bfloat16", "causal": False}, opts))
    if "timeline" in a.parts:
        for D, H, tiles, qs, causal, sched in timeline_rows():
            tl = measure_timeline(D, H, tiles, qs, causal, sched)
            print(f"timeline D{D} tiles {tiles} q{qs} {'causal' if causal else 'full'} {sched}: " + "; ".join(
                f"consumer {i + 1} spans {c['span_clk']} gaps {c['gap_clk']}" for i, c in enumerate(tl["consumers"])),
                flush=True)
            print("  stamps " + json.dumps(tl["stamps"]), flush=True)
    if "schedules" in a.parts:
        for D, H in PREFILL_HEADS.items():
            if D not in a.head_dims:
                continue
            for S in (a.seqs[:1] if a.quick else a.seqs):
                for causal in (False, True):
                    for name, opts in schedule_variants(D, causal):
                        plan.append(({"part": "schedules", "variant": name, "B": TOKENS // S, "H": H, "Hkv": H,
                                      "Sq": S, "Sk": S, "D": D, "dtype": "bfloat16", "causal": causal}, opts))
    if "latency" in a.parts:
        for B, H, Hkv, Sq, Sk, D in LATENCY_SHAPES:
            for causal in (False, True):
                for name, opts in LATENCY_VARIANTS:
                    if (causal and "splits" in opts) or ("tiles" in opts and not s6.fits(D, opts["tiles"])):
                        continue  # causal work is not split; tiles that do not fit at this head dim
                    plan.append(({"part": "latency", "variant": name, "B": B, "H": H, "Hkv": Hkv, "Sq": Sq,
                                  "Sk": Sk, "D": D, "dtype": "float16", "causal": causal}, opts))
    if "prefill" in a.parts:
        plan += [(r, None) for r in prefill_rows(a.dtype, a.quick)]
    rows, t0 = [], time.time()
    env = R.capture_env() if a.record else None
    if a.resume:
        path = R.results_path(env["gpu"]) if a.record else None
        kept = resumable_rows(R.load(path), plan, R.stage_sha256(s6.INFO)) if path and path.exists() else []
        print(f"resuming after {len(kept)} recorded rows of {len(plan)}", flush=True)
        rows, plan = list(kept), plan[len(kept):]
    done, total = len(rows), len(rows) + len(plan)
    for i, (row, opts) in enumerate(plan):
        rows.append(measure(row, opts))
        left = (time.time() - t0) / (i + 1) * (len(plan) - i - 1)
        print(f"[{done + i + 1}/{total}, ~{left:.0f} s left] {_fmt(row)}", flush=True)
        if a.record and (done + i + 1) % 10 == 0:
            # a run cut short (a call's time limit) leaves its rows here, beside the complete map,
            # which only a finished run replaces (--resume goes on from them)
            R.save_extra(env["gpu"], "shape_map_partial", {"env": env, "sha256": R.stage_sha256(s6.INFO),
                                                           "of": total, "rows": rows})
    failed = [r for r in rows if not r["passed"]]
    for part in a.parts:
        got = [r["vs_sdpa"] for r in rows if r["part"] == part and r["vs_sdpa"]]
        if got:
            print(f"{part}: stage 6 / SDPA default from {min(got):.2f}x to {max(got):.2f}x over {len(got)} rows; "
                  f"at or above SDPA in {sum(x >= 1 for x in got)}")
    if failed:
        print(f"{len(failed)} rows FAILED the error rule: nothing recorded")
        return 1
    if a.record:
        path = R.save_extra(env["gpu"], "shape_map", {"env": env, "sha256": R.stage_sha256(s6.INFO),
                                                      "quick": a.quick, "rows": rows})
        data = R.load(path)
        data.pop("_path", None)
        if data.pop("shape_map_partial", None) is not None:  # finished: the partial rows are in
            path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"recorded in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
