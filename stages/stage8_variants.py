"""Stage 8's side of stage 6's model variants (issue 51, branch bwd-variants): the backward's
arguments checked, the variant builds' switches and scalar arguments, and the sinks' gradient,
which the host computes from the forward's log-sum-exp and the preprocess's δ. The kernels'
side, and the math, are in stages/stage8_wgmma.cu (SOFTCAP, WINDOW); stages/stage8.py calls these."""
from __future__ import annotations

import math

import numpy as np
import torch

from stages.stage6_variants import NONE as NO_VARIANTS, Variants, check_softcap, check_window, finite_window, \
    softcap_build


def check_backward_variants(q, window, softcap, sinks, softcap_tanh) -> Variants:
    """The variants of a backward call, checked as stage 6 checks them (the sinks may require grad:
    this is their gradient)."""
    cap, win = check_softcap(softcap), check_window(window)
    if sinks is not None:
        H = q.shape[1] if isinstance(q, torch.Tensor) and q.dim() == 4 else None
        if not (isinstance(sinks, torch.Tensor) and sinks.dtype == torch.float32 and tuple(sinks.shape) == (H,)
                and sinks.device == getattr(q, "device", None)):
            raise ValueError(f"sinks must be a float32 tensor of shape [H] = [{H}] on q's device; got "
                             f"{getattr(sinks, 'dtype', type(sinks).__name__)} {tuple(getattr(sinks, 'shape', ()))}")
    if softcap_tanh is not None and cap is None:
        raise ValueError("softcap_tanh chooses the softcap's tanh: give softcap too")
    if cap is None and win is None and sinks is None:
        return NO_VARIANTS
    return Variants(softcap=cap, window=win, sinks=sinks is not None,
                    softcap_build=softcap_build(getattr(q, "dtype", None), softcap_tanh) if cap is not None else 0)


def sinks_gradient(sinks: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """dσ_h = −Σ_(b, rows) exp(σ_h − lse_row)·δ_row: the sink's weight in each row's softmax times
    the row's −δ = −rowsum(dO ∘ O) (the sink has no value, so its dP is 0 and its dS is −p·δ).
    lse [B, H, Sq] (the forward's, which includes the sink), δ [B, H, Sq] float32; float32 [H].
    On the host's side of the kernels: a few torch ops over B·H·Sq numbers."""
    if lse.numel() == 0:
        return torch.zeros_like(sinks, dtype=torch.float32)
    p_sink = torch.exp(sinks.detach().float()[None, :, None] - lse.float())
    return -(p_sink * delta.float()).sum(dim=(0, 2))


def variant_switches(head_dim: int, variants: Variants) -> dict:
    """The WGMMA build's switches a call's variants change (unless the call names dq_atomics or
    dq_bulk): at D 128 the softcap's ex2 form (SOFTCAP 2, fp16's) with a window spills 36 bytes in
    the stage's build (NVRTC 13.0's ptxas, 255 registers, experiments/model_variants/
    sass_digest_backward.py --variants); with dQ summed by vector reductions instead of bulk
    ones (dq_bulk=0) it spills none. Every other variant build is the stage's own. The cost of
    the switch is the GPU session's to measure. With the producer warpgroup (the stage's build
    since ffe4adc) D 128's softcap with a window spilled 8 bytes in tanh.approx's form too
    (test_variant_builds_compile_without_spills): both run the build before the producer there.
    With the dSᵀ store's guard (DS_GUARD, the stage's build since 4b7e999) tanh.approx's form with a
    window spilled 44 bytes in that build too, and none with dq_bulk=0: both forms take it. With
    DK_LAST (D 128's build since it was measured in experiments/backward_dk_last) D 96's softcap with a
    window spilled 4 bytes in the ex2 form: that build keeps dK's product before dQ's."""
    if head_dim == 128 and variants.softcap_build and variants.window is not None:
        return {"producer": 0, "dq_bulk": 0}
    if head_dim == 96 and variants.softcap_build and variants.window is not None:
        # D 96 in D 128's tiles: that build spilled 4-8 bytes there (its window mask beside fewer
        # k-steps), none without the overlap too
        return {"producer": 0, "dq_bulk": 0, "overlap": 0, "dk_last": 0}
    return {}


def variant_args(variants: Variants, scale: float, Sq: int, Sk: int) -> tuple:
    """The variant builds' VARIANT_PARAMS (stages/stage8_wgmma.cu): cap_mul = scale / c (times
    2·log2 e for the ex2 tanh, SOFTCAP 2), so that t = tanh(q·k·scale / c) keeps the score's sign
    at any scale's; cap_log2 = c·log2 e; the window made finite (stage6_variants.finite_window;
    no window: every key)."""
    if variants.softcap is None:
        mul, cap_log2 = 1.0, 1.0  # unread
    else:
        c = variants.softcap
        mul = scale / c * (2 * math.log2(math.e) if variants.softcap_build == 2 else 1.0)
        cap_log2 = c * math.log2(math.e)
    left, right = finite_window(variants.window, Sq, Sk) if variants.window is not None else (Sk, Sq)
    return np.float32(mul), np.float32(cap_log2), np.int32(left), np.int32(right)
