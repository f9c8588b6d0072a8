"""Stage 5 on the GPU, idea by idea: the waterfall from a stage-4-like build of the stage 5
kernel to the stage's own build, one idea added per step (stages/stage5.py: IDEAS), the
leave-one-out variants (the stage's build with one idea undone) and two alternatives (a ring
of 3, plain rows), next to stage 4 itself and SDPA, at the standard shape of each head dim
(fp16, full and causal). Every variant is checked against the reference on odd shapes (GQA,
Sq != Sk, full and causal) before it is timed, and again after.

    python scripts/stage5_ideas.py             # print the tables
    python scripts/stage5_ideas.py --quick     # full mask only, shorter timing
    python scripts/stage5_ideas.py --record    # and store under "stage5_ideas" in results/<gpu>.json

Speed ratios are time ratios: "× stage 4" = stage 4's time / the variant's (2× = twice as
fast); "× previous step" compares a waterfall step with the step before it; "× stage 5"
compares a leave-one-out variant with the stage's own build (below 1: the idea it lacks helps).
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

import stages.stage4 as s4  # noqa: E402
import stages.stage5 as s5  # noqa: E402
from lib import nvrtc  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import attention_flops, check_attention  # noqa: E402
from lib.simulator import HAS_GPU  # noqa: E402
from lib.timing import sdpa_call, time_cuda  # noqa: E402

SHAPES = [(16, 16, 2048, 64), (4, 16, 8192, 128)]  # (B, H, S, D): the tuned shape of each head dim
# odd shapes for the correctness checks: (B, H, H_kv, Sq, Sk)
CHECKS = [(2, 4, 2, 300, 517), (1, 2, 2, 129, 77)]


def variants() -> list[tuple[str, str, dict | None]]:
    """(kind, name, ideas) in table order: stage 4 itself (ideas None), the waterfall (its last
    step is the stage's own build), the leave-one-out variants, the alternatives."""
    out = [("stage 4", "stage 4", None)]
    out += [("waterfall", name, ideas) for name, ideas in s5.waterfall()]
    out += [("leave-one-out", name, ideas) for name, ideas in s5.leave_one_out()]
    out += [("alternative", name, ideas) for name, ideas in s5.ALTERNATIVES.items()]
    return out


def runner(ideas):
    if ideas is None:
        return lambda q, k, v, causal=False: s4.attention(q, k, v, causal=causal)
    return lambda q, k, v, causal=False: s5.attention(q, k, v, causal=causal, ideas=ideas)


def checked(fn, D) -> tuple[bool, str]:
    """Every odd shape, full and causal: (all passed, the first failure's summary)."""
    for B, H, Hkv, Sq, Sk in CHECKS:
        for causal in (False, True):
            c = check_attention(fn, B, H, Sq, Sk, D, dtype=torch.float16, causal=causal, Hkv=Hkv)
            if not c.passed:
                return False, f"B{B} H{H}/{Hkv} Sq{Sq} Sk{Sk} causal={causal}: {c.summary()}"
    return True, ""


def resources(ideas, D) -> dict:
    """Registers, spills and dynamic shared memory of a stage 5 variant (ptxas, this GPU's arch)."""
    if ideas is None:
        return {}
    compiled = next(iter(s5.compile_for(nvrtc.gpu_arch(), torch.float16, D, ideas=ideas).values()))
    p = next(iter(nvrtc.parse_ptxas_log(compiled.log).values()))
    return {"registers": p["registers"], "spill_bytes": p["spill_stores"],
            "smem_bytes": s5.config(D, None, True, tuple(sorted(ideas.items())))["smem"]}


def _us(t) -> str:
    return "—" if t is None else f"{t:,.1f} µs"


def _x(a, b) -> str:
    """a / b as a speed ratio, or — when either is missing."""
    return f"{a / b:.2f}×" if a and b else "—"


def tables(rows: list[dict]) -> str:
    """Markdown: per shape and mask, the waterfall (× stage 4, × previous step), then the
    leave-one-out variants and alternatives (× stage 4, × stage 5). Rows missing (a variant
    that failed its check) leave their ratios as —."""
    out = []
    groups = {}
    for r in rows:
        groups.setdefault((r["D"], r["B"], r["H"], r["S"], r["causal"]), []).append(r)
    for (D, B, H, S, causal), rs in groups.items():
        by = {r["variant"]: r for r in rs}
        full = by.get(s5.waterfall()[-1][0], {})
        t4 = by.get("stage 4", {}).get("us")
        out.append(f"\nB{B} H{H} S{S} D{D} fp16 {'causal' if causal else 'full'} (SDPA default "
                   f"{_us(rs[0]['sdpa_us'])}, FLASH {_us(rs[0]['sdpa_flash_us'])})\n")
        out.append("| step | µs | TFLOPS | × stage 4 | × previous step | registers | spill B | smem B |")
        out.append("|---|---|---|---|---|---|---|---|")
        prev = None
        for r in rs:
            if r["kind"] not in ("stage 4", "waterfall"):
                continue
            name = r["variant"] if r["kind"] == "stage 4" or prev is None else "+ " + r["variant"]
            step = "—" if prev is None or r["kind"] == "stage 4" else _x(prev["us"], r["us"])
            out.append(f"| {name} | {r['us']:,.1f} | {r['tflops']:.0f} | {_x(t4, r['us'])} | {step} | "
                       f"{r.get('registers', '—')} | {r.get('spill_bytes', '—')} | {r.get('smem_bytes', '—')} |")
            if r["kind"] == "waterfall":
                prev = r
        out.append("\n| stage 5 with one idea undone, or an alternative | µs | TFLOPS | × stage 4 | × stage 5 "
                   "| registers | spill B | smem B |")
        out.append("|---|---|---|---|---|---|---|---|")
        for r in rs:
            if r["kind"] in ("leave-one-out", "alternative"):
                out.append(f"| {r['variant']} | {r['us']:,.1f} | {r['tflops']:.0f} | {_x(t4, r['us'])} | "
                           f"{_x(full.get('us'), r['us'])} | {r['registers']} | {r['spill_bytes']} | {r['smem_bytes']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--record", action="store_true",
                    help='store the rows under "stage5_ideas" in results/<gpu>.json (not when a check fails)')
    ap.add_argument("--quick", action="store_true", help="full mask only, 0.3 s of timing per variant")
    a = ap.parse_args()
    if not HAS_GPU:
        ap.exit(2, f"{ap.prog}: times kernels, so it needs a CUDA GPU and none was found; "
                   "nothing measured or recorded\n")
    budget = 0.3 if a.quick else 1.0
    rows, ok = [], True
    for B, H, S, D in SHAPES:
        q, k, v = make_qkv(B, H, S, D, dtype=torch.float16)
        for causal in ((False,) if a.quick else (False, True)):
            flops = attention_flops(B, H, S, S, D, causal)
            t_sd, t_sf = (time_cuda(f, budget_s=budget).median_us if f else None
                          for f in (sdpa_call(q, k, v, causal=causal),
                                    sdpa_call(q, k, v, causal=causal, backend="flash")))
            print(f"B{B} H{H} S{S} D{D} fp16 {'causal' if causal else 'full'}: SDPA default {_us(t_sd)}, "
                  f"FLASH {_us(t_sf)}", flush=True)
            t4 = None
            for kind, name, ideas in variants():
                fn = runner(ideas)
                t0 = time.time()
                passed, why = checked(fn, D)  # before timing: a wrong kernel's time means nothing
                if not passed:
                    ok = False
                    print(f"  {kind:13s} {name:32s} FAIL, not timed: {why}", flush=True)
                    continue
                t = time_cuda(lambda: fn(q, k, v, causal=causal), budget_s=budget)
                passed, why = checked(fn, D)  # and after
                ok &= passed
                t4 = t.median_us if kind == "stage 4" else t4
                row = {"kind": kind, "variant": name, "ideas": ideas, "B": B, "H": H, "S": S, "D": D,
                       "dtype": "float16", "causal": causal, "us": t.median_us,
                       "tflops": flops / t.median_us / 1e6, "x_stage4": t4 / t.median_us if t4 else None,
                       "sdpa_us": t_sd, "sdpa_flash_us": t_sf, "passed": passed,
                       "default": kind == "waterfall" and name == s5.waterfall()[-1][0],
                       **resources(ideas, D)}
                rows.append(row)
                print(f"  {kind:13s} {name:32s} {t.median_us:10,.1f} µs {row['tflops']:6.1f} TFLOPS "
                      f"{'pass' if passed else 'FAIL after timing: ' + why} ({time.time() - t0:.1f} s)", flush=True)
        del q, k, v
    if a.record and not ok:
        print("not recorded: a variant failed its correctness check", file=sys.stderr)
    elif a.record:  # before the tables: nothing after the timing may cost the record
        env = R.capture_env()
        path = R.save_extra(env["gpu"], "stage5_ideas", {
            "env": env, "sha256": {"4": R.stage_sha256(s4.INFO), "5": R.stage_sha256(s5.INFO)},
            "baseline": s5.BASELINE, "ideas": s5.IDEAS, "alternatives": s5.ALTERNATIVES,
            "quick": a.quick, "rows": rows})
        print(f"recorded in {path}")
    print(tables(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
