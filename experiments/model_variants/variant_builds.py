"""Which stage-6 builds the launcher runs (its rules, stages/stage6.py: choose and config, at a
grid of call shapes on 132 SMs), and what each model variant (issue 51: softcap, window, sinks)
does to their registers and spills (and whether ptxas serializes wgmma): every build compiled offline (NVRTC + ptxas, no GPU) with
and without each variant, ptxas's report read. CPU only.

    python3 experiments/model_variants/variant_builds.py [--dtype float16|bfloat16|both] [--markdown]

A call's variants change its build's defines (SOFTCAP, WINDOW, SINKS), and sinks change its plan
(never split), so the builds are enumerated per variant set, as _make_plan makes them."""
import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import nvrtc  # noqa: E402
from stages.stage6_variants import NONE, Variants, softcap_build  # noqa: E402

SMS = 132
# ptxas says so when it serializes wgmma (tests/test_stage6.py's pattern)
SERIALIZING = re.compile(r"C75(08|10|11|12|15)|wgmma.*serializ", re.I)
# (B, H, Hk, Sq, Sk): latency, long prefill, short prompts (persistent launches, the queue),
# decoding (packed, split, two blocks per SM, blocks without a producer), speculative decoding
SHAPES = [(1, 8, 8, 512, 512), (16, 16, 16, 2048, 2048), (4, 16, 16, 8192, 8192), (32, 16, 16, 512, 512),
          (16, 16, 16, 1024, 1024), (8, 32, 8, 2048, 2048), (1, 32, 8, 1, 4096), (64, 32, 8, 1, 1024),
          (8, 8, 1, 1, 1024), (1, 8, 1, 1, 32768), (1, 32, 8, 4, 8192), (1, 8, 1, 16, 4096)]
CAUSALS = (0, 1, 2)


COLUMNS = ["none", "softcap 1 (approx)", "softcap 2 (exp2)", "window", "sinks", "all three"]


def variant_sets(dtype):
    """The columns: each variant alone (both tanh forms of the softcap), and all three with the
    softcap's form the rule gives this dtype (stages/stage6_variants.py: SOFTCAP_TANH)."""
    return {"none": NONE, "softcap 1 (approx)": Variants(softcap=30.0, softcap_build=1),
            "softcap 2 (exp2)": Variants(softcap=30.0, softcap_build=2),
            "window": Variants(window=(4095, 0)), "sinks": Variants(sinks=True),
            "all three": Variants(softcap=30.0, window=(4095, 0), sinks=True, softcap_build=softcap_build(dtype))}


def builds_of(D, dtype, variants, seqs=False):
    """{defines: [call shapes]} of the builds the launcher's rules pick with these variants."""
    out = {}
    for B, H, Hk, Sq, Sk in SHAPES:
        for causal in CAUSALS:
            mode = causal if Sq > 1 else (0 if causal == 2 else causal)
            try:
                ch = s6.choose(B, H, Hk, Sq, Sk, D, mode, SMS, variants=variants)
            except (ValueError, NotImplementedError):
                continue
            cfg = s6.config(D, ch["tiles"], ch["schedule"], False, None, None, ch["pack_gqa"], seqs, ch["q_stages"],
                            None, None, None, ch["blocks_per_sm"], None, softcap=variants.softcap_build,
                            window=variants.window is not None, sinks=variants.sinks)
            out.setdefault(cfg["defines"], []).append((B, H, Hk, Sq, Sk, causal))
    return out


def label(defines):
    d = dict(defines)
    sched = next((n for n, sw in s6.ALL_SCHEDULES.items()
                  if all(d.get(k) == v for k, v in sw.items() if k != "PERSISTENT")), "?")
    return (f"tiles ({d['BLOCK_N']},{d['STAGES']},{d['CONSUMERS']}) {sched}"
            + (" packed" if d["PACK_GQA"] else "") + (f" {d['BLOCKS_PER_SM']}/SM" if d["BLOCKS_PER_SM"] > 1 else "")
            + f" Q{d['Q_STAGES']}" + (" tma-store" if d["O_TMA_STORE"] else "") + (" carry" if d["CARRY_PV"] else "")
            + (" seqs" if d["SEQS"] else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=("float16", "bfloat16", "both"), default="both")
    ap.add_argument("--markdown", action="store_true", help="a table per head dim and dtype")
    a = ap.parse_args(argv)
    dtypes = [torch.float16, torch.bfloat16] if a.dtype == "both" else [getattr(torch, a.dtype)]
    plan = []  # (D, dtype, base label, variant name, defines)
    for D in (64, 128):
        for dtype in dtypes:
            for seqs in (False, True):
                for vname, var in variant_sets(dtype).items():
                    for defines in builds_of(D, dtype, var, seqs):
                        base = tuple((k, v) for k, v in defines if k not in ("SOFTCAP", "WINDOW", "SINKS"))
                        plan.append((D, dtype, base, vname, defines))
    builds = [nvrtc.Build(s6.SOURCE, s6.ARCH, dtype, D, defines) for D, dtype, _, _, defines in plan]
    n, failed = nvrtc.compile_many(builds)
    if failed:
        for b, e in failed:
            print(f"FAILED {b}: {e}", file=sys.stderr)
        return 1
    table = {}
    for (D, dtype, base, vname, defines), b in zip(plan, builds):
        c = b.compile()
        u = dict(c.resource_usage()["attention_wgmma"], serialized=bool(SERIALIZING.search(c.log)))
        table.setdefault((D, str(dtype)[6:], label(base)), {})[vname] = u
    names = COLUMNS
    if a.markdown:
        print("| build | tiles, schedule, launch | " + " | ".join(names) + " |")
        print("|---|---|" + "---|" * len(names))
    for (D, dt, lab), row in sorted(table.items()):
        cells = []
        for v in names:
            u = row.get(v)
            cells.append("—" if u is None else (f"spills {u['spill_stores']}/{u['spill_loads']} B" if u["spill_stores"] or u["spill_loads"]
                                                else "no spill") + (" SERIALIZED" if u and u["serialized"] else ""))
        if a.markdown:
            print(f"| D{D} {dt} | {lab} | " + " | ".join(cells) + " |")
        else:
            print(f"D{D} {dt:8s} {lab:60s} " + "  ".join(f"{v}: {c}" for v, c in zip(names, cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
