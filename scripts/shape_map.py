"""Stage 6 against SDPA at the shapes models run, on the GPU:

- prefill: S 512 … 16384 at B·S = 16k tokens, D64 with H16 and D128 with H32, MHA and GQA 4:1,
  full and causal;
- decoding: Sq 1 (one new token) and 4 (speculative decoding) against caches of Sk 1k … 32k,
  B 1 … 64, GQA 32/8 and 8/1, D128 and D64;
- the decoding waterfall: at a few decode shapes, the prefill build (one block per query head,
  the keys in one block), + split-KV, packed GQA alone, and both (stage 6's own choice);
- (--parts schedules) stage 6's schedules at short prefill, S 512 … 2048: one block per work
  tile against persistent blocks (fixed stride or a work queue).

Every row is checked against the float64 reference first (on batch 0 when the whole batch's
float64 copy would be too big), then timed with SDPA's default and FLASH backends on the same
inputs in interleaved rounds (lib.timing.time_interleaved: L2 flushed, GPU held). Ratios are
SDPA's time over stage 6's (> 1: stage 6 faster).

    python scripts/shape_map.py                  # print
    python scripts/shape_map.py --record         # and store under "shape_map" in results/<gpu>.json
    python scripts/shape_map.py --quick          # a few rows of each part (a smoke run)
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
             ("split-KV + packed GQA", {})]
# short prefill (B·S = 16k, MHA): the schedules that differ in what happens between work tiles
SCHEDULE_SEQS = (512, 1024, 2048)
SCHEDULES = ["+ intra-warpgroup overlap", "+ persistent blocks", "+ work queue", "work queue without ping-pong"]
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
                   splits=opts.get("splits"), pack_gqa=opts.get("pack_gqa"), schedule=opts.get("schedule"))
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
               splits=ch["splits"], packed=ch["pack_gqa"], tiles=list(ch["tiles"]), schedule=ch["schedule"],
               stage_round_medians_us=times["stage"].round_medians_us)
    del q, k, v
    return row


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
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float16"], choices=["float16", "bfloat16"])
    ap.add_argument("--parts", nargs="+", default=["decode", "waterfall", "prefill"],
                    choices=["decode", "waterfall", "prefill", "schedules"],
                    help="schedules: stage 6's schedules at short prefill (not in the default set)")
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
    if "schedules" in a.parts:
        for D, H in PREFILL_HEADS.items():
            for S in (SCHEDULE_SEQS[:1] if a.quick else SCHEDULE_SEQS):
                for causal in (False, True):
                    for name in SCHEDULES:
                        plan.append(({"part": "schedules", "variant": name, "B": TOKENS // S, "H": H, "Hkv": H,
                                      "Sq": S, "Sk": S, "D": D, "dtype": "bfloat16", "causal": causal},
                                     {"schedule": name}))
    if "prefill" in a.parts:
        plan += [(r, None) for r in prefill_rows(a.dtype, a.quick)]
    rows, t0 = [], time.time()
    env = R.capture_env() if a.record else None
    for i, (row, opts) in enumerate(plan):
        rows.append(measure(row, opts))
        left = (time.time() - t0) / (i + 1) * (len(plan) - i - 1)
        print(f"[{i + 1}/{len(plan)}, ~{left:.0f} s left] {_fmt(row)}", flush=True)
        if a.record and (i + 1) % 10 == 0:
            # a run cut short (a call's time limit) leaves its rows here, beside the complete map,
            # which only a finished run replaces
            R.save_extra(env["gpu"], "shape_map_partial", {"env": env, "sha256": R.stage_sha256(s6.INFO),
                                                           "of": len(plan), "rows": rows})
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
