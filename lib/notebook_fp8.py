"""The stage 7 (FP8) notebook's helpers: e4m3 as a number format, the P·V layout picture, the
count behind the prediction, the offline builds, and the accuracy record."""
from __future__ import annotations

import math

import torch

from lib import fp8
from lib import results as R
from lib.notebook_common import _md
from lib.plots_journey import STAGE_COLORS
from lib.plots_stage6 import TENSOR_FLOP_PER_CLOCK

# Dense tensor-core FLOP per SM per clock on Hopper (H100, H200): fp16/bf16 (stage 6's count), e4m3 twice that.
FLOP_PER_CLOCK = {"bf16": TENSOR_FLOP_PER_CLOCK, "e4m3": 2 * TENSOR_FLOP_PER_CLOCK}
MUFU_EX2_PER_CLOCK = 16  # per SM (the CUDA programming guide, compute capability 9.0)


def format_table() -> None:
    """e4m3 beside the 16-bit formats, read off torch.finfo and one rounding experiment: largest
    and smallest normal value, the relative rounding (half an ulp at 1), and the largest relative
    error of a cast of 100,000 log-uniform values in the normal range."""
    g = torch.Generator().manual_seed(0)
    rows = ["| format | mantissa bits | largest | smallest normal | rounding at 1 | measured max relative error of a cast |",
            "|---|---|---|---|---|---|"]
    for name, dt, bits in (("fp16", torch.float16, 10), ("bf16", torch.bfloat16, 7), ("e4m3", fp8.E4M3, 3)):
        fi = torch.finfo(dt)
        x = torch.exp(torch.empty(100_000, dtype=torch.float64).uniform_(math.log(fi.tiny) + 1, math.log(fi.max) - 1,
                                                                           generator=g))
        err = float(((x.to(dt).double() - x).abs() / x).max())
        rows.append(f"| {name} | {bits} | {fi.max:g} | {fi.tiny:g} | 2^-{bits + 1} = {2.0 ** -(bits + 1):.2g} | {err:.2g} |")
    _md("\n".join(rows))


def draw_key_order():
    """One thread's view of one 32-key k-step of P·V: which of its accumulators (columns of S,
    i.e. keys) feed which bytes of its e4m3 A fragment, and in which order the keys of Vᵀ must
    then be stored (lib.fp8.key_order). Returns the figure."""
    import matplotlib.pyplot as plt
    order = fp8.key_order()
    fig, axes = plt.subplots(2, 1, figsize=(10, 3.6))
    ax = axes[0]
    for t in range(4):  # the 4 threads of one row, lanes 0-3 of warp 0
        held = [fp8.acc_element(t, j)[1] for j in range(16) if fp8.acc_element(t, j)[0] == 0]
        for key in held:
            ax.add_patch(plt.Rectangle((key, 0), 1, 1, color=f"C{t}", alpha=0.8))
    ax.set_xlim(0, 32), ax.set_ylim(0, 1), ax.set_yticks([])
    ax.set_xticks(range(0, 33, 4))
    ax.set_title("S, row 0, keys 0-31: the accumulators each of the row's 4 threads holds (colour = thread)", fontsize=9)
    ax = axes[1]
    for slot in range(32):
        owner = k_thread(slot)
        ax.add_patch(plt.Rectangle((slot, 0), 1, 1, color=f"C{owner}", alpha=0.8))
        ax.text(slot + 0.5, 0.5, str(order[slot]), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, 32), ax.set_ylim(0, 1), ax.set_yticks([])
    ax.set_xticks(range(0, 33, 4))
    ax.set_title("the e4m3 A fragment of that row, k slots 0-31 (colour = thread that holds the slot, number = "
                 "the key it takes: key_order)", fontsize=9)
    fig.tight_layout()
    return fig


def k_thread(slot: int) -> int:
    """The lane (0-3) that holds k slot `slot` of row 0's A fragment (wgmma m64nNk32, e4m3)."""
    return next(t for t in range(4) for i in range(16) if fp8.a8_element(t, i) == (0, slot))


def prediction(tiles: dict, clock_hz: float, sms: int = 132, exp_poly_share: float = 0.0) -> dict:
    """Per head dim, the count behind stage 7's prediction, as stage 6's notebook counts it: per
    key tile and consumer warpgroup, the products' tensor-core cycles at the e4m3 rate, and the
    softmax's 64·BLOCK_N exponentials at 16 MUFU.EX2 per SM and clock (×2 for the rest of the
    softmax; a share `exp_poly_share` of the exponentials moved to the FMA pipes costs MUFU
    nothing). An SM has one exponential unit for all its consumers, so per key tile it needs
    consumers × one warpgroup's exponential cycles. High: the longest of the three things that
    cannot overlap with themselves (all consumers' products on the tensor cores, one consumer's
    products and softmax in a row, all consumers' exponentials on the one unit); low: nothing
    overlapped. `bound` names the terms that set the high end. TFLOPS at `clock_hz`."""
    out = {}
    for D, (bn, _, cons) in tiles.items():
        flop = 2 * (64 * bn * D * 2)
        gemm = flop / FLOP_PER_CLOCK["e4m3"]
        gemm16 = flop / FLOP_PER_CLOCK["bf16"]
        exps = 64 * bn / MUFU_EX2_PER_CLOCK * (1 - exp_poly_share)
        soft = 2 * exps
        terms = {"tensor cores": cons * gemm, "one consumer's products + softmax": gemm + soft,
                 "shared MUFU": cons * exps}
        hi, lo = max(terms.values()), cons * (gemm + soft)
        work = cons * flop * sms * clock_hz / 1e12
        out[D] = {"BLOCK_N": bn, "consumers": cons, "gemm_cycles": gemm, "gemm16_cycles": gemm16,
                  "exp_cycles": exps, "mufu_cycles": cons * exps, "period_lo": lo, "period_hi": hi,
                  "bound": [k for k, v in terms.items() if math.isclose(v, hi)],
                  "tflops": (work / lo, work / hi)}
    return out


def prediction_table(pred: dict, fp8_ceiling: float) -> None:
    rows = ["| D | BLOCK_N | consumers | products, cycles / tile / warpgroup (bf16 → e4m3) | "
            "exp cycles / tile: one warpgroup × consumers = all (one MUFU per SM) | "
            "cycles per key tile, all consumers | set by | predicted TFLOPS | of the e4m3 GEMM ceiling |",
            "|---|---|---|---|---|---|---|---|---|"]
    for D, p in pred.items():
        lo, hi = p["tflops"]
        rows.append(f"| {D} | {p['BLOCK_N']} | {p['consumers']} | {p['gemm16_cycles']:,.0f} → {p['gemm_cycles']:,.0f} | "
                    f"{p['exp_cycles']:,.0f} × {p['consumers']} = {p['mufu_cycles']:,.0f} | "
                    f"{p['period_lo']:,.0f} (serial) – {p['period_hi']:,.0f} | {', '.join(p['bound'])} | "
                    f"{lo:.0f}–{hi:.0f} | {lo / fp8_ceiling:.0%}–{hi / fp8_ceiling:.0%} |")
    _md("\n".join(rows))


def offline_builds(stage7, stage6, head_dims=(64, 128)) -> None:
    """Stage 7's default builds beside stage 6's, compiled here for sm_90a: registers, spills,
    the tensor-core instructions (QGMMA for e4m3, HGMMA for 16-bit), MUFU.EX2 and the e4m3
    conversions (F2FP), and whether ptxas serialized any wgmma."""
    import re

    from lib import sass
    rows = ["| stage | D | tiles | registers (cap) | spills | tensor-core instructions | MUFU | F2FP | ptxas warnings |",
            "|---|---|---|---|---|---|---|---|---|"]
    for D in head_dims:
        for n, mod in ((6, stage6), (7, stage7)):
            (compiled,) = mod.compile_for(dtype=torch.bfloat16, head_dim=D).values()
            kernel = "attention_fp8" if n == 7 else "attention_wgmma"  # not stage 6's combine kernel
            use = compiled.resource_usage().get(kernel)
            if use is None:  # an empty ptxas log (seen from NVRTC on the H100 machine): read the cubin
                ru = sass.resource_usage(compiled.cubin)[kernel]
                use = {"registers": ru["REG"], "spill_stores": ru["LOCAL"], "spill_loads": 0}
            mix = sass.instruction_mix(sass.function_text(sass.sass_text(compiled.cubin), kernel))
            warns = sorted(set(re.findall(r"C75\d\d", compiled.log))) or ["none"]
            mma = f"{mix['QGMMA']} QGMMA" if mix["QGMMA"] else f"{mix['HGMMA']} HGMMA"
            rows.append(f"| {n} | {D} | {mod.TILES[D]} | {use['registers']} | {use['spill_stores'] + use['spill_loads']} B | "
                        f"{mma} | {mix['MUFU']} | {mix['F2FP']} | {', '.join(warns)} |")
    _md("\n".join(rows))


def accuracy_record() -> dict | None:
    """The emulated accuracy experiment (scripts/fp8_accuracy.py --record), or None."""
    data = R.load() or {}
    return data.get("fp8_accuracy_emulated")


def accuracy_markdown(rows: list[dict], paper: dict) -> str:
    """The accuracy experiment's rows (scripts/fp8_accuracy.py) as tables: per input kind, a row
    per configuration (in the order measured), a column group per head dim (RMSE, ÷ bf16, ÷ fp16
    on the same inputs); on the outlier inputs the paper's figure (`paper`: {config: {"rmse",
    "paper_row"}}) beside."""
    parts = []
    for kind in dict.fromkeys(r["inputs"] for r in rows):
        mine = [r for r in rows if r["inputs"] == kind]
        dims = sorted({r["D"] for r in mine})
        with_paper = kind == "outliers"
        cols = ["config", "block", "rotate", "P·2^8"] + (["paper (Table 3)", "paper ÷ fp16"] if with_paper else [])
        for D in dims:
            cols += [f"D{D} RMSE", f"D{D} ÷ bf16", f"D{D} ÷ fp16"]
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for name in dict.fromkeys(r["config"] for r in mine):
            first = next(r for r in mine if r["config"] == name)
            cells = [name, str(first["block"] or "—"), "yes" if first["rotate"] else "—",
                     "—" if not first["fp8"] else ("yes" if first["p_offset"] else "no")]
            if with_paper:
                p = paper.get(name)
                cells += [f"{p['rmse']:.1e}" if p else "—", f"{p['rmse'] / paper['fp16']['rmse']:.0f}×" if p else "—"]
            for D in dims:
                r = next(r for r in mine if r["D"] == D and r["config"] == name)
                cells += [f"{r['rmse']:.2e}", f"{r['ratio_to_bf16']:.2f}×", f"{r['ratio_to_fp16']:.1f}×"]
            lines.append("| " + " | ".join(cells) + " |")
        shape = f"B{mine[0]['B']} H{mine[0]['H']} S{mine[0]['S']}, seeds {mine[0]['seeds']}"
        title = ("FlashAttention-3's outlier inputs, N(0,1) + N(0,100)·Bernoulli(0.001)" if with_paper
                 else "plain N(0,1) inputs")
        parts.append(f"**{title}** ({shape}; medians over the seeds; ÷: the median over seeds of "
                     "the ratio on the same inputs):\n\n" + "\n".join(lines))
    notes = ("The paper's figures are for its own kernels and shapes, on its GPU; ours are "
             "lib.fp8's emulation on the CPU. Paper rows beside ours: " +
             "; ".join(f"{name} ~ {p['paper_row']}" for name, p in paper.items()) + ".")
    return "\n\n".join(parts + [notes])


def show_accuracy(rec: dict) -> None:
    """The emulated accuracy record (scripts/fp8_accuracy.py --record): its provenance, tables and
    the FP8 error rule's margins."""
    env, rule = rec["env"], rec["rule"]
    _md(f"Emulated on the CPU ({env.get('device')}), commit {env['commit'][:7]}, {env['date']}, torch {env['torch']}: "
        f"`{rec['command']}`. Block quantization: blocks of {rec['block']} rows.\n\n"
        + accuracy_markdown(rec["rows"], rec["paper_table3"])
        + f"\n\nThe FP8 error rule (`lib.fp8.fp8_error_rule`): RMSE ≤ {rule['rmse_factor']:g} × the bf16 baseline's "
        f"(largest single seed here: {rule['largest_rmse_ratio_to_bf16']:.1f}×; the table shows medians over seeds), and max error ≤ {rule['max_factor']:g} × "
        f"the emulation's + one bf16 ulp (sums cut to 2^-11 moved it by at most {rule['largest_short_sums_max_err_ratio']:.2f}×).")


def _recorded_on(rec: dict, stage7, script: str, how: str) -> str:
    """The provenance sentence of one of stage 7's records (scripts/<script> --record): where,
    which commit, when, how it was timed, and whether stage 7's sources changed since."""
    env = rec["env"]
    stale = rec.get("sha256") != R.stage_sha256(stage7.INFO)
    return (f"Recorded on {env['gpu']}, commit {env['commit'][:7]}, {env['date']} (`python scripts/{script} "
            f"--record`; {how})."
            + (" **Stage 7's sources changed since this record**: the figures are of the earlier kernel."
               if stale else " Stage 7's sources are the ones recorded."))


def fp8_bench_record() -> dict | None:
    """Stage 7's benchmark (scripts/fp8_bench.py --record), or None."""
    return (R.load() or {}).get("fp8_bench")


def show_fp8_bench(rec: dict, stage7) -> None:
    """The recorded FP8 benchmark: its provenance (and whether stage 7's sources changed since),
    a table of the kernel against stage 6, SDPA and the ceilings, and a bar chart of TFLOPS."""
    import matplotlib.pyplot as plt

    env = rec["env"]
    ceil = rec["ceilings_tflops"]
    _md(_recorded_on(rec, stage7, "fp8_bench.py",
                     f"interleaved rounds, {rec.get('budget_s', 0.5):g} s of timing per callable, medians")
        + f" Ceilings measured in the same process: an e4m3 GEMM (`torch._scaled_mm`, 8192³) ran at "
        f"{ceil['e4m3 GEMM']:,.0f} TFLOPS, a bf16 one at {ceil['bf16 GEMM']:,.0f}.")
    unsplit = "stage 7 kernel, tail split" in rec["rows"][0]["us"]  # older records have no such columns
    lines = ["| shape | causal | stage 7 kernel µs | TFLOPS | of e4m3 GEMM | × stage 6 | × SDPA default | "
             + ("tail split µs | tail not split µs | " if unsplit else "")
             + "V in kernel µs | exp2 poly 4/8 µs | quantize µs | in PyTorch µs | V transpose µs | whole call µs | "
             "vs emulation (worst element / bound, RMSE / allowance) |", "|" + "---|" * (14 + 2 * unsplit)]
    for r in rec["rows"]:
        us = r["us"]
        k = us["stage 7 kernel"]
        chk = r["vs_emulation"]
        in_torch = f"{us['quantize in PyTorch']:,.1f}" if "quantize in PyTorch" in us else "—"  # an older record
        lines.append(
            f"| B{r['B']} H{r['H']} S{r['S']} D{r['D']} | {'yes' if r['causal'] else 'no'} | {k:,.1f} | "
            f"{r['tflops_kernel']:,.0f} | {r['tflops_kernel'] / ceil['e4m3 GEMM']:.0%} | {us['stage 6'] / k:.2f} | "
            f"{us['SDPA default'] / k:.2f} | "
            + (f"{us['stage 7 kernel, tail split']:,.1f} | {us['stage 7 kernel, tail not split']:,.1f} | "
               if unsplit else "")
            + f"{us['stage 7 kernel, V in kernel']:,.1f} | "
            f"{us['stage 7 kernel, exp2 poly 4/8']:,.1f} | {us['quantize']:,.1f} | {in_torch} | "
            f"{us['V transpose']:,.1f} | "
            f"{us['stage 7 call']:,.1f} | {max(c['worst'] for c in chk):.2f}, {max(c['rmse_ratio'] for c in chk):.2f} |")
    _md("\n".join(lines))
    rows = rec["rows"]
    labels = [f"S{r['S']} D{r['D']}\n{'causal' if r['causal'] else 'full'}" for r in rows]
    flops = [r["tflops_kernel"] * r["us"]["stage 7 kernel"] for r in rows]  # TFLOPS · µs: the same for every callable
    series = {"stage 7 (e4m3)": "stage 7 kernel", "stage 6 (bf16)": "stage 6", "SDPA default": "SDPA default"}
    colors = {"stage 7 (e4m3)": STAGE_COLORS[7], "stage 6 (bf16)": STAGE_COLORS["stages 0-6"],
              "SDPA default": "dimgray"}  # the journey's colours (lib.plots_journey.STAGE_COLORS)
    fig, ax = plt.subplots(figsize=(9, 3.6))
    width = 0.8 / len(series)
    for i, (name, key) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(rows))], [f / r["us"][key] for f, r in zip(flops, rows)],
               width, label=name, color=colors[name])
    for name, style in (("e4m3 GEMM", "--"), ("bf16 GEMM", ":")):
        ax.axhline(ceil[name], color="gray", linestyle=style, linewidth=1)
        ax.text(len(rows) - 0.5, ceil[name], f" {name} {ceil[name]:,.0f}", va="bottom", ha="right", fontsize=8)
    ax.set_xticks([x + width for x in range(len(rows))], labels, fontsize=8)
    ax.set_ylabel("TFLOPS")
    ax.set_title(f"Stage 7 against stage 6 and SDPA, measured ({env['gpu']}, {env['commit'][:7]})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    plt.show()


def fp8_tiles_record() -> dict | None:
    """Stage 7's key-tile comparison (scripts/fp8_tiles.py --record), or None."""
    return (R.load() or {}).get("fp8_tiles")


def show_fp8_tiles(rec: dict, stage7) -> None:
    """The recorded key-tile comparison: its provenance, and per shape each (BLOCK_N, STAGES,
    CONSUMERS) against the default tiles of that record and stage 6, in the same rounds."""
    _md(_recorded_on(rec, stage7, "fp8_tiles.py",
                     "interleaved rounds, medians; each choice checked against the emulation before and after"))
    if any(r.get("row_sum_mma") is False for r in rec["rows"]):
        _md("Every choice here runs without the row sums by P·V (`ROW_SUM_MMA`, D 64's default, which three "
            "consumers with 160-key tiles have no registers for): this compares the widths alone, and the "
            "waterfall below times the row sums as a step of their own.")
    lines = ["| shape | causal | tiles (BLOCK_N, STAGES, CONSUMERS) | µs | TFLOPS | × default tiles | × stage 6 | check |",
             "|---|---|---|---|---|---|---|---|"]
    default = {int(d): tuple(t) for d, t in rec["default_tiles"].items()}
    for r in rec["rows"]:
        tiles = tuple(r["tiles"])
        name = f"**{tiles}** (default)" if tiles == default[r["D"]] else str(tiles)
        lines.append(f"| B{r['B']} H{r['H']} S{r['S']} D{r['D']} | {'yes' if r['causal'] else 'no'} | {name} | "
                     f"{r['us']:,.1f} | {r['tflops']:,.0f} | {r['vs_default']:.3f} | {r['vs_stage6']:.2f} | "
                     f"{'pass' if r['passed'] else 'FAIL'} |")
    _md("\n".join(lines))


def fp8_waterfall_record() -> dict | None:
    """Stage 7's schedule waterfall (scripts/fp8_waterfall.py --record), or None."""
    return (R.load() or {}).get("fp8_waterfall")


def show_fp8_waterfall(rec: dict, stage7) -> None:
    """The recorded waterfall: its provenance, then one panel per shape and mask, each step's
    TFLOPS (error bars: the slowest and fastest round), with stage 6 and SDPA's default backend
    from the same rounds as lines."""
    import matplotlib.pyplot as plt

    from lib.plots_stage6 import plot_waterfall

    _md(_recorded_on(rec, stage7, "fp8_waterfall.py",
                     "interleaved rounds, medians; each step checked against the emulation first"))
    panels = rec["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), sharey=False)
    for ax, p in zip(axes, panels):
        plot_waterfall(p["rows"], f"B{p['B']} H{p['H']} S{p['S']} D{p['D']} {'causal' if p['causal'] else 'full'}",
                       sdpa_tflops=p["SDPA default"]["tflops"],
                       anchors={"stage 6 (bf16), same run": p["stage 6"]["tflops"]}, ax=ax)
    fig.tight_layout()
    plt.show()


def draw_vt_subtiles(head_dim: int = 128, widths=(128, 192, 224)):
    """A Vᵀ tile in shared memory for each key-tile width: its sub-tiles of VT_ATOM keys
    (stages.stage7.vt_atom: one copy and one swizzle row each, thick borders), its 32-key k-steps
    (colours), and where each k-step's descriptor starts, in bytes from the tile's start — the
    offsets issue_pv in stages/stage7.cu adds: sub-tile t / (VT_ATOM/32) at D·VT_ATOM bytes
    each, then 32 bytes per k-step inside it. Returns the figure."""
    import matplotlib.pyplot as plt

    from stages.stage7 import vt_atom
    fig, axes = plt.subplots(len(widths), 1, figsize=(10, 1.25 * len(widths) + 0.4))
    for ax, bn in zip(axes, widths):
        atom = vt_atom(bn)
        steps = atom // 32
        for t in range(bn // 32):
            start = (t // steps) * head_dim * atom + (t % steps) * 32
            ax.add_patch(plt.Rectangle((32 * t, 0), 32, 1, color=f"C{t % 10}", alpha=0.55))
            ax.text(32 * t + 16, 0.5, f"k-step {t}\n+{start:,} B", ha="center", va="center", fontsize=7)
        for a in range(bn // atom):
            ax.add_patch(plt.Rectangle((a * atom, 0), atom, 1, fill=False, lw=2.2, ec="k"))
            ax.text(a * atom + atom / 2, 1.06, f"copy {a}", ha="center", va="bottom", fontsize=7)
        ax.set_xlim(0, 224), ax.set_ylim(0, 1.45), ax.set_yticks([])
        ax.set_xticks(range(0, bn + 1, 32))
        ax.set_ylabel(f"{bn} keys:\n{bn // atom} sub-tile{'s' if bn > atom else ''} of {atom},\n{atom}-byte swizzle",
                      rotation=0, ha="right", va="center", fontsize=8)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel(f"keys of the tile (each sub-tile holds all {head_dim} rows of Vᵀ, one row per dimension of V)")
    fig.suptitle(f"A Vᵀ tile at D {head_dim}: sub-tiles (copies, swizzle rows) and where each 32-key k-step "
                 "of P·V reads", fontsize=9)
    fig.tight_layout()
    return fig


# -- the figures the notebook's prose cites (issue 47): read from the record, so that a prose cell
# (lib.prose) renders each sentence anew after a re-record ------------------------------------

TARGET_VS_STAGE6 = 1.5  # the goal stage 7 was built to: 1.5× stage 6's speed at D 128 (a goal, not a measurement)


def _entry(key: str) -> dict:
    from lib.prose import record
    return record()[key]


def count(tiles: dict, exp_poly_share: float = 0.0) -> dict:
    """§2's count at the clock at which the record's bf16 matmul ceiling is the tensor cores' peak
    (as the notebook's code cell computes it): {"clock_hz", "bf16_ceiling", "top": {D: TFLOPS},
    "low": {D: TFLOPS}}, `tiles` being stages.stage7.TILES."""
    env, ceil = _entry("env"), _entry("ceilings")["matmul_TFLOPS"]
    clock = ceil * 1e12 / (env["sm_count"] * FLOP_PER_CLOCK["bf16"])
    pred = prediction(tiles, clock, sms=env["sm_count"], exp_poly_share=exp_poly_share)
    return {"clock_hz": clock, "bf16_ceiling": ceil,
            "top": {D: p["tflops"][1] for D, p in pred.items()},
            "low": {D: p["tflops"][0] for D, p in pred.items()}}


def bench_env() -> dict:
    """The FP8 benchmark's env (its GPU, commit, date), for lib.prose.record_name."""
    return _entry("fp8_bench")["env"]


def bench(S: int, D: int, causal: bool) -> dict:
    """One shape of the FP8 benchmark (scripts/fp8_bench.py --record), as ratios the prose cites:
    the kernel's µs and TFLOPS, × stage 6 and × SDPA's default (their time over the kernel's),
    its share of the e4m3 GEMM measured beside it, and each other entry's time over the kernel's
    (or over the whole call's, for the quantization): `split_entry` and `no_split_entry` are the
    kernel with and without the tail split (TAIL_SPLIT), one of them the head dim's default."""
    rec = _entry("fp8_bench")
    r = next(r for r in rec["rows"] if (r["S"], r["D"], bool(r["causal"])) == (S, D, causal))
    u, k = r["us"], r["us"]["stage 7 kernel"]
    return {"us": k, "tflops": r["tflops_kernel"], "vs6": u["stage 6"] / k, "vs_sdpa": u["SDPA default"] / k,
            "of_gemm": r["tflops_kernel"] / rec["ceilings_tflops"]["e4m3 GEMM"],
            "split_entry": u["stage 7 kernel, tail split"] / k,
            "no_split_entry": u["stage 7 kernel, tail not split"] / k, "v_in_kernel": u["stage 7 kernel, V in kernel"] / k,
            "poly": u["stage 7 kernel, exp2 poly 4/8"] / k, "call": u["stage 7 call"],
            "call_vs6": u["stage 6"] / u["stage 7 call"], "quantize": u["quantize"],
            "quantize_share": u["quantize"] / u["stage 7 call"],
            "torch_vs_ours": u["quantize in PyTorch"] / u["quantize"], "v_transpose": u["V transpose"]}


def bench_ceilings() -> dict:
    """The GEMM ceilings measured in the FP8 benchmark's process: {"e4m3 GEMM", "bf16 GEMM"} TFLOPS."""
    return _entry("fp8_bench")["ceilings_tflops"]


def step(D: int, causal: bool, name: str) -> float:
    """The TFLOPS of the FP8 waterfall's step whose name starts with `name` (its panel: the shape
    with head dim D and mask `causal`)."""
    p = next(p for p in _entry("fp8_waterfall")["panels"] if (p["D"], bool(p["causal"])) == (D, causal))
    return next(r["tflops"] for r in p["rows"] if r["variant"].startswith(name))


def waterfall_stage6(D: int, causal: bool) -> float:
    """Stage 6's TFLOPS timed in the same rounds as the FP8 waterfall's panel (head dim D, mask `causal`)."""
    p = next(p for p in _entry("fp8_waterfall")["panels"] if (p["D"], bool(p["causal"])) == (D, causal))
    return p["stage 6"]["tflops"]


def best_stage6_step(D: int, causal: bool) -> float:
    """The fastest of the waterfall's steps that stage 6 also takes (before stage 7's own)."""
    p = next(p for p in _entry("fp8_waterfall")["panels"] if (p["D"], bool(p["causal"])) == (D, causal))
    ours = ("+ 192-key tiles", "without ping-pong", "+ row sums", "+ tail split")
    return max(r["tflops"] for r in p["rows"] if not r["variant"].startswith(ours))


def waterfall_env() -> dict:
    return _entry("fp8_waterfall")["env"]


def tile(D: int, causal: bool, tiles: tuple) -> dict:
    """One row of the key-tile comparison (scripts/fp8_tiles.py --record): `vs_default` is its
    speed over the default tiles' in the same rounds."""
    return next(r for r in _entry("fp8_tiles")["rows"]
                if (r["D"], bool(r["causal"]), tuple(r["tiles"])) == (D, causal, tuple(tiles)))


def default_tile(D: int, causal: bool) -> dict:
    """The key-tile comparison's row of the default tiles (the record's own default_tiles)."""
    return tile(D, causal, tuple(_entry("fp8_tiles")["default_tiles"][str(D)]))


def tiles_env() -> dict:
    return _entry("fp8_tiles")["env"]


def accuracy(inputs: str, config: str, D: int) -> dict:
    """One row of the emulated accuracy record (scripts/fp8_accuracy.py --record)."""
    return next(r for r in _entry("fp8_accuracy_emulated")["rows"]
                if (r["inputs"], r["config"], r["D"]) == (inputs, config, D))


def paper_rmse(config: str) -> float:
    """FlashAttention-3's Table 3 figure the accuracy record keeps beside its rows."""
    return _entry("fp8_accuracy_emulated")["paper_table3"][config]["rmse"]


def accuracy_env() -> dict:
    """The emulated accuracy record's env (device, commit, date)."""
    return _entry("fp8_accuracy_emulated")["env"]


def time_vs(ratio: float, digits: int = 1) -> str:
    """A time ratio (one entry's time over another's) as words: '1.8% less time', '0.3% longer',
    or 'the same time' where it rounds to 0.0%."""
    from lib.prose import pct
    frac = ratio - 1
    if round(100 * abs(frac), digits) == 0:
        return "the same time"
    return pct(abs(frac), digits) + (" longer" if frac > 0 else " less time")


def steps(*values: float) -> str:
    """TFLOPS of successive steps, the unit written once: '437 → 507 TFLOPS'."""
    from lib.prose import tflops
    return " → ".join(f"{v:,.0f}" for v in values[:-1]) + " → " + tflops(values[-1])
