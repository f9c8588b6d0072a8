"""Stage 8's WGMMA build with its dQ product issued early (DQ_EARLY, session 36), beside the
stage's own build, once per launch path for compute-sanitizer: D64 and D128, fp16 and bf16, GQA 2,
both causal alignments and none, lengths that leave the last key block and query block partial.
(Every other switch ran clean in results/logs/2026-11-26-s35call12/calls.py.) Each result checked
by the error rule."""
import torch
from lib.inputs import make_qkv
from lib.reference import check_gradients
from stages import stage5, stage8
ok = True
for D, dt, causal in [(64, torch.float16, True), (128, torch.bfloat16, False), (64, torch.bfloat16, "bottom_right"),
                      (128, torch.float16, True)]:
    q, k, v = make_qkv(1, 4, 200, D, Sk=300, Hkv=2, dtype=dt)
    dout = torch.randn_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = stage5.attention(q, k, v, causal=causal, lse=lse)
    builds = [{"warpgroups": w, "dq_atomics": 1, "dq_bulk": b, "tma_loads": 1, "dq_early": 1}
              for w, b in ((1, 1), (2, 1), (2, 0))]
    for kw in [{}, {"dq_early": 1}, *builds]:
        grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, wgmma=1, **kw)
        ok &= all(c.passed for c in check_gradients(grads, q, k, v, dout, causal=causal).values())
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
