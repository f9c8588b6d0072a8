"""Inputs: what a stage declares it supports, the one validation every stage calls, random
inputs for checks and timings, and output allocation (poisoned with NaN while checking).

Validation order: first whether this machine can run the stage at all (a GPU of the compute
capability it needs) and whether the tensors are where it runs, so that a learner on a laptop
hears "needs a GPU" once rather than after fixing each other problem; then Python types, ranks,
dtypes, shapes, strides and alignment, causal and scale, and what this stage supports.
`validate(..., check_device=False)` skips the first part, so that every other check can be
exercised on a machine without a GPU.
"""
from __future__ import annotations

import contextlib
import functools
import math
import numbers
import os
import random
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lib import simulator

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
               torch.float64: "float64", torch.float8_e4m3fn: "float8_e4m3fn"}


class GPUTooOldError(NotImplementedError):
    """The stage uses instructions this GPU does not have."""


class NoBackwardError(RuntimeError):
    """An input requires grad, grad mode is on, and the stage has no backward: raised instead
    of returning an output without a grad_fn, whose gradient would silently leave attention
    out (a RuntimeError, as autograd's own errors are)."""


def sdpa_causal(q, k, causal, is_causal=None, enable_gqa=True):
    """SDPA's own keywords, so that a call ported from F.scaled_dot_product_attention runs as
    it is: `is_causal` is SDPA's name for causal=True (give one of the two), and
    enable_gqa=False refuses K/V with fewer heads than Q, as SDPA does (every stage takes
    GQA, so True changes nothing). Returns the causal setting to use."""
    if is_causal is None and enable_gqa:
        return causal  # the common call: nothing to map
    if is_causal is not None:
        if causal is not False and bool(causal) != bool(is_causal):
            raise ValueError(f"causal={causal!r} and is_causal={is_causal!r} disagree: give one of them")
        causal = bool(is_causal) if causal is False else causal
    if not enable_gqa and getattr(q, "dim", lambda: 0)() == 4 and getattr(k, "dim", lambda: 0)() == 4 \
            and q.shape[1] != k.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads and k {k.shape[1]}: with enable_gqa=False they must "
                         "match, as in F.scaled_dot_product_attention (every stage takes GQA: pass "
                         "enable_gqa=True)")
    return causal


def wants_grad(q, k, v) -> bool:
    """Whether autograd would need a backward of this call: grad mode on and q, k or v requiring
    grad. Cheap (three attribute reads): launchers ask it on every call."""
    return torch.is_grad_enabled() and (getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
                                        or getattr(v, "requires_grad", False))


def refuse_grad(info: "StageInfo", q, k, v) -> None:
    """Raise NoBackwardError when grad mode is on and q, k or v requires grad. Cheap (three
    attribute reads): the launchers call it on every call, cached plans included."""
    if wants_grad(q, k, v):
        names = [n for n, t in (("q", q), ("k", k), ("v", v)) if getattr(t, "requires_grad", False)]
        # A stage whose forward saves the log-sum-exp has a backward (stage 8's), composed with
        # it outside the stage (stages/autograd.py): attention, and attention_varlen for packed
        # sequences (one sequence at a time).
        packed = getattr(q, "dim", lambda: 4)() == 3
        if info.saves_lse and not packed:
            raise NoBackwardError(
                f"stage {info.number}'s attention is the forward alone, and {', '.join(names)} "
                f"require{'s' if len(names) == 1 else ''} grad. To train, call "
                f"stages.autograd.attention(q, k, v, forward={info.number}, ...): this forward with "
                "stage 8's backward. For inference, call it under torch.no_grad().")
        if info.saves_lse:  # packed: stages.autograd.attention_varlen, one sequence at a time
            raise NoBackwardError(
                f"stage {info.number}'s attention_varlen (packed sequences) is the forward alone, and "
                f"{', '.join(names)} require{'s' if len(names) == 1 else ''} grad. To train, call "
                f"stages.autograd.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, "
                f"max_seqlen_k, forward={info.number}, ...): this stage's forward and stage 8's backward, "
                "one launch group per sequence (correct, not fast). For inference, call it under "
                "torch.no_grad().")
        what = f"stage {info.number} has no backward pass"
        raise NoBackwardError(
            f"{what}, and {', '.join(names)} "
            f"require{'s' if len(names) == 1 else ''} grad: its output would have no grad_fn, and "
            "a loss's gradient would silently leave attention out. For inference, call it under "
            "torch.no_grad() or torch.inference_mode() (or pass tensors that do not require "
            "grad, e.g. .detach()); to train, use stages.autograd.attention (stages 5 and 6's "
            "forward with stage 8's backward, [B, H, S, D] inputs) or "
            "torch.nn.functional.scaled_dot_product_attention.")


@dataclass(frozen=True)
class StageInfo:
    """What a stage is and what it accepts; read by the harness, the tests and the notebooks."""

    number: int
    slug: str                      # short name: notebooks/stage{number}_{slug}.ipynb
    title: str
    adds: str                      # one sentence: what this stage adds over the previous one
    backend: str                   # "numba" or "nvrtc"
    min_cc: tuple[int, int]        # minimum compute capability
    dtypes: tuple[torch.dtype, ...]
    head_dims: tuple[int, ...] | range
    sources: tuple[str, ...]       # paths relative to the repository root
    gqa: bool = False              # accepts fewer K/V heads than Q heads
    # Causal alignments the stage computes (lib.inputs.causal_mode): "top_left" is SDPA's
    # is_causal; "bottom_right" puts the Sq queries at the last Sq of the Sk key positions.
    causal_alignments: tuple[str, ...] = ("top_left",)
    varlen: bool = False           # has attention_varlen (packed sequences with cu_seqlens)
    # The data pointers and the batch, head and sequence strides of q, k and v must be
    # multiples of this many bytes (16 for 16-byte vector copies such as cp.async or TMA);
    # 0: any strides whose last dimension is unit-stride.
    align_bytes: int = 0
    # The kernel takes, as its last argument, a float* where it writes each query row's
    # log-sum-exp ([B, H, Sq] fp32, natural log; null: not written): what a backward needs.
    saves_lse: bool = False
    # What the stage's notebook (section 2) predicts at B16 H16 S2048 D64 fp16, full mask,
    # from counting bytes, FLOPs or instructions against the measured ceilings: "tflops" or
    # "speedup" (over the previous stage) as a (low, high) range, and "basis", one line on how.
    # The journey notebook puts it next to the recorded measurement.
    prediction: dict = field(default_factory=dict)
    notes: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def notebook(self) -> str:
        return f"notebooks/stage{self.number}_{self.slug}.ipynb"

    @property
    def head_dims_text(self) -> str:
        hd = self.head_dims
        if isinstance(hd, range):
            return f"{hd.start}–{hd.stop - 1}"
        return ", ".join(str(d) for d in hd)

    @property
    def dtypes_text(self) -> str:
        return ", ".join(DTYPE_NAMES[d] for d in self.dtypes)

    def source_paths(self) -> list[Path]:
        root = Path(__file__).resolve().parent.parent
        return [root / s for s in self.sources]


# --------------------------------------------------------------------------------------------
# causal alignment

NO_MASK, TOP_LEFT, BOTTOM_RIGHT = 0, 1, 2  # the kernels' `causal` argument
ALIGNMENTS = {"top_left": TOP_LEFT, "bottom_right": BOTTOM_RIGHT}


def causal_mode(causal, Sq: int, Sk: int, info: StageInfo) -> int:
    """What a call's `causal` means, as the kernels take it: NO_MASK, TOP_LEFT (query i sees
    keys j <= i: SDPA's is_causal) or BOTTOM_RIGHT (query i sees keys j <= i + Sk − Sq: the Sq
    queries are the last Sq positions of the keys, as in decoding against a cache;
    FlashAttention's causal=True since 2.1). `causal` is False, True (top-left), or the
    alignment by name, "top_left" or "bottom_right"; SDPA's spelling, attn_mask=
    causal_upper_left(Sq, Sk) or causal_lower_right(Sq, Sk), becomes these names in
    causal_from_mask. A query row that sees no key (bottom-right with Sq > Sk: the first
    Sq − Sk rows) gets zeros, as SDPA gives. With Sq = Sk the alignments are one mask."""
    if causal is False or causal is True:
        return int(causal)
    mode = ALIGNMENTS.get(causal) if isinstance(causal, str) else None
    if mode is None:
        raise TypeError(f"causal must be a bool, 'top_left' or 'bottom_right'; got {causal!r}")
    if mode == BOTTOM_RIGHT and Sq != Sk and "bottom_right" not in info.causal_alignments:
        raise NotImplementedError(
            f"stage {info.number} computes causal attention aligned top-left only (SDPA's "
            f"is_causal); bottom-right alignment (causal_lower_right) with Sq != Sk: stages "
            f"{stages_with(lambda i: 'bottom_right' in i.causal_alignments)}")
    return TOP_LEFT if Sq == Sk else mode


def causal_from_mask(causal, attn_mask, q, k, info: StageInfo):
    """The `causal` a call means when it passes SDPA's attn_mask: None leaves `causal` as it
    is; a causal bias (torch.nn.attention.bias.causal_upper_left / causal_lower_right) for
    q's and k's lengths becomes "top_left" / "bottom_right". Any other mask is refused: the
    stages take no mask tensor."""
    if attn_mask is None:
        return causal
    from torch.nn.attention.bias import CausalBias, CausalVariant
    if not isinstance(attn_mask, CausalBias):
        raise NotImplementedError(
            f"stage {info.number} takes no attention-mask tensor; attn_mask may only be a causal "
            "bias, torch.nn.attention.bias.causal_upper_left(Sq, Sk) or causal_lower_right(Sq, "
            f"Sk); got {type(attn_mask).__name__}")
    if causal is not False:
        raise ValueError("pass either causal or attn_mask, not both (SDPA refuses both too)")
    lens = tuple(t.shape[-2] for t in (q, k) if isinstance(t, torch.Tensor) and t.dim() == 4)
    if len(lens) == 2 and (attn_mask.seq_len_q, attn_mask.seq_len_kv) != lens:
        raise ValueError(f"attn_mask is a causal bias for Sq={attn_mask.seq_len_q}, "
                         f"Sk={attn_mask.seq_len_kv}; q and k have Sq={lens[0]}, Sk={lens[1]}")
    return "bottom_right" if attn_mask.variant == CausalVariant.LOWER_RIGHT else "top_left"


# --------------------------------------------------------------------------------------------
# validation

def _dims(t):
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def validate(q, k, v, *, causal, scale, info: StageInfo, check_device: bool = True) -> float:
    """Check the inputs of `info`'s attention; return the scale to use.

    Raises GPURequiredError / GPUTooOldError when this machine cannot run the stage (first),
    TypeError / ValueError naming the argument for invalid input, NotImplementedError for
    valid input this stage does not support. check_device=False leaves out the machine and
    device checks (for testing the rest without a GPU).
    """
    if check_device:
        check_machine(info, q)
    tensors = {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    refuse_grad(info, q, k, v)
    if check_device:
        check_devices(info, q, k, v)
    for name, t in tensors.items():
        if t.layout != torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4, [batch, heads, seq_len, head_dim]; "
                             f"got rank {t.dim()} with shape {_dims(t)}")
    # the floating-point dtypes, and any other a stage takes (stage 7: e4m3)
    known = FLOAT_DTYPES + tuple(d for d in info.dtypes if d not in FLOAT_DTYPES)
    for name, t in tensors.items():
        if t.dtype not in known:
            raise TypeError(f"{name} must be a floating-point tensor "
                            f"({', '.join(DTYPE_NAMES[d] for d in known)}), got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype; got q {q.dtype}, k {k.dtype}, "
                        f"v {v.dtype}")
    (B, H, Sq, D), (Bk, Hk, Sk, Dk), (Bv, Hv, Sv, Dv) = q.shape, k.shape, v.shape
    if not (B == Bk == Bv):
        raise ValueError(f"batch sizes differ: q {_dims(q)}, k {_dims(k)}, v {_dims(v)}")
    if Hk != Hv:
        raise ValueError(f"k and v must have the same number of heads: k {_dims(k)}, "
                         f"v {_dims(v)}")
    if Hk != H:
        if not info.gqa:
            raise ValueError(f"k and v have {Hk} heads but q has {H}: stage {info.number} "
                             "needs the same number of heads in q, k and v (grouped-query "
                             f"attention: stages {_gqa_stages()})")
        if Hk == 0 or H % Hk:
            raise ValueError(f"q's heads ({H}) must be a multiple of k's and v's ({Hk}) "
                             "for grouped-query attention")
    if Sk != Sv:
        raise ValueError(f"k and v must have the same sequence length: k {_dims(k)}, "
                         f"v {_dims(v)}")
    if not (D == Dk == Dv):
        raise ValueError(f"head dims differ: q {_dims(q)}, k {_dims(k)}, v {_dims(v)}; "
                         "q, k and v must share the last dimension")
    for name, t in tensors.items():
        check_layout(name, t, info)
    if check_device and simulator.SIMULATOR and info.backend == "numba":
        check_simulator_size(info, B * H * Sq * Sk, D)
    causal_mode(causal, Sq, Sk, info)
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D else 1.0
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    elif not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    if q.dtype not in info.dtypes:
        raise NotImplementedError(f"stage {info.number} supports dtypes {info.dtypes_text}; "
                                  f"got {DTYPE_NAMES.get(q.dtype, q.dtype)}")
    if D not in info.head_dims:
        raise NotImplementedError(f"stage {info.number} supports head dims "
                                  f"{info.head_dims_text}; got {D}")
    return float(scale)


_validated: dict = {}


def validate_cached(q, k, v, *, causal, scale, info: StageInfo) -> float:
    """validate(), remembered per input layout (shapes, strides, dtypes, devices, causal and
    scale): a call like one that passed before checks only the data pointers' alignment, for a
    fraction of validate()'s host time. For launchers that run on every call of a model."""
    try:
        key = (id(info), q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype,
               k.device, v.shape, v.stride(), v.dtype, v.device, causal, type(causal), scale,
               type(scale))
        hit = _validated.get(key)
    except Exception:  # not tensors, an unhashable scale...: validate() says what is wrong
        key, hit = None, None
    if hit is not None and hit[0] is info and not (
            hit[2] and (q.data_ptr() | k.data_ptr() | v.data_ptr()) % hit[2]):
        refuse_grad(info, q, k, v)  # the layout says nothing about requires_grad
        return hit[1]
    result = validate(q, k, v, causal=causal, scale=scale, info=info)
    if key is not None:
        if len(_validated) > 4096:
            _validated.clear()
        _validated[key] = (info, result, info.align_bytes if info.align_bytes > q.element_size() else 0)
    return result


# --------------------------------------------------------------------------------------------
# packed sequences (varlen)

@dataclass(frozen=True)
class Varlen:
    """A validated call of packed sequences: q, k, v seen as [1, H, total, D] (the stage
    kernels' layout, no copy), the sequences' offsets, and their count and longest lengths."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    n_seqs: int
    max_q: int
    max_k: int
    causal: int        # NO_MASK, TOP_LEFT or BOTTOM_RIGHT, per sequence
    scale: float


_known_offsets: dict = {}  # id(tensor) -> (weakref, version, host values): see offsets_tensor


def offsets_tensor(values, device) -> torch.Tensor:
    """int32 sequence offsets made from host values, as a caller that packs sequences itself
    has them (lib.hf does): validate_varlen then checks these values instead of copying the
    tensor back to the host, which would make the host wait for the GPU. Only while the tensor
    is unchanged (its version counter) and not an inference tensor (which has none)."""
    t = torch.tensor(list(values), dtype=torch.int32, device=device)
    if not t.is_inference():
        if len(_known_offsets) > 256:
            for key in [k for k, v in _known_offsets.items() if v[0]() is None]:
                del _known_offsets[key]
        _known_offsets[id(t)] = (weakref.ref(t), t._version, list(values))
    return t


def host_offsets(cu: torch.Tensor) -> list[int]:
    """The values of an int32 offsets tensor on the host: those offsets_tensor made it from
    while it is unchanged, otherwise one copy to the host (which waits for the GPU)."""
    return _host_offsets(cu)


def _host_offsets(cu: torch.Tensor) -> list[int]:
    known = _known_offsets.get(id(cu))
    if known is not None and known[0]() is cu and not cu.is_inference() and cu._version == known[1]:
        return known[2]
    return cu.tolist()  # one copy to the host: the checks need the values


def _check_cu(name: str, cu, total: int, max_len, max_name: str, q) -> list[int]:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32 offsets, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32 (as FlashAttention takes it), got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D with one offset per sequence plus one, got shape "
                         f"{tuple(cu.shape)}")
    if cu.device != q.device:
        raise ValueError(f"{name} must be on q's device ({q.device}), got {cu.device}")
    if not cu.is_contiguous():  # the kernels read offset b at the data pointer plus b
        raise ValueError(f"{name} must be contiguous, got a view with stride {cu.stride(0)}")
    if isinstance(max_len, bool) or not isinstance(max_len, numbers.Integral) or max_len < 0:
        raise TypeError(f"{max_name} must be a non-negative int, got {max_len!r}")
    if cu.is_cuda and torch.cuda.is_current_stream_capturing():
        return None  # a CUDA graph being captured cannot wait for the values: trusted, as FA does
    offsets = _host_offsets(cu)
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0, got {offsets[0]}")
    steps = [b - a for a, b in zip(offsets, offsets[1:])]
    if any(s < 0 for s in steps):
        i = next(i for i, s in enumerate(steps) if s < 0)
        raise ValueError(f"{name} must be non-decreasing (sequence lengths >= 0); offsets {i} and "
                         f"{i + 1} are {offsets[i]} and {offsets[i + 1]}")
    if offsets[-1] != total:
        raise ValueError(f"{name}[-1] is {offsets[-1]}, but the packed tensor has {total} tokens: "
                         "the last offset must be the total")
    longest = max(steps, default=0)
    if max_len < longest:
        raise ValueError(f"{max_name} is {max_len}, but {name} has a sequence of {longest} tokens")
    return steps


def validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal,
                    scale, info: StageInfo, check_device: bool = True) -> Varlen:
    """Check a call of packed sequences, FlashAttention's flash_attn_varlen_func: q
    [total_q, H, D], k and v [total_k, H_kv, D], sequence b being rows cu_seqlens_q[b] …
    cu_seqlens_q[b + 1] − 1 of q (and of cu_seqlens_k's of k, v). `causal`: False, "top_left"
    or "bottom_right", per sequence (True is refused: it means top-left in SDPA and bottom-right
    in FlashAttention ≥ 2.1). Reads the offsets (one copy to the host) to check them, except
    while a CUDA graph is being captured: then they are trusted, as FlashAttention trusts them
    (a replay may bring new offsets in the same tensors; they must be as valid).
    check_device=False as in validate()."""
    if not info.varlen:
        raise NotImplementedError(f"stage {info.number} takes no packed sequences; "
                                  f"attention_varlen: stages {stages_with(lambda i: i.varlen)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must have rank 3, [total_tokens, heads, head_dim], for packed "
                             f"sequences; got shape {_dims(t)}")
    refuse_grad(info, q, k, v)  # here, on the packed tensors, so that the error names attention_varlen
    if causal is True:
        raise TypeError("for packed sequences say the causal alignment: causal='top_left' (SDPA's "
                        "is_causal) or 'bottom_right' (FlashAttention's causal=True since 2.1); "
                        "True means one in SDPA and the other in FlashAttention")
    views = [t.unsqueeze(0).transpose(1, 2) for t in (q, k, v)]  # [1, H, total, D], no copy
    scale = validate(*views, causal=False, scale=scale, info=info, check_device=check_device)
    lens_q = _check_cu("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q", q)
    lens_k = _check_cu("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k", q)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.numel() - 1} sequences and cu_seqlens_k "
                         f"{cu_seqlens_k.numel() - 1}: one offset per sequence plus one each")
    mode = causal_mode(causal, 0, 1, info) if causal is not False else NO_MASK
    return Varlen(*views, cu_seqlens_q, cu_seqlens_k, cu_seqlens_q.numel() - 1, int(max_seqlen_q),
                  int(max_seqlen_k), mode, scale)


MAX_INT32 = 2**31 - 1


def check_layout(name: str, t: torch.Tensor, info: StageInfo) -> None:
    """Strides: the last dimension unit-stride (kernels read whole rows), and for a stage that
    copies 16 bytes at a time, the data pointer and every other stride a multiple of that.
    Strides of dimensions of size 1 never move the pointer, so they do not matter."""
    shape, strides = t.shape, t.stride()
    if shape[3] > 1 and strides[3] != 1:
        raise ValueError(f"{name} must have a unit-stride last dimension (head_dim); its strides "
                         f"are {tuple(strides)} for shape {_dims(t)}: call .contiguous() first")
    if info.backend == "nvrtc" and shape[2] > 1 and strides[2] > MAX_INT32:
        raise NotImplementedError(f"stage {info.number} takes sequence strides below 2^31 "
                                  f"elements; {name} has {strides[2]}")
    align = info.align_bytes
    item = t.element_size()
    if align > item and t.numel():
        bad = [f"{what} stride {st} ({st * item} bytes)"
               for what, n, st in zip(("batch", "head", "seq"), shape[:3], strides[:3])
               if n > 1 and st * item % align]
        if t.data_ptr() % align:
            bad.insert(0, f"data pointer {t.data_ptr():#x}")
        if bad:
            raise ValueError(f"stage {info.number} copies {align} bytes at a time: {name}'s data "
                             f"pointer and batch, head and seq strides must be multiples of "
                             f"{align} bytes ({align // item} {DTYPE_NAMES[t.dtype]} elements); "
                             f"{name} has {', '.join(bad)}. Call .contiguous() (or pad the "
                             "head dim) first")


def stages_with(has) -> str:
    """The registered stages whose INFO has `has` (a predicate), as text: "2, 3, 5" or "none"."""
    import stages  # the registry imports this module: look it up only when needed
    return ", ".join(str(n) for n in stages.NUMBERS if has(stages.get(n).INFO)) or "none"


def _gqa_stages() -> str:
    return stages_with(lambda i: i.gqa)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def check_machine(info: StageInfo, q=None) -> None:
    """This machine can run the stage: a GPU (unless a numba stage runs in the simulator) of
    compute capability info.min_cc or newer (q's GPU if q is a CUDA tensor, else the current
    one)."""
    if simulator.SIMULATOR and info.backend == "numba":
        return
    simulator.require_gpu(f"stage {info.number} ({info.title})", stage=info.number)
    on_gpu = isinstance(q, torch.Tensor) and q.device.type == "cuda"
    index = q.device.index if on_gpu and q.device.index is not None else torch.cuda.current_device()
    cc = _capability(index)
    if cc < info.min_cc:
        raise GPUTooOldError(
            f"stage {info.number} needs compute capability {info.min_cc[0]}.{info.min_cc[1]} "
            f"or newer; {torch.cuda.get_device_name(index)} has {cc[0]}.{cc[1]}")


def check_devices(info: StageInfo, *tensors) -> None:
    """The tensors are where the stage runs: CUDA (CPU for a numba stage in the simulator),
    all on one device."""
    on_simulator = simulator.SIMULATOR and info.backend == "numba"
    want = "cpu" if on_simulator else "cuda"
    for name, t in zip("qkv", tensors):
        if t.device.type != want:
            where = ("the numba simulator (no GPU here) takes CPU tensors" if on_simulator
                     else f"stage {info.number} runs on the GPU")
            raise ValueError(f"{name} must be a {want.upper()} tensor ({where}); "
                             f"got device {t.device}")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"q, k and v must be on one device, got {sorted(map(str, devices))}")


# numba's simulator runs every GPU thread as a Python thread: measured 0.9 s at B1 H1 S64 D64
# (4,096 scores) and 3.7 s at S128 (16,384), on a CPU machine of the curriculum's CI, 2026-11-24;
# the latency shape (B1 H8 S512, 2.1 M scores) would take minutes.
SIMULATOR_MAX_SCORES = 1 << 16
_simulator_said = False


def check_simulator_size(info: StageInfo, scores: int, D: int) -> None:
    """Say once that a numba stage runs in the simulator here, and refuse shapes it would take
    minutes over (more than SIMULATOR_MAX_SCORES scores, B·H·Sq·Sk)."""
    global _simulator_said
    if scores > SIMULATOR_MAX_SCORES:
        raise NotImplementedError(
            f"stage {info.number} runs in numba's CUDA simulator on this machine (no GPU): every "
            f"GPU thread is a Python thread, about 0.2 ms per score at D64 (B1 H1 S128: 3.7 s), "
            f"and this call has {scores:,} scores (B·H·Sq·Sk), which would take about "
            f"{scores * 2.3e-4 * max(D, 16) / 64 / 60:,.0f} min. The simulator is for tiny shapes "
            f"(at most {SIMULATOR_MAX_SCORES:,} scores); run larger ones on a GPU")
    if not _simulator_said:
        _simulator_said = True
        import warnings
        warnings.warn(f"stage {info.number} runs in numba's CUDA simulator (no GPU here; lib set "
                      "NUMBA_ENABLE_CUDASIM=1): every GPU thread is a Python thread, fine for tiny "
                      "shapes, slow beyond", stacklevel=4)


def check_device(info: StageInfo, *tensors) -> None:
    """The machine and the tensors' device suit the stage (both checks above)."""
    check_machine(info, tensors[0] if tensors else None)
    check_devices(info, *tensors)


def trivial_output(q, k):
    """SDPA's answer where there is nothing to compute, or None: an empty output when q is
    empty, and zeros when there are no keys (SDPA returns 0 there, not NaN: torch's math
    backend, which SDPA picks for empty inputs)."""
    if q.numel() == 0:
        return torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if k.shape[2] == 0:
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    return None


# --------------------------------------------------------------------------------------------
# inputs and outputs

def default_device() -> str:
    """Where a stage's tensors live on this machine: CUDA, or the CPU on the simulator."""
    return "cpu" if simulator.SIMULATOR else "cuda"


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def make_qkv(B, H, Sq, D, *, Sk=None, Hkv=None, dtype=torch.float16, device=None, seed=None):
    """Random normal q [B, H, Sq, D], k and v [B, Hkv, Sk, D]: fresh every call unless a
    seed is given (then drawn on the CPU: the same numbers on every machine; fresh ones on a GPU
    are drawn there). Never zeros: zeros hide unwritten outputs and wrong indexing."""
    Sk = Sq if Sk is None else Sk
    Hkv = H if Hkv is None else Hkv
    device = default_device() if device is None else device
    shapes = ((B, H, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D))
    if seed is None and torch.device(device).type == "cuda":
        # Fresh inputs need no replay: drawn where they are used. Drawing the long shape's
        # 200 M numbers on the CPU took the main job 60 of its 150 s on the H200.
        gen = torch.Generator(device=device).manual_seed(fresh_seed())
        return tuple(torch.randn(s, generator=gen, dtype=torch.float32, device=device).to(dtype)
                     for s in shapes)
    # A seed draws on the CPU, so that it gives the same numbers on every machine.
    gen = torch.Generator(device="cpu").manual_seed(fresh_seed() if seed is None else seed)
    return tuple(torch.randn(s, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
                 for s in shapes)


_poison = False


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True):
    """While active, new outputs start as NaN, so elements a kernel never writes fail the
    check. Off by default so that timed runs pay no extra fill."""
    global _poison
    old, _poison = _poison, enabled
    try:
        yield
    finally:
        _poison = old


def new_output(q, D=None, dtype=None):
    """The output tensor a stage writes into: a new contiguous tensor shaped like q (last dim
    D), q's dtype."""
    if D is None and dtype is None:  # the common case, a third of torch.empty's host time
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        return out.fill_(math.nan) if _poison else out
    shape = q.shape[:-1] + ((q.shape[-1] if D is None else D),)
    dtype = q.dtype if dtype is None else dtype
    if _poison:
        return torch.full(shape, math.nan, dtype=dtype, device=q.device)
    return torch.empty(shape, dtype=dtype, device=q.device)


def paged_cache(k, v, lens, page_size, *, spare=3, shared=True, generator=None):
    """A paged KV cache for tests and benchmarks (stage 6's page_table): k, v [B, H_kv, Sk, D] →
    (k_cache, v_cache [num_pages, page_size, H_kv, D], page_table int32 [B, max_pages]): entry b's first lens[b] keys copied to pages in shuffled order, some
    pages spare (never mapped), the table's unused entries pointing anywhere (garbage ids, out of
    range too) and, with `shared`, entries whose keys are equal sharing their first page. Slots
    past a length are finite (random), as the contract asks."""
    g = generator or random.Random(0)
    B, Hk, Sk, D = k.shape
    max_pages = -(-Sk // page_size)
    need = [-(-int(n) // page_size) for n in lens]
    share = shared and B > 1 and min(int(lens[0]), int(lens[1])) >= page_size
    if share:  # entry 1's first page is entry 0's (their first page_size keys made equal)
        k[1, :, :page_size], v[1, :, :page_size] = k[0, :, :page_size], v[0, :, :page_size]
    num_pages = sum(need) + spare
    order = list(range(num_pages))
    g.shuffle(order)
    kc = torch.randn(num_pages, page_size, Hk, D, dtype=k.dtype, device=k.device)
    vc = torch.randn_like(kc)
    table = torch.tensor([[g.randrange(-5, num_pages + 5) for _ in range(max_pages)] for _ in range(B)],
                         dtype=torch.int32)
    nxt = 0
    for b in range(B):
        n = int(lens[b])
        ids = order[nxt:nxt + need[b]]
        nxt += need[b]
        full = n // page_size
        idx = torch.tensor(ids[:full], dtype=torch.long, device=k.device)
        for src, dst in ((k, kc), (v, vc)):  # whole pages at once, then the last one's rows
            dst[idx] = src[b, :, :full * page_size].reshape(Hk, full, page_size, D).permute(1, 2, 0, 3)
            if n % page_size:
                dst[ids[full], :n % page_size] = src[b, :, full * page_size:n].transpose(0, 1)
        table[b, :need[b]] = torch.tensor(ids, dtype=torch.int32)
    if share:
        table[1, 0] = table[0, 0]
    return kc, vc, table.to(k.device)
