"""The journey's figures: host time against GPU time per call, the tile sweeps, stages against
SDPA, speed-ups, TFLOPS against sequence length and the roofline of every stage (lib.plots
re-exports these)."""
from __future__ import annotations

import matplotlib.pyplot as plt

from lib.plots_common import plot_roofline


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
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
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
    ax.set_ylim(top=ax.get_ylim()[1] * 30)  # room above the roofs for their legend, clear of the points
    ax.add_artist(ax.get_legend())  # the roofs' legend stays, upper left
    # lower left: below the memory roof's start no stage lands (lower right hid stage 0's points)
    ax.legend(handles=handles, fontsize=7, loc="lower left", ncol=2)
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


# ============================================================================================
# The journey's closing figure: the whole way, stage 0 to stage 8, as a share of the ceiling

BEYOND_STYLE = {7: ("tab:orange", "//"), 8: ("tab:green", "\\\\")}
STAGE_COLORS = {"stages 0-6": "tab:blue", "stage 6 ideas": "tab:purple", 7: BEYOND_STYLE[7][0],
                8: BEYOND_STYLE[8][0], "SDPA": "k"}  # one colour per stage in every chart that sets them side by side
ANCHOR_COLORS = ("tab:red", "tab:brown", "tab:olive")


def plot_journey_whole_way(data: dict, B: int, H: int, S: int, D: int, causal: bool = False,
                           anchors: dict | None = None, ax=None):
    """Every stage at one standard shape as a share of the measured bf16 matmul ceiling (log
    scale): stages 0-6 (blue, fp16 forward, the benchmark's rows), stage 6 idea by idea (purple,
    its schedule record), then the two stages past the 16-bit forward, hatched because they
    measure something else — stage 7's FP8 kernel (the record's fp8_bench entry: bf16 in and
    out, the forward's FLOPs on e4m3 tensor cores, whose own GEMM roof that run measured is drawn
    dotted) and stage 8's backward (the backward entry, fp16: TFLOPS at 2.5 × the forward's
    FLOPs). Lines: SDPA's default backend (the median of the rows' own timings at the shape) and
    `anchors` ({label: TFLOPS}, another run on the same GPU model), dashed: an SDPA anchor in SDPA's
    black, others in colours no bar has."""
    from lib.results import standard_runs
    peak = (data.get("ceilings") or {}).get("matmul_TFLOPS")
    rows = {r["stage"]: r for r in standard_runs(data) if not r.get("skipped") and r["dtype"] == "float16"
            and (r["B"], r["H"], r["Sq"], r["D"], r["causal"]) == (B, H, S, D, causal)}
    bars = [(f"stage {n}", rows[n]["tflops"], STAGE_COLORS["stages 0-6"], None) for n in sorted(rows)]
    bars += [(f"6: {r['variant']}", r["tflops"], STAGE_COLORS["stage 6 ideas"], None)
             for r in (data.get("stage6") or {}).get("rows", []) if r["kind"] == "schedule"
             and r.get("dtype", "float16") == "float16"
             and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal)]
    fp8 = data.get("fp8_bench") or {}
    r7 = next((r for r in fp8.get("rows", [])
               if (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal)), None)
    if r7:
        bars.append(("7: FP8 forward (e4m3, bf16 in/out)", r7["tflops_kernel"], *BEYOND_STYLE[7]))
    r8 = next((r for r in (data.get("backward") or {}).get("rows", []) if r["dtype"] == "float16"
               and (r["B"], r["H"], r["S"], r["D"], r["causal"]) == (B, H, S, D, causal)), None)
    if r8:
        bars.append(("8: backward (TFLOPS at 2.5 × fwd FLOPs)", r8["tflops"], *BEYOND_STYLE[8]))
    ax = ax or plt.subplots(figsize=(11, 3.8))[1]
    scale = 100 / peak if peak else 1.0
    ys = [b[1] for b in bars]
    for i, (_, y, color, hatch) in enumerate(bars):
        ax.bar(i, y * scale, color=color, hatch=hatch, edgecolor="k" if hatch else None, lw=0.4)
        ax.text(i, y * scale, f"{y:.0f}" if y >= 100 else f"{y:.3g}", ha="center", va="bottom", fontsize=6)
    sd = sorted(r["sdpa_tflops"] for r in rows.values() if r.get("sdpa_tflops"))
    if sd:
        ax.axhline(sd[len(sd) // 2] * scale, color=STAGE_COLORS["SDPA"], lw=1,
                   label=f"SDPA default, this record\n({sd[len(sd) // 2]:.0f} TFLOPS)")
    others = iter(ANCHOR_COLORS)  # no bar's colour: an SDPA anchor dashed in SDPA's black
    for label, v in (anchors or {}).items():
        ax.axhline(v * scale, color="k" if label.startswith("SDPA") else next(others), ls="--", lw=1,
                   label=f"{label}\n({v:.0f} TFLOPS)")
    e4m3 = (fp8.get("ceilings_tflops") or {}).get("e4m3 GEMM") if r7 else None
    if e4m3:
        ax.axhline(e4m3 * scale, color=BEYOND_STYLE[7][0], ls=":", lw=1.2,
                   label=f"e4m3 matmul roof, stage 7's\n(its benchmark's run, {e4m3:.0f} TFLOPS)")
    top = max(ys + [e4m3 or 0]) * scale
    ax.set_yscale("log")
    ax.set_ylim(bottom=min(ys) * scale / 2, top=max(100 if peak else 0, top) * 1.6)
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("% of the bf16 matmul ceiling" if peak else "TFLOPS")
    ax.set_title(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: stages 0-6 (fp16 forward), stage 6 idea "
                 f"by idea; hatched, other quantities: stage 7 (FP8) and 8 (backward)"
                 + (f"; ceiling {peak:.0f} TFLOPS" if peak else ""), fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0))
    return ax
