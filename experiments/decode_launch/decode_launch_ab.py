"""Experiment (issue 21): does decoding lose its time to each block's fixed cost?

Stage 6 decodes with one block per work tile (a K/V head's packed queries, or one split of its
keys), a block per SM at a time (its K/V ring fills the shared memory). Issue 21's splits
experiment (results/logs/2026-11-25-6ac4cb0-h100/splits.json) gives the size of a block's
fixed cost: at B64 H32/8 Sk1024 D64 (512 work tiles of 8 key tiles) two splits took 77.8 µs
against 64.0 unsplit and eight took 153.2, though the partial rows are under 1 MB: about 3.3 µs
of an SM's time for each block added (prologue, Q and the first tiles' wait, the epilogue's
stores), in which that SM streams nothing. And where the work tiles are not a whole number of
waves (512 on 132 SMs: 3.9), the last wave's blocks start late and the SMs that finish first idle.

A persistent launch (one block per SM walking the work tiles, the next tile from a counter: the
prefill build's "work queue without ping-pong") keeps the K/V ring running from one work tile
into the next: the producer copies the next tile's Q, K and V while the consumer finishes this
one. Predicted: the rows of many short work tiles gain most (B64 H32/8 Sk1024: up to the
~13 µs of four waves' fixed costs), long ones (Sk 32k) stay level, and with the fixed cost gone
splitting costs little more than its partial rows, so the tail can be cut by splits.

Measured (results/logs/2026-11-26-833bb23-h100, --launch persistent): no. The persistent launch ran
0.95-1.09x of as called, and two splits still cost B64 H32/8 Sk1024 D64 15 µs persistent (77.2 against
62.2). Nsight Compute then showed what cuDNN does at those rows (2026-11-26-c09b29e-h100): 512
blocks of 128 threads, 2 per SM at D128 (86 KB of shared memory, 183 registers) and 4 per SM at D64
(45 KB, 120 registers), so every work tile is resident at once, against stage 6's one 256-thread block
per SM (3.88 waves).

--launch blocks (2026-11-26-e2d106f-h100): stage 6 with two or three blocks of one consumer per SM
(BLOCKS_PER_SM; the K/V ring made small enough: (64, 2, 1) at D128, (128, 2, 1) and (64, 4, 1)
at D64), each with the split count as called and the one choose() plans for them
(2026-11-26-e2d106f-h100 ran when that was plan_splits counting every block slot; since, it keeps
the count as called). Predicted: the rows of many work tiles (B64 H32/8, B8 H8/1 Sk1024) reach SDPA; long
single-head rows (B1, Sk 32k) stay level. Measured (2026-11-26-e2d106f-h100): two blocks reached
SDPA at B64 H32/8 (1.02-1.03x of as called), three ran slower (0.83-0.99x), and stage 6's rule
(shares_sms) came from it.

--launch rings (2026-11-26-70e26ce-h100): at the D64 Sq 1 rows where stage 6 runs two blocks per SM,
their ring three buffers deep instead of two ((128, 3, 1): 108 KB a block, still two per SM), each
with the split count as called and twice it. Predicted: the rows that stream most (B8-B64 at Sk 32k, at
0.99x of SDPA) gain from the third buffer in flight, the short ones stay level. Measured
(2026-11-26-70e26ce-h100): no; the third buffer ran 0.97-1.00x of two at the same splits. Twice the
splits won only at B8 H8/1 Sk4096 (32 splits of one key tile: 1.07x, as in 2026-11-26-e2d106f-h100)
and lost at most other rows.

--launch prefetch (2026-11-26-d8ee25e-h100): two things that keep bytes coming at a block's edges.
(a) The producer prefetching the key tiles up to 2 or 4 past the one it loads into L2
(cp.async.bulk.prefetch.tensor, L2_AHEAD): a two-deep ring holds two tiles in flight, and at a
block's start, or where an SM's other block is between work tiles, that is all the SM asks for.
(b) Two blocks per SM as now, but persistent: each walks work tiles from the queue, so the
producer copies the next work tile's Q, K and V while the consumer ends this one, and there is
no wave boundary where both blocks of an SM start at once (512 work tiles on 264 slots: 1.94
waves, each SM's two blocks ending and starting together). Predicted: the rows of many work
tiles that are still under SDPA (B64 H32/8 Sk1024, 0.98x at D64: about 1 µs of 60) gain 1-2%,
the long ones stay level, the short split rows (one key tile per block) see nothing.
Measured (2026-11-26, H100, results/logs/2026-11-26-d8ee25e-h100, at d8ee25e, where stage 6 had the
`l2_ahead` option and allowed persistent blocks two per SM; that change, never merged, is
experiments/decode_launch/l2_prefetch_persistent_two_blocks.patch, and this launch runs only at
that commit): no. The prefetch ran 0.76-1.01x of as called with 2 tiles
ahead (median 0.92x) and 0.62-1.02x with 4, worse the longer the stream (as if prefetched
lines were evicted before their load and read twice; not profiled); the persistent blocks
0.96-1.00x (median 0.99x).

--launch no-producer (2026-11-26-f8b943b-h100): cuDNN's decoding blocks have 128 threads and no producer
warpgroup, four per SM at D64 (45 KB each) and two at D128 (86 KB), every one of 512 work tiles
resident at once (2026-11-26-c09b29e-h100). Stage 6's build without warp specialization is that
block: one consumer warpgroup whose first thread issues the copies (the ring refilled once a
tile's P·V is done), no setmaxnreg, so 128 registers a thread at four blocks per SM. Variants:
(64, 2, 1) four per SM and (128, 2, 1) three per SM at D64, (64, 2, 1) two per SM at D128, the
split count as called. Predicted: the rows of 512 work tiles (B64 H32/8) gain what the wave
boundary costs two blocks per SM (about 1 µs at Sk1024, one wave instead of 1.94); elsewhere
level or slower (no copy is issued while the consumer computes).

This times, at the recorded map's Sq 1 rows (and two Sq 4 controls), stage 6 as it is called
against the chosen launch's variants, with SDPA default and FLASH in the same interleaved
rounds; every variant checked against the float64 reference before and after timing. Logs only
(--out): nothing is recorded.

    python experiments/decode_launch/decode_launch_ab.py --launch blocks --out decode_launch.json
"""
import argparse
import importlib.util
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import results as R  # noqa: E402

_spec = importlib.util.spec_from_file_location("shape_map_script", ROOT / "scripts" / "shape_map.py")
shape_map = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shape_map)

PERSISTENT = "work queue without ping-pong"
# (tiles, blocks per SM) of --launch blocks, per head dim: rings small enough for the blocks to share
# an SM's 228 KB (stage6.config checks); three blocks have 80 registers a thread at launch, which
# 128-key tiles' accumulators do not fit (ptxas C7602), so they take 64-key tiles.
BLOCKS = {128: [((64, 2, 1), 2)], 64: [((128, 2, 1), 2), ((64, 4, 1), 2), ((64, 4, 1), 3)]}


def variants(B, H, Hkv, Sq, Sk, D, sms, launch="blocks"):
    """(fields, options) at one decode shape: as called, then the launch's variants."""
    ch = s6.choose(B, H, Hkv, Sq, Sk, D, False, sms)
    out = [({"variant": "as called", "plan_splits": ch["splits"]}, None)]
    if launch == "persistent":
        key_tiles = -(-Sk // s6.DECODE_TILES[D][0])
        for n in sorted({1, 2, 4, ch["splits"], 2 * ch["splits"]}):
            if n <= min(key_tiles, s6.MAX_SPLITS):
                out.append(({"variant": f"persistent, {n} split{'s' if n > 1 else ''}", "plan_splits": ch["splits"]},
                            {"tiles": s6.DECODE_TILES[D], "schedule": PERSISTENT, "pack_gqa": True, "splits": n}))
        return out
    if launch == "prefetch":
        for n in (2, 4):
            out.append(({"variant": f"L2 prefetch {n}", "plan_splits": ch["splits"]}, {"l2_ahead": n}))
        if ch["blocks_per_sm"] == 2:
            for n in (0, 2):
                out.append(({"variant": "persistent 2 blocks/SM" + (f", L2 prefetch {n}" if n else ""),
                             "plan_splits": ch["splits"]},
                            {"tiles": ch["tiles"], "schedule": PERSISTENT, "pack_gqa": True, "splits": ch["splits"],
                             "blocks_per_sm": 2, "l2_ahead": n}))
        return out
    if launch == "no-producer":
        for tiles, blocks in {64: [((64, 2, 1), 4), ((128, 2, 1), 3)], 128: [((64, 2, 1), 2)]}[D]:
            out.append(({"variant": f"no producer, {blocks} blocks/SM {tiles}", "plan_splits": ch["splits"]},
                        {"tiles": tiles, "schedule": "no warp specialization", "pack_gqa": True,
                         "splits": ch["splits"], "blocks_per_sm": blocks}))
        return out
    if launch == "rings":
        if D != 64 or ch["blocks_per_sm"] != 2:
            return []
        for tiles in ((128, 2, 1), (128, 3, 1)):
            for m in sorted({ch["splits"], min(2 * ch["splits"], -(-Sk // tiles[0]), s6.MAX_SPLITS)}):
                if (tiles, m) == (ch["tiles"], ch["splits"]):
                    continue  # that is the call as called
                out.append(({"variant": f"2 blocks/SM {tiles}, {m} split{'s' if m > 1 else ''}", "plan_splits": m},
                            {"tiles": tiles, "schedule": s6.DECODE_SCHEDULE, "pack_gqa": True, "splits": m,
                             "blocks_per_sm": 2}))
        return out
    for tiles, blocks in BLOCKS[D]:
        n = s6.choose(B, H, Hkv, Sq, Sk, D, False, sms, tiles=tiles, schedule=s6.DECODE_SCHEDULE, pack_gqa=True,
                      blocks_per_sm=blocks)["splits"]
        for m in sorted({n, ch["splits"]}):  # the rule's splits counting every block slot, and as called
            out.append(({"variant": f"{blocks} blocks/SM {tiles}, {m} split{'s' if m > 1 else ''}", "plan_splits": n},
                        {"tiles": tiles, "schedule": s6.DECODE_SCHEDULE, "pack_gqa": True, "splits": m,
                         "blocks_per_sm": blocks}))
    return out


def shapes(record):
    rows = [r for r in record["shape_map"]["rows"] if r["part"] == "decode" and r["dtype"] == "bfloat16"]
    picked = [r for r in rows if r["Sq"] == 1]
    picked += sorted((r for r in rows if r["Sq"] == 4), key=lambda r: r["vs_sdpa"])[:2]
    return [{k: r[k] for k in ("B", "H", "Hkv", "Sq", "Sk", "D", "dtype", "causal")} | {
        "part": "decode launch", "recorded_vs_sdpa": r["vs_sdpa"]} for r in picked]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every row, with the env, as JSON")
    ap.add_argument("--budget-s", type=float, default=0.3, help="seconds of timing per callable and shape")
    ap.add_argument("--limit", type=int, default=None, help="only the first N shapes (a smoke run)")
    ap.add_argument("--launch", choices=["persistent", "blocks", "rings", "prefetch", "no-producer"], default="blocks",
                    help="persistent: the persistent packed launch (2026-11-26-833bb23-h100); "
                         "blocks: several blocks per SM (2026-11-26-e2d106f-h100); "
                         "rings: the two-block D64 ring two or three deep (2026-11-26-70e26ce-h100); "
                         "prefetch: L2 prefetch and persistent two-block launches "
                         "(2026-11-26-d8ee25e-h100); no-producer: blocks of one warpgroup, 2-4 per SM "
                         "(2026-11-26-f8b943b-h100); each a folder of results/logs/")
    a = ap.parse_args()
    if a.launch == "prefetch" and "l2_ahead" not in inspect.signature(s6.attention).parameters:
        ap.exit(2, f"{ap.prog}: --launch prefetch needs stage 6's l2_ahead option, which was not kept: run it at "
                   "commit d8ee25e, where results/logs/2026-11-26-d8ee25e-h100 was made (the change, "
                   "never merged: experiments/decode_launch/l2_prefetch_persistent_two_blocks.patch)\n")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 6 (sm_90a), so it needs an H100 or H200 and none was found\n")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    env = R.capture_env()
    todo = shapes(R.load(R.results_path(env["gpu"])))[:a.limit]
    return shape_map.run_variant_shapes(
        todo, lambda row: variants(*(row[k] for k in ("B", "H", "Hkv", "Sq", "Sk", "D")), sms, a.launch),
        a.budget_s, a.out, env)


if __name__ == "__main__":
    sys.exit(main())
