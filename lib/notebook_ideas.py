"""Idea-by-idea records: stage 5's waterfall and leave-one-out builds, its bank-conflict and
tile-sweep tables, and stage 6's schedule rows, steps and SASS forms, with its K/V ring table
(lib.notebook re-exports these)."""
from __future__ import annotations

import re

import torch

from lib import results as R
from lib.notebook_common import _md, ncu_report, tile_sweep


# --------------------------------------------------------------------------------------------
# Stage 5 idea by idea (scripts/stage5_ideas.py records it under "stage5_ideas"; issue 12).

STAGE5_IDEAS_MISSING = ("not recorded yet: run scripts/stage5_ideas.py --record on a GPU "
                        "(or the stage5 step of scripts/gpu_session.sh)")


def stage5_ideas_record() -> dict | None:
    """The recorded "stage5_ideas" block of the results file, or None."""
    data = R.load()
    return (data or {}).get("stage5_ideas")


def show_stage5_ideas(causal: bool = False) -> dict | None:
    """From the record: per head dim, the waterfall (stage 4, then the stage-4-like build of
    the stage 5 kernel and each idea added, lib.plots.plot_waterfall) and the leave-one-out
    table; a line naming each head dim's largest step, computed from the rows. Prints
    STAGE5_IDEAS_MISSING when nothing is recorded; returns the record."""
    import matplotlib.pyplot as plt

    import stages.stage5 as s5
    from lib.plots import plot_waterfall
    rec = stage5_ideas_record()
    rows = [r for r in (rec or {}).get("rows", []) if r["causal"] == causal]
    if not rows:
        print(STAGE5_IDEAS_MISSING if not rec else
              f"not recorded yet with causal={causal}: run scripts/stage5_ideas.py --record on a GPU")
        return rec
    e = rec["env"]
    stale = rec.get("sha256", {}).get("5") != R.stage_sha256(s5.INFO)
    _md(f"*Recorded, not measured in this session:* {e['gpu']}, commit {e['commit'][:10]}, "
        f"{e['date']}" + (" — **stage 5's sources changed since: re-run the script**" if stale else ""))
    dims = sorted({r["D"] for r in rows})
    fig, axes = plt.subplots(1, len(dims), figsize=(6.5 * len(dims), 3.6), squeeze=False)
    lines = ["| stage 5 with one idea undone | " + " | ".join(
        f"D {D}: TFLOPS | D {D}: × stage 5" for D in dims) + " |", "|---|" + "---|---|" * len(dims)]
    loo = {}
    for ax, D in zip(axes[0], dims):
        rs = [r for r in rows if r["D"] == D]
        steps = [r for r in rs if r["kind"] in ("stage 4", "waterfall")]
        bars = [{"variant": r["variant"] if r["kind"] == "stage 4" or i == 1 else "+ " + r["variant"],
                 "tflops": r["tflops"]} for i, r in enumerate(steps)]
        r0 = rs[0]  # SDPA's TFLOPS: the same FLOPs in SDPA's time
        sdpa_tflops = r0["tflops"] * r0["us"] / r0["sdpa_us"] if r0.get("sdpa_us") else None
        plot_waterfall(bars, f"stage 5 idea by idea, B{r0['B']} H{r0['H']} S{r0['S']} D{D} fp16 "
                       f"{'causal' if causal else 'full'}", sdpa_tflops=sdpa_tflops, ax=ax)
        gains = [(steps[i + 2]["variant"], steps[i + 1]["us"] / steps[i + 2]["us"])
                 for i in range(len(steps) - 2)]
        if gains:
            best = max(gains, key=lambda g: g[1])
            whole = steps[1]["us"] / steps[-1]["us"]
            print(f"D {D}: from the stage-4-like build to stage 5 {whole:.2f}× in all; the largest "
                  f"step is {best[0]!r} ({best[1]:.2f}×); steps: "
                  + ", ".join(f"{n} {x:.2f}×" for n, x in gains))
        full = next((r for r in rs if r.get("default")), None)
        for r in rs:
            if r["kind"] in ("leave-one-out", "alternative"):
                loo.setdefault(r["variant"], {})[D] = (r["tflops"], full and full["us"] / r["us"])
    for name, per_d in loo.items():
        cells = []
        for D in dims:
            t, x = per_d.get(D, (None, None))
            cells += ["—" if t is None else f"{t:.0f}", "—" if x is None else f"{x:.2f}×"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    fig.tight_layout()
    plt.show()
    _md("× stage 5 = stage 5's time / the variant's time: below 1, the idea it lacks (or the "
        "alternative it takes) costs that much.\n\n" + "\n".join(lines))
    return rec


def stage5_variant_sass(head_dims=(64, 128), arch: str = "sm_90", dtype=torch.float16) -> list[dict]:
    """Each stage 5 variant (waterfall, leave-one-out, alternatives) compiled offline: its
    registers, spills and shared memory, and per K/V tile (the loop's common path, lib.sass.
    kv_loop) the instructions that tell the ideas apart. One dict per (variant, head dim)."""
    import stages.stage5 as s5
    from lib.sass import exp2_fixups, inspect_cubin, instruction_mix, kv_loop
    names = list(dict.fromkeys([n for n, _ in s5.waterfall()] + [n for n, _ in s5.leave_one_out()]
                               + list(s5.ALTERNATIVES)))
    out = []
    for D in head_dims:
        for name in names:
            ideas = s5.variant(name)
            c = next(iter(s5.compile_for(arch, dtype, D, ideas=ideas).values()))
            ins = inspect_cubin(c.cubin, arch, c.resource_usage())
            full = instruction_mix(ins.sass, full=True)
            loop = kv_loop(ins.sass)
            common = loop["common"]
            (p,) = ins.ptxas.values()
            out.append({
                "variant": name, "D": D, "registers": p["registers"], "spill_bytes": p["spill_stores"],
                "smem_bytes": s5.config(D, None, True, tuple(sorted(ideas.items())))["smem"],
                "LDGSTS.128": sum(n for op, n in full.items() if op.startswith("LDGSTS") and ".128" in op),
                "2-byte loads": sum(n for op, n in full.items() if op.startswith(("LDG.E.U16", "LD.E.U16"))),
                "BAR / tile": sum(y["op"] == "BAR" for y in loop["body"]),
                "LDSM / tile": sum(y["op"] == "LDSM" for y in common),
                "STS / tile": sum(y["op"] == "STS" for y in common),
                "exp2f fix-ups / tile": exp2_fixups(common),
                "LDL+STL / tile": sum(y["op"] in ("LDL", "STL") for y in common),
                "instructions / tile": len(common)})
    return out


def show_stage5_variant_sass(rows: list[dict]) -> None:
    """stage5_variant_sass's rows as one table per head dim."""
    cols = [k for k in rows[0] if k not in ("variant", "D")]
    for D in sorted({r["D"] for r in rows}):
        lines = ["| variant | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for r in rows:
            if r["D"] == D:
                lines.append(f"| {r['variant']} | " + " | ".join(f"{r[c]:,}" for c in cols) + " |")
        _md(f"**D {D}** (fp16, compiled offline; static counts: the K/V loop's instructions "
            "once each, the mask region left out)\n\n" + "\n".join(lines))


# --------------------------------------------------------------------------------------------
# Stage 5's notebook: the recorded shared-memory counters, the tile sweep, the recorded rows
# against the run's SDPA medians, and the variants' SASS steps (issue 13: analysis in lib/).

def show_shared_conflicts(layouts) -> dict:
    """The raw shared-memory counters of recorded ncu reports, one table row per layout and
    access (loads, stores): requests (shared-load requests count ldmatrix with the other shared
    loads), wavefronts (the passes the shared-memory pipe made), bank conflicts (the extra
    passes), and two figures derived from them: the conflict ways, wavefronts ÷ (wavefronts −
    conflicts), 1 = none; and wavefronts per request, which is 4 for a conflict-free
    ldmatrix.x4 (four 8×8 matrices). `layouts`: (name, ncu_report key) pairs. Prints each
    report's first line (command, commit, GPU, date); returns {name: report or None}."""
    def num(x, spec=","):
        return "—" if x is None else format(x, spec)

    lines = ["| layout | kernel duration | access | requests | wavefronts | bank conflicts "
             "| conflict ways | wavefronts per request | read from |", "|" + "---|" * 9]
    reps = {}
    for name, key in layouts:
        rep = reps[name] = ncu_report(key)
        if rep is None or not rep["kernels"]:
            lines.append(f"| {name} | not recorded |" + " — |" * 7)
            continue
        print(f"{name}: {rep['header']}")
        k = rep["kernels"][0]
        dur = k["metrics"].get("Duration")
        dur = f"{dur[0]:,.4g} {dur[1]}" if dur else "—"
        for kind in ("loads", "stores"):
            c = k["shared"][kind]
            if c is None:
                lines.append(f"| {name} | {dur} | {kind} | not measured |" + " — |" * 5)
                continue
            ways = "—" if c["ways"] is None else f"{c['ways']:.2f}-way"
            lines.append(f"| {name} | {dur} | {kind} | {num(c['requests'])} | {c['wavefronts']:,} "
                         f"| {c['conflicts']:,} | {ways} | {num(c['wavefronts_per_request'], '.2f')} "
                         f"| {c['source']} |")
    _md("*Recorded by Nsight Compute, not measured in this session.*\n\n" + "\n".join(lines))
    return reps


def tile_sweep_table(rec: dict) -> str:
    """The rows of a recorded tile sweep (tile_sweep) as a markdown table, fastest first per
    head dim and mask, the chosen tiles marked ★ and every row's speed against them."""
    rows = sorted(rec["rows"], key=lambda r: (r["D"], r["causal"], -r["tflops"]))
    lines = ["| D | causal | variant (BLOCK_Q, BLOCK_K, STAGES, WARP_Q) | µs | TFLOPS | vs chosen "
             "| registers | spill bytes | threads | smem bytes | check |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    best = {(r["D"], r["causal"]): r for r in rows if r["default"]}
    for r in rows:
        ref = best.get((r["D"], r["causal"]))
        vs = f"{ref['us'] / r['us']:.2f}×" if ref else "—"
        lines.append(f"| {r['D']} | {'yes' if r['causal'] else 'no'} | {'★ ' if r['default'] else ''}{r['variant']} "
                     f"| {r['us']:,.1f} | {r['tflops']:.0f} | {vs} | {r['registers']} | {r['spill_bytes']} "
                     f"| {r['threads']} | {r['smem_bytes']:,} | {'pass' if r['passed'] else '**FAIL**'} |")
    return "\n".join(lines)


def swizzle_cost(rec: dict) -> list[tuple[int, bool, float]]:
    """(D, causal, time of the 'no swizzle' row ÷ time of the chosen tiles) per recorded pair."""
    out = []
    for r in rec["rows"]:
        if "no swizzle" in r["variant"]:
            ref = next((x for x in rec["rows"] if x["default"] and x["D"] == r["D"]
                        and x["causal"] == r["causal"]), None)
            if ref:
                out.append((r["D"], r["causal"], r["us"] / ref["us"]))
    return out


def show_tile_sweep(stage: int) -> dict | None:
    """The recorded tile sweep of `stage` (scripts/tile_sweep.py): its provenance (stale when
    the stage's sources changed since), the table, the plot (lib.plots.plot_tile_sweep) and,
    per head dim and mask, what plain rows cost against the swizzle. Returns tile_sweep's
    record, or None (and says so) when none was recorded."""
    import matplotlib.pyplot as plt

    from lib.plots import plot_tile_sweep
    sweep = tile_sweep(stage)
    if sweep is None:
        print(f"no tile sweep of stage {stage} is recorded yet (python scripts/tile_sweep.py "
              "--record on a GPU): the measured cost of plain rows and of the other tile "
              "choices will appear here")
        return None
    e = sweep["env"]
    _md(f"*Recorded, not measured in this session* ({e['gpu']}, commit {e['commit'][:10]}, "
        f"{e['date']})" + (f" — **stale**: stage {stage}'s sources changed since" if sweep["stale"] else "")
        + "\n\n" + tile_sweep_table(sweep))
    plot_tile_sweep(sweep["rows"])
    plt.show()
    for D, causal, slow in swizzle_cost(sweep):
        print(f"D {D} {'causal' if causal else 'full'}: plain rows take {slow:.2f}x the time of "
              "the swizzled layout")
    return sweep


def print_stage5_variant_steps(rows: list[dict]) -> None:
    """From stage5_variant_sass's rows, per head dim: the instructions per tile from the
    stage-4-like build to stage 5 and what each waterfall step adds or removes, the two steps
    that remove the most (a prediction from counts), and the variants that spill in the loop."""
    import stages.stage5 as s5
    by = {(r["variant"], r["D"]): r for r in rows}
    steps = [s for s, _ in s5.waterfall()]
    full = steps[-1]   # the last step is the stage's own build
    for D in sorted({r["D"] for r in rows}):
        count = {s: by[s, D]["instructions / tile"] for s in steps}
        print(f"D {D}: instructions per tile {count['stage-4-like']} (stage-4-like) -> {count[full]} "
              f"(stage 5); " + "; ".join(f"{n}: {count[n] - count[p]:+d}" for p, n in zip(steps, steps[1:])))
        removed = sorted(steps[1:], key=lambda n: count[n] - count[steps[steps.index(n) - 1]])
        print(f"      predicted from the counts: the largest cuts per tile come from {removed[0]!r} "
              f"and {removed[1]!r}")
        spilled = [r["variant"] for r in rows if r["D"] == D and r["LDL+STL / tile"]]
        print(f"      spilling inside the loop: {', '.join(spilled) if spilled else 'none'}")


# --------------------------------------------------------------------------------------------
# Stage 6's notebook: the recorded schedule ablation (scripts/stage6_schedules.py, "stage6" in
# the results file) as tables, and the offline SASS of every schedule (issue 13: analysis in lib/).

STAGE6_SHAPES = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True),
                 (4, 16, 8192, 128, False), (4, 16, 8192, 128, True)]


def stage6_rows_table(rec: dict) -> str:
    """Every row of stage 6's schedule record (schedules, variants, tiles, exp2 polynomial,
    rescale), one markdown table, with both SDPA ratios from the same run."""
    lines = ["| shape | schedule / tiles | µs | TFLOPS | vs SDPA default | vs SDPA flash | check |",
             "|---|---|---|---|---|---|---|"]
    for r in rec["rows"]:
        lines.append(f"| B{r['B']} H{r['H']} S{r['S']} D{r['D']} {r.get('dtype', 'float16')} "
                     f"{'causal' if r['causal'] else 'full'} "
                     f"| {r['kind']}: {r['variant']}{' (default)' if r.get('default') else ''} "
                     f"| {r['us']:,.1f} | {r['tflops']:.0f} "
                     f"| {r['sdpa_us'] / r['us']:.2f}× | {r['sdpa_flash_us'] / r['us']:.2f}× "
                     f"| {'pass' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def stage6_schedule_rows(rec: dict, B, H, S, D, causal) -> list[dict]:
    """The fp16 rows of the schedule waterfall (kind "schedule") at one shape, in their order."""
    return [r for r in rec["rows"] if r["kind"] == "schedule" and r.get("dtype", "float16") == "float16"
            and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal)]


def stage6_steps_table(rec: dict) -> str:
    """Each waterfall step against the one before (fp16), per standard shape."""
    lines = ["| shape | step | µs | change vs previous step |", "|---|---|---|---|"]
    for B, H, S, D, causal in STAGE6_SHAPES:
        rows = stage6_schedule_rows(rec, B, H, S, D, causal)
        for prev, r in zip([None] + rows[:-1], rows):
            ch = "—" if prev is None else \
                f"{prev['us'] / r['us']:.2f}× ({'faster' if r['us'] < prev['us'] else 'slower'})"
            lines.append(f"| B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} | {r['variant']} "
                         f"| {r['us']:,.1f} | {ch} |")
    return "\n".join(lines)


# FlashAttention-3's own ablation (the paper, Table 2: B4 S8448 H16 D128, fp16, full attention,
# TFLOPS) and FlashAttention-4's sm90 kernel with and without its intra_wg_overlap flag (this
# project's anchor run, results/anchors/h100_fa4_sm90.json, B4 H16 S8192 D128 fp16).
FA3_TABLE2 = {"FlashAttention-3": 661, "without the GEMM-softmax pipelining": 582,
              "without warp specialization": 570}


def stage6_ablations_table(rec: dict, anchor_rows: list[dict]) -> str:
    """Stage 6's two FlashAttention-3 steps at B4 H16 S8192 D128 fp16 (full, causal), as ratios
    of its record's same-run medians, beside FlashAttention-3's Table 2 and FlashAttention-4's
    intra_wg_overlap flag: what overlapping the softmax with the products buys, and what the
    producer warpgroup (warp specialization) buys, in each."""
    lines = ["| what is taken away | stage 6, full | stage 6, causal | FlashAttention-3 (paper, Table 2) "
             "| FlashAttention-4 sm90 (anchor run), full / causal |", "|---|---|---|---|---|"]
    ours = {c: {r["variant"]: r["us"] for r in stage6_schedule_rows(rec, 4, 16, 8192, 128, c)} for c in (False, True)}
    fa4 = {x["causal"]: x["tflops"] for x in anchor_rows
           if (x["B"], x["H"], x["Sq"], x["D"], x["dtype"]) == (4, 16, 8192, 128, "float16")}

    def ratio(c, slow, fast):
        o = ours[c]
        return f"{o[slow] / o[fast]:.2f}× ({o[fast]:,.0f} against {o[slow]:,.0f} µs)" if slow in o and fast in o else "—"
    full3 = FA3_TABLE2["FlashAttention-3"]
    lines.append("| the softmax overlapped with the products (stage 6: + intra-warpgroup overlap against + ping-pong) "
                 f"| {ratio(False, '+ ping-pong', '+ intra-warpgroup overlap')} "
                 f"| {ratio(True, '+ ping-pong', '+ intra-warpgroup overlap')} "
                 f"| {full3 / FA3_TABLE2['without the GEMM-softmax pipelining']:.2f}× ({full3} against "
                 f"{FA3_TABLE2['without the GEMM-softmax pipelining']} TFLOPS) | "
                 + " / ".join(f"{fa4[c]['fa4_sm90'] / fa4[c]['fa4_sm90_no_intra_wg_overlap']:.2f}× "
                              f"({fa4[c]['fa4_sm90']} against {fa4[c]['fa4_sm90_no_intra_wg_overlap']})"
                              for c in (False, True) if c in fa4) + " |")
    lines.append("| warp specialization (stage 6: + intra-warpgroup overlap against no warp specialization) "
                 f"| {ratio(False, 'no warp specialization', '+ intra-warpgroup overlap')} "
                 f"| {ratio(True, 'no warp specialization', '+ intra-warpgroup overlap')} "
                 f"| {full3 / FA3_TABLE2['without warp specialization']:.2f}× ({full3} against "
                 f"{FA3_TABLE2['without warp specialization']} TFLOPS) | — |")
    return "\n".join(lines)


def stage6_repeat_rows(rows, B, H, S, D, causal, sms) -> list[dict]:
    """The fp16 rows of a schedule record that ran the default build, launched as a call is
    (stages/stage6.py call_schedule), at one shape: the head dim's default tiles (TILES), its
    EXP2_POLY and LAZY_RESCALE rows, and the default schedule's own row only where a call's launch
    is that schedule's (the waterfall's rows launch each schedule as named, which at some shapes
    is not how a call runs: another launch, not a repeat)."""
    import stages.stage6 as s6
    lazy = s6.LAZY_RESCALE[D]
    labels = {("tiles", str(s6.TILES[D])), ("exp2_poly", f"{s6.EXP2_POLY[D]}/8 of exp2 by polynomial"),
              ("rescale", {-1: "O rescaled every tile", 0: "O rescaled when a max grew"}.get(
                  lazy, f"O rescaled past 2^{lazy} growth"))}
    work = B * H * -(-S // (64 * s6.TILES[D][2]))
    if s6.call_schedule(D, causal, S, work, sms) == s6.default_schedule(D):
        labels.add(("schedule", s6.default_schedule(D)))
    return [r for r in rows if (r["kind"], r["variant"]) in labels and r.get("dtype", "float16") == "float16"
            and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal)]


def stage6_default_repeats(rec: dict, sms: int | None = None) -> str:
    """The rows of the record that ran the default build again, launched as a call is
    (stage6_repeat_rows): one kernel timed several times in one run. Their spread (slowest ÷
    fastest) is how far one timing moves: steps closer than that cannot be told apart by one
    timing each."""
    lines = ["| shape | repeats of the default build | fastest µs | slowest µs | spread |",
             "|---|---|---|---|---|"]
    for B, H, S, D, causal in STAGE6_SHAPES:
        us = [r["us"] for r in stage6_repeat_rows(rec["rows"], B, H, S, D, causal, sms or rec["env"]["sm_count"])]
        if us:
            lines.append(f"| B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} | {len(us)} "
                         f"| {min(us):,.1f} | {max(us):,.1f} | {100 * (max(us) / min(us) - 1):.1f}% |")
    return "\n".join(lines)


def stage6_schedule_sass(arch: str | None = None, dtype=torch.float16) -> str:
    """Every schedule of stage 6 compiled offline at D 64 and D 128 (no GPU needed), one markdown
    table: the registers ptxas gives a thread at launch, spill bytes, the count of HGMMA
    (wgmma), UTMALDG (TMA loads), SYNCS (mbarrier), HMMA (mma.sync) and LDL/STL (local memory)
    instructions, whether setmaxnreg is there, and whether ptxas warned that it serializes the
    wgmma (C7508, C7510, C7511, C7512, C7515)."""
    import stages.stage6 as s6
    from lib.sass import inspect_cubin, sass_text
    arch = arch or s6.ARCH
    serial = re.compile(r"C75(08|10|11|12|15)")
    lines = ["| D | schedule | registers (at entry) | spill bytes | HGMMA | UTMALDG | SYNCS | HMMA | LDL/STL "
             "| setmaxnreg | ptxas serializes wgmma |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for D in (64, 128):
        for name in s6.SCHEDULES:
            (c,) = s6.compile_for(arch, dtype, D, schedule=name).values()
            ins = inspect_cubin(c.cubin, arch, c.resource_usage())
            u = c.resource_usage()["attention_wgmma"]  # the module also holds the combine kernel
            lines.append(f"| {D} | {name} | {u['registers']} | {u['spill_stores']} | {ins.mix['HGMMA']} "
                         f"| {ins.mix['UTMALDG']} | {ins.mix['SYNCS']} | {ins.mix['HMMA']} "
                         f"| {ins.mix['LDL'] + ins.mix['STL']} "
                         f"| {'yes' if 'SETMAXREG' in sass_text(c.cubin) else 'no'} "
                         f"| {'**yes**' if serial.search(c.log) else 'no'} |")
    return "\n".join(lines)


def hgmma_forms(sass: str) -> list[str]:
    """The distinct HGMMA instructions of a SASS listing, register numbers replaced by R: the
    shapes and operand sources (gdesc: shared memory by descriptor; R: registers) it uses."""
    return sorted({re.sub(r"R\d+|UR\d+", "R", m.strip().split(";")[0].split("*/")[-1].strip())
                   for m in re.findall(r"HGMMA[^\n]*", sass)})



def kv_ring_table(stages: int = 2, positions: int = 6) -> str:
    """Stage 6's K (or V) ring, position by position, as the kernel computes it (stages/stage6.cu:
    load_tile and the consumers' waits): the buffer, its use, and the parity each side waits
    for. A table made from the kernel's formulas, not a measurement."""
    lines = ["| ring position `pos` | buffer `b = pos % STAGES` | use `u = pos / STAGES` | producer "
             "waits `empty[b]`, parity `(u & 1) ^ 1` | consumers wait `full[b]`, parity `u & 1` |",
             "|---|---|---|---|---|"]
    for pos in range(positions):
        b, u = pos % stages, pos // stages
        before = ("phase −1: complete from the start, no wait" if u == 0 else
                  f"phase {u - 1}, the release of position {pos - stages}")
        lines.append(f"| {pos} | {b} | {u} | {(u & 1) ^ 1} ({before}) | {u & 1} (phase {u}: its bytes) |")
    return "\n".join(lines)
