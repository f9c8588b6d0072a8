"""Pictures of stage 8's backward for its notebook: which blocks each kernel owns and walks over,
and one step of the Hopper build's dK/dV kernel as data flow (lib.notebook_backward has the
counts and the recorded timings)."""
from __future__ import annotations


def draw_backward_blocks(Sq: int = 16, Sk: int = 16, block: int = 4, causal: bool = True):
    """The two kernels' work on one head's score matrix (queries down, keys across), in blocks:
    left, one dK/dV block owns a column of keys and walks down over the query blocks that see
    them (causal: from the diagonal on); right, one block of the dQ pass owns a row of queries
    and walks across the keys they see. Blocks past the diagonal (causal) are never visited."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle
    nq, nk = Sq // block, Sk // block
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    titles = ("dK/dV kernel: a block owns keys j, loops over query blocks i",
              "dQ pass: a block owns queries i, loops over key blocks j")
    for ax, title, own_col in zip(axes, titles, (True, False)):
        for i in range(nq):
            for j in range(nk):
                hidden = causal and j > i
                mine = (j == 1) if own_col else (i == 2)
                visited = mine and not hidden
                color = "#d9d9d9" if hidden else ("#4c72b0" if visited else "#eaf0f8")
                ax.add_patch(Rectangle((j, nq - 1 - i), 1, 1, facecolor=color, edgecolor="white", lw=2))
        if own_col:
            start, end = (1.5, nq - 1 - 1 + 0.5), (1.5, 0.5)
            label = "dK_j, dV_j stay in registers;\nQ_i, dO_i, lse_i, δ_i stream in"
        else:
            start, end = (0.5, nq - 1 - 2 + 0.5), (2.5, nq - 1 - 2 + 0.5)
            label = "dQ_i stays in registers;\nK_j, V_j stream in"
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=18, color="#c44e52", lw=2))
        ax.text(nk + 0.2, nq / 2, label, va="center", fontsize=9)
        ax.set_xlim(0, nk + 3.2)
        ax.set_ylim(0, nq)
        ax.set_xticks([j + 0.5 for j in range(nk)], [f"K{j}" for j in range(nk)])
        ax.set_yticks([nq - 1 - i + 0.5 for i in range(nq)], [f"Q{i}" for i in range(nq)])
        ax.set_title(title, fontsize=9)
        ax.set_aspect("equal")
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    fig.suptitle("One head's scores S = Q·Kᵀ in blocks" + (" (causal: grey blocks lie past the diagonal)" if causal else ""),
                 fontsize=10)
    fig.tight_layout()
    return fig



def draw_backward_step():
    """One step of the Hopper build's dK/dV kernel (stages/stage8_wgmma.cu with its switches on),
    as data flow: which tiles come from where, in three columns (global memory, the block's
    shared memory, one warpgroup's registers). Q, dO, lse and δ arrive by the copy engine (TMA
    and bulk copies, counted on an mbarrier); K and V, copied in once per block by every thread
    (cp.async, copy_tile), stay in shared memory for the whole loop;
    Sᵀ, dPᵀ, Pᵀ and dSᵀ live in registers, as do dK and dV; dQ's partial tiles go through shared
    memory to a bulk reduction into a float32 dQ, which the postprocess puts back in rows."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    fig, ax = plt.subplots(figsize=(12.5, 7.4))
    ax.set_xlim(0, 13.8)
    ax.set_ylim(0.2, 9.55)
    ax.axis("off")
    colors = {"global": "#fde0c5", "shared": "#d4e6f1", "reg": "#d5f5e3", "kernel": "#eeeeee"}
    cols = {"global": (0.2, 2.9), "shared": (4.75, 3.2), "reg": (9.7, 3.9)}  # left edge, width
    for key, title in (("global", "global memory"), ("shared", "shared memory (one block, 128 keys)"),
                       ("reg", "registers (one warpgroup, 64 keys)")):
        x0, w = cols[key]
        ax.add_patch(FancyBboxPatch((x0 - 0.1, 0.3), w + 0.2, 8.75, boxstyle="round,pad=0.02",
                                    facecolor="none", edgecolor="#bbbbbb", lw=1, linestyle="--"))
        ax.text(x0 + w / 2, 9.3, title, ha="center", va="center", fontsize=10, weight="bold")

    def box(key, y, text, h=0.8, kind=None, w=None):
        x0, width = cols[key]
        width = w or width
        ax.add_patch(FancyBboxPatch((x0, y - h / 2), width, h, boxstyle="round,pad=0.03",
                                    facecolor=colors[kind or key], edgecolor="#555555", lw=1))
        ax.text(x0 + width / 2, y, text, ha="center", va="center", fontsize=8.2)
        return x0, x0 + width, y, h

    def arrow(p, q, text="", color="#444444", rad=0.0, tx=0.0, ty=0.1, style=None):
        ax.add_patch(FancyArrowPatch(p, q, arrowstyle="-|>", mutation_scale=13, color=color, lw=1.3,
                                     connectionstyle=style or f"arc3,rad={rad}", shrinkA=2, shrinkB=2))
        if text:
            ax.text((p[0] + q[0]) / 2 + tx, (p[1] + q[1]) / 2 + ty, text, ha="center", va="bottom",
                    fontsize=7.3, color=color)

    right = lambda b, dy=0.0: (b[1], b[2] + dy)
    left = lambda b, dy=0.0: (b[0], b[2] + dy)
    top = lambda b: ((b[0] + b[1]) / 2, b[2] + b[3] / 2)
    bottom = lambda b: ((b[0] + b[1]) / 2, b[2] - b[3] / 2)

    # global memory
    g_q = box("global", 8.0, "Q, dO  (bf16 or fp16)\nrows of one query head")
    g_l = box("global", 6.8, "lse·log₂e, δ  (float32,\none per query row)")
    g_pre = box("global", 5.55, "preprocess kernel, before: reads O, dO;\nδ = rowsum(dO∘O), lse·log₂e;\n"
                "zeroes the float32 dQ", h=0.9, kind="kernel")
    g_k = box("global", 4.2, "K, V  (bf16 or fp16)")
    g_dq = box("global", 3.0, "dQ  (float32, in tiles\nof 64 rows × 64 columns)")
    g_post = box("global", 1.75, "postprocess kernel, after:\ndQ back in rows, in q's dtype", kind="kernel")
    g_kv = box("global", 0.75, "dK, dV", h=0.55)
    # shared memory
    s_q = box("shared", 8.0, "Q, dO tiles: a ring of 2 buffers\n[64 queries × D], 128-byte swizzle;\n"
              "mbarriers full / empty per buffer", h=1.0)
    s_l = box("shared", 6.8, "lse, δ of the 64 queries")
    s_ds = box("shared", 5.5, "dSᵀ  [128 keys × 64 queries]")
    s_k = box("shared", 4.2, "K, V  [128 keys × D]:\nloaded once, kept the whole loop")
    s_dq = box("shared", 3.0, "dQ partial tiles  [64 × 64] float32,\n2 buffers (one step's may be in flight)")
    # registers
    r_s = box("reg", 8.0, "Sᵀ = K·Qᵀ,  dPᵀ = V·dOᵀ\n(wgmma, 64 keys × 64 queries each)")
    r_p = box("reg", 6.8, "Pᵀ = exp2(Sᵀ·scale·log₂e − lse·log₂e)\ndSᵀ = Pᵀ ∘ (dPᵀ − δ)·scale")
    r_acc = box("reg", 5.4, "dV += Pᵀ·dO,   dK += dSᵀ·Q\n(kept the whole loop; Pᵀ and dSᵀ are\n"
                "the register A operand, dO and Q\nread from shared memory, MN-major)", h=1.2)
    r_dq = box("reg", 3.0, "dQ part = dS·K\n(wgmma, 64 queries\n× 64 columns of D)", h=1.0, w=2.7)

    load, copy, operand, store, red = "#c0392b", "#d68910", "#555555", "#1f618d", "#7d3c98"
    arrow(right(g_q), left(s_q), "TMA (tensor maps),\nthe producer's warp 0,\n2 steps ahead", color=load)
    arrow(right(g_l), left(s_l), "bulk copies,\nsame mbarrier", color=load)
    arrow(top(g_pre), bottom(g_l), color="#777777")
    arrow(right(g_k), left(s_k), "cp.async, every thread,\nonce per block", color=copy)
    arrow(right(s_q), left(r_s), "wgmma operands\n(descriptors)", color=operand)
    arrow(right(s_k, 0.2), left(r_s, -0.2), "K, V", color=operand, rad=0.3, tx=0.35, ty=-0.6)
    arrow(right(s_l), left(r_p), color=operand)
    arrow(bottom(r_s), top(r_p))
    arrow(bottom(r_p), top(r_acc))
    arrow(left(r_p, -0.2), right(s_ds), "dSᵀ stored", color=store, tx=-0.1, ty=0.05)
    arrow(right(s_ds, -0.2), left(r_dq, 0.3), "dS", color=operand, tx=-0.1, ty=0.0)
    arrow(right(s_k, -0.2), left(r_dq, 0.1), "K", color=operand, tx=-0.1, ty=-0.05)
    arrow(left(r_dq, -0.3), right(s_dq), "stored (float4)", color=store, ty=-0.3)
    arrow(left(s_dq), right(g_dq), "cp.reduce.async\n.bulk .add.f32,\none thread", color=red)
    arrow(bottom(g_dq), top(g_post), color="#777777")
    arrow((r_acc[1] - 0.45, r_acc[2] - r_acc[3] / 2), right(g_kv), color=store, style="angle,angleA=-90,angleB=0,rad=0")
    ax.text(8.5, 0.8, "after the loop: dK, dV stored", ha="center", va="bottom", fontsize=7.3, color=store)
    for i, (c, t) in enumerate(((load, "copy engine: loads"), (copy, "threads' cp.async copies"),
                                (operand, "wgmma reads from shared memory"),
                                (store, "stores from registers"), (red, "copy engine: bulk reduction"))):
        ax.text(4.85, 2.1 - 0.26 * i, "⟶ " + t, color=c, fontsize=7.5, va="center")
    fig.suptitle("One step of the dK/dV kernel, Hopper build at D 128 (two warpgroups): 64 queries against "
                 "the block's 128 keys", fontsize=11)
    fig.tight_layout()
    return fig
