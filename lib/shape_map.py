"""The shape map (scripts/shape_map.py --record): stage 6 against SDPA at the shapes models run,
read back from the results file for the stage 6 notebook and the journey — a heatmap of the
ratio to SDPA's default backend over the prefill and decoding grids, the decoding waterfall as a
table, and a one-paragraph summary. Presentation only: the numbers are the record's."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from lib import results as R


def record(data: dict | None = None) -> dict | None:
    data = R.load() if data is None else data
    return (data or {}).get("shape_map")


def provenance(rec: dict, stage6_info=None) -> str:
    env = rec["env"]
    text = (f"shape map recorded {env['date']} on {env['gpu']}, commit {env['commit']} "
            f"({len(rec['rows'])} rows, each checked against the float64 reference before and after timing)")
    if stage6_info is not None and rec["sha256"] != R.stage_sha256(stage6_info):
        text += (" — stage 6's sources changed since; tests/test_stage6.py checks that every row would still "
                 "run the build it was timed with")
    return text


def _grid(rows, part, row_key, col_key):
    rows = [r for r in rows if r["part"] == part and r.get("vs_sdpa")]
    ys = sorted({row_key(r) for r in rows})
    xs = sorted({col_key(r) for r in rows})
    z = np.full((len(ys), len(xs)), np.nan)
    for r in rows:
        z[ys.index(row_key(r)), xs.index(col_key(r))] = r["vs_sdpa"]
    return ys, xs, z


def _heat(ax, ys, xs, z, title, xlabel, ylabels, xlabels):
    lim = max(1.5, float(np.nanmax(np.abs(np.log2(z)))) if np.isfinite(z).any() else 1.5)
    im = ax.imshow(np.log2(z), cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    for i in range(len(ys)):
        for j in range(len(xs)):
            if np.isfinite(z[i, j]):
                ax.text(j, i, f"{z[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if abs(np.log2(z[i, j])) > lim * 0.6 else "black")
    ax.set_xticks(range(len(xs)), xlabels, fontsize=7, rotation=45, ha="right")
    ax.set_yticks(range(len(ys)), ylabels, fontsize=7)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    return im


def plot_shape_map(rec: dict, dtype: str = "bfloat16"):
    """Two heatmaps of SDPA default's time / stage 6's (blue: stage 6 faster, red: slower; log
    colour scale): prefill (rows: head dim, heads, mask; columns: S at B·S = 16k) and decoding
    without a mask (rows: head dim, heads, Sq; columns: B and Sk). The decode rows timed with a
    bottom-right mask are small_batch_table's."""
    rows = [r for r in rec["rows"] if r["dtype"] == dtype and (r["part"] != "decode" or not r["causal"])]
    decode_rows = len({(r["D"], r["H"], r["Sq"]) for r in rows if r["part"] == "decode"})
    fig, axes = plt.subplots(1, 2, figsize=(14, max(5.2, 1.5 + 0.3 * decode_rows)),
                             gridspec_kw={"width_ratios": [6, 9], "wspace": 0.35})
    pk = lambda r: (r["D"], -r["Hkv"], r["causal"])  # noqa: E731
    ys, xs, z = _grid(rows, "prefill", pk, lambda r: r["Sq"])
    heads = {r["D"]: r["H"] for r in rows if r["part"] == "prefill"}
    lab = {y: f"D{y[0]} H{heads[y[0]]}/{-y[1]} {'causal' if y[2] else 'full'}" for y in ys}
    _heat(axes[0], ys, xs, z, f"prefill (B·S = 16k), {dtype}", "S", [lab[y] for y in ys], [str(x) for x in xs])
    dk = lambda r: (r["D"], -r["H"], r["Sq"])  # noqa: E731
    ys, xs, z = _grid(rows, "decode", dk, lambda r: (r["B"], r["Sk"]))
    kv = {r["H"]: r["Hkv"] for r in rows if r["part"] == "decode"}
    lab = {y: f"D{y[0]} H{-y[1]}/{kv[-y[1]]} Sq{y[2]}" for y in ys}
    im = _heat(axes[1], ys, xs, z, f"decoding against a cache of Sk keys, {dtype}", "B, Sk",
               [lab[y] for y in ys], [f"B{b} Sk{sk // 1024}k" for b, sk in xs])
    cb = fig.colorbar(im, ax=axes, shrink=0.8)
    ticks = [-3, -2, -1, 0, 1, 2, 3]
    cb.set_ticks(ticks, labels=[f"{2.0 ** t:g}×" for t in ticks])
    cb.set_label("stage 6 vs SDPA default (SDPA's time / stage 6's)")
    return fig


def waterfall_table(rec: dict) -> str:
    """The decoding waterfall: each decode shape with the prefill build, + split-KV, packed GQA
    alone, both, the combine in the last block, two blocks per SM where they fill it, the
    combine kernel launched with PDL, and where a block reads one or two key tiles at D64 blocks
    without a producer (the last row of a shape is stage 6's own choice), against SDPA's two
    backends timed beside each."""
    lines = ["| shape | build | splits | blocks/SM | µs | vs SDPA default | vs SDPA FLASH | GB/s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rec["rows"] if r["part"] == "waterfall"):
        shape = f"B{r['B']} H{r['H']}/{r['Hkv']} Sq{r['Sq']} Sk{r['Sk']} D{r['D']}"
        lines.append(f"| {shape} | {r['variant']} | {r['splits']} | {r.get('blocks_per_sm', 1)} | {r['us']:,.1f} "
                     f"| {r['vs_sdpa']:.2f}× "
                     f"| {r['vs_flash']:.2f}× | {r['gbps']:,.0f} |")
    return "\n".join(lines)


def summary(rec: dict, dtype: str = "bfloat16") -> str:
    """Per part: the range of the ratio to SDPA default and how many rows are at or above 1."""
    out = []
    for part, what in (("prefill", "prefill grid"), ("decode", "decoding grid")):
        sqs = sorted({r["Sq"] for r in rec["rows"] if r["part"] == "decode"})
        for sq in ((None,) if part == "prefill" else sqs):
            got = [r["vs_sdpa"] for r in rec["rows"] if r["part"] == part and r["dtype"] == dtype
                   and r.get("vs_sdpa") and (sq is None or r["Sq"] == sq and not r["causal"])]
            if got:
                label = what + (f", Sq {sq}" if sq else "")
                out.append(f"{label}: {min(got):.2f}× to {max(got):.2f}× of SDPA default (median "
                           f"{float(np.median(got)):.2f}×), at or above it in {sum(x >= 0.995 for x in got)} "
                           f"of {len(got)} rows")
    return "; ".join(out) + "."


def small_batch_table(rec: dict, dtype: str = "bfloat16", B: int = 1) -> str:
    """Decoding at batch `B` by Sq (one token, then speculative decoding's few): for each head
    dim, head grouping and cache length, stage 6 over SDPA default without a mask and, where
    recorded, with the bottom-right mask (SDPA given causal_lower_right(Sq, Sk)). The caption
    names B; the rows do not."""
    rows = [r for r in rec["rows"] if r["part"] == "decode" and r["dtype"] == dtype and r["B"] == B]
    sqs = sorted({r["Sq"] for r in rows})
    cell = {(r["D"], r["H"], r["Hkv"], r["Sk"], r["Sq"], bool(r["causal"])): r for r in rows}
    lines = [f"| shape (B {B}) | mask | " + " | ".join(f"Sq {sq}" for sq in sqs) + " |",
             "|---|---|" + "---|" * len(sqs)]
    for D, H, Hkv, Sk in sorted({k[:4] for k in cell}, key=lambda k: (-k[0], -k[1], k[3])):
        for masked in (False, True):
            got = [cell.get((D, H, Hkv, Sk, sq, masked)) for sq in sqs]
            if masked and not any(got[1:]):
                continue
            text = [f"{g['vs_sdpa']:.2f}×" if g and g.get("vs_sdpa") else "–" for g in got]
            lines.append(f"| H{H}/{Hkv} Sk {Sk // 1024}k D{D} | {'bottom-right' if masked else 'none'} | "
                         + " | ".join(text) + " |")
    return "\n".join(lines)
