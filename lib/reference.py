"""The reference attention and the error rule.

The reference upcasts q, k, v to float64 and computes softmax(q·kᵀ·scale)·v on the inputs'
own device, with SDPA's causal rule (query i sees keys j <= i, aligned top-left, also when
Sq != Sk). A stage's output passes when

    max|out - ref|  <=  2 · max|sdpa(q, k, v) - ref|  +  noise

where noise is the rounding of the output dtype at the output's magnitude (one unit in the
last place of max|ref|) plus the rounding of float32 accumulation, over a head dim in q·kᵀ
and over the keys in the softmax's sums and P·V ((sqrt(D) + sqrt(Sk)) float32 ulps at that
magnitude). It matters only for float32 outputs, where SDPA's own error is a few ulps and a
different summation order alone can exceed twice it: stage 0 summing 1,000 keys one by one
missed the rule with sqrt(D) alone by 2% (seen on the H100, float32, D 128, Sk 1000).
That is the form of FlashAttention's own tests (a kernel may be at most twice as wrong as a
baseline attention, both measured against a more precise reference), made stricter: the
baseline here is PyTorch's SDPA on the same inputs, and the reference is float64.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F


def causal_mask(sq: int, sk: int, device, causal=True) -> torch.Tensor:
    """True where query i may see key j: j <= i (top-left aligned, SDPA's is_causal), or with
    causal="bottom_right" j <= i + sk − sq (causal_lower_right)."""
    diagonal = sk - sq if causal == "bottom_right" else 0
    return torch.ones(sq, sk, dtype=torch.bool, device=device).tril(diagonal)


def window_mask(sq: int, sk: int, window, device) -> torch.Tensor:
    """True where query i may see key j under a sliding window (left, right), as FlashAttention
    takes it: query i sits at key position i + sk − sq (aligned bottom-right, so that decoding
    against a cache works) and sees keys j with i' − left <= j <= i' + right; a side of None (or
    negative) is unbounded. transformers' causal sliding window of W keys
    (masking_utils.sliding_window_overlay: kv_idx > q_idx − W) is window=(W − 1, 0)."""
    left, right = window
    pos = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left is not None and left >= 0:
        ok &= j >= pos - left
    if right is not None and right >= 0:
        ok &= j <= pos + right
    return ok


def reference_attention(q, k, v, *, causal=False, scale=None, dtype=torch.float64,
                        max_scores=1 << 27, window=None, softcap=None, sinks=None, round_p=None,
                        round_ds=None, round_tanh=None, shift_delta=None):
    """softmax(q·kᵀ·scale)·v computed in `dtype` (float64 by default) on upcast inputs.

    The models' variants, with transformers' eager attention as the definition:
    - window (left, right): keys outside it masked (window_mask), with or without `causal`;
    - softcap c > 0: the scaled scores become c·tanh(s / c) before the mask (Gemma 2's
      attn_logit_softcapping);
    - sinks, float [H]: one logit per query head that joins every row's softmax denominator and
      no numerator (gpt-oss: softmax over [scores, sink], the sink's column dropped), so a row's
      weights sum to less than 1; a row that sees no key gives 0 either way.
    round_p, if given, rounds P before P·V (variant_baseline: a 16-bit kernel's P); round_ds, the
    gradient of the scaled scores under autograd (a 16-bit kernel's dS before dS·K and dSᵀ·Q);
    round_tanh, the softcap's tanh (a kernel's tanh.approx: about 11 significant bits);
    shift_delta [B, H, Sq], what a kernel's δ = dO·O adds to autograd's (a kernel takes O in 16
    bits): dS = P ∘ (dP − δ) under autograd gets −shift·P.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be a positive number (or None); got {softcap!r}")
    q, k, v = (t.to(dtype) for t in (q, k, v))
    if k.shape[1] != q.shape[1]:  # grouped-query attention: share each K/V head
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    # In slices of heads so the score matrix stays near max_scores elements (1 GiB of float64)
    # at long sequences.
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    q, k, v = (t.reshape(B * H, t.shape[2], t.shape[3]) for t in (q, k, v))
    mask = causal_mask(Sq, Sk, q.device, causal) if causal else None
    if window is not None:
        w = window_mask(Sq, Sk, window, q.device)
        mask = w if mask is None else mask & w
    sink = None
    if sinks is not None:
        if sinks.shape != (H,):
            raise ValueError(f"sinks must have one logit per query head, shape ({H},); got {tuple(sinks.shape)}")
        sink = sinks.to(dtype).repeat(B)[:, None, None]  # (B·H, 1, 1), head-major within a batch
    out = torch.empty(B * H, Sq, v.shape[-1], dtype=dtype, device=q.device)
    step = max(1, max_scores // (Sq * Sk))
    for a in range(0, B * H, step):
        scores = (q[a:a + step] @ k[a:a + step].transpose(-1, -2)) * scale
        if round_ds is not None and scores.requires_grad:
            scores.register_hook(round_ds)
        if softcap is not None:
            t = torch.tanh(scores / softcap)
            scores = softcap * (t if round_tanh is None else round_tanh(t))
        if mask is not None:
            scores = scores.masked_fill(~mask, -math.inf)
        held = []  # P, for shift_delta's hook
        if shift_delta is not None and scores.requires_grad:
            shift = shift_delta.reshape(B * H, Sq)[a:a + step, :, None]
            scores.register_hook(lambda g, held=held, shift=shift: g - shift * held[0])
        if sink is None:
            # A row that sees no key (bottom-right, Sq > Sk) is 0, as SDPA gives, not softmax's NaN.
            p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        else:
            s_ = sink[a:a + step].expand(-1, Sq, 1)
            p = torch.softmax(torch.cat([scores, s_], dim=-1), dim=-1)[..., :-1]
        held.append(p.detach())
        if round_p is not None:
            p = round_p(p)
        out[a:a + step] = p @ v[a:a + step]
    return out.reshape(B, H, Sq, -1)


def sdpa_keywords(q, k, causal=False) -> dict:
    """SDPA's keywords for a stage's `causal` (False, True / "top_left": is_causal; "bottom_right":
    SDPA's causal_lower_right bias, or is_causal when Sq == Sk, where the two agree), with
    enable_gqa when k has fewer heads than q. Anything else is refused, not read as a bool."""
    kw = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    if causal not in (False, True, "top_left", "bottom_right"):
        raise ValueError(f"causal must be False, True, 'top_left' or 'bottom_right'; got {causal!r}")
    if causal == "bottom_right" and q.shape[2] != k.shape[2]:
        from torch.nn.attention.bias import causal_lower_right
        import warnings
        with warnings.catch_warnings():  # "will produce NaNs when Sq > Sk": SDPA gives zeros there
            warnings.simplefilter("ignore")
            kw["attn_mask"] = causal_lower_right(q.shape[2], k.shape[2])
    else:
        kw["is_causal"] = bool(causal)
    return kw


def sdpa(q, k, v, *, causal=False, scale=None):
    """PyTorch's own attention (its default backend choice) on the same inputs; `causal` as the
    stages take it (sdpa_keywords)."""
    return F.scaled_dot_product_attention(q, k, v, scale=scale, **sdpa_keywords(q, k, causal))


def dtype_noise(dtype: torch.dtype, magnitude: float, head_dim: int, keys: int = 0) -> float:
    """The rounding of the output dtype at `magnitude`, plus float32 accumulation over a
    head dim and over `keys` keys (every stage accumulates in float32)."""
    magnitude = max(magnitude, 2.0 ** -14)
    ulps = math.sqrt(head_dim) + math.sqrt(keys)
    return (torch.finfo(dtype).eps + ulps * torch.finfo(torch.float32).eps) * magnitude


@dataclass
class Check:
    """The verdict on one output, with the numbers behind it."""

    passed: bool
    max_abs_err: float        # max |out - ref|
    mean_abs_err: float       # mean |out - ref|
    sdpa_max_abs_err: float   # max |sdpa - ref|: how wrong PyTorch itself is here
    tolerance: float          # 2 * sdpa_max_abs_err + noise
    max_abs_diff_sdpa: float  # max |out - sdpa|
    mean_abs_diff_sdpa: float  # mean |out - sdpa|
    nonfinite: int            # NaN/Inf count in out (poisoned, unwritten elements show up here)

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        extra = f", {self.nonfinite} non-finite" if self.nonfinite else ""
        rel = "<=" if self.max_abs_err <= self.tolerance else ">"
        return (f"{verdict}: max|out-ref| {self.max_abs_err:.2e} {rel} {self.tolerance:.2e} "
                f"(2·max|sdpa-ref| + noise){extra}; vs SDPA max {self.max_abs_diff_sdpa:.2e}, "
                f"mean {self.mean_abs_diff_sdpa:.2e}")

    def as_dict(self) -> dict:
        return asdict(self)


def variant_baseline(q, k, v, dtype, *, causal=False, scale=None, window=None, softcap=None, sinks=None):
    """The baseline the error rule holds a model variant's output against (check_output), where
    SDPA cannot compute it: a 16-bit attention kernel's roundings, emulated (as lib.fp8's
    attention_16bit does for FP8's rule) — q, k, v in `dtype`, scores, softcap, mask, sinks and
    softmax in float32, P rounded to `dtype` before P·V, O written in `dtype`. A window alone
    goes to SDPA with its mask as a boolean attn_mask, as a PyTorch user would run it."""
    Sq, Sk = q.shape[2], k.shape[2]
    if softcap is None and sinks is None:
        allowed = window_mask(Sq, Sk, window, q.device)
        if causal:
            allowed &= causal_mask(Sq, Sk, q.device, causal)
        kw = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, **kw)
        return out.nan_to_num(0.0)  # rows that see no key: 0, as the reference gives
    qd, kd, vd = (t.to(dtype).float() for t in (q, k, v))
    out = reference_attention(qd, kd, vd, causal=causal, scale=scale, dtype=torch.float32, window=window,
                              softcap=softcap, sinks=None if sinks is None else sinks.float(),
                              round_p=lambda p: p.to(dtype).float())
    return out.to(dtype)


def check_output(out, q, k, v, *, causal=False, scale=None, sdpa_out=None, window=None, softcap=None,
                 sinks=None) -> Check:
    """Judge `out` against the float64 reference by the error rule (module docstring). With a
    model variant (window, softcap, sinks: reference_attention's), the baseline is SDPA where it
    can compute the variant and a 16-bit kernel's roundings where it cannot (variant_baseline)."""
    if out.shape != q.shape[:-1] + (v.shape[-1],):
        raise ValueError(f"output has shape {tuple(out.shape)}, expected "
                         f"{tuple(q.shape[:-1] + (v.shape[-1],))}")
    if window is not None or softcap is not None or sinks is not None:
        ref = reference_attention(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks)
        base = sdpa_out if sdpa_out is not None else variant_baseline(
            q, k, v, out.dtype, causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks)
        return judge(out, ref, base, dtype_noise(out.dtype, float(ref.abs().max()), q.shape[-1], k.shape[-2]))
    ref = reference_attention(q, k, v, causal=causal, scale=scale)
    if sdpa_out is None:
        sdpa_out = sdpa(q, k, v, causal=causal, scale=scale)
    if not bool(torch.isfinite(sdpa_out).all()) and bool(torch.isfinite(ref).all()):
        # SDPA's default backend can return NaN where attention is finite (seen: cuDNN on an
        # H100 with a negative scale); then bound the error by SDPA's math backend instead.
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            sdpa_out = sdpa(q, k, v, causal=causal, scale=scale)
    noise = dtype_noise(out.dtype, float(ref.abs().max()), q.shape[-1], k.shape[-2])
    return judge(out, ref, sdpa_out, noise)


def judge(got, ref, baseline, noise: float) -> Check:
    """The error rule on one tensor: `got` against the float64 `ref`, with tolerance
    2·max|baseline − ref| + noise (`baseline`: SDPA's result on the same inputs). A non-finite
    element fails; an empty tensor passes with zero errors."""
    g64, b64 = got.to(torch.float64), baseline.to(torch.float64)
    finite = torch.isfinite(g64)
    nonfinite = int((~finite).sum())
    err, diff = (g64 - ref).abs(), (g64 - b64).abs()

    def largest(t):
        return math.inf if nonfinite else (float(t.max()) if t.numel() else 0.0)

    def mean(t):
        return math.inf if nonfinite == t.numel() > 0 else (float(t[finite].mean()) if t.numel() else 0.0)

    sdpa_err = float((b64 - ref).abs().max()) if ref.numel() else 0.0
    tolerance = 2.0 * sdpa_err + noise
    max_err = largest(err)
    return Check(passed=nonfinite == 0 and max_err <= tolerance, max_abs_err=max_err,
                 mean_abs_err=mean(err), sdpa_max_abs_err=sdpa_err, tolerance=tolerance,
                 max_abs_diff_sdpa=largest(diff), mean_abs_diff_sdpa=mean(diff), nonfinite=nonfinite)


def check_attention(attention, B, H, Sq, Sk, D, *, dtype, causal=False, Hkv=None) -> Check:
    """Run `attention` once on fresh random inputs with a NaN-poisoned output and judge it:
    the one correctness check the benchmark, the notebooks and --check share. Hkv < H makes
    grouped-query inputs."""
    from lib.inputs import make_qkv, poisoned_outputs
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype)
    with poisoned_outputs():
        out = attention(q, k, v, causal=causal)
    return check_output(out, q, k, v, causal=causal)


def packed_inputs(lens_q, lens_k, H, Hk, D, *, dtype, device, seed=None):
    """Random packed sequences for a varlen call: q [Σ lens_q, H, D], k and v [Σ lens_k, Hk, D]
    and their int32 offsets cu_q, cu_k (fresh unless a seed is given)."""
    from lib.inputs import fresh_seed
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    q = torch.randn(sum(lens_q), H, D, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(sum(lens_k), Hk, D, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(sum(lens_k), Hk, D, generator=gen).to(device=device, dtype=dtype)
    cu = [torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=device)
          for lens in (lens_q, lens_k)]
    return q, k, v, cu[0], cu[1]


def reference_varlen(q, k, v, cu_q, cu_k, **kw) -> torch.Tensor:
    """reference_attention for packed sequences (q [Σ Sq, H, D], k and v [Σ Sk, Hkv, D], int32
    offsets cu_q, cu_k), each sequence alone, `kw` passed on (causal, scale, window, softcap,
    sinks); rows of a sequence without keys are zeros. In q's dtype."""
    out = torch.zeros_like(q)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        qs = q[cq[b]:cq[b + 1]].transpose(0, 1)[None]
        ks, vs = (t[ck[b]:ck[b + 1]].transpose(0, 1)[None] for t in (k, v))
        if qs.shape[2] and ks.shape[2]:
            out[cq[b]:cq[b + 1]] = reference_attention(qs, ks, vs, **kw)[0].transpose(0, 1).to(q.dtype)
    return out


def check_varlen_output(out, q, k, v, cu_q, cu_k, *, causal=False, scale=None, **variants) -> list[Check]:
    """Judge a varlen output sequence by sequence, each against the float64 reference of that
    sequence alone (the error rule above; `variants`, window= softcap= sinks=, as check_output
    takes them: a window aligned to the sequence's own last query and key); a sequence with
    queries but no keys must be zeros (SDPA's answer there). One Check per sequence with queries."""
    if out.shape != q.shape:
        raise ValueError(f"output has shape {tuple(out.shape)}, expected {tuple(q.shape)}")
    cq, ck = cu_q.tolist(), cu_k.tolist()
    checks = []
    for b in range(len(cq) - 1):
        qs, os_ = q[cq[b]:cq[b + 1]], out[cq[b]:cq[b + 1]]
        ks, vs = k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        if qs.shape[0] == 0:
            continue
        if ks.shape[0] == 0:
            bad = int((os_ != 0).sum())
            checks.append(Check(bad == 0, float(os_.abs().max()), float(os_.abs().mean()), 0.0, 0.0,
                                float(os_.abs().max()), float(os_.abs().mean()),
                                int((~torch.isfinite(os_)).sum())))
            continue
        as4 = [t.transpose(0, 1)[None] for t in (qs, ks, vs)]  # [1, H, S, D]
        checks.append(check_output(os_.transpose(0, 1)[None], *as4, causal=causal, scale=scale, **variants))
    return checks


def check_varlen(attention_varlen, lens_q, lens_k, H, Hk, D, *, dtype, causal=False) -> Check:
    """Run `attention_varlen` once on fresh packed sequences with a NaN-poisoned output; the
    worst sequence's Check (the check --check and compute-sanitizer run on the varlen path)."""
    from lib.inputs import poisoned_outputs
    q, k, v, cu_q, cu_k = packed_inputs(lens_q, lens_k, H, Hk, D, dtype=dtype, device="cuda")
    with poisoned_outputs():
        out = attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    checks = check_varlen_output(out, q, k, v, cu_q, cu_k, causal=causal)
    failed = [c for c in checks if not c.passed]
    return (failed or sorted(checks, key=lambda c: c.max_abs_err))[-1]


def attention_flops(B, H, Sq, Sk, D, causal=False) -> float:
    """FLOPs of one forward: two matmuls of 2·Sq·Sk·D each per head, halved for causal
    (the FlashAttention convention, also for Sq != Sk)."""
    flops = 4.0 * B * H * Sq * Sk * D
    return flops / 2 if causal else flops


def visible_scores(S: int, left: int) -> int:
    """Keys each of S rows sees under causal attention with a window of `left` keys before the
    diagonal (bottom-right, Sq = Sk): row i sees min(i, left) + 1; their sum."""
    full = min(S, left + 1)
    return full * (full + 1) // 2 + (S - full) * (left + 1)


def attention_min_bytes(B, H, Sq, Sk, D, itemsize, Hkv=None) -> float:
    """The fewest bytes a forward must move through device memory: read q, k, v once,
    write o once."""
    Hkv = H if Hkv is None else Hkv
    return float(itemsize) * (2 * B * H * Sq * D + 2 * B * Hkv * Sk * D)


def compulsory_intensity(B, H, S, D, causal, itemsize=2) -> float:
    """FLOPs ÷ the bytes any forward must move (q, k, v read once, o written once)."""
    return attention_flops(B, H, S, S, D, causal) / attention_min_bytes(B, H, S, S, D, itemsize)


def stage1_intensity(B, H, S, D, causal, itemsize=2) -> float | None:
    """FLOPs ÷ (compulsory bytes + stage 1's S and P round trips), or None without stage 1.
    S and P are written in full; with the causal mask they are read up to the diagonal only."""
    import stages
    if 1 not in stages.NUMBERS:
        return None
    ws = stages.get(1).workspace_bytes
    trips = (1 + 0.5) if causal else (1 + 1)
    nbytes = attention_min_bytes(B, H, S, S, D, itemsize) + trips * ws(B, H, S, S)
    return attention_flops(B, H, S, S, D, causal) / nbytes


# --------------------------------------------------------------------------------------------
# The backward pass (issue 23, stage 8): the float64 reference, and FlashAttention-2's
# algorithm written out in PyTorch, block by block — the model a backward kernel follows, and
# checked against the reference here before any kernel exists.

def reference_backward(q, k, v, dout, *, causal=False, scale=None, window=None, softcap=None, sinks=None):
    """(dq, dk, dv) of the reference attention in float64, by autograd: dk and dv of a K/V head
    summed over the query heads that share it (GQA). With `sinks`, (dq, dk, dv, dsinks)."""
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
    s64 = None if sinks is None else sinks.detach().to(torch.float64).requires_grad_(True)
    reference_attention(q64, k64, v64, causal=causal, scale=scale, window=window, softcap=softcap,
                        sinks=s64).backward(dout.to(torch.float64))
    return (q64.grad, k64.grad, v64.grad) + (() if s64 is None else (s64.grad,))


def sdpa_backward(q, k, v, dout, *, causal=False, scale=None):
    """(dq, dk, dv) of PyTorch's SDPA (default backend) by autograd, in the inputs' dtype; its
    math backend where the default gives non-finite gradients."""
    def grads():
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            sdpa(qg, kg, vg, causal=causal, scale=scale).backward(dout)
        return qg.grad, kg.grad, vg.grad
    got = grads()
    if not all(bool(torch.isfinite(g).all()) for g in got):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            got = grads()
    return got


def variant_backward_baseline(q, k, v, dout, dtype, *, causal=False, scale=None, window=None, softcap=None,
                              sinks=None, approx_tanh=False):
    """The baseline gradients of a model variant where SDPA cannot compute them (check_gradients):
    autograd through variant_baseline's 16-bit kernel emulation (q, k, v and dout rounded to
    `dtype`, float32 math, P rounded to `dtype` before P·V, δ from the 16-bit output, dS rounded
    before dS·K and dSᵀ·Q), each gradient rounded to `dtype`
    (dsinks kept float32). (dq, dk, dv) and, with sinks, dsinks. approx_tanh: the softcap's tanh
    rounded to 11 significant bits (float16's), the precision of the tanh.approx.f32 a kernel's
    SOFTCAP 1 build uses (2^-10.99 relative); at a cap of 30 that moves a logit by up to 0.015,
    several times bfloat16's rounding of P."""
    leaves = [t.detach().to(dtype).float().requires_grad_(True) for t in (q, k, v)]
    s32 = None if sinks is None else sinks.detach().float().requires_grad_(True)
    d16 = dout.to(dtype).float()
    with torch.no_grad():  # a kernel's δ = dO·O from its 16-bit O; autograd's is dO·(P·V), P unrounded
        args = dict(causal=causal, scale=scale, dtype=torch.float32, window=window, softcap=softcap,
                    sinks=None if s32 is None else s32.detach())
        o16 = reference_attention(*leaves, **args, round_p=lambda p: p.to(dtype).float()).to(dtype).float()
        shift = (d16 * (o16 - reference_attention(*leaves, **args))).sum(-1)
    with torch.enable_grad():
        out = reference_attention(*leaves, causal=causal, scale=scale, dtype=torch.float32, window=window,
                                  softcap=softcap, sinks=s32, round_p=lambda p: p + (p.to(dtype).float() - p).detach(),
                                  round_ds=lambda g: g.to(dtype).float(),
                                  round_tanh=(lambda t: t + (t.to(torch.float16).float() - t).detach()) if approx_tanh else None,
                                  shift_delta=shift)
        out.backward(d16)
    if s32 is None:
        return tuple(t.grad.to(dtype) for t in leaves)
    # dsinks as a kernel gets it (stages/stage8_variants.sinks_gradient): −Σ_rows p_sink·δ with δ
    # from the 16-bit output, p_sink = 1 − the row's weights (V a column of ones)
    with torch.no_grad():
        ones = torch.ones((*k.shape[:3], 1), dtype=torch.float32, device=k.device)
        p_sink = 1.0 - reference_attention(*(t.detach() for t in leaves[:2]), ones, causal=causal, scale=scale,
                                           dtype=torch.float32, window=window, softcap=softcap,
                                           sinks=s32.detach())[..., 0]
        delta = (dout.to(dtype).float() * out.to(dtype).float()).sum(-1)
        dsinks = -(p_sink * delta).sum(dim=(0, 2))
    return tuple(t.grad.to(dtype) for t in leaves) + (dsinks,)


def check_gradients(grads, q, k, v, dout, *, causal=False, scale=None, window=None, softcap=None,
                    sinks=None, approx_tanh=False) -> dict:
    """Judge (dq, dk, dv) by the error rule of the module docstring, gradient by gradient:
    at most twice SDPA's own gradient error against float64 autograd of the reference, plus
    the dtype's rounding at the gradient's magnitude (with float32 sums over the keys for dq and
    the queries for dk and dv). dS = P ∘ (dP − δ) subtracts two float32 sums of D products that
    cancel where a row's P is concentrated (one visible key: dP = δ exactly): their rounding,
    float32 eps at |dO|·|V|·√D, reaches dq through scale·K (P sums to 1 over a row's keys) and
    dk through scale·Q over the queries (√Sq, as a random walk); that is added to the noise.
    Returns {"dq": Check, "dk": Check, "dv": Check}.
    With a model variant (window, softcap, sinks: reference_attention's) the reference is float64
    autograd through it and the baseline variant_backward_baseline (a 16-bit kernel's roundings
    emulated; SDPA has no softcap or sinks); with sinks and `grads` (dq, dk, dv, dsinks) the
    result has "dsinks" too, its noise float32's rounding of a sum over the B·Sq rows. approx_tanh:
    the kernel's softcap used tanh.approx (SOFTCAP 1), whose rounding the baseline then has too."""
    variants = window is not None or softcap is not None or sinks is not None
    kw = dict(window=window, softcap=softcap, sinks=sinks) if variants else {}
    want = reference_backward(q, k, v, dout, causal=causal, scale=scale, **kw)
    if variants:
        base = variant_backward_baseline(q, k, v, dout, grads[0].dtype, causal=causal, scale=scale, **kw,
                                         approx_tanh=approx_tanh)
    else:
        base = sdpa_backward(q, k, v, dout, causal=causal, scale=scale)
    sums = {"dq": k.shape[2], "dk": q.shape[2], "dv": q.shape[2]}
    amax = (lambda t: float(t.abs().max()) if t.numel() else 0.0)
    sc = abs(1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale))
    dp = torch.finfo(torch.float32).eps * amax(dout) * amax(v) * math.sqrt(q.shape[-1])
    cancel = {"dq": dp * sc * amax(k), "dk": dp * sc * amax(q) * math.sqrt(q.shape[2]), "dv": 0.0}
    out = {}
    for name, got, ref, sd in zip(("dq", "dk", "dv"), grads, want, base):
        if got.shape != ref.shape:
            raise ValueError(f"{name} has shape {tuple(got.shape)}, expected {tuple(ref.shape)}")
        noise = dtype_noise(got.dtype, amax(ref), q.shape[-1], sums[name]) + cancel[name]
        out[name] = judge(got, ref, sd, noise)
    if sinks is not None and len(grads) > 3:  # (dq, dk, dv) alone: dsinks not judged
        got, ref, sd = grads[3], want[3], base[3]
        # dσ_h = −Σ_rows p_sink·δ, δ = dO·O with O the kernel's 16-bit output (the baseline rounds O
        # the same way, so its error holds most of it): each product dO_d·O_d off by up to the
        # dtype's rounding of O_d, summed as a random walk over D and the rows, weighted by the row's
        # p_sink (1 − the row's weights: the reference with V a column of ones); float32 sums
        o64 = reference_attention(q, k, v, causal=causal, scale=scale, **kw)
        ones = torch.ones((*k.shape[:3], 1), dtype=torch.float64, device=k.device)
        p_sink = 1.0 - reference_attention(q, k, ones, causal=causal, scale=scale, **kw)[..., 0]
        walk = (p_sink * (dout.to(torch.float64) * o64).norm(dim=-1)).square().sum(dim=(0, 2)).sqrt()
        rows = q.shape[0] * q.shape[2]
        noise = (torch.finfo(grads[0].dtype).eps * float(walk.max())
                 + torch.finfo(torch.float32).eps * math.sqrt(rows * q.shape[-1]) * amax(ref))
        out["dsinks"] = judge(got, ref, sd, noise)
    return out


def fa3_gradient_rule(grads, q, k, v, dout, *, causal=False, scale=None) -> dict:
    """FlashAttention-3's own precision rule for gradients (hopper/test_flash_attn.py), beside
    this curriculum's float64 rule (check_gradients): a gradient's max error against a float32
    reference on the same inputs, rounded once to the inputs' dtype, must be at most twice the
    error of the same math done in that dtype (K/V repeated over the group, products and the
    group's sum in 16 bits) plus twice the reference's rounding at its magnitude
    ((ref + 0.3 − 0.3 − ref).abs().max()). Returns {"dq"|"dk"|"dv": (error, allowance)}."""
    def autograd(dtype):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            out = reference_attention(*leaves, causal=causal, scale=scale, dtype=dtype)
            return torch.autograd.grad(out.to(q.dtype), leaves, dout)
    ref, low = autograd(torch.float32), autograd(q.dtype)  # both gradients in q's dtype
    out = {}
    for name, got, r, lo in zip(("dq", "dk", "dv"), grads, ref, low):
        if not r.numel():
            out[name] = (0.0, 0.0)
            continue
        # FA3's rounding term, (ref + 0.3 − 0.3 − ref) in the gradient's dtype, each step in
        # float32 and rounded, as CUDA's elementwise kernels do (CPU ones round 0.3 first)
        dt, t = r.dtype, r.float()
        step = (lambda a: a.to(dt).float())  # noqa: E731
        atol = 2 * float(step(step(step(t + 0.3) - 0.3) - t).abs().max())
        err = float((got.float() - r.float()).abs().max())
        out[name] = (err, 2 * float((lo.float() - r.float()).abs().max()) + atol)
    return out


def attention_lse(q, k, *, causal=False, scale=None, dtype=torch.float64):
    """Each query row's log-sum-exp of its scaled, masked scores (natural log; −inf for a row
    that sees no key): what a forward keeps for the backward (FlashAttention's softmax_lse)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k = q.to(dtype), k.to(dtype)
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device, causal), -math.inf)
    return torch.logsumexp(s, dim=-1)


def flash_backward(q, k, v, out, dout, lse, *, causal=False, scale=None, block_m=64, block_n=64,
                   dtype=torch.float32):
    """FlashAttention-2's backward, block by block, in `dtype`: D = rowsum(dO ∘ O); then for each
    block of keys (the outer loop: its dK and dV stay in one place, as a kernel keeps them in
    registers) and each block of queries (skipped where causal masking hides it whole), recompute
    S = scale·Q·Kᵀ and P = exp(S − lse) from the saved log-sum-exp, and accumulate
        dV += Pᵀ·dO,   dP = dO·Vᵀ,   dS = P ∘ (dP − D),   dK += scale·dSᵀ·Q,   dQ += scale·dS·K
    — dQ across key blocks, which a kernel does with fp32 atomics or in a pass of its own. GQA:
    a K/V head's dK and dV add up over its group of query heads. Returns (dq, dk, dv) in `dtype`."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    q, k, v, out, dout = (t.to(dtype) for t in (q, k, v, out, dout))
    lse = lse.to(dtype)
    B, H, Sq, _ = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    group = H // Hk
    visible = causal_mask(Sq, Sk, q.device, causal) if causal else None
    delta = (dout * out).sum(-1)                        # D, one number per query row
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j0 in range(0, Sk, block_n):
        j1 = min(j0 + block_n, Sk)
        for h in range(H):
            kj, vj = k[:, h // group, j0:j1], v[:, h // group, j0:j1]
            for i0 in range(0, Sq, block_m):
                i1 = min(i0 + block_m, Sq)
                if causal and not visible[i0:i1, j0:j1].any():
                    continue  # every key of the block lies past every row's diagonal
                qi, doi = q[:, h, i0:i1], dout[:, h, i0:i1]
                s = (qi @ kj.transpose(-1, -2)) * scale
                if causal:
                    s = s.masked_fill(~visible[i0:i1, j0:j1], -math.inf)
                # exp(−inf − (−inf)) would be NaN for a row that sees no key: its P is 0
                lse_i = lse[:, h, i0:i1, None]
                p = torch.where(torch.isinf(lse_i), torch.zeros_like(s), torch.exp(s - lse_i))
                dv[:, h // group, j0:j1] += p.transpose(-1, -2) @ doi
                dp = doi @ vj.transpose(-1, -2)
                ds = p * (dp - delta[:, h, i0:i1, None])
                dk[:, h // group, j0:j1] += scale * ds.transpose(-1, -2) @ qi
                dq[:, h, i0:i1] += scale * ds @ kj
    return dq, dk, dv
