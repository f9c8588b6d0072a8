"""How fast the special-function unit takes 2^x in half precision, against float32: does
`ex2.approx.f16x2` give two exponentials for the price of one?

Why ask: at D 64 stage 7 is bound by its exponentials (the notebook's section 2: 16 MUFU.EX2
per SM per clock against the FP8 tensor cores' 8,192 FLOP, and the unit 68% busy in the
profile of section 9). P goes to e4m3, 3 mantissa bits, so a half-precision 2^x (10 bits) would
be accurate enough; if the unit ran two of them per slot, that would be the lever the D 64
target lacks. Offline, the answer starts in the SASS (`--offline`, no GPU): how many MUFU
instructions each form compiles to. On the GPU the script times each form's throughput:
every thread runs CHAINS independent chains x <- 2^(-x) (values stay in (0, 1]), in
SMs × BLOCKS_PER_SM blocks of THREADS, and the exponentials per SM per clock come from each SM's
own clock64() (from its first block's start to its last block's end), so the GPU's clock (power
limit, boost) drops out.

    python experiments/mufu_half_rates/mufu_half_rates.py --offline   # MUFU instructions per exponential (CPU)
    python experiments/mufu_half_rates/mufu_half_rates.py             # and the measured rates (GPU)
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from lib import nvrtc  # noqa: E402

THREADS, BLOCKS_PER_SM, CHAINS = 128, 8, 16
# (name, PTX form, exponentials per instruction)
FORMS = [("f32", "ex2.approx.ftz.f32", 1), ("f16x1", "ex2.approx.f16", 1),
         ("f16x2", "ex2.approx.f16x2", 2), ("bf16x2", "ex2.approx.ftz.bf16x2", 2)]

SOURCE = r"""
// One kernel per form: CHAINS chains per thread of x <- 2^(-x) in 32-bit registers, the sign
// flipped in the instruction's operand (f32) or by one integer op on the sign bits (the 16-bit
// forms). The loop over iterations is not unrolled, so its body is one pass over the chains.
// Each block's thread 0 notes its SM and the SM's clock at two block barriers.
template <int FORM>
__device__ __forceinline__ unsigned step(unsigned x) {
    unsigned y;
    if (FORM == 0) {
        float f;
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(f) : "f"(-__uint_as_float(x)));
        y = __float_as_uint(f);
    } else if (FORM == 1) {
        unsigned short h, v = (unsigned short)(x ^ 0x8000u);
        asm volatile("ex2.approx.f16 %0, %1;" : "=h"(h) : "h"(v));
        y = h;
    } else if (FORM == 2) {
        asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x ^ 0x80008000u));
    } else {
        asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(x ^ 0x80008000u));
    }
    return y;
}
template <int FORM>
__device__ __forceinline__ void chains(const unsigned* in, unsigned* out, long long* clocks, int iters) {
    unsigned x[CHAINS];
    for (int k = 0; k < CHAINS; ++k) x[k] = in[(threadIdx.x + k) % 32];
    __syncthreads();
    const long long t0 = clock64();
#pragma unroll 1
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int k = 0; k < CHAINS; ++k) x[k] = step<FORM>(x[k]);
    }
    __syncthreads();
    const long long t1 = clock64();
    unsigned s = 0;
    for (int k = 0; k < CHAINS; ++k) s ^= x[k];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        clocks[3 * blockIdx.x] = sm, clocks[3 * blockIdx.x + 1] = t0, clocks[3 * blockIdx.x + 2] = t1;
    }
}
#define RATE_KERNEL(NAME, FORM)                                                                 \
    extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)                       \
    NAME(const unsigned* __restrict__ in, unsigned* __restrict__ out, long long* clocks, int iters) { \
        chains<FORM>(in, out, clocks, iters);                                                   \
    }
RATE_KERNEL(rate_f32, 0)
RATE_KERNEL(rate_f16x1, 1)
RATE_KERNEL(rate_f16x2, 2)
RATE_KERNEL(rate_bf16x2, 3)
"""
DEFINES = {"THREADS": THREADS, "BLOCKS_PER_SM": BLOCKS_PER_SM, "CHAINS": CHAINS}


def compile_for(arch: str = "sm_90a") -> nvrtc.Compiled:
    return nvrtc.compile_cuda(SOURCE, arch=arch, defines=DEFINES, name="mufu_half_rates.cu")


def mufu_per_exponential(arch: str = "sm_90a") -> dict:
    """{form: (MUFU instructions per exponential in the inner loop, their opcodes)}, from the
    SASS (no GPU)."""
    from lib.microbench import inner_loop
    from lib.sass import instruction_mix, sass_text
    sass = sass_text(compile_for(arch).cubin)
    out = {}
    for name, _, per_instr in FORMS:
        loop = inner_loop(sass, f"rate_{name}")
        mix = instruction_mix(loop["sass"], full=True)
        mufu = {op: n for op, n in mix.items() if op.startswith("MUFU")}
        if not mufu:
            raise AssertionError(f"rate_{name}: no MUFU in the inner loop: {dict(mix)}")
        exps = CHAINS * per_instr  # the loop body: one pass over the chains
        out[name] = (sum(mufu.values()) / exps, mufu)
    return out


def per_sm_clock(blocks, exps_per_block) -> float:
    """Exponentials per SM per clock, the median over SMs: each SM's blocks' exponentials over
    the clocks from its first block's start to its last block's end (whether its blocks ran all
    at once or in turns; clock64 is the SM's own counter)."""
    spans = {}
    for sm, t0, t1 in blocks:
        lo, hi, n = spans.get(sm, (t0, t1, 0))
        spans[sm] = (min(lo, t0), max(hi, t1), n + 1)
    return statistics.median(n * exps_per_block / (hi - lo) for lo, hi, n in spans.values())


def measure(repeats: int = 5, iters: int = 4096) -> dict:
    """{form: {'per_sm_clock': exponentials per SM per clock (median over repeats of the SMs'
    median, per_sm_clock), 'Gops': exponentials per second from CUDA events}}."""
    from lib.timing import time_cuda
    compiled = compile_for(nvrtc.gpu_arch())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sms * BLOCKS_PER_SM
    # inputs in (0, 1) as each form's bits: f32, or two f16 / bf16 halves of one word
    vals = 0.05 + 0.9 * torch.rand(32, 2, device="cuda")
    inputs = {"f32": vals[:, 0].contiguous().view(torch.int32),
              "f16x1": vals.half().view(torch.int32) & 0xFFFF,
              "f16x2": vals.half().view(torch.int32).reshape(32),
              "bf16x2": vals.bfloat16().view(torch.int32).reshape(32)}
    out = torch.empty(grid * THREADS, device="cuda", dtype=torch.int32)
    clocks = torch.empty(grid, 3, device="cuda", dtype=torch.int64)
    results = {}
    for name, _, per_instr in FORMS:
        kern = nvrtc.load_kernel(compiled, f"rate_{name}")
        inp = inputs[name].reshape(32).contiguous()
        call = lambda: nvrtc.launch(kern, grid, THREADS, inp, out, clocks, np.int32(iters))  # noqa: E731
        exps_per_thread = iters * CHAINS * per_instr
        per_clock, gops = [], []
        for _ in range(repeats):
            t = time_cuda(call, flush=False, min_runs=5, max_runs=20, budget_s=0.1)
            call(); torch.cuda.synchronize()  # one more run, whose clocks are read
            per_clock.append(per_sm_clock(clocks.cpu().tolist(), THREADS * exps_per_thread))
            gops.append(grid * THREADS * exps_per_thread / (t.median_us * 1e-6) / 1e9)
        results[name] = {"per_sm_clock": statistics.median(per_clock), "Gops": statistics.median(gops)}
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--offline", action="store_true", help="only the SASS count (no GPU)")
    args = ap.parse_args()
    print("| form | MUFU per exponential (SASS) | MUFU opcodes in the loop |")
    print("|---|---|---|")
    for name, (per, ops) in mufu_per_exponential().items():
        print(f"| {name} | {per:g} | {', '.join(f'{o} ×{n}' for o, n in ops.items())} |")
    if args.offline or not torch.cuda.is_available():
        return
    print(f"\n{torch.cuda.get_device_name(0)}: {BLOCKS_PER_SM} blocks of {THREADS} threads per SM, "
          f"{CHAINS} chains per thread")
    print("| form | exponentials per SM per clock (clock64) | Gexp/s (CUDA events) | × f32 (events) |")
    print("|---|---|---|---|")
    res = measure()
    for name, r in res.items():
        print(f"| {name} | {r['per_sm_clock']:.2f} | {r['Gops']:,.0f} | {r['Gops'] / res['f32']['Gops']:.3f}× |")


if __name__ == "__main__":
    main()
