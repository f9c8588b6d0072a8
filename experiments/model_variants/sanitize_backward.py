"""Stage 8's backward with stage 6's model variants (branch bwd-variants) under compute-sanitizer:
a few calls with a window (narrower than a tile, one side only, skipping whole query blocks and key
tiles), softcap (both tanh forms) and sinks, through the stage's Hopper build, the dQ pass
(dq_atomics=0) and the vector reductions (dq_bulk=0), each checked against float64 autograd of
lib.reference (check_gradients). Run on an H100/H200 as
    for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --kernel-name kns=attention_backward \
            python3 experiments/model_variants/sanitize_backward.py || break
    done
(`--switch=NAME=VALUE`, repeated: the cases on the Hopper build with those switches of stage 8.)
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

CASES = [  # (B, H, Hkv, Sq, Sk, D), causal, dtype, variants, stage 8's switches
    ((2, 4, 2, 300, 1000, 64), "bottom_right", torch.bfloat16, {"window": (5, 3)}, {}),
    ((2, 4, 2, 1000, 300, 128), True, torch.float16, {"window": (200, 0), "softcap": 5.0}, {}),
    ((2, 8, 2, 333, 333, 128), False, torch.float16, {"window": (40, 40), "softcap": 30.0}, {}),  # dq_bulk=0 (the rule)
    ((2, 8, 4, 512, 512, 64), True, torch.bfloat16, {"window": (63, 0), "sinks": True}, {}),
    ((1, 4, 4, 257, 700, 128), False, torch.bfloat16, {"window": (-1, 20), "softcap": 20.0, "sinks": True}, {}),
    ((1, 4, 2, 200, 450, 64), "bottom_right", torch.float16, {"softcap": 30.0, "sinks": True}, {}),
    ((2, 4, 2, 300, 500, 64), "bottom_right", torch.bfloat16, {"window": (10, 0), "softcap": 5.0},
     {"dq_atomics": 0}),  # the dQ pass: its key tiles from j0
    ((1, 8, 2, 400, 260, 128), "bottom_right", torch.bfloat16, {"window": (30, 2), "sinks": True},
     {"dq_atomics": 0}),
]


def run(cases, done: str, **always) -> None:
    """Each case's backward (with `always`'s switches too) against float64 autograd; asserts."""
    for (B, H, Hkv, Sq, Sk, D), causal, dtype, opts, switches in cases:
        q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=Sq + Sk)
        if opts.get("sinks") is True:
            opts = {**opts, "sinks": torch.randn(H, device="cuda") + 2}
        if "softcap" in opts:
            q = (q.float() * 4).to(dtype)
        dout = torch.randn(q.shape, device="cuda", dtype=dtype)
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device="cuda")
        out = s6.attention(q, k, v, causal=causal, lse=lse, **opts)
        grads = s8.attention_backward(q, k, v, out, dout, lse, causal=causal, **always, **opts, **switches)
        checks = check_gradients(grads, q, k, v, dout, causal=causal, **opts)
        for name, c in checks.items():
            assert c.passed, ((B, H, Hkv, Sq, Sk, D), causal, sorted(opts), switches, name, c.summary())
    torch.cuda.synchronize()
    print(done)


if __name__ == "__main__":
    # --switch NAME=VALUE (repeatable): these cases again with a build's switches, e.g. a new
    # switch of stage 8 under the sanitizers without a case list of its own
    switches = {}
    for arg in sys.argv[1:]:
        name, _, value = arg.removeprefix("--switch=").partition("=")
        if not arg.startswith("--switch=") or not value.isdigit():
            sys.exit(f"usage: {sys.argv[0]} [--switch=NAME=VALUE ...], got {arg!r}")
        switches[name] = int(value)
    run(CASES, f"stage 8 backward{f' with {switches}' if switches else ''} model-variant calls: all match the reference",
        **({"wgmma": 1, **switches} if switches else {}))
