"""Stage 7 (FP8) on the GPU: checked, then timed against stage 6 (bf16), SDPA's default and FLASH
backends and the e4m3 GEMM ceiling, in interleaved rounds at the standard shapes (issue 25's
targets: ≥ 1.5× stage 6 at B4 H16 S8192 D128, ≥ 1.3× at B16 H16 S2048 D64).

Timed apart, so each cost shows: the kernel on prepared e4m3 inputs (stage7.forward), the same
kernel transposing V's tiles itself (V_IN_KERNEL, on e4m3 V as it is), with half the
exponentials on the FMA pipes (exp2_poly 4: the notebook's count predicts the exponentials bound FP8),
with and without the tail split (TAIL_SPLIT: the queue's last partial wave split along the keys; one of
the two is the head dim's default), the quantization of bf16
inputs by stage 7's kernels with V transposed in the same pass (stage7.quantize) and by PyTorch
(lib.fp8.prepare, then lib.fp8.v_for_pv: the same bytes), V's transpose alone for inputs already
in e4m3 (lib.fp8.v_for_pv), and the whole call (stage7.attention: quantization, kernel). The ceilings: torch._scaled_mm e4m3 and a bf16
matmul at 8192³, in the same process. Stage 7 is checked against lib.fp8's emulation of the same
arithmetic (lib.fp8.check_on_emulation) before timing and again after.

    python scripts/fp8_bench.py                    # print the table (H100/H200)
    python scripts/fp8_bench.py --out fp8.json     # and write every timing with the env
    python scripts/fp8_bench.py --record           # and store it under "fp8_bench" in results/<gpu>.json

Stage 7 is outside lib.bench's table (its error rule is FP8's, lib.fp8): this script's --record
is its record.
"""
import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch  # noqa: E402

from lib import fp8  # noqa: E402
from lib import results as R  # noqa: E402
from lib.inputs import causal_mode, make_qkv  # noqa: E402
from lib.reference import attention_flops  # noqa: E402
from lib.timing import sdpa_call, time_interleaved  # noqa: E402
from stages import stage6, stage7  # noqa: E402

SHAPES = [(1, 8, 512, 64), (16, 16, 2048, 64), (4, 16, 8192, 128)]  # (B, H, S, D): the standard shapes
GEMM = 8192  # the ceilings' square matrix size


def check(q, k, v, causal) -> dict:
    """Stage 7's whole call against the emulation on its own e4m3 inputs (lib.fp8.check_on_emulation):
    passed, and how near its bounds the worst element and the RMSE came."""
    out = stage7.attention(q, k, v, causal=causal)
    B, H, S, D = q.shape
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    build = stage7.emulation_of(B, H, S, k.shape[2], D, causal, sms)  # where its running max moves, how it sums l
    c = fp8.check_on_emulation(out, *fp8.prepare(q, k, v), causal=causal, **build)
    return {k: c[k] for k in ("passed", "worst", "rmse_ratio")}


def ceilings(budget_s: float) -> dict:
    """TFLOPS of an e4m3 GEMM (torch._scaled_mm, per-tensor scales, bf16 out) and a bf16 matmul,
    GEMM³, in interleaved rounds."""
    a = torch.randn(GEMM, GEMM, device="cuda")
    a8, b8 = a.to(fp8.E4M3), a.T.contiguous().to(fp8.E4M3).T  # _scaled_mm wants B column-major
    one = torch.ones((), device="cuda")
    a16 = a.bfloat16()
    fns = {"e4m3 GEMM": lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
           "bf16 GEMM": lambda: a16 @ a16}
    t = time_interleaved(fns, budget_s=budget_s)
    return {name: 2 * GEMM ** 3 / (x.median_us * 1e-6) / 1e12 for name, x in t.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every timing, with the env, as JSON")
    ap.add_argument("--record", action="store_true",
                    help='store under "fp8_bench" in results/<gpu>.json (only when every check passed), '
                         "with stage 7's sources' hash, for the stage 7 notebook")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--budget-s", type=float, default=0.5, help="seconds of timing per callable (default 0.5)")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: runs stage 7 (e4m3 wgmma, sm_90a), so it needs an H100 or H200 and none was found\n")
    dtype = getattr(torch, a.dtype)
    ceil = ceilings(a.budget_s)
    print(f"ceilings: e4m3 GEMM {ceil['e4m3 GEMM']:.0f} TFLOPS, bf16 GEMM {ceil['bf16 GEMM']:.0f} TFLOPS", flush=True)
    rows, ok = [], True
    for B, H, S, D in SHAPES:
        for causal in (False, True):
            q, k, v = make_qkv(B, H, S, D, dtype=dtype)
            before = check(q, k, v, causal)
            q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
            vt = fp8.v_for_pv(v8)
            code = causal_mode(causal, S, S, stage7.INFO)
            fns = {"stage 7 kernel": lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code,
                                                            scale=D ** -0.5, out_dtype=dtype),
                   "stage 7 kernel, V in kernel": lambda: stage7.forward(q8, k8, v8, qd, kd, vd, Sk=S, causal=code,
                                                                         scale=D ** -0.5, out_dtype=dtype,
                                                                         v_in_kernel=True),
                   "stage 7 kernel, exp2 poly 4/8": lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code,
                                                                           scale=D ** -0.5, out_dtype=dtype,
                                                                           exp2_poly=4),
                   "stage 7 kernel, tail not split": lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code,
                                                                            scale=D ** -0.5, out_dtype=dtype,
                                                                            tail_split=False),
                   "stage 7 kernel, tail split": lambda: stage7.forward(q8, k8, vt, qd, kd, vd, Sk=S, causal=code,
                                                                        scale=D ** -0.5, out_dtype=dtype,
                                                                        tail_split=True),
                   "stage 7 call": lambda: stage7.attention(q, k, v, causal=causal),
                   "quantize": lambda: stage7.quantize(q, k, v),
                   "quantize in PyTorch": lambda: fp8.v_for_pv(fp8.prepare(q, k, v)[2]),
                   "V transpose": lambda: fp8.v_for_pv(v8),
                   "stage 6": lambda: stage6.attention(q, k, v, causal=causal),
                   "SDPA default": sdpa_call(q, k, v, causal=causal),
                   "SDPA flash": sdpa_call(q, k, v, causal=causal, backend="flash")}
            t = time_interleaved(fns, budget_s=a.budget_s)
            after = check(q, k, v, causal)
            passed = before["passed"] and after["passed"]
            ok &= passed
            flops = attention_flops(B, H, S, S, D, causal)
            us = {name: x.median_us for name, x in t.items()}
            us.setdefault("SDPA flash", math.nan)  # None: that backend does not take these inputs
            row = {"B": B, "H": H, "S": S, "D": D, "causal": causal, "dtype": a.dtype, "us": us,
                   "round_medians_us": {name: x.round_medians_us for name, x in t.items()},
                   "tflops_kernel": flops / us["stage 7 kernel"] / 1e6, "vs_emulation": [before, after],
                   "passed": passed}
            rows.append(row)
            worst = max(before["worst"], after["worst"]), max(before["rmse_ratio"], after["rmse_ratio"])
            print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: kernel {us['stage 7 kernel']:.1f} µs "
                  f"({row['tflops_kernel']:.0f} TFLOPS, {row['tflops_kernel'] / ceil['e4m3 GEMM']:.0%} of the e4m3 "
                  f"GEMM), {us['stage 6'] / us['stage 7 kernel']:.2f}× stage 6, "
                  f"{us['SDPA default'] / us['stage 7 kernel']:.2f}× SDPA; quantize {us['quantize']:.1f} µs "
                  f"(PyTorch {us['quantize in PyTorch']:.1f}), "
                  f"V transpose {us['V transpose']:.1f} µs, whole call {us['stage 7 call']:.1f} µs; vs emulation: "
                  f"worst element {worst[0]:.2f} of its bound, RMSE {worst[1]:.2f} of its allowance: "
                  f"{'pass' if passed else 'FAIL'}", flush=True)
    print("\n| shape | causal | kernel µs | TFLOPS | × stage 6 | × SDPA default | × SDPA flash | V in kernel µs | exp2 poly 4/8 µs | "
          "quantize µs | in PyTorch µs | V transpose µs | whole call µs | check |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        us = r["us"]
        print(f"| B{r['B']} H{r['H']} S{r['S']} D{r['D']} | {'yes' if r['causal'] else 'no'} | "
              f"{us['stage 7 kernel']:,.1f} | {r['tflops_kernel']:.0f} | {us['stage 6'] / us['stage 7 kernel']:.2f} | "
              f"{us['SDPA default'] / us['stage 7 kernel']:.2f} | {us['SDPA flash'] / us['stage 7 kernel']:.2f} | "
              f"{us['stage 7 kernel, V in kernel']:,.1f} | {us['stage 7 kernel, exp2 poly 4/8']:,.1f} | "
              f"{us['quantize']:,.1f} | {us['quantize in PyTorch']:,.1f} | {us['V transpose']:,.1f} | "
              f"{us['stage 7 call']:,.1f} | "
              f"{'pass' if r['passed'] else 'FAIL'} |")
    result = {"env": R.capture_env(), "sha256": R.stage_sha256(stage7.INFO), "budget_s": a.budget_s,
              "ceilings_tflops": ceil, "rows": rows}
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    if a.record and ok:
        print(f"recorded in {R.save_extra(result['env']['gpu'], 'fp8_bench', result)}")
    elif a.record:
        print("a check against the emulation FAILED: nothing recorded")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
