"""Issue 25's second step on the GPU: the whole FP8 forward loop (experiments/fp8_loop_probe/fp8_loop_probe.cu: one
warpgroup per 64 query rows, head dim 128, both products in e4m3, the online softmax in float32,
P packed in-thread against Vᵀ in key_order), checked against:

  1. lib.fp8's emulation of the same arithmetic on the same e4m3 values and descales (what the
     kernel should give, up to the tensor cores' FP8 sums, exp2.approx and the bf16 output);
  2. the float64 reference of the unquantized inputs: the RMSE FP8 costs, beside the emulation's.

Inputs: bf16 N(0, 1), or FlashAttention-3's outlier inputs (--outliers), quantized by
lib.fp8.prepare (one scale per batch entry and K/V head); odd lengths and GQA by default.

    python experiments/fp8_loop_probe/fp8_loop_probe.py     # needs an sm_90 GPU (H100/H200)
"""
import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from lib import fp8, nvrtc  # noqa: E402
from lib.reference import reference_attention  # noqa: E402

SOURCE = Path(__file__).with_suffix(".cu")
SMEM = (64 + 128 + 128) * 128 + 1024  # Q, K and Vᵀ tiles, and 1 KB to align them


def compile_probe(arch: str = "sm_90a"):
    """The kernel for `arch` (no GPU needed); HEAD_DIM is required by attention.cuh only."""
    return nvrtc.compile_cuda(SOURCE.read_text(), arch=arch, name=SOURCE.name, defines={"HEAD_DIM": 128})


def run(kern, q, k, v, p_offset=True):
    """q, k, v bf16 [B, H, S, 128] → (the kernel's output, its e4m3 inputs and descales)."""
    q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
    vt = fp8.v_for_pv(v8)
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    out = torch.empty(B, H, Sq, D, dtype=torch.bfloat16, device=q.device)
    scale = 1.0 / math.sqrt(D)
    nvrtc.launch(kern, (-(-Sq // 64), H, B), (128, 1, 1), q8.view(torch.uint8), k8.view(torch.uint8),
                 vt.view(torch.uint8), qd, kd, vd, out, *(np.int32(x) for x in (H, Hk, Sq, Sk, vt.shape[-1])),
                 np.float32(scale * math.log2(math.e)), np.int32(p_offset), smem=SMEM)
    return out, (q8, k8, v8, qd, kd, vd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--outliers", action="store_true", help="N(0,1) + N(0,100)·Bernoulli(0.001) inputs")
    a = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: runs wgmma (sm_90a), so it needs an H100 or H200 and none was found\n")
    kern = nvrtc.load_kernel(compile_probe(nvrtc.gpu_arch(arch_specific=True)), "fp8_loop_probe",
                             max_dynamic_smem=SMEM)
    ok = True
    for B, H, Hk, Sq, Sk in [(1, 1, 1, 64, 128), (2, 8, 2, 200, 333), (1, 4, 4, 77, 1000)]:
        if a.outliers:
            q, k, v = (x.to("cuda", torch.bfloat16) for x in fp8.outlier_inputs(B, H, max(Sq, Sk), 128, seed=a.seed))
            q, k, v = q[:, :, :Sq], k[:, :Hk, :Sk].contiguous(), v[:, :Hk, :Sk].contiguous()
            q = q.contiguous()
        else:
            g = torch.Generator(device="cuda").manual_seed(a.seed)
            q, k, v = (torch.randn(B, h, s, 128, generator=g, device="cuda").to(torch.bfloat16)
                       for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
        out, inputs = run(kern, q, k, v)
        torch.cuda.synchronize()
        ref = reference_attention(q, k, v)
        c = fp8.check_on_emulation(out, *inputs, scale=1.0 / math.sqrt(q.shape[-1]))
        ok &= c["passed"]
        print(f"B{B} H{H}/{Hk} Sq{Sq} Sk{Sk}: |kernel − emulation| at most {c['worst']:.2f} of its bound, RMSE "
              f"{c['rmse_ratio']:.2f} of its allowance (lib.fp8.check_on_emulation); RMSE against float64: kernel "
              f"{fp8.rmse(out, ref):.2e}, emulation {fp8.rmse(c['emu'], ref):.2e}, bf16 output alone "
              f"{fp8.rmse(ref.to(torch.bfloat16), ref):.2e} — {'pass' if c['passed'] else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
