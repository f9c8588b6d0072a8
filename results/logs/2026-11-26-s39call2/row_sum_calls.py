"""Stage 7's row sums by P·V (ROW_SUM_MMA) once per launch path, for compute-sanitizer: the
D64 default (now with them) and D128 asked for them, with the work queue (140 one-block work
tiles, more than the SMs; a K/V ring that wraps: 3 key tiles and a 1-key one; GQA), one block
per work tile with one consumer (few rows), V transposed in the kernel, and bottom-right rows
with no key (Sq > Sk); from bf16 inputs, each checked against lib.fp8's emulation of its own
build (stage7.emulation_of). Three queue calls in a row on one stream."""
import torch
from lib import fp8
from stages import stage7 as s7
ok = True
sms = torch.cuda.get_device_properties(0).multi_processor_count
for D, rs in ((64, None), (128, True)):
    bn = s7.TILES[D][0]
    for B, H, Hk, Sq, Sk, causal, opts in ((1, 140, 70, 64, 3 * bn + 1, False, {}),
                                            (1, 140, 70, 64, 3 * bn + 1, "bottom_right", {}),
                                            (1, 140, 70, 64, 3 * bn + 1, False, {}),
                                            (1, 2, 1, 77, 300, True, {}),
                                            (1, 4, 2, 200, 130, "bottom_right", {"v_in_kernel": True})):
        q, k, v = (torch.randn(B, h, s, D, device="cuda", dtype=torch.bfloat16) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
        out = s7.attention(q, k, v, causal=causal, row_sum_mma=rs, **opts)
        build = s7.emulation_of(B, H, Sq, Sk, D, bool(causal), sms, row_sum_mma=rs, **opts)
        ok &= build["sum_rounded"]
        ok &= fp8.check_on_emulation(out, *fp8.prepare(q, k, v), causal=causal, **build)["passed"]
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
