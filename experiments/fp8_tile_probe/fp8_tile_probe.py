"""Issue 25's first step on the GPU: one FP8 (e4m3) tile of attention's two products on Hopper,
checked against torch piece by piece (experiments/fp8_tile_probe/fp8_tile_probe.cu says what each piece is):

  1. S = A·Bᵀ with wgmma from shared memory, against torch in float32;
  2. the same with A from registers in lib.fp8's fragment layout: the same bits as 1;
  3. O = P·V with P = e4m3(S) packed from each thread's own accumulators and Vᵀ stored with the
     keys of each k-step in lib.fp8.key_order(), against torch's e4m3 cast of the kernel's S
     times V in float32.

    python experiments/fp8_tile_probe/fp8_tile_probe.py     # needs an sm_90 GPU (H100/H200)
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np  # noqa: E402
import torch  # noqa: E402

from lib import fp8, nvrtc  # noqa: E402

SOURCE = Path(__file__).with_suffix(".cu")
E4M3 = torch.float8_e4m3fn


def compile_probe(arch: str = "sm_90a"):
    """The probe kernel for `arch` (no GPU needed); HEAD_DIM is required by attention.cuh only."""
    return nvrtc.compile_cuda(SOURCE.read_text(), arch=arch, name=SOURCE.name, defines={"HEAD_DIM": 64})


def inputs(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(64, 128, generator=g, device="cuda") * 0.5).to(E4M3)
    b = (torch.randn(64, 128, generator=g, device="cuda") * 0.5).to(E4M3)
    v = (torch.randn(64, 64, generator=g, device="cuda")).to(E4M3)  # 64 keys × 64 dims
    order = fp8.key_order()
    keys = [32 * (p // 32) + order[p % 32] for p in range(64)]  # the key at each k position
    vt = torch.zeros(64, 128, dtype=torch.uint8, device="cuda")  # Vᵀ: dims × keys, 128-byte rows
    vt[:, :64] = v.view(torch.uint8)[keys, :].T
    return a, b, v, vt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    a_ = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.exit(2, f"{ap.prog}: runs wgmma (sm_90a), so it needs an H100 or H200 and none was found\n")
    kern = nvrtc.load_kernel(compile_probe(nvrtc.gpu_arch(arch_specific=True)), "fp8_tile_probe",
                             max_dynamic_smem=3 * 64 * 128 + 1024)
    a, b, v, vt = inputs(a_.seed)
    s_ss, s_rs, o_pv = (torch.empty(64, 64, device="cuda") for _ in range(3))
    nvrtc.launch(kern, (1, 1, 1), (128, 1, 1), a.view(torch.uint8), b.view(torch.uint8), vt, s_ss, s_rs,
                 o_pv, smem=3 * 64 * 128 + 1024)
    torch.cuda.synchronize()
    s_ref = a.float() @ b.float().T
    o_ref = s_ss.to(E4M3).float() @ v.float()
    # The products of e4m3 values are exact in float32, but Hopper's FP8 tensor cores keep fewer
    # mantissa bits than float32 in their running sums: the first run of this probe (call 13,
    # results/logs/2026-11-25-8423a0d-call13) measured errors of 2^-11.4 to 2^-13.0 of the
    # largest value, where float32 sums of 128 terms would be near 2^-20. The checks allow 2^-10;
    # a layout error would be off by the size of the values themselves.
    s_err = float((s_ss - s_ref).abs().max()) / float(s_ref.abs().max())
    o_err = float((o_pv - o_ref).abs().max()) / float(o_ref.abs().max())
    checks = {
        "1. S, both operands from shared memory, against torch": s_err <= 2 ** -10,
        "2. S with A from registers (lib.fp8.a8_element), bit for bit as 1": bool(torch.equal(s_rs, s_ss)),
        "3. P·V, P packed in-thread (a8_sources), Vᵀ in key_order, against torch": o_err <= 2 ** -10,
    }
    print(f"max |S − torch| = 2^{np.log2(s_err):.1f} of max |S| ({float(s_ref.abs().max()):.1f}); "
          f"max |S_regs − S| {float((s_rs - s_ss).abs().max()):.2e}; "
          f"max |O − torch| = 2^{np.log2(o_err):.1f} of max |O| ({float(o_ref.abs().max()):.1f})")
    for name, ok in checks.items():
        print(f"{'pass' if ok else 'FAIL'}: {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
