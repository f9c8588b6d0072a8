"""Stage 8 at head dims 256 and 96 under compute-sanitizer: D 256's build (two warpgroups reading
the same K, V, Q and dO tiles, TMA loads into two buffers, the dQ pass) at odd lengths, GQA,
causal both ways, with a window and softcap too; D 96 through D 128's build on padded copies.
Each result checked against float64 autograd. Run on an H100/H200 as
    compute-sanitizer --tool memcheck|racecheck|synccheck --kernel-name kns=attention \
        python3 experiments/backward_head_dims/sanitize.py
"""
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_gradients  # noqa: E402
from stages import stage6, stage8  # noqa: E402
from stages.stage6_variants import softcap_build  # noqa: E402

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    print("needs an H100 or H200 and none was found", file=sys.stderr)
    sys.exit(2)

CASES = [  # (B, H, Hkv, Sq, Sk, D), dtype, causal, variants
    ((2, 4, 2, 150, 97, 256), torch.bfloat16, False, {}),
    ((1, 4, 1, 200, 130, 256), torch.float16, "bottom_right", {}),
    ((1, 2, 2, 129, 129, 256), torch.bfloat16, True, {"window": (30, 0), "softcap": 20.0}),
    ((2, 4, 2, 77, 140, 96), torch.bfloat16, True, {}),
]

failed = 0
for (B, H, Hk, Sq, Sk, D), dtype, causal, kw in CASES:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dtype, seed=7)
    dout = torch.randn_like(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device="cuda")
    out = stage6.attention(q, k, v, causal=causal, lse=lse, **kw)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw)
    approx = "softcap" in kw and softcap_build(dtype, None) == 1  # the tanh.approx form, as the rule allows
    ok = all(c.passed for c in check_gradients(grads, q, k, v, dout, causal=causal, approx_tanh=approx, **kw).values())
    print((B, H, Hk, Sq, Sk, D), dtype, causal, kw, "passed" if ok else "FAILED", flush=True)
    failed += not ok
sys.exit(1 if failed else 0)
