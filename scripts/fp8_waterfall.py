"""Stage 7's schedule waterfall on the GPU (issue 25, item 5): FlashAttention-3's ideas one at a
time on the e4m3 kernel, as stage 6's notebook shows them in bf16, then what stage 7 changed on
top: 192-key tiles at D128, persistent blocks without ping-pong and, at D64, the row sums from
P·V (ROW_SUM_MMA). At the standard shapes of
issue 25's targets (B16 H16 S2048 D64, B4 H16 S8192 D128; full and causal), every step timed with
stage 6 and SDPA's default backend in the same interleaved rounds, each checked against lib.fp8's
emulation of the same arithmetic before timing.

    python scripts/fp8_waterfall.py                  # print the steps (H100/H200)
    python scripts/fp8_waterfall.py --record         # and store them under "fp8_waterfall" in results/<gpu>.json
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
from lib.timing import sdpa_call, time_interleaved  # noqa: E402
from stages import stage6, stage7  # noqa: E402

SHAPES = [(16, 16, 2048, 64), (4, 16, 8192, 128)]  # (B, H, S, D)


def steps(D: int) -> list[tuple[str, dict]]:
    """(label, options of stage7.forward) in order: stage 6's schedule ideas on 128-key tiles,
    then stage 7's own steps, ending at its default call (no options). Every step before the row
    sums runs without them, and every step before the last without the tail split."""
    t128 = stage7.V_IN_KERNEL_TILES[D]  # the 128-key tiles stage 7 started with
    plain = {"row_sum_mma": False, "tail_split": False}
    out = [(name, {"schedule": name, "tiles": t128, **plain}) for name in stage6.SCHEDULES]
    if stage7.TILES[D] != t128:
        out.append((f"+ {stage7.TILES[D][0]}-key tiles", {"schedule": "+ work queue", "tiles": stage7.TILES[D], **plain}))
    out.append(("without ping-pong", plain))
    if stage7.ROW_SUM_MMA[D]:
        out.append(("+ row sums by P·V", {"tail_split": False}))
    out.append(("+ tail split", {"tail_split": True}))
    last = out[-1] if stage7.TAIL_SPLIT[D] else out[-2]  # the head dim's default call
    out[out.index(last)] = (last[0] + " (default)", {})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", action="store_true",
                    help='store under "fp8_waterfall" in results/<gpu>.json (only when every check passed), '
                         "with stage 7's sources' hash, for the stage 7 notebook")
    ap.add_argument("--out", type=Path, help="write every timing, with the env, as JSON")
    ap.add_argument("--budget-s", type=float, default=0.3, help="seconds of timing per callable (default 0.3)")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: runs stage 7 (e4m3 wgmma, sm_90a), so it needs an H100 or H200 and none was found\n")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    panels, ok = [], True
    for B, H, S, D in SHAPES:
        for causal in (False, True):
            q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
            prepared = fp8.prepare(q, k, v)
            q8, k8, v8, qd, kd, vd = prepared
            vt = fp8.v_for_pv(v8)
            code = causal_mode(causal, S, S, stage7.INFO)
            fns, checks, used = {}, {}, {}
            for label, opts in steps(D):
                fn = (lambda opts=opts: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                                       out_dtype=torch.bfloat16, **opts))
                used[label] = stage7.choose(B, H, S, S, D, causal, sms, tiles=opts.get("tiles"),
                                            schedule=opts.get("schedule"))
                build = stage7.emulation_of(B, H, S, S, D, causal, sms, tiles=opts.get("tiles"),
                                            schedule=opts.get("schedule"), row_sum_mma=opts.get("row_sum_mma"))
                checks[label] = fp8.check_on_emulation(fn(), *prepared, causal=causal, **build)["passed"]
                fns[label] = fn
            fns["stage 6"] = lambda: stage6.attention(q, k, v, causal=causal)
            fns["SDPA default"] = sdpa_call(q, k, v, causal=causal)
            t = time_interleaved(fns, budget_s=a.budget_s)
            flops = attention_flops(B, H, S, S, D, causal)
            rows = []
            for label, _ in steps(D):
                x = t[label]
                ok &= checks[label]
                rows.append({"variant": label, "us": x.median_us, "us_rounds": x.round_medians_us,
                             "tflops": flops / x.median_us / 1e6, "tiles": list(used[label]["tiles"]),
                             "schedule": used[label]["schedule"], "passed": checks[label]})
                print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} {label}: {x.median_us:,.1f} µs, "
                      f"{rows[-1]['tflops']:.0f} TFLOPS ({used[label]['tiles']}, {used[label]['schedule']}): "
                      f"{'pass' if checks[label] else 'FAIL'}", flush=True)
            extra = {name: {"us": t[name].median_us, "tflops": flops / t[name].median_us / 1e6}
                     for name in ("stage 6", "SDPA default")}
            print(f"  stage 6 {extra['stage 6']['tflops']:.0f} TFLOPS, SDPA default {extra['SDPA default']['tflops']:.0f}",
                  flush=True)
            panels.append({"B": B, "H": H, "S": S, "D": D, "causal": causal, "rows": rows, **extra})
    result = {"env": R.capture_env(), "sha256": R.stage_sha256(stage7.INFO), "budget_s": a.budget_s, "panels": panels}
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    if a.record and ok:
        print(f"recorded in {R.save_extra(result['env']['gpu'], 'fp8_waterfall', result)}")
    elif a.record:
        print("a check against the emulation FAILED: nothing recorded")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
