"""Stage 8's backward at head dims 96 and 256 (issue 51) beside SDPA's backward, same rounds.

D 256 has a build of its own (two warpgroups that share 64 keys and split D, both computing Sᵀ and
dPᵀ; dQ by its own pass: stages/stage8_wgmma.cu, "Head dim 256"), timed with and without OVERLAP.
D 96 runs D 128's build on zero-padded copies (stage8.PADDED); what the padding costs is read
against D 128 at the same shape. Gradients of every build are checked against float64 autograd
first (on a slice of the batch), then the full-size calls are timed in interleaved rounds.

    python3 experiments/backward_head_dims/probe.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from lib.reference import attention_flops, check_gradients  # noqa: E402
from lib.timing import sdpa_backward_call, time_interleaved  # noqa: E402
from stages import stage6, stage8  # noqa: E402

SHAPES = [(2, 16, 4096, 256), (8, 16, 1024, 256), (4, 16, 4096, 96), (4, 16, 4096, 128)]  # B, H, S, D
BUILDS = {256: {"as built": {}, "overlap=0": {"overlap": 0}}, 96: {"as built": {}}, 128: {"as built": {}}}


def forward(q, k, v, causal):
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    return stage6.attention(q, k, v, causal=causal, lse=lse), lse


def checked(q, k, v, dout, causal, kw) -> None:
    """The build's gradients on one batch entry and two heads, against float64 autograd."""
    small = [t[:1, :2].contiguous() for t in (q, k, v, dout)]
    out, lse = forward(*small[:3], causal)
    g = stage8.attention_backward(*small[:3], out, small[3], lse, causal=causal, **kw)
    bad = {n: c.summary() for n, c in check_gradients(g, *small[:3], small[3], causal=causal).items() if not c.passed}
    assert not bad, (q.shape, causal, kw, bad)


def main():
    print(f"{'shape':26s} {'build':10s} {'stage 8 µs':>11s} {'TFLOPS':>7s} {'SDPA µs':>9s} {'x SDPA':>7s} "
          f"{'FLASH µs':>9s} {'x FLASH':>8s}  rounds")
    for B, H, S, D in SHAPES:
        for causal in (False, True):
            q, k, v = make_qkv(B, H, S, D, dtype=torch.bfloat16)
            dout = torch.randn_like(q)
            out, lse = forward(q, k, v, causal)
            fns = {}
            for label, kw in BUILDS[D].items():
                checked(q, k, v, dout, causal, kw)
                fns[label] = lambda kw=kw: stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw)
            fns["sdpa"] = sdpa_backward_call(q, k, v, dout, causal=causal)
            fns["flash"] = sdpa_backward_call(q, k, v, dout, causal=causal, backend="flash")
            t = time_interleaved(fns, rounds=5, budget_s=1.0)
            flops = 2.5 * attention_flops(B, H, S, S, D, causal)
            sd = t["sdpa"].median_us if "sdpa" in t else float("nan")
            fl = t["flash"].median_us if "flash" in t else float("nan")
            for label in BUILDS[D]:
                us = t[label].median_us
                print(f"B{B} H{H} S{S} D{D} {'causal' if causal else 'full':6s} {label:10s} {us:11,.0f} "
                      f"{flops / us / 1e6:7.1f} {sd:9,.0f} {sd / us:7.3f} {fl:9,.0f} {fl / us:8.3f}  "
                      f"{[round(x) for x in t[label].round_medians_us]}", flush=True)
            del q, k, v, dout, out, lse, fns
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
