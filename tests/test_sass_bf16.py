"""Offline (no GPU): the WMMA stages compile to the same machine code in bfloat16 as in float16.

NVRTC emits mma.h's bf16 fragment loads on generic addresses; without the state space ptxas
loads each fragment with four generic LD.E and transposes with MOVM instead of one ldmatrix
(LDSM). stages/attention.cuh's load_fragment names the state space. These tests fail if a
stage goes back to wmma::load_matrix_sync for a bf16 operand fragment, or if the bf16 build
otherwise drifts from the fp16 one (spills, extra instructions in the K/V loop)."""
import collections

import pytest
import torch

import stages
from conftest import prebuild
from lib import sass

# The stages whose tensor-core steps are WMMA (16×16×16 fragments through shared memory).
WMMA_STAGES = [n for n in stages.NUMBERS if n in (1, 2, 3, 4)]
# Opcodes that differ by element type only: the tensor-core product and the fp32 → 16-bit pack.
TYPE_VARIANTS = {"HMMA.16816.F32.BF16": "HMMA.16816.F32",
                 "F2FP.BF16.F32.PACK_AB": "F2FP.F16.F32.PACK_AB"}


def kernels(n, dtype, D, arch="sm_90a"):
    """{kernel: (ptxas report, full opcode Counter of its SASS)} of stage n."""
    out = {}
    for compiled in stages.get(n).compile_for(arch, dtype, D).values():
        text = sass.sass_text(compiled.cubin)
        for kernel, ptxas in compiled.resource_usage().items():
            mix = collections.Counter(x["full"] for x in sass.listing(text, kernel))
            out[kernel] = (ptxas, mix)
    return out


def _builds(n, D):
    return [stages.get(n).compile_for("sm_90a", dtype, D) for dtype in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("n", WMMA_STAGES)
@prebuild(_builds)
def test_bf16_fragments_use_ldmatrix(n, D):
    for kernel, (ptxas, mix) in kernels(n, torch.bfloat16, D).items():
        movm = sum(v for k, v in mix.items() if k.startswith("MOVM"))
        assert movm == 0, f"stage {n} {kernel} bf16 D{D}: {movm} MOVM (register transposes of " \
                          "fragments loaded without ldmatrix)"
        if any(k.startswith("HMMA") for k in mix) and any(k.startswith("LDS") for k in mix):
            assert any(k.startswith("LDSM") for k in mix), \
                f"stage {n} {kernel} bf16 D{D}: WMMA fragments are not loaded with LDSM"


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("n", WMMA_STAGES)
@prebuild(_builds)
def test_bf16_compiles_like_fp16(n, D):
    """No spills, local memory or generic loads that fp16 does not have, and (within 5%) no
    more instructions in the K/V loop (stage 1: in each kernel) than the fp16 build."""
    half, bf16 = kernels(n, torch.float16, D), kernels(n, torch.bfloat16, D)
    assert half.keys() == bf16.keys()
    for kernel in half:
        (p16, m16), (pbf, mbf) = half[kernel], bf16[kernel]
        # a stage may allow a few spilled bytes where its bound is tight (INFO.extra, stage 3 at
        # D 128): within that allowance bf16 may spill where fp16 does not (compilers differ)
        allowed = stages.get(n).INFO.extra.get("spill_bytes_allowed", {}).get(D, 0)
        assert pbf["spill_stores"] <= max(p16["spill_stores"], allowed), \
            f"stage {n} {kernel} D{D}: bf16 spills {pbf['spill_stores']} B, fp16 {p16['spill_stores']} B"
        for prefix in ("LD.E", "MOVM") + (("LDL", "STL") if not allowed else ()):
            a, b = (sum(v for k, v in m.items() if k.startswith(prefix)) for m in (m16, mbf))
            assert b <= a, f"stage {n} {kernel} D{D}: {prefix} fp16 {a}, bf16 {b}"
        assert mbf["HMMA.16816.F32.BF16"] == m16["HMMA.16816.F32"]
    if n == 1:
        return
    text = {dt: sass.sass_text(next(iter(stages.get(n).compile_for("sm_90a", dt, D).values())).cubin)
            for dt in (torch.float16, torch.bfloat16)}
    loop = {dt: len(sass.kv_loop(t)["body"]) for dt, t in text.items()}
    # 10%, not exact: the bf16 fragments' explicit ldmatrix addresses cost a few integer
    # instructions (LEA/UIADD3) that mma.h's fp16 loads fold into immediates, and how many
    # depends on the compiler: NVRTC 13.5, 2-5%; NVRTC 13.0 (the H100 machine's), 2-7% at
    # e4ef34c (stage 3 D64 866 vs 818) and up to 8% since the causal diagonal became an
    # argument (stage 3 D64 885 vs 818). The defect this file guards against, generic loads
    # and MOVM, is asserted exactly above; it made the loop 7-18% longer.
    assert loop[torch.bfloat16] <= 1.10 * loop[torch.float16], \
        f"stage {n} D{D}: K/V loop of {loop[torch.bfloat16]} instructions in bf16, " \
        f"{loop[torch.float16]} in fp16"
