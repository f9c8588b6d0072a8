"""Figures shared by the notebooks: recorded stages and sweeps on log axes, and the roofline with
the measured ceilings (lib.plots gathers every figure under one name)."""
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
