"""Stage 7's key tiles on the GPU: each (BLOCK_N, STAGES, CONSUMERS) of CANDIDATES against the
head dim's default (stage7.TILES) and stage 6 in interleaved rounds, at the standard shapes of
issue 25's targets (B16 H16 S2048 D64, B4 H16 S8192 D128; full and causal). Each candidate is
checked against lib.fp8's emulation of the same arithmetic before it is timed and again after.
Every candidate runs without ROW_SUM_MMA (the row sums from P·V, stage 7's default at D64), which
three consumers with 160-key tiles have no registers for, and without TAIL_SPLIT (whose pieces
follow the key tiles' count): this compares the widths alone, and fp8_waterfall.py times the row
sums and the tail split as steps of their own.

Why wider tiles could pay (predicted, not measured, before this script ran): a key tile's fixed
costs — the barrier waits, the row max and sum shuffles, O's rescale, the turns of ping-pong —
are the same for 128 keys as for 224, while the products and exponentials grow with the keys,
and in e4m3 the products take half the time they took in stage 6. FlashAttention-3 runs FP8 with
160-key tiles at D64 (three consumers) and 224 at D128 (two).

    python scripts/fp8_tiles.py                  # print the table (H100/H200)
    python scripts/fp8_tiles.py --out tiles.json # and write every timing with the env
    python scripts/fp8_tiles.py --record         # and store it under "fp8_tiles" in results/<gpu>.json
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

from lib import fp8  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import causal_mode, make_qkv  # noqa: E402
from lib.reference import attention_flops  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
from stages import stage6, stage7  # noqa: E402

CANDIDATES = {64: [(128, 3, 3), (160, 3, 3), (160, 4, 3), (128, 3, 2), (160, 3, 2), (192, 3, 2)],
              128: [(128, 3, 2), (160, 3, 2), (192, 2, 2), (192, 3, 2), (224, 2, 2), (224, 3, 2)]}
SHAPES = [(16, 16, 2048, 64), (4, 16, 8192, 128)]  # (B, H, S, D)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every timing, with the env, as JSON")
    ap.add_argument("--record", action="store_true",
                    help='store under "fp8_tiles" in results/<gpu>.json (only when every check passed), with '
                         "stage 7's sources' hash, for the stage 7 notebook")
    ap.add_argument("--budget-s", type=float, default=0.4, help="seconds of timing per callable (default 0.4)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: runs stage 7 (e4m3 wgmma, sm_90a), so it needs an H100 or H200 and none was found\n")
    dtype = getattr(torch, a.dtype)
    rows, ok = [], True
    for B, H, S, D in SHAPES:
        for causal in (False, True):
            q, k, v = make_qkv(B, H, S, D, dtype=dtype)
            prepared = fp8.prepare(q, k, v)
            q8, k8, v8, qd, kd, vd = prepared
            vt = fp8.v_for_pv(v8)
            code = causal_mode(causal, S, S, stage7.INFO)

            def kernel(tiles):
                return lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                              out_dtype=dtype, tiles=tiles, row_sum_mma=False, tail_split=False)

            def check(tiles) -> bool:
                return fp8.check_on_emulation(kernel(tiles)(), *prepared, causal=causal, key_tile=tiles[0])["passed"]
            before = {t: check(t) for t in CANDIDATES[D]}
            fns = {str(t): kernel(t) for t in CANDIDATES[D]}
            fns["stage 6"] = lambda: stage6.attention(q, k, v, causal=causal)
            timed = time_interleaved(fns, budget_s=a.budget_s)
            after = {t: check(t) for t in CANDIDATES[D]}
            flops = attention_flops(B, H, S, S, D, causal)
            base = timed[str(stage7.TILES[D])].median_us
            for t in CANDIDATES[D]:
                x = timed[str(t)]
                passed = before[t] and after[t]
                ok &= passed
                rows.append({"B": B, "H": H, "S": S, "D": D, "causal": causal, "dtype": a.dtype, "tiles": list(t),
                             "us": x.median_us, "round_medians_us": x.round_medians_us,
                             "tflops": flops / x.median_us / 1e6, "vs_default": base / x.median_us,
                             "vs_stage6": timed["stage 6"].median_us / x.median_us,
                             "stage6_us": timed["stage 6"].median_us, "row_sum_mma": False, "passed": passed})
                print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} tiles {t}: {x.median_us:,.1f} µs, "
                      f"{rows[-1]['tflops']:.0f} TFLOPS, {rows[-1]['vs_default']:.3f}× TILES {stage7.TILES[D]}, "
                      f"{rows[-1]['vs_stage6']:.2f}× stage 6: {'pass' if passed else 'FAIL'}", flush=True)
    print("\n| shape | causal | tiles | µs | TFLOPS | × default tiles | × stage 6 | check |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| B{r['B']} H{r['H']} S{r['S']} D{r['D']} | {'yes' if r['causal'] else 'no'} | {tuple(r['tiles'])} | "
              f"{r['us']:,.1f} | {r['tflops']:.0f} | {r['vs_default']:.3f} | {r['vs_stage6']:.2f} | "
              f"{'pass' if r['passed'] else 'FAIL'} |")
    result = {"env": R.capture_env(), "sha256": R.stage_sha256(stage7.INFO), "budget_s": a.budget_s,
              "default_tiles": {str(d): list(t) for d, t in stage7.TILES.items()}, "rows": rows}
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    if a.record and ok:
        print(f"recorded in {R.save_extra(result['env']['gpu'], 'fp8_tiles', result)}")
    elif a.record:
        print("a check against the emulation FAILED: nothing recorded")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
