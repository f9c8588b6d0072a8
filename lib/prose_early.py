"""Record look-ups for the prose cells of the introduction and the stage 0-2 notebooks (issue 47):
each returns the figures one sentence cites, read from the results file (lib.prose.record), so
that the sentence is rendered again after a re-record instead of going stale. Also the look-ups
of the recorded ncu profiles (results/profiles/) and of the logs a sentence names, and a few for
the stage 3 and 5 notebooks' sentences that test a figure before they draw a conclusion from it."""
from __future__ import annotations

from lib import prose as P
from lib.notebook_common import sdpa_median_us
from lib.prose import record
from lib.reference import attention_flops, attention_min_bytes


shape = P.shape_dims


def row(stage: int, name: str = "latency", causal: bool = False) -> dict:
    """The recorded fp16 row of `stage` at a standard shape (lib.prose.row)."""
    return P.row(stage, name, causal)


def stage_entry(stage: int) -> dict:
    """The record's entry of `stage` (its commit and date), for lib.prose.record_name."""
    return record()["stages"][str(stage)]


def sdpa_us(name: str = "latency", causal: bool = False, backend: str = "default") -> float:
    """SDPA's recorded time at a standard shape: the median over every stage's fp16 rows (each
    timed SDPA again), as the introduction's tables give it."""
    field = "sdpa_us" if backend == "default" else "sdpa_flash_us"
    return sdpa_median_us(*shape(name), causal, field=field)[0]


def vs_sdpa(r: dict, backend: str = "default") -> float:
    """A row's speed against SDPA as the recorded tables give it (lib.prose.vs_sdpa)."""
    return P.vs_sdpa(r, "sdpa_us" if backend == "default" else "sdpa_flash_us")


def floor_us(name: str, causal: bool = False) -> float:
    """The predicted floor of the introduction's section 6 at a standard shape: the larger of
    FLOPs ÷ the recorded matmul rate and the compulsory bytes ÷ the recorded copy bandwidth."""
    B, H, S, D = shape(name)
    ceil = record()["ceilings"]
    return 1e6 * max(attention_flops(B, H, S, S, D, causal) / (ceil["matmul_TFLOPS"] * 1e12),
                     attention_min_bytes(B, H, S, S, D, itemsize=2) / (ceil["copy_GBps"] * 1e9))


# -- the launch-gap experiment (scripts/launch_gap.py), kept in the record as "launch_gap" --------

def launch_gap_entry() -> dict:
    """The experiment's environment (commit, date, GPU), for lib.prose.record_name."""
    return record()["launch_gap"]["env"]


def launch_gap_times(call: str, name: str = "latency", field: str = "held_us") -> list[float]:
    """`field` of the experiment's rows for `call` ("SDPA default", "SDPA flash", "stage 5", ...)
    at a standard shape, both masks."""
    return [r[field] for r in record()["launch_gap"]["rows"] if r["call"] == call and r["shape"] == name]


launch_gap_agreement = P.launch_gap_agreement


def launch_gap_log() -> str:
    """The log of the record's launch-gap experiment (lib.prose.log_of)."""
    return P.log_of(launch_gap_entry(), "*gap.log")


# -- the Nsight Compute profiles (results/profiles/, lib.notebook_common.ncu_report) ------------

def profile(stage: int | str, shape: str = "throughput") -> dict:
    """The recorded ncu report of `stage` (ncu_report); LookupError when there is none."""
    from lib.notebook_common import ncu_report
    rep = ncu_report(stage, shape)
    if rep is None or not rep["kernels"]:
        raise LookupError(f"no recorded ncu profile of stage {stage} at {shape}")
    return rep


def profile_source(rep: dict) -> dict:
    """Where a profile was taken, from its header: {'gpu': 'H200', 'commit', 'date'}."""
    import re
    m = re.search(r"commit (\w+), (.+?), (\d{4}-\d\d-\d\d)", rep["header"])
    if not m:
        raise LookupError(f"no commit, GPU and date in the header of {rep['path']}")
    return {"gpu": P.gpu_short(m.group(2)), "commit": m.group(1)[:7], "date": m.group(3)}


def profile_name(rep: dict) -> str:
    """How prose names a profile: 'the H200 profile (commit 18745d9, 2026-11-29)'."""
    s = profile_source(rep)
    return f"the {s['gpu']} profile (commit {s['commit']}, {s['date']})"


def profile_metric(rep: dict, kernel: str, metric: str) -> float:
    """One metric of one kernel of a report (its value as ncu prints it: % of peak, cycles…)."""
    k = next(k for k in rep["kernels"] if k["name"] == kernel)
    return k["metrics"][metric][0]


def stage1_softmax(name: str = "throughput") -> dict:
    """Stage 1's softmax kernel at a standard shape (fp16, full mask), as its notebook's sections 2
    and 7 compare it: the predicted µs with one pass over S from HBM ('pred') and with all three
    ('pess'), at the recorded copy bandwidth; its duration in the recorded ncu profile ('us'),
    that profile's DRAM and SM throughput in % of peak ('dram', 'sm'), and the profile ('rep')."""
    import stages.stage1 as s1
    B, H, S, D = shape(name)
    cells = s1.padded(S) ** 2
    gbps = record()["ceilings"]["copy_GBps"]
    pred = {n: 1e6 * B * H * (4 * n * S * S + 2 * cells) / (gbps * 1e9) for n in (1, 3)}
    rep = profile(1, name)
    k = "attention_softmax"
    return {"pred": pred[1], "pess": pred[3], "us": profile_metric(rep, k, "Duration"),
            "dram": profile_metric(rep, k, "DRAM Throughput"),
            "sm": profile_metric(rep, k, "Compute (SM) Throughput"), "rep": rep}


def stage3_long_scoreboard(shape_name: str = "throughput") -> dict:
    """Stage 3's recorded ncu profiles in fp16 and bf16 at a standard shape: the share of time
    their warps stalled on the long scoreboard ('h' fp16, 'b' bf16, as '9.8%'), 'gap' (whether
    bf16's share is 1.5 times fp16's or more) and where both were taken ('gpu', 'commit', 'date')."""
    from lib.notebook_stage34 import profile_facts
    stall, where = {}, set()
    for dt in ("float16", "bfloat16"):
        f = profile_facts("3", f"{shape_name}-{dt}")
        if f is None or f.get("stall long_scoreboard") is None:
            raise LookupError(f"no long-scoreboard stall in a recorded profile of stage 3 ({dt})")
        stall[dt] = f["stall long_scoreboard"]
        where.add(tuple(profile_source(profile("3", f"{shape_name}-{dt}")).items()))
    if len(where) != 1:
        raise LookupError("stage 3's fp16 and bf16 profiles come from different runs")
    return {"h": P.pct(stall["float16"] / 100, 1), "b": P.pct(stall["bfloat16"] / 100, 1),
            "gap": stall["bfloat16"] >= 1.5 * stall["float16"], **dict(where.pop())}


# -- stage 5's tile sweep against its benchmark rows (scripts/tile_sweep.py, the record) ---------

# the rivals lib.notebook_stage34.prose_stage5_tiles compares the chosen tiles with
STAGE5_RIVAL = {64: "(128, 128, 2, 32)", 128: "(128, 32, 2, 32)"}


def stage5_sweep_gaps() -> dict:
    """The chosen tiles of stage 5 in the record's tile sweep: 'behind', the largest share of time
    they take over STAGE5_RIVAL at one head dim and mask, with its (D, causal) 'at'; 'moved', the
    largest difference between the chosen tiles' time in the sweep and in stage 5's benchmark row
    of the same shape, with its (D, causal) 'moved_at' and both times ('sweep_us', 'row_us')."""
    from lib.notebook_stage34 import rec_tile_us
    shapes = {64: "throughput", 128: "long"}
    keys = [(D, c) for D in (64, 128) for c in (False, True)]
    behind = {k: rec_tile_us(5, *k) / rec_tile_us(5, *k, STAGE5_RIVAL[k[0]]) - 1 for k in keys}
    runs = {k: (rec_tile_us(5, *k), P.row(5, shapes[k[0]], k[1])["us"]) for k in keys}
    at, moved_at = max(keys, key=behind.get), max(keys, key=lambda k: abs(runs[k][0] / runs[k][1] - 1))
    return {"behind": behind[at], "at": at, "moved": abs(runs[moved_at][0] / runs[moved_at][1] - 1),
            "moved_at": moved_at, "sweep_us": runs[moved_at][0], "row_us": runs[moved_at][1]}


def stage5_sweep_text() -> dict:
    """stage5_sweep_gaps for a sentence: 'moved_more' (whether the chosen tiles' own time moved by
    more between the sweep and the benchmark than the largest gap behind a rival), 'moved', 'mD',
    'mm', 'st1', 'st2' (that movement, where, the sweep's and the row's µs), 'gap', 'gD', 'gm'
    (the largest gap behind, where), 'lgpu' (the GPU of the interleaved log, lib.notebook_stage34
    .tiles5_interleaved) and 'note' ('; on the H200 they have not been timed that way' when the
    log's GPU is not the record's)."""
    from lib.notebook_stage34 import tiles5_interleaved
    g = stage5_sweep_gaps()
    mask = {False: "full", True: "causal"}
    lgpu, gpu = P.gpu_short(tiles5_interleaved()["env"]["gpu"]), P.gpu_short()
    return {"moved_more": g["moved"] > g["behind"], "moved": P.pct(g["moved"], 1), "mD": g["moved_at"][0],
            "mm": mask[g["moved_at"][1]], "st1": P.us(g["sweep_us"]), "st2": P.us(g["row_us"]),
            "gap": P.pct(g["behind"], 1), "gD": g["at"][0], "gm": mask[g["at"][1]], "lgpu": lgpu,
            "note": "" if lgpu == gpu else f"; on the {gpu} they have not been timed that way"}


def stage5_targets() -> dict:
    """Stage 5's targets against SDPA's FLASH_ATTENTION (the notebook's section 2: ≥ 1× at the long
    shape, ≥ 0.9× at the throughput shape, full and causal), checked as show_target_sdpa checks
    them: the ratios (r128, c128, r64, c64) and a verdict per head dim (v128, v64)."""
    from lib.notebook_common import sdpa_median_of
    out = {}
    for D, name, factor in ((128, "long", 1.0), (64, "throughput", 0.9)):
        r = {c: sdpa_median_of(P.row(5, name, c), "sdpa_flash_us") / P.row(5, name, c)["us"]
             for c in (False, True)}
        met = [c for c in (False, True) if r[c] >= factor]
        out[f"r{D}"], out[f"c{D}"] = P.x(r[False]), P.x(r[True])
        out[f"v{D}"] = ("meets both targets" if len(met) == 2 else "misses both targets" if not met
                        else f"meets the target with the {'causal' if met[0] else 'full'} mask only")
    return {**out, "rec": P.record_name(stage_entry(5))}


def loads_in_flight_spread(D: int, causal: bool = False, pair: tuple | None = None) -> float:
    """Slowest ÷ fastest − 1 of the recorded stage 4 choices differing only in loads in flight,
    for one (BLOCK_Q, BLOCK_K) pair (default: the chosen one)."""
    import stages.stage4 as s4
    from lib.notebook_stage34 import _tile_rows
    bq, bk = pair or s4.TILES[D][:2]
    ts = [r["us"] for r in _tile_rows(4, D, causal) if r["variant"].startswith(f"({bq}, {bk},")]
    return max(ts) / min(ts) - 1 if len(ts) > 1 else 0.0


def loads_in_flight_pairs(D: int, causal: bool = False) -> dict:
    """{(BLOCK_Q, BLOCK_K): loads_in_flight_spread} for every pair the sweep timed with several
    loads in flight."""
    from lib.notebook_stage34 import _tile_rows
    pairs = {tuple(int(v) for v in r["variant"].strip("()").split(",")[:2]) for r in _tile_rows(4, D, causal)}
    return {p: loads_in_flight_spread(D, causal, p) for p in sorted(pairs)
            if sum(r["variant"].startswith(f"({p[0]}, {p[1]},") for r in _tile_rows(4, D, causal)) > 1}


def prose_stage4_tiles() -> dict:
    """The old stage 4 defaults against the chosen ones in the recorded sweep (a, b at D 64 full and
    causal; c, d at D 128), and the spread of the loads in flight (p)."""
    from lib.notebook_stage34 import rec_tile_us, tiles_name
    from lib.prose import pct, x
    old = {64: "(64, 64, 16)", 128: "(64, 32, 32)"}
    r = [x(rec_tile_us(4, D, c, old[D]) / rec_tile_us(4, D, c)) for D in (64, 128) for c in (False, True)]
    chosen = max(loads_in_flight_spread(D, c) for D in (64, 128) for c in (False, True))
    every = max(((v, D, p) for D in (64, 128) for c in (False, True) for p, v in loads_in_flight_pairs(D, c).items()),
                default=(0.0, None, None))
    if every[0] <= max(chosen, 0.01):
        lif = f"barely matter: the choices that differ only in it lie within {pct(every[0], 1)} of each other"
    else:
        lif = (f"matter little for the chosen tiles (within {pct(chosen, 1)}) but not everywhere: at D {every[1]} the "
               f"choices {every[2]} with different loads in flight lie up to {pct(every[0], 1)} apart")
    return {"rec": tiles_name(), "a": r[0], "b": r[1], "c": r[2], "d": r[3], "p": pct(chosen, 1), "lif": lif}
