"""Stage 6's model variants (issue 51): the arguments of attention(..., window=, softcap=, sinks=)
checked and turned into the kernel's compile-time switches and run-time arguments.

Each variant is a switch of stages/stage6.cu whose build without it is the kernel as it was:
- softcap c (Gemma 2's attn_logit_softcapping): the scaled scores s become c·tanh(s / c) before
  the mask. SOFTCAP=1 computes the tanh with tanh.approx.f32, SOFTCAP=2 from ex2 and rcp
  (softcap_build says which a call gets);
- window (left, right) (Mistral's, Gemma's and gpt-oss's sliding window; FlashAttention's
  window_size): query i, at key position i + Sk − Sq (aligned bottom-right, as decoding against a
  cache is), sees keys j with i + Sk − Sq − left <= j <= i + Sk − Sq + right; -1 leaves that side
  unbounded. transformers' sliding window of W keys is (W − 1, 0). With causal it is the
  intersection of the two masks (lib.reference.window_mask, causal_mask);
- sinks, float32 [H] (gpt-oss's s_aux): one logit per query head that joins each row's softmax
  denominator only, so the row's weights sum to less than one.
The float64 definitions are lib.reference.reference_attention's (tests/test_reference_variants.py
holds them against transformers' eager attention).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# SOFTCAP's tanh per dtype: 1 (tanh.approx.f32, one MUFU.TANH a score) or 2 (from ex2 and rcp, two
# MUFU a score). tanh.approx's relative error (up to 2^-11 by the PTX manual) becomes an error of up
# to c·2^-11 in the logit c·tanh(s/c), which at Gemma 2's c = 50 is 50 times fp16's rounding of P.
# Emulated on the CPU (the kernel's float32 softmax with each tanh off by a random ±2^-11, P rounded,
# judged by lib.reference.check_output; B2 H4/2 Sq200 Sk300 D64 bottom-right, q scaled for scores up
# to 15-50): fp16 failed the error rule at c = 5 (1.97e-3 against 1.60e-3) and c = 50 (1.95e-2
# against 7.2e-3), bf16 passed everywhere (its rounding is 8 times coarser); the ex2 form, whose t is
# within ~2^-22 of tanh, passed at both. So fp16 takes the ex2 form until tanh.approx's real
# errors are measured on the GPU (tests/test_stage6_variants.py compares both there); bf16 the
# approximation (FlashAttention-3's choice).
SOFTCAP_TANH = {torch.float16: 2, torch.bfloat16: 1}
SOFTCAP_TANH_NAMES = {"approx": 1, "exp2": 2}


@dataclass(frozen=True)
class Variants:
    """A call's variants, checked: softcap (float or None), window ((left, right) ints >= -1, not
    both -1, or None), sinks (whether a sinks tensor comes with the call) and the SOFTCAP build
    (0 without a softcap)."""

    softcap: float | None = None
    window: tuple[int, int] | None = None
    sinks: bool = False
    softcap_build: int = 0

    @property
    def any(self) -> bool:
        return self.softcap is not None or self.window is not None or self.sinks


NONE = Variants()


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_softcap(softcap) -> float | None:
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) \
            or not softcap > 0:
        raise ValueError(f"softcap must be a finite number > 0 (Gemma 2's attn_logit_softcapping, e.g. 50.0) "
                         f"or None; got {softcap!r}")
    return float(softcap)


def check_window(window) -> tuple[int, int] | None:
    """(left, right) as ints >= -1 (-1: that side unbounded); None, or (-1, -1), is no window."""
    if window is None:
        return None
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and all(_is_int(w) and w >= -1 for w in window)):
        raise ValueError(f"window must be a pair (left, right) of ints >= -1 (-1: unbounded on that side; "
                         f"transformers' sliding window of W keys is (W - 1, 0)) or None; got {window!r}")
    left, right = int(window[0]), int(window[1])
    return None if left < 0 and right < 0 else (left, right)


def check_sinks(sinks, q) -> bool:
    if sinks is None:
        return False
    H = q.shape[1] if isinstance(q, torch.Tensor) and q.dim() >= 2 else None
    if not (isinstance(sinks, torch.Tensor) and sinks.dtype == torch.float32 and sinks.dim() == 1
            and sinks.shape[0] == H and sinks.is_contiguous() and sinks.device == q.device):
        raise ValueError(f"sinks must be a contiguous float32 tensor of shape [H] = [{H}] (one logit per query "
                         f"head) on q's device {getattr(q, 'device', '-')}; got "
                         f"{getattr(sinks, 'dtype', type(sinks).__name__)} {tuple(getattr(sinks, 'shape', ()))}"
                         f"{' non-contiguous' if isinstance(sinks, torch.Tensor) and not sinks.is_contiguous() else ''}"
                         f" on {getattr(sinks, 'device', '-')}")
    if sinks.requires_grad:
        raise ValueError("sinks that require grad: stage 6 is the forward alone (the sinks' gradient is not computed)")
    return True


def softcap_build(dtype, softcap_tanh=None) -> int:
    """SOFTCAP for a call: SOFTCAP_TANH's rule per dtype, or `softcap_tanh` ("approx": 1, "exp2": 2)."""
    if softcap_tanh is None:
        return SOFTCAP_TANH.get(dtype, 2)
    if softcap_tanh not in SOFTCAP_TANH_NAMES:
        raise ValueError(f"softcap_tanh must be one of {list(SOFTCAP_TANH_NAMES)} or None (SOFTCAP_TANH's rule); "
                         f"got {softcap_tanh!r}")
    return SOFTCAP_TANH_NAMES[softcap_tanh]


def check_variants(q, *, window=None, softcap=None, sinks=None, softcap_tanh=None) -> Variants:
    """The variants of a call, checked (clear ValueErrors), or NONE when it has none."""
    cap = check_softcap(softcap)
    win = check_window(window)
    has_sinks = check_sinks(sinks, q)
    if softcap_tanh is not None and cap is None:
        raise ValueError("softcap_tanh chooses the softcap's tanh: give softcap too")
    build = softcap_build(getattr(q, "dtype", None), softcap_tanh) if cap is not None else 0
    if cap is None and win is None and not has_sinks:
        return NONE
    return Variants(softcap=cap, window=win, sinks=has_sinks, softcap_build=build)


def finite_window(window, Sq: int, Sk: int) -> tuple[int, int]:
    """The kernel's (win_left, win_right): a side left unbounded (-1) becomes one that reaches
    every key of every row (left Sk, right Sq: query i's window then starts at or before key 0 and
    ends at or past key Sk − 1), and a bounded side is clamped to the same, so that no position
    the kernel forms from them overflows."""
    left, right = window
    return (Sk if left < 0 else min(left, Sk)), (Sq if right < 0 else min(right, Sq))


def heavy(variants: Variants) -> bool:
    """Whether a call's variants add enough registers to the consumers' loop to make the tightest
    builds spill (experiments/model_variants/variant_builds.py, NVRTC 13.0's ptxas, every build the
    launcher runs): the softcap's ex2 form (SOFTCAP=2: two MUFU and two more values in flight a
    score), or all three variants at once."""
    return variants.softcap_build == 2 or (variants.softcap is not None and variants.window is not None
                                           and variants.sinks)


def variant_tiles(tiles, variants: Variants):
    """The tiles a call runs when its variants are heavy (heavy): D64's blocks of three consumers
    (160 registers each: 16-36 bytes spilled, inside the key-tile loop) take two (232-240), and
    D128's 176-key tiles (24-40 bytes) 128 keys, three stages (CHOICES; within the noise of the
    176-key tiles at full attention and faster causal, measured on the H100). Other tiles, and
    calls without heavy variants, keep theirs. The cost of the switch is the GPU session's to
    measure (experiments/model_variants/branch_notes.md)."""
    bn, stages, consumers = tiles
    if not heavy(variants):
        return tuple(tiles)
    if consumers == 3:
        return (bn, stages, 2)
    if bn == 176:
        return (128, 3, consumers)
    return tuple(tiles)
