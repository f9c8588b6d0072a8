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
             "duration_us": m.get("Duration", (None,))[0],  # ncu_report converts it to µs
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
        print(f"  duration {f3['duration_us']} -> {f4['duration_us']} µs ({f3['duration_us'] / f4['duration_us']:.2f}x)")
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


# -- record look-ups for the stage 3, 4 and 5 notebooks' prose cells (issue 47, lib.prose) --------

def rec_row(stage: int, shape: str = "throughput", causal: bool = False, dtype: str = "float16") -> dict:
    """The recorded row of `stage` at a named standard shape (lib.prose.row)."""
    from lib.prose import row
    return row(stage, shape, causal, dtype)


def rec_speedup(old: int, new: int, shape: str = "throughput", causal: bool = False) -> float:
    """Stage `old`'s recorded time ÷ stage `new`'s at one shape (fp16)."""
    return rec_row(old, shape, causal)["us"] / rec_row(new, shape, causal)["us"]


def rec_vs_sdpa(stage: int, shape: str, causal: bool = False, field: str = "sdpa_us") -> float:
    """SDPA's recorded median time at the shape ÷ the stage's, fp16 (lib.prose.vs_sdpa)."""
    from lib.prose import vs_sdpa
    return vs_sdpa(rec_row(stage, shape, causal), field)


def _rec(entry: str | None = None, stage: int | None = None) -> str:
    from lib.prose import record, record_name
    return record_name(record()["stages"][str(stage)] if stage is not None else record()[entry]["env"])


def rec_stage_name(stage: int) -> str:
    """'the H100 record (commit 2f55a4f, 2026-11-26)': the record of one stage's rows."""
    return _rec(stage=stage)


def launch_gap_name() -> str:  # the record of scripts/launch_gap.py's timings
    return _rec("launch_gap")


def tiles_name() -> str:  # the record of the tile sweep
    return _rec("tiles")


def launch_gap_held(call: str, causal: bool = False, shape: str = "latency") -> float:
    """µs of `call` ("SDPA default", "SDPA flash", "stage 3", …) timed with the GPU held, in the
    record's launch_gap entry (scripts/launch_gap.py)."""
    from lib.prose import record
    return next(r["held_us"] for r in record()["launch_gap"]["rows"]
                if (r["call"], r["causal"], r["shape"]) == (call, causal, shape))


def launch_gap_agreement(shapes=("throughput", "long")) -> float:
    """The largest relative difference between the two ways of timing (lib.prose)."""
    from lib.prose import launch_gap_agreement
    return launch_gap_agreement(shapes)


def _tile_rows(stage: int, D: int, causal: bool) -> list:
    from lib.prose import record
    return [r for r in record()["tiles"]["rows"] if (r["stage"], r["D"], r["causal"]) == (stage, D, causal)]


def rec_tile_us(stage: int, D: int, causal: bool, variant: str | None = None) -> float:
    """A recorded tile sweep time (µs): `variant` as the sweep names it, the chosen one by default."""
    return next(r["us"] for r in _tile_rows(stage, D, causal)
                if (r["variant"] == variant if variant else r["default"]))


def tiles5_interleaved() -> dict:
    """Stage 5's tile choices timed in interleaved rounds (scripts/tile_sweep.py --interleaved; a
    log, not recorded): {'env', 'us': {(variant, D, causal): µs}, 'rounds': {…: round medians}}."""
    import json
    data = json.loads(sorted(ROOT.glob("results/logs/*/device/tiles5_interleaved.json"))[-1].read_text())
    key = lambda r: (r["variant"], r["D"], r["causal"])  # noqa: E731
    return {"env": data["env"], "us": {key(r): r["us"] for r in data["rows"]},
            "rounds": {key(r): r["round_medians_us"] for r in data["rows"]}}


# Values for the prose cells (each a dict for lib.prose.say), so that a cell binds no name but its
# own import: prose cells run in the notebook's namespace too, beside its ordinary code cells.

def prose_latency(stage: int) -> dict:
    """The latency-shape sentence (B1 H8 S512 D64): launch_gap's held µs (sd, sf, st: full–causal;
    sd0, sf0, st0: full), held SDPA ÷ stage (hd, hf full; hdc, hfc causal), every held time (every),
    the record's SDPA ÷ stage (d, f; dc, fc), its host and GPU µs per call (host, gpu, faster), the
    speed-up over the stage before (prev), the agreement at the other shapes, the records' names."""
    from lib.prose import pct, span, us, x
    call, row = f"stage {stage}", rec_row(stage, "latency")
    held = {(c, m): launch_gap_held(c, m) for c in ("SDPA default", "SDPA flash", call) for m in (False, True)
            if c != call or stage in (3, 5, 6)}
    both = lambda c: span([held[c, False], held[c, True]], us)  # noqa: E731
    out = {"lg": launch_gap_name(), "rec": rec_stage_name(stage), "sd": both("SDPA default"),
           "sf": both("SDPA flash"), "sd0": us(held["SDPA default", False]),
           "sf0": us(held["SDPA flash", False]), "every": span(held.values(), us),
           "d": x(rec_vs_sdpa(stage, "latency")), "f": x(rec_vs_sdpa(stage, "latency", field="sdpa_flash_us")),
           "dc": x(rec_vs_sdpa(stage, "latency", True)),
           "fc": x(rec_vs_sdpa(stage, "latency", True, "sdpa_flash_us")),
           "host": us(row["host_us"]), "gpu": us(row["host_gpu_us"]),
           "faster": "faster than" if row["host_us"] < row["host_gpu_us"] else "no faster than",
           "prev": span([rec_speedup(stage - 1, stage, "latency", m) for m in (False, True)]),
           "agree": pct(launch_gap_agreement(), 1)}
    if (call, False) in held:
        out.update(st=both(call), st0=us(held[call, False]),
                   **{k: x(held[c, m] / held[call, m]) for k, c, m in
                      (("hd", "SDPA default", False), ("hf", "SDPA flash", False),
                       ("hdc", "SDPA default", True), ("hfc", "SDPA flash", True))})
    return out


def prose_bf16(stage: int = 3) -> dict:
    """bf16 ÷ fp16 recorded time at D 64 (a) and D 128 (b), and whether that is 'within a few percent'."""
    from lib.prose import x
    r = [rec_row(stage, s, dtype="bfloat16")["us"] / rec_row(stage, s)["us"] for s in ("throughput", "long")]
    return {"a": x(r[0]), "b": x(r[1]), "rec": rec_stage_name(stage),
            "verdict": "within a few percent, as predicted" if max(r) < 1.05
            else "so the prediction does not hold everywhere"}


def prose_stage4_gain() -> dict:
    """Stage 3 → 4 at D 64 (s) against stage4.INFO.prediction (lo, hi; w: below, inside or above),
    and at D 128 with either mask (s128)."""
    import stages.stage4 as s4
    from lib.prose import span, x
    s = rec_speedup(3, 4)
    lo, hi = s4.INFO.prediction["speedup"]
    w = "below" if round(s, 2) < lo else "above" if round(s, 2) > hi else "inside"
    return {"s": x(s), "lo": x(lo), "hi": x(hi), "w": w, "rec": rec_stage_name(4),
            "s128": span([rec_speedup(3, 4, "long", c) for c in (False, True)])}


def prose_stage5_tiles() -> dict:
    """Stage 5's chosen tiles against (128, 128, 2, 32) at D 64 and (128, 32, 2, 32) at D 128: in the
    recorded sweep (a, b; c, d: full, causal) and in the interleaved log (e, f; g, h), as 'x% more/less
    time'; the sweep's and the benchmark's time at D 128 causal; the log's D 128 full µs and rounds."""
    from lib.prose import pct, us
    log, C = tiles5_interleaved(), "(128, 64, 2, 32)"
    other = {64: "(128, 128, 2, 32)", 128: "(128, 32, 2, 32)"}
    than = lambda a, b: f"{pct(abs(a / b - 1), 1)} {'more' if a > b else 'less'} time"  # noqa: E731
    sw = [than(rec_tile_us(5, D, c), rec_tile_us(5, D, c, other[D])) for D in (64, 128) for c in (False, True)]
    il = [than(log["us"][C, D, c], log["us"][other[D], D, c]) for D in (128, 64) for c in (False, True)]
    moved = max(max(r) / min(r) - 1 for r in (log["rounds"][v, 128, False] for v in (C, other[128])))
    return dict(zip("abcdefgh", sw + il), W=other[64], O=other[128], sw=tiles_name(),
                t1=us(rec_tile_us(5, 128, True)), t2=us(rec_row(5, "long", True)["us"]),
                rec=rec_stage_name(5), lc=log["env"]["commit"][:7], ld=log["env"]["date"][:10],
                u1=us(log["us"][other[128], 128, False]), u2=us(log["us"][C, 128, False]), mv=pct(moved))
