"""Stage 7's consumers taking turns at the exponential unit: does it feed MUFU better at D 64?

Why ask: at D 64 the FP8 kernel is bound by its exponentials (16 per SM per clock,
experiments/mufu_half_rates/mufu_half_rates.py), yet the unit is busy only about two thirds of the time (the
notebook's section 9) while 36% of the stall samples wait on it. That is the signature of
consumers in step: the three warpgroups of a block wait on the same K/V tiles, reach their
exponentials together, share the unit for a while, then all go to their row maxima, casts and
products at once and leave it idle. Taking turns breaks the step: consumer c starts its tile's
exponentials once consumer c − 1 has finished its own (stage 6's named-barrier turns, PINGPONG=2),
and does its max, casts and products while the others' exponentials run. Predicted per key tile
and SM sub-partition: 3 × 512 clocks of exponentials back to back, plus the turns' barriers,
against about 2,360 now (the profile's 65-68% busy), if each consumer's other work fits in the
1,024 clocks of the others' turns.

Variants, each against the build as called (the work queue without turns), on the same e4m3
inputs in interleaved rounds, with stage 6 (bf16) beside them for issue 25's ratio:
  softmax turns   the whole softmax (masks, row max, exponentials) in the turn: stage 6's
                  PINGPONG=2 on the work queue (a schedule registered here, not in stage 6)
  exp turns       only the exponentials (and P's casts) in the turn: the same build with the
                  turn taken in softmax_tile after the row maxima and given in to_operand once P
                  is cast (stages/stage7.cu edited in memory; the file is untouched)
Each variant's output must equal the default's bit for bit (the turns change no arithmetic).

    python experiments/fp8_exp_turns/fp8_exp_turns_ab.py [--budget-s 0.5] [--out ab.json]
"""
import argparse
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

SHAPES = [(16, 16, 2048, 64), (4, 16, 8192, 128)]
QUEUE = stage6.ALL_SCHEDULES[stage7.PERSISTENT_SCHEDULE]
SCHEDULES = {"softmax turns": dict(QUEUE, PINGPONG=2),
             "exp turns": dict(QUEUE, PINGPONG=2, EXP_TURNS=1)}

# The exp-turns source: softmax_begin/end take no turn. softmax_tile takes it just before its 2^x
# loop, and to_operand gives it once P is cast. ptxas moves arithmetic across a bar.sync freely
# (the barrier orders memory, not registers), so the turn is tied to the data: the barrier's id
# carries (row maxima bits & z) and the exponents' base adds (clock bits & z), read after the
# barrier; the end's id carries (P's bits & z). z = %dynamic_smem_size >> 24 is 0 at run time
# (no block has 16 MB of shared memory) and unknown to the compiler.
_HELPERS = r"""
__device__ __forceinline__ unsigned turn_zero() {
    unsigned z;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(z));
    return z >> 24;
}
"""
_EDITS = [
    ("template <bool MASK>\n__device__ __forceinline__ void softmax_tile(",
     _HELPERS + "template <bool MASK>\n__device__ __forceinline__ void softmax_tile("),
    ("#pragma unroll\n    for (int n = 0; n < BLOCK_N / 8; ++n)\n#pragma unroll\n        for (int e = 0; e < 4; ++e) {\n"
     "            const float x = fmaf(s[4 * n + e], scale_log2, -base[e >> 1]);",
     "    if (PINGPONG == 2) {\n"
     "        const unsigned z = turn_zero(), c = threadIdx.x / 128 - WARP_SPECIALIZED;\n"
     "        named_bar_sync(TURN_BAR + c + ((__float_as_uint(base[0]) ^ __float_as_uint(base[1])) & z), 256);\n"
     "        unsigned t;\n"
     "        asm volatile(\"mov.u32 %0, %%clock;\" : \"=r\"(t));\n"
     "        base[0] += __uint_as_float(t & z), base[1] += __uint_as_float(t & z);\n"
     "    }\n"
     "#pragma unroll\n    for (int n = 0; n < BLOCK_N / 8; ++n)\n#pragma unroll\n        for (int e = 0; e < 4; ++e) {\n"
     "            const float x = fmaf(s[4 * n + e], scale_log2, -base[e >> 1]);"),
    ("            p[t][r] = to_e4m3x2(s[j0], s[j0 + 1]) | (to_e4m3x2(s[j0 + 4], s[j0 + 5]) << 16);\n        }\n",
     "            p[t][r] = to_e4m3x2(s[j0], s[j0 + 1]) | (to_e4m3x2(s[j0 + 4], s[j0 + 5]) << 16);\n        }\n"
     "    if (PINGPONG == 2) {\n"
     "        unsigned x = 0;\n"
     "#pragma unroll\n"
     "        for (int t = 0; t < BLOCK_N / 32; ++t) x ^= p[t][0] ^ p[t][1] ^ p[t][2] ^ p[t][3];\n"
     "        const unsigned c = threadIdx.x / 128 - WARP_SPECIALIZED;\n"
     "        named_bar_arrive(TURN_BAR + (c + 1) % CONSUMERS + (x & turn_zero()), 256);\n"
     "    }\n"),
    ("__device__ __forceinline__ void softmax_begin(int c) {\n    if (PINGPONG == 2) take_turn(c);",
     "__device__ __forceinline__ void softmax_begin(int c) {\n    if (0) take_turn(c);"),
    ("__device__ __forceinline__ void softmax_end(int c) {\n    if (PINGPONG == 2) give_turn(c);",
     "__device__ __forceinline__ void softmax_end(int c) {\n    if (0) give_turn(c);"),
]


def exp_turns_source() -> str:
    src = Path(stage7.SOURCE).read_text()
    for old, new in _EDITS:
        if src.count(old) != 1:
            raise SystemExit(f"stages/stage7.cu changed: {old[:60]!r} found {src.count(old)} times; update this script")
        src = src.replace(old, new)
    return src


def install_variants():
    """Register the schedules with stage 6's table (stage7.config reads it) and route builds with
    EXP_TURNS to the edited source."""
    stage6.ALL_SCHEDULES.update(SCHEDULES)
    plain = stage7._kernel

    def kernel(out_dtype, D, defines, smem):
        if not dict(defines).get("EXP_TURNS"):
            return plain(out_dtype, D, defines, smem)
        compiled = nvrtc.compile_cuda(exp_turns_source(), arch=stage7.ARCH, name="stage7_exp_turns.cu",
                                      defines={**nvrtc.ELEMENT_DEFINES[out_dtype], "HEAD_DIM": D, **dict(defines)})
        combine = nvrtc.load_kernel(compiled, "attention_fp8_combine_tail") if dict(defines)["TAIL_SPLIT"] else None
        return nvrtc.load_kernel(compiled, "attention_fp8", max_dynamic_smem=smem), combine

    cache = {}
    stage7._kernel = lambda *a: cache[a] if a in cache else cache.setdefault(a, kernel(*a))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=0.5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    install_variants()
    rows, ok = [], True
    for B, H, S, D in SHAPES:
        for causal in (False, True):
            q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
            q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
            vt = fp8.v_for_pv(v8)
            code = causal_mode(causal, S, S, stage7.INFO)
            run = lambda schedule=None: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code,  # noqa: E731
                                                       scale=D ** -0.5, schedule=schedule)
            ref = run()
            same = {}
            for name in SCHEDULES:
                out = run(name)
                same[name] = bool(torch.equal(out, ref))
                if not same[name]:
                    ok = False
                    print(f"  {name}: output differs from the default's, max {(out.float() - ref.float()).abs().max():.3g}")
            fns = {"default": run, **{name: (lambda n=name: run(n)) for name in SCHEDULES},
                   "stage 6": lambda: stage6.attention(q, k, v, causal=causal)}
            t = time_interleaved(fns, budget_s=a.budget_s)
            us = {n: x.median_us for n, x in t.items()}
            flops = attention_flops(B, H, S, S, D, causal)
            row = {"B": B, "H": H, "S": S, "D": D, "causal": causal, "us": us,
                   "round_medians_us": {n: x.round_medians_us for n, x in t.items()}, "same_bits": same}
            rows.append(row)
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: "
                  + "; ".join(f"{n} {us[n]:,.1f} µs ({flops / us[n] / 1e6:.0f} TFLOPS, "
                              f"{us['default'] / us[n]:.3f}× default, {us['stage 6'] / us[n]:.3f}× stage 6)"
                              for n in fns if n != "stage 6")
                  + f"; same bits: {same}", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"rows": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
