"""Record look-ups for the prose cells of the introduction and the stage 0-2 notebooks (issue 47):
each returns the figures one sentence cites, read from the results file (lib.prose.record), so
that the sentence is rendered again after a re-record instead of going stale."""
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
