"""EARLY_S's launch paths for compute-sanitizer: the work queue with and without ping-pong and
persistent blocks, D64 and D128, fp16 and bf16, two and three Q buffers, many work tiles per block
(the ring wrapping many times), rows without keys (bottom-right, Sq > Sk), a negative scale; each
output checked."""
import torch
import stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import check_output
ok = True
for B, H, Hkv, Sq, Sk, D, dt, kw in [
        (2, 70, 70, 400, 900, 64, torch.bfloat16, {"causal": True}),
        (2, 70, 35, 300, 700, 64, torch.float16, {"causal": "bottom_right", "schedule": "+ work queue", "tiles": (128, 2, 2)}),
        (2, 40, 40, 700, 129, 64, torch.bfloat16, {"causal": "bottom_right", "schedule": "work queue without ping-pong", "tiles": (128, 4, 2)}),
        (2, 70, 70, 300, 700, 128, torch.bfloat16, {"causal": True, "tiles": (128, 2, 2), "q_stages": 3}),
        (2, 60, 30, 500, 900, 128, torch.float16, {"schedule": "+ persistent blocks", "tiles": (128, 2, 2), "q_stages": 2}),
        (2, 50, 50, 333, 333, 64, torch.float16, {"causal": True, "scale": -0.1, "tiles": (128, 4, 2)})]:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dt)
    ref = {x: y for x, y in kw.items() if x in ("causal", "scale")}
    c = check_output(s6.attention(q, k, v, carry_pv=False, early_s=True, **kw), q, k, v, **ref)
    ok &= c.passed
    if not c.passed:
        print("FAILED", B, H, Hkv, Sq, Sk, D, dt, kw, c.summary())
torch.cuda.synchronize()
print("calls done,", "all passed" if ok else "A CHECK FAILED")
