"""Session 34, call 12: stage 7 with stage 6's cheaper work-tile start and end (the work index
decoded by magic-number division in the consumers, v_descale / l as one MUFU.RCP, shared memory
addressed as shared) against its kernel before them (stage7-d021463.cu, this folder), on the same
prepared e4m3 inputs in the same interleaved rounds, stage 6 (bf16) beside them, at
scripts/fp8_bench.py's shapes. Both outputs checked against lib.fp8's emulation first."""
import sys
from functools import lru_cache
from pathlib import Path

import torch

from lib import fp8, nvrtc
from lib.inputs import causal_mode, make_qkv
from lib.reference import attention_flops
from lib.timing import time_interleaved
from stages import stage6, stage7

OLD = Path(__file__).with_name("stage7-d021463.cu")


@lru_cache(maxsize=None)
def old_kernel(out_dtype, D, defines, smem):
    compiled = nvrtc.compile_stage(OLD, arch=stage7.ARCH, dtype=out_dtype, head_dim=D, defines=dict(defines))
    return nvrtc.load_kernel(compiled, "attention_fp8", max_dynamic_smem=smem)


def with_old(fn):
    def run():
        saved = stage7._kernel
        stage7._kernel = old_kernel
        try:
            return fn()
        finally:
            stage7._kernel = saved
    return run


ok = True
for B, H, S, D in [(1, 8, 512, 64), (16, 16, 2048, 64), (4, 16, 8192, 128)]:
    for causal in (False, True):
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
        vt = fp8.v_for_pv(v8)
        code = causal_mode(causal, S, S, stage7.INFO)
        new = lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5, out_dtype=torch.bfloat16)  # noqa: E731
        fns = {"today": new, "d021463": with_old(new), "stage 6": lambda: stage6.attention(q, k, v, causal=causal)}
        for name in ("today", "d021463"):
            c = fp8.check_on_emulation(fns[name](), q8, k8, v8, qd, kd, vd, causal=causal)
            ok &= bool(c["passed"])
            if not c["passed"]:
                print(f"{name} B{B} H{H} S{S} D{D} causal={causal}: FAILED against the emulation: {c}")
        t = time_interleaved(fns, budget_s=0.5)
        us = {n: x.median_us for n, x in t.items()}
        fl = attention_flops(B, H, S, S, D, causal)
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: today {us['today']:.1f} µs ({fl / us['today'] / 1e6:.0f} TFLOPS), "
              f"d021463 {us['d021463']:.1f} µs, today / d021463 {us['d021463'] / us['today']:.3f}x; "
              f"stage 6 {us['stage 6']:.1f} µs -> today {us['stage 6'] / us['today']:.2f}x stage 6", flush=True)
sys.exit(0 if ok else 1)
