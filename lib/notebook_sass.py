"""The stage 0-2 notebooks' readings of SASS and profiles: kernel listings, hot and innermost
loops, block limits, ncu durations and shared-memory counters, the K/V loop's steps and the
occupancy against the profile (lib.notebook re-exports these)."""
from __future__ import annotations

import re

from lib.notebook_common import ROOT, _md, conflict_text, instruction_classes
from lib.sass import innermost_loops


# --------------------------------------------------------------------------------------------
# The stage 0-2 notebooks: SASS loops, the kernels' source constants, instructions per K/V tile
# and the recorded profile (issue 13: analysis in lib/, not in notebook cells).

def kernel_listings(sass: str, names) -> dict[str, str]:
    """{name: the SASS listing of the kernel whose name contains it}, from a cuobjdump listing
    of a module with several kernels."""
    from lib.sass import function_text
    return {k: function_text(sass, k) for k in names}


def _sass_clean(line: str) -> str:
    """A SASS line without cuobjdump's trailing encoding comment."""
    return re.sub(r"\s*/\*\s*0x[0-9a-f]+\s*\*/\s*$", "", line).rstrip()


def show_hot_loops(sass: str, kernel: str, label, listing: int = 24) -> tuple[list, float]:
    """The hot loops of a scalar kernel: its innermost loops that load from global memory and
    do FFMAs, one table row each (addresses, instructions, FFMA, LDG, LDL, STL, the FFMA and the
    integer / address shares; `label(mix)` names the loop), then the first `listing`
    instructions of the first one. Each such loop does one FFMA per element of the head dim, so
    its instructions ÷ its FFMAs is what it issues per element; their sum and the FFMA share
    are printed under the table. Returns (the loops, those
    instructions per element summed over them)."""
    from IPython.display import Markdown, display
    hot = [L for L in innermost_loops(sass, kernel) if L["mix"]["LDG"] and L["mix"]["FFMA"]]
    per_element = 0.0
    lines = ["| loop | addresses | instructions | FFMA | LDG | LDL | STL | FFMA share | "
             "integer / address share |", "|---|---|---|---|---|---|---|---|---|"]
    for L in hot:
        mix, total = L["mix"], sum(L["mix"].values())
        integer = next((n for c, n, _ in instruction_classes(mix) if c == "integer / address"), 0)
        per_element += total / mix["FFMA"]
        lines.append(f"| {label(mix)} | {L['start']:#06x}–{L['end']:#06x} | {total} | {mix['FFMA']} | "
                     f"{mix['LDG']} | {mix['LDL']} | {mix['STL']} | {100 * mix['FFMA'] / total:.1f}% | "
                     f"{100 * integer / total:.0f}% |")
    display(Markdown("\n".join(lines)))
    if hot:
        print(f"per (query, key) pair each thread issues about {per_element:.0f}·D instructions "
              f"for {len(hot)}·D FFMAs: FFMA share {100 * len(hot) / per_element:.1f}%")
    if hot and listing:
        print(f"\nthe first hot loop, first {listing} of its {sum(hot[0]['mix'].values())} instructions:")
        for ln in hot[0]["sass"].splitlines()[:listing]:
            print(_sass_clean(ln))
    return hot, per_element


def show_block_limits(ins, threads: dict, sm: dict | None = None) -> None:
    """One table row per kernel of an inspected module (lib.sass.Inspection): threads per
    block, registers, spills, shared memory (ptxas's static figure and cuobjdump's, which
    includes what the system reserves per block), the blocks per SM that registers, threads and
    shared memory each allow, and the resident warps per SM that result. `threads`: {kernel:
    threads per block}; `sm`: lib.sass.HOPPER_SM unless given."""
    import math

    from lib.sass import HOPPER_SM
    sm = sm or HOPPER_SM
    max_warps = sm["threads"] // 32
    lines = ["| kernel | threads/block | registers/thread | spills (B) | static shared B (ptxas) "
             "| shared B per block (cuobjdump) | blocks/SM by registers / threads / shared "
             f"| resident warps/SM (of {max_warps}) |", "|---|---|---|---|---|---|---|---|"]
    for kname, tpb in threads.items():
        res, px = ins.resources[kname], ins.ptxas.get(kname, {})
        regs_per_block = math.ceil(res["REG"] * 32 / 256) * 256 * tpb // 32
        by_reg = sm["registers"] // regs_per_block
        by_thr = min(sm["threads"] // tpb, sm["blocks"])
        by_smem = sm["smem"] // max(res.get("SHARED", 0), 1)
        blocks = min(by_reg, by_thr, by_smem)
        lines.append(f"| `{kname}` | {tpb} | {res['REG']} | {px.get('spill_stores', 0) + px.get('spill_loads', 0)} "
                     f"| {px.get('static_smem_bytes', '—')} | {res.get('SHARED', 0)} | {by_reg} / {by_thr} / {by_smem} "
                     f"| {blocks * tpb // 32} |")
    _md("\n".join(lines))


def show_innermost_loops(sass: str, kernels) -> dict[str, list]:
    """Print each kernel's innermost loops (innermost_loops): addresses, instruction count and
    its six most frequent opcodes. Returns {kernel: its loops}."""
    out = {}
    for kname in kernels:
        loops = out[kname] = innermost_loops(sass, kname)
        print(f"{kname}: {len(loops)} innermost loop(s)" + (":" if loops else ""))
        for L in loops:
            top = ", ".join(f"{op} {n}" for op, n in L["mix"].most_common(6))
            print(f"  {L['start']:#06x}–{L['end']:#06x}: {sum(L['mix'].values())} instructions ({top})")
    return out


def print_skeleton(sass: str, ops=("LDG", "STS", "BAR", "LDSM", "HMMA", "STG")) -> None:
    """The memory, barrier and tensor-core instructions of a SASS listing in program order, a
    run of one opcode printed once with how many more follow: the shape of a loop at a glance."""
    pattern = r"\b(" + "|".join(ops) + r")\S*"
    skeleton = [_sass_clean(ln) for ln in sass.splitlines() if re.search(pattern, ln)]
    prev, run, first = None, 0, None
    for ln in skeleton + [None]:
        op = None if ln is None else re.search(pattern, ln).group(0)
        if op == prev:
            run += 1
            continue
        if prev is not None:
            print(f"    {first}" + (f"   ... and {run - 1} more {prev}" if run > 1 else ""))
        prev, run, first = op, 1, ln and ln.strip()


def ncu_durations_us(rep: dict | None, names=None) -> dict[str, float]:
    """{kernel: duration in µs} from a recorded ncu report (ncu_report, which gives Duration in
    µs; NaN for a unit it did not know), for the kernels named in `names` (every kernel: None)."""
    out = {}
    for k in (rep or {}).get("kernels", []):
        if (names is None or k["name"] in names) and "Duration" in k["metrics"]:
            val, unit = k["metrics"]["Duration"]
            out[k["name"]] = val if unit == "us" else float("nan")
    return out


def print_ncu_kernels(rep: dict | None, names=None) -> None:
    """One line per kernel of a recorded ncu report: DRAM, L2 and SM throughput, achieved and
    theoretical occupancy, and the shared-memory bank conflicts (conflict_text)."""
    if rep is None:
        return
    print("ncu, per kernel (recorded):")
    for k in rep["kernels"]:
        if names is None or k["name"] in names:
            m = k["metrics"]
            get = lambda key: f"{m[key][0]:,.3g}%" if key in m else "—"  # noqa: E731
            print(f"  {k['name']:18s} DRAM {get('DRAM Throughput')}, L2 {get('L2 Cache Throughput')}, "
                  f"SM {get('Compute (SM) Throughput')}, occupancy {get('Achieved Occupancy')} "
                  f"(theoretical {get('Theoretical Occupancy')}), shared-memory bank conflicts: loads "
                  f"{conflict_text(k, 'loads')}, stores {conflict_text(k, 'stores')}")


def show_shared_counters(rep: dict | None) -> None:
    """The raw shared-memory counters behind a recorded ncu report's bank-conflict figures, one
    row per kernel and access: requests (instructions; for loads, ldmatrix included, and how
    many of them were ldmatrix), wavefronts (the passes the shared-memory pipe made), bank
    conflicts (the extra passes), conflict-free wavefronts (wavefronts − conflicts), and the
    two ratios: the ways (wavefronts ÷ conflict-free wavefronts, 1 = none) and wavefronts per
    request (4 for a conflict-free ldmatrix.x4)."""
    if rep is None:
        return
    def num(x, spec=","):
        return "—" if x is None else format(x, spec)

    lines = ["| kernel | access | requests | of which ldmatrix | wavefronts | bank conflicts "
             "| conflict-free wavefronts | conflict ways | wavefronts per request | read from |",
             "|" + "---|" * 10]
    for k in rep["kernels"]:
        for kind in ("loads", "stores"):
            c = k["shared"].get(kind)
            if c is None:
                lines.append(f"| {k['name']} | {kind} | not measured |" + " — |" * 7)
                continue
            ldsm = num(k.get("ldsm")) if kind == "loads" else "—"
            ways = "—" if c["ways"] is None else f"{c['ways']:.2f}-way"
            lines.append(f"| {k['name']} | {kind} | {num(c['requests'])} | {ldsm} | {c['wavefronts']:,} "
                         f"| {c['conflicts']:,} | {c['wavefronts'] - c['conflicts']:,} | {ways} "
                         f"| {num(c['wavefronts_per_request'], '.2f')} | {c['source']} |")
    _md(f"*Recorded by Nsight Compute, not measured in this session* (`{rep['path']}`): the raw "
        "shared-memory counters of one call.\n\n" + "\n".join(lines))


def stage_constants(path: str, head_dim: int) -> dict:
    """The `constexpr int NAME = expr;` constants of a stage's .cu file (a path from the
    repository root), evaluated in order for HEAD_DIM = head_dim (integer division for /)."""
    env = {"HEAD_DIM": head_dim}
    for name, expr in re.findall(r"constexpr int (\w+) = ([^;]+);", (ROOT / path).read_text()):
        env[name] = eval(expr.replace("/", "//"), {}, dict(env))
    return env


def shared_declarations(path: str, head_dim: int, item: int = 2) -> dict[str, int]:
    """{name: bytes} of the `__shared__` declarations of a stage's .cu file at HEAD_DIM =
    head_dim, with elem_t `item` bytes; a declared `union Tiles` counts as its largest member."""
    import math
    text = (ROOT / path).read_text()
    env, size = stage_constants(path, head_dim), {"float": 4, "elem_t": item}
    count = lambda dims: math.prod(eval(d.replace("/", "//"), {}, dict(env))  # noqa: E731
                                   for d in re.findall(r"\[([^\]]+)\]", dims))
    arrays = lambda t: sum(size[ty] * count(dims) for ty, dims in  # noqa: E731
                           re.findall(r"(float|elem_t)\s+\w+((?:\[[^\]]+\])+)\s*;", t))
    union = re.search(r"union Tiles \{(.*?)\n\};", text, re.S)
    if union:
        size["Tiles"] = max(arrays(m) for m in re.findall(
            r"struct \{.*?\}\s*\w+;|(?:float|elem_t)\s+\w+(?:\[[^\]]+\])+;", union.group(1)))
    return {name: size[t] * count(dims) for t, name, dims in re.findall(
        r"__shared__(?:\s+__align__\(\d+\))?\s+(\w+)\s+(\w+)((?:\[[^\]]+\])*)\s*;", text)}


def kv_loop_steps(sass: str, names, copy_elements: int, block_k: int,
                  kernel: str = "attention_fused") -> dict:
    """What one warp issues per K/V tile in each step of a fused kernel's main loop, from its
    SASS. The loop over K/V tiles is the longest backward branch around the HMMAs; its barriers
    (BAR, one per step, len(names) of them) cut it into the steps, the first step starting at
    the loop's top. Each inner loop's body counts as often as it runs per tile: a copy loop
    (LDG) copy_elements ÷ its loads, a 2^x loop (MUFU) block_k ÷ its MUFUs, a max loop (FMNMX)
    block_k ÷ its FMNMXs; one of none of these is counted once, and said so.
    {step name: opcode Counter}."""
    import collections

    from lib.sass import backward_branches, listing
    instrs = listing(sass, kernel)
    hmma = [x["addr"] for x in instrs if x["op"] == "HMMA"]
    lo, hi = max((L for L in backward_branches(instrs) if any(L[0] <= h <= L[1] for h in hmma)),
                 key=lambda L: L[1] - L[0])
    body = [(x["addr"], x["op"]) for x in instrs if lo <= x["addr"] <= hi]
    bars = [a for a, op in body if op == "BAR"]
    assert len(bars) == len(names), f"expected the loop's {len(names)} barriers, found {len(bars)}"
    inner = [L for L in innermost_loops(sass, kernel) if lo <= L["start"] and L["end"] <= hi]

    def trip(L):
        if L["mix"]["LDG"]:
            return max(1, copy_elements // L["mix"]["LDG"])
        if L["mix"]["MUFU"]:
            return max(1, block_k // L["mix"]["MUFU"])
        if L["mix"]["FMNMX"]:
            return max(1, block_k // L["mix"]["FMNMX"])
        print(f"(a loop at {L['start']:#x} of unknown trip count is counted once)")
        return 1

    edges = [lo] + bars[1:] + [hi + 1]
    steps = {}
    for name, a, z in zip(names, edges[:-1], edges[1:]):
        mix = collections.Counter(op for x, op in body if a <= x < z)
        for L in inner:
            if a <= L["start"] < z:
                for op, n in L["mix"].items():
                    mix[op] += n * (trip(L) - 1)
        steps[name] = mix
    return steps


def show_step_table(steps: dict, title: str) -> None:
    """kv_loop_steps's counts as a table: per step the instructions, HMMA, LDG, shared loads
    (LDS + LDSM), STS, MUFU, BAR and the integer / address instructions."""
    lines = [title, "", "| step | instructions | HMMA | LDG | LDS + LDSM | STS | MUFU | BAR "
             "| integer / address |", "|---|---|---|---|---|---|---|---|---|"]
    for name, mix in steps.items():
        integer = next((n for c, n, _ in instruction_classes(mix) if c == "integer / address"), 0)
        lines.append(f"| {name} | {sum(mix.values())} | {mix['HMMA']} | {mix['LDG']} | "
                     f"{mix['LDS'] + mix['LDSM']} | {mix['STS']} | {mix['MUFU']} | {mix['BAR']} | "
                     f"{integer} |")
    _md("\n".join(lines))


def print_occupancy_vs_profile(kernel: dict, predicted_pct: float, max_warps: int = 64) -> None:
    """What a recorded ncu kernel (of ncu_report) says about occupancy and issue, next to the
    occupancy predicted from registers and shared memory: theoretical occupancy, achieved
    occupancy as warps per scheduler and the share of cycles a scheduler can issue on (warps ÷
    warp cycles per issued instruction), each unit's throughput and the bank conflicts."""
    m = lambda name: kernel["metrics"].get(name, (None, ""))[0]  # noqa: E731
    theo, ach, cpi = (m("Theoretical Occupancy"), m("Achieved Occupancy"),
                      m("Warp Cycles Per Issued Instruction"))
    if theo is not None:
        print(f"theoretical occupancy: ncu {theo:.1f}%, predicted from registers and shared "
              f"memory in section 6 {predicted_pct:.1f}%")
    if ach is not None and cpi:
        per_sched = ach / 100 * max_warps / 4
        print(f"achieved occupancy {ach:.1f}% = {per_sched:.1f} warps per scheduler; each waits "
              f"{cpi:.1f} cycles per instruction -> a scheduler issues on about "
              f"{100 * min(1, per_sched / cpi):.0f}% of cycles")
    for unit in ("Compute (SM) Throughput", "L1/TEX Cache Throughput", "L2 Cache Throughput",
                 "DRAM Throughput"):
        if m(unit) is not None:
            print(f"{unit:26s} {m(unit):5.1f}% of peak")
    print(f"shared-memory bank conflicts (wavefronts ÷ conflict-free wavefronts): loads "
          f"{conflict_text(kernel, 'loads')}, stores {conflict_text(kernel, 'stores')}")
