"""Plots of recorded or live results (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from lib.results import shape_text, standard_runs


def _log_axes(ax, xlabel, ylabel, title=None, legend_size=8):
    """The log-log axes of the sweep plots (S on a base-2 axis), gridded, with a legend."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=legend_size)


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
        _log_axes(ax, "sequence length S", "TFLOPS", f"D={D}, H16, B·S fixed", legend_size=8)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return Path(path) if path else fig


# --------------------------------------------------------------------------------------------
# the roofline: what a kernel of a given arithmetic intensity can reach on the measured GPU

# compute ceilings that lib.microbench.measure_ceilings records: (key, what runs at that rate)
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
    rate `rate`), in TFLOPS, from a ceilings dict as lib.microbench.measure_ceilings returns it."""
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


def timeline_overlaps(tl: dict, first: int = 1, last: int = 12) -> dict:
    """From stage 6's timeline record, per schedule with two consumers: the share of consumer 1's
    softmax time (tiles first … last − 1) during which consumer 2 is in a softmax too
    ("softmaxes"), and during which it is waiting for its S — its turn and its Q·Kᵀ ("under S").
    Ping-pong means to make the second large and the first small."""
    def overlap(a, b):
        return max(0, min(a[1], b[1]) - max(a[0], b[0]))
    out = {}
    for name, st in tl["stamps"].items():
        if tl["consumers"] != 2 or len(st) < 3:
            continue
        mine = [(x[1], x[2]) for x in st[1][first:last]]
        soft = [(x[1], x[2]) for x in st[2]]
        wait = [(x[0], x[1]) for x in st[2]]
        total = sum(b - a for a, b in mine)
        out[name] = {"softmaxes": sum(overlap(m, o) for m in mine for o in soft) / total,
                     "under S": sum(overlap(m, o) for m in mine for o in wait) / total}
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


def plot_tile_sweep(rows: list[dict]):
    """A recorded tile sweep (lib.notebook.tile_sweep's rows): TFLOPS of every tile choice per
    head dim, full and causal side by side; the chosen tiles starred with a thick edge, the
    'no swizzle' rows hatched, rows that spill labelled. Returns the figure."""
    import numpy as np
    Ds = sorted({r["D"] for r in rows})
    fig, axes = plt.subplots(1, len(Ds), figsize=(6.2 * len(Ds), 4.2), squeeze=False)
    for ax, D in zip(axes[0], Ds):
        rs = [r for r in rows if r["D"] == D]
        variants = list(dict.fromkeys(r["variant"] for r in rs))
        x = np.arange(len(variants))
        for k, causal in enumerate((False, True)):
            tf = [next((r["tflops"] for r in rs if r["variant"] == v and r["causal"] == causal), 0)
                  for v in variants]
            bars = ax.bar(x + (k - 0.5) * 0.4, tf, 0.4, label="causal" if causal else "full",
                          color="tab:orange" if causal else "tab:blue")
            for b, v in zip(bars, variants):
                r = next((r for r in rs if r["variant"] == v and r["causal"] == causal), None)
                if r and r["default"]:
                    b.set_edgecolor("k")
                    b.set_linewidth(2)
                if r and "no swizzle" in v:
                    b.set_hatch("//")
                if r and r["spill_bytes"]:
                    ax.text(b.get_x() + b.get_width() / 2, b.get_height(), "spills", rotation=90,
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [("★ " if any(r["default"] and r["variant"] == v for r in rs) else "")
                          + v.replace(" no swizzle", "\nno swizzle") for v in variants],
                      rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOPS")
        ax.set_title(f"D {D}: tile choices (★, thick edge: chosen; hatched: no swizzle)", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_stages_vs_sdpa(rows: list[tuple], names=("stage 4", "stage 5"), ceilings: dict | None = None,
                        title: str = ""):
    """TFLOPS per shape of two stages and SDPA's two backends: `rows` of (B, H, S, D, causal,
    µs of the first stage, µs of the second, SDPA default µs, SDPA flash µs); with `ceilings`
    (lib.notebook.ceilings), the matmul ceiling and the mma.sync rate as lines. Returns the
    figure."""
    import numpy as np

    from lib.timing import tflops
    fig, ax = plt.subplots(figsize=(10, 3.8))
    labels = [f"B{B} H{H} S{S} D{D}\n{'causal' if c else 'full'}" for B, H, S, D, c, *_ in rows]
    x = np.arange(len(rows))
    for k, (col, name, colour) in enumerate(((5, names[0], "0.6"), (6, names[1], "tab:green"),
                                             (8, "SDPA flash (FA2)", "tab:blue"), (7, "SDPA default", "k"))):
        ax.bar(x + (k - 1.5) * 0.2, [tflops(r[0], r[1], r[2], r[2], r[3], r[4], r[col]) for r in rows],
               0.2, label=name, color=colour)
    if ceilings and ceilings.get("matmul_TFLOPS"):
        ax.axhline(ceilings["matmul_TFLOPS"], color="tab:red", ls="--", lw=1,
                   label=f"matmul ceiling ({ceilings['source'].split(':')[0]})")
    if ceilings and ceilings.get("hmma_TFLOPS"):
        ax.axhline(ceilings["hmma_TFLOPS"], color="tab:purple", ls=":", lw=1,
                   label=f"mma.sync rate ({ceilings['source'].split(':')[0]})")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("TFLOPS")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=5, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# the journey notebook's figures (the rows come from lib.notebook.journey_panels/journey_sweep)

def plot_journey_speedups(panels, numbers, colors: dict, label: str):
    """One panel per standard shape and mask: each stage's speed-up over the first stage with
    a row there (log scale), labelled with the step over the previous stage, and SDPA's two
    backends (the median of the rows' own timings) as lines on the same scale."""
    from lib.results import sdpa_spread
    shapes = sorted({p[0] for p in panels}, key=[p[0] for p in panels].index)
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.6 * len(shapes), 7.4), squeeze=False)
    for (name, B, H, S, D, causal, rows, skipped), ax in zip(panels, axes.T.flat):
        ax.set_title(f"{name}: B{B} H{H} S{S} D{D}, {'causal' if causal else 'full'}", fontsize=9)
        ax.set_yscale("log")
        ax.set_xticks(range(len(numbers)), [str(n) for n in numbers])
        ax.set_xlabel("stage", fontsize=8)
        if not rows:
            ax.text(0.5, 0.5, "not recorded yet", transform=ax.transAxes, ha="center")
            continue
        base = min(rows)
        base_us = rows[base]["us"]
        top = 1.0
        if base != numbers[0]:
            ax.set_title(ax.get_title() + f"\n(relative to stage {base}: no stage "
                         f"{numbers[0]} row)", fontsize=9)
        for x, n in enumerate(numbers):
            if n not in rows:
                ax.text(x, 1, "skipped" if n in skipped else "not recorded", rotation=90,
                        ha="center", va="bottom", fontsize=7, color="0.4")
                continue
            speedup = base_us / rows[n]["us"]
            ax.bar(x, speedup, color=colors[n])
            top = max(top, speedup)
            prev = numbers[x - 1] if x else None
            if prev in rows:
                ax.text(x, speedup * 1.15, f"{rows[prev]['us'] / rows[n]['us']:.3g}×",
                        ha="center", va="bottom", fontsize=8)
        for field, what, style in (("sdpa_us", "SDPA default", "--"),
                                   ("sdpa_flash_us", "SDPA flash", ":")):
            spread = sdpa_spread(rows.values(), field)
            if spread:
                x = base_us / spread[0]
                ax.axhline(x, color="k", ls=style, lw=1,
                           label=f"{what} ({x:,.0f}×)" if x >= 100 else f"{what} ({x:.3g}×)")
                top = max(top, x)
        ax.set_ylim(0.5, top * 8)  # room for the labels and the legend
        ax.set_xlim(-0.6, len(numbers) - 0.4)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(axis="y", alpha=0.3, which="both")
    for row in axes:
        row[0].set_ylabel(f"speed-up over stage {numbers[0]} (log)")
    fig.suptitle(f"Speed-up per stage, fp16 (labels: step over the previous stage) — {label}",
                 fontsize=10)
    fig.tight_layout()
    plt.show()


def plot_journey_sweep(sweep: dict, numbers, colors: dict, label: str, tokens: int, seqs):
    """TFLOPS against S (B·S = `tokens`, H16), one panel per head dim (columns) and mask (rows),
    a line per stage, and SDPA's two backends as the median of the rows' own timings with
    their range shaded. Returns SDPA's spread at each point, (max − min) / median."""
    from lib.results import sdpa_spread
    dims = sorted({D for D, _ in sweep})
    fig, axes = plt.subplots(2, len(dims), figsize=(5.6 * len(dims), 7.2), squeeze=False,
                             sharey="row")
    spreads = []
    for col, D in enumerate(dims):
        for row, causal in enumerate((False, True)):
            ax, by_s = axes[row][col], sweep[(D, causal)]
            for n in numbers:
                pts = [(S, rows[n]["tflops"]) for S, (rows, _) in by_s.items() if n in rows]
                if pts:
                    ax.plot(*zip(*pts), "o-", color=colors[n], ms=4, label=f"stage {n}")
            for field, what, style in (("sdpa_tflops", "SDPA default", "--"),
                                       ("sdpa_flash_tflops", "SDPA flash", ":")):
                pts = [(S, *sp) for S, (rows, _) in by_s.items()
                       if (sp := sdpa_spread(rows.values(), field))]
                if pts:
                    s, med, lo, hi = zip(*pts)
                    ax.plot(s, med, "k" + style, label=f"{what} (median)")
                    ax.fill_between(s, lo, hi, color="0.5", alpha=0.25, lw=0,
                                    label=f"{what}: range over the runs")
                    spreads += [(h - l) / m for m, l, h in zip(med, lo, hi)]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(list(seqs), [str(s) for s in seqs], fontsize=7)
            ax.set_title(f"D{D}, {'causal' if causal else 'full'}, B·S = {tokens:,}, H16",
                         fontsize=9)
            ax.set_xlabel("sequence length S")
            ax.set_ylabel("TFLOPS (log)")
            ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(f"TFLOPS against sequence length, fp16 — {label}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    plt.show()
    return spreads


JOURNEY_SHAPE_MARKERS = "osD^v<>"  # one marker per standard shape, in the benchmark's order


def plot_journey_roofline(panels, ceilings: dict, numbers, colors: dict, label: str):
    """Every stage at every standard shape under the roofline (plot_roofline's roofs, the
    MUFU.EX2 roof at each head dim present), placed at its compulsory intensity; stage 1 also
    at its own (its S and P round trips counted, an arrow between the two); SDPA's two
    backends (median of the rows' own timings) as black marks."""
    import math
    from matplotlib.lines import Line2D
    from lib.reference import compulsory_intensity, stage1_intensity
    from lib.results import sdpa_spread
    shapes = sorted({p[0] for p in panels}, key=[p[0] for p in panels].index)
    marker = dict(zip(shapes, JOURNEY_SHAPE_MARKERS))
    pts = []  # (stage, shape name, causal, intensity, TFLOPS)
    for name, B, H, S, D, causal, rows, _ in panels:
        x = compulsory_intensity(B, H, S, D, causal)
        pts += [(n, name, causal, x, r["tflops"]) for n, r in rows.items()]
    if not pts:
        print("no recorded standard rows: nothing to place")
        return
    xs = [p[3] for p in pts]
    x1 = [x for _, B, H, S, D, c, rows, _ in panels if 1 in rows
          and (x := stage1_intensity(B, H, S, D, c))]
    lo = 10 ** math.floor(math.log10(min(xs + x1) / 2))
    hi = 10 ** math.ceil(math.log10(max(xs) * 2))
    ax = plot_roofline(ceilings, (lo, hi), plt.subplots(figsize=(10, 6))[1],
                       head_dims=sorted({p[4] for p in panels}))
    for n, name, causal, x, y in pts:
        ax.scatter(x, y, marker=marker[name], s=36, color=colors[n],
                   facecolors="none" if causal else colors[n], zorder=3)
    for name, B, H, S, D, causal, rows, _ in panels:
        x_own = stage1_intensity(B, H, S, D, causal)
        if 1 in rows and x_own:
            y = rows[1]["tflops"]
            ax.annotate("", (x_own, y), (compulsory_intensity(B, H, S, D, causal), y),
                        arrowprops=dict(arrowstyle="->", color=colors[1], lw=0.8, alpha=0.7))
            ax.scatter(x_own, y, marker=marker[name], s=70, zorder=4,
                       facecolors="none" if causal else colors[1],
                       edgecolors=colors[1] if causal else "k", linewidths=1.5)
    sdpa_marks = (("sdpa_tflops", "SDPA default", "x"), ("sdpa_flash_tflops", "SDPA flash", "+"))
    for name, B, H, S, D, causal, rows, _ in panels:
        for field, _, m in sdpa_marks:
            if spread := sdpa_spread(rows.values(), field):
                ax.scatter(compulsory_intensity(B, H, S, D, causal), spread[0], marker=m,
                           s=40, color="k", zorder=3)
    # legend: colours are stages, markers are shapes, filled = full, hollow = causal
    handles = [Line2D([], [], ls="", marker="o", color=colors[n], label=f"stage {n}")
               for n in numbers if any(p[0] == n for p in pts)]
    handles += [Line2D([], [], ls="", marker=m, color="0.4", label=name)
                for name, m in marker.items() if any(p[1] == name for p in pts)]
    handles += [Line2D([], [], ls="", marker="o", color="0.4", markerfacecolor="none",
                       label="hollow: causal")]
    if x1:
        handles += [Line2D([], [], ls="", marker="o", color=colors[1], markeredgecolor="k",
                           label="stage 1, S and P counted (arrow)")]
    handles += [Line2D([], [], ls="", marker=m, color="k", label=f"{what} (median)")
                for _, what, m in sdpa_marks]
    ax.add_artist(ax.get_legend())  # the roofs' legend stays, upper left
    ax.legend(handles=handles, fontsize=7, loc="lower right", ncol=2)
    ax.set_title(f"Every stage under the roofline, fp16, x = FLOPs ÷ compulsory bytes\n{label}",
                 fontsize=9)
    plt.show()


def plot_journey_host(shape, host: dict, label: str):
    """plot_host_time for the full and the causal mask side by side at one shape."""
    B, H, S, D = shape
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        plot_host_time(host[causal], f"B{B} H{H} S{S} D{D} fp16, "
                       f"{'causal' if causal else 'full'}", ax=ax)
    fig.suptitle(f"Host time per call against GPU time per call — {label}", fontsize=10)
    fig.tight_layout()
    plt.show()


def plot_softmax_chains(count: dict):
    """Stages 2 and 3: one K/V tile per warp as instructions issued back to back (predicted from
    the stage 3 notebook's counts, lib.notebook.warp_softmax_tile_counts, {stage: counts}; no
    stalls modelled). In stage 2 warp 1 waits at __syncthreads while warp 0 runs the softmax."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 2.8), sharex=True)
    for ax, n in zip(axes, (2, 3)):
        c = count[n]
        # in order: copy, S (half of "rest", for the picture), softmax, P·V and rescale (other half)
        steps = [(c["loads"], "K/V copy", "0.75"), (c["rest"] / 2, "S, P·V, rescale, barriers", "tab:green"),
                 (c["softmax"], "softmax", "tab:red"), (c["rest"] / 2, None, "tab:green")]
        for w in (0, 1):
            t = 0
            for dur, label, col in steps:
                if n == 2 and w == 1 and label == "softmax":   # warp 1 waits at __syncthreads
                    ax.barh(w, dur, left=t, color="white", edgecolor="k", hatch="//", lw=0.5,
                            label="waits at __syncthreads")
                else:
                    ax.barh(w, dur, left=t, color=col, edgecolor="k", lw=0.5,
                            label=label if w == 0 else None)
                t += dur
        bars = ("__syncthreads: copy ↔ S ↔ softmax ↔ P·V" if n == 2
                else "__syncthreads only around the copy")
        ax.set_yticks((0, 1), ("warp 0", "warp 1"))
        ax.set_ylim(1.6, -0.6)
        ax.set_title(f"stage {n}: {bars}", fontsize=9)
        ax.set_xlabel("instructions (counted)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, -0.08))
    fig.suptitle("One K/V tile per warp, as instructions issued back to back (predicted from the "
                 "counts; no stalls modelled)", fontsize=10)
    fig.tight_layout()
    plt.show()


def plot_stage6_waterfalls(rows: list[dict], anchor_rows: list[dict] | None = None):
    """Stage 6's schedule waterfall (plot_waterfall) at its four standard shapes (fp16): `rows`
    from scripts/stage6_schedules.py's record, SDPA's default backend of the same run as a line
    (the median of the rows' own SDPA timings), and from `anchor_rows` (another run's anchor
    file, results/anchors/h100_fa4_sm90.json) FlashAttention-4's sm90 kernel and that run's
    SDPA default as dashed lines. Returns the figure."""
    shapes = [(16, 16, 2048, 64, False), (16, 16, 2048, 64, True),
              (4, 16, 8192, 128, False), (4, 16, 8192, 128, True)]
    fig, axs = plt.subplots(2, 2, figsize=(12, 6.5))
    for ax, (B, H, S, D, causal) in zip(axs.flat, shapes):
        rs = [r for r in rows if r["kind"] == "schedule" and r.get("dtype", "float16") == "float16"
              and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal)]
        if not rs:
            ax.set_visible(False)
            continue
        a = next((x["tflops"] for x in anchor_rows or [] if (x["B"], x["H"], x["Sq"], x["D"], x["causal"],
                  x["dtype"]) == (B, H, S, D, causal, "float16")), None)
        sd = sorted(r["sdpa_us"] for r in rs)[len(rs) // 2]
        fl = 4 * B * H * S * S * D / (2 if causal else 1)
        plot_waterfall(rs, f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}, fp16",
                       sdpa_tflops=fl / sd / 1e6,
                       anchors={"FA4 sm90 (anchor run)": a["fa4_sm90"],
                                "its SDPA default": a["sdpa_default"]} if a else None, ax=ax)
    fig.tight_layout()
    return fig


def plot_stage6_timelines(tl: dict, tiles: int = 10):
    """One Gantt chart (plot_timeline) per schedule of stage 6's recorded timeline
    (scripts/stage6_schedules.py: {"stamps": {schedule: stamps}, "consumers": n}). Returns the
    figure."""
    names = list(tl["stamps"])
    fig, axs = plt.subplots(len(names), 1, figsize=(11, 2.2 * len(names)), sharex=False)
    for ax, name in zip(axs, names):
        plot_timeline(tl["stamps"][name], tl["consumers"], tiles=tiles, title=name, ax=ax)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# Figures of the stage 0-2 notebooks (issue 13: plotting in lib/, not in notebook cells).

def plot_time_sweep(S: list, series, tflops_of, title: str):
    """Two log-log panels against the sequence length S: µs per call and TFLOPS, one line per
    (label, matplotlib style, [µs at each S]) of `series`; tflops_of(S, µs) gives the TFLOPS."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, style, us in series:
        axes[0].plot(S, us, style, label=label)
        axes[1].plot(S, [tflops_of(s, u) for s, u in zip(S, us)], style, label=label)
    for ax, ylabel in zip(axes, ("µs per call", "TFLOPS")):
        _log_axes(ax, "sequence length S", ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    plt.show()


def draw_row_ownership(Sq: int = 8, Sk: int = 8):
    """Stage 0's causal scores for one head: row i (coloured) is thread i's, walked twice."""
    import numpy as np
    owner = np.where(np.tril(np.ones((Sq, Sk))) > 0, np.arange(Sq)[:, None], np.nan)
    fig, ax = plt.subplots(figsize=(4.6, 3.6))
    ax.imshow(owner, cmap="tab10", vmin=0, vmax=9)
    for i in range(Sq):
        ax.annotate("", xy=(min(i, Sk - 1) + 0.4, i), xytext=(-0.4, i),
                    arrowprops=dict(arrowstyle="->", color="k", lw=0.8))
    ax.set_xticks(range(Sk))
    ax.set_yticks(range(Sq), [f"thread {i}" for i in range(Sq)])
    ax.set_xlabel("key j")
    ax.set_title("causal scores: row i is thread i's,\nwalked twice (pass 0, pass 1)")
    plt.show()


def draw_unfused_dataflow():
    """Stage 1's three kernels and the HBM trips between them; red: the S and P traffic that
    grows like Sq·Sk."""
    from matplotlib.patches import FancyBboxPatch
    fig, ax = plt.subplots(figsize=(10, 3.8))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4)
    ax.axis("off")

    def box(x, y, w, h, text, color):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc=color, ec="k", lw=0.8))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9)

    def arrow(x0, y0, x1, y1, label="", color="k"):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops=dict(arrowstyle="->", color=color, lw=1.4))
        if label:
            ax.text((x0 + x1) / 2 + 0.08, (y0 + y1) / 2, label, fontsize=8, color=color, va="center")

    ax.text(0.05, 3.75, "HBM (global memory)", fontsize=9, style="italic")
    ax.text(0.05, 0.2, "kernels, in launch order", fontsize=9, style="italic")
    small, big = "#dbe9f6", "#f6d5d5"
    box(0.2, 2.6, 0.8, 0.8, "Q\n$S_q{\\cdot}D$", small)
    box(1.3, 2.6, 0.8, 0.8, "K\n$S_k{\\cdot}D$", small)
    box(3.0, 2.6, 1.7, 0.8, "S  (fp32)\n$S_q{\\times}S_k$, 4 B each", big)
    box(5.6, 2.6, 1.7, 0.8, "P  (fp16/bf16)\n$S_q{\\times}S_k$, 2 B each", big)
    box(7.6, 2.6, 0.8, 0.8, "V\n$S_k{\\cdot}D$", small)
    box(8.9, 2.6, 0.8, 0.8, "O\n$S_q{\\cdot}D$", small)
    box(0.7, 0.7, 1.9, 0.9, "attention_scores\nS = Q·Kᵀ  (WMMA)", "#e8f4e0")
    box(3.9, 0.7, 2.1, 0.9, "attention_softmax\n3 passes over each row", "#fff2cc")
    box(7.0, 0.7, 1.9, 0.9, "attention_pv\nO = P·V  (WMMA)", "#e8f4e0")
    arrow(0.6, 2.55, 1.3, 1.65)
    arrow(1.7, 2.55, 1.9, 1.65)
    arrow(2.4, 1.65, 3.4, 2.55, "write 4 B/pair", "firebrick")
    arrow(4.0, 2.55, 4.5, 1.65, "read 4 B/pair\n(×3 passes)", "firebrick")
    arrow(5.6, 1.65, 6.1, 2.55, "write 2 B/pair", "firebrick")
    arrow(6.8, 2.55, 7.3, 1.65, "read 2 B/pair", "firebrick")
    arrow(8.0, 2.55, 8.0, 1.65)
    arrow(8.7, 1.65, 9.3, 2.55)
    ax.set_title("Stage 1: every arrow is a trip through HBM; the red ones grow like $S_q \\cdot S_k$")
    plt.show()


def plot_unfused_sweep(sweep, stage0_us=None, D: int = 64):
    """Stage 1's live sweep, one panel per (B, H): µs per call against S for stage 1 and SDPA's
    two backends, full (solid) and causal (dashed). `sweep`: (B, H, S, causal, stage 1 µs, SDPA
    default µs, SDPA flash µs or None); stage0_us(B, H, S, causal) gives stage 0's recorded µs,
    or None, drawn as crosses."""
    pairs = list(dict.fromkeys((s[0], s[1]) for s in sweep))
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.5 * len(pairs), 3.8), squeeze=False)
    for ax, (B, H) in zip(axes[0], pairs):
        for causal, style in ((False, "-"), (True, "--")):
            pts = [s for s in sweep if (s[0], s[1], s[3]) == (B, H, causal)]
            if not pts:
                continue
            Ss = [p[2] for p in pts]
            mask = "causal" if causal else "full"
            ax.plot(Ss, [p[4] for p in pts], "o" + style, color="C1", label=f"stage 1, {mask}")
            ax.plot(Ss, [p[5] for p in pts], "s" + style, color="k", label=f"SDPA default, {mask}")
            if all(p[6] for p in pts):
                ax.plot(Ss, [p[6] for p in pts], "^" + style, color="grey", label=f"SDPA flash, {mask}")
            r0 = [(S, stage0_us(B, H, S, causal)) for S in Ss] if stage0_us else []
            r0 = [(S, us) for S, us in r0 if us]
            if r0:
                ax.plot(*zip(*r0), "x", color="C0", ms=9, label=f"stage 0, {mask} (recorded)")
        _log_axes(ax, "sequence length S", "µs per call", f"B{B} H{H} D{D} fp16", legend_size=7)
    fig.suptitle("Stage 1 vs SDPA, measured now (stage 0: recorded)")
    fig.tight_layout()
    plt.show()


def draw_tile_walk(S: int, block_q: int, block_k: int, q_tile: int):
    """A fused kernel's tiles for one head with Sq = Sk = S, full and causal side by side:
    computed, computed but partly masked (the diagonal), skipped; the walk of query tile
    `q_tile` along its K/V tiles outlined."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    n = S // block_q
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    colors = ["#9ecae1", "#fdae6b", "#eeeeee"]
    for ax, causal in zip(axes, (False, True)):
        state = np.zeros((n, n))  # 0 computed, 1 partly masked (diagonal), 2 skipped
        for i in range(n):
            for j in range(n):
                if causal and j * block_k >= (i + 1) * block_q:
                    state[i, j] = 2
                elif causal and (j + 1) * block_k - 1 > i * block_q:
                    state[i, j] = 1
        ax.imshow(state, cmap=ListedColormap(colors), vmin=0, vmax=2)
        last = int((state[q_tile] < 2).sum())
        ax.add_patch(plt.Rectangle((-0.5, q_tile - 0.5), last, 1, fill=False, ec="k", lw=2))
        for j in range(last - 1):
            ax.annotate("", xy=(j + 1, q_tile), xytext=(j, q_tile),
                        arrowprops=dict(arrowstyle="->", color="k", lw=1))
        ax.set_xticks(range(n), [f"{j * block_k}" for j in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"block {i}" for i in range(n)], fontsize=7)
        ax.set_xlabel("first key of the K/V tile")
        done = int((state < 2).sum())
        ax.set_title(f"{'causal' if causal else 'full'}: {done} of {n * n} tiles computed\n"
                     f"(block {q_tile} walks {last} K/V tiles)", fontsize=9)
    axes[1].legend(handles=[Patch(color=c, label=lab) for c, lab in
                            zip(colors, ("computed", "computed, partly masked", "skipped"))],
                   fontsize=7, loc="upper right")
    fig.tight_layout()
    plt.show()
