"""The stage 7 (FP8) notebook's helpers: e4m3 as a number format, the P·V layout picture, the
count behind the prediction, the offline builds, and the accuracy record."""
from __future__ import annotations

import math

import torch

from lib import fp8
from lib import results as R
from lib.notebook_common import _md

# Dense tensor-core FLOP per SM per clock on the H100 (SXM): fp16/bf16, and e4m3 at twice that.
FLOP_PER_CLOCK = {"bf16": 4096, "e4m3": 8192}
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
    nothing). High: every softmax hidden under the other consumers' products (or the softmax
    itself the bound); low: nothing overlapped. TFLOPS at `clock_hz`."""
    out = {}
    for D, (bn, _, cons) in tiles.items():
        flop = 2 * (64 * bn * D * 2)
        gemm = flop / FLOP_PER_CLOCK["e4m3"]
        gemm16 = flop / FLOP_PER_CLOCK["bf16"]
        exps = 64 * bn / MUFU_EX2_PER_CLOCK * (1 - exp_poly_share)
        soft = 2 * exps
        hi, lo = max(cons * gemm, gemm + soft), cons * (gemm + soft)
        work = cons * flop * sms * clock_hz / 1e12
        out[D] = {"BLOCK_N": bn, "consumers": cons, "gemm_cycles": gemm, "gemm16_cycles": gemm16,
                  "exp_cycles": exps, "period_lo": lo, "period_hi": hi,
                  "tflops": (work / lo, work / hi)}
    return out


def prediction_table(pred: dict, fp8_ceiling: float) -> None:
    rows = ["| D | BLOCK_N | consumers | products, cycles / tile / warpgroup (bf16 → e4m3) | exp cycles / tile / warpgroup | "
            "cycles per key tile, all consumers | predicted TFLOPS | of the e4m3 GEMM ceiling |",
            "|---|---|---|---|---|---|---|---|"]
    for D, p in pred.items():
        lo, hi = p["tflops"]
        rows.append(f"| {D} | {p['BLOCK_N']} | {p['consumers']} | {p['gemm16_cycles']:,.0f} → {p['gemm_cycles']:,.0f} | "
                    f"{p['exp_cycles']:,.0f} | {p['period_lo']:,.0f} (serial) – {p['period_hi']:,.0f} | "
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
            use = compiled.resource_usage()[kernel]
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


def show_accuracy(rec: dict) -> None:
    """The emulated accuracy record as a table, one row per configuration and input kind."""
    rows = rec.get("rows", [])
    if not rows:
        print("the accuracy record has no rows")
        return
    keys = [k for k in rows[0] if not isinstance(rows[0][k], (list, dict))]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    _md("\n".join(lines))
