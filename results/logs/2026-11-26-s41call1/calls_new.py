"""The launch paths new in session 41, for compute-sanitizer, each output checked: the producer's
L2 prefetch (l2_ahead) on one and two blocks per SM, split and not, and on a prefill build; and
persistent blocks of one consumer two per SM (the work queue), unsplit over many work tiles with
the ring wrapping many times, and split with the combine in the last block and by the kernel."""
import torch
import stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import check_output
ok = True
queue2 = lambda D, **kw: dict(tiles=s6.DECODE_SHARED_TILES[D], schedule="work queue without ping-pong",  # noqa: E731
                              pack_gqa=True, blocks_per_sm=2, **kw)
for B, H, Hkv, Sq, Sk, D, dt, kw in [
        (40, 32, 8, 1, 3001, 128, torch.bfloat16, {"l2_ahead": 2}),                  # two blocks per SM, unsplit
        (28, 16, 4, 1, 2900, 64, torch.float16, {"l2_ahead": 4}),
        (1, 32, 8, 1, 4097, 64, torch.bfloat16, {"l2_ahead": 2}),                    # 16 splits, combined in the block
        (1, 8, 1, 1, 20000, 128, torch.float16, {"l2_ahead": 2}),                    # 128 splits, the combine kernel
        (3, 8, 8, 1, 1500, 64, torch.bfloat16, {"l2_ahead": 3}),                     # one block per SM, deeper ring
        (2, 50, 25, 500, 900, 64, torch.float16, {"l2_ahead": 2}),                   # prefill, persistent
        (40, 32, 8, 1, 3001, 128, torch.bfloat16, queue2(128)),                      # persistent, two per SM, unsplit
        (28, 16, 4, 1, 2900, 64, torch.float16, queue2(64, l2_ahead=2)),
        (1, 32, 8, 1, 4097, 64, torch.bfloat16, queue2(64, splits=16)),             # split, combined in the block
        (1, 8, 1, 1, 20000, 128, torch.float16, queue2(128, splits=128)),           # split, the combine kernel
        (3, 8, 1, 4, 1000, 128, torch.bfloat16, queue2(128, splits=3))]:             # Sq 4, odd split
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dt)
    c = check_output(s6.attention(q, k, v, **kw), q, k, v)
    ok &= c.passed
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
