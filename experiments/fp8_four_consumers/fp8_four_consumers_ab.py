"""Stage 7 at D 64 with four consumer warpgroups on 64-key tiles, against today's three on 128:
a fourth warp per scheduler to feed the exponential unit, bought with smaller tiles.

Why: at D 64 the kernel is bound by its exponentials and the unit is about two thirds busy with
0.85 warps eligible per scheduler (the notebook's section 9), so one more warp per scheduler is
the obvious step. With 128-key tiles it has no registers (experiments/fp8_four_consumers/fp8_consumers_offline.py: 120
a thread for four consumers, 137-144 needed). A 64-key tile halves S (32 registers) and P (8):
offline, four consumers with 112 registers each (the producer keeps 32, as with three) compile
with no spill and no serialized wgmma, with or without ROW_SUM_MMA. The price: twice the tiles
per row, so twice the per-tile work that does not scale with the keys (the row max's shuffles,
alpha's exponentials, the ring's barriers, the wgmma issues): predicted to cost a few percent of
what the fourth warp gains, if the unit's idle third is a matter of too few warps.

The kernel limits itself to three consumers and 128-224 keys; this script edits those asserts
and the setmaxnreg split in memory (stages/stage7.cu is untouched) and adds the tiles to
stage7.CHOICES for this process. Each variant is checked against lib.fp8's emulation (its own
64-key tiles) at the timed shapes and at odd ones before it is timed.

    python experiments/fp8_four_consumers/fp8_four_consumers_ab.py [--budget-s 0.5] [--out ab.json]
"""
import argparse
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402

from lib import fp8, nvrtc  # noqa: E402
from lib.inputs import causal_mode, make_qkv  # noqa: E402
from lib.reference import attention_flops  # noqa: E402
from lib.timing import time_interleaved  # noqa: E402
from stages import stage6, stage7  # noqa: E402

# The lines of stages/stage7.cu that limit the consumers and split the registers: the ones
# experiments/fp8_four_consumers/fp8_consumers_offline.py edits too.
_spec = importlib.util.spec_from_file_location("fp8_consumers_offline", Path(__file__).with_name("fp8_consumers_offline.py"))
_offline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_offline)
LIMIT, PRODUCER, CONSUMER = _offline.LIMIT, _offline.PRODUCER, _offline.CONSUMER
KEYS = "static_assert(BLOCK_N == 128 || BLOCK_N == 160 || BLOCK_N == 192 || BLOCK_N == 224,"
# (name, tiles, ROW_SUM_MMA)
VARIANTS = [("4 x 64 keys, 4 stages", (64, 4, 4), False),
            ("4 x 64 keys, 6 stages", (64, 6, 4), False),
            ("4 x 64 keys, 4 stages, row sums by P·V", (64, 4, 4), True)]
SHAPES = [(16, 16, 2048, 64)]
ODD = [(2, 3, 1000, 64, True), (1, 4, 333, 64, False), (3, 2, 65, 64, True)]  # (B, H, S, D, causal)


def four_consumer_source() -> str:
    """stage7.cu with four consumers and 64-key tiles allowed (no ping-pong: the turn barriers
    4-6 would meet consumer 3's own barrier 4) and setmaxnreg 32/112 for four consumers: the
    640 threads start with 96 registers each (65,536 / 640, in steps of 8), and the split may
    hand out no more than that, 128·32 + 512·112 = 61,440 — three-consumer and wider builds keep
    theirs."""
    src = Path(stage7.SOURCE).read_text()
    for line in (LIMIT, KEYS, PRODUCER, CONSUMER):
        if src.count(line) != 1:
            raise SystemExit(f"stages/stage7.cu changed: {line[:60]!r} not found once; update this script")
    return (src.replace(LIMIT, 'static_assert(CONSUMERS <= 3 || (CONSUMERS == 4 && !PINGPONG), "barriers");')
            .replace(KEYS, "static_assert(BLOCK_N == 64 || BLOCK_N == 128 || BLOCK_N == 160 || BLOCK_N == 192 || BLOCK_N == 224,")
            .replace(PRODUCER, "constexpr int PRODUCER_REGS = CONSUMERS == 4 ? 32 : V_IN_KERNEL ? 64 : CONSUMERS == 3 ? 32 : DYNAMIC_WORK ? 40 : 24;")
            .replace(CONSUMER, CONSUMER.replace("constexpr int CONSUMER_REGS = ",
                                                "constexpr int CONSUMER_REGS = CONSUMERS == 4 ? 112 : ")))


def install():
    """The variants' tiles allowed in stage7.config, and their builds compiled from the edited source."""
    stage7.CHOICES.extend(t for _, t, _ in VARIANTS if t not in stage7.CHOICES)
    plain = stage7._kernel
    cache = {}

    def kernel(out_dtype, D, defines, smem):
        key = (out_dtype, D, defines, smem)
        d = dict(defines)
        if d["CONSUMERS"] != 4 and d["BLOCK_N"] != 64:
            return plain(*key)
        if key not in cache:
            compiled = nvrtc.compile_cuda(four_consumer_source(), arch=stage7.ARCH, name="stage7_four_consumers.cu",
                                          defines={**nvrtc.ELEMENT_DEFINES[out_dtype], "HEAD_DIM": D, **d})
            u = compiled.resource_usage()["attention_fp8"]
            if u["spill_stores"] or "C7512" in compiled.log:
                raise SystemExit(f"{d}: spills {u['spill_stores']} B or serialized wgmma: not this experiment")
            combine = nvrtc.load_kernel(compiled, "attention_fp8_combine_tail") if d["TAIL_SPLIT"] else None
            cache[key] = nvrtc.load_kernel(compiled, "attention_fp8", max_dynamic_smem=smem), combine
        return cache[key]

    stage7._kernel = kernel


def run(inputs, S, D, causal, tiles=None, row_sum_mma=None):
    q8, k8, vt, qd, kd, vd = inputs
    # the variants always on the work queue without ping-pong (four consumers take no turns)
    return stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=causal_mode(causal, S, S, stage7.INFO),
                          scale=D ** -0.5, tiles=tiles, row_sum_mma=row_sum_mma,
                          schedule=None if tiles is None else stage7.PERSISTENT_SCHEDULE)


def check(B, H, S, D, causal, tiles, row_sum_mma) -> dict:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
    out = run((q8, k8, fp8.v_for_pv(v8), qd, kd, vd), S, D, causal, tiles, row_sum_mma)
    c = fp8.check_on_emulation(out, q8, k8, v8, qd, kd, vd, causal=causal, key_tile=tiles[0],
                               sum_rounded=bool(row_sum_mma))
    return {k: c[k] for k in ("passed", "worst", "rmse_ratio")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=0.5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    install()
    ok, rows = True, []
    checks = {}
    for name, tiles, rs in VARIANTS:
        for B, H, S, D, causal in ODD + [(b, h, s, d, c) for b, h, s, d in SHAPES for c in (False, True)]:
            r = check(B, H, S, D, causal, tiles, rs)
            checks[f"{name}: B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}"] = r
            ok &= r["passed"]
            print(f"check {name}, B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: worst {r['worst']:.2f} of its "
                  f"bound, RMSE {r['rmse_ratio']:.2f} of its allowance: {'pass' if r['passed'] else 'FAIL'}", flush=True)
    if not ok:
        print("a variant failed its check against the emulation: not timed")
        return 1
    for B, H, S, D in SHAPES:
        for causal in (False, True):
            q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
            q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
            inputs = (q8, k8, fp8.v_for_pv(v8), qd, kd, vd)
            fns = {"default": lambda: run(inputs, S, D, causal),
                   **{name: (lambda t=tiles, r=rs: run(inputs, S, D, causal, t, r)) for name, tiles, rs in VARIANTS},
                   "stage 6": lambda: stage6.attention(q, k, v, causal=causal)}
            t = time_interleaved(fns, budget_s=a.budget_s)
            us = {n: x.median_us for n, x in t.items()}
            flops = attention_flops(B, H, S, S, D, causal)
            rows.append({"B": B, "H": H, "S": S, "D": D, "causal": causal, "us": us,
                         "round_medians_us": {n: x.round_medians_us for n, x in t.items()}})
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: "
                  + "; ".join(f"{n} {us[n]:,.1f} µs ({flops / us[n] / 1e6:.0f} TFLOPS, {us['default'] / us[n]:.3f}× "
                              f"default, {us['stage 6'] / us[n]:.3f}× stage 6)" for n in fns if n != "stage 6"), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"checks": checks, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
