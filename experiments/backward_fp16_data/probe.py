"""Does fp16's data make stage 8's backward slower than bf16's, against cuDNN? In the record at
0c143ec the fp16 rows run 0.979x SDPA's default backward where bf16's run 0.991x (D 64 full) and
0.998x (D 128 causal), though the two builds' SASS differ only in the pack instruction of the
16-bit conversion (F2FP.F16 for F2FP.BF16). Both backward kernels run at the GPU's power limit
(experiments/backward_clocks), and a product's energy depends on the bits it multiplies: fp16 has
10 bits of mantissa, bf16 7. So each row is timed three ways from the same float32 draws: in bf16,
in fp16 holding bf16's values (the low 3 mantissa bits zero), and in fp16 rounded from float32;
stage 8 and SDPA's default backward, all six in the same interleaved rounds.

    python3 experiments/backward_fp16_data/probe.py
"""
import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from backward_bench import forward_with_lse  # noqa: E402
from lib.timing import sdpa_backward_call, time_interleaved  # noqa: E402
from stages import stage6, stage8  # noqa: E402

ROWS = [(16, 16, 2048, 64, False), (4, 16, 8192, 128, True), (4, 16, 8192, 128, False)]  # B, H, S, D, causal


def inputs(B, H, S, D, seed):
    """{form: (q, k, v, dout)} from one float32 draw: bf16, fp16 holding bf16's values, fp16."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = [torch.randn(B, H, S, D, device="cuda", generator=g) for _ in range(4)]
    return {"bf16": [t.bfloat16() for t in x], "fp16 (bf16's values)": [t.bfloat16().half() for t in x],
            "fp16": [t.half() for t in x]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: times stage 8's Hopper build (sm_90a), so it needs an H100 or H200 and none was found\n")
    for B, H, S, D, causal in ROWS:
        fns = {}
        for form, (q, k, v, dout) in inputs(B, H, S, D, seed=S + D).items():
            out, lse = forward_with_lse(q, k, v, causal, stage6)
            fns[f"stage 8, {form}"] = (lambda q=q, k=k, v=v, out=out, dout=dout, lse=lse:
                                       stage8.attention_backward(q, k, v, out, dout, lse, causal=causal))
            fns[f"SDPA, {form}"] = sdpa_backward_call(q, k, v, dout, causal=causal)
        t = time_interleaved(fns, rounds=7, budget_s=1.0)
        print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} (µs, 7 interleaved rounds):", flush=True)
        for form in ("bf16", "fp16 (bf16's values)", "fp16"):
            s8, sd = t[f"stage 8, {form}"].median_us, t[f"SDPA, {form}"].median_us
            b8, bd = t["stage 8, bf16"].median_us, t["SDPA, bf16"].median_us
            print(f"  {form:22s} stage 8 {s8:9,.1f} ({s8 / b8:.3f}x bf16's)  SDPA {sd:9,.1f} ({sd / bd:.3f}x bf16's)  "
                  f"stage 8 at {sd / s8:.3f}x SDPA's speed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
