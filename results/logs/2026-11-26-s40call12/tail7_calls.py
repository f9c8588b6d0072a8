"""Stage 7 on the work queue with the tail order (causal, both alignments, D64 and D128, GQA, the
ring wrapping many times), for compute-sanitizer; each output checked against the emulation."""
import torch
import stages.stage7 as s7
from lib import fp8
ok = True
g = torch.Generator().manual_seed(0)
for D, B, H, Hk, Sq, Sk in [(64, 2, 40, 8, 700, 700), (128, 2, 24, 24, 500, 900)]:
    q, k, v = (torch.randn(B, h, s, D, generator=g).to("cuda", torch.bfloat16) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
    for causal in (True, "bottom_right"):
        out = s7.attention(q, k, v, causal=causal, schedule="work queue without ping-pong", tail_waves=2)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        prepared = fp8.prepare(q, k, v)
        c = fp8.check_on_emulation(out, *prepared, causal=causal, **s7.emulation_of(B, H, Sq, Sk, D, bool(causal), sms,
                                                                                  schedule="work queue without ping-pong"))
        ok &= c["passed"]
torch.cuda.synchronize()
print("calls done,", "all passed" if ok else "A CHECK FAILED")
