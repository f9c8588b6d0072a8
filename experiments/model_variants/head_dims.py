"""Head dims 96 and 256 in stage 6 (issue 51 item 1): the candidate tiles compiled offline (NVRTC +
ptxas, no GPU) and ptxas's report read: registers, spills, and whether it serialized wgmma
(warnings C75xx). Writes the tables of experiments/model_variants/head_dims.md. CPU only.

    python3 experiments/model_variants/head_dims.py [--launcher]

The candidates follow a rule (head_dims.md): at D256 a consumer thread holds O (D/2 = 128 fp32), a
key tile's S (BLOCK_N/2) and its P (BLOCK_N/4 registers of 16-bit pairs) at once (the overlap
issues the next S while P·V runs), so BLOCK_N = 64 (176 + ~40 of addresses and row state within
the 240 a consumer gets with one or two consumers; three consumers get 160, less than O alone);
shared memory takes 512 B per row of Q, K or V, so two consumers (64 KB of Q) leave room for two
64-key stages, one consumer for three. Each candidate is compiled anyway, also the ones the rule
rejects, to check the rule against ptxas. --launcher: also every build the launcher's rules pick at
D96 and D256 (variant_builds.py's shapes, with and without SEQS, with each model variant)."""
import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import stages.stage6 as s6  # noqa: E402
from lib import nvrtc  # noqa: E402

SERIALIZING = re.compile(r"C75(08|10|11|12|15)|wgmma.*serializ", re.I)
DTYPES = (torch.float16, torch.bfloat16)
OVERLAP, ONE = "+ intra-warpgroup overlap", s6.DECODE_SCHEDULE  # two or more consumers; one


def candidates():
    """(D, tiles, schedule, extra defines, note) to compile."""
    out = []
    for tiles in [(64, 2, 2), (64, 2, 1), (64, 3, 1), (128, 2, 1), (128, 1, 2), (64, 1, 3)]:
        sched = OVERLAP if tiles[2] > 1 else ONE
        out.append((256, tiles, sched, (), "prefill" if tiles[2] > 1 else "one consumer"))
    out.append((256, (64, 2, 2), ONE, (), "without ping-pong"))
    out.append((256, (64, 2, 2), "+ persistent blocks", (), "persistent"))
    for tiles in [(176, 2, 2), (128, 3, 2), (128, 3, 1), (128, 2, 3)]:
        sched = OVERLAP if tiles[2] > 1 else ONE
        out.append((96, tiles, sched, (), "P·V over 128 (padded)"))
        out.append((96, tiles, sched, (("PV_N", 96),), "P·V over 96 (m64n96k16)"))
    return out


def usage(b):
    try:
        c = b.compile()
    except Exception as e:  # ptxas refuses (e.g. C7602, too few registers for a wgmma's operands)
        m = re.search(r"\(C\d+\)[^\n]*", str(e))
        return {"error": m.group(0)[:60] if m else str(e).splitlines()[0][:60]}
    u = c.resource_usage()["attention_wgmma"]
    return dict(u, serialized=bool(SERIALIZING.search(c.log)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launcher", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for D, tiles, sched, extra, note in candidates():
        try:
            cfg = s6.config(D, tiles, sched)
        except ValueError as e:
            rows.append((D, tiles, sched, extra, note, None, str(e).split(";")[0]))
            continue
        defines = tuple(cfg["defines"]) + extra
        rows.append((D, tiles, sched, extra, note, [nvrtc.Build(s6.SOURCE, s6.ARCH, dt, D, defines) for dt in DTYPES],
                     f"{cfg['smem'] / 1024:.1f} KB"))
    nvrtc.compile_many([b for r in rows if r[5] for b in r[5]])
    print("| D | tiles (BLOCK_N, STAGES, CONSUMERS) | schedule | build | smem | fp16 regs, spills (B), serialized | bf16 | kept |")
    print("|---|---|---|---|---|---|---|---|")
    for D, tiles, sched, extra, note, builds, smem in rows:
        if builds is None:
            print(f"| {D} | {tiles} | {sched} | {note} | does not fit ({smem}) | — | — | no |")
            continue
        cells, ok = [], True
        for b in builds:
            u = usage(b)
            if "error" in u:
                ok = False
                cells.append(f"ptxas fails: {u['error']}")
                continue
            bad = u["spill_stores"] or u["spill_loads"] or u["serialized"]
            ok = ok and not bad
            cells.append(f"{u['registers']}, {u['spill_stores']}/{u['spill_loads']}" + (", SERIALIZED" if u["serialized"] else ""))
        print(f"| {D} | {tiles} | {sched} | {note} | {smem} | {cells[0]} | {cells[1]} | {'yes' if ok else 'no'} |")
    if a.launcher:
        from variant_builds import builds_of, label, variant_sets
        plan = {}
        for D in (96, 256):
            for dt in DTYPES:
                for seqs in (False, True):
                    for vname, var in variant_sets(dt).items():
                        for defines in builds_of(D, dt, var, seqs):
                            plan.setdefault((D, str(dt)[6:], defines), vname)
        builds = {k: nvrtc.Build(s6.SOURCE, s6.ARCH, getattr(torch, k[1]), k[0], k[2]) for k in plan}
        nvrtc.compile_many(list(builds.values()))
        print("\n| D | dtype | launcher build | variant | ptxas registers | spills (B) | serialized |")
        print("|---|---|---|---|---|---|---|")
        for (D, dt, defines), vname in sorted(plan.items(), key=lambda x: repr(x[0])):
            u = usage(builds[(D, dt, defines)])
            if "error" in u:
                print(f"| {D} | {dt} | {defines} | {vname} | ptxas fails: {u['error']} | | |")
                continue
            base = tuple((k, v) for k, v in defines if k not in ("SOFTCAP", "WINDOW", "SINKS"))
            print(f"| {D} | {dt} | {label(base)} | {vname} | {u['registers']} | {u['spill_stores']}/{u['spill_loads']} | "
                  f"{'yes' if u['serialized'] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
