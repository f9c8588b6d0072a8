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
"""
from __future__ import annotations

from functools import partial

import torch

from lib.inputs import NoBackwardError, causal_from_mask, sdpa_causal
from stages import stage5, stage6, stage8

FORWARDS = {5: stage5, 6: stage6}  # the stages whose forward writes the log-sum-exp stage 8 needs


def attention(q, k, v, *, forward: int = 6, causal=False, scale=None, attn_mask=None, is_causal=None,
              enable_gqa=True, **options):
    """F.scaled_dot_product_attention(q, k, v, ...) with gradients: stage `forward`'s kernel (6,
    Hopper; or 5, any GPU from sm_80) and, when grad mode is on and q, k or v requires grad, an
    output whose grad_fn runs stage 8's backward from the log-sum-exp the forward saved.
    Otherwise it is the forward stage's own call, at its own cost. `options` go to the forward
    (its measuring keywords: tiles, schedule, ...); `seqlens_k` has no backward (stage 8 takes
    every key of each entry) and is refused when gradients are asked for."""
    stage = FORWARDS.get(forward)
    if stage is None:
        raise ValueError(f"forward must be one of {sorted(FORWARDS)} (the stages whose forward saves "
                         f"the log-sum-exp stage 8's backward starts from), got {forward!r}")
    causal = sdpa_causal(q, k, causal, is_causal, enable_gqa)
    if not (torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v))):
        return stage.attention(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask, **options)
    if options.get("seqlens_k") is not None:
        raise NoBackwardError(f"stage {forward} with seqlens_k (per-entry key lengths) has no backward "
                              "pass: stage 8 takes every key of each entry. Call it under "
                              "torch.no_grad() for inference, or without seqlens_k to train.")
    if attn_mask is not None:
        causal = causal_from_mask(causal, attn_mask, q, k, stage.INFO)
    return stage8.with_grad(partial(stage.attention, **options), q, k, v, causal=causal, scale=scale)
