"""Stage 8's dK/dV kernel with a producer warpgroup (PRODUCER) under compute-sanitizer: a few
calls at odd shapes (lengths no multiple of 64, Sq ≠ Sk, GQA, both causal alignments, a row of
many query blocks so that the rings and the mbarriers' phases wrap), both head dims, one and two
warpgroups that multiply, dQ in turns, and the variants; each checked against float64 autograd of
lib.reference (check_gradients). The pattern of experiments/model_variants/sanitize_backward.py.
Run on an H100/H200 as
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --kernel-name kns=attention_backward \
            python3 experiments/backward_producer/sanitize_producer.py || break
    done
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
import stages.stage6 as s6  # noqa: E402
import stages.stage8 as s8  # noqa: E402

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    sys.exit("needs an H100 or H200 and none was found")

CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, dtype, variants, stage 8's switches (producer=1 added)
    ((2, 4, 2, 300, 1000, 64), "bottom_right", torch.bfloat16, {}, {}),
    ((2, 4, 2, 1000, 300, 128), True, torch.float16, {}, {}),
    ((1, 8, 2, 333, 333, 128), False, torch.bfloat16, {}, {"warpgroups": 1}),
    ((2, 8, 4, 257, 700, 64), True, torch.float16, {}, {"warpgroups": 2}),
    ((1, 4, 1, 450, 200, 64), "bottom_right", torch.bfloat16, {}, {"warpgroups": 2, "dq_turns": 1}),
    ((1, 2, 2, 1500, 130, 128), "bottom_right", torch.bfloat16, {}, {}),  # 24 steps per key block
    ((2, 4, 2, 300, 500, 128), "bottom_right", torch.float16, {"window": (40, 0), "softcap": 5.0}, {}),
    ((1, 4, 2, 200, 450, 64), True, torch.bfloat16, {"window": (10, 3), "softcap": 30.0, "sinks": True}, {}),
]
for (B, H, Hkv, Sq, Sk, D), causal, dtype, opts, switches in CASES:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=Sq + Sk)
    if opts.get("sinks") is True:
        opts = {**opts, "sinks": torch.randn(H, device="cuda") + 2}
    if "softcap" in opts:
        q = (q.float() * 4).to(dtype)
    dout = torch.randn(q.shape, device="cuda", dtype=dtype)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device="cuda")
    out = s6.attention(q, k, v, causal=causal, lse=lse, **opts)
    grads = s8.attention_backward(q, k, v, out, dout, lse, causal=causal, producer=1, **opts, **switches)
    checks = check_gradients(grads, q, k, v, dout, causal=causal, **opts)
    for name, c in checks.items():
        assert c.passed, ((B, H, Hkv, Sq, Sk, D), causal, sorted(opts), switches, name, c.summary())
torch.cuda.synchronize()
print("stage 8 backward with a producer warpgroup: all match the reference")
