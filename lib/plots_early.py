"""The stage 0-3 notebooks' figures: time sweeps, row ownership, the unfused dataflow, the tile
walk and the softmax's dependency chains (lib.plots re-exports these)."""
from __future__ import annotations

import matplotlib.pyplot as plt

from lib.plots_common import _log_axes


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
