"""What every notebook shares: the mode banner, a stage's source and its diff against the
previous stage, checks on several shapes, the recorded rows and targets, the Nsight Compute
reports (results/profiles/) and the instruction classes of a SASS mix (executing notebooks:
notebook_run). lib.notebook gathers these and the topic modules (notebook_*) under one name."""
from __future__ import annotations

import difflib
import re
from pathlib import Path

import torch

from lib import results as R
from lib.inputs import DTYPE_NAMES
from lib.reference import check_attention
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


def source_span(lines: list[str], start: str | None, end: str | None, path: str = "") -> tuple[int, int]:
    """Lines a … b − 1: from the line containing `start` up to the one containing `end`. A
    marker that is not there is an error, never the whole file shown in its place (an edited
    source line would otherwise turn a cell into a silent dump of the file)."""
    a = next((i for i, ln in enumerate(lines) if start in ln), None) if start else 0
    if a is None:
        raise ValueError(f"{path}: no line contains {start!r}")
    b = next((i for i, ln in enumerate(lines[a + 1:], a + 1) if end in ln), None) if end else len(lines)
    if b is None:
        raise ValueError(f"{path}: no line after {start!r} contains {end!r}")
    return a, b


def show_source(path: str, start: str | None = None, end: str | None = None) -> None:
    """Show a file (or the part from the line containing `start` up to, not including, the
    line containing `end`), read from the repository, so the notebook never drifts from it."""
    lines = (ROOT / path).read_text().splitlines()
    a, b = source_span(lines, start, end, path)
    lang = "cuda" if path.endswith((".cu", ".cuh")) else "python"
    _md(f"`{path}` (lines {a + 1}–{b})\n```{lang}\n" + "\n".join(lines[a:b]) + "\n```")


def show_diff(old: str, new: str) -> None:
    """Unified diff of two source files of the repository."""
    d = difflib.unified_diff((ROOT / old).read_text().splitlines(),
                             (ROOT / new).read_text().splitlines(), old, new, lineterm="", n=2)
    _md("```diff\n" + "\n".join(d) + "\n```")


def show_part_diff(old: str, new: str, start: str, end: str) -> None:
    """Unified diff of the part of two source files from the line containing `start` up to the
    line containing `end` (as show_source cuts them): one function of two stages side by side."""
    def part(path):
        lines = (ROOT / path).read_text().splitlines()
        a, b = source_span(lines, start, end, path)
        return lines[a:b]
    d = difflib.unified_diff(part(old), part(new), old, new, lineterm="", n=3)
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


NCU_TIME_UNITS_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
                     "s": 1e6, "second": 1e6}


def ncu_report(stage: int | str, shape: str = "throughput", metrics=NCU_METRICS) -> dict | None:
    """The recorded ncu report of one call of `stage` (a number, or a file stem's middle such as
    "5-noswizzle"): {'header': first line (where and when), 'path', 'kernels': [{'name',
    'launch', 'metrics': {metric: (value, unit)} for each of `metrics` found (Duration in µs,
    whatever unit ncu printed it in), 'shared': {'loads'|'stores': counters of
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
        found = {}
        for name in metrics:
            mm = re.search(rf"^\s+{re.escape(name)}\s+(\S+)?\s+([\d,.]+)\s*$", block, re.M)
            if mm:
                value, unit = float(mm.group(2).replace(",", "")), mm.group(1) or ""
                if name == "Duration" and unit in NCU_TIME_UNITS_US:  # ncu picks the unit per kernel
                    value, unit = value * NCU_TIME_UNITS_US[unit], "us"
                found[name] = (value, unit)
        shared = {kind: _shared_counters(block, kind) for kind in ("loads", "stores")}
        mm = re.search(_metric_pattern(NCU_LDSM_METRIC), block, re.M)
        kernels.append({"name": m.group(1), "launch": m.group(2), "metrics": found,
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


# ============================================================================================
