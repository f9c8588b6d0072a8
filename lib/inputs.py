"""Inputs: what a stage declares it supports, the one validation every stage calls, random
inputs for checks and timings, and output allocation (poisoned with NaN while checking).

Validation order: Python types, ranks, dtypes, shapes, empty tensors, scale, what this stage
supports, then devices and the GPU. Shape errors are reported before device errors so that
every check can be exercised on a machine without a GPU.
"""
from __future__ import annotations

import contextlib
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


def validate(q, k, v, *, causal, scale, info: StageInfo) -> float:
    """Check the inputs of `info`'s attention; return the scale to use.

    Raises TypeError / ValueError naming the argument for invalid input, NotImplementedError
    for valid input this stage does not support, GPUTooOldError / RuntimeError when the
    machine cannot run the stage.
    """
    tensors = {"q": q, "k": k, "v": v}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in tensors.items():
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4, [batch, heads, seq_len, head_dim]; "
                             f"got rank {t.dim()} with shape {_dims(t)}")
    for name, t in tensors.items():
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, "
                            f"float32), got {t.dtype}")
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
                             "needs the same number of heads in q, k and v")
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
        if t.numel() == 0:
            raise ValueError(f"{name} is empty (shape {_dims(t)}): every dimension must be >= 1")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    elif not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous in [batch, heads, seq_len, head_dim] "
                             f"order (strides {tuple(t.stride())}); call .contiguous() first")
    if q.dtype not in info.dtypes:
        raise NotImplementedError(f"stage {info.number} supports dtypes {info.dtypes_text}; "
                                  f"got {DTYPE_NAMES.get(q.dtype, q.dtype)}")
    if D not in info.head_dims:
        raise NotImplementedError(f"stage {info.number} supports head dims "
                                  f"{info.head_dims_text}; got {D}")
    check_device(info, q, k, v)
    return float(scale)


def check_device(info: StageInfo, *tensors) -> None:
    """The tensors' device and this machine's GPU must suit the stage."""
    on_simulator = simulator.SIMULATOR and info.backend == "numba"
    if not on_simulator:
        simulator.require_gpu(f"stage {info.number} ({info.title})")
    want = "cpu" if on_simulator else "cuda"
    for name, t in zip("qkv", tensors):
        if t.device.type != want:
            where = ("the numba simulator (no GPU here) takes CPU tensors" if on_simulator
                     else "this stage runs on the GPU")
            raise ValueError(f"{name} must be a {want.upper()} tensor ({where}); "
                             f"got device {t.device}")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"q, k and v must be on one device, got {sorted(map(str, devices))}")
    if on_simulator:
        return
    cc = torch.cuda.get_device_capability(tensors[0].device)
    if cc < info.min_cc:
        raise GPUTooOldError(
            f"stage {info.number} needs compute capability {info.min_cc[0]}.{info.min_cc[1]} "
            f"or newer; {torch.cuda.get_device_name(tensors[0].device)} has {cc[0]}.{cc[1]}")


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
    """The output tensor a stage writes into: shaped like q (last dim D), q's dtype."""
    shape = q.shape[:-1] + ((q.shape[-1] if D is None else D),)
    dtype = q.dtype if dtype is None else dtype
    if _poison:
        return torch.full(shape, math.nan, dtype=dtype, device=q.device)
    return torch.empty(shape, dtype=dtype, device=q.device)
