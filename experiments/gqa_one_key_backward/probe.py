"""Issue 52: the backward at Sq 239, Sk 1 with grouped heads misses FlashAttention-3's precision
rule in dV. Where is dV rounded more than once? With one key every P is 1, so dV of a K/V head is
the sum of dO over the group's heads and queries: this prints, per build and input, the error of
stage 8's dV (and dK) in units of the output dtype's last place at the reference's magnitude,
beside FA3's allowance (2 × the error of the same math in the low-precision dtype + 2 × the
reference's rounding).

    python3 experiments/gqa_one_key_backward/probe.py
"""
import math
from functools import partial
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lib.inputs import make_qkv  # noqa: E402
from stages import autograd, stage6, stage8  # noqa: E402


def ref_attention(q, k, v, dtype, upcast):
    """FA3's attention_ref in spirit: K/V repeated over the group, in float32 (upcast) or in the
    inputs' dtype (the low-precision 'pt' baseline)."""
    if upcast:
        q, k, v = (t.float() for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    p = torch.softmax(s.float(), -1).to(v.dtype)
    return p @ v


def grads(fn, q, k, v, dout):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    fn(*leaves).backward(dout.to(leaves[0].dtype))
    return [t.grad for t in leaves]


def ulp(dtype, mag):
    return 2.0 ** math.floor(math.log2(mag)) * torch.finfo(dtype).eps


def fa3_layout():
    """FlashAttention-3's test_flash_attn_output as issue 52 ran it: q, k, v made as [B, S, H, D]
    leaves and passed as [B, H, S, D] views, the output's gradient drawn in [B, S, H, D]."""
    print(f"{'FA3 layout':44s} {'seed':>4s} {'dV err':>8s} {'pt err':>8s} {'allow':>8s} {'dK err':>8s} {'allow':>8s}")
    for D in (64, 128):
        for dtype in (torch.bfloat16, torch.float16):
            for H, Hk in ((6, 2), (6, 1), (6, 6)):
                for seed in range(4):
                    torch.manual_seed(seed)
                    B, Sq, Sk = 9, 239, 1
                    q, k, v = (torch.randn(B, S, h, D, device="cuda", dtype=dtype).requires_grad_()
                               for S, h in ((Sq, H), (Sk, Hk), (Sk, Hk)))
                    out = autograd.attention(*(t.transpose(1, 2) for t in (q, k, v)), forward=6).transpose(1, 2)
                    g = torch.randn_like(out)
                    got = torch.autograd.grad(out, (q, k, v), g)
                    tr = lambda f: (lambda a, b, c: f(a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2)).transpose(1, 2))  # noqa: E731
                    ref = torch.autograd.grad(tr(lambda *a: ref_attention(*a, dtype, True).to(dtype))(q, k, v), (q, k, v), g)
                    pt = torch.autograd.grad(tr(lambda *a: ref_attention(*a, dtype, False))(q, k, v), (q, k, v), g)
                    row = []
                    for i in (2, 1):
                        err = float((got[i].float() - ref[i].float()).abs().max())
                        pterr = float((pt[i].float() - ref[i].float()).abs().max())
                        atol = 2 * float((ref[i] + 0.3 - 0.3 - ref[i]).abs().max())
                        row += [err, pterr, 2 * pterr + atol]
                    flag = " FAIL" if row[0] > row[2] or row[3] > row[5] else ""
                    print(f"{'D%d %s H%d/%d Sq%d Sk%d' % (D, str(dtype)[6:], H, Hk, Sq, Sk):44s} {seed:4d} "
                          f"{row[0]:8.4f} {row[1]:8.4f} {row[2]:8.4f} {row[3]:8.4f} {row[5]:8.4f}{flag}")


def main():
    fa3_layout()
    torch.manual_seed(0)
    print(f"{'case':44s} {'build':22s} {'dV err':>8s} {'allow':>8s} {'ulps':>5s} {'dK err':>8s} {'allow':>8s}")
    for D in (64, 128):
        for dtype in (torch.bfloat16, torch.float16):
            for H, Hk, Sq, Sk in ((6, 2, 239, 1), (6, 1, 239, 1), (6, 6, 239, 1), (6, 2, 239, 2),
                                  (6, 2, 256, 1), (6, 2, 64, 1)):
                q, k, v = make_qkv(9, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dtype, device="cuda", seed=1)
                dout = torch.randn(q.shape, device="cuda", dtype=dtype)
                ref = grads(lambda *a: ref_attention(*a, dtype, True), q, k, v, dout.float())
                pt = grads(lambda *a: ref_attention(*a, dtype, False), q, k, v, dout)
                lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
                out = stage6.attention(q, k, v, lse=lse)
                lse64 = torch.logsumexp((q.double() @ k.double().repeat_interleave(H // Hk, 1)
                                         .transpose(-1, -2)) / math.sqrt(D), -1).float()
                builds = {"autograd stage6": lambda: grads(partial(autograd.attention, forward=6), q, k, v, dout),
                          "autograd stage5": lambda: grads(partial(autograd.attention, forward=5), q, k, v, dout),
                          "wgmma (default)": lambda: stage8.attention_backward(q, k, v, out, dout, lse),
                          "wgmma, exact lse": lambda: stage8.attention_backward(q, k, v, out, dout, lse64),
                          "mma.sync": lambda: stage8.attention_backward(q, k, v, out, dout, lse, wgmma=0),
                          "mma.sync dq pass": lambda: stage8.attention_backward(q, k, v, out, dout, lse, wgmma=0, dq_atomics=0)}
                case = f"D{D} {str(dtype)[6:]:8s} H{H}/{Hk} Sq{Sq} Sk{Sk}"
                for name, f in builds.items():
                    try:
                        g = f()
                    except Exception as e:  # noqa: BLE001  (a build that refuses the case)
                        print(f"{case:44s} {name:22s} {type(e).__name__}: {str(e)[:60]}")
                        continue
                    row = []
                    for i in (2, 1):
                        err = float((g[i].float() - ref[i]).abs().max())
                        atol = 2 * float((ref[i] + 0.3 - 0.3 - ref[i]).abs().max())
                        allow = 2 * float((pt[i].float() - ref[i]).abs().max()) + atol
                        row += [err, allow]
                    mag = float(ref[2].abs().max())
                    flag = " FAIL" if row[0] > row[1] or row[2] > row[3] else ""
                    print(f"{case:44s} {name:22s} {row[0]:8.4f} {row[1]:8.4f} {row[0] / ulp(dtype, mag):5.1f} "
                          f"{row[2]:8.4f} {row[3]:8.4f}{flag}")


if __name__ == "__main__":
    main()
