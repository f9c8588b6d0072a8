"""Stage 6 with the half last tile (HALF_LAST_TILE, session 37), once per launch path for
compute-sanitizer: D64 and D128, two and three consumers, persistent and not, the work queue,
causal in both alignments and not, lengths that end 1-64 keys into a tile, a split call. Each
result checked by the error rule."""
import torch
from lib.inputs import make_qkv
from lib.reference import check_output
from stages import stage6 as s6
ok = True
for D, tiles, schedule in [(64, (128, 4, 2), "work queue without ping-pong"), (64, (128, 2, 3), "+ persistent blocks"),
                           (128, (128, 2, 2), "+ work queue"), (128, (128, 2, 2), "+ intra-warpgroup overlap")]:
    for B, H, Sq, Sk, causal in [(2, 3, 300, 700, "bottom_right"), (2, 3, 515, 515, "top_left"), (1, 2, 257, 192, False),
                                 (1, 2, 1, 129, False)]:
        q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=1, dtype=torch.bfloat16)
        out = s6.attention(q, k, v, causal=causal, schedule=schedule, tiles=tiles, half_last=True, carry_pv=False)
        ok &= check_output(out, q, k, v, causal=causal).passed
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
