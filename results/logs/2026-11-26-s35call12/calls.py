"""Stage 8's WGMMA build with each switch (warpgroups 1 or 2; dQ by its pass, by reductions or by
bulk reductions; Q, dO, lse and δ by cp.async or by TMA; at D 64 dQ in turns),
run once per launch path for compute-sanitizer: D64 and D128, fp16 and bf16, GQA 2, both causal
alignments and none, lengths that leave the last key block (128 keys) and query block partial
and walk several query blocks per key block. Each result checked by the error rule."""
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
    builds = [{"warpgroups": w, "dq_atomics": a, "dq_bulk": b, "tma_loads": t}
              for w, a, b, t in ((1, 0, 0, 0), (2, 0, 0, 0), (1, 1, 0, 0), (2, 1, 0, 0), (1, 1, 1, 0), (2, 1, 1, 0),
                                 (1, 0, 0, 1), (2, 1, 0, 1), (1, 1, 1, 1), (2, 1, 1, 1))]
    if D == 64:  # two warpgroups taking turns at dQ, with bulk and with vector reductions
        builds += [{"warpgroups": 2, "dq_atomics": 1, "dq_bulk": b, "tma_loads": 1, "dq_turns": 1} for b in (1, 0)]
    for kw in [{}, {"dq_atomics": 0}, *builds]:  # the stage's build, its deterministic dQ pass, each switch
        grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, wgmma=1, **kw)
        ok &= all(c.passed for c in check_gradients(grads, q, k, v, dout, causal=causal).values())
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
