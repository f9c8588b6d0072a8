"""Plots of recorded or live results (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from lib.results import shape_text, standard_runs


def plot_stages(data: dict, path: Path | None = None, dtype: str = "float16"):
    """TFLOPS of every stage at each standard shape in `dtype` (one series per stage: the
    other dtypes' rows of a stage would land on the same bar), next to SDPA's two backends
    (log scale)."""
    runs = [r for r in standard_runs(data) if not r.get("skipped") and r["dtype"] == dtype]
    keys = list(dict.fromkeys((shape_text(r), r["causal"]) for r in runs))
    stages = sorted({r["stage"] for r in runs})
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(keys)), 4))
    width = 0.8 / (len(stages) + 2)
    for si, st in enumerate(stages):
        ys = [next((r["tflops"] for r in runs if r["stage"] == st and
                    (shape_text(r), r["causal"]) == k), 0) for k in keys]
        ax.bar([i + si * width for i in range(len(keys))], ys, width, label=f"stage {st}")
    for j, (field, label) in enumerate((("sdpa_tflops", "SDPA default"),
                                        ("sdpa_flash_tflops", "SDPA flash"))):
        ys = [max((r.get(field) or 0) for r in runs if (shape_text(r), r["causal"]) == k)
              for k in keys]
        ax.bar([i + (len(stages) + j) * width for i in range(len(keys))], ys, width,
               label=label, hatch="//" if j else None, alpha=0.6)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))])
    ax.set_xticklabels([f"{s}\n{'causal' if c else 'full'}" for s, c in keys], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("TFLOPS (log scale)")
    ax.set_title(f"Attention forward on {data['env']['gpu']} ({dtype})")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return Path(path) if path else fig


def plot_sweep(data: dict, path: Path | None = None, dtype: str = "float16"):
    """TFLOPS against sequence length (B·S fixed), one panel per head dim, non-causal, in
    `dtype` (lib.bench sweeps in one dtype, float16 when recording)."""
    runs = [r for r in data["runs"] if r.get("suite") == "sweep" and not r.get("skipped")
            and not r["causal"] and r["dtype"] == dtype]
    dims = sorted({r["D"] for r in runs})
    fig, axes = plt.subplots(1, max(1, len(dims)), figsize=(5 * max(1, len(dims)), 3.6),
                             squeeze=False)
    for ax, D in zip(axes[0], dims):
        rd = [r for r in runs if r["D"] == D]
        for st in sorted({r["stage"] for r in rd}):
            pts = sorted((r["Sq"], r["tflops"]) for r in rd if r["stage"] == st)
            ax.plot(*zip(*pts), marker="o", label=f"stage {st}")
        for field, label, style in (("sdpa_tflops", "SDPA default", "k--"),
                                    ("sdpa_flash_tflops", "SDPA flash", "k:")):
            pts = sorted({r["Sq"]: r[field] for r in rd if r.get(field)}.items())
            if pts:
                ax.plot(*zip(*pts), style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length S")
        ax.set_ylabel("TFLOPS")
        ax.set_title(f"D={D}, H16, B·S fixed")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return Path(path) if path else fig


# --------------------------------------------------------------------------------------------
# the roofline: what a kernel of a given arithmetic intensity can reach on the measured GPU

# compute ceilings that lib.timing.measure_ceilings records: (key, what runs at that rate)
COMPUTE_ROOFS = (("matmul_TFLOPS", "tensor cores, cuBLAS matmul (WGMMA on Hopper)"),
                 ("hmma_TFLOPS", "tensor cores, mma.sync m16n8k16 (HMMA.16816)"),
                 ("fp32_TFLOPS", "FP32 on the CUDA cores"))
# MUFU.EX2 is not a FLOP rate: attention takes one 2^x per score and does 4·D FLOPs per score
# (2·D in Q·Kᵀ, 2·D in P·V), so the 2^x rate caps attention at rate × 4·D FLOPs.
MUFU_KEY = "mufu_ex2_Gops"


def mufu_roof_tflops(ceilings: dict, head_dim: int) -> float | None:
    """The attention FLOP rate that MUFU.EX2 alone allows at `head_dim`: one 2^x per score,
    4·head_dim FLOPs per score. None when the rate was not measured."""
    rate = ceilings.get(MUFU_KEY)
    return None if rate is None else rate * 1e9 * 4 * head_dim / 1e12


def attainable_tflops(ceilings: dict, intensity: float, rate: str = "matmul_TFLOPS") -> float:
    """The roofline at `intensity` FLOPs per byte: min(copy bandwidth × intensity, the compute
    rate `rate`), in TFLOPS, from a ceilings dict as lib.timing.measure_ceilings returns it."""
    return min(ceilings["copy_GBps"] * 1e9 * intensity / 1e12, ceilings[rate])


def _spread(ceilings: dict, key: str) -> str:
    lo, hi = ceilings.get(key + "_min"), ceilings.get(key + "_max")
    return f" [{lo:,.0f}–{hi:,.0f}]" if lo is not None and hi is not None else ""


def plot_roofline(ceilings: dict, x_range=(1.0, 1e4), ax=None, head_dims=()):
    """Draw the rooflines of `ceilings` on log-log axes (x: FLOPs per byte, y: TFLOPS): the
    memory roof (copy bandwidth × intensity), a flat roof for each compute rate present
    (COMPUTE_ROOFS), and for each of `head_dims` the roof MUFU.EX2 sets on attention at that
    head dim (mufu_roof_tflops), named with their rates (median, [min–max] of the repeats) and
    ridge points in a legend at the upper left. Returns the axes; the caller places its kernels
    on them (to keep this legend next to one of its own: ax.add_artist(ax.get_legend()) first)."""
    import numpy as np
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 4.8))
    lo, hi = x_range
    slope = ceilings["copy_GBps"] * 1e9 / 1e12  # TFLOPS per FLOP/byte of intensity
    rates = [(k, what, ceilings[k]) for k, what in COMPUTE_ROOFS if ceilings.get(k)]
    mufu = [(MUFU_KEY, f"MUFU.EX2 {ceilings[MUFU_KEY]:,.0f} Gop/s{_spread(ceilings, MUFU_KEY)}, "
             f"one 2^x per score, D {d}", mufu_roof_tflops(ceilings, d))
            for d in head_dims if ceilings.get(MUFU_KEY)]
    top = max((r for _, _, r in rates + mufu), default=slope * hi)
    x_mem = np.geomspace(lo, min(hi, top / slope), 100)
    ax.plot(x_mem, slope * x_mem, "-", color="0.45", lw=2,
            label=f"memory roof: copy bandwidth {ceilings['copy_GBps']:,.0f} GB/s"
                  f"{_spread(ceilings, 'copy_GBps')} × intensity")
    for style, (key, what, rate) in zip(("-", "--", ":", "-."), rates):
        ridge = rate / slope
        ax.plot([max(lo, ridge), hi], [rate, rate], "k" + style, lw=1.5 if style == "-" else 1,
                label=f"{what}: {rate:,.0f}{_spread(ceilings, key)} TFLOPS "
                      f"(ridge {ridge:,.0f} FLOP/byte)")
    for colour, (_, what, rate) in zip(("tab:purple", "tab:pink", "tab:brown"), mufu):
        ridge = rate / slope
        ax.plot([max(lo, ridge), hi], [rate, rate], ls=(0, (5, 2, 1, 2)), color=colour, lw=1,
                label=f"{what}: {rate:,.0f} TFLOPS of attention")
    ax.update_datalim([(lo, top * 2.5)])  # room above the highest roof
    ax.autoscale_view()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of device memory)")
    ax.set_ylabel("TFLOPS")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    return ax


# --------------------------------------------------------------------------------------------
# stage 6 (Hopper): pictures of the design and of its measurements

def draw_swizzle(rows: int = 16, ax=None):
    """The 128-byte swizzle TMA writes and wgmma reads: row r of a 128-byte-wide tile keeps its
    16-byte chunk c at position c XOR (r mod 8). Colour = the logical chunk; the eight rows
    that one 8-row group spans put any given chunk in eight different bank groups."""
    import numpy as np
    ax = ax or plt.subplots(figsize=(5, 0.28 * rows + 1))[1]
    grid = np.array([[p ^ (r % 8) for p in range(8)] for r in range(rows)])
    ax.imshow(grid, cmap="tab10", aspect="auto", vmin=0, vmax=9)
    for r in range(rows):
        for p in range(8):
            ax.text(p, r, str(grid[r, p]), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(8), [f"{16 * p}–{16 * p + 15}" for p in range(8)], fontsize=6, rotation=30)
    ax.set_xlabel("bytes of the 128-byte row (4-byte banks 4p … 4p + 3)")
    ax.set_yticks(range(rows))
    ax.set_ylabel("row")
    ax.set_title("128-byte swizzle: logical 16-byte chunk stored at each position", fontsize=9)
    return ax


def draw_pipeline(tiles: int = 5, gemm: float = 1.0, softmax: float = 0.8, ax=None):
    """A schematic (not a measurement) of stage 6's schedule with two consumer warpgroups:
    the producer's copies, and per consumer Q·Kᵀ / softmax / P·V with ping-pong and the
    next tile's Q·Kᵀ issued before this tile's softmax. Units: one Q·Kᵀ = `gemm` / 2."""
    ax = ax or plt.subplots(figsize=(10, 2.6))[1]
    half = gemm / 2
    colors = {"Q·Kᵀ": "tab:blue", "P·V": "tab:orange", "softmax": "tab:green", "copy K/V": "0.6"}
    t_core = 0.0   # when the tensor cores are free
    ready = [0.0, 0.0]
    for j in range(tiles):
        ax.barh(2, 0.8 * half, left=j * gemm, color=colors["copy K/V"], edgecolor="k", lw=0.4)
        for c in range(2):
            start = max(t_core, ready[c])
            ax.barh(1 - c, half, left=start, color=colors["Q·Kᵀ"], edgecolor="k", lw=0.4)
            if j:
                ax.barh(1 - c, half, left=start + half, color=colors["P·V"], edgecolor="k", lw=0.4)
            s0 = start + half
            ax.barh(1 - c, softmax, left=s0, height=0.35, color=colors["softmax"], edgecolor="k", lw=0.4)
            t_core = start + (gemm if j else half)
            ready[c] = max(s0 + softmax, t_core)
    ax.set_yticks([2, 1, 0], ["producer", "consumer 1", "consumer 2"])
    ax.set_xlabel("time (schematic)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=v) for v in colors.values()],
              labels=list(colors), fontsize=7, ncol=4, loc="upper right")
    ax.set_title("Warp-specialized ping-pong, next Q·Kᵀ before this softmax (schematic)", fontsize=9)
    return ax


def plot_waterfall(rows: list[dict], title: str, sdpa_tflops: float | None = None,
                   anchors: dict | None = None, ax=None):
    """Bars: TFLOPS of each schedule step (rows in order, each {"variant", "tflops"}); a line
    at SDPA's default backend from the same run, and dashed lines for anchors measured in
    another run on the same GPU model ({label: TFLOPS})."""
    ax = ax or plt.subplots(figsize=(7, 3.2))[1]
    names = [r["variant"] for r in rows]
    ys = [r["tflops"] for r in rows]
    bars = ax.bar(range(len(ys)), ys, color="tab:blue")
    for b, y in zip(bars, ys):
        ax.text(b.get_x() + b.get_width() / 2, y, f"{y:.0f}", ha="center", va="bottom", fontsize=7)
    if sdpa_tflops:
        ax.axhline(sdpa_tflops, color="k", lw=1, label=f"SDPA default, same run ({sdpa_tflops:.0f})")
    for i, (label, v) in enumerate((anchors or {}).items()):
        ax.axhline(v, color=f"C{i + 3}", ls="--", lw=1, label=f"{label} ({v:.0f})")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("TFLOPS")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return ax


def plot_timeline(stamps: list, consumers: int, tiles: int = 8, title: str = "", ax=None):
    """Gantt chart of stage 6's TIMELINE build: stamps[role][tile] = clock64 at (0) operands in
    (producer: K copy issued), (1) S ready, (2) softmax done, (3) P·V done; role 0 = producer."""
    ax = ax or plt.subplots(figsize=(10, 2.4))[1]
    t0 = min(x for role in stamps for t in role[:tiles] for x in t if x > 0)
    for c in range(1, consumers + 1):
        y = consumers + 1 - c
        for j in range(tiles):
            e = [x - t0 for x in stamps[c][j]]
            ax.barh(y, e[1] - e[0], left=e[0], color="tab:blue", edgecolor="k", lw=0.3)
            ax.barh(y, e[2] - e[1], left=e[1], height=0.4, color="tab:green", edgecolor="k", lw=0.3)
            if e[3] > 0:
                ax.plot([e[3]], [y + 0.3], "v", color="tab:orange", ms=4)
    for j in range(tiles):
        for k, col in ((0, "0.4"), (1, "0.7")):
            x = stamps[0][j][k]
            if x > 0:
                ax.plot([x - t0], [consumers + 1], "|", color=col, ms=10)
    ax.set_yticks(range(consumers + 1, 0, -1), ["producer"] + [f"consumer {c}" for c in range(1, consumers + 1)])
    ax.set_xlabel("SM clock cycles (clock64), one block")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:blue", "tab:green")]
              + [plt.Line2D([], [], marker="v", ls="", color="tab:orange"),
                 plt.Line2D([], [], marker="|", ls="", color="0.4", ms=10)],
              labels=["waiting for S = Q·Kᵀ", "softmax", "P·V done", "K copy issued"],
              fontsize=7, ncol=4, loc="upper right")
    ax.set_title(title, fontsize=9)
    return ax


def plot_journey_waterfall(data: dict, B: int, H: int, S: int, D: int, causal: bool = False,
                           anchors: dict | None = None, ax=None):
    """Every stage's recorded TFLOPS at one standard shape as a share of the measured matmul
    ceiling (log scale: stage 0 and stage 6 are three orders apart), then stage 6's schedule
    steps from its own record; SDPA's default backend (the run's median at the shape) and
    `anchors` ({label: TFLOPS}, from another run on the same GPU model) as lines."""
    import math
    peak = (data.get("ceilings") or {}).get("matmul_TFLOPS")
    rows = {r["stage"]: r for r in standard_runs(data) if not r.get("skipped") and r["dtype"] == "float16"
            and (r["B"], r["H"], r["Sq"], r["D"], r["causal"]) == (B, H, S, D, causal)}
    names = [f"stage {n}" for n in sorted(rows)]
    ys = [rows[n]["tflops"] for n in sorted(rows)]
    steps = [r for r in (data.get("stage6") or {}).get("rows", []) if r["kind"] == "schedule"
             and r.get("dtype", "float16") == "float16"
             and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal)]
    names += [f"6: {r['variant']}" for r in steps]
    ys += [r["tflops"] for r in steps]
    ax = ax or plt.subplots(figsize=(10, 3.6))[1]
    scale = 100 / peak if peak else 1.0
    colors = ["tab:blue"] * len(rows) + ["tab:purple"] * len(steps)
    bars = ax.bar(range(len(ys)), [y * scale for y in ys], color=colors)
    for b, y in zip(bars, ys):
        ax.text(b.get_x() + b.get_width() / 2, y * scale, f"{y:.3g}", ha="center", va="bottom", fontsize=6)
    sd = sorted(r["sdpa_tflops"] for r in rows.values() if r.get("sdpa_tflops"))
    if sd:
        ax.axhline(sd[len(sd) // 2] * scale, color="k", lw=1, label=f"SDPA default, this run ({sd[len(sd) // 2]:.0f} TFLOPS)")
    for i, (label, v) in enumerate((anchors or {}).items()):
        ax.axhline(v * scale, color=f"C{i + 3}", ls="--", lw=1, label=f"{label} ({v:.0f} TFLOPS)")
    ax.set_yscale("log")
    ax.set_ylim(bottom=min(ys) * scale / 2, top=100 * (1.3 if peak else math.inf) if peak else None)
    ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("% of the matmul ceiling" if peak else "TFLOPS")
    ax.set_title(f"B{B} H{H} S{S} D{D} fp16 {'causal' if causal else 'full'}: every stage, then stage 6 idea by idea"
                 + (f" (ceiling {peak:.0f} TFLOPS)" if peak else ""), fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return ax


def timeline_phases(tl: dict, first: int = 1, last: int = 12) -> dict:
    """From stage 6's timeline record ({"stamps": {schedule: stamps}, "consumers": n}): per
    schedule and consumer, mean cycles per key tile and of its two phases (waiting for S, the
    softmax) over tiles first … last − 1 (past the block's start, before its end)."""
    out = {}
    for name, st in tl["stamps"].items():
        out[name] = []
        for c in range(1, 1 + tl["consumers"]):
            t = st[c][first:last]
            out[name].append({"tile": (st[c][last][0] - st[c][first][0]) / (last - first),
                              "wait_s": sum(x[1] - x[0] for x in t) / len(t),
                              "softmax": sum(x[2] - x[1] for x in t) / len(t)})
    return out


def timeline_summary(tl: dict) -> str:
    """timeline_phases as text, a line per schedule."""
    return "\n".join(f"  {name:28s} " + "; ".join(
        f"consumer {c}: {p['tile']:,.0f} cycles per key tile, S wait {p['wait_s']:,.0f}, softmax {p['softmax']:,.0f}"
        for c, p in enumerate(per, 1)) for name, per in timeline_phases(tl).items())


# ============================================================================================
# Host time per call against GPU time per call (the journey's "host time against kernel time";
# issue 11): what a model making many small attention calls waits on.

HOST_COLORS = {"host_us": "tab:orange", "host_gpu_us": "tab:blue"}


def plot_host_time(rows: dict, title: str, ax=None):
    """Grouped bars at one shape, from recorded rows ({stage: row}, rows with "host_us"): per
    stage its host µs/call (wall time of many back-to-back calls ÷ calls) and its GPU µs/call
    (CUDA events around the same calls), then SDPA's pair as a last group: the median over
    the rows (every stage's run timed SDPA again), the whiskers its range. A black tick on each
    stage's group marks SDPA's host µs/call from that stage's own run. Log scale."""
    import statistics
    ax = ax or plt.subplots(figsize=(7, 3.6))[1]
    order = sorted(rows)
    width = 0.38
    top, bottom = 1.0, float("inf")

    def bar(x, y, key, err=None):
        nonlocal top, bottom
        if not y:
            return
        ax.bar(x, y, width, color=HOST_COLORS[key], yerr=err, capsize=2 if err else 0,
               error_kw={"lw": 0.8})
        ax.text(x, (y if err is None else y + err[1][0]) * 1.08,
                f"{y:,.0f}" if y >= 100 else f"{y:.3g}",
                ha="center", va="bottom", fontsize=6, rotation=90)
        top, bottom = max(top, y if err is None else y + err[1][0]), min(bottom, y)

    for i, n in enumerate(order):
        r = rows[n]
        bar(i - width / 2, r["host_us"], "host_us")
        bar(i + width / 2, r.get("host_gpu_us"), "host_gpu_us")
        if r.get("sdpa_host_us"):
            ax.plot([i - width, i + width], [r["sdpa_host_us"]] * 2, color="k", lw=1.2)
    x = len(order)
    for key, sdpa_key, dx in (("host_us", "sdpa_host_us", -width / 2),
                              ("host_gpu_us", "sdpa_host_gpu_us", width / 2)):
        xs = [r[sdpa_key] for r in rows.values() if r.get(sdpa_key)]
        if xs:
            med = statistics.median(xs)
            bar(x + dx, med, key, err=[[med - min(xs)], [max(xs) - med]])
    ax.set_yscale("log")
    ax.set_ylim(bottom / 2 if bottom < float("inf") else 1, top * 6)
    ax.set_xticks(range(len(order) + 1), [f"stage {n}" for n in order] + ["SDPA\n(median)"],
                  fontsize=7)
    ax.set_ylabel("µs per call (log)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=HOST_COLORS["host_us"]),
                       plt.Rectangle((0, 0), 1, 1, color=HOST_COLORS["host_gpu_us"]),
                       plt.Line2D([], [], color="k", lw=1.2)],
              labels=["host µs/call (back-to-back calls)", "GPU µs/call (CUDA events)",
                      "SDPA's host µs/call, same run as the stage"],
              fontsize=7, loc="upper right")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.set_title(title, fontsize=9)
    return ax
