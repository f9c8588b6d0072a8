"""Stage 6's notebook prose: small look-ups into the record (lib.prose.record) that its prose
cells render sentences from — the stage's benchmark rows, its schedule record ("stage6"), the
shape map, the ceilings, the anchor run and the recorded Nsight Compute profile. Each returns
numbers, never text, so that a sentence reads the same after a re-record with new figures."""
from __future__ import annotations

import json
import statistics

from lib import prose as P
from lib.notebook_common import ROOT, ncu_report
from lib.prose import record

SHAPE_OF_D = {64: "throughput", 128: "long"}
STD = {64: (16, 16, 2048), 128: (4, 16, 8192)}  # B, H, S of each head dim's standard shape


# -- the benchmark rows ("runs") ---------------------------------------------------------------

def row(shape: str, causal: bool = False, dtype: str = "float16", stage: int = 6) -> dict:
    """A recorded benchmark row at a standard shape (lib.prose.row)."""
    return P.row(stage, shape, causal, dtype)


vs_own = P.vs_own_sdpa      # SDPA default's time in the row's own run ÷ the stage's
vs_median = P.vs_sdpa       # SDPA's median time over every stage's rows at that shape ÷ the stage's


def vs_flash(r: dict) -> float:
    return r["sdpa_flash_us"] / r["us"]


def over_stage5(shape: str, causal: bool) -> float:
    return row(shape, causal, stage=5)["us"] / row(shape, causal)["us"]


def standard_rows(dtype: str = "float16"):
    """The four (shape, causal) rows of the throughput and long shapes."""
    return [row(s, c, dtype) for s in ("throughput", "long") for c in (False, True)]


# -- the schedule record ("stage6": scripts/stage6_schedules.py) --------------------------------

def stage6_rows() -> list[dict]:
    return record()["stage6"]["rows"]


def sched(D: int, causal: bool, variant: str, kind: str = "schedule") -> dict:
    """The fp16 row of `variant` at head dim D's standard shape."""
    B, H, S = STD[D]
    for r in stage6_rows():
        if (r["kind"], r["variant"], r["B"], r["H"], r["S"], r["D"], r["causal"]) == \
                (kind, variant, B, H, S, D, causal) and r.get("dtype", "float16") == "float16":
            return r
    raise LookupError(f"no stage6 row {kind}: {variant} at D{D} causal={causal}")


def step(D: int, causal: bool, variant: str) -> float:
    """A waterfall step against the step before it: the previous step's time ÷ this one's."""
    rows = [r for r in stage6_rows() if r["kind"] == "schedule" and r.get("dtype", "float16") == "float16"
            and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (*STD[D], D, causal)]
    i = next(i for i, r in enumerate(rows) if r["variant"] == variant)
    return rows[i - 1]["us"] / rows[i]["us"]


def steps(variant: str) -> list[float]:
    """`step` at the four standard shapes: D64 full, D64 causal, D128 full, D128 causal."""
    return [step(D, c, variant) for D in (64, 128) for c in (False, True)]


def against(D: int, causal: bool, variant: str, kind: str, reference: str = "+ intra-warpgroup overlap") -> float:
    """The reference schedule's time ÷ a variant's (below 1: the variant is slower)."""
    return sched(D, causal, reference)["us"] / sched(D, causal, variant, kind)["us"]


def exp2_poly_ratios(by_shape: bool = False) -> list:
    """Every exp2_poly fraction above 0 against the fraction 0, at all four shapes (by_shape: one
    list per shape, in the record's order of fractions)."""
    if by_shape:
        return [exp2_poly_at(D, c) for D in (64, 128) for c in (False, True)]
    return [r for D in (64, 128) for c in (False, True) for r in exp2_poly_at(D, c)]


def exp2_poly_at(D: int, causal: bool) -> list[float]:
    out = []
    rows = [r for r in stage6_rows() if r["kind"] == "exp2_poly" and r["D"] == D and r["causal"] == causal
            and r.get("dtype", "float16") == "float16"]
    none = next(r for r in rows if r["variant"].startswith("0/"))
    rows = sorted((r for r in rows if not r["variant"].startswith("0/")), key=lambda r: int(r["variant"].split("/")[0]))
    out += [none["us"] / r["us"] for r in rows]
    return out


def default_repeats(D: int, causal: bool) -> list[float]:
    """The times (µs) of the rows that timed the default build, launched as a call is, at head
    dim D's standard shape (lib.notebook_ideas.stage6_repeat_rows)."""
    from lib.notebook_ideas import stage6_repeat_rows
    return [r["us"] for r in stage6_repeat_rows(stage6_rows(), *STD[D], D, causal, record()["env"]["sm_count"])]


def repeat_spread() -> list[float]:
    """Per standard shape, slowest ÷ fastest of the rows that timed the default build again
    (as fractions)."""
    out = []
    for D in (64, 128):
        for c in (False, True):
            us = default_repeats(D, c)
            out.append(max(us) / min(us) - 1)
    return out


def fastest_schedule(D: int, causal: bool) -> dict:
    """The fastest fp16 schedule or variant row (not tiles, exp2_poly, rescale) at head dim D's
    standard shape."""
    return min((r for r in stage6_rows() if r["kind"] in ("schedule", "variant")
                and r.get("dtype", "float16") == "float16"
                and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (*STD[D], D, causal)),
               key=lambda r: r["us"])


def schedule_us(D: int, causal: bool, name: str) -> float:
    """The fp16 time (µs) of a schedule or variant, by name, at head dim D's standard shape."""
    import stages.stage6 as s6
    return sched(D, causal, name, "variant" if name in s6.VARIANTS else "schedule")["us"]


def call_schedule_at(D: int, causal: bool) -> str:
    """The schedule stage6.call_schedule gives a call at head dim D's standard shape (fp16,
    the record's SM count)."""
    import stages.stage6 as s6
    B, H, S = STD[D]
    work = B * H * -(-S // (64 * s6.TILES[D][2]))
    return s6.call_schedule(D, causal, S, work, record()["env"]["sm_count"])


def timeline():
    return record()["stage6"]["timeline"]


# -- ceilings, anchor run, profile -------------------------------------------------------------

def implied_clock_ghz() -> float:
    """The clock at which the recorded matmul rate is the tensor cores' peak (section 2)."""
    from lib.plots_stage6 import TENSOR_FLOP_PER_CLOCK
    return record()["ceilings"]["matmul_TFLOPS"] * 1e12 / (record()["env"]["sm_count"] * TENSOR_FLOP_PER_CLOCK) / 1e9


def mufu_clock_ghz() -> float:
    """The clock implied by the recorded MUFU.EX2 rate at 16 per SM per clock."""
    return record()["ceilings"]["mufu_ex2_Gops"] / (record()["env"]["sm_count"] * 16)


def copy_us(nbytes: float) -> float:
    """The time to move `nbytes` at the recorded copy ceiling."""
    return nbytes / (record()["ceilings"]["copy_GBps"] * 1e9) * 1e6


def anchor() -> dict:
    return json.loads((ROOT / "results/anchors/h100_fa4_sm90.json").read_text())


def anchor_row(B, H, S, D, causal=False, dtype="float16") -> dict:
    return next(r for r in anchor()["rows"] if (r["B"], r["H"], r["Sq"], r["D"], r["causal"], r["dtype"])
                == (B, H, S, D, causal, dtype))


def anchor_where() -> str:
    """How prose names the anchor run: 'an H100' (its GPU, with 'another run on the same GPU
    model' when the record's GPU is the same)."""
    from lib.prose import gpu_short
    gpu, own = anchor()["env"]["gpu"], record()["env"]["gpu"]
    return ("another run on the same GPU model" if gpu == own
            else f"a run on an {gpu_short(gpu)}, not on this record's {gpu_short(own)}")


def anchor_vs_sdpa(B, H, S, D, causal=False, dtype="float16") -> float:
    t = anchor_row(B, H, S, D, causal, dtype)["tflops"]
    return t["fa4_sm90"] / t["sdpa_default"]


def profile() -> dict:
    """The recorded Nsight Compute profile of stage 6 at the throughput shape: its commit, the SM
    clock, the warps active per SM and the cycles between one warp's instructions."""
    rep = ncu_report(6)
    m = rep["kernels"][0]["metrics"]
    warps = m["Achieved Occupancy"][0] / 100 * 64  # 64 warps per SM at full occupancy
    cpi = m["Warp Cycles Per Issued Instruction"][0]
    from lib.prose_early import profile_source
    commit = profile_source(rep)["commit"]
    return {"commit": commit, "ghz": m["SM Frequency"][0], "warps": warps, "cpi": cpi,
            "issue": warps / 4 / cpi}


# -- the shape map ------------------------------------------------------------------------------

def smap() -> dict:
    return record()["shape_map"]


def waterfall(B, H, Hkv, Sq, Sk, D) -> dict:
    """{variant: row} of the shape map's decoding waterfall at one shape."""
    return {r["variant"]: r for r in smap()["rows"] if r["part"] == "waterfall"
            and (r["B"], r["H"], r["Hkv"], r["Sq"], r["Sk"], r["D"]) == (B, H, Hkv, Sq, Sk, D)}


def grid(part: str, Sq: int | None = None, dtype: str = "bfloat16", masked: bool = False) -> list[dict]:
    """The map's rows of one part; decode rows without a mask, or (masked) the ones timed with the
    bottom-right mask (B 1, Sq > 1)."""
    return [r for r in smap()["rows"] if r["part"] == part and r["dtype"] == dtype
            and r.get("vs_sdpa") and (Sq is None or r["Sq"] == Sq)
            and (part != "decode" or bool(r["causal"]) == masked)]


def grid_stats(part: str, Sq: int | None = None, rows: list | None = None) -> dict:
    """The ratio to SDPA default over a grid (or over `rows`): lo, hi, median, rows, rows at or
    above 0.995, rows below 1, and the lowest row."""
    rows = grid(part, Sq) if rows is None else rows
    xs = [r["vs_sdpa"] for r in rows]
    low = min(rows, key=lambda r: r["vs_sdpa"])
    return {"lo": min(xs), "hi": max(xs), "median": statistics.median(xs), "n": len(xs),
            "at": sum(x >= 0.995 for x in xs), "below": sum(x < 1.0 for x in xs), "low": low,
            "low_name": f"B{low['B']} H{low['H']}/{low['Hkv']} Sk{low['Sk']} D{low['D']}",
            "flash_lo": min(r["vs_flash"] for r in rows)}


def latency_rows(dtype: str = "float16") -> list[dict]:
    return [row("latency", c, dtype) for c in (False, True)]


def commit_of_runs(stage: int = 6) -> str:
    """The commit that recorded a stage's benchmark rows."""
    data = record()
    return data["stages"].get(str(stage), {}).get("commit", data["env"]["commit"])


def runs_entry(stage: int = 6) -> dict:
    """The part of the record with a stage's rows' commit and date (for lib.prose.record_name)."""
    return record()["stages"].get(str(stage), record()["env"])

