"""Training through the stages: a forward stage's kernel (stage 5 or 6) and stage 8's backward,
composed for torch.autograd.

The composition lives here, not in the stage files, so that each forward stage reads as one
kernel and its launcher, and no stage imports a stage above it: stages 5 and 6 are forwards
(they write the rows' log-sum-exp when asked), stage 8 is the backward and the
autograd.Function that saves what it needs (`stage8.with_grad`), and this module joins them.
FlashAttention is split the same way: kernels below, an interface whose autograd.Function calls
the forward and the backward.

    import stages.autograd as A
    out = A.attention(q, k, v, forward=6, causal=True)   # stage 6's forward ...
    out.backward(dout)                                     # ... and stage 8's backward

With forward 6 on an H100/H200 the backward's autograd node is C++ (stages/autograd_node.py,
built at first use from stages/stage8_node.cpp with the host's g++): no Python runs on the
autograd engine's thread, which at short shapes is most of a training step's host time. It
launches stage 8's own kernels (the same gradients, dK and dV the same bits). Elsewhere, for
what the node does not take (stage 6's options, other GPUs, other head dims, ...), and when
the extension cannot be built, the backward is stage 8's Python autograd.Function
(`stage8.with_grad`). FA_AUTOGRAD_NODE=0 in the environment forces the Python Function, to
measure one against the other; `stages.autograd_node.route(q, k, v, causal)` says which runs.

Packed sequences train through `attention_varlen`, one sequence at a time (its docstring says
what that costs).

Stage 6's model variants (window, softcap, softcap_tanh, sinks; issue 51) train too, with forward
6: the call goes to stage 8's Python Function (stage8.with_grad), never the C++ node, and stage
8's backward takes the same variants (its WGMMA build: an H100/H200); sinks that require grad get
their gradient. Packed sequences carry them per sequence.

Stage 8 takes every head dim stage 6's forward has: 64, 96 (in D 128's tiles), 128
and 256 (its WGMMA build only: elsewhere D256 with gradients is refused before the forward runs,
NoBackwardError naming the ones it has).
"""
from __future__ import annotations

import math
from functools import partial

import torch
from torch.autograd.function import once_differentiable

from lib.inputs import NoBackwardError, causal_from_mask, host_offsets, sdpa_causal, validate_varlen, wants_grad
from stages import autograd_node, stage5, stage6, stage8

FORWARDS = {5: stage5, 6: stage6}  # the stages whose forward writes the log-sum-exp stage 8 needs
# stage 6's model variants (issue 51), which stage 8's backward takes too (its WGMMA build: window
# and softcap; sinks, a host-side gradient, in either)
MODEL_VARIANTS = ("window", "softcap", "sinks")


def _split_variants(forward: int, options: dict) -> tuple[dict, dict]:
    """(the model variants among `options`, the other options); a forward without them refuses them."""
    variants = {n: options[n] for n in stage8.VARIANT_KEYWORDS if options.get(n) is not None}
    rest = {n: v for n, v in options.items() if n not in stage8.VARIANT_KEYWORDS}
    if variants and forward != 6:
        raise NotImplementedError(f"stage {forward}'s forward has no model variants ({', '.join(variants)}); "
                                  "forward=6 has them, with stage 8's backward")
    return variants, rest


def _sinks_want_grad(options: dict) -> bool:
    sinks = options.get("sinks")
    return torch.is_grad_enabled() and isinstance(sinks, torch.Tensor) and sinks.requires_grad


def _refuse_head_dims_without_backward(forward: int, q) -> None:
    """NoBackwardError, before the forward runs, for a head dim stage 8's backward has no build of
    here (D256 off an sm_90 GPU): the backward would otherwise fail only at loss.backward(), after
    the forward's cost. Not a tensor: the stage's own checks say what is wrong."""
    D = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() else None
    if D is None:
        return
    if D not in stage8.HEAD_DIMS or (D in stage8.WGMMA_ONLY and not stage8.wgmma_here()):
        here = [d for d in stage8.HEAD_DIMS if d not in stage8.WGMMA_ONLY or stage8.wgmma_here()]
        raise NoBackwardError(f"stage 8's backward takes head dims {', '.join(map(str, here))} on this GPU "
                              f"({', '.join(map(str, stage8.WGMMA_ONLY))} in its WGMMA build only: an sm_90 GPU); got {D}. "
                              f"Stage {forward}'s forward computes it without gradients (under "
                              "torch.no_grad() or torch.inference_mode()); to train at this head dim, use "
                              "PyTorch's attention (SDPA, or a Hugging Face model's attn_implementation='eager')")


def _check_deterministic(deterministic) -> None:
    """`deterministic` of the two entry points: a bool, or a clear error (stage 8 checks it again
    where its backward runs)."""
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")


def _forward_stage(forward: int):
    stage = FORWARDS.get(forward)
    if stage is None:
        raise ValueError(f"forward must be one of {sorted(FORWARDS)} (the stages whose forward saves "
                         f"the log-sum-exp stage 8's backward starts from), got {forward!r}")
    return stage


def attention(q, k, v, *, forward: int = 6, causal=False, scale=None, attn_mask=None, is_causal=None,
              enable_gqa=True, deterministic=False, **options):
    """F.scaled_dot_product_attention(q, k, v, ...) with gradients: stage `forward`'s kernel (6,
    Hopper; or 5, any GPU from sm_80) and, when grad mode is on and q, k or v requires grad, an
    output whose grad_fn runs stage 8's backward from the log-sum-exp the forward saved.
    Otherwise it is the forward stage's own call, at its own cost. `options` go to the forward
    (its measuring keywords: tiles, schedule, ...); `seqlens_k` has no backward (stage 8 takes
    every key of each entry) and is refused when gradients are asked for. With forward 6 and no
    options the grad_fn is stage 8's C++ node where it applies (the module docstring says when),
    else stage 8's Python autograd.Function. `deterministic=True`: a backward whose gradients are
    the same bits on every run (stage8.attention_backward's; the Python Function)."""
    stage = _forward_stage(forward)
    _check_deterministic(deterministic)
    causal = sdpa_causal(q, k, causal, is_causal, enable_gqa)
    if not (wants_grad(q, k, v) or _sinks_want_grad(options)):
        return stage.attention(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, **options)
    _refuse_head_dims_without_backward(forward, q)
    if options.get("seqlens_k") is not None:
        raise NoBackwardError(f"stage {forward} with seqlens_k (per-entry key lengths) has no backward "
                              "pass: stage 8 takes every key of each entry. Call it under "
                              "torch.no_grad() for inference, or without seqlens_k to train.")
    variants, options = _split_variants(forward, options)
    if attn_mask is not None:
        causal = causal_from_mask(causal, attn_mask, q, k, stage.INFO)
    if forward == 6 and not options and not variants and not deterministic:  # the C++ node where it applies
        out = autograd_node.attention(q, k, v, causal, scale)                  # (stages/autograd_node.py)
        if out is not None:
            return out
    # the model variants, a deterministic backward: stage 8's Python Function (the C++ node takes
    # the plain case only)
    forward_call = partial(stage.attention, **options) if options else stage.attention
    return stage8.with_grad(forward_call, q, k, v, causal=causal, scale=scale, deterministic=deterministic, **variants)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, forward: int = 6,
                     causal=False, scale=None, deterministic=False, **options):
    """Packed sequences (FlashAttention's flash_attn_varlen_func, as stage `forward`'s own
    attention_varlen takes them: q [total_q, H, D], k and v [total_k, H_kv, D], int32 offsets on
    q's device, causal False, "top_left" or "bottom_right" within each sequence) with gradients.

    Without gradients (grad mode off, or no input that requires grad) it is the forward stage's
    own attention_varlen: one launch for the whole batch, at its own cost; `options` go to it.

    With gradients, the output has a grad_fn whose backward is stage 8's, and this is NOT the
    fast path: it costs one forward launch group and one backward launch group PER SEQUENCE
    (correct, not fast; a varlen backward kernel, and a varlen forward that writes the
    log-sum-exp, are future work). Stage 8's kernels take no packed sequences, and neither stage's
    varlen build writes the log-sum-exp, so each sequence b runs as a batch of one:
      forward:  stage.attention on [1, H, S_b, D] views of the packed q, k, v (rows cu_seqlens[b]
                … of each, no copies: the views keep the packed tensors' strides) with `lse=` a
                slice of one float32 buffer, `options` passed to it; the outputs are then
                gathered into one [total_q, H, D] tensor (one copy);
      backward: stage8.attention_backward on the same views, that sequence's rows of the output,
                of the output's gradient and its log-sum-exp; each sequence's dq, dk, dv written
                into its own rows of the packed gradients (sequences never share rows, so
                nothing is summed across them).
    A sequence with no queries or no keys launches nothing: its rows of the output and of every
    gradient are zeros (rows that see no key, bottom-right with S_q > S_k, get zero output and
    zero gradient from the kernels themselves). The offsets are read on the host (one copy per
    call unless made by lib.inputs.offsets_tensor), so this path cannot be captured in a CUDA
    graph. `deterministic`: as attention's, for every sequence's backward."""
    stage = _forward_stage(forward)
    _check_deterministic(deterministic)
    if not (wants_grad(q, k, v) or _sinks_want_grad(options)):
        return stage.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      causal=causal, scale=scale, **options)
    _refuse_head_dims_without_backward(forward, q)
    variants, options = _split_variants(forward, options)  # each sequence's forward and backward take them
    # The stage's checks, on the tensors without their graph (the stage refuses grad itself).
    plain = [t.detach() if isinstance(t, torch.Tensor) else t for t in (q, k, v)]
    call = validate_varlen(*plain, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=causal, scale=scale, info=stage.INFO)
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        raise NoBackwardError("stages.autograd.attention_varlen with gradients runs one launch group "
                              "per sequence from offsets read on the host: it cannot be captured in a "
                              "CUDA graph. Capture the forward alone under torch.no_grad().")
    cq, ck = host_offsets(cu_seqlens_q), host_offsets(cu_seqlens_k)
    seqs = [(cq[b], cq[b + 1], ck[b], ck[b + 1]) for b in range(call.n_seqs)]
    sinks = variants.pop("sinks", None)
    return _PackedAttention.apply(q, k, v, sinks, stage, seqs, causal, scale, options, variants, deterministic)


def _seq(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows start … end − 1 of a packed [total, H, D] tensor as a [1, H, S, D] view (no copy)."""
    return t[start:end].unsqueeze(0).transpose(1, 2)


class _PackedAttention(torch.autograd.Function):
    """Packed sequences, each run alone: the stage's forward with lse, stage 8's backward. Stage
    6's model variants go to both per sequence (a window is bottom-right within each sequence, as
    stage 6's attention_varlen takes it); the sinks' gradient is the sum of the sequences'."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, stage, seqs, causal, scale, options, variants, deterministic):
        total_q, H, D = q.shape
        # one buffer for every row's log-sum-exp: sequence b's [1, H, S_b] is its slice
        lse = torch.full((H * total_q,), -math.inf, dtype=torch.float32, device=q.device)
        parts = []
        plain_sinks = None if sinks is None else sinks.detach()
        var_kw = {**variants, **({"sinks": plain_sinks} if sinks is not None else {})}
        for q0, q1, k0, k1 in seqs:
            if q1 == q0:
                continue
            if k1 == k0:  # queries without keys: zeros, as SDPA gives
                parts.append(torch.zeros((q1 - q0, H, D), dtype=q.dtype, device=q.device))
                continue
            o = stage.attention(_seq(q, q0, q1), _seq(k, k0, k1), _seq(v, k0, k1), causal=causal,
                                scale=scale, lse=lse[H * q0:H * q1].view(1, H, q1 - q0), **options, **var_kw)
            parts.append(o[0].transpose(0, 1))
        out = torch.cat(parts) if parts else torch.empty((0, H, D), dtype=q.dtype, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse, plain_sinks)
        ctx.seqs, ctx.causal, ctx.scale, ctx.variants, ctx.deterministic = seqs, causal, scale, variants, deterministic
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        H = q.shape[1]
        dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dk, dv = torch.zeros((2, *k.shape), dtype=q.dtype, device=q.device)
        dsinks = None if sinks is None else torch.zeros_like(sinks)
        var_kw = {**ctx.variants, **({"sinks": sinks} if sinks is not None else {})}
        for q0, q1, k0, k1 in ctx.seqs:
            if q1 == q0 or k1 == k0:
                continue  # nothing attended: zero gradients
            g = stage8.attention_backward(_seq(q, q0, q1), _seq(k, k0, k1), _seq(v, k0, k1), _seq(out, q0, q1),
                                          _seq(dout, q0, q1), lse[H * q0:H * q1].view(1, H, q1 - q0),
                                          causal=ctx.causal, scale=ctx.scale, deterministic=ctx.deterministic, **var_kw)
            for packed, one, (a, b) in zip((dq, dk, dv), g, ((q0, q1), (k0, k1), (k0, k1))):
                packed[a:b] = one[0].transpose(0, 1)
            if dsinks is not None:  # a sequence without keys has O = 0, δ = 0: no share
                dsinks += g[3]
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                dsinks if need[3] else None, None, None, None, None, None, None, None)
