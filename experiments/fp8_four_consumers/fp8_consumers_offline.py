"""Stage 7 at D64 with four consumer warpgroups instead of three, compiled offline (no GPU): does
it fit the register file? Prints ptxas's registers, spills and wgmma warnings for each build.

Why ask: at D64 three consumers ran 1.30x two with the same 128-key tiles, and 1.15-1.21x the
two-consumer builds of 160 and 192 keys (scripts/fp8_tiles.py, the record's `fp8_tiles`), and the profile of the default build has 0.85 warps eligible per scheduler, so a
fourth warp per scheduler is the obvious next step toward issue 25's 1.3x. The register file
decides first: 65,536 registers for 640 threads, the producer's 128 keeping 24 (or 40 with the
work queue), leaves 120 (112) per consumer thread after setmaxnreg, against the 160 three
consumers get now. A consumer holds S (64 of fp32 for a 128-key tile), O (32, 36 with
ROW_SUM_MMA's extra column), P in e4m3 (16), plus addresses and row state; the intra-warpgroup
overlap keeps P of one tile and S of the next alive together. Predicted: it spills. The script also compiles today's three-consumer build with fewer
registers per consumer, to show how many it needs.

The kernel allows at most three consumers (named barriers); this script lifts that assert and
sets the register split in the source it compiles (the file in stages/ is untouched), with the
D64 default's other switches (stage7.config).

    python experiments/fp8_four_consumers/fp8_consumers_offline.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

from lib import nvrtc  # noqa: E402
from stages import stage7 as s7  # noqa: E402

LIMIT = 'static_assert(CONSUMERS <= 3, "named barriers 1-3 and 4-6 are the consumers\' own");'
PRODUCER = "constexpr int PRODUCER_REGS = V_IN_KERNEL ? 64 : CONSUMERS == 3 ? 32 : DYNAMIC_WORK ? 40 : 24;"
CONSUMER = ("constexpr int CONSUMER_REGS = V_IN_KERNEL ? (CONSUMERS == 3 ? 144 : 216) : CONSUMERS == 3 ? 160 "
            ": DYNAMIC_WORK ? 232 : 240;")


def source_with_regs(producer_regs: int, consumer_regs: int, consumers: int = 4) -> str:
    """stage7.cu with up to four consumers allowed and the given setmaxnreg split."""
    src = Path(s7.SOURCE).read_text()
    for line in (LIMIT, PRODUCER, CONSUMER):
        if line not in src:
            raise SystemExit(f"stages/stage7.cu changed: no line {line!r}; update this script")
    if 128 * producer_regs + 128 * consumers * consumer_regs > 65536:
        raise ValueError(f"{producer_regs}/{consumer_regs} registers for {consumers} consumers: more than an SM has")
    return (src.replace(LIMIT, "static_assert(!PINGPONG || CONSUMERS <= 3, \"named barriers\");")
            .replace(PRODUCER, f"constexpr int PRODUCER_REGS = {producer_regs};")
            .replace(CONSUMER, f"constexpr int CONSUMER_REGS = {consumer_regs};"))


def usage(compiled) -> str:
    u = compiled.resource_usage()["attention_fp8"]
    serial = "wgmma serialized (C7512)" if "C7512" in compiled.log else "wgmma not serialized"
    return (f"{u['registers']} registers at entry, {u['spill_stores']} B spilled / {u['spill_loads']} B "
            f"reloaded, {u['stack_bytes']} B stack; {serial}")


def main():
    base = dict(s7.config(64, s7.TILES[64], "work queue without ping-pong")["defines"])
    elem = {**nvrtc.ELEMENT_DEFINES[torch.bfloat16], "HEAD_DIM": 64}
    print(f"D64 default, {base['CONSUMERS']} consumers, tiles {s7.TILES[64]}: "
          + usage(nvrtc.compile_stage(s7.SOURCE, arch=s7.ARCH, dtype=torch.bfloat16, head_dim=64, defines=base)))
    # How many a consumer of today's three needs: the default build with fewer after setmaxnreg.
    for consumer_regs in (152, 144, 136, 128, 120):
        c = nvrtc.compile_cuda(source_with_regs(32, consumer_regs, 3), arch=s7.ARCH, name="stage7.cu",
                               defines={**elem, **base})
        print(f"3 consumers, setmaxnreg 32/{consumer_regs}: {usage(c)}", flush=True)
    for producer_regs, consumer_regs in ((24, 120), (40, 112)):
        src = source_with_regs(producer_regs, consumer_regs)
        for row_sums in (1, 0):
            for q_stages in (1, 2):
                d = {**base, "CONSUMERS": 4, "ROW_SUM_MMA": row_sums, "Q_STAGES": q_stages}
                c = nvrtc.compile_cuda(src, arch=s7.ARCH, name="stage7.cu", defines={**elem, **d})
                print(f"4 consumers, setmaxnreg {producer_regs}/{consumer_regs}, ROW_SUM_MMA={row_sums}, "
                      f"Q_STAGES={q_stages}: {usage(c)}", flush=True)


if __name__ == "__main__":
    main()
