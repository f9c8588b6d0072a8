"""Microbenchmarks for the ceilings the kernels actually meet: the rate of `mma.sync`
(m16n8k16, 16-bit inputs, fp32 accumulate; SASS `HMMA.16816.F32`) and of `MUFU.EX2` (the
special-function unit's 2^x, which every softmax score passes through).

A dense matrix product from cuBLAS (measure_ceilings, below) runs on Hopper's warpgroup
MMAs (WGMMA); the stages up to 5 issue `mma.sync`, one warp at a time, and one `MUFU.EX2` per
score. These two kernels measure what those instructions can do on their own: every warp runs
CHAINS independent dependency chains (so the pipe, not one chain's latency, sets the pace)
for `iters` iterations, and stores its results, so the compiler can neither drop nor fold the
work. `check_sass` reads the compiled inner loop back (no GPU needed) to prove it.
"""
from __future__ import annotations

import re
import statistics

import numpy as np
import torch

from lib import nvrtc
from lib.simulator import require_gpu

THREADS = 128          # 4 warps per block: one per SM sub-partition
BLOCKS_PER_SM = 8      # 32 warps per SM, 8 per scheduler
HMMA_CHAINS = 8        # independent accumulators per warp
MUFU_CHAINS = 16       # independent 2^x chains per thread
MMA_FLOP = 2 * 16 * 8 * 16  # one m16n8k16

SOURCE = r"""
#if defined(ELEM_BF16)
#define MMA_TYPE "bf16"
#else
#define MMA_TYPE "f16"
#endif

// mma.sync m16n8k16: c (4 floats per thread) += a (16 x 16) · b (16 x 8), fp32 accumulate.
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Every warp: HMMA_CHAINS accumulators, each one a dependency chain of `iters` MMAs. The
// operands come from memory (the compiler cannot know them) and the sums are stored.
extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
hmma_rate(const unsigned* __restrict__ in, float* __restrict__ out, int iters) {
    const int lane = threadIdx.x % 32;
    unsigned a[4], b0 = in[(lane + 4) % 32], b1 = in[(lane + 5) % 32];
    for (int i = 0; i < 4; ++i) a[i] = in[(lane + i) % 32];
    float c[HMMA_CHAINS][4];
    for (int k = 0; k < HMMA_CHAINS; ++k)
        for (int i = 0; i < 4; ++i) c[k][i] = 0.0f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int k = 0; k < HMMA_CHAINS; ++k) mma_16816(c[k], a, b0, b1);
    }
    float s = 0.0f;
    for (int k = 0; k < HMMA_CHAINS; ++k)
        for (int i = 0; i < 4; ++i) s += c[k][i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// 2^x in one MUFU.EX2, as stage 5 computes it.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm volatile("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Every thread: MUFU_CHAINS chains x <- 2^(-x), which stay in (0, 1] (no overflow, no
// denormals). The negation folds into MUFU's operand; the results are stored.
extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
mufu_ex2_rate(const float* __restrict__ in, float* __restrict__ out, int iters) {
    float x[MUFU_CHAINS];
    for (int k = 0; k < MUFU_CHAINS; ++k) x[k] = in[(threadIdx.x + k) % 32];
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int k = 0; k < MUFU_CHAINS; ++k) x[k] = ex2(-x[k]);
    }
    float s = 0.0f;
    for (int k = 0; k < MUFU_CHAINS; ++k) s += x[k];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""

DEFINES = {"THREADS": THREADS, "BLOCKS_PER_SM": BLOCKS_PER_SM, "HMMA_CHAINS": HMMA_CHAINS,
           "MUFU_CHAINS": MUFU_CHAINS}


def compile_for(arch: str, dtype=torch.float16) -> nvrtc.Compiled:
    """Both microbenchmark kernels compiled for `arch` (no GPU needed)."""
    defines = dict(DEFINES, **nvrtc.ELEMENT_DEFINES[dtype])
    return nvrtc.compile_cuda(SOURCE, arch=arch, defines=defines, name="microbench.cu")


def inner_loop(sass: str, kernel: str) -> dict:
    """The innermost loop of `kernel` in a SASS listing (lib.sass.innermost_loops), the
    one holding the most instructions."""
    from lib.sass import innermost_loops
    loops = innermost_loops(sass, kernel)
    if not loops:
        raise ValueError(f"{kernel}: no loop in the SASS")
    return max(loops, key=lambda lp: sum(lp["mix"].values()))


def check_sass(arch: str = "sm_90", dtype=torch.float16) -> dict:
    """Compile offline and check that the work is really there: the inner loop of hmma_rate
    holds HMMA.16816.F32 (a multiple of HMMA_CHAINS of them), that of mufu_ex2_rate MUFU.EX2
    (a multiple of MUFU_CHAINS), both kernels store their results (STG). Returns
    {kernel: {'loop': opcode Counter with modifiers, 'unroll': loop trips per pass}};
    raises AssertionError if the compiler dropped or changed the work."""
    from lib.sass import function_text, instruction_mix, sass_text
    compiled = compile_for(arch, dtype)
    for kernel, usage in compiled.resource_usage().items():
        assert not usage["spill_stores"], f"{kernel} spills at {arch}: the timing would include it"
    sass = sass_text(compiled.cubin)
    out = {}
    for kernel, op, chains in (("hmma_rate", "HMMA.16816.F32", HMMA_CHAINS),
                               ("mufu_ex2_rate", "MUFU.EX2", MUFU_CHAINS)):
        loop = inner_loop(sass, kernel)
        full = instruction_mix(loop["sass"], full=True)
        n = sum(c for o, c in full.items() if o.startswith(op))
        assert n and n % chains == 0, f"{kernel}: {n} {op} in the loop, not a multiple of {chains}"
        assert instruction_mix(function_text(sass, kernel))["STG"], f"{kernel}: no store of the results"
        if op == "MUFU.EX2":  # nothing but the 2^x (and the loop's own counter and branch)
            extra = {o: c for o, c in full.items() if o.split(".")[0] in ("FADD", "FMUL", "FFMA")}
            assert not extra, f"{kernel}: float arithmetic around MUFU.EX2 in the loop: {extra}"
        out[kernel] = {"loop": full, "unroll": n // chains}
    return out


def _iters(unroll: int, target: int) -> int:
    """`target` rounded up to a multiple of the loop's unroll (whole passes)."""
    return max(unroll, (target + unroll - 1) // unroll * unroll)


def measure(repeats: int = 5, dtype=torch.bfloat16) -> dict:
    """Time both kernels on this GPU with CUDA events (lib.timing.time_cuda, no L2 flush: they
    touch no memory in the loop), `repeats` times each, on SMs × BLOCKS_PER_SM blocks of
    THREADS threads. Returns {'hmma_TFLOPS', 'mufu_ex2_Gops'} (medians of the repeats'
    medians) with '_min' and '_max' variants, and what was run."""
    require_gpu("the mma.sync and MUFU.EX2 microbenchmarks")
    from lib.timing import time_cuda
    arch = nvrtc.gpu_arch()
    compiled = compile_for(arch, dtype)
    hmma = nvrtc.load_kernel(compiled, "hmma_rate")
    mufu = nvrtc.load_kernel(compiled, "mufu_ex2_rate")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sms * BLOCKS_PER_SM
    # operands: 64 16-bit values in [0.01, 0.02) of the measured dtype (32 words of two), 32 floats
    # in (0, 1) for the 2^x chains; finite, so no NaN or infinity ever enters the pipes
    ops16 = (0.01 + 0.01 * torch.rand(64, device="cuda")).to(dtype).view(torch.int32)
    ops32 = torch.rand(32, device="cuda", dtype=torch.float32)
    out = torch.empty(grid * THREADS, device="cuda", dtype=torch.float32)
    warps = grid * THREADS // 32
    it_h, it_m = 16384, 8192  # about 5 ms each on an H100
    results = {}
    for key, kern, inp, iters, work in (
            ("hmma_TFLOPS", hmma, ops16, it_h, warps * it_h * HMMA_CHAINS * MMA_FLOP / 1e12),
            ("mufu_ex2_Gops", mufu, ops32, it_m, grid * THREADS * it_m * MUFU_CHAINS / 1e9)):
        call = lambda: nvrtc.launch(kern, grid, THREADS, inp, out, np.int32(iters))  # noqa: E731
        rates = sorted(work / (time_cuda(call, flush=False, min_runs=5, max_runs=20,
                                         budget_s=0.2).median_us * 1e-6)
                       for _ in range(repeats))
        results[key] = float(np.median(rates))
        results[key + "_min"], results[key + "_max"] = rates[0], rates[-1]
    results["microbench"] = (f"{arch}, {str(dtype).replace('torch.', '')} m16n8k16 mma.sync "
                             f"({HMMA_CHAINS} chains per warp) and ex2.approx.ftz "
                             f"({MUFU_CHAINS} chains per thread), {grid} blocks x {THREADS} "
                             f"threads, median of {repeats} repeats")
    return results


def rate_text(ceilings: dict, key: str, unit: str) -> str:
    """'median (min–max)' of a ceiling with its spread, for prose and legends."""
    v = ceilings.get(key)
    if v is None:
        return "not measured"
    lo, hi = ceilings.get(key + "_min"), ceilings.get(key + "_max")
    spread = f" (min {lo:,.0f}, max {hi:,.0f})" if lo is not None and hi is not None else ""
    return f"{v:,.0f} {unit}{spread}"


if __name__ == "__main__":
    import sys
    if torch.cuda.is_available():
        print(measure())
    else:
        for arch in sys.argv[1:] or ["sm_90", "sm_80"]:
            for k, v in check_sass(arch).items():
                print(arch, k, "unroll", v["unroll"], dict(v["loop"]))


def measure_ceilings(dtype=torch.bfloat16, repeats: int = 5) -> dict:
    """This GPU's ceilings, measured: device-to-device copy bandwidth (bytes read plus
    written), the rate of a large matrix product on random data (tensor cores, cuBLAS: WGMMA on
    Hopper), the float32 rate of the CUDA cores, and the rates of the two instructions the
    stages' inner loops lean on: `mma.sync` m16n8k16 (HMMA.16816) and MUFU.EX2 (2^x), from
    measure() above. Each is timed `repeats` times (each time the median of several runs): the
    plain key is the median of the repeats, '<key>_min' and '<key>_max' their spread."""
    require_gpu("measuring the ceilings")
    from lib.timing import time_cuda

    def spread(key, work, fn, **kw):
        rates = sorted(work / (time_cuda(fn, flush=False, **kw).median_us * 1e-6)
                       for _ in range(repeats))
        return {key: statistics.median(rates), key + "_min": rates[0], key + "_max": rates[-1]}

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    out = spread("copy_GBps", 2 * n / 1e9, lambda: dst.copy_(src), min_runs=10, budget_s=0.2)
    del src, dst
    m = 8192
    a = torch.randn(m, m, device="cuda", dtype=dtype)
    b = torch.randn(m, m, device="cuda", dtype=dtype)
    out.update(spread("matmul_TFLOPS", 2 * m ** 3 / 1e12, lambda: a @ b, min_runs=10,
                      budget_s=0.2))
    del a, b
    # the CUDA cores' float32 rate: a float32 product with TF32 off runs on FFMA, not tensor cores
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        f = 4096
        a32, b32 = (torch.randn(f, f, device="cuda") for _ in range(2))
        out.update(spread("fp32_TFLOPS", 2 * f ** 3 / 1e12, lambda: a32 @ b32, min_runs=10,
                          budget_s=0.1))
        del a32, b32
    finally:
        torch.set_float32_matmul_precision(old)
    try:  # a failure here must not cost the recording its other ceilings; say what failed
        out.update(measure(repeats=repeats, dtype=dtype))
    except Exception as e:  # noqa: BLE001
        out["microbench_error"] = f"{type(e).__name__}: {e}"[:500]
    out.update(matmul_dtype=str(dtype).replace("torch.", ""), matmul_shape=f"{m}x{m}x{m}",
               repeats=repeats)
    return out
