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
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lib import simulator

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
               torch.float64: "float64"}


class GPUTooOldError(NotImplementedError):
    """The stage uses instructions this GPU does not have."""


class NoBackwardError(RuntimeError):
    """An input requires grad, grad mode is on, and the stage has no backward: raised instead
    of returning an output without a grad_fn, whose gradient would silently leave attention
    out (a RuntimeError, as autograd's own errors are)."""


def refuse_grad(info: "StageInfo", q, k, v) -> None:
    """Raise NoBackwardError when grad mode is on and q, k or v requires grad. Cheap (three
    attribute reads): the launchers call it on every call, cached plans included."""
    if torch.is_grad_enabled() and (getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
                                    or getattr(v, "requires_grad", False)):
        names = [n for n, t in (("q", q), ("k", k), ("v", v)) if getattr(t, "requires_grad", False)]
        raise NoBackwardError(
            f"stage {info.number} has no backward pass, and {', '.join(names)} "
            f"require{'s' if len(names) == 1 else ''} grad: its output would have no grad_fn, and "
            "a loss's gradient would silently leave attention out. For inference, call it under "
            "torch.no_grad() or torch.inference_mode() (or pass tensors that do not require "
            "grad, e.g. .detach()); to train, use torch.nn.functional.scaled_dot_product_attention "
            "until a stage with a backward exists.")


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
    # The data pointers and the batch, head and sequence strides of q, k and v must be
    # multiples of this many bytes (16 for 16-byte vector copies such as cp.async or TMA);
    # 0: any strides whose last dimension is unit-stride.
    align_bytes: int = 0
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
    for name, t in tensors.items():
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be a floating-point tensor "
                            f"({', '.join(DTYPE_NAMES[d] for d in FLOAT_DTYPES)}), got {t.dtype}")
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
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
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


def _gqa_stages() -> str:
    import stages  # the registry imports this module: look it up only when needed
    return ", ".join(str(n) for n in stages.NUMBERS if stages.get(n).INFO.gqa) or "none"


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
    seed is given. Never zeros: zeros hide unwritten outputs and wrong indexing."""
    Sk = Sq if Sk is None else Sk
    Hkv = H if Hkv is None else Hkv
    device = default_device() if device is None else device
    gen = torch.Generator(device="cpu").manual_seed(fresh_seed() if seed is None else seed)
    shapes = ((B, H, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D))
    # Drawn on the CPU so a seed gives the same numbers on every machine.
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
