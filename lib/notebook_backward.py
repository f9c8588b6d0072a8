"""The stage 8 notebook's helpers: the backward's counts (products, FLOPs, the dQ atomics'
traffic), its recorded timings against SDPA's backward, and the recorded training run."""
from __future__ import annotations

import math

from lib import results as R
from lib.plots_backward import draw_backward_blocks, draw_backward_step  # noqa: F401  (the notebook's pictures)
from lib.reference import attention_flops


def backward_counts(B, H, S, D, causal, block_n=64) -> dict:
    """What one backward at this shape must do, counted: the forward's FLOPs, the backward's
    five products (2.5 times the forward's, the papers' convention), the dQ pass's two extra
    products (S and dP recomputed once more: 3.5 times), and the float32 additions the dQ
    atomics make (every block of block_n keys adds its share of dS·K into all of dQ)."""
    fwd = attention_flops(B, H, S, S, D, causal)
    key_blocks = math.ceil(S / block_n)
    # causal: a key block adds into the query rows at or after it, about half on average
    adds = B * H * S * D * key_blocks * (0.5 if causal else 1.0)
    return {"forward_flops": fwd, "backward_flops": 2.5 * fwd, "with_dq_pass_flops": 3.5 * fwd,
            "dq_atomic_adds": adds, "dq_atomic_bytes": 4 * adds}


def show_counts(shapes) -> None:
    from IPython.display import Markdown, display
    lines = ["| shape | causal | forward TFLOP | backward TFLOP (5 products) | with the dQ pass (7) "
             "| dQ atomics: float32 adds | their bytes |", "|---|---|---|---|---|---|---|"]
    for B, H, S, D in shapes:
        for causal in (False, True):
            c = backward_counts(B, H, S, D, causal)
            lines.append(f"| B{B} H{H} S{S} D{D} | {'yes' if causal else 'no'} | {c['forward_flops'] / 1e12:.2f} "
                         f"| {c['backward_flops'] / 1e12:.2f} | {c['with_dq_pass_flops'] / 1e12:.2f} "
                         f"| {c['dq_atomic_adds'] / 1e9:.2f} G | {c['dq_atomic_bytes'] / 1e9:.1f} GB |")
    display(Markdown("\n".join(lines)))


def backward_record() -> dict | None:
    data = R.load()
    return (data or {}).get("backward")


def training_record() -> dict | None:
    data = R.load()
    return (data or {}).get("training")


def record_line(rec: dict) -> str:
    """Where a record was made, and whether the stage sources it timed (its sha256 per stage: 5
    and 8 for the backward's entry) are still these."""
    import stages
    env = rec["env"]
    shas = rec.get("sha256", {})
    changed = [n for n in sorted(shas, key=int) if shas[n] != R.stage_sha256(stages.get(int(n)).INFO)]
    return (f"*Recorded* on {env['gpu']} at commit {env['commit']}, {env['date']} (torch {env['torch']}, "
            f"NVRTC {env.get('nvrtc', '?')})"
            + (f" — **stage {' and '.join(map(str, changed))} changed since: re-record pending**" if changed else ""))


def head_dims_record() -> dict | None:
    """The `backward_head_dims` entry (scripts/backward_bench.py --head-dims --record), or None."""
    return (R.load() or {}).get("backward_head_dims")


def show_head_dims_table(rec: dict) -> None:
    """Stage 8 at D 96 and D 256 (and D 128 at D 96's shape) against SDPA's backward, same run;
    the other builds timed beside the stage's, as a multiple of its time."""
    from IPython.display import Markdown, display
    lines = [record_line(rec), "",
             "| shape | causal | built as | stage 8 µs | TFLOPS | SDPA default µs | stage 8 × SDPA default "
             "| SDPA FLASH µs | stage 8 × SDPA FLASH | other builds (their time ÷ the stage's) | gradients |",
             "|---" * 11 + "|"]
    for r in rec["rows"]:
        d, f = r.get("sdpa_us"), r.get("sdpa_flash_us")
        built = (f"D {r['padded_to']} on zero-padded copies" if r.get("padded_to") else
                 "two warpgroups split D, dQ pass, no producer" if r["D"] > 128 else
                 "D 128's tiles, columns 96–127 zero" if r["D"] == 96 else "the stage's build")
        others = "; ".join(f"{lab}: {o['us'] / r['us']:.2f}" for lab, o in r.get("others", {}).items()) or "—"
        lines.append(f"| B{r['B']} H{r['H']} S{r['S']} D{r['D']} | {'yes' if r['causal'] else 'no'} | {built} "
                     f"| {r['us']:,.0f} | {r['tflops']:.0f} | {d:,.0f} | {d / r['us']:.2f}× | {f:,.0f} | "
                     f"{f / r['us']:.2f}× | {others} | {'pass' if r['passed'] else 'FAIL'} |")
    display(Markdown("\n".join(lines)))


def show_backward_table(rec: dict) -> None:
    """Stage 8's backward against SDPA's default (cuDNN) and FLASH backends, same run."""
    from IPython.display import Markdown, display
    several = len({r.get("dtype") for r in rec["rows"]}) > 1  # a dtype column where the record has both
    lines = [record_line(rec), "",
             ("| dtype " if several else "") + "| shape | causal | stage 8 µs | TFLOPS | SDPA default µs "
             "| stage 8 × SDPA default | SDPA FLASH µs | stage 8 × SDPA FLASH | gradients (largest error / tolerance) |",
             "|---" * (10 if several else 9) + "|"]
    for r in rec["rows"]:
        d, f = r.get("sdpa_default_us"), r.get("sdpa_flash_us")
        grads = "—"
        if "passed" in r:
            worst = max(r["max_grad_err"][n] / r["grad_tolerance"][n] for n in r["max_grad_err"])
            grads = f"{'pass' if r['passed'] else 'FAIL'} ({worst:.2f})"
        lines.append((f"| {r['dtype']} " if several else "") +
                     f"| B{r['B']} H{r['H']} S{r['S']} D{r['D']} | {'yes' if r['causal'] else 'no'} | "
                     f"{r['us']:,.0f} | {r['tflops']:.0f} | {d:,.0f} | {d / r['us']:.2f}× | "
                     f"{f:,.0f} | {f / r['us']:.2f}× | {grads} |")
    display(Markdown("\n".join(lines)))


def show_variants_table(rec: dict) -> None:
    """Every build of stage 8 the record timed (rows) at each shape (columns), same rounds: µs
    and speed as a multiple of the stage's build; the stage's own build in bold."""
    from IPython.display import Markdown, display
    rows = [r for r in rec["rows"] if r.get("variants")]
    if not rows:
        return
    labels = list(dict.fromkeys(label for r in rows for label in r["variants"]))
    head = "| build | " + " | ".join(f"B{r['B']} S{r['S']} D{r['D']} {'causal' if r['causal'] else 'full'}"
                                     for r in rows) + " |"
    lines = [head, "|---|" + "---|" * len(rows),
             "| **stage 8's build** (row `build` of the record) | "
             + " | ".join(f"**{r['us']:,.0f}**" for r in rows) + " |"]
    for label in labels:
        cells = []
        for r in rows:
            v = r["variants"].get(label)
            cells.append("—" if v is None else f"{v['us']:,.0f} ({r['us'] / v['us']:.2f}×)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    display(Markdown("µs, and in brackets each build's speed as a multiple of the stage's build "
                     "(below 1: slower):\n\n" + "\n".join(lines)))


def _gpu(rec: dict) -> str:
    """The GPU an entry was recorded on, as figure titles name it ("H200")."""
    from lib.prose import gpu_short
    return gpu_short(rec["env"]["gpu"])


def plot_backward_waterfall(rec: dict, path: dict):
    """The WGMMA build's switches turned on one at a time, from the one-warpgroup build with the
    dQ pass to the stage's build, as backward TFLOPS per shape (bars), with SDPA's FLASH and
    default backends as lines; `path` maps a head dim to the variant labels in order
    (scripts/backward_bench.py's WGMMA_PATH through wgmma_label)."""
    import matplotlib.pyplot as plt
    rows = [r for r in rec["rows"] if r.get("variants")]
    fig, axes = plt.subplots(1, len(rows), figsize=(3.4 * len(rows), 4.6), sharey=False)
    for ax, r in zip(axes, rows):
        fl = 2.5 * attention_flops(r["B"], r["H"], r["S"], r["S"], r["D"], r["causal"])
        labels = [label for label in path[r["D"]] if label in r["variants"]]
        tf = [fl / r["variants"][label]["us"] / 1e6 for label in labels]
        short = [label.replace("WGMMA, ", "").replace("WGMMA ", "").replace("warpgroups", "WG").replace("warpgroup", "WG")
                 .replace("dQ by bulk reduction", "bulk dQ").replace("the stage's build again", "the stage's build")
                 .replace("producer warpgroup", "producer") for label in labels]  # one line each, slanted below
        ax.bar(range(len(tf)), tf, color=["#9ecae1"] * (len(tf) - 1) + ["#3182bd"])
        for i, t in enumerate(tf):
            ax.text(i, t, f"{t:.0f}", ha="center", va="bottom", fontsize=7)
        for key, style, name in (("sdpa_flash_us", ":", "SDPA FLASH"), ("sdpa_default_us", "--", "SDPA default")):
            ax.axhline(fl / r[key] / 1e6, color="k", linestyle=style, linewidth=1, label=name)
        ax.set_xticks(range(len(tf)), short, fontsize=6, rotation=40, ha="right", rotation_mode="anchor")
        ax.set_title(f"B{r['B']} S{r['S']} D{r['D']} {'causal' if r['causal'] else 'full'}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("backward TFLOPS (2.5 × forward FLOPs)")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Stage 8's WGMMA build, one switch at a time ({_gpu(rec)}, same run, recorded)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_backward(rec: dict):
    """Bars per shape: the mma.sync build with dQ atomics and with the dQ pass (its default
    tiles), stage 8's build, SDPA FLASH and SDPA default, as TFLOPS (2.5 × the forward's FLOPs)."""
    import matplotlib.pyplot as plt
    import numpy as np
    import stages.stage8 as s8
    rows = rec["rows"]
    names = ["mma.sync, dQ atomics", "mma.sync, dQ pass", "stage 8 (its build)", "SDPA FLASH (FlashAttention-2)",
             "SDPA default (cuDNN)"]
    vals = {n: [] for n in names}
    for r in rows:
        fl = 2.5 * attention_flops(r["B"], r["H"], r["S"], r["S"], r["D"], r["causal"])
        tiles = s8.TILES[r["D"]]
        for n, label in ((names[0], f"mma.sync {tiles} dQ atomics"), (names[1], f"mma.sync {tiles} dQ pass")):
            alt = r.get("variants", {}).get(label)
            vals[n].append(fl / alt["us"] / 1e6 if alt else np.nan)
        vals[names[2]].append(r["tflops"])
        vals[names[3]].append(fl / r["sdpa_flash_us"] / 1e6)
        vals[names[4]].append(fl / r["sdpa_default_us"] / 1e6)
    names = [n for n in names if not all(np.isnan(v) for v in vals[n])]  # builds this record did not time: no bars, no legend
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(11, 4))
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar(x + (i - (len(names) - 1) / 2) * w, vals[n], w, label=n)
    several = len({r.get("dtype") for r in rows}) > 1
    ax.set_xticks(x, [f"B{r['B']} S{r['S']} D{r['D']}\n{'causal' if r['causal'] else 'full'}"
                      + (f"\n{r['dtype']}" if several else "") for r in rows])
    ax.set_ylabel("backward TFLOPS (2.5 × forward FLOPs)")
    ax.set_title(f"The backward pass on the {_gpu(rec)}, same run (recorded)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_training(rec: dict):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for (name, losses), style in zip(rec["losses"].items(), ("-", ":", "--", "-.", (0, (1, 3)))):
        ax.plot(range(1, len(losses) + 1), losses, linestyle=style, label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(f"Tiny Llama, {rec['dtype']}, batch {rec['batch']} × {rec['length']} random tokens, "
                 f"{rec['optimizer']}", fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def training_summary(rec: dict) -> str:
    """The training record in three lines: both gradient checks and how far the curves drift."""
    L = rec["losses"]
    sd, st = L["sdpa"], L["stage 5 + stage 8"]
    lines = [f"first step: every one of {rec['first_step']['parameters']} parameter gradients within the error "
             f"rule (largest error / tolerance {rec['first_step']['worst_error_over_tolerance']:.2f})"]
    if rec.get("after_training"):
        lines.append(f"after {len(sd)} steps, at the weights stages 5 + 8 trained: largest error / tolerance "
                     f"{rec['after_training']['worst_error_over_tolerance']:.2f}")
    drift = [f"stages 5 + 8 {max(abs(x - y) for x, y in zip(sd, st)):.3f}"]
    if "sdpa FLASH" in L:
        drift.insert(0, f"SDPA's FLASH backend {max(abs(x - y) for x, y in zip(sd, L['sdpa FLASH'])):.3f}")
    lines.append(f"final loss: SDPA {sd[-1]:.4f}, stages 5 + 8 {st[-1]:.4f}; largest gap to SDPA's default "
                 f"curve at any step: " + ", ".join(drift))
    for label in ("stage 5 forward + SDPA backward", "SDPA forward + stage 8 backward"):
        if label in L:
            lines.append(f"{label}: largest gap to SDPA's default {max(abs(x - y) for x, y in zip(sd, L[label])):.3f}, "
                         f"final loss {L[label][-1]:.4f}")
    if rec.get("seeds"):
        seeds = rec["seeds"]
        above = sum(v["stage 5 + stage 8"]["mean"] > v["sdpa"]["mean"] for v in seeds.values())
        flash = sum(v["sdpa FLASH"]["mean"] > v["sdpa"]["mean"] for v in seeds.values())
        lines.append(f"over {len(seeds)} seeds (weights and tokens), the mean loss over the steps was above SDPA "
                     f"default's for stages 5 + 8 in {above} and for SDPA's FLASH backend in {flash}")
        lines.append("   mean loss per seed (SDPA default / FLASH / stages): " + "; ".join(
            f"{sd} {v['sdpa']['mean']:.3f} / {v['sdpa FLASH']['mean']:.3f} / {v['stage 5 + stage 8']['mean']:.3f}"
            for sd, v in seeds.items()))
    return "\n".join(lines)



TRAIN_MAP_COMMAND = "python3 scripts/backward_bench.py --train-step --record"


def plot_train_map(data: dict | None, dtype: str = "bfloat16"):
    """The training map (the record's "train_step" entry, issue 48): SDPA default's training step
    over stage 6 + 8's (forward and backward through autograd, same run) against S at B·S fixed,
    one line per head dim, MHA or GQA and mask; above 1, the stages' step is faster. Prints one
    line and returns None when the record has no training map."""
    rec = (data or {}).get("train_step")
    if not rec:
        print(f"no training map recorded yet: {TRAIN_MAP_COMMAND} (on an H100 or H200)")
        return None
    import matplotlib.pyplot as plt
    import stages.stage6 as s6
    import stages.stage8 as s8
    lines = {}
    for r in rec["rows"]:
        if r["dtype"] == dtype and r.get("sdpa_us"):
            lines.setdefault((r["D"], r["Hkv"] < r["H"], r["causal"]), []).append(r)
    fig, ax = plt.subplots(figsize=(10, 4.2))
    colours = {(64, False): "#08519c", (64, True): "#6baed6", (128, False): "#a50f15", (128, True): "#fb6a4a"}
    for (D, gqa, causal), rows in sorted(lines.items()):
        rows.sort(key=lambda r: r["S"])
        ratios = [r["sdpa_us"] / r["us"] for r in rows]
        ax.plot([r["S"] for r in rows], ratios, color=colours.get((D, gqa), "grey"), linestyle="--" if causal else "-",
                marker="s" if gqa else "o", markersize=4,
                label=f"D{D} H{rows[0]['H']}/{rows[0]['Hkv']} ({'GQA' if gqa else 'MHA'}) {'causal' if causal else 'full'}")
        for r, y in zip(rows, ratios):  # a row whose gradients failed (never recorded by the script)
            if not r.get("passed", True):
                ax.plot(r["S"], y, "x", color="k", markersize=9)
    ax.axhline(1.0, color="k", linewidth=1)
    seqs = sorted({r["S"] for rows in lines.values() for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs, [str(S) for S in seqs])
    tokens = sorted({r["B"] * r["S"] for rows in lines.values() for r in rows})
    ax.set_xlabel(f"S (B·S = {', '.join(map(str, tokens))} tokens)")
    ax.set_ylabel("SDPA default's step / stage 6 + 8's")
    env = rec["env"]
    changed = [n for n, m in ((6, s6), (8, s8)) if rec.get("sha256", {}).get(str(n)) != R.stage_sha256(m.INFO)]
    ax.set_title(f"A training step through autograd, {dtype}: {env['gpu']}, commit {env['commit']}, {env['date']}"
                 + (f"\n(stage {' and '.join(map(str, changed))} changed since: re-record pending)" if changed else ""),
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# The recorded Nsight Compute report at D 64 (results/profiles/stage8-backward-d64.ncu.txt): what
# each kernel's columns are, in the order shown.
PROFILE_COLUMNS = ("Duration", "SM: Pipe Tensor Cycles Active", "SM: Issue Active", "L2 Cache Throughput",
                   "L2: D Atomic Input Cycles Active", "DRAM Throughput", "Registers Per Thread",
                   "Achieved Occupancy")
PROFILE_NAMES = {"attention_backward_preprocess": "stage 8 preprocess", "attention_backward": "stage 8 dK/dV kernel",
                 "attention_backward_postprocess": "stage 8 postprocess"}


def show_backward_profile(shape: str = "backward-d64") -> dict | None:
    """A table of the recorded Nsight Compute report of stage 8's kernels and cuDNN's backward
    kernel at one shape (lib.notebook_common.ncu_report), labelled as recorded."""
    from lib.notebook_common import _md, ncu_report
    rep = ncu_report(8, shape, metrics=PROFILE_COLUMNS)
    if rep is None:
        print(f"no recorded profile (results/profiles/stage8-{shape}.ncu.txt)")
        return None
    head = ["kernel (grid)x(block)", "µs", "tensor pipe active %", "issue active %", "L2 %",
            "L2 atomic input %", "DRAM %", "registers", "achieved occupancy %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in rep["kernels"]:
        name = PROFILE_NAMES.get(k["name"], "cuDNN's backward kernel" if k["name"].startswith("cudnn") else k["name"])
        cells = [f"{name} {k['launch']}"] + [f"{k['metrics'][c][0]:,.4g}" if c in k["metrics"] else "—"
                                             for c in PROFILE_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    _md(f"*Recorded by Nsight Compute, not measured in this session* (`{rep['path']}`: {rep['header']}). "
        "ncu runs each kernel alone with its caches flushed: compare shares, not microseconds.\n\n"
        + "\n".join(lines))
    return rep


# -- look-ups for the notebook's prose cells (lib.prose): every figure its sentences cite comes
# from the record's "backward" and "training" entries through these --------------------------

# the variants' labels (scripts/backward_bench.py's wgmma_label) that the prose compares
WG1_PASS, WG1_RED = "WGMMA 1 warpgroup, dQ pass", "WGMMA 1 warpgroup, dQ by red"
NO_OVERLAP_D128 = "WGMMA without overlap"
D64_WITH_OVERLAP = "WGMMA 1 warpgroup, dQ by bulk reduction, TMA loads"
# the builds before the producer warpgroup (stage8.BEFORE_PRODUCER), which the switches below modify
D64_BUILD_AGAIN = "WGMMA 1 warpgroup, dQ by bulk reduction, TMA loads, without overlap"
D128_BUILD_AGAIN = "WGMMA 2 warpgroups, dQ by bulk reduction, TMA loads"
BEFORE_PRODUCER = {64: D64_BUILD_AGAIN, 128: D128_BUILD_AGAIN}
PRODUCER_LABEL = "WGMMA, producer warpgroup"  # BEFORE_PRODUCER's build with a producer warpgroup
D64_PRODUCER_TWO_WG = "WGMMA 2 warpgroups, producer warpgroup"
D64_PRODUCER_TURNS = "WGMMA 2 warpgroups, producer warpgroup, dQ in turns"  # D 64's build
STAGE_AGAIN = "WGMMA, the stage's build again"  # the stage's build timed a second time: what the rounds resolve
D64_TWO_WG = "WGMMA 2 warpgroups, dQ by bulk reduction, TMA loads"
D64_TURNS = D64_TWO_WG + ", dQ in turns"
D64_THREE_BLOCKS = D64_BUILD_AGAIN + ", 3 blocks per SM"
DQ_EARLY_LABEL = "WGMMA, dQ issued before dV and dK are done"
# the stage's build with every switch after the guard off (DK_LAST, MASK_SPLIT, SCALE_AT_END,
# EPILOGUE_SMEM, LONGEST_FIRST, DS_STMATRIX, PREP_EARLY): the producer (at D 64 with two warpgroups taking
# turns at dQ) and the guard
GUARD_LABEL = "WGMMA, producer warpgroup and guard"
GUARD_SCALE_LABEL = GUARD_LABEL + ", the scale at the end"  # the waterfall's next step: that build with SCALE_AT_END
GUARD_DK_LAST_LABEL = GUARD_SCALE_LABEL + ", dK's product last"  # D 128's next: with DK_LAST too
# DK_LAST (dK's product after dQ's): on in D 128's build; at D 64, where it is off, the build with it
DK_LAST_LABEL = "WGMMA, dK's product last"
NO_MASK_SPLIT_LABEL = "WGMMA, the stage's build without the mask split"  # MASK_SPLIT, LONGEST_FIRST and those after off
HEAD_BY_HEAD_LABEL = "WGMMA, the stage's build head by head"  # LONGEST_FIRST (causal calls only) and those after off
# the stage's build without DS_STMATRIX (dSᵀ by stmatrix), PREP_EARLY (lse read before the wait for Sᵀ) and
# KV_REGS (K and V in registers); then at D 128, where PREP_EARLY is on, the build without it alone, and at
# D 64 the build without KV_REGS and PREP_EARLY 3 (lse read while the products run), which only won together
NO_STMATRIX_LABEL = "WGMMA, the stage's build with dSᵀ stored 4 bytes a store"
NO_PREP_EARLY_LABEL = "WGMMA, the stage's build with lse read after the wait"
NO_KV_REGS_LABEL = "WGMMA, the stage's build with K and V read from shared memory"
DETERMINISTIC_LABEL = "WGMMA, deterministic (dQ by its own pass)"  # attention_backward(deterministic=True)


def _backward() -> dict:
    from lib.prose import record
    return record()["backward"]


def bwd_entry() -> dict:
    """The backward entry's env (its commit and date), for lib.prose.record_name."""
    return _backward()["env"]


def bwd_rows(D=None, causal=None, dtype=None, timed_builds=False) -> list:
    """The backward record's rows, filtered; timed_builds: only rows with the variants timed."""
    return [r for r in _backward()["rows"]
            if (D is None or r["D"] == D) and (causal is None or r["causal"] == causal)
            and (dtype is None or r.get("dtype") == dtype) and (not timed_builds or r.get("variants"))]


def bwd_t(r: dict, label: str | None = None) -> float:
    """µs of the stage's build (label None) or of one variant of a row."""
    return r["us"] if label is None else r["variants"][label]["us"]


def bwd_speed(slow: str | None, fast: str | None, D=None, causal=None) -> list:
    """For each row with variants timed: the time of build `slow` over that of `fast` (None: the
    stage's build), i.e. the speed of `fast` as a multiple of `slow`'s."""
    return [bwd_t(r, slow) / bwd_t(r, fast) for r in bwd_rows(D, causal, timed_builds=True)
            if (slow is None or slow in r["variants"]) and (fast is None or fast in r["variants"])]



def bwd_resolve() -> float:
    """What the backward record's rounds resolve: the stage's build against its second timing in the
    same rounds (STAGE_AGAIN), the largest departure from 1 over the rows, plus 0.01."""
    return max(abs(a - 1) for a in bwd_speed(None, STAGE_AGAIN)) + 0.01

def bwd_vs_sdpa(backend: str = "flash", D=None) -> list:
    """Stage 8's speed as a multiple of SDPA's backward (backend 'flash' or 'default'), every dtype."""
    return [r[f"sdpa_{backend}_us"] / r["us"] for r in bwd_rows(D)]


# The mma.sync builds (the first backward, before WGMMA) were timed in the H100's record; the
# H200's times the WGMMA builds only (backward_bench.py --variants wgmma). Prose about them reads
# the newest record that has them, and names it.
MMA_HISTORY_GPU = "NVIDIA H100 80GB HBM3"


def _mma_record() -> dict:
    """The whole record whose backward entry timed the mma.sync builds: the current one if it
    did, else MMA_HISTORY_GPU's."""
    from lib.prose import record
    cur = record()
    if any(label.startswith("mma.sync") for r in cur["backward"]["rows"] for label in r.get("variants", {})):
        return cur
    return R.load(R.results_path(MMA_HISTORY_GPU))


def bwd_mma_entry() -> dict:
    """The env of the backward entry the mma.sync figures come from (for lib.prose.record_name),
    with its GPU."""
    rec = _mma_record()
    return {**rec["backward"]["env"], "gpu": rec["env"]["gpu"]}


def _mma_rows() -> list:
    return [r for r in _mma_record()["backward"]["rows"] if r.get("variants")]


def bwd_mma_best(r: dict, kind: str) -> float:
    """µs of the fastest mma.sync build of a row with dQ by `kind` ('dQ pass' or 'dQ atomics')."""
    return min(v["us"] for label, v in r["variants"].items() if label.startswith("mma.sync") and label.endswith(kind))


def bwd_mma_pass_gain() -> list:
    """The fastest mma.sync dQ-pass build's speed over the fastest atomics build's, per row of
    the record that timed them (bwd_mma_entry)."""
    return [bwd_mma_best(r, "dQ atomics") / bwd_mma_best(r, "dQ pass") for r in _mma_rows()]


def bwd_first_wgmma_gain() -> list:
    """The first WGMMA build's speed over the fastest mma.sync build's, same rounds, same record."""
    return [bwd_mma_best(r, "dQ pass") / bwd_t(r, WG1_PASS) for r in _mma_rows()]


def bwd_every_round_faster(r: dict, fast: str, slow: str | None = None) -> bool:
    """Whether every round's median of build `fast` beat every round's median of `slow`."""
    rounds = lambda label: r["round_medians_us"] if label is None else r["variants"][label]["round_medians_us"]
    return max(rounds(fast)) < min(rounds(slow))


def bwd_training() -> dict:
    from lib.prose import record
    return record()["training"]


def bwd_loss_gap(label: str, to: str = "sdpa") -> float:
    """The largest gap at any step between a training curve and SDPA default's."""
    L = bwd_training()["losses"]
    return max(abs(a - b) for a, b in zip(L[to], L[label]))


def bwd_seeds_above(label: str) -> tuple[int, int]:
    """(seeds whose mean loss over the steps was above SDPA default's for `label`, seeds)."""
    seeds = bwd_training()["seeds"]
    return sum(v[label]["mean"] > v["sdpa"]["mean"] for v in seeds.values()), len(seeds)


def bwd_seed_mean_gap(label: str, to: str = "sdpa") -> float:
    """The largest difference, over the seeds, between `label`'s mean loss and `to`'s (default:
    SDPA default's; "sdpa FLASH": SDPA's FLASH backend's)."""
    return max(abs(v[label]["mean"] - v[to]["mean"]) for v in bwd_training()["seeds"].values())


def bwd_mma_executed() -> list[dict]:
    """Per full row with variants timed (the D 64 and D 128 standard shapes): the tensor-core rate
    of what the fastest mma.sync dQ-pass build executes (its seven products, 3.5 times the
    forward's FLOPs, over its time), that rate over the record's mma.sync ceiling, and stage 5's
    bf16 forward at the same shape from its own rows of the record (None if not recorded): the
    figures the notebook's code cell prints under the variants table."""
    rec = _mma_record()
    ceiling = rec["ceilings"]["hmma_TFLOPS"]
    out = []
    for r in (r for r in _mma_rows() if not r["causal"]):
        executed = 3.5 * attention_flops(r["B"], r["H"], r["S"], r["S"], r["D"], False) / bwd_mma_best(r, "dQ pass") / 1e6
        fwd = next((f for f in rec["runs"] if f["stage"] == 5 and f.get("suite") == "standard" and not f["causal"]
                    and f["dtype"] == "bfloat16" and (f["B"], f["H"], f["Sq"], f["D"]) == (r["B"], r["H"], r["S"], r["D"])), None)
        out.append({"D": r["D"], "tflops": executed, "of_ceiling": executed / ceiling, "ceiling": ceiling,
                    "forward_tflops": fwd["tflops"] if fwd else None})
    return out


def bwd_profile(kernel: str, column: str, shape: str = "backward-d64") -> float:
    """One figure of the recorded Nsight Compute report (show_backward_profile's table): the
    kernel whose name is `kernel` or starts with it ('attention_backward', 'cudnn'), one of
    PROFILE_COLUMNS; percentages as fractions."""
    from lib.notebook_common import ncu_report
    rep = ncu_report(8, shape, metrics=PROFILE_COLUMNS)
    k = next(k for k in rep["kernels"] if k["name"] == kernel or (kernel == "cudnn" and k["name"].startswith("cudnn")))
    value, unit = k["metrics"][column]
    return value / 100 if unit == "%" else value
