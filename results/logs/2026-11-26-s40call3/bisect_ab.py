"""Call 2 measured the new epilogue (stmatrix, and O zeroed only where rows see no key) at
0.994-0.996x of the sources before it at D64 causal S 512-1024 and 1.007-1.013x at D64 full S 512,
D128 causal S 512. Which half: the sources before (/tmp/before), the zeroing alone
(/tmp/zeroonly: stage6_zero_o_only.patch, the old 4-byte stores kept) and both (the tree), each
against `before` in pairs in both orders; outputs compared bit for bit."""
import importlib.util
import sys

import torch

from lib.inputs import make_qkv
from lib.timing import time_interleaved
from stages import stage6 as both


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


mods = {"before": load("stage6_before", "/tmp/before/stage6_before.py"),
        "zero_o only": load("stage6_zeroonly", "/tmp/zeroonly/stage6_zeroonly.py"), "both": both}
for B, H, Hk, S, D, causal in [(32, 16, 16, 512, 64, True), (32, 16, 4, 512, 64, True), (16, 16, 16, 1024, 64, True),
                               (16, 16, 4, 1024, 64, True), (32, 16, 16, 512, 64, False), (32, 32, 32, 512, 128, True)]:
    q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16, Hkv=Hk)
    fns = {n: (lambda m=m: m.attention(q, k, v, causal=causal)) for n, m in mods.items()}
    ref = fns["before"]()
    same = all(torch.equal(ref, f()) for f in fns.values())
    for other in ("zero_o only", "both"):
        for order in (("before", other), (other, "before")):
            t = time_interleaved({n: fns[n] for n in order}, budget_s=0.4)
            a, b = t["before"], t[other]
            rounds = ", ".join(f"{x / y:.3f}" for x, y in zip(a.round_medians_us, b.round_medians_us))
            print(f"B{B} H{H}/{Hk} S{S} D{D} {'causal' if causal else 'full'} {other}, {order[0]} first: before "
                  f"{a.median_us:,.1f} µs, {other} {b.median_us:,.1f} µs: {a.median_us / b.median_us:.3f}x "
                  f"(rounds {rounds}); same bits {same}", flush=True)
