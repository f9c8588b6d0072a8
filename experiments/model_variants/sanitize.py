"""Stage 6's model variants under compute-sanitizer: a few calls with a window (narrower than a
tile, and cutting the first tiles of a block), softcap and sinks, prefill on the persistent and
queue launches (and on the launch a window that cuts key tiles gets by rule) and decoding split (the sink added by both combines), each checked against the
float64 reference. Run on an H100/H200 as
    compute-sanitizer --tool memcheck|racecheck|synccheck --kernel-name kns=attention \
        python3 experiments/model_variants/sanitize.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import check_output  # noqa: E402
import stages.stage6 as s6  # noqa: E402

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    sys.exit("needs an H100 or H200 and none was found")

CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, options
    ((2, 4, 2, 300, 1000, 64), "bottom_right", {"window": (5, 3)}),
    ((2, 4, 2, 1000, 300, 128), True, {"window": (200, 0), "softcap": 5.0}),
    ((4, 16, 4, 512, 512, 64), True, {"window": (63, 0), "sinks": True}),      # the work queue
    ((4, 16, 4, 512, 512, 128), False, {"window": (100, 100), "softcap": 5.0, "sinks": True}),  # persistent
    # the window's own launch (stage6.WINDOW_SCHEDULES: more work tiles than SMs, the window cuts key tiles)
    ((2, 16, 4, 1000, 1000, 128), True, {"window": (200, 0)}),                 # persistent, 128-key tiles, O by TMA
    ((3, 12, 12, 700, 2100, 64), "bottom_right", {"window": (300, 300), "sinks": True}),  # the work queue
    ((1, 32, 8, 1, 4097, 128), False, {"sinks": True, "window": (1023, 0)}),  # split, combined in the block
    ((1, 32, 8, 1, 4097, 64), False, {"sinks": True, "splits": 5, "combine_in_block": False}),  # the combine kernel
    ((1, 8, 1, 16, 3001, 64), "bottom_right", {"sinks": True, "softcap": 20.0, "splits": 4}),
]
for (B, H, Hkv, Sq, Sk, D), causal, opts in CASES:
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16, seed=Sq + Sk)
    if opts.get("sinks") is True:
        opts = {**opts, "sinks": torch.randn(H, device="cuda") + 2}
    if "softcap" in opts:
        q = q * 4
    out = s6.attention(q, k, v, causal=causal, **opts)
    ref = {n: opts[n] for n in ("window", "softcap", "sinks") if n in opts}
    c = check_output(out, q, k, v, causal=causal, **ref)
    assert c.passed, ((B, H, Hkv, Sq, Sk, D), causal, sorted(opts), c.summary())
torch.cuda.synchronize()
print("model-variant calls: all match the reference")
