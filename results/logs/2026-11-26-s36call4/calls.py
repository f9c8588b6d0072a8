"""Every launch path of stage 6 as in results/logs/2026-11-25-ab914da-call7/calls.py, plus two
blocks per SM (session 36): unsplit over many work tiles with the ring wrapping many times,
split with the combine in the last block and by the kernel, at D64 and D128, fp16 and bf16.
Each output checked."""
import torch
import stages.stage5 as s5
import stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import attention_lse, check_output
ok = True
for B, H, Hkv, Sq, Sk, D, dt, kw in [
        (2, 70, 35, 300, 700, 128, torch.bfloat16, {}),                                   # persistent, 128-key tiles, Q2, TMA store
        (2, 70, 70, 300, 700, 128, torch.float16, {"causal": "bottom_right"}),            # work queue with ping-pong
        (2, 50, 25, 500, 900, 64, torch.float16, {}),                                     # persistent D64 (192-row blocks)
        (2, 70, 70, 400, 900, 64, torch.bfloat16, {"causal": True}),                      # work queue without ping-pong, 128-row blocks
        (1, 8, 8, 512, 700, 64, torch.float16, {"causal": True}),                         # blocks of one consumer (few rows)
        (1, 32, 8, 1, 5000, 128, torch.bfloat16, {}),                                     # split-KV, packed, combined in the last block
        (1, 8, 1, 1, 20000, 128, torch.bfloat16, {}), (2, 5, 1, 3, 777, 64, torch.float16, {}),  # split-KV, combine kernel
        (2, 4, 2, 517, 1100, 64, torch.bfloat16, {"schedule": "softmax ping-pong"}),     # turns at the softmax
        (2, 4, 2, 517, 1100, 128, torch.bfloat16, {"causal": True, "schedule": "+ intra-warpgroup overlap"}),
        # the carried P·V
        (2, 50, 25, 500, 900, 64, torch.float16, {"carry_pv": True}),                    # persistent, 3 consumers, ping-pong
        (2, 70, 70, 300, 700, 128, torch.bfloat16, {"causal": "bottom_right", "carry_pv": True}),  # queue, ping-pong
        (2, 70, 70, 400, 900, 64, torch.bfloat16, {"causal": True, "carry_pv": True}),   # queue without ping-pong
        (2, 40, 40, 700, 129, 64, torch.float16, {"causal": "bottom_right", "carry_pv": True,
                                                  "schedule": "+ persistent blocks", "tiles": (128, 2, 3)}),  # rows without keys
        (2, 60, 30, 300, 700, 128, torch.float16, {"carry_pv": True, "tiles": (176, 2, 2)}),  # one Q buffer, plain stores
        # two blocks per SM (shares_sms' rule, or forced)
        (40, 32, 8, 1, 3001, 128, torch.bfloat16, {}),                                    # 320 work tiles unsplit, 47 key tiles
        (28, 16, 4, 1, 2900, 64, torch.float16, {}),                                      # 112 work tiles, ring wraps
        (1, 32, 8, 1, 4097, 64, torch.bfloat16, {"blocks_per_sm": 2}),                    # 16 splits, combined in the block
        (1, 8, 1, 1, 20000, 128, torch.float16, {"blocks_per_sm": 2}),                    # 128 splits, the combine kernel
        (3, 8, 1, 4, 1000, 128, torch.bfloat16, {"blocks_per_sm": 2, "splits": 3})]:      # Sq 4, odd split
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dt)
    kw_ref = {x: y for x, y in kw.items() if x == "causal"}
    c = check_output(s6.attention(q, k, v, **kw), q, k, v, **kw_ref)
    ok &= c.passed
# the log-sum-exp output
for B, H, Hkv, Sq, Sk, D, causal in [(1, 8, 8, 512, 512, 64, False), (2, 70, 35, 300, 700, 128, False),
                                     (2, 70, 70, 400, 900, 64, True), (3, 32, 8, 1, 4096, 128, False)]:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    c = check_output(s6.attention(q, k, v, causal=causal, lse=lse), q, k, v, causal=causal)
    want = attention_lse(q, k, causal=causal)
    ok &= c.passed and float((lse.double() - want).abs().max()) < 1e-4
# stage 5, most blocks without a key tile
for D in (64, 128):
    q, k, v = make_qkv(2, 4, 300, D, Sk=3, Hkv=1, dtype=torch.float16)
    c = check_output(s5.attention(q, k, v, causal="bottom_right"), q, k, v, causal="bottom_right")
    ok &= c.passed
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
