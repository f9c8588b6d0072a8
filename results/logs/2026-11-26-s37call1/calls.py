"""Stage 8's WGMMA build with three blocks per SM at D 64 (BLOCKS_PER_SM 3, without the overlap;
session 37), beside the stage's own build, once per launch path for compute-sanitizer: fp16 and
bf16, GQA 2, both causal alignments and none, lengths that leave the last key block and query
block partial. Each result checked by the error rule."""
import torch
from lib.inputs import make_qkv
from lib.reference import check_gradients
from stages import stage5, stage8
ok = True
for dt, causal in [(torch.float16, True), (torch.bfloat16, False), (torch.bfloat16, "bottom_right")]:
    q, k, v = make_qkv(1, 4, 200, 64, Sk=300, Hkv=2, dtype=dt)
    dout = torch.randn_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = stage5.attention(q, k, v, causal=causal, lse=lse)
    for kw in [{}, {"overlap": 0, "blocks_per_sm": 3}]:
        grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, wgmma=1, **kw)
        ok &= all(c.passed for c in check_gradients(grads, q, k, v, dout, causal=causal).values())
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
