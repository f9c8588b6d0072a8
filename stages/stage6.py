"""Stage 6 — Hopper: TMA + WGMMA, warp-specialized (sm_90a), CUDA C++ through NVRTC.

The FlashAttention-3 design (stages/stage6.cu, PTX wrappers in stages/hopper.cuh): a producer
warpgroup copies Q, K and V tiles with the copy engine (TMA) into a ring of shared-memory
buffers guarded by transaction-count barriers; two consumer warpgroups of 64 query rows each
multiply with asynchronous warpgroup tensor-core instructions (wgmma), S = Q·Kᵀ from shared
memory and O += P·V with P from registers; registers move from producer to consumers
(setmaxnreg); consumers take turns on the tensor cores (ping-pong) and overlap each softmax
with the previous tile's P·V. Each schedule idea is a compile-time switch (SCHEDULES).

The tensor maps that describe q, k and v to the copy engine are encoded on the host from the
tensors' real strides (a 4-D map over [B, H, S, D]), so transposed views of [B, S, H, D]
tensors are read in place, and rows past the sequence end come back as zeros.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from lib import nvrtc
from lib.inputs import GPUTooOldError, StageInfo, new_output, refuse_grad, trivial_output, validate_cached

SOURCE = Path(__file__).with_suffix(".cu")
ARCH = "sm_90a"  # wgmma and setmaxnreg exist only in the arch-specific target
# (BLOCK_N, STAGES, CONSUMERS) per head dim: keys per tile, K/V ring depth, consumer warpgroups
# (64 query rows each), picked from CHOICES on the H100 (scripts/stage6_schedules.py): at D64
# three consumers (192 rows per block: two thirds of the K/V traffic per row of two); at D128
# 176-key tiles (fewer per-tile fixed costs: barriers, shuffles, turns; 2 stages fit), within the
# noise of (128, 3, 2), which was faster causal.
TILES = {64: (128, 2, 3), 128: (176, 2, 2)}
CHOICES = [(128, 2, 2), (128, 3, 2), (176, 2, 2), (64, 4, 2), (128, 2, 3), (128, 3, 3)]
# The FlashAttention-3 schedule, one idea at a time (the notebook's waterfall, in this order).
# PERSISTENT is the launch, not the kernel: one block per SM walking the work tiles, instead of
# one block per work tile; in a fixed stride, or (DYNAMIC_WORK) taking the next from a counter.
_FA3 = dict(WARP_SPECIALIZED=1, SETMAXNREG=1, PINGPONG=1, INTRA_OVERLAP=1)
SCHEDULES = {
    "no warp specialization": dict(WARP_SPECIALIZED=0, SETMAXNREG=0, PINGPONG=0, INTRA_OVERLAP=0, PERSISTENT=0, DYNAMIC_WORK=0),
    "+ producer warpgroup": dict(WARP_SPECIALIZED=1, SETMAXNREG=0, PINGPONG=0, INTRA_OVERLAP=0, PERSISTENT=0, DYNAMIC_WORK=0),
    "+ setmaxnreg": dict(WARP_SPECIALIZED=1, SETMAXNREG=1, PINGPONG=0, INTRA_OVERLAP=0, PERSISTENT=0, DYNAMIC_WORK=0),
    "+ ping-pong": dict(WARP_SPECIALIZED=1, SETMAXNREG=1, PINGPONG=1, INTRA_OVERLAP=0, PERSISTENT=0, DYNAMIC_WORK=0),
    "+ intra-warpgroup overlap": dict(_FA3, PERSISTENT=0, DYNAMIC_WORK=0),
    "+ persistent blocks": dict(_FA3, PERSISTENT=1, DYNAMIC_WORK=0),
    "+ work queue": dict(_FA3, PERSISTENT=1, DYNAMIC_WORK=1),
}
# Other combinations worth measuring, outside the waterfall's order: FlashAttention-3 itself runs
# its head-dim-64 kernel (three consumer warpgroups) with the overlap but without ping-pong.
VARIANTS = {
    "overlap without ping-pong": dict(_FA3, PINGPONG=0, PERSISTENT=0, DYNAMIC_WORK=0),
    "work queue without ping-pong": dict(_FA3, PINGPONG=0, PERSISTENT=1, DYNAMIC_WORK=1),
}
ALL_SCHEDULES = {**SCHEDULES, **VARIANTS}
# The schedule each head dim runs by default: the pick of `scripts/stage6_schedules.py --pick` on
# the H100 (candidates and rule fixed before measuring: PICK_CANDIDATES, PICK_RULE there; the
# rounds it timed are in results/logs/). Schedules a few percent apart need those repeated rounds.
DEFAULT_SCHEDULES = {64: "+ intra-warpgroup overlap", 128: "+ intra-warpgroup overlap"}


def default_schedule(head_dim: int) -> str:
    return DEFAULT_SCHEDULES[head_dim]
# Eighths of the scores whose exp2 runs as a polynomial on the FMA pipes instead of MUFU.EX2
# (stages/stage6.cu: poly_exp2), per head dim.
EXP2_POLY = {64: 0, 128: 0}
# When the softmax rescales O (stages/stage6.cu: LAZY_RESCALE), per head dim: -1 every tile, as
# FlashAttention-3 does; 0 only in warps where a row's max grew; k > 0 keeps a row's max until a
# tile's exceeds it by more than 2^k (FlashAttention-4's threshold, 8), so O is almost never
# rescaled after the first tile (P up to 2^k: fine in fp16/bf16).
LAZY_RESCALE = {64: 8, 128: 8}
TIMELINE_TILES, TIMELINE_EVENTS = 16, 4  # stages/stage6.cu: TL_TILES, TL_EVENTS
MAX_SMEM = 232_448  # bytes of shared memory one block may have on sm_90 (227 KB)


def fits(head_dim: int, tiles) -> bool:
    """Whether a tile choice fits in one block's shared memory at this head dim."""
    bn, stages, consumers = tiles
    return (64 * consumers + 2 * stages * bn) * head_dim * 2 + 1024 + 8 * (3 + 4 * stages) <= MAX_SMEM

INFO = StageInfo(
    number=6,
    slug="wgmma_tma",
    title="Hopper: TMA + WGMMA, warp-specialized",
    adds="Hopper's copy engine (TMA) and transaction barriers feed a K/V ring from a producer "
         "warpgroup; asynchronous warpgroup tensor-core products (wgmma) read Q, K and V from "
         "shared memory and P from registers; setmaxnreg, ping-pong between consumer "
         "warpgroups and softmax overlapped with P·V (the FlashAttention-3 schedule).",
    backend="nvrtc",
    min_cc=(9, 0),
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),
    sources=("stages/stage6.py", "stages/stage6.cu", "stages/hopper.cuh", "stages/attention.cuh"),
    gqa=True,
    align_bytes=16,  # the copy engine: 16-byte-aligned base and strides
    # The notebook's count at B16 H16 S2048 D64: wgmma cycles and MUFU.EX2 (×2 for the rest of
    # the softmax) per key tile and consumer, against the recorded matmul ceiling.
    prediction={"tflops": (239, 718),
                "basis": "wgmma and MUFU.EX2 cycles per key tile and consumer warpgroup: softmax "
                         "serialized with the products (low) to hidden under the other consumers' "
                         "products (high), × the matmul ceiling recorded at 4506624 (718 TFLOPS)"},
    notes="sm_90a only (H100/H200): wgmma and setmaxnreg exist in no other target.",
    extra={"arch": ARCH, "tensor_core_op": "HGMMA"},
)


@lru_cache(maxsize=None)
def config(head_dim: int, tiles=None, schedule: str | None = None, timeline: bool = False,
           exp2_poly: int | None = None, lazy_rescale: int | None = None) -> dict:
    """Launch settings for one choice of (BLOCK_N, STAGES, CONSUMERS) and schedule: query rows
    per block, threads, dynamic shared memory (Q, the K and V rings, the barriers, and 1 KB of
    slack to align the tiles to 1024 bytes) and the kernel's defines."""
    schedule = DEFAULT_SCHEDULES[head_dim] if schedule is None else schedule
    if schedule not in ALL_SCHEDULES:
        raise ValueError(f"schedule must be one of {list(ALL_SCHEDULES)}, got {schedule!r}")
    bn, stages, consumers = tiles or TILES[head_dim]
    sw = dict(ALL_SCHEDULES[schedule])
    persistent = bool(sw.pop("PERSISTENT"))
    assert persistent or not sw["DYNAMIC_WORK"], "a work queue is for a persistent launch"
    block_m = 64 * consumers
    tiles_bytes = (block_m + 2 * stages * bn) * head_dim * 2
    if tiles_bytes + 1024 > MAX_SMEM:
        raise ValueError(f"tiles {(bn, stages, consumers)} at D{head_dim} need {tiles_bytes + 1024:,} bytes of "
                         f"shared memory; a block gets at most {MAX_SMEM:,} on sm_90")
    eighths = EXP2_POLY[head_dim] if exp2_poly is None else exp2_poly
    if not 0 <= eighths <= 8:
        raise ValueError(f"exp2_poly counts eighths of the score columns, 0 to 8; got {eighths}")
    lazy = LAZY_RESCALE[head_dim] if lazy_rescale is None else lazy_rescale
    if not (isinstance(lazy, int) and -1 <= lazy <= 10):
        raise ValueError(f"lazy_rescale is -1 (rescale every tile) or a threshold 0 to 10 (log2); got {lazy!r}")
    defines = (("BLOCK_N", bn), ("STAGES", stages), ("CONSUMERS", consumers),
               *sorted(sw.items()), ("TIMELINE", int(timeline)), ("EXP2_POLY_EIGHTHS", eighths),
               ("LAZY_RESCALE", lazy))
    return {"block_m": block_m, "threads": 128 * (consumers + sw["WARP_SPECIALIZED"]), "persistent": persistent,
            "smem": tiles_bytes + 8 * (3 + 4 * stages) + 1024, "defines": defines}  # Smem's barriers and work


def compile_for(arch: str = ARCH, dtype=torch.float16, head_dim: int = 64, tiles=None,
                schedule: str | None = None, timeline: bool = False, exp2_poly: int | None = None,
                lazy_rescale: int | None = None) -> dict:
    """The stage's kernel compiled without a GPU, for lib.sass. Only sm_90a has the
    instructions; any other arch is refused."""
    if arch != ARCH:
        raise NotImplementedError(f"stage 6 compiles only for {ARCH} (wgmma, setmaxnreg); got {arch}")
    cfg = config(head_dim, None if tiles is None else tuple(tiles), schedule, timeline, exp2_poly, lazy_rescale)
    return {f"stage{INFO.number} {str(dtype)[6:]} D{head_dim}":
            nvrtc.compile_stage(SOURCE, arch=ARCH, dtype=dtype, head_dim=head_dim,
                                defines=dict(cfg["defines"]))}


# --------------------------------------------------------------------------------------------
# running (GPU only)

_kernels: dict = {}


def _kernel(dtype, D, cfg):
    key = (dtype, D, cfg["defines"])
    k = _kernels.get(key)
    if k is None:
        compiled = nvrtc.compile_stage(SOURCE, arch=ARCH, dtype=dtype, head_dim=D,
                                       defines=dict(cfg["defines"]))
        k = _kernels[key] = nvrtc.load_kernel(compiled, "attention_wgmma", max_dynamic_smem=cfg["smem"])
    return k


def tensor_map(t: torch.Tensor, rows: int):
    """The copy engine's description of a [B, H, S, D] tensor with its real strides: boxes of
    `rows` × 64 elements (128 bytes, the widest box a 128-byte swizzle takes), swizzled.
    Encoding costs host time: attention() makes a tensor's map once per layout (its plan) and
    afterwards only replaces the address. Each call here returns a new map of its own."""
    from cuda.core.utils import StridedMemoryView
    from cuda.core._tensor_map import TensorMapSwizzle
    # The copy engine moves bits: a 16-bit integer view of fp16/bf16 has the same layout.
    # It also wants every stride a multiple of 16 bytes, even where a dimension has size 1
    # and its stride is never used: give those one that is.
    strides = [st if n > 1 else 8 * (t.numel() + 1) for n, st in zip(t.shape, t.stride())]
    strides[-1] = 1
    t = t.as_strided(t.shape, strides)
    view = StridedMemoryView.from_dlpack(t.view(torch.uint16), stream_ptr=-1)
    return view.as_tensor_map((1, 1, rows, 64), swizzle=TensorMapSwizzle.SWIZZLE_128B)


_arch_ok: set = set()


def _check_arch(q) -> None:
    if q.device.index in _arch_ok:
        return
    cc = torch.cuda.get_device_capability(q.device)
    if cc == (9, 0):
        _arch_ok.add(q.device.index)
    else:
        raise GPUTooOldError(f"stage 6 is built for sm_90a and needs compute capability 9.0 exactly "
                             f"(H100, H200); {torch.cuda.get_device_name(q.device)} has {cc[0]}.{cc[1]}")


class _Plan:
    """Everything about a call except the data pointers, made once per input layout and
    option set: a model's many small calls then cost about what SDPA's do on the host. The
    tensor maps are kept too; when a later call brings new tensors of the same layout, only
    their addresses are replaced (cuTensorMapReplaceAddress), not the whole map encoded."""

    __slots__ = ("kernel", "config", "args", "rows", "maps", "ptrs", "trivial", "queues")


_plans: dict = {}


class _Address:
    """The one thing TensorMapDescriptor.replace_address reads from a tensor: its address (as
    __cuda_array_interface__, far cheaper to build than a DLPack capsule)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, t):
        self.__cuda_array_interface__ = {"shape": (t.numel(),), "typestr": "<u2", "version": 3,
                                         "data": (t.data_ptr(), False), "strides": None}


def _make_plan(q, k, v, causal, scale, tiles, schedule, timeline, exp2_poly, lazy_rescale) -> _Plan:
    if tiles is not None and tuple(tiles) not in CHOICES:
        raise ValueError(f"tiles must be one of {CHOICES}, got {tiles}")
    scale = validate_cached(q, k, v, causal=causal, scale=scale, info=INFO)
    _check_arch(q)
    plan = _Plan()
    plan.trivial = trivial_output(q, k) is not None  # no queries, or no keys: what SDPA returns
    if plan.trivial:
        return plan
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    cfg = config(D, None if tiles is None else tuple(tiles), schedule, timeline, exp2_poly, lazy_rescale)
    bn = (tiles or TILES[D])[0]
    # Work tiles: (batch·head, block of query rows); one grid dimension holds up to 2³¹ − 1.
    n_work = B * H * ((Sq + cfg["block_m"] - 1) // cfg["block_m"])
    if n_work >= 2**31:
        raise NotImplementedError(f"stage 6: {n_work} work tiles exceed the grid's 2^31 - 1 blocks")
    grid = min(n_work, _sm_count(q.device)) if cfg["persistent"] else n_work
    plan.kernel = _kernel(q.dtype, D, cfg)
    plan.config = nvrtc.launch_config((grid, 1, 1), (cfg["threads"], 1, 1), cfg["smem"])
    plan.args = (np.int32(Sq), np.int32(Sk), np.int32(H), np.int32(H // Hk),
                 np.float32(scale * math.log2(math.e)), np.int32(causal), np.int32(n_work))
    plan.rows = (cfg["block_m"], bn, bn)
    plan.maps = [tensor_map(t, r) for t, r in zip((q, k, v), plan.rows)]
    plan.ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    # DYNAMIC_WORK: the work counter (next, blocks done), zero between launches (the kernel's
    # last block resets it). One per stream: launches on two streams at once must not share one.
    plan.queues = {} if dict(cfg["defines"])["DYNAMIC_WORK"] else None
    return plan


def _queue(plan: _Plan, device) -> int:
    if plan.queues is None:
        return 0
    stream = torch.cuda.current_stream(device).cuda_stream
    queue = plan.queues.get(stream)
    if queue is None:
        queue = plan.queues[stream] = torch.zeros(2, dtype=torch.int32, device=device)
    return queue.data_ptr()


def attention(q, k, v, *, causal=False, scale=None, tiles=None, schedule=None,
              timeline=None, exp2_poly=None, lazy_rescale=None):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True) for q [B, H, Sq, D], k/v [B, H_kv, Sk, D]; output in q's dtype.
    `tiles` (one of CHOICES), `schedule` (a key of ALL_SCHEDULES; default: the head dim's, see
    DEFAULT_SCHEDULES), `exp2_poly` (eighths of the exponentials computed by polynomial, 0–8)
    and `lazy_rescale` (-1: rescale O every tile; k >= 0: only when a row max grew by more than
    2^k, see LAZY_RESCALE) are for measuring the alternatives; `timeline`, an int64 CUDA tensor of
    (1 + CONSUMERS)·16·4 elements, receives clock64 stamps of block 0's first work tile (see
    stages/stage6.cu)."""
    try:  # attributes a non-tensor lacks: the full validation in _make_plan says what is wrong
        key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
               v.shape, v.stride(), v.dtype, v.device, causal, type(causal), scale, type(scale),
               None if tiles is None else tuple(tiles), schedule, timeline is not None, exp2_poly,
               lazy_rescale)
        plan = _plans.get(key)
    except Exception:
        key, plan = None, None
    ptrs = None
    if plan is not None:
        refuse_grad(INFO, q, k, v)  # no backward: never an output without a grad_fn
    if plan is not None and not plan.trivial:
        ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr()]
        if (ptrs[0] | ptrs[1] | ptrs[2]) % INFO.align_bytes:
            plan = None  # validate() explains the misaligned pointer
    if plan is None:
        plan = _make_plan(q, k, v, causal, scale, tiles, schedule, timeline is not None, exp2_poly,
                          lazy_rescale)
        if key is not None:
            if len(_plans) > 1024:
                _plans.clear()
            _plans[key] = plan
    if plan.trivial:
        return trivial_output(q, k)
    if ptrs is not None:
        for i, t in enumerate((q, k, v)):
            if ptrs[i] != plan.ptrs[i]:  # same layout, new tensor: point its map at it
                _retarget(plan, i, t)
    out = new_output(q)
    nvrtc.launch_prepared(plan.kernel, plan.config,
                          (*plan.maps, out.data_ptr(), *plan.args,
                           timeline.data_ptr() if timeline is not None else 0, _queue(plan, q.device)))
    return out


def _retarget(plan: _Plan, i: int, t) -> None:
    """Point tensor map i of a plan at tensor t (same layout as the one it was made for)."""
    try:
        plan.maps[i].replace_address(_Address(t))
    except Exception:  # a cuda.core without replace_address, or one that reads more: encode
        plan.maps[i] = tensor_map(t, plan.rows[i])
    plan.ptrs[i] = t.data_ptr()


_sms: dict = {}


def _sm_count(device) -> int:
    n = _sms.get(device.index)
    if n is None:
        n = _sms[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n
