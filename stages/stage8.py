"""Stage 8 — the backward pass (FlashAttention-2's algorithm), CUDA C++ through NVRTC.

`attention_backward(q, k, v, out, dout, lse)` gives (dq, dk, dv) from the forward's inputs,
its output, the output's gradient and the row log-sum-exp the forward saved
(stages/stage8.cu says how). Three steps, timed together:
  1. preprocess (stages/stage8_preprocess.cu, one kernel): δ = rowsum(dO ∘ O) in float32, and
     lse in log2 units; both padded to whole query blocks (lse with +∞, so padded rows get P = 0);
  2. the dK/dV kernel: one block per block of keys of a (batch, K/V head), dK and dV in
     registers while it walks over every query block of the group's heads;
  3. dQ: either a kernel of its own, one block per 64 query rows walking over the keys as the
     forward does, or (dq_atomics=1) summed by the dK/dV kernel into a float32 dQ, which is
     converted to q's dtype at the end.
Two builds of the same kernels: mma.sync (stages/stage8.cu, any GPU from sm_80, with tile
choices and `dq_atomics=1`, dQ summed by float32 atomics in step 2 instead of step 3) and
WGMMA (stages/stage8_wgmma.cu, sm_90a: every product a warpgroup's wgmma, with switches of its
own), the default on an H100. On an H100 the stage's build (WGMMA_BUILD) sums dQ in the dK/dV
kernel with the copy engine's bulk reductions and loads Q and dO by TMA from a producer
warpgroup feeding two MMA warpgroups per block (at D 64 taking turns at dQ). The notebook
measures each switch against the others.

Autograd: `with_grad(forward, q, k, v, ...)` runs a forward that saves the log-sum-exp so
that its output's grad_fn runs this backward. This stage's `attention` is stage 5's forward
taken that way; stages/autograd.py does the same for stage 6's (forward=6), so that the
forward stages need not know about this one. GQA sums dK and dV over each
group of query heads; causal works in both alignments; any length. Head dims 64 and 128; 96 in
D 128's tiles (the mma.sync build: on zero-padded copies, PADDED); 256 in the WGMMA build alone,
two warpgroups splitting D (stages/stage8_wgmma.cu, "Head dim 96" and "Head dim 256"). With dQ summed by atomics
(the WGMMA build's default) the order of the additions changes from run to run, so dQ's last
bits may too; `dq_atomics=0` gives the dQ pass, whose dQ is the same bits for the same inputs.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from lib import nvrtc
from lib.tma import Address, tensor_map
from stages import stage5  # the forward this stage's attention() takes gradients through
from stages.stage6_variants import NONE as NO_VARIANTS, Variants
from stages.stage8_variants import check_backward_variants, sinks_gradient, variant_args, variant_switches  # noqa: F401
from lib.inputs import StageInfo, causal_from_mask, causal_mode, sdpa_causal, validate_cached, wants_grad

SOURCE = Path(__file__).with_suffix(".cu")
WGMMA_SOURCE = Path(__file__).with_name("stage8_wgmma.cu")  # the Hopper build (WGMMA 1, sm_90a)
PREPROCESS_SOURCE = Path(__file__).with_name("stage8_preprocess.cu")  # δ and lse in log2 units, both builds
POSTPROCESS_SOURCE = Path(__file__).with_name("stage8_postprocess.cu")  # bulk-summed dQ back to rows
# (BLOCK_N keys per block: 16 per warp, BLOCK_M queries per step) per head dim, the fastest of
# CHOICES with the dQ pass in that measurement. At D 128 a warp's dK and dV take 128
# accumulator registers; with 64 queries per step, Sᵀ and dPᵀ another 64 and ptxas spills
# (160 B), so D 128 steps 32 queries at a time.
TILES = {64: (64, 64), 128: (64, 32)}
CHOICES = [(64, 64), (64, 32), (128, 64), (128, 32)]
# The kernel's compile-time switch: dQ computed by a pass of its own, attention_backward_dq
# (0), or summed by float32 atomics in the dK/dV kernel (1). The first value is the stage's
# build: on the H100 the dQ pass took 1.39-1.61x less time than the atomics at the standard
# shapes of both head dims (results/logs/2026-11-25-aa31e81-call4/backward.log), although it
# computes two more products per tile — at B4 H16 S8192 D128 the atomics add 34 GB into dQ.
SWITCHES = {"DQ_ATOMICS": (0, 1), "WGMMA": (1, 0), "OVERLAP": (1, 0), "WARPGROUPS": (1, 2), "DQ_BULK": (0, 1),
            "TMA_LOADS": (0, 1), "DQ_TURNS": (0, 1), "DQ_EARLY": (0, 1), "BLOCKS_PER_SM": (1, 3), "PRODUCER": (0, 1),
            "DS_GUARD": (0, 1), "DK_LAST": (0, 1), "MASK_SPLIT": (0, 1), "SCALE_AT_END": (0, 1), "EPILOGUE_SMEM": (0, 1), "LONGEST_FIRST": (0, 1),
            "DS_STMATRIX": (0, 1), "PREP_EARLY": (0, 1, 2, 3), "KV_REGS": (0, 1, 2), "ROWS80": (0, 1)}
# WGMMA 1: the same kernels with every product a warpgroup's wgmma (stages/stage8_wgmma.cu,
# sm_90a only: the build on an H100); 0: mma.sync (stages/stage8.cu, any GPU from sm_80). The
# WGMMA build has fixed 64-row tiles and switches of its own (stages/stage8_wgmma.cu says how
# each works), each measured against the others (scripts/backward_bench.py --variants):
#   OVERLAP     each product its own commit group, the exponentials computed while the next
#               product runs (1), or every product waited for at once (0);
#   WARPGROUPS  warpgroups per dK/dV block, 64 keys each, sharing the Q and dO tiles;
#   DQ_ATOMICS  (its own default, not the mma.sync build's) dQ = dS·K by wgmma in the dK/dV
#               kernel, summed into a float32 dQ by vector reductions, instead of the dQ pass;
#   DQ_BULK     with DQ_ATOMICS: summed by the copy engine's bulk reductions from shared memory;
#   TMA_LOADS   the dK/dV kernel's Q, dO, lse and δ loaded by the copy engine two steps ahead,
#               with mbarriers instead of a block barrier per step;
#   DQ_TURNS    (two warpgroups at D 64) the warpgroups take turns making dQ over all 128 keys,
#               instead of each adding its own 64 keys' share every step;
#   DQ_EARLY    (with DQ_ATOMICS) a warpgroup exchanges dSᵀ and issues its dQ product while its
#               dV and dK products still run, instead of waiting for them first.
#   BLOCKS_PER_SM  (one warpgroup at D 64, without OVERLAP) 3: registers and shared memory
#               budgeted so that three blocks share an SM instead of two (168 registers, one
#               buffer of dQ tiles). With OVERLAP ptxas finds no room: at 168 registers it
#               spilled 88 bytes and serialized the wgmmas (C7512).
#   PRODUCER    (with TMA_LOADS and DQ_BULK) a warpgroup of its own issues the loads and the dQ bulk
#               reductions (FlashAttention-3's producer, setmaxnreg 24), the others only multiply:
#               one more warpgroup per block (threads), a "full" and an "empty" mbarrier per dQ buffer.
#   DS_GUARD    (with DQ_ATOMICS, two warpgroups whose dQ products read both's dSᵀ) each step's dSᵀ
#               store waits at a named barrier for the other warpgroup's dQ product of the step
#               before, which arrives there once it has read (without it, time orders them:
#               experiments/backward_producer, "Found by reading, then guarded").
#   DK_LAST     (with DQ_ATOMICS, one dQ product per turn) FlashAttention-3's order: dK's product
#               issued after dQ's, so that it runs while the warps store the dQ tile.
#   MASK_SPLIT  the exponentials of a step whose tile no mask edge cuts skip the per-score compares
#               (the softcap's builds keep them).
#   SCALE_AT_END (with DQ_BULK, or the dQ pass) dS without the softmax scale: dK's accumulators and
#               the postprocess's dQ take it once, instead of a multiply per score every step.
#   EPILOGUE_SMEM dK and dV stored through shared memory in whole 16-byte pieces of rows, instead of
#               the accumulators' 4-byte pairs straight from registers.
#   DS_STMATRIX (with DQ_ATOMICS) a warp's dSᵀ stored for the dQ product by four stmatrix a step
#               instead of sixteen 4-byte stores.
#   PREP_EARLY  a step's lse (the thread's 16 columns) read into registers and its first query row
#               worked out before Sᵀ and dPᵀ are issued, not after the wait for Sᵀ; 2: δ's too, read
#               once Sᵀ is in (D 64: at D 128 that spills); 3: as 1, but after the products are issued.
#   KV_REGS     (D 64) K and V (1), or K alone (2), read into registers once per block, the A operands
#               of Sᵀ and dPᵀ, which then read only Q and dO from shared memory.
#   ROWS80      (D 96/128: two warpgroups splitting dQ's columns, the producer; DK_LAST and PREP_EARLY off; no variants)
#               80 queries a step instead of 64, FlashAttention-3's full-attention tile: dQᵀ = Kᵀ·dSᵀ,
#               one buffer of dQ tiles; K's and V's reads and dQ's product per score 4/5 of 64's.
WGMMA_SWITCHES = ("OVERLAP", "WARPGROUPS", "DQ_ATOMICS", "DQ_BULK", "TMA_LOADS", "DQ_TURNS", "DQ_EARLY",
                  "BLOCKS_PER_SM", "PRODUCER", "DS_GUARD", "DK_LAST", "MASK_SPLIT", "SCALE_AT_END", "EPILOGUE_SMEM", "LONGEST_FIRST",
                  "DS_STMATRIX", "PREP_EARLY", "KV_REGS", "ROWS80")
# The stage's WGMMA build per head dim, from the switches measured in the same rounds on the H100
# (the backward record, results/logs/2026-11-26-49da751-h100/backward.log, bf16, the standard
# shapes):
#   D 128: two warpgroups, dQ summed by bulk reductions, TMA loads: 1.33x (full and causal) the
#     one-warpgroup build with the dQ pass. Two warpgroups split dQ's 128 columns, so each row
#     of dQ gets one addition per 128 keys; the copy engine takes loads and sums off the warps,
#     which then wait for each other only where they swap dS.
#   D 64: one warpgroup, dQ by bulk reductions, TMA loads: 1.14x (full) and 1.12x (causal). At
#     D 64 a step has half the products of D 128 for the same exponentials and bookkeeping, and
#     two warpgroups (which must each add their own keys' dQ, 64 columns being one wgmma's
#     width) ran no faster than one, nor did they taking turns at dQ over all 128 keys
#     (DQ_TURNS: half the additions into dQ, 0.98-1.00x).
#   D 64 without OVERLAP: the build with it ran 0.98-0.99x of the one without at the full row
#     and 0.995-1.00x at the causal one, in each of three records (results/logs/
#     2026-11-26-afc9f16-h100 and 2026-11-26-bb4ff6f-h100). A D 64 step's products are short (64
#     columns), so waiting for each one separately costs about what the exponentials gain by running
#     under them. Three blocks per SM (BLOCKS_PER_SM 3) ran 0.99x of two (2026-11-26-bb4ff6f-h100);
#     Nsight Compute then found the kernel's L2 at 78% of its peak, half of it the bulk reductions
#     into dQ (2026-11-26-adea0d9-h100).
#   Both: DQ_EARLY off. The dQ product issued while dV and dK still run ran 0.98-1.03x of the
#     build without it at the four standard rows (results/logs/2026-11-26-afc9f16-h100/backward.log),
#     and 1.00-1.02x of the stage's build, producer and guard included (H200, 2026-11-29,
#     experiments/backward_dq_early/h200_1440e0e.log).
#   Both: PRODUCER on (H200, same rounds, bf16, the standard rows; results/logs/2026-11-29-c76a9ce-
#     h200-producer/pbench.txt). The build above with a producer warpgroup ran 1.13-1.15x (D 64) and
#     1.09-1.10x (D 128) its speed. With the producer's registers given to them, two warpgroups at
#     D 64 taking turns at dQ ran 1.17x (full) and 1.13x (causal): that is D 64's build now. The
#     builds before it stay measurable (BEFORE_PRODUCER, the record's comparisons).
BEFORE_PRODUCER = {
    64: {"OVERLAP": 0, "WARPGROUPS": 1, "DQ_ATOMICS": 1, "DQ_BULK": 1, "TMA_LOADS": 1, "DQ_TURNS": 0, "DQ_EARLY": 0,
         "BLOCKS_PER_SM": 1, "PRODUCER": 0, "DS_GUARD": 0, "DK_LAST": 0,
         "MASK_SPLIT": 0, "SCALE_AT_END": 0, "EPILOGUE_SMEM": 0, "LONGEST_FIRST": 0, "DS_STMATRIX": 0, "PREP_EARLY": 0,
         "KV_REGS": 0, "ROWS80": 0},
    128: {"OVERLAP": 1, "WARPGROUPS": 2, "DQ_ATOMICS": 1, "DQ_BULK": 1, "TMA_LOADS": 1, "DQ_TURNS": 0, "DQ_EARLY": 0,
          "BLOCKS_PER_SM": 1, "PRODUCER": 0, "DS_GUARD": 0, "DK_LAST": 0,
          "MASK_SPLIT": 0, "SCALE_AT_END": 0, "EPILOGUE_SMEM": 0, "LONGEST_FIRST": 0, "DS_STMATRIX": 0, "PREP_EARLY": 0,
          "KV_REGS": 0, "ROWS80": 0},
}
#   Both: DS_GUARD on. One shared-memory buffer holds both warpgroups' dSᵀ, and a warpgroup's store
#     of the next step's may otherwise overtake the other's dQ product still reading this step's
#     (FlashAttention-3 syncs its warpgroups at the same place). The guard, an arrival right after
#     the read and a wait before the store, ran 0.99x and 1.00x the build without it at D 64 (full,
#     causal) and 1.03x and 0.99x at D 128 in the backward record at b6a1670 (H200, same rounds,
#     bf16; results/logs/2026-11-29-b6a1670-h200; the forms timed before it in
#     results/logs/2026-11-29-6c69c51-h200-ds-guard).
#   D 128: DK_LAST on (FlashAttention-3's order: dK's product after dQ's, which the warps store while
#     dK runs): 1.03-1.06x the build without it at six rows (H200, same rounds, bf16; dK and dV bit-equal;
#     experiments/backward_dk_last). D 64 off: 0.995-0.998x there, its dQ product being every other step's.
#   Both: MASK_SPLIT on (a step whose tile no mask edge cuts skips the per-score compares): 1.03-1.04x
#     the build without it at D 64 (full, causal) and D 128 causal, 1.01-1.02x at S 512, level at D 128
#     full (0.998x) (H200, same rounds, bf16; dK and dV bit-equal; experiments/backward_mask_split).
#   Both: SCALE_AT_END on (one multiply a score less every step): 1.012-1.021x the build without it at
#     five D 64 rows, dK and dV bit-equal (the scale is 2⁻³) (H200, same rounds, bf16;
#     experiments/backward_scale_at_end). Both: EPILOGUE_SMEM on (dK and dV leave through shared
#     memory in whole 16-byte pieces of rows): 1.015-1.064x the build without it at five D 64 rows
#     from S 512 to S 8192, the most where a block walks fewest steps (experiments/backward_epilogue).
#     At D 128 the two A/Bs that kept them off there (0.988-0.998x, and 0.96x at S 8192) were made
#     before LONGEST_FIRST, DS_STMATRIX and PREP_EARLY; on the build with those the two together ran
#     1.029-1.069x the build without them at seven D 128 rows (S 2048 and 8192, full and causal,
#     bf16 and fp16), either alone 0.990-1.056x (H200, same rounds; dV bit-equal, dK rounded apart
#     as the scale 128^-0.5 is no power of two; experiments/backward_d128_end_switches).
#     At D 96 and 128 EPILOGUE_SMEM is off with a softcap or without the producer: its addresses
#     spill there, 16-24 and 4 bytes (config()).
#   Both: LONGEST_FIRST on (causal calls without a window: key block j of every head in an L2-sized
#     section of heads starts before block j + 1 of any, FlashAttention-3's order), except where
#     longest_first() says: 1.01-1.21x head by head at the training map's twelve grouped-heads (4:1)
#     causal rows but its S 16384 D 64 one, where a section holds one head and the order is head
#     by head's; with one K/V head per query head 0.98-1.03x from S 4096 and 0.94-1.00x below, the
#     least at S 512 (H200, same rounds, bf16; dK and dV bit-equal; experiments/backward_longest_first).
#   Both: DS_STMATRIX on (a warp's dSᵀ stored by four stmatrix, not sixteen 4-byte stores): 1.000-1.005x
#     the build without it at four D 64 rows in each of two runs, 1.03x at D 128 S 1024 full, level
#     within the rounds' spread at D 128 S 8192 (H200, same rounds, bf16; dK and dV bit-equal;
#     experiments/backward_step_overheads).
#   D 128: PREP_EARLY 1 on (lse read into registers before the products, not after the wait for Sᵀ):
#     1.031x alone at D 128 S 1024 full; on top of DS_STMATRIX 1.005x there and 1.003x and 1.006x at
#     S 8192 full and causal (whose rounds spread 4-16%: unresolved). D 64 off: 0.987-1.000x;
#     PREP_EARLY 2 (δ too) 0.95-0.99x; and D 64 with OVERLAP, now beside the producer, 0.985-0.993x
#     (same probe).
#   D 64: KV_REGS 1 and PREP_EARLY 3 on, together (K and V held in registers as the A operands of Sᵀ and
#     dPᵀ, which then read only Q and dO from shared memory; lse read while the products run): 1.007-1.023x
#     the build without them at four S 2048 rows (bf16 and fp16, full and causal), 1.011x and 1.007x at
#     S 512 (H200, same rounds; dK and dV bit-equal; experiments/backward_kv_regs). Either alone did less:
#     KV_REGS 1 0.992-1.010x, KV_REGS 2 (K alone) 0.977-1.005x, PREP_EARLY 3 0.973-0.998x. At D 128 K
#     alone spills (112-144 bytes), and PREP_EARLY 3 ran 0.988-1.020x PREP_EARLY 1's build.
WGMMA_BUILD = {
    64: {**BEFORE_PRODUCER[64], "WARPGROUPS": 2, "DQ_TURNS": 1, "PRODUCER": 1, "DS_GUARD": 1, "MASK_SPLIT": 1,
         "SCALE_AT_END": 1, "EPILOGUE_SMEM": 1, "LONGEST_FIRST": 1, "DS_STMATRIX": 1, "KV_REGS": 1, "PREP_EARLY": 3},
    128: {**BEFORE_PRODUCER[128], "PRODUCER": 1, "DS_GUARD": 1, "DK_LAST": 1, "MASK_SPLIT": 1, "SCALE_AT_END": 1,
          "EPILOGUE_SMEM": 1, "LONGEST_FIRST": 1, "DS_STMATRIX": 1, "PREP_EARLY": 1},
    # D 256 (issue 51): the one layout that fits. Two warpgroups share 64 keys and split D's
    # columns (a warpgroup's dK and dV over all of D would take 256 registers a thread); dQ by its
    # own pass, as there is no room in shared memory for dSᵀ and dQ tiles beside two Q and two dO
    # tiles of 32 KB each (stages/stage8_wgmma.cu, "Head dim 256"). Without OVERLAP: 1.04-1.07x
    # the build with it at four rows (H200, same rounds, bf16; experiments/backward_head_dims).
    256: {**BEFORE_PRODUCER[128], "DQ_ATOMICS": 0, "DQ_BULK": 0, "OVERLAP": 0},
}
# D 96 (Phi-3's) in D 128's tiles, columns 96-127 zero (stages/stage8_wgmma.cu, "Head dim 96"): D 128's build.
WGMMA_BUILD[96] = WGMMA_BUILD[128]
# LONGEST_FIRST is off, unless the call says, for one K/V head per query head below this many query
# rows: there the blocks running together share less of Q and dO in L2 across heads than head by
# head, and the tail the order shortens is short (WGMMA_BUILD's comment).
LONGEST_FIRST_MIN_SQ = 4096


def longest_first(Sq: int, group: int) -> int | None:
    """LONGEST_FIRST for a call that leaves it unsaid: 0 without grouped heads below
    LONGEST_FIRST_MIN_SQ query rows, else None (the build's, WGMMA_BUILD)."""
    return 0 if group == 1 and Sq < LONGEST_FIRST_MIN_SQ else None
# Head dims the mma.sync build takes by running another's build on zero-padded copies: D 96 as
# D 128 (columns 96-127 of Q, K, V, O and dO zero change no score, no δ and no gradient of the
# first 96 columns; the scale stays 1/sqrt(96)). The price: five copies in and three out. The
# WGMMA build takes D 96 in its own tiles instead, without copies (experiments/backward_head_dims).
PADDED = {96: 128}
WGMMA_ONLY = (256,)  # head dims only the WGMMA build has (an sm_90 GPU)
HEAD_DIMS = (64, 96, 128, 256)  # attention_backward's: every head dim stage 6's forward has
WGMMA_ROWS = 64
DQ_ROWS, DQ_KEYS = 64, 64  # the dQ pass's query rows per block and keys per tile (stage8.cu)

INFO = StageInfo(
    number=8,
    slug="backward",
    title="The backward pass",
    adds="Gradients: dQ, dK and dV recomputed tile by tile from the saved log-sum-exp "
         "(FlashAttention-2's backward): dK and dV held per key block, dQ summed from them; on "
         "Hopper every product a WGMMA, loads by TMA, dQ by bulk reductions.",
    backend="nvrtc",
    min_cc=(8, 0),
    dtypes=(torch.float16, torch.bfloat16),
    head_dims=(64, 128),  # the stage's attention(): stage 5's forward (the backward's own: HEAD_DIMS)
    sources=("stages/stage8.py", "lib/tma.py", "stages/stage8.cu", "stages/stage8_wgmma.cu", "stages/stage8_preprocess.cu",
             "stages/stage8_variants.py", "stages/stage6_variants.py",
             "stages/stage8_postprocess.cu",
             "stages/mma.cuh",
             "stages/hopper.cuh", "stages/attention.cuh"),
    gqa=True,
    causal_alignments=("top_left", "bottom_right"),
    align_bytes=16,  # 16-byte cp.async copies of Q, K, V and dO
    # At D 128 a warp holds dK and dV (128 accumulator registers) and Sᵀ and dPᵀ (32 more):
    # with dQ atomics, NVRTC 13.0 (the H100 machine's) spills 8 bytes there, 13.5 none.
    extra={"spill_bytes_allowed": {128: 8}},
)
_BACKWARD_INFO = replace(INFO, head_dims=HEAD_DIMS)  # what attention_backward validates against


def tile_width(head_dim: int) -> int:
    """The WGMMA build's tile width at a head dim: whole 64-column atoms (D 96: 128)."""
    return -(-head_dim // 64) * 64


def smem_bytes(head_dim: int, block_n: int, block_m: int, dq_atomics: int = 1) -> int:
    """Dynamic shared memory of one dK/dV block (stages/stage8.cu: SMEM_BYTES_NEEDED): K and V,
    two buffers each of Q and dO, the dSᵀ tile (with dQ atomics), two buffers each of lse and δ."""
    ds = block_n * block_m if dq_atomics else 0
    return (2 * block_n * head_dim + 4 * block_m * head_dim + ds) * 2 + 4 * block_m * 4


def dq_smem_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one block of the dQ pass: Q and dO, two K and two V tiles."""
    return (2 * DQ_ROWS + 4 * DQ_KEYS) * head_dim * 2


def wgmma_here() -> bool:
    """Whether this machine runs the WGMMA build: a GPU of compute capability 9.0 (sm_90a)."""
    return torch.cuda.is_available() and _capability(torch.cuda.current_device()) == (9, 0)


@lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:  # asked once per device, not on every call
    return torch.cuda.get_device_capability(index)


@lru_cache(maxsize=None)
def config(head_dim: int, tiles: tuple[int, int] | None = None, dq_atomics: int | None = None,
           wgmma: int = 0, softcap: int = 0, window: bool = False, **switches) -> dict:
    """Launch settings and defines for one build: tiles and the dQ switch (defaults: the stage's
    build) of the mma.sync kernels, or the WGMMA build (wgmma=1: fixed 64-row tiles, with
    dq_atomics and its own switches, WGMMA_SWITCHES by lower-case name; defaults
    WGMMA_BUILD[head_dim]). `softcap` (0, 1 or 2: SOFTCAP, stage 6's tanh forms) and `window`
    (WINDOW) are the models' variant builds (stages/stage8_wgmma.cu says how), WGMMA only; each
    define is there only when on, so that the builds without them are the kernels as they were."""
    if isinstance(softcap, bool) or softcap not in (0, 1, 2):
        raise ValueError(f"softcap must be 0, 1 or 2 (SOFTCAP: off, tanh.approx, tanh from ex2), got {softcap!r}")
    variant_defines = (("SOFTCAP", int(softcap)),) * bool(softcap) + (("WINDOW", 1),) * bool(window)
    if variant_defines and not wgmma:
        raise NotImplementedError("stage 8's model variants (softcap, window) are in the WGMMA build only "
                                  "(wgmma=1, an sm_90 GPU); the mma.sync build (stages/stage8.cu) has none")
    unknown = set(switches) - {n.lower() for n in WGMMA_SWITCHES}
    if unknown:
        raise TypeError(f"unknown switch(es) {sorted(unknown)}; the WGMMA build's are "
                        f"{sorted(n.lower() for n in WGMMA_SWITCHES)}")
    if wgmma:
        if tiles is not None and tuple(tiles) != (WGMMA_ROWS, WGMMA_ROWS):
            raise ValueError(f"the WGMMA build has fixed tiles {(WGMMA_ROWS, WGMMA_ROWS)}; pass wgmma=0 "
                             "for the mma.sync build's choices")
        given = {"dq_atomics": dq_atomics, **switches}
        if dq_atomics == 0 and switches.get("dq_bulk") is None:
            given["dq_bulk"] = 0  # the dQ pass asked for: nothing to sum in bulk
        chosen = {}
        for name in WGMMA_SWITCHES:
            value = given.get(name.lower())
            chosen[name] = WGMMA_BUILD[head_dim][name] if value is None else value
            if isinstance(chosen[name], bool) or chosen[name] not in SWITCHES[name]:
                raise ValueError(f"{name.lower()} must be one of {SWITCHES[name]}, got {chosen[name]!r}")
        # what DQ_TURNS and PRODUCER need of the other switches: where a call turns one of those off
        # and leaves these unsaid, they go off too (a dQ pass, one warpgroup, ...); asked for, refused
        turns_fit = chosen["WARPGROUPS"] == 2 and head_dim == 64 and chosen["DQ_ATOMICS"]
        producer_fits = chosen["TMA_LOADS"] and chosen["DQ_BULK"] and chosen["BLOCKS_PER_SM"] == 1
        if given.get("dq_turns") is None and not turns_fit:
            chosen["DQ_TURNS"] = 0
        if given.get("producer") is None and not producer_fits:
            chosen["PRODUCER"] = 0
        # DS_GUARD: two warpgroups whose dQ products read both's dSᵀ (D 128, or dQ in turns)
        dp = tile_width(head_dim)  # the tiles' width (D 96: D 128's)
        guard_fits = chosen["WARPGROUPS"] == 2 and chosen["DQ_ATOMICS"] and (dp == 128 or chosen["DQ_TURNS"])
        if given.get("ds_guard") is None and not guard_fits:
            chosen["DS_GUARD"] = 0
        # DK_LAST: one dQ product a turn in this kernel (D 64, or D 128's two halves)
        dk_last_fits = (chosen["DQ_ATOMICS"] and not chosen["DQ_EARLY"]
                        and (dp == 64 or dp // 64 == chosen["WARPGROUPS"]))
        if given.get("dk_last") is None and not dk_last_fits:
            chosen["DK_LAST"] = 0
        if given.get("scale_at_end") is None and chosen["DQ_ATOMICS"] and not chosen["DQ_BULK"]:
            chosen["SCALE_AT_END"] = 0  # the vector reductions' dQ has no postprocess to take the scale
        if given.get("epilogue_smem") is None and dp == 128 and (softcap or not chosen["PRODUCER"]):
            # D 96/128 with a softcap, or without the producer's setmaxnreg: its addresses spilled 16-24
            # and 4 bytes (NVRTC 13)
            chosen["EPILOGUE_SMEM"] = 0
        if given.get("mask_split") is None and chosen["BLOCKS_PER_SM"] == 3:
            chosen["MASK_SPLIT"] = 0  # in 168 registers its second loop of exponentials spilled 16 bytes
        if given.get("ds_stmatrix") is None and not chosen["DQ_ATOMICS"]:
            chosen["DS_STMATRIX"] = 0  # the dQ pass: no dSᵀ stored for a dQ product here
        # KV_REGS: only where the kernel makes dQ and loads by TMA. Without a dQ product the SASS (NVRTC 13.0)
        # writes K's and V's registers inside the loop, keeping no copy (tests/test_backward_producer.py,
        # test_kv_regs_registers_stay); with cp.async loads, K and V are read before they land
        kv_fits = chosen["DQ_ATOMICS"] and chosen["TMA_LOADS"]
        if given.get("kv_regs") is None and (not kv_fits or chosen["BLOCKS_PER_SM"] == 3):
            chosen["KV_REGS"] = 0  # (three blocks per SM: 168 registers, where K and V spill 164 bytes)
        if given.get("prep_early") is None and chosen["BLOCKS_PER_SM"] == 3:
            chosen["PREP_EARLY"] = 0
        if given.get("prep_early") is None and dp == 128 and (softcap or window or chosen["WARPGROUPS"] == 1):
            chosen["PREP_EARLY"] = 0  # the variants' masks and tanh, or one warpgroup's dQ over all of D,
            # beside 16 more registers: 4-80 bytes spilled
        if chosen["DS_GUARD"] and not chosen["DQ_ATOMICS"]:
            raise ValueError("ds_guard=1 orders the dSᵀ store of the dK/dV kernel's dQ product: it needs dq_atomics=1")
        if chosen["DS_GUARD"] and not guard_fits:
            raise ValueError("ds_guard=1 orders a warpgroup's dSᵀ store after the other's dQ product: it needs two "
                             "warpgroups whose dQ products read both warpgroups' dSᵀ (D 128, or dq_turns=1 at D 64)")
        if chosen["SCALE_AT_END"] and chosen["DQ_ATOMICS"] and not chosen["DQ_BULK"]:
            raise ValueError("scale_at_end=1 leaves the scale to the postprocess of dQ's bulk sum: it needs "
                             "dq_bulk=1, or the dQ pass (dq_atomics=0)")
        if chosen["DQ_BULK"] and not chosen["DQ_ATOMICS"]:
            raise ValueError("dq_bulk=1 is a way of summing dQ in the dK/dV kernel: it needs dq_atomics=1")
        if chosen["DQ_EARLY"] and not chosen["DQ_ATOMICS"]:
            raise ValueError("dq_early=1 issues the dQ product of the dK/dV kernel early: it needs dq_atomics=1")
        if chosen["DK_LAST"] and not dk_last_fits:
            raise ValueError("dk_last=1 issues dK after the dK/dV kernel's dQ product: it needs dq_atomics=1, "
                             "dq_early=0 and one dQ product per turn (D 64, or two warpgroups at D 128)")
        if chosen["PREP_EARLY"] == 2 and head_dim != 64:
            raise ValueError("prep_early=2 keeps δ in registers across dPᵀ too: at D 96, 128 and 256 that spills "
                             "(prep_early=1 reads lse alone early)")
        if chosen["KV_REGS"] and not kv_fits:
            raise ValueError("kv_regs holds K and V in registers in the build that makes dQ in this kernel and loads "
                             "by TMA: it needs dq_atomics=1 and tma_loads=1")
        if chosen["KV_REGS"] and chosen["BLOCKS_PER_SM"] == 3:
            raise ValueError("kv_regs with blocks_per_sm=3: in 168 registers K and V spill 164 bytes and are "
                             "reloaded from local memory every step; leave kv_regs unsaid or 0")
        if chosen["KV_REGS"] and head_dim != 64:
            raise ValueError("kv_regs holds K (2) or K and V (1) in registers, 16 or 32 a thread at D 64: at D 96 "
                             "and 128 K alone spills 112-144 bytes beside dK's and dV's accumulators")
        if chosen["DS_STMATRIX"] and not chosen["DQ_ATOMICS"]:
            raise ValueError("ds_stmatrix=1 stores the dSᵀ of the dK/dV kernel's dQ product: it needs dq_atomics=1")
        if chosen["DQ_TURNS"] and not turns_fit:
            raise ValueError("dq_turns=1 takes two warpgroups at D 64 summing dQ in the dK/dV kernel "
                             "(warpgroups=2, dq_atomics=1)")
        if chosen["BLOCKS_PER_SM"] == 3 and not (head_dim == 64 and chosen["WARPGROUPS"] == 1
                                                  and not chosen["OVERLAP"]):
            raise ValueError("blocks_per_sm=3 takes one warpgroup at D 64 without the overlap "
                             "(warpgroups=1, overlap=0): only there do three blocks' registers fit")
        if head_dim == 256 and (chosen["WARPGROUPS"] != 2 or chosen["DQ_ATOMICS"] or chosen["PRODUCER"]):
            raise ValueError("D 256 has one build: two warpgroups that split D (warpgroups=2), dQ by its own "
                             "pass (dq_atomics=0), no producer (stages/stage8_wgmma.cu, 'Head dim 256')")
        if chosen["PRODUCER"] and not producer_fits:
            raise ValueError("producer=1 issues the TMA loads and the dQ bulk reductions: it needs tma_loads=1 "
                             "and dq_bulk=1 (with dq_atomics=1), and blocks_per_sm=1")
        rows80_fits = (dp == 128 and head_dim <= 128 and chosen["WARPGROUPS"] == 2 and chosen["DQ_BULK"]
                       and chosen["PRODUCER"] and not softcap and not window)
        if chosen["ROWS80"] and not rows80_fits:
            raise ValueError("rows80=1 takes D 96 or 128's two warpgroups with dq_bulk=1 and producer=1, "
                             "without softcap or window")
        if chosen["ROWS80"]:  # Sᵀ's and dPᵀ's 80 registers beside dK's and dV's 128: no room for these
            for name in ("DK_LAST", "PREP_EARLY"):
                if given.get(name.lower()) is None:
                    chosen[name] = 0
                elif chosen[name]:
                    raise ValueError(f"rows80=1 with {name.lower()}={chosen[name]}: ptxas serializes the wgmma "
                                     "(C7512, too few registers); leave it unsaid or 0")
        wgs, atomics, r = chosen["WARPGROUPS"], chosen["DQ_ATOMICS"], WGMMA_ROWS
        qr = 80 if chosen["ROWS80"] else r  # the kernel's QR: queries per step
        dq_buffers = 1 if chosen["BLOCKS_PER_SM"] == 3 or chosen["ROWS80"] else 2  # the kernel's DQ_BUFFERS
        keys = r if head_dim > 128 else r * wgs  # D 256: the two warpgroups share 64 keys
        dq_tiles = wgs * (1 if dp // 64 == wgs else dp // 64)  # the kernel's DQ_TILES per warpgroup
        # K and V of the block's keys, two Q and two dO tiles, dSᵀ (with the atomics; ROWS80: two
        # 64-query atoms), one or two buffers of each warpgroup's float32 dQ tiles (bulk), lse and
        # δ, four mbarriers (the producer: two more per dQ buffer and warpgroup)
        smem = ((2 * keys + 4 * qr) * dp * 2 + (keys * r * 2 * (1 + chosen["ROWS80"]) if atomics else 0)
                + (dq_buffers * dq_tiles * qr * 64 * 4 if chosen["DQ_BULK"] else 0)
                + 4 * qr * 4 + 32 + (2 * dq_buffers * wgs * 8 if chosen["PRODUCER"] else 0) + 1024)
        return {"block_n": keys, "block_m": qr, "threads": 128 * (wgs + chosen["PRODUCER"]), "dq_atomics": atomics, "wgmma": 1,
                "dq_bulk": chosen["DQ_BULK"], "tma_loads": chosen["TMA_LOADS"],
                "smem": smem, "dq_smem": 0 if atomics else 6 * r * dp * 2 + 1024,
                "defines": tuple(sorted(chosen.items())) + variant_defines, "variants": bool(variant_defines)}
    if any(v is not None for v in switches.values()):
        raise ValueError(f"{', '.join(sorted(switches))}: switch(es) of the WGMMA build (wgmma=1)")
    dq_atomics = SWITCHES["DQ_ATOMICS"][0] if dq_atomics is None else int(dq_atomics)
    if dq_atomics not in SWITCHES["DQ_ATOMICS"]:
        raise ValueError(f"dq_atomics must be one of {SWITCHES['DQ_ATOMICS']}, got {dq_atomics!r}")
    bn, bm = tiles or TILES[head_dim]
    if (bn, bm) not in CHOICES:
        raise ValueError(f"tiles must be one of {CHOICES}, got {(bn, bm)}")
    defines = (("BLOCK_N", bn), ("BLOCK_M", bm), ("DQ_ATOMICS", dq_atomics))
    return {"block_n": bn, "block_m": bm, "threads": 32 * bn // 16, "dq_atomics": dq_atomics, "wgmma": 0,
            "smem": smem_bytes(head_dim, bn, bm, dq_atomics), "dq_smem": dq_smem_bytes(head_dim),
            "defines": defines}


def compile_for(arch: str, dtype=torch.float16, head_dim: int = 64, tiles=None, dq_atomics=None,
                wgmma=None, softcap: int = 0, window: bool = False, **switches):
    """The kernels built for `arch` (no GPU needed), for reading their ptxas log and SASS. The
    WGMMA build for an sm_90 arch unless wgmma=0; softcap (0, 1, 2) and window: config's."""
    wgmma = arch.startswith("sm_90") if wgmma is None else bool(wgmma)
    cfg = config(head_dim, tiles and tuple(tiles), dq_atomics, int(wgmma), softcap, bool(window), **switches)
    if wgmma:
        compiled = nvrtc.compile_stage(WGMMA_SOURCE, arch="sm_90a", dtype=dtype, head_dim=head_dim,
                                       defines=dict(cfg["defines"]))
    else:
        compiled = nvrtc.compile_stage(SOURCE, arch=arch, dtype=dtype, head_dim=head_dim,
                                       defines=dict(cfg["defines"]))
    return {"attention_backward": compiled,
            **{f"attention_backward_{part}": nvrtc.compile_stage(src, arch=arch, dtype=dtype, head_dim=head_dim)
               for part, src in (("preprocess", PREPROCESS_SOURCE), ("postprocess", POSTPROCESS_SOURCE))}}


@lru_cache(maxsize=None)
def _kernels(dtype, head_dim: int, cfg_key: tuple) -> dict:
    """The build's kernels, compiled for this GPU and loaded once per process."""
    cfg = dict(cfg_key)
    names = ("attention_backward",) if cfg["dq_atomics"] else ("attention_backward", "attention_backward_dq")
    smem = max(cfg["smem"], cfg["dq_smem"])
    if cfg["wgmma"]:
        compiled = nvrtc.compile_stage(WGMMA_SOURCE, arch=nvrtc.gpu_arch(arch_specific=True), dtype=dtype,
                                       head_dim=head_dim, defines=dict(cfg["defines"]))
        return {n: nvrtc.load_kernel(compiled, n, max_dynamic_smem=smem) for n in names}
    return nvrtc.stage_kernels(SOURCE, names, dtype, head_dim, max_dynamic_smem=smem, defines=cfg["defines"])


@lru_cache(maxsize=None)
def _preprocess_kernel(dtype, head_dim: int, part: str = "preprocess"):
    """The kernel of the pass before the main ones (or, part="postprocess", of the pass after
    them), loaded once."""
    src = PREPROCESS_SOURCE if part == "preprocess" else POSTPROCESS_SOURCE  # (both postprocesses: one file)
    return nvrtc.stage_kernels(src, (f"attention_backward_{part}",), dtype, head_dim)[f"attention_backward_{part}"]


def postprocess(acc: torch.Tensor, Sq: int, dtype, head_dim: int | None = None, scale: float = 1.0,
                rows: int = WGMMA_ROWS) -> torch.Tensor:
    """The [B, H, sq_pad, DP] float32 dQ the bulk reductions summed (tiles in the accumulators'
    order, tiles_in_order says how; rows=80: ROWS80's tiles of dQᵀ) as a new contiguous [B, H, Sq, D]
    tensor of `dtype`: one kernel (stages/stage8_postprocess.cu), one pass, times `scale`. D:
    head_dim (default DP, the tiles' width; D 96's tiles are 128 wide)."""
    B, H, sq_pad, dp = acc.shape
    D = head_dim or dp
    dq = torch.empty((B, H, Sq, D), dtype=dtype, device=acc.device)
    kernel, cfg, args = _post_launch(B, H, Sq, sq_pad, D, dtype, scale, rows)
    nvrtc.launch_prepared(kernel, cfg, (acc.data_ptr(), dq.data_ptr(), *args))
    return dq


def _post_launch(B, H, Sq, sq_pad, D, dtype, scale: float = 1.0, rows: int = WGMMA_ROWS) -> tuple:
    """The postprocess's kernel, launch configuration and scalar arguments (scale: what dQ's sum is
    multiplied by, the softmax scale where the main kernel left it out: SCALE_AT_END; rows: the
    main kernel's queries per step, 64, or ROWS80's 80, whose tiles hold dQᵀ)."""
    if rows == 80:  # a thread's: two query rows × 16 columns
        pieces = B * H * sq_pad // 2 * tile_width(D) // 16
        part = "postprocess_rows80"
    else:  # a thread's: 8 columns of two rows of the float32 sum
        pieces = B * H * sq_pad // 2 * tile_width(D) // 8
        part = "postprocess"
    nvrtc.check_grid_x("stage 8 (postprocess)", -(-pieces // 256))
    return (_preprocess_kernel(dtype, D, part), nvrtc.launch_config((-(-pieces // 256), 1, 1), (256, 1, 1)),
            (np.int32(Sq), np.int32(sq_pad // rows), np.int64(pieces), np.float32(scale)))


def preprocess(out, dout, lse, sq_pad: int, dq_zero: torch.Tensor | None = None):
    """(δ, lse·log2 e), each [B, H, sq_pad] float32: δ = rowsum(dO ∘ O), 0 past Sq; the
    log-sum-exp in log2 units, +∞ where it is −∞ (a row that sees no key) and past Sq. One
    kernel (stages/stage8_preprocess.cu), DP/8 threads per row reading 16 bytes each; out and
    dout of any strides whose rows start 16-byte aligned with unit last dim (others are copied
    first). dq_zero, a contiguous float32 [B, H, sq_pad, DP] (DP = tile_width(D): D 96's is 128 wide),
    is zeroed in the same pass."""
    B, H, Sq, D = out.shape
    if dq_zero is not None and (tuple(dq_zero.shape) != (B, H, sq_pad, tile_width(D)) or not dq_zero.is_contiguous()
                                or dq_zero.dtype != torch.float32):
        raise ValueError(f"dq_zero must be a contiguous float32 {[B, H, sq_pad, tile_width(D)]}, the float32 dQ "
                         f"the preprocess zeroes; got {dq_zero.dtype} {list(dq_zero.shape)}")
    out, dout = (t if _aligned(t) else t.contiguous() for t in (out, dout))
    delta, lse2 = torch.empty((2, B, H, sq_pad), dtype=torch.float32, device=out.device)
    kernel, cfg, args = _pre_launch(out, dout, sq_pad)
    nvrtc.launch_prepared(kernel, cfg, (dout.data_ptr(), out.data_ptr(), lse.float().contiguous().data_ptr(),
                                        delta.data_ptr(), lse2.data_ptr(),
                                        0 if dq_zero is None else dq_zero.data_ptr(), *args))
    return delta, lse2


def _pre_launch(out, dout, sq_pad: int) -> tuple:
    """The preprocess's kernel, launch configuration and scalar arguments for these layouts."""
    B, H, Sq, D = out.shape
    rows = B * H * sq_pad
    blocks = -(-rows * (tile_width(D) // 8) // 256)  # DP/8 threads per row (D 96: the last 4 read nothing)
    nvrtc.check_grid_x("stage 8 (preprocess)", blocks)
    return (_preprocess_kernel(out.dtype, D), nvrtc.launch_config((blocks, 1, 1), (256, 1, 1)),
            (np.int32(Sq), np.int32(sq_pad), np.int32(H), np.int64(rows),
             *nvrtc.layout_args(out), *nvrtc.layout_args(dout)))


def _aligned(t: torch.Tensor, align: int = 16) -> bool:
    return _aligned_strides(t, align) and t.data_ptr() % align == 0


def _aligned_strides(t: torch.Tensor, align: int = 16) -> bool:
    """Unit last stride and every other stride a multiple of `align` bytes (the pointer apart)."""
    item = t.element_size()
    return t.stride(-1) == 1 and all(s * item % align == 0 for s in t.stride()[:-1])


def attention_backward(q, k, v, out, dout, lse, *, causal=False, scale=None, tiles=None,
                       dq_atomics=None, wgmma=None, window=None, softcap=None, sinks=None, softcap_tanh=None,
                       deterministic=False, **switches):
    """(dq, dk, dv) of attention(q, k, v) for the output gradient `dout`, given the forward's
    output `out` and its row log-sum-exp `lse` ([B, H, Sq] float32, natural log, −∞ for a row
    that sees no key). Shapes and causal as in the forward; dk and dv have k's shape (GQA:
    summed over each group of query heads). New contiguous tensors in q's dtype. No gradient
    of these gradients: a second backward raises (once_differentiable). `wgmma` (default: 1 on
    an sm_90 GPU), `tiles` (one of CHOICES) and `dq_atomics` (0: the separate dQ pass) are for
    measuring the alternatives; tiles apply to the mma.sync build (wgmma=0), the keyword
    `switches` (WGMMA_SWITCHES by lower-case name: overlap=0, warpgroups=2, …) to the WGMMA
    build, dq_atomics to both (each build has its own default).

    Stage 6's model variants (stages/stage6_variants.py; the forward that wrote `out` and `lse`
    must have had the same ones): `window` (left, right), `softcap` c (with `softcap_tanh`, as
    stage 6 takes it: the same tanh the forward used) — the WGMMA build's SOFTCAP and WINDOW
    builds — and `sinks` (float32 [H]): then the call returns (dq, dk, dv, dsinks), dsinks the
    float32 [H] gradient of the sinks (sinks_gradient), the other three unchanged by them.

    `deterministic=True`: the same gradients, bit for bit, on every run with the same inputs.
    The stage's build sums dQ in the dK/dV kernel by bulk reductions into float32, in whatever
    order the blocks reach them, so dq may differ in its last bits from run to run (dk and dv do
    not: each key block's are one block's sums in a fixed order). Deterministic, dQ is made by
    its own pass (dq_atomics=0), each row's by one block over the keys in order; the backward
    record's row "WGMMA, deterministic (dQ by its own pass)" is its cost. FlashAttention-3's
    deterministic mode keeps the reductions and orders them with a semaphore per query block."""
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    if deterministic:
        if dq_atomics:
            raise ValueError("deterministic=True makes dQ by its own pass: dq_atomics=1 contradicts it")
        dq_atomics = 0
    variants = check_backward_variants(q, window, softcap, sinks, softcap_tanh)
    with torch.no_grad():
        if sinks is None:
            return _backward(q, k, v, out, dout, lse, causal=causal, scale=scale, tiles=tiles,
                             dq_atomics=dq_atomics, wgmma=wgmma, variants=variants, **switches)
        dq, dk, dv, delta = _backward(q, k, v, out, dout, lse, causal=causal, scale=scale, tiles=tiles,
                                      dq_atomics=dq_atomics, wgmma=wgmma, variants=variants, want_delta=True,
                                      **switches)
        return dq, dk, dv, sinks_gradient(sinks, lse, delta)


class _Launch:
    """Everything about one backward call but the data pointers, made once per input layout
    (shapes, strides, dtypes, devices, causal, scale, build): the validation's verdict, the
    kernels, their launch configurations and their scalar arguments. A training step calls the
    backward with the same layout every time, and building these anew cost host time while the
    GPU waited (experiments/train_step_host)."""

    __slots__ = ("shape", "k_shape", "empty", "pad", "atomics", "bulk", "wgmma_acc", "sq_pad", "rows", "tma", "copy_out",
                 "rows_pad", "acc_at", "acc_shape", "work_floats",
                 "copy_dout", "lse_ready", "main", "main_config", "dq_kernel", "dq_config", "shape_args",
                 "pre", "pre_config", "pre_args", "post", "post_config", "post_args", "maps", "map_ptrs", "call")


_launches: dict = {}


def _backward(q, k, v, out, dout, lse, *, causal, scale, tiles=None, dq_atomics=None, wgmma=None,
              variants: Variants = NO_VARIANTS, want_delta=False, **switches):
    """(dq, dk, dv), and δ ([B, H, Sq] float32, a view of the workspace) when want_delta."""
    try:  # attributes a non-tensor lacks: the full validation in _make_launch says what is wrong
        key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape,
               v.stride(), v.dtype, v.device, out.shape, out.stride(), out.dtype, out.device, dout.shape,
               dout.stride(), dout.dtype, dout.device, lse.shape, lse.stride(), lse.dtype, causal,
               type(causal), scale, type(scale), tiles and tuple(tiles), dq_atomics, wgmma,
               tuple(sorted(switches.items()))) + ((variants,) if variants.any else ())
        plan = _launches.get(key)
    except Exception:
        key, plan = None, None
    if plan is not None and (q.data_ptr() | k.data_ptr() | v.data_ptr()) % INFO.align_bytes:
        plan = None  # a misaligned pointer: validate() explains
    if plan is None:
        plan = _make_launch(q, k, v, out, dout, lse, causal, scale, tiles, dq_atomics, wgmma, switches, variants)
        if key is not None:
            if len(_launches) > 1024:
                _launches.clear()
            _launches[key] = plan
    return _run(plan, q, k, v, out, dout, lse, want_delta)


def _make_launch(q, k, v, out, dout, lse, causal, scale, tiles, dq_atomics, wgmma, switches,
                 variants: Variants = NO_VARIANTS) -> _Launch:
    scale = validate_cached(q, k, v, causal=causal, scale=scale, info=_BACKWARD_INFO)
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    mode = causal_mode(causal, Sq, Sk, INFO)
    for name, t in (("out", out), ("dout", dout)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(q.shape):
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if t.dtype != q.dtype or t.device != q.device:  # the kernels read dout as q's element type
            raise TypeError(f"{name} must be {q.dtype} on {q.device}, as q is; got {t.dtype} on {t.device}")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, H, Sq):
        raise ValueError(f"lse must be a [B, H, Sq] = {[B, H, Sq]} tensor (the forward's "
                         "row log-sum-exp)")
    if wgmma is None:  # the Hopper build on an H100, unless an mma.sync choice was asked for
        wgmma = (wgmma_here() and tiles is None) or any(v is not None for v in switches.values())
    kernel_variants = variants.softcap is not None or variants.window is not None
    if kernel_variants and not wgmma:
        raise NotImplementedError("stage 8's backward takes window and softcap in its WGMMA build only "
                                  "(an sm_90 GPU: H100/H200); the mma.sync build (stages/stage8.cu) has "
                                  "neither. Sinks alone work in both.")
    if wgmma and not wgmma_here():
        raise NotImplementedError("stage 8's WGMMA build needs a GPU of compute capability 9.0 "
                                  "(sm_90a); pass wgmma=0 for the mma.sync build")
    if D in WGMMA_ONLY and not wgmma:
        raise NotImplementedError(f"stage 8's backward at head dim {D} is in its WGMMA build only (an sm_90 "
                                  "GPU: H100/H200); the mma.sync build (stages/stage8.cu) takes 64, 96 and 128")
    if D in PADDED and not wgmma:  # the build of PADDED[D] on zero-padded copies (_run_padded)
        p = _Launch()
        p.call, p.pad = (causal, scale, tiles, dq_atomics, wgmma, switches, variants), PADDED[D]
        p.shape, p.k_shape, p.empty = tuple(q.shape), tuple(k.shape), False
        return p
    if wgmma and dq_atomics is None and switches.get("dq_bulk") is None and not switches.get("producer"):
        # (a call that asks for the producer keeps it: variant_switches is the stage's rule)
        switches = {**switches, **variant_switches(D, variants)}
    if wgmma and switches.get("longest_first") is None:
        switches = {**switches, "longest_first": longest_first(Sq, H // Hk)}
    cfg = config(D, tiles and tuple(tiles), dq_atomics, int(bool(wgmma)),
                 variants.softcap_build, variants.window is not None, **switches)
    p = _Launch()
    p.call = (causal, scale, tiles, dq_atomics, wgmma, switches, variants)  # to plan again for copies (_run)
    p.pad = 0
    p.shape, p.k_shape = tuple(q.shape), tuple(k.shape)
    p.empty = B * H * Sq * Sk * D == 0  # no products: zero gradients of the inputs' shapes
    if p.empty:
        return p
    p.atomics, p.bulk = cfg["dq_atomics"], bool(cfg.get("dq_bulk"))
    p.wgmma_acc = bool(p.atomics and cfg["wgmma"])
    # The WGMMA build's atomics add whole 64-row blocks: its float32 dQ has sq_pad rows, zeroed
    # by the preprocess; the mma.sync build's has Sq.
    p.rows = cfg["block_m"] if cfg["wgmma"] else DQ_ROWS  # queries per step (ROWS80: 80) or dQ block
    p.sq_pad = (Sq + p.rows - 1) // p.rows * p.rows  # whole blocks of either kernel's rows
    p.rows_pad = B * H * p.sq_pad  # δ's and lse·log2 e's elements each, in the workspace (_run)
    p.acc_at = 2 * p.rows_pad
    p.acc_shape = (B, H, p.sq_pad, tile_width(D)) if p.wgmma_acc else (B, H, Sq, D)
    p.work_floats = p.acc_at + (math.prod(p.acc_shape) if p.atomics else 0)
    p.copy_out, p.copy_dout = not _aligned_strides(out), not _aligned_strides(dout)
    p.lse_ready = lse.dtype == torch.float32 and lse.is_contiguous()
    out_l = out.contiguous() if p.copy_out else out  # the layouts the kernels will read
    dout_l = dout.contiguous() if p.copy_dout else dout
    bn = cfg["block_n"]
    n_blocks = (Sk + bn - 1) // bn * B * Hk
    nvrtc.check_grid_x("stage 8", n_blocks)
    kerns = _kernels(q.dtype, D, tuple(sorted(cfg.items())))
    p.main = kerns["attention_backward"]
    p.main_config = nvrtc.launch_config((n_blocks, 1, 1), (cfg["threads"], 1, 1), cfg["smem"])
    p.shape_args = (np.int32(Sq), np.int32(Sk), np.int32(p.sq_pad), np.float32(scale * math.log2(math.e)),
                    np.float32(scale), np.int32(mode), np.int32(H), np.int32(H // Hk),
                    *nvrtc.layout_args(q), *nvrtc.layout_args(k), *nvrtc.layout_args(v), *nvrtc.layout_args(dout_l))
    if kernel_variants:  # VARIANT_PARAMS: cap_mul, cap_log2, win_left, win_right
        p.shape_args += variant_args(variants, scale, Sq, Sk)
    p.tma = bool(cfg.get("tma_loads"))  # the copy engine's descriptions of q and dout: boxes of a step's rows
    p.maps = (tensor_map(q, p.rows), tensor_map(dout_l, p.rows)) if p.tma else ()
    p.map_ptrs = [q.data_ptr(), dout_l.data_ptr()]  # where the maps point now (_run retargets them)
    p.pre, p.pre_config, p.pre_args = _pre_launch(out_l, dout_l, p.sq_pad)
    p.dq_kernel = p.dq_config = p.post = p.post_config = p.post_args = None
    if p.bulk:
        p.post, p.post_config, p.post_args = _post_launch(B, H, Sq, p.sq_pad, D, q.dtype,
                                                          scale if dict(cfg["defines"])["SCALE_AT_END"] else 1.0,
                                                          p.rows)
    elif not p.atomics:
        n_dq_blocks = (Sq + DQ_ROWS - 1) // DQ_ROWS * B * H
        nvrtc.check_grid_x("stage 8 (dQ pass)", n_dq_blocks)
        p.dq_kernel = kerns["attention_backward_dq"]
        p.dq_config = nvrtc.launch_config((n_dq_blocks, 1, 1), (128, 1, 1), cfg["dq_smem"])
    return p


def _run(p: _Launch, q, k, v, out, dout, lse, want_delta=False):
    """One backward with a plan: four allocations (one float32 workspace for δ, lse·log2 e and,
    with the atomics, dQ's sum, addressed by offsets; dQ, dK, dV), the preprocess, the dK/dV
    kernel, and the dQ pass or the postprocess. A training step at a short shape is bound by the host's
    time, so each allocation and launch saved counts (experiments/train_step_host)."""
    if p.pad:
        return _run_padded(p, q, k, v, out, dout, lse, want_delta)
    dev, dtype = q.device, q.dtype
    if p.empty:
        zeros = (torch.zeros(p.shape, dtype=dtype, device=dev), torch.zeros(p.k_shape, dtype=dtype, device=dev),
                 torch.zeros(p.k_shape, dtype=dtype, device=dev))
        # no products: O is zero where a row has no key, so δ is too
        return zeros + (torch.zeros(p.shape[:3], dtype=torch.float32, device=dev),) if want_delta else zeros
    # autograd may hand a broadcast or strided gradient (its layout planned as a copy), or
    # rarely one whose rows start misaligned: then fresh copies, planned for this call alone
    if (dout.data_ptr() | out.data_ptr()) % 16:
        out, dout = (t.clone(memory_format=torch.contiguous_format) if t.data_ptr() % 16 else t for t in (out, dout))
        return _run(_make_launch(q, k, v, out, dout, lse, *p.call), q, k, v, out, dout, lse, want_delta)
    if p.copy_dout:
        dout = dout.contiguous()
    if p.copy_out:
        out = out.contiguous()
    if not p.lse_ready:
        lse = lse.float().contiguous()
    # The workspace: δ and lse·log2 e ([B, H, sq_pad] each), then (with the atomics) dQ's float32
    # sum, [B, H, sq_pad or Sq, D], which the WGMMA build's preprocess zeroes and the mma.sync
    # build's is zeroed here. Every part starts a multiple of 256 bytes in (sq_pad rows of 64).
    work = torch.empty(p.work_floats, dtype=torch.float32, device=dev)
    if p.atomics and not p.wgmma_acc:
        work[p.acc_at:].zero_()
    base = work.data_ptr()
    delta, lse2, acc = base, base + 4 * p.rows_pad, base + 4 * p.acc_at
    # The gradients, each its own allocation: an allocation costs about what one view of a
    # shared one does (split, view, unbind: each a dispatched op), and autograd may keep each
    # gradient alone (a leaf's .grad)
    dq = torch.empty(p.shape, dtype=dtype, device=dev)
    dk = torch.empty(p.k_shape, dtype=dtype, device=dev)
    dv = torch.empty(p.k_shape, dtype=dtype, device=dev)
    nvrtc.launch_prepared(p.pre, p.pre_config, (dout.data_ptr(), out.data_ptr(), lse.data_ptr(), delta, lse2,
                                                acc if p.wgmma_acc else 0, *p.pre_args))
    # The launch copies a map's bytes, so a map may be pointed elsewhere right after. A training
    # loop's caching allocator mostly hands q and dO the same addresses step after step: then
    # the maps already point there (each retarget costs the host a few µs)
    for i, t in enumerate((q, dout)[:len(p.maps)]):
        ptr = t.data_ptr()
        if ptr != p.map_ptrs[i]:
            p.maps[i].replace_address(Address(t))
            p.map_ptrs[i] = ptr
    inputs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(), lse2, delta)
    nvrtc.launch_prepared(p.main, p.main_config, (*p.maps, *inputs, acc if p.atomics else 0,
                                                  dk.data_ptr(), dv.data_ptr(), *p.shape_args))
    if p.bulk:  # dQ's float32 sum in q's dtype, in row order after the bulk reductions
        nvrtc.launch_prepared(p.post, p.post_config, (acc, dq.data_ptr(), *p.post_args))
    elif p.atomics:  # the float32 sum's first Sq rows, in q's dtype
        dq.copy_(work[p.acc_at:].view(p.acc_shape)[:, :, :p.shape[2], :p.shape[3]])  # D 96: its first 96 of DP columns
    else:
        nvrtc.launch_prepared(p.dq_kernel, p.dq_config, (*inputs, dq.data_ptr(), *p.shape_args))
    if want_delta:  # the preprocess's δ, the first Sq of each (b, h)'s sq_pad rows
        B, H, Sq = p.shape[:3]
        return dq, dk, dv, work[:p.rows_pad].view(B, H, p.sq_pad)[:, :, :Sq]
    return dq, dk, dv


def _run_padded(p: _Launch, q, k, v, out, dout, lse, want_delta=False):
    """A backward at head dim D (PADDED) by the build of p.pad: q, k, v, out and dout copied with
    zero columns D … p.pad − 1, the gradients' first D columns copied out. The scale in p.call is
    D's (validate's), so the scores are the unpadded ones."""
    causal, scale, tiles, dq_atomics, wgmma, switches, variants = p.call
    D = p.shape[-1]
    padded = [torch.nn.functional.pad(t, (0, p.pad - D)) for t in (q, k, v, out, dout)]
    g = _backward(*padded, lse, causal=causal, scale=scale, tiles=tiles, dq_atomics=dq_atomics, wgmma=wgmma,
                  variants=variants, want_delta=want_delta, **switches)
    return tuple(t[..., :D].contiguous() for t in g[:3]) + tuple(g[3:])


def tiles_in_order(acc: torch.Tensor, dtype=None, rows: int = WGMMA_ROWS) -> torch.Tensor:
    """The [B, H, Sq_pad, D] float32 dQ that the bulk reductions (DQ_BULK) summed, tile by tile
    in the accumulators' order, as rows and columns, in `dtype` (default acc's), in one copy: the
    PyTorch statement of what postprocess() does in a kernel, and its tests' reference.
    Each 64 × 64 tile (query block, 64-column block) holds thread t's elements 4n … 4n + 3 at
    (128n + t)·4; t = 32w + 4g + i4 holds rows 16w + g and + 8 (jh), columns 8n + 2·i4 and + 1
    (jl): element 4n + 2·jh + jl. rows=80 (ROWS80): each tile is 64 columns × 80 rows of dQᵀ,
    n < 10, 16w + g (+ 8) its columns and 8n + 2·i4 (+ 1) its rows."""
    B, H, S, D = acc.shape
    if rows == 80:
        t = acc.view(B * H, S // 80, D // 64, 10, 4, 8, 4, 2, 2)  # bh, qb, atom, n, w, g, i4, jh, jl
        ordered = torch.empty((B, H, S, D), dtype=dtype or acc.dtype, device=acc.device)
        ordered.view(B * H, S // 80, 10, 4, 2, D // 64, 4, 2, 8).copy_(  # bh, qb, n, i4, jl | atom, w, jh, g
            t.permute(0, 1, 3, 6, 8, 2, 4, 7, 5))
        return ordered
    t = acc.view(B * H, S // 64, D // 64, 8, 4, 8, 4, 2, 2)  # bh, qb, atom, n, w, g, i4, jh, jl
    ordered = torch.empty((B, H, S, D), dtype=dtype or acc.dtype, device=acc.device)
    ordered.view(B * H, S // 64, 4, 2, 8, D // 64, 8, 4, 2).copy_(  # bh, qb, w, jh, g | atom, n, i4, jl
        t.permute(0, 1, 4, 7, 5, 2, 3, 6, 8))
    return ordered


class _Attention(torch.autograd.Function):
    """A forward that saves the log-sum-exp, and this stage's backward."""

    @staticmethod
    def forward(ctx, q, k, v, forward, causal, scale, deterministic=False):
        B, H, Sq, _ = q.shape
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
        out = forward(q, k, v, causal=causal, scale=scale, lse=lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic
        return out

    @staticmethod
    def backward(ctx, dout):
        # The engine runs a backward with grad mode off: then no wrapper (a training step at a
        # short shape waits on the host, experiments/train_step_host); with create_graph=True,
        # once_differentiable's outputs, whose own backward raises
        return _gradients_once(ctx, dout) if torch.is_grad_enabled() else _gradients(ctx, dout)


def _gradients(ctx, dout):
    q, k, v, out, lse = ctx.saved_tensors
    if ctx.deterministic:  # dQ by its own pass (attention_backward's deterministic)
        return (*_backward(q, k, v, out, dout, lse, causal=ctx.causal, scale=ctx.scale, dq_atomics=0),
                None, None, None, None)
    return (*_backward(q, k, v, out, dout, lse, causal=ctx.causal, scale=ctx.scale), None, None, None, None)


_gradients_once = once_differentiable(_gradients)


class _VariantAttention(torch.autograd.Function):
    """_Attention for stage 6's model variants (window, softcap, softcap_tanh, sinks): the same
    variants to the forward and to attention_backward; the sinks an input of their own, so that
    they get their gradient (dsinks, attention_backward's fourth result) when they require it.
    The forward sees them detached (stage 6's forward refuses sinks that require grad)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, forward, causal, scale, variant_kw, deterministic=False):
        B, H, Sq, _ = q.shape
        lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
        plain_sinks = None if sinks is None else sinks.detach()
        out = forward(q, k, v, causal=causal, scale=scale, lse=lse, sinks=plain_sinks, **variant_kw)
        ctx.save_for_backward(q, k, v, out, lse, plain_sinks)
        ctx.causal, ctx.scale, ctx.variant_kw, ctx.deterministic = causal, scale, variant_kw, deterministic
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        g = attention_backward(q, k, v, out, dout, lse, causal=ctx.causal, scale=ctx.scale, sinks=sinks,
                               deterministic=ctx.deterministic, **ctx.variant_kw)
        dsinks = g[3] if sinks is not None and ctx.needs_input_grad[3] else None
        return g[0], g[1], g[2], dsinks, None, None, None, None, None


VARIANT_KEYWORDS = ("window", "softcap", "sinks", "softcap_tanh")  # stage 6's, which the backward takes


def with_grad(forward, q, k, v, *, causal, scale, window=None, softcap=None, sinks=None, softcap_tanh=None,
              deterministic=False):
    """forward(q, k, v, causal=, scale=, lse=) — a forward that writes the log-sum-exp into
    `lse` — run so that its output has a grad_fn whose backward is this stage's. With stage 6's
    model variants (window, softcap, softcap_tanh, sinks) forward takes them too, and the sinks
    get a gradient when they require grad. `deterministic`: attention_backward's."""
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    if window is None and softcap is None and sinks is None and softcap_tanh is None:
        return _Attention.apply(q, k, v, forward, causal, scale, deterministic)
    variant_kw = {"window": window, "softcap": softcap, "softcap_tanh": softcap_tanh}
    return _VariantAttention.apply(q, k, v, sinks, forward, causal, scale, variant_kw, deterministic)


def attention(q, k, v, *, causal=False, scale=None, attn_mask=None, is_causal=None, enable_gqa=True):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True), SDPA's own keywords taken too: stage 5's forward, and when grad mode is on
    and an input requires grad, an output whose grad_fn runs this stage's backward."""
    causal = causal_from_mask(sdpa_causal(q, k, causal, is_causal, enable_gqa), attn_mask, q, k, INFO)
    if wants_grad(q, k, v):
        return with_grad(stage5.attention, q, k, v, causal=causal, scale=scale)
    return stage5.attention(q, k, v, causal=causal, scale=scale)
