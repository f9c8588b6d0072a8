"""Where a kernel's warps spend their time, instruction by instruction, from Nsight Compute's
source page (`ncu -i report.ncu-rep --page source --print-source sass --csv`, optionally
gzipped): each SASS instruction's executions and its warp-state samples. A sample lands on
the instruction a warp is at, issuing or stalled, so a run of instructions' share of the samples
is its share of the warps' time.

`segments` cuts a kernel into runs of neighbouring instructions that executed equally often
(a loop body, a work tile's prologue, an epilogue: each runs as often as the thing it does),
the cut the stage 6 notebook reads its profile by:

    python -m lib.ncu results/logs/2026-11-26-f942a3b-h100/causal512-sass.csv.gz --min-share 0.01
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def run_for_profiler(calls, warmups: int = 3) -> None:
    """Run each of `calls` `warmups` times (compile, plan, let the libraries pick their kernels),
    then once more each between torch.cuda.profiler.start() and stop(): what a profiler started
    with `--profile-from-start off` records
    (experiments/profile_pair/profile_pair.py, experiments/profile_backward/profile_backward.py)."""
    import torch
    for _ in range(warmups):
        for f in calls:
            f()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for f in calls:
        f()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _number(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def load(path: str | Path) -> dict[str, list[dict]]:
    """{kernel name: [one dict per SASS instruction, the CSV's columns]} in address order."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    kernels, name, header = {}, None, None
    with opener(path, "rt", newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                name, header = row[1], None
                kernels[name] = []
            elif row[0] == "Address":
                header = row
            elif header is not None and name is not None:
                kernels[name].append(dict(zip(header, row)))
    return kernels


def kernel(kernels: dict, part: str) -> tuple[str, list[dict]]:
    """The one kernel whose name contains `part`."""
    names = [n for n in kernels if part in n]
    if len(names) != 1:
        raise ValueError(f"{len(names)} kernels named like {part!r}: {list(kernels)}")
    return names[0], kernels[names[0]]


def segments(rows: list[dict], min_share: float = 0.0) -> tuple[float, list[dict]]:
    """(all samples, runs of neighbouring instructions with the same execution count whose
    samples are at least `min_share` of the kernel's): start and end address (low 20 bits),
    instructions, executions of each, samples, share, the stall reasons that took most of them,
    and the run's first instruction."""
    total = sum(_number(r[SAMPLES]) for r in rows)
    runs = []
    for r in rows:
        ex, s = _number(r[EXECUTED]), _number(r[SAMPLES])
        addr = int(r["Address"], 16) & 0xFFFFF
        reasons = collections.Counter({k[6:]: _number(v) for k, v in r.items()
                                       if k.startswith("stall_") and "Not Issued" not in k})
        if runs and runs[-1]["executed"] == ex:
            run = runs[-1]
            run.update(end=addr, instructions=run["instructions"] + 1, samples=run["samples"] + s)
            run["reasons"].update(reasons)
        else:
            runs.append({"start": addr, "end": addr, "instructions": 1, "executed": ex, "samples": s,
                         "reasons": reasons, "first": r["Source"].strip()})
    out = []
    for run in runs:
        run["share"] = run["samples"] / total if total else 0.0
        if run["share"] >= min_share:
            run["reasons"] = [k for k, v in run["reasons"].most_common(2) if v > 0]
            out.append(run)
    return total, out


def samples_by_count(rows: list[dict], groups: dict[str, set]) -> dict[str, float]:
    """Samples of the instructions whose execution count is in each group's set ({name: counts}),
    the rest under "other": with counts that say "once per work tile per warp" and "once per key
    tile per warp", a kernel's time splits into what each work tile costs and what its key tiles
    cost."""
    out = dict.fromkeys([*groups, "other"], 0.0)
    for r in rows:
        ex = _number(r[EXECUTED])
        name = next((g for g, counts in groups.items() if ex in counts), "other")
        out[name] += _number(r[SAMPLES])
    return out


def table(rows: list[dict], min_share: float = 0.01) -> str:
    """Markdown: the segments with at least `min_share` of the samples."""
    total, segs = segments(rows, min_share)
    lines = [f"{total:,.0f} samples, {sum(_number(r[EXECUTED]) for r in rows):,.0f} warp instructions executed",
             "", "| addresses | instructions | executed (each) | share of samples | most stalled on | first instruction |",
             "|---|---|---|---|---|---|"]
    for g in segs:
        lines.append(f"| {g['start']:05x}–{g['end']:05x} | {g['instructions']} | {g['executed']:,.0f} | "
                     f"{g['share']:.1%} | {', '.join(g['reasons'])} | `{g['first'][:44]}` |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path, help="ncu --page source --print-source sass --csv output (.csv or .csv.gz)")
    ap.add_argument("--kernel", default="", help="a part of the kernel's name (default: every kernel)")
    ap.add_argument("--min-share", type=float, default=0.01, help="smallest share of samples shown (default 0.01)")
    a = ap.parse_args(argv)
    for name, rows in load(a.csv).items():
        if a.kernel in name:
            print(f"## {name}\n\n{table(rows, a.min_share)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
