"""Session 34, call 13: call 12 timed stage 7 after stage 6's cheaper work-tile start and end at
0.84x (D128 full) and 0.89x (D128 causal) of its kernel before them, and 1.01x at D64; its own
benchmark in the same call put the new kernel 7% faster than that A/B did. Again, with the
order of the variants reversed, more rounds, and a third build: the new source with only the
shared-memory alignment put back as before (generic pointer), to tell the two changes apart.
Outputs checked against lib.fp8's emulation first."""
import sys
from functools import lru_cache
from pathlib import Path

import torch

from lib import fp8, nvrtc
from lib.inputs import causal_mode, make_qkv
from lib.timing import time_interleaved
from stages import stage7

HERE = Path(__file__).parent


def loader(path):
    @lru_cache(maxsize=None)
    def kernel(out_dtype, D, defines, smem):
        compiled = nvrtc.compile_stage(path, arch=stage7.ARCH, dtype=out_dtype, head_dim=D, defines=dict(defines))
        return nvrtc.load_kernel(compiled, "attention_fp8", max_dynamic_smem=smem)
    return kernel


def with_kernel(k, fn):
    def run():
        saved = stage7._kernel
        stage7._kernel = k
        try:
            return fn()
        finally:
            stage7._kernel = saved
    return run


ok = True
builds = {"d021463": loader(HERE / "stage7-d021463.cu"), "generic smem": loader(HERE / "stage7-generic-smem.cu"),
          "today": stage7._kernel}
for B, H, S, D in [(16, 16, 2048, 64), (4, 16, 8192, 128)]:
    for causal in (False, True):
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
        vt = fp8.v_for_pv(v8)
        code = causal_mode(causal, S, S, stage7.INFO)
        call = lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5, out_dtype=torch.bfloat16)  # noqa: E731
        fns = {name: with_kernel(kern, call) for name, kern in builds.items()}
        for name, fn in fns.items():
            c = fp8.check_on_emulation(fn(), q8, k8, v8, qd, kd, vd, causal=causal)
            ok &= bool(c["passed"])
        t = time_interleaved(fns, rounds=9, budget_s=0.8)
        us = {n: x.median_us for n, x in t.items()}
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: " + ", ".join(
            f"{n} {us[n]:.1f} µs ({us['d021463'] / us[n]:.3f}x; rounds {min(t[n].round_medians_us):.0f}-{max(t[n].round_medians_us):.0f})"
            for n in fns), flush=True)
sys.exit(0 if ok else 1)
