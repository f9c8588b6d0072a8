"""Stage 5 — vectorized, asynchronous, P in registers (mma.sync), CUDA C++ through NVRTC.

The FlashAttention-2 formulation (stages/stage5.cu): 16-byte cp.async copies of Q, K and V
into a ring of STAGES K/V buffers in a swizzled (bank-conflict-free) shared-memory layout;
ldmatrix and mma.sync m16n8k16, so the softmax runs on S in the accumulator registers and P
goes from registers straight into the second product; output through shared memory in
16-byte stores. The 16-byte copies need 16-byte-aligned rows: the data pointers and the batch,
head and sequence strides of q, k and v must be multiples of 8 elements (INFO.align_bytes).

Each of the stage's ideas is a compile-time switch of the kernel (IDEAS), so that it can be
measured alone: `attention(q, k, v, ideas={"COPY_BYTES": 2})` runs the stage with 2-byte
copies, `waterfall()` lists the builds from a stage-4-like one to the stage's own, one idea
added per step, and `leave_one_out()` the stage's build with one idea taken out.

Serving (issue 22): causal attention in either alignment, SDPA's top-left (causal=True) or
bottom-right (causal="bottom_right", or attn_mask=causal_lower_right(Sq, Sk): the Sq queries are
the last Sq key positions, as in chunked prefill against a cache); packed sequences of different
lengths through `attention_varlen` (FlashAttention's flash_attn_varlen_func: q, k, v as
[total, H, D] with cu_seqlens offsets; a build of the kernel of its own, VARLEN).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from lib import nvrtc
from lib.inputs import StageInfo, causal_from_mask, sdpa_causal, validate_varlen

SOURCE = Path(__file__).with_suffix(".cu")
# (BLOCK_Q, BLOCK_K, STAGES, WARP_Q) per head dim: the fastest of CHOICES on the H100 at
# B16 H16 S2048 D64 and B4 H16 S8192 D128 in the sweep of 5f8d1dd (scripts/tile_sweep.py). The
# sweep recorded at 81c4acd had (128, 32, 2, 32) 2-4% ahead at D128; in the same interleaved
# rounds (--interleaved, results/logs/2026-11-26-1336dc8-h100) these are 1.12x faster full, level causal.
TILES = {64: (128, 64, 2, 32), 128: (128, 64, 2, 32)}
CHOICES = [(64, 64, 2, 16), (128, 64, 2, 16), (128, 64, 3, 16), (128, 32, 2, 16),
           (128, 64, 2, 32), (128, 32, 2, 32), (128, 32, 3, 32), (128, 128, 2, 32)]

INFO = StageInfo(
    number=5,
    slug="vectorized",
    title="Vectorized, asynchronous, P in registers",
    adds="16-byte cp.async copies into a multi-stage K/V ring with a swizzled, conflict-free "
         "layout; ldmatrix + mma.sync, so the softmax works in registers and P feeds P·V "
         "without shared memory.",
    backend="nvrtc",
    min_cc=(8, 0),
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),
    sources=("stages/stage5.py", "stages/stage5.cu", "stages/mma.cuh", "stages/attention.cuh"),
    gqa=True,
    causal_alignments=("top_left", "bottom_right"),
    varlen=True,
    saves_lse=True,  # for stage 8's backward
    align_bytes=16,  # 16-byte cp.async copies: pointers and batch/head/seq strides too
    # At D128 the 32-row warps with 64-key tiles need more than 255 registers, and ptxas spills
    # a few bytes (20 with NVRTC 13.0, up to 88 with 13.4). Measured on the H100 they are still
    # the fastest choice (the tile sweep), so they stay: the offline test allows this many.
    extra={"spill_bytes_allowed": {128: 128}},
    # the notebook's section 2 at D 64: the tensor core busy from the serialized to the
    # overlapped bound (SASS counts, NVRTC 13.5) × the recorded matmul ceiling (718 TFLOPS)
    prediction={"tflops": (344, 537),
                "basis": "HMMA and all instructions per K/V tile (SASS of NVRTC 13.5): serialized "
                         "(low) to overlapped (high) issue, × the matmul ceiling recorded at "
                         "4506624 (718 TFLOPS)"},
)


# ---- idea by idea ----------------------------------------------------------------------------
# The kernel's switches (stages/stage5.cu) and the values each may take; the first is the
# stage's own build. STAGES (the K/V ring depth) is also part of the tiles: set here, it
# overrides theirs.
SWITCHES = {"COPY_BYTES": (16, 2), "STAGES": (2, 1, 3), "NO_SWIZZLE": (0, 1), "PAD_ROWS": (0, 1),
            "P_IN_REGISTERS": (1, 0), "FAST_EXP2": (1, 0)}
# The stage-4-like start of the waterfall: every idea of this stage undone, on stage 5's
# tiles, warps and mma.sync (stage 4 itself is timed next to it, for reference).
BASELINE = {"COPY_BYTES": 2, "STAGES": 1, "PAD_ROWS": 1, "P_IN_REGISTERS": 0, "FAST_EXP2": 0}
# The ideas in the order the waterfall adds them, each with the defines that turn it on. The
# order makes each step meaningful: cp.async copies 4, 8 or 16 bytes, so the wider copies come
# before the ring that lets them run under the compute; the swizzle then replaces the padding
# of the tiles the ring has multiplied; P in registers and the cheaper 2^x then trim the
# loop's own instructions.
IDEAS = {
    "16-byte copies": {"COPY_BYTES": 16},
    "K/V ring of 2": {"STAGES": 2},
    "swizzle for padding": {"PAD_ROWS": 0},
    "P in registers": {"P_IN_REGISTERS": 1},
    "ex2.approx.ftz": {"FAST_EXP2": 1},
}
# Measured next to the ideas, not one of them: a deeper ring, and plain rows (bank conflicts).
ALTERNATIVES = {"ring of 3": {"STAGES": 3}, "plain rows": {"NO_SWIZZLE": 1}}
# Spills: none at D 64. At D 128 the variants sit at the 255-register limit like the stage's
# build, and ptxas spills several of them more than it (with NVRTC 13.x up to 124 bytes, e.g.
# the stage-4-like build and exp2f; the notebook's SASS table lists each): all within
# INFO.extra["spill_bytes_allowed"], which the offline test holds every variant to.


def check_ideas(ideas: dict | None) -> dict:
    """The switches of `ideas` (a dict of the kernel's defines), checked: a ValueError names
    an unknown switch or a value it cannot take."""
    ideas = dict(ideas or {})
    for name, value in ideas.items():
        if name not in SWITCHES:
            raise ValueError(f"ideas: unknown switch {name!r}; the switches of stages/stage5.cu "
                             f"are {list(SWITCHES)}")
        if isinstance(value, bool) or value not in SWITCHES[name]:
            raise ValueError(f"ideas: {name} must be one of {SWITCHES[name]}, got {value!r}")
    if ideas.get("NO_SWIZZLE") and ideas.get("PAD_ROWS"):
        raise ValueError("ideas: NO_SWIZZLE (plain rows) and PAD_ROWS (padded rows) are two "
                         "layouts: set one of them")
    return ideas


def waterfall() -> list[tuple[str, dict]]:
    """(name, ideas) from the stage-4-like build to the stage's own, one idea added per step:
    the first is "stage-4-like", the others are the names of IDEAS."""
    steps, ideas = [("stage-4-like", dict(BASELINE))], dict(BASELINE)
    for name, on in IDEAS.items():
        ideas = {**ideas, **on}
        steps.append((name, ideas))
    return steps


def leave_one_out() -> list[tuple[str, dict]]:
    """("without <idea>", ideas) for each idea: the stage's build with that one idea undone."""
    return [(f"without {name}", {key: BASELINE[key] for key in on}) for name, on in IDEAS.items()]


def variant(name: str) -> dict:
    """The ideas of a variant by its name (waterfall(), leave_one_out() or ALTERNATIVES);
    "stage 5" is the stage's own build."""
    table = {"stage 5": {}, **dict(waterfall()), **dict(leave_one_out()), **ALTERNATIVES}
    if name not in table:
        raise ValueError(f"no stage 5 variant {name!r}; the variants are {list(table)}")
    return dict(table[name])


def _idea_defines(ideas: dict) -> tuple:
    """The defines of `ideas` that differ from the stage's build (which then needs none)."""
    return tuple((k, v) for k, v in sorted(ideas.items())
                 if k != "STAGES" and v != SWITCHES[k][0])


def smem_bytes(head_dim: int, block_q: int, block_k: int, stages: int, ideas: dict | None = None) -> int:
    """Dynamic shared memory of one block (stages/stage5.cu: SMEM_ELEMS): Q plus STAGES tiles
    of K and of V, rows padded by 8 elements with PAD_ROWS; P's tiles without P_IN_REGISTERS."""
    ideas = ideas or {}
    ld = head_dim + 8 if ideas.get("PAD_ROWS") else head_dim
    p = 0 if ideas.get("P_IN_REGISTERS", 1) else block_q * (block_k + 8)
    return ((block_q + 2 * stages * block_k) * ld + p) * 2


@lru_cache(maxsize=None)  # attention() asks on every call: made once
def config(head_dim: int, tiles: tuple[int, int, int, int] | None = None,
           swizzle: bool = True, ideas: tuple = ()) -> dict:
    """Launch settings for one choice of (BLOCK_Q, BLOCK_K, STAGES, WARP_Q): block_q, threads
    (a warp per WARP_Q rows), dynamic shared memory (Q plus STAGES tiles of K and of V), and
    the kernel's defines. `ideas`: the switches of a variant, as sorted (name, value) pairs."""
    ideas = check_ideas(dict(ideas))
    if not swizzle:
        ideas = check_ideas({**ideas, "NO_SWIZZLE": 1})
    bq, bk, stages, warp_q = tiles or TILES[head_dim]
    stages = ideas.get("STAGES", stages)
    defines = (("BLOCK_Q", bq), ("BLOCK_K", bk), ("STAGES", stages), ("WARP_Q", warp_q))
    defines += _idea_defines(ideas)
    return {"block_q": bq, "threads": 32 * bq // warp_q,
            "smem": smem_bytes(head_dim, bq, bk, stages, ideas), "defines": defines}


def _ideas_key(ideas) -> tuple:
    return tuple(sorted(check_ideas(ideas).items()))


def compile_for(arch: str, dtype=torch.float16, head_dim: int = 64, tiles=None,
                swizzle: bool = True, ideas: dict | None = None, packed: bool = True) -> dict:
    """The stage's kernel compiled for `arch` without a GPU, for lib.sass: the build contiguous
    inputs run (row strides the constant D), or with packed=False the one for any row stride."""
    cfg = config(head_dim, tiles and tuple(tiles), swizzle, _ideas_key(ideas))
    return {f"stage{INFO.number} {str(dtype)[6:]} D{head_dim}":
            nvrtc.compile_stage(SOURCE, arch=arch, dtype=dtype, head_dim=head_dim,
                                defines=dict(cfg["defines"] + (nvrtc.PACKED_ROWS if packed else ())))}


def attention(q, k, v, *, causal=False, scale=None, attn_mask=None, is_causal=None, enable_gqa=True, tiles=None, swizzle=True,
              ideas=None, lse=None):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True) for q [B, H, Sq, D], k/v [B, H_kv, Sk, D] with H a multiple of H_kv, read in
    place with their strides; output a new contiguous tensor in q's dtype. `tiles` = (BLOCK_Q,
    BLOCK_K, STAGES, WARP_Q), one of CHOICES, swizzle=False (plain rows, bank conflicts) and
    `ideas` (a dict of the kernel's switches, SWITCHES; `variant(name)` gives those of a named
    variant) are for measuring the alternatives.
    `causal` may also name the alignment, "top_left" or "bottom_right", and `attn_mask` may be
    SDPA's causal bias, causal_upper_left(Sq, Sk) or causal_lower_right(Sq, Sk)
    (lib.inputs.causal_mode). Packed sequences of
    different lengths: attention_varlen.
    Gradients: this is the forward alone (an input that requires grad is refused);
    stages.autograd.attention(q, k, v, forward=5) adds stage 8's backward. `lse`, a float32
    [B, H, Sq] tensor, receives the rows' log-sum-exp that backward starts from."""
    causal = sdpa_causal(q, k, causal, is_causal, enable_gqa)  # SDPA's keywords
    causal = causal_from_mask(causal, attn_mask, q, k, INFO)
    if tiles is not None and tuple(tiles) not in CHOICES:
        raise ValueError(f"tiles must be one of {CHOICES}, got {tiles}")
    D = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() == 4 else None
    cfg = config(D if D in TILES else 64, tiles and tuple(tiles), swizzle,
                 _ideas_key(ideas) if ideas else ())
    if lse is not None and (not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32
                            or not lse.is_contiguous() or tuple(lse.shape) != tuple(q.shape[:3])):
        raise ValueError(f"lse must be a contiguous float32 [B, H, Sq] = {list(q.shape[:3])} tensor")
    return nvrtc.launch_fused(INFO, SOURCE, q, k, v, causal=causal, scale=scale, lse=lse, **cfg)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, scale=None):
    """Packed sequences of different lengths, as FlashAttention's flash_attn_varlen_func takes
    them: q [total_q, H, D], k and v [total_k, H_kv, D], sequence b being rows
    cu_seqlens_q[b] … cu_seqlens_q[b + 1] − 1 of q and cu_seqlens_k[b] … of k and v (int32
    offsets on q's device, starting at 0, non-decreasing, ending at the total); max_seqlen_q and
    max_seqlen_k at least the longest. causal: False, "top_left" or "bottom_right" within each
    sequence (a row that sees no key, and every row of a sequence without keys, gives zeros).
    Output [total_q, H, D]. One block per (sequence, head, query tile of the longest sequence);
    the blocks past a shorter sequence's end return at once. Reads the offsets on the host to
    check them (lib.inputs.validate_varlen)."""
    call = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=causal, scale=scale, info=INFO)
    cfg = config(q.shape[-1], None, True, ())
    return nvrtc.launch_fused(INFO, SOURCE, call.q, call.k, call.v, causal=call.causal,
                              scale=call.scale, varlen=call, **cfg)
