"""Stage 7 with wider key tiles (160, 192, 224: Vᵀ in sub-tiles of 32, 64 and 128 keys), once per
launch path for compute-sanitizer: small shapes whose K/V ring wraps (3 key tiles and a 1-key
one through 2 or 3 stages), GQA, causal bottom-right, one block per work tile and persistent
blocks walking several; each result checked against lib.fp8's emulation, its running max moved
at the kernel's key tiles (call 1's copy of this script moved it every 128 keys)."""
import torch
from lib import fp8
from stages import stage7 as s7
ok = True
for D, tiles in [(64, (160, 3, 3)), (128, (224, 2, 2)), (128, (192, 2, 2))]:
    bn = tiles[0]
    for H, Sq, schedule in ((4, 150, None), (140, 64, "+ persistent blocks")):
        q, k, v = (torch.randn(1, h, s, D, device="cuda", dtype=torch.bfloat16)
                   for h, s in ((H, Sq), (H // 2, 3 * bn + 1), (H // 2, 3 * bn + 1)))
        for causal in (False, "bottom_right"):
            out = s7.attention(q, k, v, causal=causal, tiles=tiles, schedule=schedule)
            ok &= fp8.check_on_emulation(out, *fp8.prepare(q, k, v), causal=causal, key_tile=bn)["passed"]
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
