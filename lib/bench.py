"""The main job: every registered stage this machine can run — correctness verdict and error
vs SDPA, then timing, TFLOPS and the ratios to SDPA's default and FLASH_ATTENTION backends —
printed as a markdown table, with a progress line per stage and shape on stderr.

    python -m lib.bench                 # all stages, standard shapes, print the table (~1 min)
    python -m lib.bench --record        # ... and write results/<gpu>.json, the plots, README
    python -m lib.bench --stages 0 --shapes latency
    python -m lib.bench --all           # no time-based skips (stage 0, long shape: ~5 s a call)
    python -m lib.bench --record --stages 6 --dtype float16 bfloat16   # fp16 and bf16 rows

Without a GPU only stage 0 runs (numba's simulator, tiny shapes); the CUDA C++ stages are
compiled offline; then it prints the recorded table, labelled as recorded.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import lib  # noqa: F401  (mode first)

# torch and the harness modules that need it are imported inside the functions, so that
# `--help` and usage errors answer at once.

# The shapes a record holds (lib.results defines them: the notebooks read records by them).
from lib.results import STANDARD_SHAPES, SWEEP_SEQS, SWEEP_TOKENS  # noqa: E402,F401
SIM_SHAPES = [(1, 2, 17, 17, 16), (1, 1, 33, 20, 8)]  # (B, H, Sq, Sk, D) for the simulator
CHECK_SHAPES = [(1, 2, 64, 64, 64), (1, 2, 67, 45, 64), (2, 1, 45, 67, 64)]  # a small, odd ones
# (B, H, H_kv, Sq, Sk, D), for stages with INFO.gqa; the second is a decoding call (stage 6: packed
# query heads and split keys, which compute-sanitizer then checks too)
GQA_CHECK_SHAPES = [(1, 4, 2, 67, 45, 64), (2, 8, 2, 3, 1000, 64)]
# (B, H, H_kv, Sq, Sk, D), bottom-right causal: a few queries against a cache, more queries than keys
BOTTOM_RIGHT_CHECK_SHAPES = [(2, 4, 2, 5, 130, 64), (1, 2, 2, 70, 33, 64)]
# packed sequences (lengths of q, of k, H, H_kv, D): an empty one, one without keys, odd lengths
VARLEN_CHECK = ([5, 0, 70, 3, 1], [40, 0, 70, 0, 200], 4, 2, 64)
HOST_TIMED_SHAPES = ("latency",)  # host time per call matters for small calls
HOST_CALLS = 300
# Seconds of timed runs per callable (the stage, SDPA's two backends) and row: a record takes
# its time; a plain run (the README's first command) aims at a minute for the whole table.
RECORD_BUDGET_S, RUN_BUDGET_S = 1.0, 0.4
DTYPES = ("float16", "bfloat16")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(mod, B, H, Sq, Sk, D, dtype, causal, *, suite, max_call_s, predicted_s=None,
            host_calls=0, budget_s=1.0):
    """One row of the table: check, time the stage and both SDPA backends, check again.
    With host_calls, also the host time per call of the stage and of SDPA's default.
    budget_s: the timed runs' budget per callable (lib.timing.time_interleaved); below 1 s (a
    plain run, not a record) the host timing also stops after about half a second of calls."""
    from lib.inputs import DTYPE_NAMES, make_qkv
    from lib.reference import attention_flops, check_attention
    from lib.timing import sdpa_call, time_host, time_interleaved

    row = {"stage": mod.INFO.number, "suite": suite, "B": B, "H": H, "Sq": Sq, "Sk": Sk, "D": D,
           "dtype": DTYPE_NAMES[dtype], "causal": causal}
    if predicted_s is not None and predicted_s > max_call_s:
        row["skipped"] = (f"predicted {predicted_s:.1f} s per call > {max_call_s:g} s "
                          "(from the stage's TFLOPS on a smaller shape; --all runs it)")
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
    kw = (dict(warmup=1, min_runs=3, budget_s=max(3 * (predicted_s or 0), budget_s)) if slow
          else dict(budget_s=budget_s))
    call = lambda: mod.attention(q, k, v, causal=causal)  # noqa: E731
    sd = sdpa_call(q, k, v, causal=causal)
    sf = sdpa_call(q, k, v, causal=causal, backend="flash")
    # the stage and both SDPA backends in turns (rounds), so that a slow spell of the GPU
    # moves all three a little instead of one of them a lot
    times = time_interleaved({"stage": call, "sdpa": sd, "flash": sf}, **kw)
    t, ts, tf = times["stage"], times.get("sdpa"), times.get("flash")
    if host_calls:
        gpu_calls = 100  # time_host's: its second pass, the GPU time of one call
        if budget_s < 1.0:  # a stage of milliseconds a call needs no 300 calls to show it
            host_calls = max(10, min(host_calls, int(0.5e6 / t.median_us)))
            # nor 100 in the second pass, each of which waits for the GPU to spin twice the
            # host time first (about 3x the call: 1.8 s of stage 0's 6 ms calls): about half a
            # second of them, as for the first pass
            gpu_calls = max(10, min(gpu_calls, int(0.5e6 / (3 * t.median_us))))
        h = time_host(call, calls=host_calls, gpu_calls=gpu_calls)
        hs = time_host(sd, calls=host_calls, gpu_calls=gpu_calls) if sd else None
        row.update(host_us=h.host_us, host_gpu_us=h.gpu_us, host_calls=host_calls,
                   sdpa_host_us=hs.host_us if hs else None,
                   sdpa_host_gpu_us=hs.gpu_us if hs else None)
    del q, k, v, call
    checks.append(check())  # again after the timing loop, on fresh inputs
    flops = attention_flops(B, H, Sq, Sk, D, causal)
    row.update(us=t.median_us, tflops=flops / t.median_us / 1e6, runs=t.runs,
               p20_us=t.p20_us, p80_us=t.p80_us, us_rounds=t.round_medians_us,
               sdpa_us_rounds=ts.round_medians_us if ts else None,
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


def plan(shapes, sweep: bool, dtypes=("float16",)):
    """(suite, shape name, B, H, S, D, causal, dtype name): the standard shapes in each dtype,
    then the sweep in the first dtype only (it is one series on the plots, and the longest part
    of a run); within a dtype in order of growing work, so predictions come from measurements
    on smaller shapes."""
    out = []
    for dtype in dtypes:
        for name, B, H, S, D in STANDARD_SHAPES:
            if name in shapes:
                out += [("standard", name, B, H, S, D, c, dtype) for c in (False, True)]
    if sweep and dtypes:
        for D in (64, 128):
            out += [("sweep", f"S{S}", SWEEP_TOKENS // S, 16, S, D, c, dtypes[0])
                    for S in SWEEP_SEQS for c in (False, True)]
    return out


def progress_line(row) -> str:
    """'[stage 3] B16 H16 S2048 D64 float16 causal: 1,957.0 µs (70.2 TFLOPS), 0.18x SDPA, pass'"""
    from lib.results import ratio, shape_text
    head = f"[stage {row['stage']}] {shape_text(row)} {row['dtype']} " \
           f"{'causal' if row['causal'] else 'full'}"
    if row.get("skipped"):
        return f"{head}: skipped, {row['skipped']}"
    vs = ratio(row.get("sdpa_us"), row["us"])
    host = (f", host {row['host_us']:,.1f} µs/call (SDPA {row['sdpa_host_us'] or math.nan:,.1f})"
            if row.get("host_us") is not None else "")
    return (f"{head}: {row['us']:,.1f} µs ({row['tflops']:.3g} TFLOPS), "
            f"{'—' if vs is None else format(vs, '.2g')}x SDPA{host}, "
            f"{'pass' if row['passed'] else 'FAIL'}")


def stage_rows(mod, shapes, sweep, dtypes, cc) -> tuple[list[str], list[tuple]]:
    """What run_gpu runs of one stage on a GPU of compute capability `cc`: (why it runs none,
    or lacks a dtype: a line each; its rows, plan's entries at its head dims and dtypes)."""
    import torch
    info = mod.INFO
    if cc < tuple(info.min_cc):
        return [f"stage {info.number} needs compute capability "
                f"{info.min_cc[0]}.{info.min_cc[1]}, this GPU has {cc[0]}.{cc[1]}"], []
    lacking = [d for d in dtypes if getattr(torch, d) not in info.dtypes]
    return ([f"stage {info.number} has no {d} kernel" for d in lacking],
            [p for p in plan(shapes, sweep, dtypes) if p[5] in info.head_dims and p[7] not in lacking])


def run_gpu(mods, shapes, sweep, dtypes, max_call_s, sweep_max_call_s, budget_s=1.0):
    """Rows of every stage at every planned shape and dtype (names, e.g. ["float16"]); stages
    this GPU cannot run, and dtypes a stage has no kernel for, are named in the second list."""
    import torch

    from lib.reference import attention_flops
    runs, not_run = [], []
    cc = torch.cuda.get_device_capability()
    for mod in mods:
        info = mod.INFO
        why, rows = stage_rows(mod, shapes, sweep, dtypes, cc)
        for line in why:
            not_run.append(line)
            log(f"[stage {info.number}] skipped: {line}")
        # the stage's best measured FLOP/s so far per dtype, for predicting the next shape
        # (per dtype, so that a shape is skipped or not in each dtype as in a run of that alone)
        rate = {}
        for suite, name, B, H, S, D, causal, dtype in rows:
            predicted = attention_flops(B, H, S, S, D, causal) / rate[dtype] if dtype in rate \
                else None
            t0 = time.time()
            row = measure(mod, B, H, S, S, D, getattr(torch, dtype), causal, suite=suite,
                          max_call_s=max_call_s if suite == "standard" else sweep_max_call_s,
                          predicted_s=predicted,
                          host_calls=HOST_CALLS if name in HOST_TIMED_SHAPES else 0,
                          budget_s=budget_s)
            if not row.get("skipped"):  # the best, as small shapes underfill the GPU
                rate[dtype] = max(rate.get(dtype, 0.0), row["tflops"] * 1e12)
            log(progress_line(row) + ("" if row.get("skipped") else f" ({time.time() - t0:.1f} s)"))
            runs.append(row)
    return runs, not_run


# --------------------------------------------------------------------------------------------
# Compiling ahead. A machine whose kernel cache is empty compiled each CUDA C++ build in the
# row that first needed it, one after another (17 s of the main job's 71 on a fresh H200
# machine, experiments/main_job_time). Before the first row, every build the rows will need is
# compiled at once, one thread per core (nvrtc.compile_many: NVRTC runs without Python's lock),
# and numba compiles stage 0's kernel meanwhile.

# What a stage's attention() compiles (lib.nvrtc.Build) for a call on contiguous q [B, H, Sq, D]
# and k, v [B, Hk, Sk, D] in `dtype` with mask `causal`, on a GPU of `arch` with `sms` SMs: each
# entry follows its stage's launcher and asks the stage's own rules (its config, tiles and
# choose), so a change of tiles or schedules moves the list with it. (Here rather than in the
# stage modules: their code is hashed into the recorded results, which a helper would make
# stale.) tests/test_compile_ahead.py holds the entries to the stages' offline builds
# (compile_for) and, on a GPU, to what their calls really compile.
def _unfused_builds(mod, B, H, Hk, Sq, Sk, D, dtype, causal, *, arch, sms):
    """stage 1: nvrtc.stage_kernels(SOURCE, KERNELS, dtype, D), no defines."""
    from lib import nvrtc
    return [nvrtc.Build(mod.SOURCE, arch, dtype, D)]


def _fused_builds(mod, B, H, Hk, Sq, Sk, D, dtype, causal, *, arch, sms):
    """stages 2-5: nvrtc.launch_fused with the stage's config(D) defines (none where it has no
    config), contiguous rows (PACKED_ROWS)."""
    from lib import nvrtc
    own = mod.config(D)["defines"] if hasattr(mod, "config") else ()
    return [nvrtc.Build(mod.SOURCE, arch, dtype, D, nvrtc.fused_defines(own, packed=True))]


def _stage6_builds(mod, B, H, Hk, Sq, Sk, D, dtype, causal, *, arch, sms):
    """stage 6: _make_plan's kernel mode, choose() and config() with attention()'s defaults, for
    stage6.ARCH whatever the GPU's arch; a call without work compiles nothing."""
    from lib import nvrtc
    from lib.inputs import NO_MASK, causal_mode
    mode = causal_mode(causal, Sq, Sk, mod.INFO)
    if Sq <= 1 and mode == 2:  # one query bottom-right sees every key
        mode = NO_MASK
    if B * H * Sq == 0 or Sk == 0:
        return []
    ch = mod.choose(B, H, Hk, Sq, Sk, D, mode, sms)
    cfg = mod.config(D, ch["tiles"], ch["schedule"], False, None, None, ch["pack_gqa"], False,
                     ch["q_stages"], None, None, None, ch["blocks_per_sm"], None)
    return [nvrtc.Build(mod.SOURCE, mod.ARCH, dtype, D, tuple(cfg["defines"]))]


CALL_BUILDS = {1: _unfused_builds, 2: _fused_builds, 3: _fused_builds, 4: _fused_builds,
               5: _fused_builds, 6: _stage6_builds}


def ahead_builds(mods, shapes, sweep, dtypes, cc, arch: str, sms: int) -> list:
    """Every CUDA C++ build the rows of run_gpu compile, once each, in the order first needed:
    CALL_BUILDS of each stage at each of its rows (stage_rows). A stage without an entry, or a
    row whose builds cannot be worked out, is left to compile its own, as before."""
    import torch
    out = []
    for mod in mods:
        builds = CALL_BUILDS.get(mod.INFO.number)
        if mod.INFO.backend == "numba" or builds is None:
            continue
        for suite, name, B, H, S, D, causal, dtype in stage_rows(mod, shapes, sweep, dtypes, cc)[1]:
            try:
                out += builds(mod, B, H, H, S, S, D, getattr(torch, dtype), causal, arch=arch, sms=sms)
            except Exception:  # noqa: BLE001 (the row runs the stage, which says what is wrong)
                pass
    return list(dict.fromkeys(out))


def first_calls(mods, shapes, sweep, dtypes, cc) -> list:
    """A first call of each numba stage in each dtype its rows run, on a small shape (fresh
    inputs, result unused): numba compiles a kernel at its first call for the argument types
    (dtype and array layout, not the sizes; stage 0 turns bfloat16 into float32), about 2 s on
    the H200 machine, which the stage's first row then no longer waits for."""
    import torch

    from lib.inputs import make_qkv
    calls = []
    for mod in mods:
        if mod.INFO.backend != "numba":
            continue
        first = {}
        for suite, name, B, H, S, D, causal, dtype in stage_rows(mod, shapes, sweep, dtypes, cc)[1]:
            first.setdefault(dtype, D)
        for dtype, D in first.items():
            calls.append(lambda mod=mod, D=D, dt=getattr(torch, dtype):
                         mod.attention(*make_qkv(1, 2, 64, D, dtype=dt)))
    return calls


def compile_ahead(mods, shapes, sweep, dtypes) -> None:
    """Compile every build the rows will need (ahead_builds) that the kernel cache lacks, one
    thread per core, and meanwhile make the numba stages' first calls (first_calls): one line
    on stderr says how many and how long. Nothing at all when every build is cached. A build
    that fails here is left to its row, which compiles it again and reports what is wrong."""
    import torch

    from lib import nvrtc
    cc = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    todo = [b for b in ahead_builds(mods, shapes, sweep, dtypes, cc, nvrtc.gpu_arch(), sms)
            if not b.cached()]
    if not todo:
        return
    workers = min(nvrtc.usable_cores(), len(todo))
    calls = first_calls(mods, shapes, sweep, dtypes, cc)
    numba = [m.INFO.number for m in mods if m.INFO.backend == "numba"]
    print(f"compiling {len(todo)} kernel build{'s' if len(todo) > 1 else ''} the rows need "
          f"(not in the kernel cache {nvrtc.cache_dir()}) on {workers} "
          f"core{'s' if workers > 1 else ''}"
          + (f", and stage {_numbers(numba)}'s numba kernel" if calls else "") + " ...",
          end="", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    done, failed = nvrtc.compile_many(todo, workers, alongside=calls)
    print(f" {time.perf_counter() - t0:.1f} s"
          + (f"; {len(failed)} failed, left for their rows to compile and report: "
             + ", ".join(str(b) for b, _ in failed) if failed else ""), file=sys.stderr, flush=True)


def check_all(mods, shapes, dtypes=None) -> tuple[int, int]:
    """Correctness only (no timing): every stage that can run here, on each shape, causal and
    not, each dtype. The simulator path without a GPU; what compute-sanitizer runs on one.
    Returns (checks passed, checks failed)."""
    from lib.inputs import DTYPE_NAMES
    from lib.reference import check_attention, check_varlen
    from lib.simulator import HAS_GPU
    passed = failed = 0
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
                    passed, failed = passed + c.passed, failed + (not c.passed)
                    heads = f"H{H}" if Hkv == H else f"H{H}/{Hkv}"
                    print(f"stage {info.number} ({'GPU' if HAS_GPU else 'simulator'}) "
                          f"B{B} {heads} S{Sq}/{Sk} D{D} {DTYPE_NAMES[dtype]} "
                          f"{'causal' if causal else 'full'}: {c.summary()}", flush=True)
        if HAS_GPU and "bottom_right" in info.causal_alignments:
            for B, H, Hkv, Sq, Sk, D in BOTTOM_RIGHT_CHECK_SHAPES:
                for dtype in dtypes or info.dtypes:
                    c = check_attention(mod.attention, B, H, Sq, Sk, D, dtype=dtype,
                                        causal="bottom_right", Hkv=Hkv)
                    passed, failed = passed + c.passed, failed + (not c.passed)
                    print(f"stage {info.number} (GPU) B{B} H{H}/{Hkv} S{Sq}/{Sk} D{D} "
                          f"{DTYPE_NAMES[dtype]} bottom-right: {c.summary()}", flush=True)
        if HAS_GPU and info.varlen:
            for causal in (False, "bottom_right"):
                for dtype in dtypes or info.dtypes:
                    c = check_varlen(mod.attention_varlen, *VARLEN_CHECK, dtype=dtype, causal=causal)
                    passed, failed = passed + c.passed, failed + (not c.passed)
                    print(f"stage {info.number} (GPU) varlen q {VARLEN_CHECK[0]} k {VARLEN_CHECK[1]} "
                          f"{DTYPE_NAMES[dtype]} {causal or 'full'}: {c.summary()}", flush=True)
    return passed, failed


def run_cpu(mods) -> tuple[int, int, list[int]]:
    """No GPU: the simulator for numba stages, the offline compile for CUDA C++ stages.
    Returns (checks passed, failed, stages compiled offline)."""
    from lib.sass import inspect_stage
    passed, failed = check_all(mods, SIM_SHAPES)
    compiled = []
    for mod in mods:
        if mod.INFO.backend != "numba":
            for name, ins in inspect_stage(mod.INFO.number).items():
                print(f"stage {mod.INFO.number} (offline compile) {name}:\n{ins.table(top=6)}")
            compiled.append(mod.INFO.number)
    return passed, failed, compiled


def _numbers(ns) -> str:
    return ", ".join(map(str, ns)) if ns else "none"


def recorded_rows(data, stage_numbers, shapes, dtypes) -> list[dict]:
    """The recorded standard rows the command line asked for (dtypes: names)."""
    from lib.results import standard_runs
    dims = {(B, H, S, D) for name, B, H, S, D in STANDARD_SHAPES if name in shapes}
    return [r for r in standard_runs(data) if r["stage"] in stage_numbers
            and (r["B"], r["H"], r["Sq"], r["D"]) in dims and r["dtype"] in dtypes]


def main_cpu(a, ap, mods, t0) -> int:
    """No GPU: simulator checks, offline compile, then the recorded table (filtered like a
    GPU run would be)."""
    from lib import results as R
    if a.record:
        ap.exit(2, f"{ap.prog}: --record needs a GPU (it writes measured figures into "
                   "results/ and the README): nothing recorded\n")
    changed = lambda opt: getattr(a, opt) != ap.get_default(opt)  # noqa: E731
    ignored = [opt for opt, given in (("--sweep", a.sweep), ("--all", a.all),
                                      ("--max-call-s", changed("max_call_s")),
                                      ("--sweep-max-call-s", changed("sweep_max_call_s")))
               if given]
    if ignored:
        log(f"note: {', '.join(ignored)} only change{'s' if len(ignored) == 1 else ''} what is "
            "timed on a GPU; nothing is timed without one, so "
            f"{'it is' if len(ignored) == 1 else 'they are'} ignored here")
    passed, failed, compiled = run_cpu(mods)
    data = R.load()
    numbers = [m.INFO.number for m in mods]
    if data:
        rows = recorded_rows(data, numbers, a.shapes, a.dtype)
        print("\n## Recorded results (not measured here)\n")
        if rows:
            print(R.results_block(data, rows))
        else:
            print(f"No recorded rows for stages {_numbers(numbers)} at {', '.join(a.shapes)} "
                  f"in {', '.join(a.dtype)} in `{data['_path']}`.")
        table = f"{len(rows)} recorded rows printed from {data['_path']} (not measured here)"
    else:
        table = ("no recorded results in results/ yet: run `python -m lib.bench --record` "
                 "on a GPU")
        print("\n" + table[0].upper() + table[1:] + ".")
    simulated = [m.INFO.number for m in mods if m.INFO.backend == "numba"]
    done = ([f"simulator checks {passed} passed, {failed} failed (stages {_numbers(simulated)})"]
            if simulated else []) + ([f"compiled offline: stages {_numbers(compiled)}"]
                                     if compiled else [])
    print(f"\nsummary (CPU mode): {'; '.join(done + [table])}; {time.time() - t0:.0f} s",
          flush=True)
    return 0 if failed == 0 else 1


def record_ceilings(recorded: dict, env: dict, again: bool) -> dict:
    """The ceilings a record keeps: those already recorded for this GPU model, unless `again`
    (--ceilings) or none are. They are the GPU's, not a stage's, and every notebook divides by
    them: measured again with each stage's re-record, they moved by a few percent (the bf16
    matmul rate 682 and then 713 TFLOPS on one H200 model, 2026-11-29) and left the notebooks
    executed before with other figures than the prose rendered from the record."""
    if recorded and not again:
        log(f"keeping the recorded ceilings ({recorded.get('measured_at', 'measured before this field')}; "
            "--ceilings measures them again)")
        return recorded
    from lib.microbench import measure_ceilings
    log("measuring the GPU's ceilings (copy bandwidth, matmul rate)...")
    return {**measure_ceilings(), "measured_at": f"commit {env.get('commit', '?')}, {env.get('date', '?')}"}


def main_gpu(a, mods, t0) -> int:
    import torch

    from lib import results as R
    max_call_s = math.inf if a.all else a.max_call_s
    sweep_max_call_s = math.inf if a.all else a.sweep_max_call_s
    budget_s = a.timing_budget_s or (RECORD_BUDGET_S if a.record else RUN_BUDGET_S)
    compile_ahead(mods, a.shapes, a.sweep, a.dtype)
    runs, not_run = run_gpu(mods, a.shapes, a.sweep, a.dtype, max_call_s, sweep_max_call_s, budget_s)
    std = R.fp16_first([r for r in runs if r["suite"] == "standard"])
    # % of matmul peak needs the GPU's matmul rate: the one recorded for this GPU model, if any
    recorded = R.results_path(torch.cuda.get_device_name(0))
    ceilings = (R.load(recorded).get("ceilings") or {}) if recorded.exists() else {}
    peak = ceilings.get("matmul_TFLOPS")
    print("\n" + R.ratio_legend("this run's rows", std) + (
        f" % of matmul peak: over the matmul rate recorded for this GPU model in "
        f"{recorded.relative_to(R.ROOT)} ({peak:.0f} TFLOPS)." if peak else ""))
    print("\n" + R.markdown_table(std, peak))
    notes = R.table_notes(std, R.sdpa_medians(std))
    host = R.host_table(std)
    print("".join(f"\n{n}" for n in notes) + (f"\n\n{host}" if host else ""))
    timed = [r for r in runs if not r.get("skipped")]
    skipped = [r for r in runs if r.get("skipped")]
    failed = [r for r in timed if not r["passed"]]
    if not a.record:
        where = "printed only (--record writes results/<gpu>.json, the plots and the README table)"
    elif failed:
        where = f"NOT recorded: {len(failed)} row(s) failed the correctness check"
    elif not timed:
        where = "NOT recorded: nothing was timed"
    else:
        from lib.plots import plot_stages, plot_sweep
        env = R.capture_env()
        ceilings = record_ceilings(ceilings, env, a.ceilings)
        recorded = sorted({r["stage"] for r in runs})
        path = R.save(env, [m.INFO for m in mods if m.INFO.number in recorded], runs,
                      extra={"ceilings": ceilings})
        data = R.load(path)
        slug = R.gpu_slug(env["gpu"])
        plot = plot_stages(data, R.RESULTS_DIR / f"{slug}.png")
        if any(r.get("suite") == "sweep" for r in data["runs"]):
            plot_sweep(data, R.RESULTS_DIR / f"{slug}-sweep.png")
        R.update_readme(R.readme_block(data, str(plot.relative_to(R.ROOT))))
        R.update_readme(R.docs_block(data, str(plot.relative_to(R.ROOT))), R.DOCS_RESULTS)
        where = (f"recorded {len(runs)} rows in {path.relative_to(R.ROOT)}, plots and the "
                 "README table regenerated")
    stages_timed = sorted({r["stage"] for r in timed})
    print(f"\nsummary (GPU mode): {len(timed)} rows timed, stages {_numbers(stages_timed)}; "
          f"{len(skipped)} skipped; checks {len(timed) - len(failed)} passed, {len(failed)} "
          f"failed{'; not run: ' + '; '.join(not_run) if not_run else ''}; {where}; "
          f"{time.time() - t0:.0f} s", flush=True)
    return 1 if failed else 0


# The stages past the 16-bit forward kernel (stages.BEYOND) are timed by their own scripts.
OWN_BENCHMARKS = {7: "scripts/fp8_bench.py", 8: "scripts/backward_bench.py"}
_OWN_WHAT = {7: "the FP8 forward, with its own error rule",
             8: "the backward pass, timed against SDPA's backward"}


def own_benchmark_message(numbers) -> str:
    """What `--stages 7` or `8` answers: lib.bench's table is the 16-bit forward's."""
    import stages
    lines = [f"python -m lib.bench: stage {n} ({_OWN_WHAT[n]}) is not in the main job's table; "
             f"its benchmark is: python {OWN_BENCHMARKS[n]}" for n in numbers]
    return "\n".join(lines + ["lib.bench checks and times the forward stages "
                               f"{', '.join(map(str, stages.NUMBERS))}."])


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown after each option; the description's examples kept as written."""


def parser() -> argparse.ArgumentParser:
    import stages  # cheap: the registry imports no stage module until one is asked for
    shape_names = [s[0] for s in STANDARD_SHAPES]
    ap = argparse.ArgumentParser(prog="python -m lib.bench", description=__doc__,
                                 formatter_class=_HelpFormatter)
    # stages.BEYOND's numbers are accepted here only to be pointed to their own benchmarks (main)
    ap.add_argument("--stages", type=int, nargs="+", default=list(stages.NUMBERS),
                    choices=list(stages.NUMBERS + stages.BEYOND), metavar="N",
                    help=f"stage numbers, from {list(stages.NUMBERS)} (stages 7 and 8 have "
                         "their own benchmarks: " + ", ".join(OWN_BENCHMARKS.values()) + ")")
    ap.add_argument("--shapes", nargs="+", default=shape_names, choices=shape_names,
                    metavar="NAME", help="standard shapes, from " + ", ".join(
                        f"{n} (B{B} H{H} S{S} D{D})" for n, B, H, S, D in STANDARD_SHAPES))
    ap.add_argument("--sweep", action="store_true",
                    help=f"GPU: also sweep S over {SWEEP_SEQS} at B·S={SWEEP_TOKENS}, H16, D64 "
                         "and D128")
    ap.add_argument("--all", action="store_true",
                    help="GPU: no time-based skips (--max-call-s and --sweep-max-call-s off)")
    ap.add_argument("--dtype", nargs="+", default=["float16"], choices=DTYPES, metavar="DTYPE",
                    help=f"the dtypes timed, from {', '.join(DTYPES)}: every standard shape in "
                         "each; the sweep in the first one only")
    ap.add_argument("--max-call-s", type=float, default=1.0,
                    help="GPU: skip a standard shape whose predicted time per call exceeds this "
                         "(the skip and its reason go in the table)")
    ap.add_argument("--sweep-max-call-s", type=float, default=1.5,
                    help="GPU: the same limit for the sweep's shapes")
    ap.add_argument("--timing-budget-s", type=float, default=None, metavar="S",
                    help=f"GPU: seconds of timed runs per callable and row (default {RUN_BUDGET_S:g}; "
                         f"{RECORD_BUDGET_S:g} with --record, whose rows the README and notebooks show)")
    ap.add_argument("--ceilings", action="store_true",
                    help="with --record: measure the GPU's ceilings again (copy bandwidth, matmul and "
                         "FP32 rates), which the notebooks' predictions and the tables' %% of peak "
                         "divide by; without it the ones recorded for this GPU model are kept")
    ap.add_argument("--check", action="store_true",
                    help="correctness only, at a small and odd shapes (for compute-sanitizer)")
    ap.add_argument("--record", action="store_true",
                    help="GPU: measure every standard shape and the sweep, and write "
                         "results/<gpu>.json, the plots and the README table (not when a check "
                         "fails); the stages not run keep their recorded rows, the stages run "
                         "keep only this run's (so list every dtype they should have, float16 "
                         "first)")
    return ap


def main(argv=None) -> int:
    t0 = time.time()
    ap = parser()
    a = ap.parse_args(argv)
    beyond = sorted({n for n in a.stages if n in OWN_BENCHMARKS})
    if beyond:
        print(own_benchmark_message(beyond), file=sys.stderr, flush=True)
        return 2
    if a.record and set(a.shapes) != {s[0] for s in STANDARD_SHAPES}:
        ap.error("--record replaces every recorded row of the stages it runs, so it measures "
                 "every standard shape: leave out --shapes (or drop --record)")
    a.sweep |= a.record  # likewise the sweep: recording without it would drop the recorded one
    a.dtype = list(dict.fromkeys(a.dtype))  # each once, in the order given
    if a.record and a.dtype[0] != "float16":
        ap.error("--record replaces every recorded row of the stages it runs, and the plots, "
                 "notebooks and the sweep read float16: list float16 first in --dtype")
    a.stages = sorted(set(a.stages))
    a.shapes = [s[0] for s in STANDARD_SHAPES if s[0] in a.shapes]  # in order of growing work

    import stages
    from lib.simulator import HAS_GPU, banner
    mods = [stages.get(n) for n in a.stages]
    print(banner(), flush=True)
    if a.check:
        import torch
        passed, failed = check_all(mods, CHECK_SHAPES if HAS_GPU else SIM_SHAPES,
                                   [getattr(torch, d) for d in a.dtype])
        print(f"\nsummary: {passed} checks passed, {failed} failed", flush=True)
        return 0 if failed == 0 else 1
    return main_gpu(a, mods, t0) if HAS_GPU else main_cpu(a, ap, mods, t0)


if __name__ == "__main__":
    sys.exit(main())
