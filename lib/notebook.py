"""Helpers the notebooks share: the mode banner, a stage's source and its diff against the
previous stage, checks on several shapes, live timings, and recorded tables."""
from __future__ import annotations

import difflib
import re
from pathlib import Path

import torch

from lib import results as R
from lib.inputs import DTYPE_NAMES
from lib.reference import check_attention, compulsory_intensity, stage1_intensity  # noqa: F401
from lib.results import sdpa_spread  # noqa: F401  (the notebooks import these from here too)
from lib.sass import innermost_loops  # noqa: F401
from lib.simulator import HAS_GPU, banner

ROOT = Path(__file__).resolve().parent.parent


def _md(text: str):
    from IPython.display import Markdown, display
    display(Markdown(text))


def show_banner() -> None:
    """First cell of every notebook: which mode this is, and where recorded numbers come from."""
    lines = [f"**{banner()}**"]
    data = R.load()
    if data:
        lines.append(f"Recorded results: {R.provenance(data)}")
    _md("\n\n".join(lines))


def show_source(path: str, start: str | None = None, end: str | None = None) -> None:
    """Show a file (or the part from the line containing `start` up to, not including, the
    line containing `end`), read from the repository, so the notebook never drifts from it."""
    text = (ROOT / path).read_text()
    lines = text.splitlines()
    a = next((i for i, ln in enumerate(lines) if start in ln), 0) if start else 0
    b = next((i for i, ln in enumerate(lines[a + 1:], a + 1) if end in ln), len(lines)) \
        if end else len(lines)
    lang = "cuda" if path.endswith((".cu", ".cuh")) else "python"
    _md(f"`{path}` (lines {a + 1}–{b})\n```{lang}\n" + "\n".join(lines[a:b]) + "\n```")


def show_diff(old: str, new: str) -> None:
    """Unified diff of two source files of the repository."""
    d = difflib.unified_diff((ROOT / old).read_text().splitlines(),
                             (ROOT / new).read_text().splitlines(), old, new, lineterm="", n=2)
    _md("```diff\n" + "\n".join(d) + "\n```")


def check_shapes(attention, shapes, dtypes=(torch.float16,), hkv=None):
    """Run `attention` on fresh random inputs for each (B, H, Sq, Sk, D, causal) and dtype
    (with `hkv` K/V heads when given: grouped-query inputs), show one table of every case, and
    return the list of lib.reference.Check. Failures are listed again under the table."""
    checks, rows = [], []
    for B, H, Sq, Sk, D, causal in shapes:
        for dtype in dtypes:
            kw = {"Hkv": hkv} if hkv else {}
            c = check_attention(attention, B, H, Sq, Sk, D, dtype=dtype, causal=causal, **kw)
            checks.append(c)
            heads = f"H{H}" + (f" H_kv{hkv}" if hkv else "")
            rows.append(f"| B{B} {heads} Sq{Sq} Sk{Sk} D{D} | {DTYPE_NAMES[dtype]} | "
                        f"{'causal' if causal else 'full'} | {c.max_abs_err:.2e} | "
                        f"{c.tolerance:.2e} | {c.max_abs_diff_sdpa:.2e} | "
                        f"{'pass' if c.passed else '**FAIL**'} |")
    show_check_table(rows)
    for c, r in zip(checks, rows):
        if not c.passed:
            print("FAIL:", r, c.summary())
    return checks


def show_check_table(rows) -> None:
    """One table for a notebook's correctness cases (rows as check_shapes formats them)."""
    _md("| case | dtype | mask | max abs error vs reference | bound (2× SDPA's + rounding) "
        "| max abs diff vs SDPA | result |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows))


def verdict(checks) -> None:
    """The line nbval checks: identical in every mode, so it can be compared. The bound is
    lib.reference's: max|out − ref| ≤ 2·max|SDPA − ref| + the output dtype's rounding, with a
    float64 reference (the form of FlashAttention's tests, which compare against a naive
    low-precision PyTorch attention with an fp32 reference; ours is stricter)."""
    if not checks:  # nothing measured here and nothing recorded: that is not a pass
        print("verdict: FAIL — nothing was checked")
        return
    bad = sum(not c.passed for c in checks)
    print("verdict: PASS — every case within the error bound" if not bad
          else f"verdict: FAIL — {bad} case(s) outside the bound")


def recorded_runs(stage: int | None = None, suite: str | None = "standard",
                  dtype: str | None = "float16") -> list[dict]:
    """The recorded rows of `stage` (every stage: None) in `suite` (every suite: None) and
    `dtype` (every dtype: None). float16 by default: a stage may have rows in several dtypes,
    and a reader matching rows by stage, shape and mask would otherwise mix them."""
    data = R.load()
    if not data:
        return []
    return [r for r in data["runs"] if suite in (None, r.get("suite", "standard"))
            and (stage is None or r["stage"] == stage) and dtype in (None, r["dtype"])]


def show_recorded(stage: int | None = None, suite: str = "standard",
                  dtype: str | None = "float16") -> list:
    """The recorded rows of `stage` (every stage: None) in `suite` and `dtype` (every dtype:
    None; one table each), labelled with their device, dates and commits. The SDPA ratios use
    the median SDPA time of each shape over every stage's rows (R.sdpa_medians), not a row's own
    SDPA timing, which may be an outlier: a row whose own was more than R.SDPA_OUTLIER off is
    marked † and listed below, as is a row whose timing rounds disagreed (‡). Returns the rows."""
    data = R.load()
    if not data:
        print("no recorded results yet: run `python -m lib.bench --record` on a GPU")
        return []
    every = recorded_runs(None, suite, dtype)
    runs = [r for r in every if stage is None or r["stage"] == stage]
    if not runs:
        print(f"no recorded {suite} rows of stage {stage} yet: run `python -m lib.bench "
              "--record` on a GPU")
        return []
    medians = R.sdpa_medians(every)
    peak = (data.get("ceilings") or {}).get("matmul_TFLOPS")
    held = R.held_sdpa(data)
    notes = R.table_notes(runs, medians, data)
    _md(f"*Recorded, not measured in this session* ({suite} suite). "
        f"{R.provenance(data, sorted({r['stage'] for r in runs}))} "
        f"{R.ratio_legend('every stage’s rows', runs)}\n\n"
        + R.markdown_table(runs, peak, medians, held)
        + "".join(f"\n\n{n}" for n in notes))
    return runs


def gpu_only(what: str) -> bool:
    """True when a GPU is here; otherwise say that this cell is skipped and why."""
    if not HAS_GPU:
        print(f"(no GPU in this session: {what} skipped; recorded figures are shown below)")
    return HAS_GPU


def show_recorded_plot(suffix: str = "") -> None:
    """The recorded plot results/<gpu><suffix>.png (written by `python -m lib.bench --record`),
    labelled as recorded; a note when there is none."""
    data = R.load()
    path = R.RESULTS_DIR / f"{R.gpu_slug(data['env']['gpu'])}{suffix}.png" if data else None
    if path is None or not path.exists():
        print(f"no recorded plot results/<gpu>{suffix}.png yet: run "
              "`python -m lib.bench --record` on a GPU")
        return
    from IPython.display import Image, display
    _md(f"*Recorded, not measured in this session:* `{path.relative_to(ROOT)}` "
        f"({data['env']['gpu']}, commit {data['env']['commit'][:10]}, {data['env']['date']})")
    display(Image(filename=str(path)))


def ceilings() -> dict | None:
    """The GPU's ceilings a prediction divides by: the ones recorded with the results file
    (results/, measured by lib.microbench.measure_ceilings in the recording run), so that every
    notebook divides by the same figures as the recorded table; measured now only on a GPU when
    nothing is recorded for it; else None. 'source' says which."""
    data = R.load()
    here = torch.cuda.get_device_name(0) if HAS_GPU else None
    if data and data.get("ceilings") and (here is None or here == data["env"]["gpu"]):
        return {**data["ceilings"], "source": f"recorded: {R.provenance(data)}"}
    if HAS_GPU:
        from lib.microbench import measure_ceilings
        return {**measure_ceilings(), "source": f"measured now on {here} (none recorded for it)"}
    return None


# --------------------------------------------------------------------------------------------
# profiles: scripts/gpu_session.sh runs Nsight Compute (ncu) on one call of stages 1 and up at
# the throughput shape and keeps its report in results/profiles/

PROFILE_DIR = R.RESULTS_DIR / "profiles"
NCU_METRICS = ("Duration", "SM Frequency", "Compute (SM) Throughput", "Memory Throughput",
               "L1/TEX Cache Throughput", "L2 Cache Throughput", "DRAM Throughput",
               "Achieved Occupancy", "Theoretical Occupancy", "Warp Cycles Per Issued Instruction")


# Raw shared-memory counters the profile step asks ncu for (--metrics), read when present:
# wavefronts are the passes the shared-memory pipe makes, bank conflicts the extra ones.
NCU_SHARED_METRICS = {
    # ncu counts ldmatrix (LDSM) apart from the other shared loads: the load requests are the
    # sum of the two ("ldsm" is added to "requests" where both were recorded)
    "loads": {"wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
              "conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
              "requests": "smsp__sass_inst_executed_op_shared_ld.sum",
              "ldsm": "smsp__sass_inst_executed_op_ldsm.sum"},
    "stores": {"wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
               "conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
               "requests": "smsp__sass_inst_executed_op_shared_st.sum"},
}
NCU_LDSM_METRIC = "smsp__sass_inst_executed_op_ldsm.sum"


def _metric_pattern(metric: str) -> str:
    """A metric's line in ncu's 'Command line profiler metrics' table: name, an optional unit,
    the value; ncu moves the value to the next line when the name is long."""
    return rf"^\s+{re.escape(metric)}\s+(?:[A-Za-z%/][^\s\d]*[ \t]+)?([\d,]+)[ \t]*$"


def _shared_counters(block: str, kind: str) -> dict | None:
    """One kernel's shared loads or stores in an ncu text report: {'requests', 'wavefronts',
    'conflicts', 'ways', 'wavefronts_per_request', 'source'}, or None when the report has
    neither the raw counters (NCU_SHARED_METRICS) nor ncu's bank-conflict rule for them.

    'ways' is wavefronts ÷ conflict-free wavefronts (wavefronts − conflicts): 1 means no
    conflict, 2 means every access took twice the passes it needed. It is not wavefronts per
    request, which ncu's rule prints as "n-way": an ldmatrix.x4 request needs 4 wavefronts
    (four 8×8 matrices) even without any conflict."""
    names = NCU_SHARED_METRICS[kind]
    raw = {}
    for field, metric in names.items():
        m = re.search(_metric_pattern(metric), block, re.M)
        if m:
            raw[field] = int(m.group(1).replace(",", ""))
    ldsm = raw.pop("ldsm", 0)
    if "wavefronts" in raw and "conflicts" in raw:
        source = "ncu metrics"
        if "requests" in raw:
            raw["requests"] += ldsm
    else:
        text = re.sub(r"\s+", " ", block)
        m = re.search(rf"across all ([\d,]+) shared {kind[:-1]} requests\.? ?This results in "
                      rf"([\d,]+) bank conflicts, which represent [\d.]+% of the overall "
                      rf"([\d,]+) wavefronts", text)
        if not m:
            return None
        raw = {"requests": int(m.group(1).replace(",", "")),
               "conflicts": int(m.group(2).replace(",", "")),
               "wavefronts": int(m.group(3).replace(",", ""))}
        source = "ncu rule"
    ideal = raw["wavefronts"] - raw["conflicts"]
    return {**raw, "requests": raw.get("requests"), "source": source,
            "ways": raw["wavefronts"] / ideal if ideal > 0 else None,
            "wavefronts_per_request": raw["wavefronts"] / raw["requests"]
            if raw.get("requests") else None}


def conflict_text(kernel: dict, kind: str) -> str:
    """'2.06-way (8.25 wavefronts per request)' for a kernel of ncu_report, or 'not measured'."""
    c = kernel["shared"].get(kind)
    if c is None or c["ways"] is None:
        return "not measured"
    per = (f" ({c['wavefronts_per_request']:.2f} wavefronts per request)"
           if c["wavefronts_per_request"] else "")
    return f"{c['ways']:.2f}-way{per}"


def ncu_report(stage: int | str, shape: str = "throughput") -> dict | None:
    """The recorded ncu report of one call of `stage` (a number, or a file stem's middle such as
    "5-noswizzle"): {'header': first line (where and when), 'path', 'kernels': [{'name',
    'launch', 'metrics': {metric: (value, unit)}, 'shared': {'loads'|'stores': counters of
    _shared_counters or None}, 'bank_conflicts': {'loads'|'stores': ways or None}, 'ldsm':
    ldmatrix instructions executed or None}]}, or None when there is no report. None means not
    measured: ncu prints its bank-conflict rule only when it fires."""
    path = PROFILE_DIR / f"stage{stage}-{shape}.ncu.txt"
    if not path.exists():
        return None
    text = path.read_text()
    header = text.splitlines()[0].lstrip("# ") if text.startswith("#") else ""
    kernels = []
    blocks = re.split(r"\n  (?=\w+ \(\d+, \d+, \d+\)x\()", text)
    for block in blocks[1:]:
        first = block.splitlines()[0]
        m = re.match(r"(\w+) (\(.*?\)x\(.*?\))", first)
        metrics = {}
        for name in NCU_METRICS:
            mm = re.search(rf"^\s+{re.escape(name)}\s+(\S+)?\s+([\d,.]+)\s*$", block, re.M)
            if mm:
                metrics[name] = (float(mm.group(2).replace(",", "")), mm.group(1) or "")
        shared = {kind: _shared_counters(block, kind) for kind in ("loads", "stores")}
        mm = re.search(_metric_pattern(NCU_LDSM_METRIC), block, re.M)
        kernels.append({"name": m.group(1), "launch": m.group(2), "metrics": metrics,
                        "shared": shared,
                        "bank_conflicts": {k: (c["ways"] if c else None) for k, c in shared.items()},
                        "ldsm": int(mm.group(1).replace(",", "")) if mm else None})
    return {"header": header, "path": str(path.relative_to(ROOT)), "kernels": kernels}


def show_ncu(stage: int, shape: str = "throughput") -> dict | None:
    """A table of the recorded ncu report of `stage` (see ncu_report), labelled as recorded."""
    rep = ncu_report(stage, shape)
    if rep is None:
        print(f"no recorded profile of stage {stage} (results/profiles/stage{stage}-{shape}.ncu.txt)"
              ": scripts/gpu_session.sh writes it on a GPU with ncu")
        return None
    cols = ["Duration", "Compute (SM) Throughput", "L1/TEX Cache Throughput",
            "L2 Cache Throughput", "DRAM Throughput", "Achieved Occupancy",
            "Warp Cycles Per Issued Instruction"]
    units = {c: next((k["metrics"][c][1] for k in rep["kernels"] if c in k["metrics"]), "")
             for c in cols}
    head = ["kernel (grid)x(block)"] + [f"{c} ({units[c]})" if units[c] else c for c in cols] \
        + ["shared-load bank conflicts", "shared-store bank conflicts"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in rep["kernels"]:
        cells = [f"{k['name']} {k['launch']}"]
        cells += [f"{k['metrics'][c][0]:,.4g}" if c in k["metrics"] else "—" for c in cols]
        cells += [conflict_text(k, "loads"), conflict_text(k, "stores")]
        lines.append("| " + " | ".join(cells) + " |")
    clocks = ("ncu ran with --clock-control none, so the SM kept its usual clocks; it still "
              "runs each kernel alone, its caches flushed, so compare ratios rather than "
              "microseconds" if "--clock-control none" in rep["header"] else
              "ncu fixes the SM clock while it profiles, so its durations are longer than the "
              "benchmark's")
    _md(f"*Recorded by Nsight Compute, not measured in this session* (`{rep['path']}`; "
        f"{rep['header']}). {clocks}. Bank conflicts: wavefronts ÷ conflict-free wavefronts "
        "(1-way = none); 'not measured' where the report has neither the raw counters nor ncu's "
        "bank-conflict rule (which prints only when it fires).\n\n" + "\n".join(lines))
    return rep


def show_target(stage: int, factor: float, shape: str = "throughput") -> None:
    """The curriculum's speed target for `stage`: at the named standard shape (fp16, full),
    at least `factor` times the previous stage's speed, both from one recorded benchmark run."""
    from lib.results import STANDARD_SHAPES
    _, B, H, S, D = next(s for s in STANDARD_SHAPES if s[0] == shape)
    data = R.load()
    rows = {n: r for n in (stage - 1, stage) if (r := recorded_row(n, shape))}
    if stage not in rows or stage - 1 not in rows:
        print(f"target: stage {stage} ≥ {factor:g}× stage {stage - 1} at B{B} H{H} S{S} D{D} "
              "fp16 — not recorded yet")
        return
    ratio = rows[stage - 1]["us"] / rows[stage]["us"]
    _md(f"**Target**: stage {stage} ≥ {factor:g}× stage {stage - 1} at B{B} H{H} S{S} D{D} fp16 "
        f"(full). *Recorded* ({R.provenance(data)}): stage {stage - 1} "
        f"{rows[stage - 1]['us']:,.1f} µs, stage {stage} {rows[stage]['us']:,.1f} µs → "
        f"**{ratio:.3g}×, target {'met' if ratio >= factor else 'missed'}**.")


DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16"}


def show_target_sdpa(stage: int, factor: float, shape: str = "long", causal: bool = False,
                     backend: str = "flash", dtype: str = "float16") -> None:
    """A speed target against SDPA: at the named standard shape and dtype, at least `factor`
    times the speed of SDPA's `backend` ("flash": FLASH_ATTENTION, "default"). SDPA's time is
    the median over every recorded row of that shape (sdpa_median_of), as in the README's table;
    the SDPA timing in the stage's own row is shown beside it."""
    from lib.results import STANDARD_SHAPES
    _, B, H, S, D = next(s for s in STANDARD_SHAPES if s[0] == shape)
    key, name = {"flash": ("sdpa_flash_us", "SDPA FLASH_ATTENTION"),
                 "default": ("sdpa_us", "SDPA default")}[backend]
    what = f"stage {stage} ≥ {factor:g}× {name} at B{B} H{H} S{S} D{D} {DTYPE_SHORT[dtype]} " \
           f"({'causal' if causal else 'full'})"
    row = recorded_row(stage, shape, causal, dtype)
    if row is None or not row.get(key):
        print(f"target: {what} — not recorded yet")
        return
    median = sdpa_median_of(row, key)
    ratio = median / row["us"]
    _md(f"**Target**: {what}. *Recorded* ({R.provenance(R.load(), [stage])}): {name} "
        f"{median:,.1f} µs (median over the record's rows; {row[key]:,.1f} µs in this stage's "
        f"row, {row[key] / row['us']:.2f}×), stage {stage} {row['us']:,.1f} µs → "
        f"**{ratio:.3g}×, target {'met' if ratio >= factor else 'missed'}**.")


def tile_sweep(stage: int) -> dict | None:
    """scripts/tile_sweep.py's recorded measurements of `stage`'s tile choices: {"env", "rows",
    "stale"} (stale: the stage's sources changed since), or None if none were recorded."""
    data = R.load()
    rec = (data or {}).get("tiles")
    if not rec:
        return None
    import stages
    rows = [r for r in rec["rows"] if r["stage"] == stage]
    if not rows:
        return None
    stale = rec.get("sha256", {}).get(str(stage)) != R.stage_sha256(stages.get(stage).INFO)
    return {"env": rec["env"], "rows": rows, "stale": stale}


def recorded_verdicts(stage: int) -> list:
    """Without a GPU, a CUDA C++ stage cannot run here: its verdict comes from the recorded
    benchmark rows instead (each was checked twice on fresh inputs when it was timed)."""
    from types import SimpleNamespace
    return [SimpleNamespace(passed=bool(r["passed"]))
            for r in recorded_runs(stage, suite=None, dtype=None) if not r.get("skipped")]


def sdpa_median_us(B, H, S, D, causal, field="sdpa_us", dtype="float16") -> tuple | None:
    """SDPA's time at one standard shape in the recorded run: every stage's benchmark row timed
    SDPA again on its own inputs, so take the median over those rows: (median µs, number of
    rows, min, max), or None when nothing is recorded."""
    import statistics
    xs = [r[field] for r in recorded_runs(dtype=dtype) if not r.get("skipped") and r.get(field)
          and (r["B"], r["H"], r["Sq"], r["Sk"], r["D"], r["dtype"], r["causal"])
          == (B, H, S, S, D, dtype, causal)]
    return (statistics.median(xs), len(xs), min(xs), max(xs)) if xs else None


def sdpa_median_of(row: dict, field: str = "sdpa_us") -> float | None:
    """SDPA's recorded time for the shape of a recorded `row` (any suite): the median over
    every row of the run with that shape, dtype and mask (each stage's row timed SDPA again on
    its own inputs), rather than the one timing next to that stage. None when none has it."""
    return R.sdpa_medians(recorded_runs(suite=None, dtype=row["dtype"])).get(
        (R.shape_key(row), field))


SDPA_MEDIAN_NOTE = ("SDPA columns: the median of the run's SDPA timings at that shape (every "
                    "stage's row timed SDPA again), not the one timing next to this stage.")


def recorded_row(stage: int, shape: str = "throughput", causal: bool = False,
                 dtype: str = "float16") -> dict | None:
    """The recorded row of `stage` at a named standard shape (fp16 unless `dtype`), or None."""
    from lib.results import STANDARD_SHAPES
    _, B, H, S, D = next(s for s in STANDARD_SHAPES if s[0] == shape)
    return next((r for r in recorded_runs(stage, dtype=dtype) if not r.get("skipped")
                 and (r["B"], r["H"], r["Sq"], r["Sk"], r["D"], r["dtype"], r["causal"])
                 == (B, H, S, S, D, dtype, causal)), None)


def stage_summary(stage: int, remember: str) -> None:
    """The three lines a stage notebook opens with: what the stage adds (its INFO), the measured
    gain over the previous stage at the throughput shape (from the recorded results file), the
    one thing to remember; and links to the previous and next stage notebooks."""
    import stages
    info = stages.get(stage).INFO
    nums = list(stages.NUMBERS)
    i = nums.index(stage)
    data = R.load()
    gain = "not recorded yet"
    cur = recorded_row(stage)

    def commit_of(n):  # the commit that recorded stage n's rows (stages may differ)
        return data["stages"].get(str(n), {}).get("commit", data["env"]["commit"])[:7]
    if i > 0:
        prev = recorded_row(nums[i - 1])
        if cur and prev:
            c, p = commit_of(stage), commit_of(nums[i - 1])
            gain = (f"**{prev['us'] / cur['us']:.2f}×** stage {nums[i - 1]} at B{cur['B']} "
                    f"H{cur['H']} S{cur['Sq']} D{cur['D']} fp16 ({prev['us']:,.0f} → "
                    f"{cur['us']:,.0f} µs; recorded, "
                    + (f"commit {c})" if c == p else f"commits {p} and {c})"))
    elif cur:
        gain = (f"the baseline: {cur['us']:,.0f} µs at B{cur['B']} H{cur['H']} S{cur['Sq']} "
                f"D{cur['D']} fp16 (recorded, commit {commit_of(stage)})")
    links = []
    if i > 0:
        p = Path(stages.get(nums[i - 1]).INFO.notebook).name
        links.append(f"← previous: [{p}]({p})")
    else:
        links.append("← [00_introduction.ipynb](00_introduction.ipynb)")
    if i + 1 < len(nums):
        n = Path(stages.get(nums[i + 1]).INFO.notebook).name
        links.append(f"next: [{n}]({n}) →" if (ROOT / "notebooks" / n).exists()
                     else f"next: stage {nums[i + 1]} ({n}, not written yet) →")
    else:
        links.append("next: [journey.ipynb](journey.ipynb) →")
    _md(f"- **Adds:** {info.adds}\n- **Measured gain:** {gain}\n- **Remember:** {remember}"
        f"\n\n{' · '.join(links)}")


def stage_plan() -> None:
    """The curriculum's steps: the registered stages (stages.NUMBERS) and, after the last,
    the Hopper step (WGMMA and TMA, stage 6) with its status read from the registry."""
    import stages
    data = R.load() or {}
    lines = ["| step | stage | status |", "|---|---|---|"]
    for k, n in enumerate(stages.NUMBERS, 1):
        info = stages.get(n).INFO
        rec = any(r["stage"] == n and not r.get("skipped") for r in data.get("runs", []))
        nb = (ROOT / info.notebook).exists()
        status = ("registered" + (", recorded" if rec else ", not recorded yet")
                  + ("" if nb else ", notebook not written yet"))
        lines.append(f"| {k} | {n}: {info.title} | {status} |")
    if 6 not in stages.NUMBERS:
        lines.append(f"| {len(stages.NUMBERS) + 1} | 6: Hopper, WGMMA and TMA (sm_90a) | "
                     "planned: not in the stage registry of this checkout yet |")
    _md("\n".join(lines))


def instruction_bounds(n_hmma: int, n_mufu: int, ceil: dict, mma_flop: int = 2 * 16 * 8 * 16
                       ) -> dict | None:
    """What the two instruction ceilings allow one K/V tile of `n_hmma` HMMA.16816 and `n_mufu`
    MUFU warp instructions (32 lanes each): the attention TFLOPS if the tile's MMAs ran at the
    measured mma.sync rate ('hmma'), if its 2^x ran at the measured MUFU.EX2 rate ('mufu'), and
    which is lower ('binding'). None when the ceilings lack those rates."""
    if not ceil or not ceil.get("hmma_TFLOPS") or not ceil.get("mufu_ex2_Gops"):
        return None
    flop = n_hmma * mma_flop
    t_mma = flop / (ceil["hmma_TFLOPS"] * 1e12)
    t_ex2 = n_mufu * 32 / (ceil["mufu_ex2_Gops"] * 1e9)
    out = {"hmma": flop / t_mma / 1e12, "mufu": flop / t_ex2 / 1e12,
           "both_serial": flop / (t_mma + t_ex2) / 1e12}
    out["binding"] = "mma.sync (HMMA.16816)" if t_mma >= t_ex2 else "MUFU.EX2"
    return out


# Opcode families of the SASS instruction mix, for a learner's first look at what runs.
INSTRUCTION_CLASSES = {
    "tensor core": ("HMMA", "HGMMA", "IMMA", "QGMMA", "IGMMA", "BGMMA"),
    "FP32 math": ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "FCHK", "FSWZADD"),
    "FP16 math / conversion": ("HADD2", "HFMA2", "HMUL2", "HMNMX2", "HSETP2", "F2FP", "F2F",
                               "I2F", "F2I", "I2FP", "F2IP"),
    "special function (MUFU)": ("MUFU",),
    "global memory": ("LDG", "STG", "LD", "ST", "ATOMG", "RED", "LDGSTS", "LDGDEPBAR"),
    "local memory": ("LDL", "STL"),
    "shared memory": ("LDS", "STS", "LDSM", "STSM", "ATOMS"),
    "TMA / async barriers": ("UTMALDG", "UTMASTG", "UBLKCP", "UTMAPF", "SYNCS"),
    "integer / address": ("IMAD", "IADD3", "IADD", "VIADD", "ISETP", "SEL", "LOP3", "LEA", "SHF",
                          "IABS", "IMNMX", "VIMNMX", "IMUL", "POPC", "FLO", "BREV", "PRMT"),
    "warp shuffle / vote": ("SHFL", "VOTE", "VOTEU", "MATCH", "REDUX"),
    "control flow": ("BRA", "BRX", "JMP", "BSSY", "BSYNC", "CALL", "RET", "EXIT", "BAR",
                     "WARPSYNC", "YIELD", "BREAK", "ELECT", "NANOSLEEP"),
}


def instruction_classes(mix) -> list[tuple[str, int, float]]:
    """Group an opcode Counter (lib.sass.instruction_mix) into INSTRUCTION_CLASSES:
    [(class, count, percent of all)], largest first. Opcodes of the uniform datapath (U*,
    R2UR, S2UR) form their own class; everything else (MOV, NOP, S2R, ...) is 'other'."""
    family = {op: cls for cls, ops in INSTRUCTION_CLASSES.items() for op in ops}
    counts = {}
    for op, n in mix.items():
        cls = family.get(op) or ("uniform datapath" if op.startswith("U") or op in
                                 ("R2UR", "S2UR") else "other")
        counts[cls] = counts.get(cls, 0) + n
    total = sum(counts.values()) or 1
    return sorted(((c, n, 100 * n / total) for c, n in counts.items()), key=lambda t: -t[1])


def execute(paths, timeout=1200) -> int:
    """Execute notebooks in place (outputs kept), as on the GPU before committing them."""
    import time

    import nbformat
    from nbclient import NotebookClient
    failed = 0
    for p in map(Path, paths):
        t0 = time.time()
        nb = nbformat.read(p, as_version=4)
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(p.parent)}}).execute()
            status = "ok"
        except Exception as e:  # keep going: write what ran, report the failure
            failed += 1
            status = f"FAILED: {type(e).__name__}: {str(e)[-2000:]}"
        nbformat.write(nb, p)
        print(f"{p}: {status} ({time.time() - t0:.0f} s)", flush=True)
    return 1 if failed else 0




# ============================================================================================
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
# the journey notebook: every stage side by side, read from the recorded results file
# (the plots are lib.plots.plot_journey_*; these gather the rows and make the tables)

def journey_stages(data: dict | None) -> tuple[list[int], dict]:
    """(stage numbers, {number: module}): the registered stages, plus any stage the results
    file has rows of (one recorded on another branch)."""
    import stages
    mods = {m.INFO.number: m for m in stages.all_stages()}
    return sorted(set(mods) | {r["stage"] for r in (data or {}).get("runs", [])}), mods


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
    *_, rows, skipped = next(p for p in panels if p[0] == "throughput" and not p[5])
    out = []
    for i, n in enumerate(numbers):
        pred = mods[n].INFO.prediction if n in mods else {}
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


def stage6_default_repeats(rec: dict) -> str:
    """The rows of the record that ran the default build again (fp16): the default schedule,
    the head dim's default tiles (stages/stage6.py TILES), its EXP2_POLY and its LAZY_RESCALE
    rows are one kernel timed four times in one run. Their spread (slowest ÷ fastest) is how
    far one timing moves: steps closer than that cannot be told apart by one timing each."""
    import stages.stage6 as s6
    lines = ["| shape | repeats of the default build | fastest µs | slowest µs | spread |",
             "|---|---|---|---|---|"]
    for B, H, S, D, causal in STAGE6_SHAPES:
        lazy = s6.LAZY_RESCALE[D]
        labels = {("schedule", s6.default_schedule(D)), ("tiles", str(s6.TILES[D])),
                  ("exp2_poly", f"{s6.EXP2_POLY[D]}/8 of exp2 by polynomial"),
                  ("rescale", {-1: "O rescaled every tile", 0: "O rescaled when a max grew"}.get(
                      lazy, f"O rescaled past 2^{lazy} growth"))}
        us = [r["us"] for r in rec["rows"] if (r["kind"], r["variant"]) in labels
              and r.get("dtype", "float16") == "float16"
              and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal)]
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


# --------------------------------------------------------------------------------------------
# The stage 0-2 notebooks: SASS loops, the kernels' source constants, instructions per K/V tile
# and the recorded profile (issue 13: analysis in lib/, not in notebook cells).

def kernel_listings(sass: str, names) -> dict[str, str]:
    """{name: the SASS listing of the kernel whose name contains it}, from a cuobjdump listing
    of a module with several kernels."""
    from lib.sass import function_text
    return {k: function_text(sass, k) for k in names}


def _sass_clean(line: str) -> str:
    """A SASS line without cuobjdump's trailing encoding comment."""
    return re.sub(r"\s*/\*\s*0x[0-9a-f]+\s*\*/\s*$", "", line).rstrip()


def show_hot_loops(sass: str, kernel: str, label, listing: int = 24) -> tuple[list, float]:
    """The hot loops of a scalar kernel: its innermost loops that load from global memory and
    do FFMAs, one table row each (addresses, instructions, FFMA, LDG, LDL, STL, the FFMA and the
    integer / address shares; `label(mix)` names the loop), then the first `listing`
    instructions of the first one. Each such loop does one FFMA per element of the head dim, so
    its instructions ÷ its FFMAs is what it issues per element; their sum and the FFMA share
    are printed under the table. Returns (the loops, those
    instructions per element summed over them)."""
    from IPython.display import Markdown, display
    hot = [L for L in innermost_loops(sass, kernel) if L["mix"]["LDG"] and L["mix"]["FFMA"]]
    per_element = 0.0
    lines = ["| loop | addresses | instructions | FFMA | LDG | LDL | STL | FFMA share | "
             "integer / address share |", "|---|---|---|---|---|---|---|---|---|"]
    for L in hot:
        mix, total = L["mix"], sum(L["mix"].values())
        integer = next((n for c, n, _ in instruction_classes(mix) if c == "integer / address"), 0)
        per_element += total / mix["FFMA"]
        lines.append(f"| {label(mix)} | {L['start']:#06x}–{L['end']:#06x} | {total} | {mix['FFMA']} | "
                     f"{mix['LDG']} | {mix['LDL']} | {mix['STL']} | {100 * mix['FFMA'] / total:.1f}% | "
                     f"{100 * integer / total:.0f}% |")
    display(Markdown("\n".join(lines)))
    if hot:
        print(f"per (query, key) pair each thread issues about {per_element:.0f}·D instructions "
              f"for {len(hot)}·D FFMAs: FFMA share {100 * len(hot) / per_element:.1f}%")
    if hot and listing:
        print(f"\nthe first hot loop, first {listing} of its {sum(hot[0]['mix'].values())} instructions:")
        for ln in hot[0]["sass"].splitlines()[:listing]:
            print(_sass_clean(ln))
    return hot, per_element


def show_block_limits(ins, threads: dict, sm: dict | None = None) -> None:
    """One table row per kernel of an inspected module (lib.sass.Inspection): threads per
    block, registers, spills, shared memory (ptxas's static figure and cuobjdump's, which
    includes what the system reserves per block), the blocks per SM that registers, threads and
    shared memory each allow, and the resident warps per SM that result. `threads`: {kernel:
    threads per block}; `sm`: lib.sass.HOPPER_SM unless given."""
    import math

    from lib.sass import HOPPER_SM
    sm = sm or HOPPER_SM
    max_warps = sm["threads"] // 32
    lines = ["| kernel | threads/block | registers/thread | spills (B) | static shared B (ptxas) "
             "| shared B per block (cuobjdump) | blocks/SM by registers / threads / shared "
             f"| resident warps/SM (of {max_warps}) |", "|---|---|---|---|---|---|---|---|"]
    for kname, tpb in threads.items():
        res, px = ins.resources[kname], ins.ptxas.get(kname, {})
        regs_per_block = math.ceil(res["REG"] * 32 / 256) * 256 * tpb // 32
        by_reg = sm["registers"] // regs_per_block
        by_thr = min(sm["threads"] // tpb, sm["blocks"])
        by_smem = sm["smem"] // max(res.get("SHARED", 0), 1)
        blocks = min(by_reg, by_thr, by_smem)
        lines.append(f"| `{kname}` | {tpb} | {res['REG']} | {px.get('spill_stores', 0) + px.get('spill_loads', 0)} "
                     f"| {px.get('static_smem_bytes', '—')} | {res.get('SHARED', 0)} | {by_reg} / {by_thr} / {by_smem} "
                     f"| {blocks * tpb // 32} |")
    _md("\n".join(lines))


def show_innermost_loops(sass: str, kernels) -> dict[str, list]:
    """Print each kernel's innermost loops (innermost_loops): addresses, instruction count and
    its six most frequent opcodes. Returns {kernel: its loops}."""
    out = {}
    for kname in kernels:
        loops = out[kname] = innermost_loops(sass, kname)
        print(f"{kname}: {len(loops)} innermost loop(s)" + (":" if loops else ""))
        for L in loops:
            top = ", ".join(f"{op} {n}" for op, n in L["mix"].most_common(6))
            print(f"  {L['start']:#06x}–{L['end']:#06x}: {sum(L['mix'].values())} instructions ({top})")
    return out


def print_skeleton(sass: str, ops=("LDG", "STS", "BAR", "LDSM", "HMMA", "STG")) -> None:
    """The memory, barrier and tensor-core instructions of a SASS listing in program order, a
    run of one opcode printed once with how many more follow: the shape of a loop at a glance."""
    pattern = r"\b(" + "|".join(ops) + r")\S*"
    skeleton = [_sass_clean(ln) for ln in sass.splitlines() if re.search(pattern, ln)]
    prev, run, first = None, 0, None
    for ln in skeleton + [None]:
        op = None if ln is None else re.search(pattern, ln).group(0)
        if op == prev:
            run += 1
            continue
        if prev is not None:
            print(f"    {first}" + (f"   ... and {run - 1} more {prev}" if run > 1 else ""))
        prev, run, first = op, 1, ln and ln.strip()


NCU_TIME_UNITS_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                     "msecond": 1e3}


def ncu_durations_us(rep: dict | None, names=None) -> dict[str, float]:
    """{kernel: duration in µs} from a recorded ncu report (ncu_report), for the kernels named
    in `names` (every kernel: None)."""
    out = {}
    for k in (rep or {}).get("kernels", []):
        if (names is None or k["name"] in names) and "Duration" in k["metrics"]:
            val, unit = k["metrics"]["Duration"]
            out[k["name"]] = val * NCU_TIME_UNITS_US.get(unit, float("nan"))
    return out


def print_ncu_kernels(rep: dict | None, names=None) -> None:
    """One line per kernel of a recorded ncu report: DRAM, L2 and SM throughput, achieved and
    theoretical occupancy, and the shared-memory bank conflicts (conflict_text)."""
    if rep is None:
        return
    print("ncu, per kernel (recorded):")
    for k in rep["kernels"]:
        if names is None or k["name"] in names:
            m = k["metrics"]
            get = lambda key: f"{m[key][0]:,.3g}%" if key in m else "—"  # noqa: E731
            print(f"  {k['name']:18s} DRAM {get('DRAM Throughput')}, L2 {get('L2 Cache Throughput')}, "
                  f"SM {get('Compute (SM) Throughput')}, occupancy {get('Achieved Occupancy')} "
                  f"(theoretical {get('Theoretical Occupancy')}), shared-memory bank conflicts: loads "
                  f"{conflict_text(k, 'loads')}, stores {conflict_text(k, 'stores')}")


def show_shared_counters(rep: dict | None) -> None:
    """The raw shared-memory counters behind a recorded ncu report's bank-conflict figures, one
    row per kernel and access: requests (instructions; for loads, ldmatrix included, and how
    many of them were ldmatrix), wavefronts (the passes the shared-memory pipe made), bank
    conflicts (the extra passes), conflict-free wavefronts (wavefronts − conflicts), and the
    two ratios: the ways (wavefronts ÷ conflict-free wavefronts, 1 = none) and wavefronts per
    request (4 for a conflict-free ldmatrix.x4)."""
    if rep is None:
        return
    def num(x, spec=","):
        return "—" if x is None else format(x, spec)

    lines = ["| kernel | access | requests | of which ldmatrix | wavefronts | bank conflicts "
             "| conflict-free wavefronts | conflict ways | wavefronts per request | read from |",
             "|" + "---|" * 10]
    for k in rep["kernels"]:
        for kind in ("loads", "stores"):
            c = k["shared"].get(kind)
            if c is None:
                lines.append(f"| {k['name']} | {kind} | not measured |" + " — |" * 7)
                continue
            ldsm = num(k.get("ldsm")) if kind == "loads" else "—"
            ways = "—" if c["ways"] is None else f"{c['ways']:.2f}-way"
            lines.append(f"| {k['name']} | {kind} | {num(c['requests'])} | {ldsm} | {c['wavefronts']:,} "
                         f"| {c['conflicts']:,} | {c['wavefronts'] - c['conflicts']:,} | {ways} "
                         f"| {num(c['wavefronts_per_request'], '.2f')} | {c['source']} |")
    _md(f"*Recorded by Nsight Compute, not measured in this session* (`{rep['path']}`): the raw "
        "shared-memory counters of one call.\n\n" + "\n".join(lines))


def stage_constants(path: str, head_dim: int) -> dict:
    """The `constexpr int NAME = expr;` constants of a stage's .cu file (a path from the
    repository root), evaluated in order for HEAD_DIM = head_dim (integer division for /)."""
    env = {"HEAD_DIM": head_dim}
    for name, expr in re.findall(r"constexpr int (\w+) = ([^;]+);", (ROOT / path).read_text()):
        env[name] = eval(expr.replace("/", "//"), {}, dict(env))
    return env


def shared_declarations(path: str, head_dim: int, item: int = 2) -> dict[str, int]:
    """{name: bytes} of the `__shared__` declarations of a stage's .cu file at HEAD_DIM =
    head_dim, with elem_t `item` bytes; a declared `union Tiles` counts as its largest member."""
    import math
    text = (ROOT / path).read_text()
    env, size = stage_constants(path, head_dim), {"float": 4, "elem_t": item}
    count = lambda dims: math.prod(eval(d.replace("/", "//"), {}, dict(env))  # noqa: E731
                                   for d in re.findall(r"\[([^\]]+)\]", dims))
    arrays = lambda t: sum(size[ty] * count(dims) for ty, dims in  # noqa: E731
                           re.findall(r"(float|elem_t)\s+\w+((?:\[[^\]]+\])+)\s*;", t))
    union = re.search(r"union Tiles \{(.*?)\n\};", text, re.S)
    if union:
        size["Tiles"] = max(arrays(m) for m in re.findall(
            r"struct \{.*?\}\s*\w+;|(?:float|elem_t)\s+\w+(?:\[[^\]]+\])+;", union.group(1)))
    return {name: size[t] * count(dims) for t, name, dims in re.findall(
        r"__shared__(?:\s+__align__\(\d+\))?\s+(\w+)\s+(\w+)((?:\[[^\]]+\])*)\s*;", text)}


def kv_loop_steps(sass: str, names, copy_elements: int, block_k: int,
                  kernel: str = "attention_fused") -> dict:
    """What one warp issues per K/V tile in each step of a fused kernel's main loop, from its
    SASS. The loop over K/V tiles is the longest backward branch around the HMMAs; its barriers
    (BAR, one per step, len(names) of them) cut it into the steps, the first step starting at
    the loop's top. Each inner loop's body counts as often as it runs per tile: a copy loop
    (LDG) copy_elements ÷ its loads, a 2^x loop (MUFU) block_k ÷ its MUFUs, a max loop (FMNMX)
    block_k ÷ its FMNMXs; one of none of these is counted once, and said so.
    {step name: opcode Counter}."""
    import collections

    from lib.sass import backward_branches, listing
    instrs = listing(sass, kernel)
    hmma = [x["addr"] for x in instrs if x["op"] == "HMMA"]
    lo, hi = max((L for L in backward_branches(instrs) if any(L[0] <= h <= L[1] for h in hmma)),
                 key=lambda L: L[1] - L[0])
    body = [(x["addr"], x["op"]) for x in instrs if lo <= x["addr"] <= hi]
    bars = [a for a, op in body if op == "BAR"]
    assert len(bars) == len(names), f"expected the loop's {len(names)} barriers, found {len(bars)}"
    inner = [L for L in innermost_loops(sass, kernel) if lo <= L["start"] and L["end"] <= hi]

    def trip(L):
        if L["mix"]["LDG"]:
            return max(1, copy_elements // L["mix"]["LDG"])
        if L["mix"]["MUFU"]:
            return max(1, block_k // L["mix"]["MUFU"])
        if L["mix"]["FMNMX"]:
            return max(1, block_k // L["mix"]["FMNMX"])
        print(f"(a loop at {L['start']:#x} of unknown trip count is counted once)")
        return 1

    edges = [lo] + bars[1:] + [hi + 1]
    steps = {}
    for name, a, z in zip(names, edges[:-1], edges[1:]):
        mix = collections.Counter(op for x, op in body if a <= x < z)
        for L in inner:
            if a <= L["start"] < z:
                for op, n in L["mix"].items():
                    mix[op] += n * (trip(L) - 1)
        steps[name] = mix
    return steps


def show_step_table(steps: dict, title: str) -> None:
    """kv_loop_steps's counts as a table: per step the instructions, HMMA, LDG, shared loads
    (LDS + LDSM), STS, MUFU, BAR and the integer / address instructions."""
    lines = [title, "", "| step | instructions | HMMA | LDG | LDS + LDSM | STS | MUFU | BAR "
             "| integer / address |", "|---|---|---|---|---|---|---|---|---|"]
    for name, mix in steps.items():
        integer = next((n for c, n, _ in instruction_classes(mix) if c == "integer / address"), 0)
        lines.append(f"| {name} | {sum(mix.values())} | {mix['HMMA']} | {mix['LDG']} | "
                     f"{mix['LDS'] + mix['LDSM']} | {mix['STS']} | {mix['MUFU']} | {mix['BAR']} | "
                     f"{integer} |")
    _md("\n".join(lines))


def print_occupancy_vs_profile(kernel: dict, predicted_pct: float, max_warps: int = 64) -> None:
    """What a recorded ncu kernel (of ncu_report) says about occupancy and issue, next to the
    occupancy predicted from registers and shared memory: theoretical occupancy, achieved
    occupancy as warps per scheduler and the share of cycles a scheduler can issue on (warps ÷
    warp cycles per issued instruction), each unit's throughput and the bank conflicts."""
    m = lambda name: kernel["metrics"].get(name, (None, ""))[0]  # noqa: E731
    theo, ach, cpi = (m("Theoretical Occupancy"), m("Achieved Occupancy"),
                      m("Warp Cycles Per Issued Instruction"))
    if theo is not None:
        print(f"theoretical occupancy: ncu {theo:.1f}%, predicted from registers and shared "
              f"memory in section 6 {predicted_pct:.1f}%")
    if ach is not None and cpi:
        per_sched = ach / 100 * max_warps / 4
        print(f"achieved occupancy {ach:.1f}% = {per_sched:.1f} warps per scheduler; each waits "
              f"{cpi:.1f} cycles per instruction -> a scheduler issues on about "
              f"{100 * min(1, per_sched / cpi):.0f}% of cycles")
    for unit in ("Compute (SM) Throughput", "L1/TEX Cache Throughput", "L2 Cache Throughput",
                 "DRAM Throughput"):
        if m(unit) is not None:
            print(f"{unit:26s} {m(unit):5.1f}% of peak")
    print(f"shared-memory bank conflicts (wavefronts ÷ conflict-free wavefronts): loads "
          f"{conflict_text(kernel, 'loads')}, stores {conflict_text(kernel, 'stores')}")


if __name__ == "__main__":
    import argparse
    import sys
    ap = argparse.ArgumentParser(description="Execute notebooks in place, keeping outputs.")
    ap.add_argument("--execute", nargs="+", required=True, metavar="NOTEBOOK")
    sys.exit(execute(ap.parse_args().execute))


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
