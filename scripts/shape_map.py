"""Stage 6 against SDPA at the shapes models run, on the GPU:

- prefill: S 512 … 16384 at B·S = 16k tokens, D64 with H16 and D128 with H32, MHA and GQA 4:1,
  full and causal;
- decoding: Sq 1 (one new token) and 2, 4, 8, 16 (speculative decoding, chunked prefill) against
  caches of Sk 1k … 32k, B 1 … 64, GQA 32/8 and 8/1, D128 and D64, without a mask; and at B 1
  the Sq > 1 rows again with the mask speculative decoding uses (causal bottom-right: the Sq
  queries are the cache's last Sq positions), SDPA given the same mask (causal_lower_right);
- the decoding waterfall: at a few decode shapes, the prefill build (one block per query head,
  the keys in one block), + split-KV, packed GQA alone, both with the combine kernel, both
  with the combine in each work tile's last block where its rule takes it, two blocks per SM
  where they fill it, the combine kernel launched with PDL, and (at D64, where a block reads one
  or two key tiles) blocks of one warpgroup without a producer, three per SM (stage 6's choice);
- (--parts schedules) stage 6's launches at short prefill, S 512 … 2048: one block per work
  tile against persistent blocks (fixed stride, or a work queue with and without ping-pong for
  causal), each with the head dim's tiles and with 128-key tiles, one Q buffer or two, each
  work tile's last P·V carried into the next (CARRY_PV, where the rule puts it) and not;
- (--parts timeline) block 0's measured timeline at S 512 (persistent blocks, one Q buffer and
  two): per consumer, how long each work tile took and the gap before the next one's first S;
- (--parts splits, issue 21) at the recorded map's decode rows below SDPA and a few controls:
  every split count against the combine in the last block and the combine kernel, all of a
  shape's configs in the same rounds; a table (best and plan marked), logged with --out, never
  recorded. What each explanation predicts: the comment above SPLIT_COUNTS.

Every row is checked against the float64 reference first (on batch 0 when the whole batch's
float64 copy would be too big), then timed with SDPA's default and FLASH backends on the same
inputs in interleaved rounds (lib.timing.time_interleaved: L2 flushed, GPU held). Ratios are
SDPA's time over stage 6's (> 1: stage 6 faster).

    python scripts/shape_map.py                  # print
    python scripts/shape_map.py --record         # and store under "shape_map" in results/<gpu>.json
    python scripts/shape_map.py --quick          # a few rows of each part (a smoke run)
    python scripts/shape_map.py --record --resume  # finish a recorded run that was cut short
    python scripts/shape_map.py --paged [--record] # the paged KV cache against contiguous (PAGED_DOC)
    python scripts/shape_map.py --fp8-kv [--record] # decoding from an e4m3 cache against SDPA (FP8_DOC)
    python scripts/shape_map.py --parts splits --dtype bfloat16 --out splits.json  # ~4 min (--budget-s)
"""
import argparse
import json
import random
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
import stages.stage6_decoding as s6d  # noqa: E402
import stages.stage6_kv_fp8 as f8  # noqa: E402
import stages.stage7_decode as d7  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import ALIGNMENTS, make_qkv, paged_cache  # noqa: E402
from lib.reference import attention_flops, check_output  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402

TOKENS = 16384
PREFILL_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
PREFILL_HEADS = {64: 16, 128: 32}   # query heads per head dim (the issue's grid)
DECODE_SQ = (1, 2, 4, 8, 16)
DECODE_SK = (1024, 4096, 32768)
DECODE_B = (1, 8, 64)
DECODE_MASKED_B = (1,)  # the batch sizes whose Sq > 1 rows are also timed causal bottom-right
DECODE_GROUPS = ((32, 8), (8, 1))   # (query heads, K/V heads)
# (B, H, Hkv, Sq, Sk, D): the waterfall's decode shapes
WATERFALL_SHAPES = [(1, 32, 8, 1, 4096, 128), (8, 32, 8, 1, 4096, 128), (32, 32, 8, 1, 8192, 128),
                    (1, 8, 1, 4, 32768, 128), (1, 8, 1, 1, 32768, 128), (1, 32, 8, 1, 4096, 64)]
# Each step adds one idea to the one before; until the last, packed calls keep a producer
# warpgroup (the decoding schedule named), so the last step is stage 6's choice with blocks
# without a producer where stage6.few_keys_per_block takes them (only shapes it takes run it).
_PRODUCER = {"pack_gqa": True, "schedule": s6.DECODE_SCHEDULE}
WATERFALL = [("prefill build", {"pack_gqa": False, "splits": 1, "pdl": False}),
             ("+ split-KV", {"pack_gqa": False, "pdl": False}),
             ("packed GQA alone", {"pack_gqa": True, "splits": 1, "blocks_per_sm": 1, "pdl": False}),
             ("split-KV + packed GQA", {"combine_in_block": False, "blocks_per_sm": 1, "pdl": False}),
             ("+ combine in the last block", {"blocks_per_sm": 1, "pdl": False}),
             ("+ two blocks per SM where they fill it", {**_PRODUCER, "pdl": False}),
             ("+ PDL for the combine kernel", _PRODUCER),
             ("+ no producer where a block has 1-2 key tiles", {})]
FEW_KEYS_STEP = WATERFALL[-1][0]
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


# --parts splits (issue 21): at the decode rows where the recorded map has stage 6 below SDPA's
# default backend, and at a few controls above it, stage 6 at every split count with either
# combine, SDPA default and FLASH in the same rounds. The worst row, B1 H8/1 Sq1 Sk4096 D64:
# 13.4 µs against SDPA's 10.4 (32 splits of one key tile; 8 rows · 32 · 64 · 4 B = 64 KB combined
# in the last block), where its D128 twin (twice the bytes) takes 12.2 (the same 32 splits,
# 128 KB: the combine kernel). Two explanations:
# (a) The combine in the last block costs more than the combine kernel near its 64 KB bound
#     (one SM: each of 4 warps walks its rows' splits one after another).
#     Predicted: at the plan's split count "kernel" beats "in block" at the rows that combine
#     64 KB in the block: B1 H8/1 Sk4096 D64 by 1-3 µs (to at most the D128 twin's 12.2), B1 and
#     B8 H8/1 Sq4 Sk1024 D64, B8 H8/1 Sk4096 and Sk32768 D128, and the controls (32-64 KB,
#     above SDPA) alike; the gap shrinks with the bytes and is gone at 16 KB and less (so (a)
#     cannot explain B8 H8/1 Sq1 Sk1024 D64, 0.85× with 16 KB); the block forced at 128 KB
#     (B1 H8/1 Sk4096 D128, 32 splits) is slower than the kernel there.
# (b) plan_splits splits too finely at D64: its cost model counts a block's fixed work as one
#     key tile, and a D64 key tile moves half a D128 one's bytes.
#     Predicted: at the D64 rows split to one key tile a block (B1 H8/1 Sk4096, 32 splits; B1
#     and B8 H8/1 Sk1024, 8) the fastest count gives each block 2-4 key tiles (Sk4096: 8-16
#     splits, Sk1024: 2-4), with either combine (the two within ~0.5 µs there), at or above
#     SDPA; at D128 the plan's count is within noise of the fastest.
# Both: the fastest pairs the kernel with fewer splits. Neither: every config of a shape stays
# below SDPA (the loss is in each block's fixed costs, not in the split). The noise floor: the
# call as is against its explicit twin (marked plan; the same build where it combines in the block).
SPLIT_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)   # and plan_splits' own count; never above the key tiles
SPLIT_CONTROLS = 4                             # rows above SDPA, half per head dim
# What the part costs the GPU machine, from the full map's log (results/logs/2026-11-25-38ba1c1-call10):
SPLIT_COST = {"startup": 15.0,     # s: python, torch, the CUDA context
              "compile": 3.0,      # s a stage 6 build (NVRTC): the map's first row took 3 s
              "shape": 0.5,        # s a shape: its inputs' first SDPA calls (backend plans)
              "element": 10e-9,    # s an input element: make_qkv draws on the CPU (B64 H32/8 Sk32768: 23-34 s)
              "check": 0.1,        # s a float64 check, two a config
              "run": 150e-6}       # s a timed run beyond the kernel: the L2 flush, the hold spin, the events


def _combine_of(ch, H, Hkv, Sq, D) -> str:
    """Which combine a call planned as `ch` (choose's answer) with no combine_in_block given
    runs: none unsplit; in the last block when packed and combines_in_block says so (only the
    packed build has it); else the combine kernel."""
    if ch["splits"] == 1:
        return "none"
    return "in block" if ch["pack_gqa"] and s6d.combines_in_block((H // Hkv) * Sq, ch["splits"], D) else "kernel"


def split_variants(B, H, Hkv, Sq, Sk, D, sms=132) -> list:
    """(fields, attention options) of the splits part at one decode shape: stage 6 called as is
    (its plan's count and combine), then each count of SPLIT_COUNTS and the plan's up to the key
    tiles (as many as run: a split holds whole key tiles) with the combine in the last block
    and with the combine kernel (one split: neither). The explicit twin of the plan's choice is
    marked plan; "kernel" is the build without the in-block code (COMBINE_IN_BLOCK 0), where
    the call as is, over 64 KB, runs the packed build with it switched off. One block per SM
    throughout, as when this experiment ran (session 33; shares_sms came later)."""
    one = {"blocks_per_sm": 1}
    ch = s6.choose(B, H, Hkv, Sq, Sk, D, False, sms, **one)
    key_tiles = -(-Sk // ch["tiles"][0])
    planned = (ch["splits"], _combine_of(ch, H, Hkv, Sq, D))
    chosen = {"plan_splits": planned[0], "plan_combine": planned[1]}
    out = [({"variant": "stage 6's choice", "combine": planned[1], "plan": False, "as_is": True, **chosen}, one)]
    counts = sorted({s6.choose(B, H, Hkv, Sq, Sk, D, False, sms, splits=n, **one)["splits"]
                     for n in {*SPLIT_COUNTS, planned[0]} if n <= key_tiles})
    for n in counts:
        for combine in (("none",) if n == 1 else ("in block", "kernel")):
            opts = {"splits": n, **one} if n == 1 else {"splits": n, "combine_in_block": combine == "in block", **one}
            name = "1 split" if n == 1 else f"{n} splits, {combine}"
            out.append(({"variant": name, "combine": combine, "plan": (n, combine) == planned, "as_is": False,
                         **chosen}, opts))
    return out


def split_shapes(recorded, dtypes, controls=SPLIT_CONTROLS, sms=132) -> list:
    """The splits part's shapes from a recorded map's rows: every decode row below SDPA's
    default (worst first), then `controls` rows at or above it, half per head dim: those whose
    plan combines the most bytes in the last block (nearest the worst row's 64 KB, the suspect
    of explanation (a)), the ratio nearest 1 first on a tie. Each a row of part "splits" with
    the record's ratio and times."""
    def row(r, control):
        return {"part": "splits", **{k: r[k] for k in ("B", "H", "Hkv", "Sq", "Sk", "D", "dtype")}, "causal": False,
                "control": control, "recorded_vs_sdpa": r["vs_sdpa"], "recorded_us": r["us"],
                "recorded_sdpa_us": r["sdpa_us"]}

    def in_block_bytes(r):
        ch = s6.choose(r["B"], r["H"], r["Hkv"], r["Sq"], r["Sk"], r["D"], False, sms)
        rows = (r["H"] // r["Hkv"]) * r["Sq"]
        in_block = _combine_of(ch, r["H"], r["Hkv"], r["Sq"], r["D"]) == "in block"
        return rows * ch["splits"] * r["D"] * 4 if in_block else 0

    dec = [r for r in recorded if r.get("part") == "decode" and r.get("dtype") in dtypes and r.get("vs_sdpa")
           and not r.get("causal")]
    out = [row(r, False) for r in sorted((r for r in dec if r["vs_sdpa"] < 1.0), key=lambda r: r["vs_sdpa"])]
    for D in sorted({r["D"] for r in dec}):
        above = [r for r in dec if r["D"] == D and r["vs_sdpa"] >= 1.0 and in_block_bytes(r)]
        above.sort(key=lambda r: (-in_block_bytes(r), r["vs_sdpa"]))
        out += [row(r, True) for r in above[:controls // 2]]
    return out


def split_cost_s(row, variants, per_fn_s=0.3) -> float:
    """SPLIT_COST's estimate of one shape's seconds: its inputs, two checks a config, and
    time_interleaved's runs of each config and both SDPA backends (as many as fit `per_fn_s`,
    5 to 100, each after 3 warm-up and probe calls). A config's kernel is taken as the
    recorded time scaled by how many more key tiles a split holds than under the plan's count."""
    c = SPLIT_COST
    B, H, Hkv, Sq, Sk, D = (row[k] for k in ("B", "H", "Hkv", "Sq", "Sk", "D"))

    def fn_s(t_us):
        runs = min(100, max(5, per_fn_s / (t_us * 1e-6)))
        return (3 + runs) * (t_us * 1e-6 + c["run"])

    t = max(row["recorded_us"], row["recorded_sdpa_us"])
    stage = sum(fn_s(t * max(1.0, f["plan_splits"] / o.get("splits", f["plan_splits"]))) for f, o in variants)
    return (c["shape"] + c["element"] * (B * H * Sq * D + 2 * B * Hkv * Sk * D) + 2 * c["check"] * len(variants)
            + stage + 2 * fn_s(row["recorded_sdpa_us"]))


def splits_plan(shapes, sms=132, budget_s=240.0) -> dict:
    """What --parts splits measures within `budget_s` seconds of the GPU machine: the shapes in
    their order (worst first, the controls last), each taken while the estimate (startup, two
    builds per head dim and dtype, split_cost_s of the shapes taken) still fits, else left out.
    -> {"shapes": [(row, variants, estimate)], "left_out": [rows], "estimate_s", "configs"}."""
    c = SPLIT_COST
    builds = 2 * len({(r["D"], r["dtype"]) for r in shapes})  # the packed build with and without the in-block code
    total = c["startup"] + c["compile"] * builds
    taken, left = [], []
    # the controls' cost is set aside first: they are few and small, and a table without them
    # cannot say which effect is particular to the rows below SDPA
    costed = [(r, v, split_cost_s(r, v)) for r in shapes for v in [split_variants(*(r[k] for k in (
        "B", "H", "Hkv", "Sq", "Sk", "D")), sms=sms)]]
    reserved = sum(e for r, _, e in costed if r.get("control"))
    for r, v, e in costed:
        if total + e + (0 if r.get("control") else reserved) <= budget_s:
            taken.append((r, v, e))
            total += e
            if r.get("control"):
                reserved -= e
        else:
            left.append(r)
    return {"shapes": taken, "left_out": left, "estimate_s": total, "configs": sum(len(v) for _, v, _ in taken)}


def _shape(r) -> str:
    return f"B{r['B']} H{r['H']}/{r['Hkv']} Sq{r['Sq']} Sk{r['Sk']} D{r['D']}"


def splits_table(rows) -> str:
    """The splits part's rows as a markdown table, a shape's configs together: the fastest
    config of each shape marked best, the plan's (plan_splits and combines_in_block) marked
    plan, stage 6 called with no options marked as called."""
    lines = ["| shape | splits | combine | µs | SDPA µs | ratio | |", "|---|---|---|---|---|---|---|"]
    shapes = {}
    for r in rows:
        shapes.setdefault((_shape(r), r["dtype"]), []).append(r)
    for (shape, dtype), got in shapes.items():
        best = min(got, key=lambda r: r["us"])
        control = ", control" if got[0]["control"] else ""
        head = f"{shape} {dtype} (recorded {got[0]['recorded_vs_sdpa']:.2f}×{control})"
        for i, r in enumerate(got):
            marks = [m for m, on in (("**best**", r is best), ("plan", r["plan"]), ("as called", r["as_is"])) if on]
            sd = f"{r['sdpa_us']:.1f}" if r["sdpa_us"] else "n/a"
            ratio = f"{r['vs_sdpa']:.2f}×" if r["vs_sdpa"] else "n/a"
            lines.append(f"| {head if i == 0 else ''} | {r['splits']} | {r['combine']} | {r['us']:.1f} | {sd} "
                         f"| {ratio} | {' '.join(marks)}{'' if r['passed'] else ' FAIL'} |")
    return "\n".join(lines)


def splits_verdicts(got) -> str:
    """One shape's answer to both explanations: its fastest config against the plan's, and the
    combine in the block minus the combine kernel at the plan's split count."""
    best = min(got, key=lambda r: r["us"])
    plan = next(r for r in got if r["as_is"])
    at = {r["combine"]: r["us"] for r in got if r["splits"] == plan["splits"] and not r["as_is"]}
    gap = (f"; in block − kernel at {plan['splits']} splits {at['in block'] - at['kernel']:+.1f} µs"
           if {"in block", "kernel"} <= at.keys() else "")
    return (f"{_shape(plan)} {plan['dtype']}: best {best['splits']} {best['combine']} {best['us']:.1f} µs "
            f"({best['vs_sdpa'] or 0:.2f}×), as called {plan['splits']} {plan['combine']} {plan['us']:.1f} µs "
            f"({plan['vs_sdpa'] or 0:.2f}×){gap}")


def timeline_rows():
    """(D, H, tiles, Q buffers, causal, schedule) of the timelines at S 512, B32: persistent
    blocks walk ~30 work tiles of 4 key tiles each; causal, the work queue hands out work tiles
    of 1-4 key tiles."""
    yield 64, PREFILL_HEADS[64], (128, 2, 3), 2, False, "+ persistent blocks"
    yield 128, PREFILL_HEADS[128], (128, 2, 2), 2, False, "+ persistent blocks"
    for tiles, sched in (((128, 2, 3), "work queue without ping-pong"), ((128, 2, 2), "work queue without ping-pong")):
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
                            for causal in ((False, "bottom_right") if Sq > 1 and B in DECODE_MASKED_B else (False,)):
                                yield {"part": "decode", "B": B, "H": H, "Hkv": Hkv, "Sq": Sq, "Sk": Sk,
                                       "D": D, "dtype": dtype, "causal": causal}


def _check(fn, q, k, v, causal):
    if q.numel() + 2 * k.numel() > CHECK_ELEMENTS and q.shape[0] > 1:
        q, k, v = q[:1], k[:1], v[:1]
    c = check_output(fn(q, k, v), q, k, v, causal=causal)
    return c


def measure(row, opts=None, budget_s=0.3):
    """Check, then time stage 6 (with `opts`) and both SDPA backends in turns; fill `row`."""
    row.update(measure_variants(row, [({}, opts)], budget_s)[0])
    return row


def combine_kernel(ch: dict, built: dict, opts: dict, D: int) -> bool:
    """Whether a call's split-KV partial rows go to the combine kernel (not to the last block of
    each work tile): stage 6's combine_in_last_block, from choose's plan and the build's defines."""
    rows = (ch["H"] // ch["Hk"]) * ch["Sq"] if ch["pack_gqa"] else 64 * ch["tiles"][2]  # the work tile's
    return ch["splits"] > 1 and not s6.combine_in_last_block(rows, ch["splits"], D, built, opts.get("combine_in_block"))


def measure_variants(row, variants, budget_s=0.3) -> list:
    """Check, then time stage 6 with each of `variants` ([(fields, opts)]) and both SDPA backends
    on the same inputs in the same interleaved rounds; checked again after the timing. One row
    per variant: a copy of `row` with the variant's `fields` and its measurements."""
    B, H, Hkv, Sq, Sk, D = (row[x] for x in ("B", "H", "Hkv", "Sq", "Sk", "D"))
    dtype = getattr(torch, row["dtype"])
    causal = row["causal"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype)
    fns = [partial(s6.attention, causal=causal, **(opts or {})) for _, opts in variants]
    checks = [_check(fn, q, k, v, causal) for fn in fns]
    times = time_interleaved({**{f"stage{i}": partial(fn, q, k, v) for i, fn in enumerate(fns)},
                              "sdpa": sdpa_call(q, k, v, causal=causal),
                              "flash": sdpa_call(q, k, v, causal=causal, backend="flash")}, budget_s=budget_s)
    sd = times["sdpa"].median_us if "sdpa" in times else None
    sf = times["flash"].median_us if "flash" in times else None
    flops = attention_flops(B, H, Sq, Sk, D, bool(causal) and Sq == Sk)  # a few queries against a cache see ~all keys
    moved = 2 * (2 * B * H * Sq * D + 2 * B * Hkv * Sk * D)  # bytes: Q and O, K and V, once each
    out = []
    for i, ((fields, opts), fn, c) in enumerate(zip(variants, fns, checks)):
        opts = opts or {}
        again = _check(fn, q, k, v, causal)  # and again after the timing loop
        ch = s6.choose(B, H, Hkv, Sq, Sk, D, ALIGNMENTS.get(causal, causal), sms, splits=opts.get("splits"),
                       pack_gqa=opts.get("pack_gqa"),
                       schedule=opts.get("schedule"), tiles=opts.get("tiles"), blocks_per_sm=opts.get("blocks_per_sm"))
        ch.update(H=H, Hk=Hkv, Sq=Sq)
        blocks = ch["blocks_per_sm"]
        built = dict(s6.config(D, ch["tiles"], ch["schedule"], pack_gqa=ch["pack_gqa"],
                               q_stages=opts.get("q_stages") or ch["q_stages"], carry_pv=opts.get("carry_pv"),
                               blocks_per_sm=blocks)["defines"])
        q_stages = opts.get("q_stages") or built["Q_STAGES"]
        tma_store = bool(built["O_TMA_STORE"] if opts.get("tma_store") is None else opts["tma_store"])
        t = times[f"stage{i}"].median_us
        out.append({**row, **fields})
        out[-1].update(us=t, sdpa_us=sd, sdpa_flash_us=sf, tflops=flops / t / 1e6, gbps=moved / t / 1e3,
                       vs_sdpa=sd / t if sd else None, vs_flash=sf / t if sf else None,
                       max_abs_err=max(c.max_abs_err, again.max_abs_err), passed=c.passed and again.passed,
                       splits=ch["splits"], packed=ch["pack_gqa"], tiles=list(ch["tiles"]), schedule=ch["schedule"],
                       q_stages=q_stages, tma_store=tma_store, carry_pv=bool(built["CARRY_PV"]), blocks_per_sm=blocks,
                       pdl_combine=combine_kernel(ch, built, opts, D) and s6.pdl_launches(opts.get("pdl"))[1],
                       stage_round_medians_us=times[f"stage{i}"].round_medians_us)
    del q, k, v
    return out


def run_variant_shapes(todo, variants_of, budget_s=0.3, out=None, env=None) -> int:
    """The A/B experiments' loop (experiments/decode_launch/decode_launch_ab.py,
    experiments/prefill_blocks/prefill_blocks_ab.py): each row of `todo` with its variants
    (`variants_of(row)`: [(fields, opts)], the first the call as it is; none: the row is skipped)
    measured by measure_variants, a line per row, every row so far written to `out` as JSON after
    each. Returns 1 if any variant failed the error rule, else 0."""
    got, t0 = [], time.time()
    for i, row in enumerate(todo):
        variants = variants_of(row)
        if not variants:
            continue
        these = measure_variants(row, variants, budget_s)
        got += these
        print(f"[{i + 1}/{len(todo)} {time.time() - t0:.0f} s] {_shape(row)}{' causal' if row['causal'] else ''}: "
              f"SDPA {these[0]['sdpa_us']:.1f} µs; " + "; ".join(
                  f"{r['variant']} {r['us']:.1f} ({r['vs_sdpa']:.3f}x{'' if r['passed'] else ' FAILED'})"
                  for r in these) + f"; best/as called {these[0]['us'] / min(r['us'] for r in these):.3f}", flush=True)
        if out:
            out.write_text(json.dumps({"env": env, "sha256": R.stage_sha256(s6.INFO), "rows": got}, indent=1) + "\n")
    failed = [r for r in got if not r["passed"]]
    print(f"{len(failed)} variants failed the error rule" if failed else "every variant passed the error rule")
    return 1 if failed else 0


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
            f"{ {False: 'full  ', True: 'causal'}.get(row['causal'], 'bottom-right')} {row['us']:10.1f} us  {vs(row['vs_sdpa'])} SDPA  "
            f"{vs(row['vs_flash'])} FLASH  splits {row['splits']:<3d} {'packed' if row['packed'] else '      '} "
            f"{'pass' if row['passed'] else 'FAIL'}")


def _log(path, env, rows, splits=None) -> None:
    """--out: the rows so far, with the environment and stage 6's source hash (and the splits
    part's plan), rewritten after each row or shape so a run cut short keeps what it measured."""
    if path is None:
        return
    extra = {"splits_plan": {k: splits[k] for k in ("source", "estimate_s", "configs", "budget_s")}} if splits else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"env": env, "sha256": R.stage_sha256(s6.INFO), **extra, "rows": rows}, indent=1) + "\n")


def splits_part(a) -> dict:
    """The splits part's plan on this GPU (its SM count): the shapes from the recorded shape map,
    what fits a.budget_s, printed with the estimate before anything runs."""
    data = R.load(a.splits_record) if a.splits_record is None or a.splits_record.exists() else None
    recorded = ((data or {}).get("shape_map") or {}).get("rows") or []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = split_shapes(recorded, a.dtype, sms=sms)
    if not shapes:
        sys.exit(f"shape_map.py --parts splits: no recorded decode rows of {a.dtype} in "
                 f"{a.splits_record or 'results/'} to pick its shapes from (record the map first: --record)")
    source = f"{data['_path']}'s shape map"
    if a.quick:  # the worst row and one control
        shapes = shapes[:1] + [r for r in shapes if r["control"]][:1]
    plan = splits_plan(shapes, sms, a.budget_s)
    plan.update(source=str(source), budget_s=a.budget_s)
    print(f"splits: {len(plan['shapes'])} shapes from {source} ({sum(r['control'] for r, _, _ in plan['shapes'])} "
          f"controls), {plan['configs']} configs of stage 6 beside SDPA default and FLASH; estimated "
          f"{plan['estimate_s']:.0f} s of the GPU machine for this part (budget {a.budget_s:.0f} s)", flush=True)
    for r in plan["left_out"]:
        print(f"  left out for the budget: {_shape(r)} {r['dtype']} (recorded {r['recorded_vs_sdpa']:.2f}x)")
    return plan


def run_splits(plan, out, env, rows) -> list:
    """Measure the splits part's shapes (each shape's configs and both SDPA backends in the same
    rounds), logging after each; then the table and each shape's verdict."""
    got, t0 = [], time.time()
    for i, (row, variants, _) in enumerate(plan["shapes"]):
        these = measure_variants(row, variants)
        got += these
        left = sum(e for _, _, e in plan["shapes"][i + 1:])
        print(f"[{i + 1}/{len(plan['shapes'])} shapes, {time.time() - t0:.0f} s, ~{left:.0f} s left by the estimate] "
              f"{splits_verdicts(these)}", flush=True)
        _log(out, env, rows + got, plan)
    print("\n" + splits_table(got) + "\n")
    for these in {(_shape(r), r["dtype"]): None for r in got}:
        print(splits_verdicts([r for r in got if (_shape(r), r["dtype"]) == these]))
    return got



# --------------------------------------------------------------------------------------------
# --paged: the paged KV cache against the same cache contiguous (issue 50)

PAGED_DOC = """--paged: Stage 6's paged KV cache against the same cache contiguous (issue 50), on the GPU, same-run ratios.

Each row: a decoding (or speculative-decoding) call against caches of Sk keys per entry, the keys
once in pages (shuffled, page_table) and once contiguous ([B, H_kv, Sk, D] with seqlens_k), timed
in the same interleaved rounds (lib.timing.time_interleaved); each paged call is checked against
the float64 reference of the gathered keys first, on the same inputs. The target: paged at least
0.95x contiguous (contiguous_us / us >= 0.95) at every row, page size 16 included.
"""
PAGED_DTYPE = torch.bfloat16
PAGED_D, PAGED_H, PAGED_HKV = 128, 32, 8
PAGE_SIZES = (16, 64, 256)
# (B, Sq, Sk): decoding over batch and cache length, and a few speculative (bottom-right) rows
PAGED_ROWS = [(B, 1, Sk) for B in (1, 8, 64) for Sk in (1024, 4096, 16384, 32768) if B * Sk <= 64 * 16384] \
    + [(1, 4, 8192), (8, 4, 4096), (1, 16, 8192), (8, 16, 4096)]
PAGED_QUICK = [(1, 1, 4096), (8, 1, 16384), (64, 1, 1024), (8, 4, 4096)]


def paged_checked(out, q, k, v, lens, causal) -> bool:
    """The paged call's output against the reference of each entry's keys (a sample of entries)."""
    for b in sorted({0, len(lens) - 1, len(lens) // 2}):
        n = lens[b]
        c = check_output(out[b:b + 1], q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=causal)
        if not c.passed:
            print(f"  entry {b} ({n} keys): {c.summary()}", flush=True)
            return False
    return True


def paged(a) -> int:
    """--paged: PAGED_DOC's rows, recorded under "paged"."""
    rows, ok, t0 = [], True, time.time()
    g = random.Random(50)
    for B, Sq, Sk in (PAGED_QUICK if a.quick else PAGED_ROWS):
        causal = "bottom_right" if Sq > 1 else False
        q, k, v = make_qkv(B, PAGED_H, Sq, PAGED_D, Sk=Sk, Hkv=PAGED_HKV, dtype=PAGED_DTYPE, seed=B + Sq + Sk)
        lens = [Sk] * B  # every entry full: the same work paged and contiguous
        seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
        fns, passed, caches = {}, {}, {}
        for ps in PAGE_SIZES:
            kc, vc, table = paged_cache(k, v, lens, ps, spare=0, shared=False, generator=g)
            caches[ps] = (kc, vc, table)
            out = s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=table)
            passed[ps] = paged_checked(out, q, k, v, lens, causal)
            fns[f"paged {ps}"] = (lambda kc=kc, vc=vc, table=table:
                                  s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=table))
        fns["contiguous"] = lambda: s6.attention(q, k, v, causal=causal, seqlens_k=seqlens)
        times = time_interleaved(fns, rounds=5, budget_s=0.3)
        base = times["contiguous"]
        print(f"B{B} H{PAGED_H}/{PAGED_HKV} Sq{Sq} Sk{Sk} D{PAGED_D} bf16: contiguous {base.median_us:,.1f} µs "
              f"({time.time() - t0:.0f} s)", flush=True)
        for ps in PAGE_SIZES:
            t = times[f"paged {ps}"]
            ratio = base.median_us / t.median_us
            rows.append({"B": B, "H": PAGED_H, "Hkv": PAGED_HKV, "Sq": Sq, "Sk": Sk, "D": PAGED_D, "dtype": "bfloat16",
                         "causal": bool(causal), "page_size": ps, "us": t.median_us,
                         "us_rounds": t.round_medians_us, "contiguous_us": base.median_us,
                         "contiguous_us_rounds": base.round_medians_us, "ratio": ratio,
                         "passed": passed[ps]})
            ok &= passed[ps]
            print(f"  page {ps:3d}: {t.median_us:10,.1f} µs  {ratio:5.3f}x contiguous "
                  f"{'(target >= 0.95) ' if ratio < 0.95 else ''}{'pass' if passed[ps] else 'FAIL'}", flush=True)
        del q, k, v, caches, fns
    worst = min(rows, key=lambda r: r["ratio"])
    print(f"worst: {worst['ratio']:.3f}x at B{worst['B']} Sq{worst['Sq']} Sk{worst['Sk']} page {worst['page_size']}")
    if a.record:
        env = R.capture_env()
        path = R.save_extra(env["gpu"], "paged", {"env": env, "sha256": R.stage_sha256(s6.INFO), "rows": rows})
        print(f"recorded in {path}")
    return 0 if ok else 1


# --paged-ideas: a producer idea for small pages, on and off in the same rounds (issue 50 item 3)
IDEAS_PAGE = 16
# name -> stage6.attention options: the build the rule picks now against the idea left off
IDEAS = {"ids ahead (rule)": {}, "ids ahead off": {"page_ids_ahead": 0}, "ids ahead 2": {"page_ids_ahead": 2},
         "ids ahead 8": {"page_ids_ahead": 8}}


def paged_ideas(a) -> int:
    """--paged-ideas: PAGED_ROWS at IDEAS_PAGE-key pages, each of IDEAS and contiguous timed in the
    same interleaved rounds (each paged call checked first); ratios to contiguous, and of each idea
    to "ids ahead off" (the build before PAGE_IDS_AHEAD). Rows also to --out."""
    rows, ok, t0 = [], True, time.time()
    g = random.Random(50)
    for B, Sq, Sk in (PAGED_QUICK if a.quick else PAGED_ROWS):
        causal = "bottom_right" if Sq > 1 else False
        q, k, v = make_qkv(B, PAGED_H, Sq, PAGED_D, Sk=Sk, Hkv=PAGED_HKV, dtype=PAGED_DTYPE, seed=B + Sq + Sk)
        lens = [Sk] * B
        seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
        kc, vc, table = paged_cache(k, v, lens, IDEAS_PAGE, spare=0, shared=False, generator=g)
        fns, passed = {}, {}
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        chosen = s6.choose(B, PAGED_H, PAGED_HKV, Sq, Sk, PAGED_D, s6.causal_mode(causal, Sq, Sk, s6.INFO) if Sq > 1
                           else 0, sms, paged=IDEAS_PAGE)["splits"]
        ideas = {**IDEAS, "ids ahead, 2x splits": {"splits": 2 * chosen}}  # twice the blocks: two per SM in flight
        for name, opts in ideas.items():
            out = s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=table, **opts)
            passed[name] = paged_checked(out, q, k, v, lens, causal)
            fns[name] = (lambda opts=opts: s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens,
                                                        page_table=table, **opts))
        fns["contiguous"] = lambda: s6.attention(q, k, v, causal=causal, seqlens_k=seqlens)
        times = time_interleaved(fns, rounds=5, budget_s=0.3)
        base, off = times["contiguous"], times["ids ahead off"]
        print(f"B{B} H{PAGED_H}/{PAGED_HKV} Sq{Sq} Sk{Sk} D{PAGED_D} bf16 page {IDEAS_PAGE}: contiguous "
              f"{base.median_us:,.1f} µs ({time.time() - t0:.0f} s)", flush=True)
        for name in ideas:
            t = times[name]
            ratio, vs_off = base.median_us / t.median_us, off.median_us / t.median_us
            rows.append({"B": B, "Sq": Sq, "Sk": Sk, "page_size": IDEAS_PAGE, "idea": name, "opts": ideas[name],
                         "us": t.median_us, "us_rounds": t.round_medians_us, "contiguous_us": base.median_us,
                         "ratio": ratio, "vs_off": vs_off, "passed": passed[name]})
            ok &= passed[name]
            print(f"  {name:18s}: {t.median_us:10,.1f} µs  {ratio:5.3f}x contiguous  {vs_off:5.3f}x off "
                  f"{'(target >= 0.95) ' if ratio < 0.95 else ''}{'pass' if passed[name] else 'FAIL'}", flush=True)
        del q, k, v, kc, vc, table, fns
    for name in dict.fromkeys(r["idea"] for r in rows):
        mine = [r for r in rows if r["idea"] == name]
        worst = min(mine, key=lambda r: r["ratio"])
        print(f"{name}: worst {worst['ratio']:.3f}x contiguous at B{worst['B']} Sq{worst['Sq']} Sk{worst['Sk']}; "
              f"{sum(r['ratio'] < 0.95 for r in mine)} of {len(mine)} rows below 0.95x")
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "rows": rows}, indent=1))
        print(f"rows in {a.out}")
    return 0 if ok else 1


# --------------------------------------------------------------------------------------------
# --fp8-kv: decoding from an e4m3 KV cache against SDPA on the same cache in bf16 (issue 50 item 2)

FP8_DOC = """--fp8-kv: decoding from an e4m3 KV cache (k_descale, v_descale) with FP8's own path
(stages/stage7_decode.py) against SDPA's default backend on the same cache dequantized to bf16, with
stage 6's e4m3 build and stage 6 on that bf16 cache beside them, in the same interleaved rounds
(lib.timing.time_interleaved); each row's e4m3 calls are checked first against the float64 reference
of the dequantized cache (a sample of entries). Sq 1, D128, H32/8, B 1/8/64, Sk 1k-32k.
"""
FP8_ROWS = [(B, Sk) for B in (1, 8, 64) for Sk in (1024, 4096, 16384, 32768)]
FP8_QUICK = [(1, 4096), (8, 16384), (64, 1024)]
FP8_D, FP8_H, FP8_HKV = 128, 32, 8


def fp8_checked(out, q, k64, v64) -> bool:
    """The e4m3 call's output against the float64 reference of the dequantized cache (k64, v64),
    entry by entry, the error rule's baseline SDPA on that cache in q's dtype."""
    from lib.reference import sdpa
    for b in range(q.shape[0]):
        kb, vb = k64[b:b + 1], v64[b:b + 1]
        base = sdpa(q[b:b + 1], kb.to(q.dtype), vb.to(q.dtype))
        c = check_output(out[b:b + 1], q[b:b + 1], kb, vb, sdpa_out=base)
        if not c.passed:
            print(f"  entry {b}: {c.summary()}", flush=True)
            return False
    return True


def fp8_kv(a) -> int:
    """--fp8-kv: FP8_DOC's rows, recorded under "fp8_decode"."""
    rows, ok, t0 = [], True, time.time()
    for B, Sk in (FP8_QUICK if a.quick else FP8_ROWS):
        q, k, v = make_qkv(B, FP8_H, 1, FP8_D, Sk=Sk, Hkv=FP8_HKV, dtype=torch.bfloat16)  # drawn on the GPU
        (k8, kd), (v8, vd) = f8.quantize(k), f8.quantize(v)
        del k, v
        k16, v16 = f8.dequantized(k8, kd, torch.bfloat16), f8.dequantized(v8, vd, torch.bfloat16)  # the same cache
        fns = {"fp8": lambda: d7.attention(q, k8, v8, k_descale=kd, v_descale=vd),
               "sdpa": sdpa_call(q, k16, v16),
               "stage6 fp8": lambda: s6.attention(q, k8, v8, k_descale=kd, v_descale=vd),
               "bf16": lambda: s6.attention(q, k16, v16)}
        idx = torch.tensor(sorted({0, B // 2, B - 1}), device=q.device)  # the whole B64 Sk32k cache in float64: 34 GB
        k64, v64 = f8.dequantized(k8[idx], kd[idx]), f8.dequantized(v8[idx], vd[idx])
        outs = {name: fns[name]() for name in ("fp8", "stage6 fp8")}
        passed = all(fp8_checked(o[idx], q[idx], k64, v64) for o in outs.values())
        del k64, v64
        times = time_interleaved(fns, rounds=5, budget_s=0.3)
        passed &= all(torch.equal(fns[name](), o) for name, o in outs.items())  # again after the timing: the same bits
        us, sdpa_us, s6_us, bf16_us = (times[n].median_us for n in ("fp8", "sdpa", "stage6 fp8", "bf16"))
        rows.append({"B": B, "H": FP8_H, "Hkv": FP8_HKV, "Sq": 1, "Sk": Sk, "D": FP8_D, "dtype": "bfloat16",
                     "us": us, "us_rounds": times["fp8"].round_medians_us, "sdpa_us": sdpa_us,
                     "sdpa_us_rounds": times["sdpa"].round_medians_us, "stage6_fp8_us": s6_us,
                     "stage6_bf16_us": bf16_us, "vs_sdpa": sdpa_us / us, "vs_stage6_fp8": s6_us / us,
                     "vs_bf16": bf16_us / us, "passed": passed})
        ok &= passed
        print(f"B{B} H{FP8_H}/{FP8_HKV} Sq1 Sk{Sk} D{FP8_D}: e4m3 {us:9,.1f} µs  SDPA bf16 {sdpa_us:9,.1f} µs "
              f"({sdpa_us / us:5.2f}x)  stage 6 e4m3 {s6_us:9,.1f} µs ({s6_us / us:5.2f}x)  stage 6 bf16 "
              f"{bf16_us:9,.1f} µs ({bf16_us / us:5.2f}x)  {'pass' if passed else 'FAIL'}  ({time.time() - t0:.0f} s)",
              flush=True)
        del q, k8, v8, k16, v16, fns, outs
        torch.cuda.empty_cache()
    if a.record and ok:
        env = R.capture_env()
        path = R.save_extra(env["gpu"], "fp8_decode", {"env": env, "sha256": R.stage_sha256(d7.INFO),
                                                       "stage6_sha256": R.stage_sha256(s6.INFO), "rows": rows})
        print(f"recorded in {path}")
    elif a.record:
        print("a row FAILED the error rule: nothing recorded")
    if a.out:
        a.out.write_text(json.dumps({"env": R.capture_env(), "rows": rows}, indent=1))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--record", action="store_true", help='store under "shape_map" in results/<gpu>.json')
    ap.add_argument("--paged", action="store_true", help="only the paged KV cache against contiguous "
                    '(PAGED_DOC); with --record stored under "paged", with --quick a few rows')
    ap.add_argument("--paged-ideas", action="store_true", help="with --paged: a producer idea for "
                    f"{IDEAS_PAGE}-key pages on and off in the same rounds (IDEAS; rows to --out, not recorded)")
    ap.add_argument("--fp8-kv", action="store_true", help="only decoding from an e4m3 KV cache against SDPA (FP8_DOC); "
                    'with --record stored under "fp8_decode", with --quick a few rows')
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
                    choices=["decode", "waterfall", "prefill", "schedules", "latency", "timeline", "splits"],
                    help="schedules, latency, timeline: stage 6's launches at short prefill; splits: split counts "
                         "and combines at the decode rows below SDPA (not in the default set)")
    ap.add_argument("--budget-s", type=float, default=240.0,
                    help="the splits part: seconds of the GPU machine it may take by its estimate (start-up included)")
    ap.add_argument("--splits-record", type=Path, default=None,
                    help="the splits part: the results file whose shape map picks the rows (default: this GPU's, "
                         "else the newest in results/)")
    ap.add_argument("--out", type=Path, help="also write every measured row (and the environment) to this JSON file")
    a = ap.parse_args()
    if "splits" in a.parts and a.record:
        ap.error("--parts splits is an experiment: its rows go to --out, not into the record")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("shape_map.py times stage 6, which runs on sm_90 GPUs (H100/H200) only", file=sys.stderr)
        return 2
    if a.paged_ideas and (not a.paged or a.record):
        ap.error("--paged-ideas goes with --paged, without --record (an experiment: its rows go to --out)")
    if a.paged:
        return paged_ideas(a) if a.paged_ideas else paged(a)
    if a.fp8_kv:
        return fp8_kv(a)
    splits = splits_part(a) if "splits" in a.parts else None
    plan = []
    if "decode" in a.parts:
        plan += [(r, None) for r in decode_rows(a.dtype, a.quick)]
    if "waterfall" in a.parts:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for B, H, Hkv, Sq, Sk, D in (WATERFALL_SHAPES[:1] if a.quick else WATERFALL_SHAPES):
            for name, opts in WATERFALL:
                if name == FEW_KEYS_STEP and s6.choose(B, H, Hkv, Sq, Sk, D, False, sms)["schedule"] != s6.FEW_KEYS_SCHEDULE:
                    continue  # the same launch as the step before
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
    env = R.capture_env() if a.record or a.out else None
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
        _log(a.out, env, rows, splits)
        if a.record and (done + i + 1) % 10 == 0:
            # a run cut short (a call's time limit) leaves its rows here, beside the complete map,
            # which only a finished run replaces (--resume goes on from them)
            R.save_extra(env["gpu"], "shape_map_partial", {"env": env, "sha256": R.stage_sha256(s6.INFO),
                                                           "of": total, "rows": rows})
    if splits:
        rows += run_splits(splits, a.out, env, rows)
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
