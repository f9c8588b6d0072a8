"""Session 41's blocks of one warpgroup without a producer (schedule "no warp specialization"),
2-4 per SM, packed decoding, for compute-sanitizer: unsplit with the ring wrapping many times,
split with the combine in the last block and by the kernel, Sq 4, odd key counts. Each output checked."""
import torch
import stages.stage6 as s6
from lib.inputs import make_qkv
from lib.reference import check_output
ok = True
nows = lambda tiles, blocks, **kw: dict(tiles=tiles, schedule="no warp specialization", pack_gqa=True,  # noqa: E731
                                        blocks_per_sm=blocks, **kw)
for B, H, Hkv, Sq, Sk, D, dt, kw in [
        (40, 32, 8, 1, 3001, 64, torch.bfloat16, nows((64, 2, 1), 4)),
        (28, 16, 4, 1, 2900, 64, torch.float16, nows((128, 2, 1), 3)),
        (40, 32, 8, 1, 3001, 128, torch.bfloat16, nows((64, 2, 1), 2)),
        (1, 32, 8, 1, 4097, 64, torch.bfloat16, nows((64, 2, 1), 4, splits=16)),    # combined in the block
        (1, 8, 1, 1, 20000, 128, torch.float16, nows((64, 2, 1), 2, splits=128)),   # the combine kernel
        (3, 8, 1, 4, 1000, 64, torch.bfloat16, nows((64, 2, 1), 4, splits=3))]:     # Sq 4, odd split
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dt)
    c = check_output(s6.attention(q, k, v, **kw), q, k, v)
    ok &= c.passed
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
