"""Tensor maps: the copy engine's (TMA's) description of a tensor in global memory, for the
Hopper stages (stage 6's forward, stage 8's backward). Kept here, below the stages, so that a
stage that needs one does not import another stage for it."""
from __future__ import annotations

import torch


# Tried and not kept: the maps' L2 promotion (how much the L2 fetches from memory for each copy
# request; cuda.core's default, kept here, fetches what is asked; CUTLASS encodes its maps with 128
# bytes). Predicted to help the streaming decoding rows, measured against none in the same rounds
# at the recorded map's 120 rows (results/logs/2026-11-26-3525efe-h100,
# experiments/l2_promotion/l2_promotion_ab.py): decoding 0.978-1.021x (median 1.00x at Sq 1 and Sq
# 4, 128 and 256 bytes alike), prompts of S <= 2048 level, and S >= 4096 slower, 0.93-1.00x with 128
# bytes (median 0.98x) and 0.89-1.00x with 256 (B1 H32 S16384 D128: 7,759 µs against 6,909), as if
# the promoted lines pushed K and V tiles still to be reread out of the L2 (not profiled).
def tensor_map(t: torch.Tensor, rows: int | tuple):
    """The copy engine's description of a [B, H, S, D] tensor with its real strides: boxes of
    `rows` × 64 elements (128 bytes, the widest box a 128-byte swizzle takes), swizzled. `rows`
    may be a tuple for the box's leading dimensions: (group, Sq) for packed_queries' 5-D view.
    Encoding costs host time: stage 6's attention() and stage 8's backward make a tensor's map
    once per layout (their plans) and afterwards only replace the address. Each call here returns a new map of its own."""
    from cuda.core.utils import StridedMemoryView
    from cuda.core._tensor_map import TensorMapSwizzle
    # The copy engine moves bits: a 16-bit integer view of fp16/bf16 has the same layout.
    # It also wants every stride a multiple of 16 bytes, even where a dimension has size 1
    # and its stride is never used: give those one that is.
    strides = [st if n > 1 else 8 * (t.numel() + 1) for n, st in zip(t.shape, t.stride())]
    strides[-1] = 1
    t = t.as_strided(t.shape, strides)
    view = StridedMemoryView.from_dlpack(t.view(torch.uint16), stream_ptr=-1)
    box = (1,) * (t.dim() - 1 - len(rows)) + tuple(rows) if isinstance(rows, tuple) else (1, 1, rows)
    return view.as_tensor_map((*box, 64), swizzle=TensorMapSwizzle.SWIZZLE_128B)


class Address:
    """The one thing TensorMapDescriptor.replace_address reads from a tensor: its address (as
    __cuda_array_interface__, far cheaper to build than a DLPack capsule)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, t):
        self.__cuda_array_interface__ = {"shape": (t.numel(),), "typestr": "<u2", "version": 3,
                                         "data": (t.data_ptr(), False), "strides": None}
