"""Stage 7's cast kernel and attention kernel launched with programmatic dependent launch (PDL)
against the same launches without it, and stage 6, in the same interleaved rounds at the
standard shapes: the whole call from bf16 inputs (quantize's two launches, then the kernel),
the quantization alone and the kernel alone, each output checked against the emulation first.
Predicted (not measured): about 2 µs off the whole call (19-20 µs at B1 H8 S512: 1.1x there),
nothing measurable at the large shapes; the kernel alone, after the harness's L2 flush, as
stage 6's split kernel (call 5): level."""
import statistics

import torch

from lib import fp8
from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage6, stage7

gains = []
sms = torch.cuda.get_device_properties(0).multi_processor_count
for B, H, S, D in [(1, 8, 512, 64), (16, 16, 2048, 64), (4, 16, 8192, 128)]:
    for causal in (False, True):
        q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
        inputs = fp8.prepare(q, k, v)
        build = stage7.emulation_of(B, H, S, S, D, causal, sms)
        for pdl in (None, False):
            c = fp8.check_on_emulation(stage7.attention(q, k, v, causal=causal, pdl=pdl), *inputs, causal=causal, **build)
            assert c["passed"], (B, H, S, D, causal, pdl, c["worst"], c["rmse_ratio"])
        q8, k8, vt, qd, kd, vd = stage7.quantize(q, k, v)
        code = int(causal)
        fns = {"call, PDL": lambda: stage7.attention(q, k, v, causal=causal),
               "call, no PDL": lambda: stage7.attention(q, k, v, causal=causal, pdl=False),
               "quantize, PDL": lambda: stage7.quantize(q, k, v),
               "quantize, no PDL": lambda: stage7.quantize(q, k, v, pdl=False),
               "kernel, PDL": lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5),
               "kernel, no PDL": lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code, scale=D ** -0.5,
                                                        pdl=False),
               "stage 6": lambda: stage6.attention(q, k, v, causal=causal)}
        t = time_interleaved(fns, budget_s=0.3)
        us = {n: x.median_us for n, x in t.items()}
        gains.append(us["call, no PDL"] / us["call, PDL"])
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: "
              + "; ".join(f"{what} {us[what + ', PDL']:,.1f} µs with PDL, {us[what + ', no PDL']:,.1f} without "
                          f"({us[what + ', no PDL'] / us[what + ', PDL']:.3f}x)" for what in ("call", "quantize", "kernel"))
              + f"; whole call {us['stage 6'] / us['call, PDL']:.2f}x stage 6 ({us['stage 6']:,.1f} µs)", flush=True)
print(f"whole call, PDL over none: median {statistics.median(gains):.3f}x, range {min(gains):.3f}-{max(gains):.3f}x")
print("RECORD" if statistics.median(gains) >= 1.0 else "NO RECORD")
