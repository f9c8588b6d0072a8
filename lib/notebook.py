"""Helpers the notebooks share: the mode banner, a stage's source and its diff against the
previous stage, checks on several shapes, live timings, and recorded tables."""
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
                  dtype: str | None = "float16") -> None:
    """The recorded table (from results/), labelled with its device, date and commit."""
    data = R.load()
    if not data:
        print("no recorded results yet: run `python -m lib.bench --record` on a GPU")
        return
    peak = (data.get("ceilings") or {}).get("matmul_TFLOPS")
    _md(f"*Recorded, not measured in this session.* {R.provenance(data)}\n\n"
        + R.markdown_table(recorded_runs(stage, suite, dtype), peak))


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
    (results/, measured by lib.timing.measure_ceilings in the recording run), so that every
    notebook divides by the same figures as the recorded table; measured now only on a GPU when
    nothing is recorded for it; else None. 'source' says which."""
    data = R.load()
    here = torch.cuda.get_device_name(0) if HAS_GPU else None
    if data and data.get("ceilings") and (here is None or here == data["env"]["gpu"]):
        return {**data["ceilings"], "source": f"recorded: {R.provenance(data)}"}
    if HAS_GPU:
        from lib.timing import measure_ceilings
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
    _md(f"*Recorded by Nsight Compute, not measured in this session* (`{rep['path']}`; "
        f"{rep['header']}). ncu fixes the SM clock while it profiles, so its durations are "
        "longer than the benchmark's. Bank conflicts: wavefronts ÷ conflict-free wavefronts "
        "(1-way = none); 'not measured' where the report has neither the raw counters nor ncu's "
        "bank-conflict rule (which prints only when it fires).\n\n" + "\n".join(lines))
    return rep


def show_target(stage: int, factor: float, shape: str = "throughput") -> None:
    """The curriculum's speed target for `stage`: at the named standard shape (fp16, full),
    at least `factor` times the previous stage's speed, both from one recorded benchmark run."""
    from lib.bench import STANDARD_SHAPES
    _, B, H, S, D = next(s for s in STANDARD_SHAPES if s[0] == shape)
    data = R.load()
    rows = {r["stage"]: r for r in recorded_runs() if not r.get("skipped")
            and (r["B"], r["H"], r["Sq"], r["Sk"], r["D"], r["dtype"], r["causal"])
            == (B, H, S, S, D, "float16", False)}
    if stage not in rows or stage - 1 not in rows:
        print(f"target: stage {stage} ≥ {factor:g}× stage {stage - 1} at B{B} H{H} S{S} D{D} "
              "fp16 — not recorded yet")
        return
    ratio = rows[stage - 1]["us"] / rows[stage]["us"]
    _md(f"**Target**: stage {stage} ≥ {factor:g}× stage {stage - 1} at B{B} H{H} S{S} D{D} fp16 "
        f"(full). *Recorded* ({R.provenance(data)}): stage {stage - 1} "
        f"{rows[stage - 1]['us']:,.1f} µs, stage {stage} {rows[stage]['us']:,.1f} µs → "
        f"**{ratio:.2f}×, target {'met' if ratio >= factor else 'missed'}**.")


DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16"}


def show_target_sdpa(stage: int, factor: float, shape: str = "long", causal: bool = False,
                     backend: str = "flash", dtype: str = "float16") -> None:
    """A speed target against SDPA: at the named standard shape and dtype, at least `factor`
    times the speed of SDPA's `backend` ("flash": FLASH_ATTENTION, "default"), timed in the
    same recorded benchmark row as the stage."""
    from lib.bench import STANDARD_SHAPES
    _, B, H, S, D = next(s for s in STANDARD_SHAPES if s[0] == shape)
    key, name = {"flash": ("sdpa_flash_us", "SDPA FLASH_ATTENTION"),
                 "default": ("sdpa_us", "SDPA default")}[backend]
    what = f"stage {stage} ≥ {factor:g}× {name} at B{B} H{H} S{S} D{D} {DTYPE_SHORT[dtype]} " \
           f"({'causal' if causal else 'full'})"
    row = next((r for r in recorded_runs(stage, dtype=dtype) if not r.get("skipped") and r.get(key)
                and (r["B"], r["H"], r["Sq"], r["Sk"], r["D"], r["dtype"], r["causal"])
                == (B, H, S, S, D, dtype, causal)), None)
    if row is None:
        print(f"target: {what} — not recorded yet")
        return
    ratio = row[key] / row["us"]
    _md(f"**Target**: {what}. *Recorded* ({R.provenance(R.load())}): {name} "
        f"{row[key]:,.1f} µs, stage {stage} {row['us']:,.1f} µs → "
        f"**{ratio:.2f}×, target {'met' if ratio >= factor else 'missed'}**.")


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
    import statistics
    k = ("B", "H", "Sq", "Sk", "D", "dtype", "causal")
    xs = [r[field] for r in recorded_runs(suite=None, dtype=row["dtype"])
          if not r.get("skipped") and r.get(field)
          and all(r[x] == row[x] for x in k) and r.get("Hkv", r["H"]) == row.get("Hkv", row["H"])]
    return statistics.median(xs) if xs else None


SDPA_MEDIAN_NOTE = ("SDPA columns: the median of the run's SDPA timings at that shape (every "
                    "stage's row timed SDPA again), not the one timing next to this stage.")


def recorded_row(stage: int, shape: str = "throughput", causal: bool = False,
                 dtype: str = "float16") -> dict | None:
    """The recorded row of `stage` at a named standard shape (fp16 unless `dtype`), or None."""
    from lib.bench import STANDARD_SHAPES
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
    if i > 0:
        prev = recorded_row(nums[i - 1])
        if cur and prev:
            gain = (f"**{prev['us'] / cur['us']:.2f}×** stage {nums[i - 1]} at B{cur['B']} "
                    f"H{cur['H']} S{cur['Sq']} D{cur['D']} fp16 ({prev['us']:,.0f} → "
                    f"{cur['us']:,.0f} µs; recorded, commit {data['env']['commit']})")
    elif cur:
        gain = (f"the baseline: {cur['us']:,.0f} µs at B{cur['B']} H{cur['H']} S{cur['Sq']} "
                f"D{cur['D']} fp16 (recorded, commit {data['env']['commit']})")
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


def innermost_loops(sass: str, kernel: str) -> list[dict]:
    """The innermost loops of `kernel` (a substring of its name) in a SASS listing: for each
    backward branch that jumps over no other loop, {'start', 'end' (addresses), 'sass' (its
    lines), 'mix' (opcode Counter)}. A loop body runs once per iteration, so its mix is close to
    what the hardware executes; the whole-kernel mix counts each instruction once."""
    from lib.sass import instruction_mix
    parts = sass.split("Function : ")
    body = next((p for p in parts[1:] if kernel in p.split("\n", 1)[0]), None)
    if body is None:
        raise ValueError(f"no function named like {kernel!r} in the listing")
    lines = [ln for ln in body.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln)]
    addr = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in lines]
    loops = []
    for i, ln in enumerate(lines):
        m = re.search(r"\bBRA\b[^;]*?0x([0-9a-f]+)\s*;", ln)
        if m and int(m.group(1), 16) < addr[i]:
            loops.append((int(m.group(1), 16), addr[i]))
    inner = [(a, b) for a, b in loops
             if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    out = []
    for a, b in sorted(inner):
        text = "\n".join(ln for ln, x in zip(lines, addr) if a <= x <= b)
        out.append({"start": a, "end": b, "sass": text, "mix": instruction_mix(text)})
    return out


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


if __name__ == "__main__":
    import argparse
    import sys
    ap = argparse.ArgumentParser(description="Execute notebooks in place, keeping outputs.")
    ap.add_argument("--execute", nargs="+", required=True, metavar="NOTEBOOK")
    sys.exit(execute(ap.parse_args().execute))
