"""Stage 6's default launch where few_keys_per_block takes blocks without a producer (D64, one
or two key tiles a block), for compute-sanitizer, with what else those calls may ask for: the
log-sum-exp output (stage 8's forward), per-entry key lengths, both causal alignments, Sq 4,
a key count that is not a multiple of the tile, and the combine kernel. Each output checked."""
import torch
import stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import attention_lse, check_output
ok = True
for B, H, Hkv, Sq, Sk, D, dt, kw in [
        (1, 32, 8, 1, 4000, 64, torch.bfloat16, {}),                   # 32 key tiles (the last partial), 16 splits of 2
        (8, 8, 1, 1, 1000, 64, torch.float16, {}),                     # splits of one tile, combined in the block
        (3, 8, 1, 4, 200, 64, torch.bfloat16, {"causal": True}),       # unsplit, two tiles, causal
        (3, 8, 1, 4, 200, 64, torch.bfloat16, {"causal": "bottom_right"}),
        (1, 16, 1, 4, 30000, 64, torch.float16, {})]:                  # 64 rows x 128 splits: the combine kernel
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dt)
    assert s6.choose(B, H, Hkv, Sq, Sk, D, bool(kw.get("causal")), 132)["schedule"] == s6.FEW_KEYS_SCHEDULE
    c = check_output(s6.attention(q, k, v, **kw), q, k, v, **kw)
    ok &= c.passed
# the log-sum-exp (one block per row's keys) and per-entry key lengths
q, k, v = make_qkv(4, 16, 1, 64, Sk=250, Hkv=2, dtype=torch.bfloat16)
lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
c = check_output(s6.attention(q, k, v, lse=lse), q, k, v)
ok &= c.passed and float((lse.double() - attention_lse(q, k)).abs().max()) < 1e-4
used = torch.tensor([250, 1, 0, 129], dtype=torch.int32, device="cuda")
out = s6.attention(q, k, v, seqlens_k=used)
for b in range(4):
    n = int(used[b])
    if n:
        ok &= check_output(out[b:b + 1], q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n]).passed
    else:
        ok &= bool((out[b] == 0).all())
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
