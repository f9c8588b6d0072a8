"""The journey notebook: every stage side by side, read from the recorded results file (the
rows and tables; the figures are lib.plots.plot_journey_*). lib.notebook re-exports these."""
from __future__ import annotations

from lib import results as R
from lib.notebook_common import _md, recorded_runs
from lib.reference import compulsory_intensity, stage1_intensity
from lib.results import sdpa_spread

# what `from lib.notebook_journey import *` (lib.notebook) re-exports: the tables and rows the
# journey's code cells use; the prose look-ups below are imported from this module by name
__all__ = ["R", "STAGE_MECHANISMS", "compulsory_intensity", "journey_facts", "journey_host_rows",
           "journey_panels", "journey_predictions", "journey_reading_table", "journey_stage_table",
           "journey_stages",
           "journey_sweep", "prediction_verdict", "recorded_label", "recorded_runs", "rows_at_shape",
           "sdpa_spread", "show_journey_host_table", "show_journey_prediction_table",
           "show_journey_roofline_table", "show_journey_speed_table", "stage1_intensity",
           "stage_colors"]


# --------------------------------------------------------------------------------------------
# the journey notebook: every stage side by side, read from the recorded results file
# (the plots are lib.plots.plot_journey_*; these gather the rows and make the tables)

def journey_stages(data: dict | None) -> tuple[list[int], dict]:
    """(stage numbers, {number: module}): the registered stages, plus any stage the results
    file has rows of (one recorded on another branch)."""
    import stages
    mods = {m.INFO.number: m for m in stages.all_stages()}
    return sorted(set(mods) | {r["stage"] for r in (data or {}).get("runs", [])}), mods


# the stages past the 16-bit forward (stages.BEYOND), and the record entry that holds each one's rows
BEYOND_ENTRIES = {7: "fp8_bench", 8: "backward"}


def journey_stage_table(data: dict | None) -> str:
    """Section 1's table, stage 0 to stage 8: title, what it adds, notebook, and the commit of its
    rows: the forward stages' benchmark rows, for stages 7 and 8 their record entry (BEYOND_ENTRIES)."""
    from pathlib import Path

    import stages
    numbers, mods = journey_stages(data)
    lines = ["| stage | title | adds | notebook | recorded |", "|---|---|---|---|---|"]
    for n in numbers + [n for n in BEYOND_ENTRIES if n not in numbers]:
        key = BEYOND_ENTRIES.get(n)
        rec = ((data or {}).get(key) or {}).get("env") if key else (data or {}).get("stages", {}).get(str(n))
        recorded = (f"commit {str(rec.get('commit', '?'))[:10]}, {rec.get('date', '?')}"
                    + (f" (`{key}`)" if key else "")) if rec else "not recorded yet"
        mod = mods.get(n) or (stages.get(n) if n in stages.BEYOND else None)
        if mod is None:
            lines.append(f"| {n} | {(rec or {}).get('title', f'stage {n}')} | (not registered in this "
                         f"checkout) | — | {recorded} |")
            continue
        i, nb = mod.INFO, Path(mod.INFO.notebook).name
        exists = (Path(__file__).resolve().parent.parent / i.notebook).exists()
        link = f"[{nb}]({nb})" if exists else f"{nb} (not written yet)"
        lines.append(f"| {n} | {i.title} | {i.adds} | {link} | {recorded} |")
    return "\n".join(lines)


def stage_colors(numbers) -> dict:
    """One matplotlib colour per stage, the same in every figure of a notebook."""
    return {n: f"C{i}" for i, n in enumerate(numbers)}


def recorded_label(data: dict | None) -> str:
    """A short provenance for figure titles and table captions: the GPU and the commit each
    stage's rows were recorded at (R.provenance, in the banner, has the whole environment)."""
    if not data:
        return "nothing recorded"
    e, groups = data["env"], {}
    for n, st in data.get("stages", {}).items():
        groups.setdefault(st.get("commit", e["commit"])[:10], []).append(int(n))
    when = "; ".join(f"{R._number_ranges(ns)} at commit {c}"
                     for c, ns in sorted(groups.items(), key=lambda kv: min(kv[1])))
    return f"recorded on {e['gpu']}, {when or 'commit ' + e['commit'][:10]}"


def rows_at_shape(suite: str, B: int, H: int, S: int, D: int, causal: bool,
                  dtype: str = "float16") -> tuple[dict, dict]:
    """The recorded rows at one shape (Sq = Sk = S, as many K/V heads as query heads):
    ({stage: row}, {stage: why it was skipped})."""
    rows, skipped = {}, {}
    for r in recorded_runs(suite=suite, dtype=dtype):
        if (r["B"], r["H"], r.get("Hkv", r["H"]), r["Sq"], r["Sk"], r["D"], r["causal"]) \
                == (B, H, H, S, S, D, causal):
            if r.get("skipped"):
                skipped[r["stage"]] = r["skipped"]
            else:
                rows[r["stage"]] = r
    return rows, skipped


def journey_panels(dtype: str = "float16") -> list[tuple]:
    """[(shape name, B, H, S, D, causal, {stage: row}, {stage: skipped})] at the standard
    shapes, full then causal, in the benchmark's order."""
    from lib.results import STANDARD_SHAPES
    return [(name, B, H, S, D, causal, *rows_at_shape("standard", B, H, S, D, causal, dtype))
            for name, B, H, S, D in STANDARD_SHAPES for causal in (False, True)]


def journey_sweep(dtype: str = "float16") -> dict:
    """{(D, causal): {S: ({stage: row}, {stage: skipped})}} of the recorded sweep (B·S fixed
    at SWEEP_TOKENS, H16)."""
    from lib.results import SWEEP_SEQS, SWEEP_TOKENS
    out = {}
    for D in sorted({r["D"] for r in recorded_runs(suite="sweep", dtype=dtype)}):
        for causal in (False, True):
            out[(D, causal)] = {S: rows_at_shape("sweep", SWEEP_TOKENS // S, 16, S, D, causal,
                                                 dtype) for S in SWEEP_SEQS}
    return out


def _ratio_cell(rows: dict, r: dict, field: str) -> str:
    """SDPA's median time at the shape ÷ the stage's; † and the row's own ratio when its own
    SDPA time is more than R.SDPA_OUTLIER off that median."""
    spread = sdpa_spread(rows.values(), field)
    if spread is None or not r.get(field):
        return "—"
    text = f"{spread[0] / r['us']:.3g}×"
    if abs(r[field] / spread[0] - 1) > R.SDPA_OUTLIER:
        text += f" † (own {r[field] / r['us']:.3g}×)"
    return text


def show_journey_speed_table(panels, numbers, note: str) -> None:
    """Every stage at every standard shape: µs, TFLOPS, the step over the previous stage, and
    the speed relative to SDPA's two backends (their median time over the rows at the shape)."""
    lines = ["| shape | mask | stage | µs | TFLOPS | × previous stage | × SDPA default "
             "| × SDPA flash |", "|---|---|---|---|---|---|---|---|"]
    for name, B, H, S, D, causal, rows, skipped in panels:
        for i, n in enumerate(numbers):
            head = f"| {name}: B{B} H{H} S{S} D{D} | {'causal' if causal else 'full'} | {n} |"
            if n not in rows:
                why = f"skipped: {skipped[n]}" if n in skipped else "not recorded yet"
                lines.append(f"{head} {why} | — | — | — | — |")
                continue
            r, prev = rows[n], rows.get(numbers[i - 1]) if i else None
            step = f"{prev['us'] / r['us']:.3g}×" if prev else "—"
            lines.append(f"{head} {r['us']:,.1f} | {r['tflops']:.3g} | {step} | "
                         f"{_ratio_cell(rows, r, 'sdpa_us')} | "
                         f"{_ratio_cell(rows, r, 'sdpa_flash_us')} |")
    _md(f"{note} SDPA's time: the median of the rows' own SDPA timings at that shape; † marks a "
        f"row whose own SDPA timing was more than {R.SDPA_OUTLIER:.0%} off it, with the ratio "
        "to its own.\n\n" + "\n".join(lines))


def show_journey_roofline_table(panels, ceil: dict, numbers, note: str) -> None:
    """How far each stage is from its roofs at the throughput shape (full mask): the
    attainable rate at the stage's intensity under each compute roof recorded."""
    from lib.plots import attainable_tflops
    name, B, H, S, D, _, rows, skipped = next(p for p in panels
                                              if p[0] == "throughput" and not p[5])
    roofs = [k for k in ("matmul_TFLOPS", "hmma_TFLOPS", "fp32_TFLOPS") if ceil.get(k)]
    names = {"matmul_TFLOPS": "tensor-core (matmul)", "hmma_TFLOPS": "mma.sync",
             "fp32_TFLOPS": "FP32"}
    head = ["stage", "bytes counted", "FLOP/byte", "TFLOPS"]
    for k in roofs:
        head += [f"{names[k]} roof TFLOPS", "% of it"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in numbers:
        if n not in rows:
            why = f"skipped: {skipped[n]}" if n in skipped else "not recorded yet"
            lines.append(f"| {n} | — | — | {why} |" + " — | — |" * len(roofs))
            continue
        points = [("compulsory", compulsory_intensity(B, H, S, D, False))]
        if n == 1 and stage1_intensity(B, H, S, D, False):
            points.append(("compulsory + S and P", stage1_intensity(B, H, S, D, False)))
        for what, x in points:
            y = rows[n]["tflops"]
            cells = [str(n), what, f"{x:,.0f}", f"{y:.3g}"]
            for k in roofs:
                roof = attainable_tflops(ceil, x, k)
                cells += [f"{roof:,.0f}", f"{100 * y / roof:.2g}%" if y <= roof else "above it"]
            lines.append("| " + " | ".join(cells) + " |")
    rates = [f"copy {ceil['copy_GBps']:,.0f} GB/s",
             f"matmul ({ceil.get('matmul_dtype', '?')} {ceil.get('matmul_shape', '')}) "
             f"{ceil['matmul_TFLOPS']:,.0f} TFLOPS"]
    if ceil.get("fp32_TFLOPS"):
        rates.append(f"FP32 {ceil['fp32_TFLOPS']:,.1f} TFLOPS")
    rates.append(f"mma.sync {ceil['hmma_TFLOPS']:,.0f} TFLOPS" if ceil.get("hmma_TFLOPS")
                 else "mma.sync rate not recorded yet")
    _md(f"{note} B{B} H{H} S{S} D{D}, fp16, full mask; ceilings: {', '.join(rates)}.\n\n"
        + "\n".join(lines))


def journey_predictions(numbers, mods, panels) -> list[tuple]:
    """Each stage's INFO.prediction next to the recorded measurement at the throughput shape
    (full mask): [(stage, what, (low, high) or None, basis, measured or None, why not)]. The
    measurement is TFLOPS, or the previous stage's time ÷ this one's for a speed-up."""
    from lib.notebook_common import ceilings
    *_, rows, skipped = next(p for p in panels if p[0] == "throughput" and not p[5])
    ceil = ceilings()
    out = []
    for i, n in enumerate(numbers):
        pred = dict(mods[n].INFO.prediction) if n in mods else {}
        if "of_matmul_ceiling" in pred and ceil:  # shares of the ceiling: × the recorded one
            pred["tflops"] = tuple(x * ceil["matmul_TFLOPS"] for x in pred.pop("of_matmul_ceiling"))
        kind = next((k for k in ("tflops", "speedup") if k in pred), None)
        prev = numbers[i - 1] if i else None
        measured, why = None, None
        if n not in rows:
            why = f"skipped: {skipped[n]}" if n in skipped else "not recorded yet"
        elif kind == "speedup":
            if prev in rows:
                measured = rows[prev]["us"] / rows[n]["us"]
            else:
                why = f"stage {prev} not recorded yet" if prev is not None else "no previous stage"
        else:
            measured = rows[n]["tflops"]
        what = {"tflops": "TFLOPS", "speedup": f"speed-up over stage {prev}"}.get(kind)
        if kind is None:  # no prediction: the measurement stands alone, as TFLOPS
            what, measured = "—", rows[n]["tflops"] if n in rows else None
        out.append((n, what, pred.get(kind), pred.get("basis", "—"), measured, why))
    return out


def prediction_verdict(rng, measured) -> tuple[str, str]:
    """(inside the predicted range?, measured ÷ each end of it, low end first)."""
    if rng is None or measured is None:
        return "—", "—"
    low, high = rng
    if low == high:
        return "— (a single value)", f"{measured / low:.2g}"
    inside = "yes" if low <= measured <= high else \
        ("no, below" if measured < low else "no, above")
    return inside, f"{measured / low:.2g}, {measured / high:.2g}"


def show_journey_prediction_table(predictions, note: str) -> None:
    """journey_predictions as a table."""
    lines = ["| stage | predicts | predicted | basis | measured | inside the predicted range? "
             "| measured ÷ predicted |", "|---|---|---|---|---|---|---|"]
    for n, what, rng, basis, measured, why in predictions:
        unit = "×" if what.startswith("speed-up") else ""
        p = "—" if rng is None else (f"{rng[0]:.3g}{unit}" if rng[0] == rng[1]
                                     else f"{rng[0]:.3g}{unit} – {rng[1]:.3g}{unit}")
        m = why if measured is None else \
            (f"{measured:.3g}{unit}" if rng else f"({measured:.3g} TFLOPS, no prediction)")
        inside, ratio = prediction_verdict(rng, measured)
        lines.append(f"| {n} | {what} | {p} | {basis} | {m} | {inside} | {ratio} |")
    _md(f"{note} B16 H16 S2048 D64, fp16, full mask.\n\n" + "\n".join(lines))


def journey_facts(data: dict, numbers, panels, predictions) -> list[str]:
    """The facts the journey's conclusion rests on, computed from the recorded rows at the
    throughput shape (full mask) and the recorded ceilings."""
    from lib.results import STANDARD_SHAPES
    name, B, H, S, D, _, rows, _ = next(p for p in panels if p[0] == "throughput" and not p[5])
    if len(rows) < 2:
        return ["fewer than two stages recorded at the throughput shape: nothing to compare yet"]
    order = [n for n in numbers if n in rows]
    first, last = order[0], order[-1]
    facts = [f"at B{B} H{H} S{S} D{D} fp16 (full), stage {last} is "
             f"{rows[first]['us'] / rows[last]['us']:,.0f}× faster than stage {first} "
             f"({rows[first]['tflops']:.3g} → {rows[last]['tflops']:.3g} TFLOPS)"]
    steps = [(rows[a]["us"] / rows[b]["us"], a, b) for a, b in zip(numbers, numbers[1:])
             if a in rows and b in rows]
    if steps:
        big = max(steps)
        facts.append(f"the largest single step is stage {big[1]} → {big[2]}, {big[0]:.3g}×; "
                     "the other steps: " + ", ".join(f"{a} → {b} {s:.3g}×"
                                                    for s, a, b in steps if (s, a, b) != big))
    for field, label in (("sdpa_us", "SDPA default"), ("sdpa_flash_us", "SDPA flash")):
        spread = sdpa_spread(rows.values(), field)
        if spread:
            facts.append(f"stage {last} runs at {spread[0] / rows[last]['us']:.2g}× the speed of "
                         f"{label} there (SDPA's median time {spread[0]:,.0f} µs)")
    ceil = data.get("ceilings")
    if ceil:
        ridge = ceil["matmul_TFLOPS"] / (ceil["copy_GBps"] / 1e3)
        xs = [compulsory_intensity(b, h, s, d, c) for _, b, h, s, d in STANDARD_SHAPES
              for c in (False, True)]
        facts.append(f"{sum(x > ridge for x in xs)} of the {len(xs)} standard shape and mask "
                     f"pairs have a compulsory intensity above the tensor-core ridge point "
                     f"({ridge:,.0f} FLOP/byte)")
        best = max(rows[n]["tflops"] for n in order)
        facts.append(f"the fastest recorded stage there reaches {best / ceil['matmul_TFLOPS']:.1%} "
                     f"of the measured matmul rate ({ceil['matmul_TFLOPS']:,.0f} TFLOPS)")
    judged = [prediction_verdict(rng, m)[0] for _, _, rng, _, m, _ in predictions
              if rng is not None and m is not None and rng[0] < rng[1]]
    if judged:
        facts.append(f"{sum(v == 'yes' for v in judged)} of {len(judged)} predicted ranges with "
                     "a recorded measurement contain it (single-value predictions not counted)")
    return facts


def journey_host_rows(dtype: str = "float16") -> tuple[tuple, dict]:
    """The latency shape and its recorded host times: ((B, H, S, D), {causal: {stage: row}})."""
    from lib.results import STANDARD_SHAPES
    _, B, H, S, D = next(s for s in STANDARD_SHAPES if s[0] == "latency")
    host = {causal: {n: r for n, r in rows_at_shape("standard", B, H, S, D, causal, dtype)[0]
                     .items() if r.get("host_us") is not None} for causal in (False, True)}
    return (B, H, S, D), host


def show_journey_host_table(shape, host: dict, targets: dict, pending: dict, note: str) -> None:
    """Host µs/call against GPU µs/call per stage at one shape, what the caller waits on (the
    GPU when host µs/call is within 10% of GPU µs/call), and the ratio to SDPA's host time in
    the same run, judged against `targets` ({stage: largest ratio})."""
    B, H, S, D = shape
    lines = ["| stage | mask | host µs/call | GPU µs/call | host ÷ GPU | the caller waits on "
             "| SDPA host µs/call (same run) | × SDPA's host | target |", "|---" * 9 + "|"]
    for causal, rows in host.items():
        for n, r in sorted(rows.items()):
            gpu, sd = r.get("host_gpu_us"), r.get("sdpa_host_us")
            x = r["host_us"] / sd if sd else None
            waits = "—" if not gpu else \
                "the GPU (kernel)" if r["host_us"] <= 1.1 * gpu else "the host (launch path)"
            target = "—" if n not in targets or x is None else \
                f"≤ {targets[n]:g}×: **{'met' if x <= targets[n] else 'missed'}**"
            cells = [str(n), "causal" if causal else "full", f"{r['host_us']:,.1f}",
                     f"{gpu:,.1f}" if gpu else "—", f"{r['host_us'] / gpu:.2f}" if gpu else "—",
                     waits, f"{sd:,.1f}" if sd else "—", "—" if x is None else f"{x:.2f}×",
                     target]
            lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- **stage {n}**: sources changed since this record, re-record pending — "
             f"{pending[str(n)]['why']}" for n in targets if str(n) in pending]
    calls = next(r for rows in host.values() for r in rows.values()).get("host_calls", "many")
    _md(f"{note} B{B} H{H} S{S} D{D}, fp16; host µs/call over {calls} back-to-back calls.\n\n"
        + "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else ""))


# --------------------------------------------------------------------------------------------
# The journey's last reading: one row per stage — the idea, its measured step, and where the
# mechanism's evidence is (the stage's own notebook).

STAGE_MECHANISMS = {
    1: "tensor cores (WMMA) for Q·Kᵀ and P·V, S and P still written to memory between them: the "
       "bytes against the tensor time counted in its §2, the memory throughput ncu measured in §7",
    2: "one fused kernel, S and P kept on the SM, the online softmax: the compulsory bytes against "
       "the tensor time in its §2, ncu's memory throughput falling in §7",
    3: "the softmax's row reductions by warp shuffles instead of shared memory: the serial "
       "instruction chain per tile counted in the SASS (its §2), cycles per issued instruction "
       "from ncu (§7)",
    4: "larger tiles, fewer K/V loads per row; a branch per column in the softmax costs back what "
       "the loads save at D 64: SASS counts per row and key, ncu's occupancy and bank conflicts (§8)",
    5: "16-byte asynchronous copies, ldmatrix from swizzled shared memory, a multi-stage pipeline: "
       "bank conflicts measured with ncu, each idea added and left out in its waterfall",
    6: "wgmma and TMA, a producer warpgroup, ping-pong turns and the softmax overlapped with the "
       "products: the schedule waterfall in interleaved rounds (§6), the tensor cores' share of the "
       "period from the timeline stamps (§7)",
    7: "both products in e4m3 at twice the 16-bit tensor rate, bound by the exponentials it does not "
       "speed up: the count in its §2, timing against stage 6 in §8, what did not help in §9",
    8: "dK and dV held per key block, dQ summed by the copy engine's bulk reductions, loads by TMA: "
       "the count in its §2, timing against SDPA's backward in §5, training in §6",
}


def journey_reading_table(data: dict) -> str:
    """A markdown table, one row per stage after 0: its idea (INFO.title), its step at the
    throughput shape (D 64) and the long shape (D 128), fp16, full mask — each stage's speed
    against SDPA's default backend in its own run, divided by the previous stage's (so a run's
    pace cancels out; stages recorded in different runs are compared through SDPA) — and the
    mechanism with the notebook section that holds its evidence. For stage 6 the tensor cores'
    share of the key-tile period with and without the overlap is read from its timeline."""
    import stages
    from lib.plots_stage6 import timeline_tensor_share
    rows = {}
    for r in R.standard_runs(data):
        if r.get("skipped") or r["dtype"] != "float16" or r["causal"] or not r.get("sdpa_us"):
            continue
        key = (r["B"], r["H"], r["Sq"], r["D"])
        if key in ((16, 16, 2048, 64), (4, 16, 8192, 128)):
            rows[r["stage"], r["D"]] = r["sdpa_us"] / r["us"]

    def step(n, D):
        a, b = rows.get((n - 1, D)), rows.get((n, D))
        return f"{b / a:.2f}×" if a and b else "—"
    extra = ""
    tl = (data.get("stage6") or {}).get("timeline")
    if tl:
        import stages.stage6 as s6
        share = timeline_tensor_share(tl, s6.TILES[tl["D"]][0])
        on, off = share.get("+ intra-warpgroup overlap"), share.get("+ ping-pong")
        if on and off:
            extra = f" ({on['share']:.0%} with the overlap, {off['share']:.0%} without, at D {tl['D']})"
    lines = ["| stage | the idea | step at D 64 (B16 H16 S2048) | step at D 128 (B4 H16 S8192) | mechanism, and where its evidence is |",
             "|---|---|---|---|---|"]
    for n in sorted(n for n in STAGE_MECHANISMS if n <= 6):   # 7 and 8 below, from their own entries
        mech = STAGE_MECHANISMS[n] + (extra if n == 6 else "")
        lines.append(f"| {n} | {stages.get(n).INFO.title} | {step(n, 64)} | {step(n, 128)} | {mech} |")
    shapes = {64: (16, 16, 2048, 64), 128: (4, 16, 8192, 128)}
    fp8 = {(r["B"], r["H"], r["S"], r["D"]): r for r in (data.get("fp8_bench") or {}).get("rows", [])
           if not r["causal"]}
    bwd = {(r["B"], r["H"], r["S"], r["D"]): r for r in (data.get("backward") or {}).get("rows", [])
           if not r["causal"] and r["dtype"] == "float16"}

    def step7(D):   # stage 6's time ÷ the FP8 kernel's, timed in the same rounds: the same step as above
        r = fp8.get(shapes[D])
        return f"{r['us']['stage 6'] / r['us']['stage 7 kernel']:.2f}× (e4m3 ÷ bf16 stage 6, same rounds)" if r else "—"

    def step8(D):   # no backward before it: its own rate, and against FlashAttention-2's backward
        r = bwd.get(shapes[D])
        return (f"— (a backward: {r['tflops']:.0f} TFLOPS at 2.5 × the forward's FLOPs, "
                f"{r['sdpa_flash_us'] / r['us']:.2f}× FlashAttention-2's backward)") if r else "—"
    for n, rows_n, step_n in ((7, fp8, step7), (8, bwd, step8)):
        if rows_n:
            lines.append(f"| {n} | {stages.get(n).INFO.title} | {step_n(64)} | {step_n(128)} | {STAGE_MECHANISMS[n]} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Look-ups for the journey's prose cells (lib.prose): each sentence that quotes a measured figure
# reads it here from the record, so a re-record rewrites the sentence.

def _rec() -> dict:
    from lib.prose import record
    return record()


def shape_of(shape: str) -> tuple:
    """(B, H, S, D) of a named standard shape (lib.prose.shape_dims)."""
    from lib.prose import shape_dims
    return shape_dims(shape)


def std_rows(shape: str, causal: bool = False) -> dict:
    """{stage: row}: the record's fp16 rows at a named standard shape and mask."""
    B, H, S, D = shape_of(shape)
    return {r["stage"]: r for r in R.standard_runs(_rec())
            if not r.get("skipped") and r["dtype"] == "float16"
            and (r["B"], r["H"], r.get("Hkv", r["H"]), r["Sq"], r["Sk"], r["D"], r["causal"])
            == (B, H, H, S, S, D, causal)}


def row(stage: int, shape: str, causal: bool = False) -> dict:
    return std_rows(shape, causal)[stage]


def sdpa_median(shape: str, causal: bool = False, field: str = "sdpa_us") -> float:
    """SDPA's time at a shape as the speed table takes it: the median of the rows' own timings."""
    return sdpa_spread(std_rows(shape, causal).values(), field)[0]


def vs_sdpa(stage: int, shape: str, causal: bool = False, field: str = "sdpa_us") -> float:
    """The speed table's '× SDPA': SDPA's median time at the shape ÷ the stage's time."""
    return sdpa_median(shape, causal, field) / row(stage, shape, causal)["us"]


def vs_own_sdpa(stage: int, shape: str, causal: bool = False, field: str = "sdpa_us") -> float:
    """The stage's speed against the SDPA timing of its own run (lib.prose.vs_own_sdpa)."""
    from lib.prose import vs_own_sdpa
    return vs_own_sdpa(row(stage, shape, causal), field)


def both_masks(f, *args, **kw) -> list:
    """[f(*args, causal=False), f(*args, causal=True)]: a figure over both masks, for span()."""
    return [f(*args, causal=c, **kw) for c in (False, True)]


def dur(t_us: float) -> str:
    """A time in the unit that reads best: '560 µs', '3.47 ms', '630 ms', '5.2 s'."""
    from lib.prose import _num
    if t_us >= 1e6:
        return _num(t_us / 1e6, 1) + " s"
    if t_us >= 1e3:
        return _num(t_us / 1e3) + " ms"
    return _num(t_us) + " µs"


def stage_step(stage: int, shape: str, causal: bool = False, since: int | None = None) -> float:
    """The previous stage's time (or stage `since`'s) ÷ this stage's, at one shape."""
    rows = std_rows(shape, causal)
    return rows[stage - 1 if since is None else since]["us"] / rows[stage]["us"]


def sdpa_strays() -> list[str]:
    """The speed table's † rows: where a row's own SDPA timing is more than R.SDPA_OUTLIER off
    the median at its shape, as 'stage N, shape mask (backend)'."""
    out = []
    for name, *_ in R.STANDARD_SHAPES:
        for causal in (False, True):
            rows = std_rows(name, causal)
            for field, backend in (("sdpa_us", "default"), ("sdpa_flash_us", "flash")):
                med = sdpa_spread(rows.values(), field)[0]
                out += [f"stage {n} at the {name} shape, {'causal' if causal else 'full'} ({backend})"
                        for n, r in sorted(rows.items()) if abs(r[field] / med - 1) > R.SDPA_OUTLIER]
    return out


def launch_gap(call: str = "SDPA default", shape: str = "latency", causal: bool = False) -> dict:
    """One row of the record's launch-gap comparison (scripts/launch_gap.py): a call timed
    the old way (start event, then launch: 'old_us') and with the GPU held ('held_us')."""
    return next(r for r in _rec()["launch_gap"]["rows"]
                if (r["call"], r["shape"], r["causal"]) == (call, shape, causal))


def unheld_gap(shapes=("throughput", "long")) -> float:
    """The largest |old ÷ held − 1| of the launch-gap comparison at `shapes`: how far the two
    ways of timing part where the GPU work outlasts the launch."""
    return max(abs(r["old_us"] / r["held_us"] - 1) for r in _rec()["launch_gap"]["rows"]
               if r["shape"] in shapes)


# Per-clock peaks of one H100 SM (NVIDIA's H100 whitepaper and the CUDA C++ Programming Guide's
# throughput table): dense fp16/bf16 tensor-core FLOPs, and MUFU.EX2 results.
SM_FLOPS_PER_CLOCK, SM_EX2_PER_CLOCK = 4096, 16


def ceiling_clocks() -> dict:
    """The record's ceilings read as clocks: the clock at which the measured matmul rate is the
    tensor cores' per-clock peak, the clock at which the measured MUFU.EX2 rate is 16 per SM per
    clock, and the exponential unit's cap on attention at D 64 (one 2^x per 4·D FLOPs)."""
    c, sms = _rec()["ceilings"], _rec()["env"]["sm_count"]
    return {"matmul": c["matmul_TFLOPS"], "matmul_min": c["matmul_TFLOPS_min"],
            "matmul_max": c["matmul_TFLOPS_max"], "ex2_Gops": c["mufu_ex2_Gops"],
            "matmul_GHz": c["matmul_TFLOPS"] * 1e3 / (SM_FLOPS_PER_CLOCK * sms),
            "ex2_GHz": c["mufu_ex2_Gops"] / (SM_EX2_PER_CLOCK * sms),
            "ex2_cap_d64": c["mufu_ex2_Gops"] * 4 * 64 / 1e3}


def sdpa_tflops_median(shape: str, causal: bool = False) -> float:
    """The black line of the share-of-the-ceiling figure: the median of the rows' SDPA TFLOPS."""
    sd = sorted(r["sdpa_tflops"] for r in std_rows(shape, causal).values() if r.get("sdpa_tflops"))
    return sd[len(sd) // 2]


def anchor_ratio(shape: str, who: str = "fa4_sm90") -> float:
    """results/anchors/h100_fa4_sm90.json (another run, same GPU model): `who` ÷ SDPA default
    in TFLOPS at a standard shape, full mask, fp16."""
    import json
    B, H, S, D = shape_of(shape)
    rows = json.loads((R.RESULTS_DIR / "anchors" / "h100_fa4_sm90.json").read_text())["rows"]
    t = next(a["tflops"] for a in rows if (a["B"], a["H"], a["Sq"], a["D"], a["causal"], a["dtype"])
             == (B, H, S, D, False, "float16"))
    return t[who] / t["sdpa_default"]


def widest_rounds(shape: str, causal: bool = False) -> tuple:
    """(variant, fastest round µs, slowest round µs) of the schedule record's variant whose
    rounds spread the most at a shape (the purple bars of the share-of-the-ceiling figure)."""
    B, H, S, D = shape_of(shape)
    rows = [r for r in _rec()["stage6"]["rows"] if r["kind"] == "schedule"
            and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal)]
    r = max(rows, key=lambda r: max(r["us_rounds"]) / min(r["us_rounds"]))
    return r["variant"], min(r["us_rounds"]), max(r["us_rounds"])


def fp8_row(shape: str, causal: bool = False) -> dict:
    """The FP8 benchmark's row (scripts/fp8_bench.py) at a standard shape."""
    B, H, S, D = shape_of(shape)
    return next(r for r in _rec()["fp8_bench"]["rows"]
                if (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal))


def fp8_vs_stage6(shape: str, causal: bool = False) -> float:
    us = fp8_row(shape, causal)["us"]
    return us["stage 6"] / us["stage 7 kernel"]


def backward_ratios(D: int, field: str = "sdpa_flash_us") -> list[float]:
    """Stage 8's speed against one SDPA backward (FLASH: FlashAttention-2's; default: cuDNN's)
    over the record's dtypes and masks at head dim D."""
    return [r[field] / r["us"] for r in _rec()["backward"]["rows"] if r["D"] == D and r.get(field)]


def backward_row(shape: str, causal: bool = False, dtype: str = "float16") -> dict:
    """Stage 8's row of the backward record (scripts/backward_bench.py) at a standard shape."""
    B, H, S, D = shape_of(shape)
    return next(r for r in _rec()["backward"]["rows"]
                if (r["B"], r["H"], r["S"], r["D"], r["causal"], r["dtype"]) == (B, H, S, D, causal, dtype))


def generate_ratios() -> list[float]:
    """generate()'s time per token, each stage's ÷ SDPA's in the same rounds, over every row."""
    return [r["ms_per_token"] / r["sdpa_ms_per_token"] for r in _rec()["generate"]["rows"]]


def entry(key: str) -> dict:
    """The env of one part of the record (its commit, date, GPU), for lib.prose.record_name."""
    return _rec()[key]["env"]


def time_us(stage: int, shape: str, causal: bool = False) -> float:
    """A stage's recorded time at a named standard shape (fp16), µs."""
    return row(stage, shape, causal)["us"]


def stages_record_name(numbers=None) -> str:
    """How prose names the record's benchmark rows of several stages, each group of stages with
    the commit that recorded it: 'the H100 record (stage 0 at commit f1ddaac; stages 1, 5 at
    dd242e6; stage 6 at 9bd1b67; 2026-11-26)'. `numbers`: the stages (default: every one)."""
    from lib.prose import gpu_short
    data = _rec()
    env, st = data["env"], data.get("stages", {})
    numbers = sorted(int(n) for n in st) if numbers is None else sorted(numbers)
    groups, dates = {}, set()
    for n in numbers:
        e = st.get(str(n), env)
        groups.setdefault(str(e.get("commit", env["commit"]))[:7], []).append(n)
        dates.add(str(e.get("date", env["date"]))[:10])
    parts = []
    for i, (commit, ns) in enumerate(sorted(groups.items(), key=lambda kv: min(kv[1]))):
        text = R._number_ranges(ns)
        parts.append(f"{text} at {'commit ' if i == 0 else ''}{commit}")
    when = " to ".join(sorted({min(dates), max(dates)}))
    return f"the {gpu_short(env['gpu'])} record ({'; '.join(parts)}; {when})"
