"""The stage 3 and stage 4 notebooks' evidence: their fp16 and bf16 SASS side by side, the
profile's warp stalls, the softmax's control flow, and the instructions one warp issues per K/V
tile, counted from the SASS (lib.notebook re-exports these)."""
from __future__ import annotations

import re

import torch

from lib.inputs import DTYPE_NAMES
from lib.notebook_common import ROOT, _md, _metric_pattern, ncu_report, tile_sweep
from lib.reference import check_attention
from lib.sass import innermost_loops


# Evidence for the stage 3 and stage 4 notebooks (issue 12): the bf16 / fp16 SASS comparison
# and the stage 3 → 4 hypotheses, computed offline from the SASS and the recorded ncu reports.

def fp16_bf16_sass(stage: int, D: int, arch: str = "sm_90a", bf16_defines: dict | None = None
                   ) -> dict:
    """Stage `stage`'s kernel compiled offline in fp16 and in bf16 at head dim D: per dtype
    {'registers', 'spill_bytes', 'loop' (instructions in the K/V loop), 'mix' (full-opcode
    Counter of the K/V loop), 'loads_in_flight' (global loads the K/V copy issues before its
    first store to shared memory: how many it keeps in flight)}, and 'differ': {opcode: (fp16,
    bf16)} for the opcodes whose K/V loop counts differ. `bf16_defines` are extra defines for the bf16 build (e.g.
    BF16_GENERIC_FRAGMENT_LOADS: mma.h's own fragment loads, as before stages/attention.cuh's
    load_fragment)."""
    import collections

    import stages
    from lib import nvrtc, sass
    mod = stages.get(stage)
    # the build contiguous inputs run (row strides the constant D), as the stages' compile_for
    base = dict(mod.config(D)["defines"]) if hasattr(mod, "config") else dict(nvrtc.PACKED_ROWS)
    out = {}
    for dtype in (torch.float16, torch.bfloat16):
        extra = bf16_defines if dtype == torch.bfloat16 and bf16_defines else {}
        compiled = nvrtc.compile_stage(mod.SOURCE, arch=arch, dtype=dtype, head_dim=D,
                                       defines={**base, **extra})
        p = next(iter(compiled.resource_usage().values()))
        body = sass.kv_loop(sass.sass_text(compiled.cubin))["body"]
        out[DTYPE_NAMES[dtype]] = {"registers": p["registers"], "spill_bytes": p["spill_stores"],
                                   "loop": len(body),
                                   "mix": collections.Counter(x["full"] for x in body),
                                   "loads_in_flight": loads_before_first_store(body)}
    a, b = out["float16"]["mix"], out["bfloat16"]["mix"]
    out["differ"] = {op: (a[op], b[op]) for op in sorted(set(a) | set(b), key=lambda o: -abs(a[o] - b[o]))
                     if a[op] != b[op]}
    return out


def loads_before_first_store(body: list[dict]) -> int:
    """Global loads (LDG) a K/V loop issues before its first shared-memory store (STS): the
    loads a warp has in flight at once before it must wait for the first of them."""
    ops = [x["op"] for x in body]
    return ops[:ops.index("STS")].count("LDG") if "STS" in ops else ops.count("LDG")


STALL_REASONS = ("short_scoreboard", "long_scoreboard", "barrier", "branch_resolving",
                 "mio_throttle", "math_pipe_throttle", "wait", "no_instruction", "not_selected")
# What the profile step asks ncu for beyond its sections (scripts/gpu_session.sh, WARP_METRICS):
# the share of active warps stalled for each reason, instructions and branches executed.
NCU_WARP_METRICS = {**{f"stall {r}": f"smsp__warp_issue_stalled_{r}_per_warp_active.pct"
                       for r in STALL_REASONS},
                    "instructions executed": "smsp__inst_executed.sum",
                    "branches executed": "smsp__sass_inst_executed_op_branch.sum",
                    "uniform branches (%)": "smsp__sass_average_branch_targets_threads_uniform.pct"}


def profile_facts(stage: int, shape: str = "throughput") -> dict | None:
    """What one recorded ncu report says about where a kernel's time goes, as numbers: achieved
    and theoretical occupancy, warps per scheduler, cycles per issued instruction, the issue
    rate per scheduler and the instructions each scheduler issued (derived: active cycles ×
    warps per scheduler ÷ cycles per issued instruction), L1/TEX throughput, the shared-store
    counters, ncu's short-scoreboard rule where it printed one, and every NCU_WARP_METRICS value
    the report holds (None for those it lacks). None when there is no report."""
    rep = ncu_report(stage, shape)
    if rep is None or not rep["kernels"]:
        return None
    k = rep["kernels"][0]
    text = (ROOT / rep["path"]).read_text()

    def value(name):
        m = re.search(rf"^\s+{re.escape(name)}\s+(?:\S+\s+)?([\d,.]+)\s*$", text, re.M)
        return float(m.group(1).replace(",", "")) if m else None

    m = k["metrics"]
    warps = value("Achieved Active Warps Per SM")
    cpi = m.get("Warp Cycles Per Issued Instruction", (None,))[0]
    active = value("SM Active Cycles")
    per_sched = warps / 4 if warps else None
    facts = {"commit": re.search(r"commit (\w+)", rep["header"]).group(1) if "commit" in rep["header"] else None,
             "duration_ms": m.get("Duration", (None,))[0],
             "achieved_occupancy": m.get("Achieved Occupancy", (None,))[0],
             "theoretical_occupancy": m.get("Theoretical Occupancy", (None,))[0],
             "warps_per_scheduler": per_sched, "cycles_per_issue": cpi,
             "issue_rate": per_sched / cpi if per_sched and cpi else None,
             "issued_per_scheduler": active * per_sched / cpi if active and per_sched and cpi else None,
             "l1tex_pct": m.get("L1/TEX Cache Throughput", (None,))[0],
             "shared_stores": k["shared"].get("stores"), "shared_loads": k["shared"].get("loads")}
    flat = re.sub(r"\s+", " ", text)
    mm = re.search(r"spends ([\d.]+) cycles being stalled waiting for a scoreboard dependency on a MIO", flat)
    facts["short_scoreboard_cycles"] = float(mm.group(1)) if mm else None
    for what, metric in NCU_WARP_METRICS.items():
        mm = re.search(_metric_pattern(metric).replace(r"([\d,]+)", r"([\d,.]+)"), text, re.M)
        facts[what] = float(mm.group(1).replace(",", "")) if mm else None
    return facts


def softmax_control_flow(stage: int, D: int, tiles=None, dtype=torch.float16,
                         arch: str = "sm_90a") -> dict:
    """The softmax of one warp and one K/V tile, read off the SASS of the K/V loop (from the
    first FMNMX to the last shared store before the P·V product): instructions and control-flow
    instructions (BRA, BSSY, BSYNC, BREAK, WARPSYNC), static and weighted by the trips of the
    softmax loops (a pass with fewer MUFU or FMNMX than the lane's columns is a loop run
    columns ÷ per-trip times), plus the columns per lane. Counts both sides of each branch: an
    upper bound on what one path executes."""
    import collections

    import stages
    from lib import sass
    mod = stages.get(stage)
    kw = {"tiles": tiles} if tiles is not None and stage == 4 else {}
    compiled = next(iter(mod.compile_for(arch, dtype, D, **kw).values()))
    L = sass.listing(sass.sass_text(compiled.cubin), "attention_fused")
    lo, hi = (lambda kv: (kv["body"][0]["addr"], kv["body"][-1]["addr"]))(
        sass.kv_loop(sass.sass_text(compiled.cubin)))
    body = [x for x in L if lo <= x["addr"] <= hi]
    first = next(x["addr"] for x in body if x["op"] == "FMNMX")
    pv = min(x["addr"] for x in body if x["op"] == "HMMA" and x["addr"] > first)
    last = max(x["addr"] for x in body if x["op"] == "STS" and x["addr"] < pv)
    block_k = 32 if stage == 3 else (tiles or mod.TILES[D])[1]
    cols = block_k // 2
    loops = [(sass.branch_target(x), x["addr"]) for x in body if x["op"] == "BRA"
             and sass.branch_target(x) is not None and sass.branch_target(x) < x["addr"]
             and first - 0x400 <= sass.branch_target(x) and x["addr"] < pv]
    weight = {}
    for a, b in loops:
        inner = collections.Counter(x["op"] for x in body if a <= x["addr"] <= b)
        per_trip = inner["MUFU"] or inner["FMNMX"]
        if per_trip:
            for x in body:
                if a <= x["addr"] <= b:
                    weight[x["addr"]] = cols // per_trip
    start, end = min([first] + [a for a, _ in loops]), max([last] + [b for _, b in loops])
    region = [x for x in body if start <= x["addr"] <= end]
    ctrl = ("BRA", "BSSY", "BSYNC", "BREAK", "WARPSYNC")
    w = lambda xs: sum(weight.get(x["addr"], 1) for x in xs)
    return {"columns_per_lane": cols, "static": len(region),
            "static_control": sum(x["op"] in ctrl for x in region),
            "per_tile": w(region), "control_per_tile": w([x for x in region if x["op"] in ctrl]),
            "per_tile_by_op": {op: w([x for x in region if x["op"] == op]) for op in ctrl}}


def column_store_ways(block_q: int, ld_p: int, item: int = 2) -> int:
    """Shared-memory passes of one warp's store of P in the stage 3/4 softmax: lane l writes
    p_t[l % 2][row0 + l / 2] (two lanes per row, neighbouring columns) into a column-major tile
    of column stride ld_p elements of `item` bytes. The most distinct 4-byte words in one bank."""
    banks = {}
    for lane in range(32):
        word = ((lane % 2) * ld_p + lane // 2) * item // 4
        banks.setdefault(word % 32, set()).add(word)
    return max(len(s) for s in banks.values())

# --------------------------------------------------------------------------------------------
# The stage 3 and stage 4 notebooks' counting (issue 13: moved out of their cells). Both count
# the instructions one warp issues per K/V tile in the fp16 SASS for sm_90a, the way their
# sections 2 explain; the numbers are what the cells computed before.

def warp_softmax_tile_counts(stage: int, D: int = 64, block_q: int = 32, block_k: int = 32) -> dict:
    """Stage 2's or 3's K/V loop per tile and warp, split as the stage 3 notebook's section 2
    explains, from the fp16 SASS for sm_90a (lib.sass.inspect_stage): instructions per element
    of the K/V copy ('load_per_element') and per column of the max and 2^x passes, the softmax
    columns per lane (stage 2: one lane per row, 32 lanes; stage 3: every thread), and the
    per-tile totals 'loads' (the lane's share of the copy), 'softmax' and 'rest' (everything else
    in the loop: the tensor-core products, the rescale, the barriers)."""
    import stages
    from lib.sass import backward_branches, inspect_stage, listing
    mod = stages.get(stage)
    ins = next(iter(inspect_stage(stage).values()))
    instrs = listing(ins.sass, "attention_fused")
    L = [(x["addr"], x["op"], x["text"]) for x in instrs]
    # the K/V loop: the (last) backward branch whose body holds the tensor-core instructions
    lo, hi = next((a, b) for a, b in reversed(backward_branches(instrs))
                  if any(o == "HMMA" and a <= x <= b for x, o, _ in L))
    body = [x for x in L if lo <= x[0] <= hi]
    inner = [l for l in innermost_loops(ins.sass, "attention_fused") if lo <= l["start"]
             and l["end"] <= hi and not l["mix"]["HMMA"]]  # loops inside the K/V loop
    # the softmax: from the end of the S product (last HMMA before the first max) to its last
    # shared-memory store before the P·V product, widened to cover any loop it cuts into
    first_max = next(a for a, op, _ in body if op == "FMNMX")
    start = max(a for a, op, _ in body if op == "HMMA" and a < first_max)
    end = max(a for a, op, _ in body if op == "STS" and a < min(
        a for a, op, _ in body if op == "HMMA" and a > first_max))
    for l in inner:
        if l["start"] <= end and l["end"] >= start:
            start, end = min(start, l["start"]), max(end, l["end"])

    def per_column(op):  # instructions per column of the pass whose one-per-column op is `op`
        loop = next((l for l in inner if l["mix"][op] and start <= l["start"] <= end), None)
        if loop:
            return sum(loop["mix"].values()) / loop["mix"][op]
        at = [a for a, o, _ in body if o == op and start <= a <= end]   # unrolled: its span
        return sum(1 for a, _, _ in body if at[0] <= a <= at[-1]) / len(at)

    loads = [l for l in inner if l["mix"]["LDG"]]
    if loads:  # the copy is a loop of its own
        in_loads = {a for l in loads for a, _, _ in body if l["start"] <= a <= l["end"]}
        per_element = sum(sum(l["mix"].values()) for l in loads) / sum(l["mix"]["LDG"] for l in loads)
    else:      # the copy is unrolled: it is what lies between the two __syncthreads() around it
        ldg = [a for a, op, _ in body if op == "LDG"]
        bar_before = max(a for a, op, _ in body if op == "BAR" and a < ldg[0])
        bar_after = min(a for a, op, _ in body if op == "BAR" and a > ldg[-1])
        copy = [(a, op) for a, op, _ in body if bar_before < a <= bar_after]
        in_loads = {a for a, _ in copy}
        per_element = len(copy) / sum(op == "LDG" for _, op in copy)
    cols_per_lane = block_q * block_k // (32 if stage == 2 else mod.THREADS)
    c = dict(load_per_element=per_element, max_per_col=per_column("FMNMX"),
             exp_per_col=per_column("MUFU"), cols_per_lane=cols_per_lane)
    c["loads"] = 2 * block_k * D / mod.THREADS * per_element
    c["softmax"] = cols_per_lane * (c["max_per_col"] + c["exp_per_col"])
    c["rest"] = sum(1 for a, _, _ in body if a not in in_loads and not start <= a <= end)
    return c


def ptxas_of(mod, D: int, tiles=None, dtype=torch.float16):
    """(compiled kernel, ptxas's registers, spills and static shared memory) of a stage module
    compiled for sm_90a here; `tiles` picks one of stage 4's CHOICES."""
    from lib import nvrtc
    kw = {"tiles": tiles} if tiles is not None and hasattr(mod, "CHOICES") else {}
    compiled = next(iter(mod.compile_for("sm_90a", dtype, D, **kw).values()))
    return compiled, next(iter(nvrtc.parse_ptxas_log(compiled.log).values()))


STAGE3_TILES = (32, 32, 4)  # stage 3's BLOCK_Q, BLOCK_K and loads in flight (fixed in its .cu)


def kv_tile_counts(stage: int, D: int, tiles=None) -> dict:
    """Stage 3's or 4's K/V loop per warp and tile (fp16, sm_90a), as the stage 4 notebook's
    section 2 counts it: the largest loop holding HMMA, its inner loops (a softmax pass: one
    FMNMX or MUFU per column) counted once per trip. {'tiles', 'warps', 'threads',
    'per_warp_tile', 'copy' (instructions between the copy's two barriers), 'mix' (opcode
    Counter, weighted by trips), 'ins' (lib.sass inspection), 'ptxas', 'per_warp_key',
    'per_row_key', 'ldg_batches' (global-load round trips per thread and tile)}."""
    import collections
    import math

    import stages
    from lib.sass import backward_branches, inspect_cubin, listing
    mod = stages.get(stage)
    bq, bk, f = STAGE3_TILES if stage == 3 else (tiles or mod.TILES[D])
    compiled, ptxas = ptxas_of(mod, D, tiles if stage == 4 else None)
    ins = inspect_cubin(compiled.cubin, "sm_90a", compiled.resource_usage())
    instrs = listing(ins.sass, "attention_fused")
    L = [(x["addr"], x["op"], x["text"]) for x in instrs]
    loops = backward_branches(instrs)
    lo, hi = max(((a, b) for a, b in loops if any(op == "HMMA" and a <= x <= b for x, op, _ in L)),
                 key=lambda l: l[1] - l[0])
    body = [x for x in L if lo <= x[0] <= hi]
    mix = collections.Counter(op for _, op, _ in body)
    for a, b in loops:                       # a softmax pass: one FMNMX or MUFU per column
        if (a, b) != (lo, hi) and lo <= a and b <= hi:
            inner = collections.Counter(op for x, op, _ in body if a <= x <= b)
            per_trip = inner["FMNMX"] or inner["MUFU"]
            trips = (bk // 2) // per_trip if per_trip else 1
            for op, n in inner.items():
                mix[op] += (trips - 1) * n
    bars = [x for x, op, _ in body if op == "BAR"]
    copy = sum(1 for x, _, _ in body if bars[0] < x <= bars[1])    # between the copy's barriers
    total = sum(mix.values())
    warps = bq // 16
    per_thread = 2 * bk * D // (32 * warps)   # elements of K and V one thread copies per tile
    return dict(tiles=(bq, bk, f), warps=warps, threads=32 * warps, per_warp_tile=total,
                copy=copy, mix=mix, ins=ins, ptxas=ptxas,
                per_warp_key=total / bk, per_row_key=total * warps / (bq * bk),
                ldg_batches=math.ceil(per_thread / f))


def show_tile_choices(stage: int = 4) -> dict | None:
    """The recorded tile sweep of a stage whose tiles are (BLOCK_Q, BLOCK_K, LOADS_IN_FLIGHT)
    (scripts/tile_sweep.py; stage 4): a table, TFLOPS per choice and head dim, the spread from
    the fastest to the slowest choice, and per head dim and mask whether the chosen tiles are
    the fastest measured; where not, whether the faster choice spills when compiled here.
    Returns {(D, causal): fastest ÷ slowest}, or None when no sweep is recorded."""
    import matplotlib.pyplot as plt

    import stages
    from lib import nvrtc
    mod = stages.get(stage)
    sweep = tile_sweep(stage)
    if sweep is None:
        print(f"tile sweep of stage {stage}: not recorded yet (scripts/tile_sweep.py --record writes it)")
        return None
    if sweep["stale"]:
        print(f"note: stage {stage}'s sources changed since this sweep was recorded, so it may not "
              "describe the kernel as it is now (re-run scripts/tile_sweep.py --record on a GPU)")
    env = sweep["env"]
    rows = sorted(sweep["rows"], key=lambda r: (r["D"], r["causal"], -r["tflops"]))
    lines = [f"*Recorded, not measured in this session* ({env['gpu']}, commit {env['commit'][:10]}, "
             f"{env['date']}, NVRTC {env.get('nvrtc', '?')}).", "",
             "| shape | causal | BLOCK_Q, BLOCK_K, in flight | µs | TFLOPS | vs fastest | registers "
             "| spills (B) | threads | shared (B) | check |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    best = {}
    for r in rows:
        best.setdefault((r["D"], r["causal"]), r["us"])
        lines.append(f"| B{r['B']} H{r['H']} S{r['S']} D{r['D']} | {'yes' if r['causal'] else 'no'} "
                     f"| {r['variant']}{' **(chosen)**' if r['default'] else ''} | {r['us']:,.1f} "
                     f"| {r['tflops']:.1f} | {best[r['D'], r['causal']] / r['us']:.2f}× | {r['registers']} "
                     f"| {r['spill_bytes']} | {r['threads']} | {r['smem_bytes']:,} "
                     f"| {'pass' if r['passed'] else '**FAIL**'} |")
    _md("\n".join(lines))
    groups = sorted({(r["D"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.8), squeeze=False)
    for ax, (D, causal) in zip(axes[0], groups):
        g = [r for r in sweep["rows"] if r["D"] == D and r["causal"] == causal]
        ax.bar(range(len(g)), [r["tflops"] for r in g],
               color=["tab:orange" if r["default"] else "tab:blue" for r in g])
        ax.set_xticks(range(len(g)), [r["variant"] for r in g], rotation=70, fontsize=7)
        ax.set_title(f"D {D}, {'causal' if causal else 'full'}", fontsize=9)
        ax.set_ylabel("TFLOPS")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Stage {stage}'s tile choices, recorded (orange: built by default)", fontsize=10)
    fig.tight_layout()
    plt.show()
    spread = {}
    for D, causal in groups:
        t = [r["tflops"] for r in sweep["rows"] if r["D"] == D and r["causal"] == causal]
        spread[D, causal] = max(t) / min(t)
        print(f"D {D} {'causal' if causal else 'full  '}: fastest choice {max(t) / min(t):.2f}x "
              f"the slowest, over {len(t)} choices")
    for D, causal in groups:
        g = [r for r in sweep["rows"] if r["D"] == D and r["causal"] == causal]
        fast, chosen = min(g, key=lambda r: r["us"]), next((r for r in g if r["default"]), None)
        if chosen is None or fast is chosen:
            print(f"D {D} {'causal' if causal else 'full'}: the chosen tiles are the fastest measured")
            continue
        if chosen["us"] / fast["us"] < 1.02:
            print(f"D {D} {'causal' if causal else 'full'}: the chosen {chosen['variant']} is within 2% of "
                  f"the fastest measured, {fast['variant']} ({chosen['us'] / fast['us']:.3f}x)")
            continue
        t = tuple(int(x) for x in re.findall(r"\d+", fast["variant"])[:3])
        p = next(iter(mod.compile_for("sm_90a", torch.float16, D, t).values())).resource_usage()
        p = next(iter(p.values()))
        print(f"D {D} {'causal' if causal else 'full'}: {fast['variant']} measured {chosen['us'] / fast['us']:.2f}x "
              f"faster than the chosen {chosen['variant']} ({fast['spill_bytes']} B spilled as recorded); "
              f"compiled here (NVRTC {nvrtc.nvrtc_version()}) it spills {p['spill_stores']} B stored / "
              f"{p['spill_loads']} B loaded" + (", so it is not the default" if p["spill_stores"] else
                                                 ": spills do not explain why it is not the default"))
    return spread


def check_variants(variants: dict, shapes, dtypes=(torch.float16,)) -> list:
    """check_shapes for several builds of one stage at once: `variants` maps a label (say the
    tile choice) to an attention function; one table of every case, the label in the first
    column. Returns the list of lib.reference.Check; failures are listed again under the table."""
    checks, rows = [], []
    for label, attention in variants.items():
        for B, H, Sq, Sk, D, causal in shapes:
            for dtype in dtypes:
                c = check_attention(attention, B, H, Sq, Sk, D, dtype=dtype, causal=causal)
                checks.append(c)
                rows.append(f"| {label} | B{B} H{H} Sq{Sq} Sk{Sk} D{D} | {DTYPE_NAMES[dtype]} | "
                            f"{'causal' if causal else 'full'} | {c.max_abs_err:.2e} | "
                            f"{c.tolerance:.2e} | {c.max_abs_diff_sdpa:.2e} | "
                            f"{'pass' if c.passed else '**FAIL**'} |")
    _md("| variant | case | dtype | mask | max abs error vs reference | bound (2× SDPA's + rounding) "
        "| max abs diff vs SDPA | result |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    for c, r in zip(checks, rows):
        if not c.passed:
            print("FAIL:", r, c.summary())
    return checks


def show_stage4_hypotheses(head_dims=(64, 128)) -> tuple[dict | None, dict | None]:
    """The stage 4 notebook's three hypotheses for its small gain at D 64, each against what
    exists offline: A (fewer warps per SM) and the instructions executed, from the recorded ncu
    reports of stages 3 and 4 at the throughput shape; B (per-column branches in the softmax),
    from the SASS compiled here (softmax_control_flow) and the reports' branch counters; C (the
    S/P round trip through shared memory), from the bank ways of the P stores (counted) and the
    reports' raw store counters and short-scoreboard stalls. Returns the two profile_facts."""
    import stages
    s4 = stages.get(4)
    f3, f4 = profile_facts(3), profile_facts(4)
    both = bool(f3 and f4)

    def pair(key, spec):
        a, b = f3.get(key), f4.get(key)
        return "not in the reports" if a is None or b is None else f"{a:{spec}} -> {b:{spec}}"

    if both:
        print(f"ncu reports (recorded, commit {f3['commit']} / {f4['commit']}, B16 H16 S2048 D64 fp16):")
        print(f"  duration {f3['duration_ms']} -> {f4['duration_ms']} ms ({f3['duration_ms'] / f4['duration_ms']:.2f}x)")
        print(f"A. warps per SM: theoretical occupancy {f3['theoretical_occupancy']:g}% -> {f4['theoretical_occupancy']:g}%, "
              f"achieved {f3['achieved_occupancy']:g}% -> {f4['achieved_occupancy']:g}% "
              f"({f3['warps_per_scheduler']:.2f} -> {f4['warps_per_scheduler']:.2f} warps per scheduler)")
        print(f"   cycles per issued instruction {f3['cycles_per_issue']} -> {f4['cycles_per_issue']}; "
              f"warp instructions executed (smsp__inst_executed.sum) "
              + (f"{f3['instructions executed'] / 1e6:,.0f}M -> {f4['instructions executed'] / 1e6:,.0f}M "
                 f"({f4['instructions executed'] / f3['instructions executed']:.2f}x)"
                 if f3["instructions executed"] and f4["instructions executed"] else "not in the reports"))
    else:
        print("no recorded ncu reports of stages 3 and 4: the profile step of scripts/gpu_session.sh writes them")
    from lib.nvrtc import nvrtc_version
    for D in head_dims:
        a, b = softmax_control_flow(3, D), softmax_control_flow(4, D)
        print(f"B. softmax per warp and tile, D {D} (SASS of NVRTC {nvrtc_version()}, both sides of every "
              f"branch counted): stage 3 "
              f"{a['per_tile']} instructions for {a['columns_per_lane']} columns per lane "
              f"({a['per_tile'] / a['columns_per_lane']:.1f} per column, {a['control_per_tile']} control flow), stage 4 "
              f"{b['per_tile']} for {b['columns_per_lane']} ({b['per_tile'] / b['columns_per_lane']:.1f} per column, "
              f"{b['control_per_tile']} control flow: " + ", ".join(f"{op} {n}" for op, n in b["per_tile_by_op"].items()) + ")")
    if both:
        br3, br4 = f3["branches executed"], f4["branches executed"]
        print("   ncu: branch instructions executed "
              + (f"{br3 / 1e6:.1f}M -> {br4 / 1e6:.1f}M" if br3 and br4 else "not in the reports")
              + f"; warps stalled resolving branches {pair('stall branch_resolving', '.2f')} % of the time; "
              f"branches uniform across the warp {pair('uniform branches (%)', 'g')} %")
    bq3, bq4 = STAGE3_TILES[0], s4.TILES[64][0]
    pad4 = int(re.search(r"LD_P = BLOCK_Q \+ (\d+);", (ROOT / "stages/stage4.cu").read_text()).group(1))
    print(f"C. P stores, two lanes per row (bank ways, counted): stage 3 LD_P = {bq3 + 8}: "
          f"{column_store_ways(bq3, bq3 + 8)}-way; stage 4 with stage 3's padding, LD_P = {bq4 + 8}: "
          f"{column_store_ways(bq4, bq4 + 8)}-way; stage 4 as built, LD_P = BLOCK_Q + {pad4} = {bq4 + pad4}: "
          f"{column_store_ways(bq4, bq4 + pad4)}-way")
    if both:
        t3, t4 = f3["shared_stores"], f4["shared_stores"]
        if t3 and t4:
            req = (f"{t3['requests'] / 1e6:.1f}M -> {t4['requests'] / 1e6:.1f}M store instructions, "
                   if t3.get("requests") and t4.get("requests") else "")
            print(f"   ncu, every shared store of the kernel: {req}"
                  f"{t3['wavefronts'] / 1e6:.1f}M -> {t4['wavefronts'] / 1e6:.1f}M wavefronts, "
                  f"{t3['conflicts'] / 1e6:.1f}M -> {t4['conflicts'] / 1e6:.1f}M bank conflicts "
                  f"({t3['ways']:.2f}-way -> {t4['ways']:.2f}-way); L1/TEX {f3['l1tex_pct']}% -> {f4['l1tex_pct']}%")
        print(f"   warps stalled on the short scoreboard (shared-memory results) {pair('stall short_scoreboard', '.2f')} "
              f"% of the time; on the long scoreboard (global loads) {pair('stall long_scoreboard', '.2f')} %")
    return f3, f4
