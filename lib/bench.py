"""The main job: every registered stage this machine can run — correctness verdict and error
vs SDPA, then timing, TFLOPS and the ratios to SDPA's default and FLASH_ATTENTION backends —
printed as a markdown table.

    python -m lib.bench                 # all stages, standard shapes, print the table
    python -m lib.bench --record        # ... and write results/<gpu>.json, the plots, README
    python -m lib.bench --stages 0 --shapes latency

Without a GPU it runs the simulator (numba stages, tiny shapes) and the offline compile
(CUDA C++ stages), then prints the recorded table, labelled as recorded.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import torch

import lib  # noqa: F401  (mode first)
from lib import results as R
from lib.inputs import DTYPE_NAMES, make_qkv
from lib.reference import attention_flops, check_attention
from lib.simulator import HAS_GPU, banner

# (name, B, H, S, D): the seeds' latency and throughput shapes and a long-sequence shape.
STANDARD_SHAPES = [("latency", 1, 8, 512, 64), ("throughput", 16, 16, 2048, 64),
                   ("long", 4, 16, 8192, 128)]
SWEEP_TOKENS = 16384  # sweeps over S keep B·S fixed
SWEEP_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
SIM_SHAPES = [(1, 2, 17, 17, 16), (1, 1, 33, 20, 8)]  # (B, H, Sq, Sk, D) for the simulator
CHECK_SHAPES = [(1, 2, 64, 64, 64), (1, 2, 67, 45, 64), (2, 1, 45, 67, 64)]  # a small, odd ones
GQA_CHECK_SHAPES = [(1, 4, 2, 67, 45, 64)]  # (B, H, H_kv, Sq, Sk, D), for stages with INFO.gqa


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(mod, B, H, Sq, Sk, D, dtype, causal, *, suite, max_call_s, predicted_s=None):
    """One row of the table: check, time the stage and both SDPA backends, check again."""
    from lib.timing import sdpa_call, time_cuda

    row = {"stage": mod.INFO.number, "suite": suite, "B": B, "H": H, "Sq": Sq, "Sk": Sk, "D": D,
           "dtype": DTYPE_NAMES[dtype], "causal": causal}
    if predicted_s is not None and predicted_s > max_call_s:
        row["skipped"] = (f"predicted {predicted_s:.1f} s per call > {max_call_s:g} s "
                          "(from the stage's TFLOPS on the last shape)")
        return row
    check = lambda: check_attention(mod.attention, B, H, Sq, Sk, D,  # noqa: E731
                                    dtype=dtype, causal=causal)
    try:
        checks = [check()]
    except MemoryError as e:  # a stage that materialises S×S may not fit: say so, go on
        row["skipped"] = str(e)
        return row
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, dtype=dtype)
    slow = predicted_s is not None and predicted_s > 0.2
    kw = dict(warmup=1, min_runs=3, budget_s=max(3 * (predicted_s or 0), 1.0)) if slow else {}
    t = time_cuda(lambda: mod.attention(q, k, v, causal=causal), **kw)
    sd = sdpa_call(q, k, v, causal=causal)
    sf = sdpa_call(q, k, v, causal=causal, backend="flash")
    ts = time_cuda(sd) if sd else None
    tf = time_cuda(sf) if sf else None
    del q, k, v
    checks.append(check())  # again after the timing loop, on fresh inputs
    flops = attention_flops(B, H, Sq, Sk, D, causal)
    row.update(us=t.median_us, tflops=flops / t.median_us / 1e6, runs=t.runs,
               p20_us=t.p20_us, p80_us=t.p80_us,
               sdpa_us=ts.median_us if ts else None,
               sdpa_flash_us=tf.median_us if tf else None,
               sdpa_tflops=flops / ts.median_us / 1e6 if ts else None,
               sdpa_flash_tflops=flops / tf.median_us / 1e6 if tf else None,
               max_abs_err=max(c.max_abs_err for c in checks),
               mean_abs_err=max(c.mean_abs_err for c in checks),
               max_abs_diff_sdpa=max(c.max_abs_diff_sdpa for c in checks),
               mean_abs_diff_sdpa=max(c.mean_abs_diff_sdpa for c in checks),
               sdpa_max_abs_err=max(c.sdpa_max_abs_err for c in checks),
               passed=all(c.passed for c in checks))
    return row


def plan(suites, dtype):
    """(suite, B, H, Sq, D, causal) in order of growing work, so predictions come from
    measurements on smaller shapes."""
    out = []
    if "standard" in suites:
        for name, B, H, S, D in STANDARD_SHAPES:
            if name in suites["standard"]:
                out += [("standard", B, H, S, D, c) for c in (False, True)]
    if "sweep" in suites:
        for D in (64, 128):
            out += [("sweep", SWEEP_TOKENS // S, 16, S, D, c) for S in SWEEP_SEQS
                    for c in (False, True)]
    return out


def run_gpu(mods, suites, dtype, max_call_s, sweep_max_call_s):
    runs = []
    for mod in mods:
        info = mod.INFO
        cc = torch.cuda.get_device_capability()
        if cc < info.min_cc:
            log(f"stage {info.number}: skipped, needs compute capability "
                f"{info.min_cc[0]}.{info.min_cc[1]}, this GPU has {cc[0]}.{cc[1]}")
            continue
        if dtype not in info.dtypes:
            log(f"stage {info.number}: skipped, no {DTYPE_NAMES[dtype]} support")
            continue
        rate = None  # the stage's last measured FLOP/s, for predicting the next shape
        items = plan(suites, dtype)
        for i, (suite, B, H, S, D, causal) in enumerate(items, 1):
            if D not in info.head_dims:
                continue
            flops = attention_flops(B, H, S, S, D, causal)
            predicted = flops / rate if rate else None
            tag = f"[stage {info.number} {i}/{len(items)}] {suite} B{B} H{H} S{S} D{D} " \
                  f"{'causal' if causal else 'full'}"
            t0 = time.time()
            row = measure(mod, B, H, S, S, D, dtype, causal, suite=suite,
                          max_call_s=max_call_s if suite == "standard" else sweep_max_call_s,
                          predicted_s=predicted)
            if row.get("skipped"):
                log(f"{tag}: skipped, {row['skipped']}")
            else:
                rate = max(rate or 0.0, row["tflops"] * 1e12)  # small shapes underfill the GPU
                log(f"{tag}: {row['us']:,.1f} µs, {row['tflops']:.3g} TFLOPS, "
                    f"SDPA {row['sdpa_us'] or math.nan:,.1f} µs, "
                    f"{'pass' if row['passed'] else 'FAIL'} ({time.time() - t0:.1f} s)")
            runs.append(row)
    return runs


def check_all(mods, shapes, dtypes=None) -> bool:
    """Correctness only (no timing): every stage that can run here, on each shape, causal and
    not, each dtype. The simulator path without a GPU; what compute-sanitizer runs on one."""
    ok = True
    for mod in mods:
        info = mod.INFO
        if not HAS_GPU and info.backend != "numba":
            continue
        gqa = GQA_CHECK_SHAPES if info.gqa and shapes is CHECK_SHAPES else []
        for B, H, Hkv, Sq, Sk, D in [(B, H, H, Sq, Sk, D) for B, H, Sq, Sk, D in shapes] + gqa:
            if D not in info.head_dims:
                continue
            for causal in (False, True):
                for dtype in dtypes or info.dtypes:
                    c = check_attention(mod.attention, B, H, Sq, Sk, D, dtype=dtype,
                                        causal=causal, Hkv=Hkv)
                    ok &= c.passed
                    heads = f"H{H}" if Hkv == H else f"H{H}/{Hkv}"
                    print(f"stage {info.number} ({'GPU' if HAS_GPU else 'simulator'}) "
                          f"B{B} {heads} S{Sq}/{Sk} D{D} {DTYPE_NAMES[dtype]} "
                          f"{'causal' if causal else 'full'}: {c.summary()}", flush=True)
    return ok


def run_cpu(mods):
    """No GPU: the simulator for numba stages, the offline compile for CUDA C++ stages."""
    from lib.sass import inspect_stage
    ok = check_all(mods, SIM_SHAPES)
    for mod in mods:
        if mod.INFO.backend != "numba":
            for name, ins in inspect_stage(mod.INFO.number).items():
                print(f"stage {mod.INFO.number} (offline compile) {name}:\n{ins.table(top=6)}")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--stages", type=int, nargs="*", help="stage numbers (default: all)")
    ap.add_argument("--shapes", nargs="*", default=[s[0] for s in STANDARD_SHAPES],
                    choices=[s[0] for s in STANDARD_SHAPES], help="standard shapes to run")
    ap.add_argument("--sweep", action="store_true",
                    help=f"also sweep S over {SWEEP_SEQS} at B·S={SWEEP_TOKENS}, H16, D64 and D128")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--max-call-s", type=float, default=10.0,
                    help="skip a shape whose predicted time per call exceeds this")
    ap.add_argument("--sweep-max-call-s", type=float, default=1.5,
                    help="the same limit for the sweep's shapes")
    ap.add_argument("--check", action="store_true",
                    help="correctness only, at a small and odd shapes (for compute-sanitizer)")
    ap.add_argument("--record", action="store_true",
                    help="write results/<gpu>.json, the plots and the README table")
    a = ap.parse_args(argv)

    import stages
    numbers = stages.NUMBERS if a.stages is None else a.stages
    mods = [stages.get(n) for n in numbers]
    print(banner(), flush=True)
    if a.check:
        return 0 if check_all(mods, CHECK_SHAPES if HAS_GPU else SIM_SHAPES,
                              [getattr(torch, a.dtype)]) else 1
    if not HAS_GPU:
        if a.record:
            log("--record needs a GPU: nothing recorded")
            return 2
        ok = run_cpu(mods)
        data = R.load()
        if data:
            print(f"\n## Recorded results (not measured here)\n\n{R.provenance(data)}\n")
            print(R.markdown_table(R.standard_runs(data)))
        else:
            print("\nNo recorded results in results/ yet: run `python -m lib.bench --record` on a GPU.")
        return 0 if ok else 1

    from lib.plots import plot_stages, plot_sweep
    from lib.timing import measure_ceilings
    suites = {"standard": set(a.shapes)}
    if a.sweep:
        suites["sweep"] = True
    dtype = getattr(torch, a.dtype)
    runs = run_gpu(mods, suites, dtype, a.max_call_s, a.sweep_max_call_s)
    std = [r for r in runs if r["suite"] == "standard"]
    print("\n" + R.markdown_table(std))
    failed = [r for r in runs if not r.get("skipped") and not r["passed"]]
    if a.record:
        env = R.capture_env()
        log("measuring the GPU's ceilings (copy bandwidth, matmul rate)...")
        ceilings = measure_ceilings()
        path = R.save(env, [m.INFO for m in mods], runs, extra={"ceilings": ceilings})
        data = R.load(path)
        slug = R.gpu_slug(env["gpu"])
        plot = plot_stages(data, R.RESULTS_DIR / f"{slug}.png")
        if any(r.get("suite") == "sweep" for r in data["runs"]):
            plot_sweep(data, R.RESULTS_DIR / f"{slug}-sweep.png")
        R.update_readme(R.readme_block(data, str(plot.relative_to(R.ROOT))))
        print(f"\nrecorded {len(runs)} rows in {path.relative_to(R.ROOT)}; README table regenerated")
    if failed:
        log(f"{len(failed)} row(s) FAILED the correctness check")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
