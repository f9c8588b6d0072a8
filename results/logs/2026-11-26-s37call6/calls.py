"""Stage 7's quantization kernels (stages/stage7_quantize.cu, session 37), once per launch path
for compute-sanitizer: fp16 and bf16, D64 and D128, GQA, key lengths that are not a multiple of
32, one key, V transposed and not; each result compared with lib.fp8.prepare's bytes, then one
whole stage 7 call on them."""
import torch
from lib import fp8
from stages import stage7 as s7
ok = True
for D, dt in [(64, torch.float16), (128, torch.bfloat16)]:
    for B, H, Hk, Sq, Sk in [(2, 4, 2, 77, 300), (1, 2, 2, 1, 1)]:
        q, k, v = (torch.randn(B, h, s, D, device="cuda", dtype=dt) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
        ref = fp8.prepare(q, k, v)
        got = s7.quantize(q, k, v)
        ok &= torch.equal(got[2].view(torch.uint8), fp8.v_for_pv(ref[2]).view(torch.uint8))
        ok &= torch.equal(s7.quantize(q, k, v, v_transposed=False)[2].view(torch.uint8), ref[2].view(torch.uint8))
        ok &= bool(torch.isfinite(s7.attention(q, k, v, causal=True)).all())
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
