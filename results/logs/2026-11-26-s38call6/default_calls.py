"""Stage 7's default launches where the rule picks persistent blocks (now the work queue without
ping-pong, PERSISTENT_SCHEDULE), once per launch path for compute-sanitizer: 140 one-block work
tiles (more than the SMs), a K/V ring that wraps (3 key tiles and a 1-key one), GQA, full and
causal bottom-right, D64 (128-key tiles) and D128 (192-key tiles), from bf16 inputs (the
quantization's two launches included); each checked against lib.fp8's emulation at the kernel's
key tiles. Three calls in a row on one stream: the queue's counter must be back at zero."""
import torch
from lib import fp8
from stages import stage7 as s7
ok = True
sms = torch.cuda.get_device_properties(0).multi_processor_count
for D in (64, 128):
    bn = s7.TILES[D][0]
    q, k, v = (torch.randn(1, h, s, D, device="cuda", dtype=torch.bfloat16)
               for h, s in ((140, 64), (70, 3 * bn + 1), (70, 3 * bn + 1)))
    for causal in (False, "bottom_right", False):
        ch = s7.choose(1, 140, 64, 3 * bn + 1, D, bool(causal), sms)
        ok &= ch["schedule"] == s7.PERSISTENT_SCHEDULE and ch["tiles"][0] == bn
        out = s7.attention(q, k, v, causal=causal)
        ok &= fp8.check_on_emulation(out, *fp8.prepare(q, k, v), causal=causal, key_tile=bn)["passed"]
torch.cuda.synchronize(); print("calls done, all passed" if ok else "calls done, A CHECK FAILED")
