"""Stage 8's preprocess before (adea0d9: a warp per row, 2-byte loads; preprocess_before.cu,
copied here) and now (D/8 threads per row, 16-byte loads), timed in the same interleaved rounds
at the two standard shapes (bf16, dQ zeroed too), after checking that both give the same δ,
lse·log2 e and zeros."""
import sys
from pathlib import Path
import numpy as np
import torch
from lib import nvrtc
from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage8

before_src = Path(__file__).with_name("preprocess_before.cu")
ok = True
for B, H, S, D in ((16, 16, 2048, 64), (4, 16, 8192, 128)):
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
    out, dout = torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(B, H, S, device="cuda")
    sq_pad = -(-S // 64) * 64
    rows = B * H * sq_pad
    old = nvrtc.stage_kernels(before_src, ("attention_backward_preprocess",), torch.bfloat16, D)["attention_backward_preprocess"]
    dq_old = torch.full((B, H, sq_pad, D), 7.0, device="cuda")
    d_old = torch.empty((B, H, sq_pad), device="cuda"); l_old = torch.empty_like(d_old)
    def run_old():
        nvrtc.launch_prepared(old, nvrtc.launch_config((-(-rows // 8), 1, 1), (256, 1, 1)),
                              (dout.data_ptr(), out.data_ptr(), lse.data_ptr(), d_old.data_ptr(), l_old.data_ptr(),
                               dq_old.data_ptr(), np.int32(S), np.int32(sq_pad), np.int32(H), np.int64(rows),
                               *nvrtc.layout_args(out), *nvrtc.layout_args(dout)))
    dq_new = torch.full((B, H, sq_pad, D), 7.0, device="cuda")
    run_new = lambda: stage8.preprocess(out, dout, lse, sq_pad, dq_new)  # noqa: E731
    run_old(); d_new, l_new = run_new(); torch.cuda.synchronize()
    same = (torch.allclose(d_old, d_new, rtol=1e-5, atol=1e-4) and torch.equal(l_old, l_new)
            and not dq_new.any().item() and not dq_old.any().item())
    ok &= same
    t = time_interleaved({"before": run_old, "now": run_new}, rounds=5, budget_s=1.0)
    moved = 2 * out.numel() * 2 + dq_new.numel() * 4 + 3 * rows * 4
    print(f"B{B} H{H} S{S} D{D}: before {t['before'].median_us:7.1f} us, now {t['now'].median_us:7.1f} us "
          f"({t['before'].median_us / t['now'].median_us:.2f}x); {moved / t['now'].median_us / 1e6:.2f} TB/s moved now; "
          f"same results: {same}", flush=True)
sys.exit(0 if ok else 1)
