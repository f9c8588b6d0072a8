"""Stage 6 (Hopper) in pictures: the swizzle, the pipeline, the schedule waterfalls and the
measured warpgroup timelines (lib.plots re-exports these)."""
from __future__ import annotations

import matplotlib.pyplot as plt


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
    """Bars: TFLOPS of each schedule step (rows in order, each {"variant", "tflops"}; with
    "us" and "us_rounds", the medians of interleaved rounds, an error bar from the slowest round
    to the fastest); a line at SDPA's default backend from the same run, and dashed lines for
    anchors measured in another run on the same GPU model ({label: TFLOPS})."""
    ax = ax or plt.subplots(figsize=(7, 3.2))[1]
    names = [r["variant"] for r in rows]
    ys = [r["tflops"] for r in rows]
    err = None
    if all(r.get("us_rounds") for r in rows):
        # TFLOPS scale as 1/time: the slowest round gives the bar's low end, the fastest its high
        err = [[y - y * r["us"] / max(r["us_rounds"]) for y, r in zip(ys, rows)],
               [y * r["us"] / min(r["us_rounds"]) - y for y, r in zip(ys, rows)]]
    bars = ax.bar(range(len(ys)), ys, color="tab:blue", yerr=err, capsize=2,
                  error_kw={"lw": 0.8, "ecolor": "0.3"})
    for b, y in zip(bars, ys):
        ax.text(b.get_x() + b.get_width() / 2, y, f"{y:.0f}", ha="center", va="bottom", fontsize=7)
    if sdpa_tflops:
        ax.axhline(sdpa_tflops, color="k", lw=1, label=f"SDPA default, same run ({sdpa_tflops:.0f})")
    for i, (label, v) in enumerate((anchors or {}).items()):
        ax.axhline(v, color=f"C{i + 3}", ls="--", lw=1, label=f"{label} ({v:.0f})")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("TFLOPS")
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:
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


# Dense fp16/bf16 tensor-core rate of one H100 SM: 989.4 TFLOPS (the data sheet's dense figure) /
# (132 SMs × 1.83 GHz, the clock that figure assumes) = 4096 FLOP per clock.
TENSOR_FLOP_PER_CLOCK = 4096


def timeline_tensor_share(tl: dict, block_n: int, first: int = 1, last: int = 12) -> dict:
    """From stage 6's timeline record: per schedule, the share of the SM's clocks its tensor
    cores need for the products the timeline's consumers ran — per key tile each consumer's
    S = Q·Kᵀ and O += P·V (2 · 64 · block_n · D FLOP each, at TENSOR_FLOP_PER_CLOCK), all
    consumers together, over the measured key-tile period (timeline_phases: first S to first S,
    averaged over the consumers). 100% would be tensor cores never idle."""
    need = 2 * (2 * 64 * block_n * tl["D"]) / TENSOR_FLOP_PER_CLOCK  # both products, one consumer
    out = {}
    for name, per in timeline_phases(tl, first, last).items():
        period = sum(p["tile"] for p in per) / len(per)
        out[name] = {"wgmma_clocks_per_tile": need * len(per), "period_clocks": period,
                     "share": need * len(per) / period}
    return out


def timeline_summary(tl: dict) -> str:
    """timeline_phases as text, a line per schedule."""
    return "\n".join(f"  {name:28s} " + "; ".join(
        f"consumer {c}: {p['tile']:,.0f} cycles per key tile, S wait {p['wait_s']:,.0f}, softmax {p['softmax']:,.0f}"
        for c, p in enumerate(per, 1)) for name, per in timeline_phases(tl).items())



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


def draw_kv_ring(stages: int = 2, positions: int = 6, consumers: int = 2, ax=None):
    """Stage 6's K ring as a schematic (from the kernel's formulas, not a measurement): one row
    per buffer b = pos % STAGES, one box per ring position using it (use u = pos / STAGES). At a
    box's left edge the producer has waited for the buffer's empty barrier (parity (u & 1) ^ 1:
    the release of position pos − STAGES, or nothing for the first STAGES positions) and started
    the copy; the full barrier's phase u completes when the bytes land, and the consumers wait
    on it with parity u & 1. At the right edge every consumer warp has arrived on empty[b]
    (4 · consumers arrivals), completing its phase u: the producer may refill b for pos + STAGES."""
    ax = ax or plt.subplots(figsize=(10, 1.2 + 0.7 * stages))[1]
    for pos in range(positions):
        b, u = pos % stages, pos // stages
        y = stages - 1 - b
        ax.add_patch(plt.Rectangle((pos + 0.05, y + 0.15), stages - 0.1, 0.7, fc=f"C{pos % 10}", alpha=0.25,
                                   ec="k", lw=0.6))
        ax.text(pos + 0.1, y + 0.62, f"pos {pos}: tile {pos}, use {u}", fontsize=7, va="center")
        ax.text(pos + 0.1, y + 0.36, f"wait empty[{b}] ≡ {(u & 1) ^ 1}, full[{b}] ≡ {u & 1}", fontsize=6,
                va="center", color="0.25")
        ax.annotate("", xy=(pos + stages - 0.05, y + 0.12), xytext=(pos + 0.05, y + 0.12),
                    arrowprops={"arrowstyle": "-|>", "lw": 0.6, "color": "0.4"})
        ax.text(pos + stages - 0.08, y + 0.02, f"{4 * consumers} arrivals: empty[{b}] phase {u}", fontsize=6,
                ha="right", va="bottom", color="tab:red")
    ax.set_xlim(0, positions + stages - 1)
    ax.set_ylim(-0.05, stages)
    ax.set_yticks([stages - 1 - b + 0.5 for b in range(stages)], [f"buffer {b}" for b in range(stages)])
    ax.set_xlabel("ring position (the producer's copies, in order); a box spans the positions its buffer is held")
    ax.set_title(f"K ring, STAGES = {stages}: who waits for which phase (≡ parity), who arrives", fontsize=9)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    return ax


def draw_turns(consumers: int = 2, tiles: int = 4, ax=None):
    """Ping-pong (PINGPONG=1) as a schematic: consumer c issues its products (S of tile j and
    P·V of tile j − 1) only on its turn — a bar.sync on its named barrier TURN_BAR + c — and then
    passes the turn to c + 1 with a bar.arrive, running its softmax while the next consumer's
    products occupy the tensor cores. The last consumer's turn goes back to consumer 0, across
    work tiles too; consumer 0 takes the final one back when the block ends."""
    ax = ax or plt.subplots(figsize=(10, 0.8 + 0.6 * consumers))[1]
    t = 0
    for j in range(tiles):
        for c in range(consumers):
            y = consumers - 1 - c
            ax.add_patch(plt.Rectangle((t, y + 0.2), 1, 0.6, fc="tab:blue", ec="k", lw=0.5))
            ax.text(t + 0.5, y + 0.5, f"S{j}" + (f" + P·V{j - 1}" if j else ""), ha="center", va="center",
                    fontsize=7, color="w")
            w = max(consumers - 1, 1) - 0.1  # until the consumer's next turn
            ax.add_patch(plt.Rectangle((t + 1, y + 0.3), w, 0.4, fc="tab:green", ec="k", lw=0.4, alpha=0.7))
            ax.text(t + 1 + w / 2, y + 0.5, f"softmax {j}", ha="center", va="center", fontsize=6)
            nxt = (c + 1) % consumers
            ax.annotate("", xy=(t + 1, consumers - 1 - nxt + 0.5), xytext=(t + 1, y + 0.5),
                        arrowprops={"arrowstyle": "-|>", "lw": 0.6, "color": "tab:red"})
            t += 1
    ax.set_xlim(0, t + consumers)
    ax.set_ylim(0, consumers)
    ax.set_yticks([consumers - 1 - c + 0.5 for c in range(consumers)], [f"consumer {c}" for c in range(consumers)])
    ax.set_xlabel("turns in order (one unit: the products one consumer issues on its turn)")
    ax.set_title("Ping-pong: blue = products issued on the turn, green = softmax, red = the turn passed on "
                 "(bar.arrive on the next consumer's TURN_BAR)", fontsize=9)
    for s in ("top", "right"):
        ax.spines[s].set_visible(False)
    return ax
