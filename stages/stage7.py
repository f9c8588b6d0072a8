"""Stage 7 — FP8 (e4m3): FlashAttention-3's third idea (sm_90a), CUDA C++ through NVRTC.

Stage 6's warp-specialized kernel with both products on the tensor cores' e4m3 path, which runs
at twice the 16-bit rate (stages/stage7.cu says what changes, line by line against stage6.cu).
The arithmetic is lib.fp8's: Q, K and V stored as x / descale in e4m3 with one fp32 descale
per batch entry and K/V head (FlashAttention-3's q_descale, k_descale, v_descale), scores from
e4m3 products summed by the tensor cores, the softmax in fp32, P cast to e4m3 as P·2^8, O out
in 16 bits. Before the kernel, timed on their own by the notebook:
- quantization, when the inputs are fp16 or bf16 (lib.fp8.prepare's arithmetic: amax / 448 per
  batch entry and K/V head, so nothing overflows e4m3's 448), by the kernels of
  stages/stage7_quantize.cu (`quantize`: two launches, amax then cast, V's transpose included;
  the cast and the attention kernel after it launched with PDL, `PDL`);
- V's transpose for inputs already in e4m3 (lib.fp8.v_for_pv): 8-bit wgmma reads its B operand
  K-major only, so P·V needs Vᵀ [D][keys], each 32-key k-step's keys in lib.fp8.key_order() so
  that P's A fragment is every thread's own scores.

Beyond stage 6's launch: 192-key tiles at D128 (TILES; scripts/fp8_tiles.py times the widths),
wherever work tiles outnumber the SMs the work queue without ping-pong (PERSISTENT_SCHEDULE), at
D128 its last partial wave of full-attention tiles split along the keys (TAIL_SPLIT, a second
kernel combining the pieces), and at D64 the row sums from P·V through a row of ones under Vᵀ
(ROW_SUM_MMA); scripts/fp8_waterfall.py times each step.

Status (2026-11-26): checked on an H100 (tests/test_stage7.py against lib.fp8.check_on_emulation
and the float64 reference, compute-sanitizer clean on every launch path at small shapes; first in
results/logs/2026-11-25-4e746b2-h100, last in 2026-11-26-429631e-h100). Held to FP8's error
rule, so it stands outside the 16-bit harness (stages.BEYOND); scripts/fp8_bench.py --record is
its record, with fp8_tiles and fp8_waterfall beside it.

Not here (NotImplementedError): stage 6's serving paths (split-KV, packed GQA, packed sequences,
per-entry key lengths: decoding shapes run unsplit), and a backward (inputs that require grad
are refused, lib.inputs.refuse_grad).
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from lib import fp8, nvrtc
from lib.inputs import (GPUTooOldError, StageInfo, causal_from_mask, causal_mode, new_output, refuse_grad,
                        sdpa_causal, validate)
from stages import stage6 as s6

SOURCE = Path(__file__).with_suffix(".cu")
QUANTIZE_SOURCE = Path(__file__).with_name("stage7_quantize.cu")  # 16-bit inputs to e4m3 (quantize)
ARCH = s6.ARCH  # wgmma (e4m3 too) and setmaxnreg exist only in the arch-specific target
# (BLOCK_N, STAGES, CONSUMERS) per head dim. Predicted, not yet measured: stage 6's consumer
# counts (three at D64; two at D128, where three serialize the wgmma for want of registers:
# ptxas C7512 with 160 each), 128-key tiles (one 128-byte swizzle row of Vᵀ), and a ring one
# deeper than stage 6's — an e4m3 tile is half the bytes, and the products that use it take half
# the time, so a copy has less time to land.
# Then at D128 wider key tiles: (192, 2, 2) ran 1.19x (128, 3, 2) at B4 H16 S8192 full and 1.22x
# causal, level with 224 keys, in the same rounds (scripts/fp8_tiles.py, results/logs/
# 2026-11-26-03badfd-h100); at D64 160 keys ran 1.02x full and 0.98x causal: 128 stays. Timed again
# with lib.timing's settled batches (2026-11-26-19ecdee-h100): (128, 3, 2) 0.997x of (192, 2, 2)
# full and 0.94x causal, so 192 keys still win causal, and at full attention most of the 1.19x was
# the entries' places in the round (see lib.timing.SETTLE_MS).
TILES = {64: (128, 3, 3), 128: (192, 2, 2)}
V_IN_KERNEL_TILES = {64: (128, 3, 3), 128: (128, 3, 2)}  # the producer's transpose writes 128-key tiles
FEW_ROWS_TILES = {64: (128, 4, 1), 128: (128, 4, 1)}
# The launch wherever work tiles outnumber the SMs: the work queue without ping-pong, full or
# causal. In three runs at the standard shapes (results/logs/2026-11-26-21a162c-h100,
# 2026-11-26-810e2ed-h100 and 2026-11-26-68ef631-h100), against what stage 6's rule (call_schedule)
# picks: 1.034x its persistent blocks at D64 full each time, 0.989-1.025x at D128 full, 1.025-1.034x
# its one block per work tile at D128 causal S8192, and the same launch at D64 causal S2048. In e4m3
# the products take half the time that ping-pong's turns are there to hide, while the exponential
# unit, which turns do not add to, sets the pace; the queue keeps causal work tiles of different
# lengths balanced. (In bf16 at D64 causal S8192, one block per work tile beat the queue:
# stage6.call_schedule.)
PERSISTENT_SCHEDULE = "work queue without ping-pong"
# TAIL_SPLIT (stages/stage7.cu: work_item, finish_piece), per head dim, in the work queue's builds:
# full attention's work tiles all take the same time, so the queue's last n_work mod SMs of them run
# alone, one per SM, while every other SM idles. experiments/tail_split/queue_tail_probe.py measured
# it (results/logs/2026-11-26-e81cead-h100): every SM within 1% of the same pace, and 2.53% of the SM
# time idle at the launch's end at B4 H16 S8192 D128 (4 tiles of 4,096 on 132 SMs), 3.02% at B16 H16
# S2048 D64 (44 of 2,816). Those last tiles are split along their keys into pieces that the queue
# hands out as SMs free up; each piece writes its rows in fp32, and a small kernel after this one
# (attention_fp8_combine_tail, launched with PDL) combines them as stage 6's split-KV combine does.
# Predicted 2-3% at those two shapes. Measured against the build without, rounds ordered split,
# whole, whole, split (experiments/tail_split/tail_split_ab.py, 2026-11-26-41ed404-h100): 1.019x at
# B4 H16 S8192 D128 full and at B3, 1.014x causal and 1.000x at B2 H16 S8192, where nothing is
# split; at D64 0.995x at B16 H16 S2048 full, 0.992x causal, 1.010x at B8 S4096. So on at D128 only;
# at D64 6 or 8 pieces per tail tile ran 0.995-1.000x too (2026-11-26-b7a0e66-h100). (The first
# version combined in the last piece to finish, inside the attention kernel: that code cost its main
# loop 1-2.6% everywhere, 2026-11-26-5580a3e-h100.)
TAIL_SPLIT = {64: False, 128: True}
# A piece keeps at least this many key tiles: each adds its rows in fp32 (BLOCK_M × D floats)
# for the combine to read back, which at 4 key tiles per piece is under a tenth of the piece's
# own time.
TAIL_PIECE_TILES = 4


def tail_pieces(n_work: int, key_tiles: int, grid: int, causal: bool) -> int:
    """How many pieces each work tile of the queue's last partial wave is split into along its
    keys (TAIL_SPLIT; 1: none): as many as the SMs the partial wave leaves idle make room for,
    each of at least TAIL_PIECE_TILES key tiles. Causal work tiles differ in length, and the
    queue already ends on the lightest (stage6.tail_heads_for); a launch of at most one wave, or
    of whole waves, has no partial one."""
    left = n_work % grid
    if causal or n_work <= grid or left == 0:
        return 1
    return max(1, min(grid // left, key_tiles // TAIL_PIECE_TILES))
# SKIP_ROWS_PAST_END, as stage 6's (stages/stage6.py): at D64 S 2048 the last query block's third
# consumer (rows 2048-2111) has no row and computes nothing, 1/33 of the call's rows. Measured
# against the build without, same rounds (experiments/rows_past_end/rows_past_end_ab.py, results/logs/
# 2026-11-26-daf7855-h100): 1.015x at B16 H16 S2048 D64, 1.034x causal; at B32 H16 S1024 (two of
# three consumers idle) 1.034x full and 1.094x causal; the work queue hands the time saved to other
# work tiles.
SKIP_ROWS_PAST_END = True
# Key tiles wider than 128 (FlashAttention-3's FP8 tiles are 160 keys at D64 with three consumers,
# 224 at D128 with two): fewer per-tile costs (barrier waits, row max and sum shuffles, the
# rescale of O, turns) over the same products. Vᵀ's tiles then come in sub-tiles (vt_atom).
CHOICES = [(bn, s, c) for bn in (128, 160, 192, 224) for c in (1, 2, 3) for s in (2, 3, 4)]


def vt_atom(block_n: int) -> int:
    """Keys per sub-tile of a Vᵀ tile (stage7.cu's VT_ATOM): one swizzle row of the widest
    pattern (128, 64 or 32 bytes) that divides the key tile."""
    return next(a for a in (128, 64, 32) if block_n % a == 0)
# When the softmax rescales O: 0 only in warps where a row's max grew (stage 6's default,
# FlashAttention-4's threshold of 2^8, cannot be kept: P·2^8 must stay within e4m3's 448);
# -1 every tile, as FlashAttention-3 does.
# Tried and not kept (results/logs/2026-11-26-68ef631-h100; the change: experiments/fp8_lazy_rescale/): a
# threshold k > 0 as stage 6 keeps (a kept max exceeded by up to 2^k), with P's offset 8 - k so
# that P stays under 448. O's rescale was 5.5-5.7% of the executed instructions (the profile
# in 2026-11-26-810e2ed-h100), but k = 1, 2, 4 ran 0.98-1.01x of k = 0 in the same rounds, with
# 0.4-1.6% more RMSE.
LAZY_RESCALE = 0
P_OFFSET_LOG2 = 8  # P cast to e4m3 as P·2^8 (FlashAttention-3's Max_offset); 0: as it is
# ROW_SUM_MMA (stage7.cu), per head dim: the softmax's row sums from P·V itself, through a row
# of ones under each Vᵀ tile, instead of an FADD per score. Predicted 1-4% at D64, where those
# FADDs are 13% of the executed instructions and the exponential unit sets the pace (Nsight
# Compute, results/logs/2026-11-26-810e2ed-h100), for 1/8 more P·V work on tensor cores busy 29% of
# the time; 0-2% at D128. Measured against the build without, same rounds (results/logs/
# 2026-11-26-4103813-h100, the column then left to grow in the accumulator): 1.047x at B16 H16 S2048
# D64 full, 1.010x causal; 0.96-0.97x at B4 H16 S8192 D128 (N = 136 for 128 + 8 columns). With
# each P·V's sums moved into l in fp32 (take_row_sums, 2026-11-26-429631e-h100): 1.062x and 1.029x
# at D64, 0.96-0.99x at D128, and 0.97x at B1 H8 S512 D64, whose blocks have one consumer each
# (FEW_ROWS_TILES): there no other warpgroup competes for the issue slots the FADDs took, and
# the extra column only adds to each tile's latency. Hence row_sums_by_mma's rule.
ROW_SUM_MMA = {64: True, 128: False}
# Tried and not kept (results/logs/2026-11-26-f2f0ccc-h100; the change: experiments/fp8_half_max/):
# each key tile's first half of columns exponentiated against the row max over that half (and
# the tiles before) while the second half's max is reduced by its shuffles, that half then scaled
# down by 2^(m1 - max) where the second half raised the max (a warp-uniform branch, taken in most
# warps). The exponentials of a tile wait for its whole row's max (32 FMNMX and two dependent
# shuffles), and at D64 the exponential unit sets the pace; predicted 2-5% there. Measured
# against the build without, kernel alone, in pairs in both orders: 0.912-0.916x at B16 H16
# S2048 D64 (full and causal), 0.912-0.935x at B4 H16 S8192 D128, 0.94x at D128 S2048 and B1 H8
# S512 D64; stage 7's tests passed with it. The second max, its shuffles and the fix-ups cost more
# issue slots than the wait they hide.
# Tried and not kept (results/logs/2026-11-26-837362b-h100; the change: experiments/pack_in_softmax/):
# each tile's previous P·V waited for between its row maxima and its exponentials, so that P's
# e4m3 casts interleave with the MUFU.EX2 stream (ptxas then placed a cast after every second
# exponential) instead of following it. Predicted 2-5% at D64, where the exponential unit is 68%
# busy and the casts are 8% of the instructions. Same bits; against the build without, in pairs in
# both orders: D64 S2048 causal 1.019-1.025x, full 0.995x (one order's median 1.019x, its rounds
# 0.994-0.996), D128 S8192 full 1.007-1.012x, causal 0.947-0.951x (the wait for a P·V twice as
# long, before the exponentials), B1 H8 S512 0.99x.
# The cast kernel and the attention kernel launched with programmatic dependent launch (PDL,
# stages/pdl.cuh): each starts while the one before it finishes and waits on the GPU for its
# writes, instead of being launched after its end, as stage 6's split-KV combine is (PDL_COMBINE
# there: 0.7-1.4 µs a launch). Predicted about 2 µs off the whole call from 16-bit inputs (19-20
# µs at B1 H8 S512), nothing measurable at the large shapes. Measured against no PDL, same rounds
# (results/logs/2026-11-26-6cc0a84-h100), with each kernel letting the next go at its blocks' start:
# 20.2 -> 17.9 µs at B1 H8 S512 (1.13x), 1.00x at D64 S2048, but 0.95x at B4 H16 S8192 D128
# full (the attention kernel's blocks, let go at the casts' start, might hold SMs the casts still
# needed: each kernel now lets the next go at the end of its blocks' work). The runs of
# 2026-11-26-2446304-h100 and 2026-11-26-070df4e-h100 still had D128 at 0.94-0.98x, but there seven
# callables shared each round, and the two kernel-only entries, both without PDL, differed by 3%
# with only their place in the round between them (the board at its 700 W limit). Timed in pairs, in
# both orders: 1.001-1.003x with PDL at D128 S8192 full and causal (2026-11-26-91471aa-h100,
# 2026-11-26-8ebc472-h100); in the rounds of 2026-11-26-070df4e-h100 1.14x at B1 H8 S512.
PDL = True
# Tried and not kept (results/logs/2026-11-26-b04e904-h100; the change:
# experiments/fp8_tree_reductions/): a tile's row max and row sum as trees of 4 levels instead of
# one chain through 16 column slices each. Nsight Compute at B4 H16 S8192 D128
# (2026-11-26-fe49663-h100) had 20% of the warps' stall samples on those chains, but the trees ran
# 0.96-1.02x of the chains in the same rounds (the chains faster at 5 of 6 rows): other warps issue
# while one waits on its chain.


def smem_bytes(head_dim: int, tiles, q_stages: int = 1, v_in_kernel: bool = False, row_sum_mma: bool = False) -> int:
    """One block's dynamic shared memory: the Q buffers, the K and Vᵀ rings (one byte per element;
    with ROW_SUM_MMA 8 more rows per Vᵀ sub-tile), with V_IN_KERNEL two staging tiles of V and
    their barriers, the barriers and work slots, and 1 KB of slack to align the tiles to 1024 bytes."""
    bn, stages, consumers = tiles
    staging = (2 * bn * head_dim + 16) if v_in_kernel else 0
    return (q_stages * 64 * consumers + stages * bn) * head_dim + stages * bn * (head_dim + 8 * row_sum_mma) \
        + staging + 8 * (2 * q_stages + 4 * stages) + 4 * q_stages + 1024


def row_sums_by_mma(head_dim: int, tiles, row_sum_mma: bool | None = None) -> bool:
    """Whether a build sums l by P·V (ROW_SUM_MMA): as asked, or (None) the head dim's default
    for blocks of three consumers with 128-key tiles — where three warpgroups' softmaxes compete
    for one SM's issue slots, which the FADDs it removes were taking. Three consumers (160
    registers each) with more than 128 keys hold the wider S and O's extra column only by
    spilling (ptxas C7512): refused."""
    bn, _, consumers = tiles
    room = not (consumers == 3 and bn > 128)
    if row_sum_mma is None:
        return ROW_SUM_MMA[head_dim] and consumers == 3 and bn == 128
    if row_sum_mma and not room:
        raise ValueError(f"row_sum_mma with tiles {tuple(tiles)}: three consumers' 160 registers hold a "
                         f"wider S and O's extra column only by spilling (ptxas C7512); take 128 keys")
    return bool(row_sum_mma)


def q_buffers(head_dim: int, tiles, row_sum_mma: bool = False) -> int:
    """Two Q buffers wherever they fit (stage 6's rule, q_buffers there): e4m3 tiles always do."""
    return 2 if smem_bytes(head_dim, tiles, 2, row_sum_mma=row_sum_mma) <= s6.MAX_SMEM else 1


INFO = StageInfo(
    number=7,
    slug="fp8",
    title="FP8 (e4m3): FlashAttention-3's low precision",
    adds="Both products on the tensor cores' e4m3 path (twice the 16-bit rate): Q, K and V scaled "
         "into e4m3 with per-head descale factors, Vᵀ laid out so that P's 8-bit operand needs no "
         "shuffle, P cast to e4m3 with FlashAttention-3's 2^8 offset.",
    backend="nvrtc",
    min_cc=(9, 0),
    dtypes=(torch.float16, torch.bfloat16, torch.float8_e4m3fn),
    head_dims=(64, 128),
    sources=("stages/stage7.py", "stages/stage7.cu", "stages/stage7_quantize.cu", "stages/fp8.cuh", "stages/pdl.cuh",
             "stages/work_queue.cuh", "stages/hopper.cuh",
             "stages/attention.cuh", "lib/fp8.py"),
    gqa=True,
    causal_alignments=("top_left", "bottom_right"),
    align_bytes=16,  # the copy engine: 16-byte-aligned base and strides
    notes="sm_90a only (H100/H200). Checked on an H100 against lib.fp8's emulation of the same "
          "arithmetic (tests/test_stage7.py); timed by scripts/fp8_bench.py, fp8_tiles.py, fp8_waterfall.py.",
    extra={"arch": ARCH, "tensor_core_op": "QGMMA", "registered": False},
)


@lru_cache(maxsize=None)
def config(head_dim: int, tiles=None, schedule: str | None = None, q_stages: int | None = None,
           lazy_rescale: int | None = None, p_offset: bool | None = None, exp2_poly: int = 0,
           v_in_kernel: bool = False, row_sum_mma: bool | None = None, tail_split: bool | None = None,
           skip_past_end: bool | None = None) -> dict:
    """Launch settings for one choice of (BLOCK_N, STAGES, CONSUMERS) and one of stage 6's
    schedules (stages.stage6.ALL_SCHEDULES): query rows per block, threads, dynamic shared
    memory and the kernel's defines. v_in_kernel: the producer warpgroup transposes V's tiles
    (V_IN_KERNEL) instead of reading Vᵀ from lib.fp8.v_for_pv's pass; it walks a fixed stride of
    work tiles, so a work-queue schedule is refused. row_sum_mma: ROW_SUM_MMA (None: the default).
    tail_split: TAIL_SPLIT in the work queue's builds (None: the head dim's default, TAIL_SPLIT).
    skip_past_end: SKIP_ROWS_PAST_END (None: the module's default)."""
    schedule = s6.default_schedule(head_dim) if schedule is None else schedule
    if schedule not in s6.ALL_SCHEDULES:
        raise ValueError(f"schedule must be one of {list(s6.ALL_SCHEDULES)}, got {schedule!r}")
    bn, stages, consumers = tiles or (V_IN_KERNEL_TILES if v_in_kernel else TILES)[head_dim]
    if (bn, stages, consumers) not in CHOICES:
        raise ValueError(f"tiles must be one of {CHOICES}, got {tiles}")
    sw = dict(s6.ALL_SCHEDULES[schedule])
    if sw["PINGPONG"] and consumers < 2:
        raise ValueError(f"schedule {schedule!r} takes turns between consumer warpgroups; tiles "
                         f"{(bn, stages, consumers)} have one (use {s6.DECODE_SCHEDULE!r})")
    persistent = bool(sw.pop("PERSISTENT"))
    if v_in_kernel and head_dim == 128 and consumers == 3:
        raise ValueError("v_in_kernel at D128 with three consumers: their 144 registers each spill and "
                         "serialize the wgmma (ptxas C7512); take two")
    if v_in_kernel and bn != 128:
        raise ValueError(f"v_in_kernel transposes key tiles of 128 (one 128-byte swizzle row of Vᵀ); got {bn}")
    if v_in_kernel and (sw["DYNAMIC_WORK"] or not sw["WARP_SPECIALIZED"]):
        raise ValueError(f"v_in_kernel: the producer warpgroup transposes V, walking a fixed stride of work "
                         f"tiles; schedule {schedule!r} has {'a work queue' if sw['DYNAMIC_WORK'] else 'no producer'}")
    rs = row_sums_by_mma(head_dim, (bn, stages, consumers), row_sum_mma)
    qs = q_buffers(head_dim, (bn, stages, consumers), rs) if q_stages is None else q_stages
    if qs not in (1, 2):
        raise ValueError(f"q_stages is 1 or 2 Q buffers, got {q_stages!r}")
    smem = smem_bytes(head_dim, (bn, stages, consumers), qs, v_in_kernel, rs)
    if smem > s6.MAX_SMEM:
        raise ValueError(f"tiles {(bn, stages, consumers)} need {smem:,} bytes of shared memory at D{head_dim}")
    lazy = LAZY_RESCALE if lazy_rescale is None else lazy_rescale
    if lazy not in (-1, 0):
        raise ValueError(f"lazy_rescale is -1 (every tile) or 0 (when a row's max grew): P·2^8 must stay "
                         f"within e4m3's 448; got {lazy_rescale!r}")
    if not 0 <= exp2_poly <= 8:
        raise ValueError(f"exp2_poly counts eighths of the score columns, 0 to 8; got {exp2_poly}")
    offset = P_OFFSET_LOG2 if p_offset is None or p_offset else 0
    defines = (("BLOCK_N", bn), ("STAGES", stages), ("CONSUMERS", consumers), *sorted(sw.items()),
               ("EXP2_POLY_EIGHTHS", exp2_poly), ("LAZY_RESCALE", lazy), ("Q_STAGES", qs),
               ("P_OFFSET_LOG2", offset), ("V_IN_KERNEL", int(v_in_kernel)), ("ROW_SUM_MMA", int(rs)),
               ("TAIL_SPLIT", int(bool(sw["DYNAMIC_WORK"]) and (TAIL_SPLIT[head_dim] if tail_split is None else bool(tail_split)))),
               ("SKIP_ROWS_PAST_END", int(SKIP_ROWS_PAST_END if skip_past_end is None else bool(skip_past_end))))
    return {"block_m": 64 * consumers, "threads": 128 * (consumers + sw["WARP_SPECIALIZED"]),
            "persistent": persistent, "smem": smem, "defines": defines}


def compile_for(arch: str = ARCH, dtype=torch.bfloat16, head_dim: int = 128, tiles=None,
                schedule: str | None = None, **options) -> dict:
    """The stage's kernel compiled without a GPU, for lib.sass; `dtype` is the output's (fp16 or
    bf16: the kernel's inputs are e4m3 either way). Only sm_90a has the instructions."""
    if arch != ARCH:
        raise NotImplementedError(f"stage 7 compiles only for {ARCH} (e4m3 wgmma, setmaxnreg); got {arch}")
    cfg = config(head_dim, None if tiles is None else tuple(tiles), schedule, **options)
    return {f"stage{INFO.number} {str(dtype)[6:]} D{head_dim}":
            nvrtc.compile_stage(SOURCE, arch=ARCH, dtype=dtype, head_dim=head_dim, defines=dict(cfg["defines"]))}


def choose(B, H, Sq, Sk, D, causal, sms, *, tiles=None, schedule=None, v_in_kernel=False) -> dict:
    """Tiles and schedule of a call. Tiles: blocks of one consumer where each gets an SM to itself
    (stage 6's few_rows), else this stage's. Schedule, unless given: one consumer has nobody to
    take turns with (stage 6's DECODE_SCHEDULE); blocks of one work tile each run the head dim's
    default (stage 6's, as call_schedule gives them); with more work tiles than SMs, the work
    queue without ping-pong (PERSISTENT_SCHEDULE), or with v_in_kernel the same launch in a fixed
    stride (persistent blocks: its producer walks a known stride of work tiles). `Sk` and
    `causal` do not enter the rule (stage 6's causal cases lose to the queue here)."""
    if tiles is None and schedule is None and s6.few_rows(B, H, Sq, sms):
        tiles = FEW_ROWS_TILES[D]
    tiles = tuple(tiles) if tiles is not None else (V_IN_KERNEL_TILES if v_in_kernel else TILES)[D]
    work = B * H * -(-Sq // (64 * tiles[2]))
    if schedule is None:
        if tiles[2] == 1:
            schedule = s6.DECODE_SCHEDULE
        elif work <= sms:
            schedule = s6.default_schedule(D)
        else:
            schedule = "+ persistent blocks" if v_in_kernel else PERSISTENT_SCHEDULE
    return {"tiles": tiles, "schedule": schedule, "work": work}


def emulation_of(B, H, Sq, Sk, D, causal, sms, *, tiles=None, schedule=None, v_in_kernel=False,
                 row_sum_mma=None) -> dict:
    """The arguments of lib.fp8.check_on_emulation (and emulate_on_e4m3) that follow what a call
    with these options runs: key_tile, where its running max moves (choose's tiles), and
    sum_rounded, whether its l sums the rounded P (ROW_SUM_MMA)."""
    tiles = choose(B, H, Sq, Sk, D, causal, sms, tiles=tiles, schedule=schedule, v_in_kernel=v_in_kernel)["tiles"]
    return {"key_tile": tiles[0], "sum_rounded": row_sums_by_mma(D, tiles, row_sum_mma)}


def tensor_map(t: torch.Tensor, rows: int, inner: int):
    """The copy engine's description of a 4-D e4m3 tensor with its real strides: boxes of `rows`
    × `inner` bytes, swizzled by the row's width (128, 64 or 32 bytes: that swizzle)."""
    from cuda.core.utils import StridedMemoryView
    from cuda.core._tensor_map import TensorMapSwizzle
    strides = [st if n > 1 else 16 * (t.numel() + 1) for n, st in zip(t.shape, t.stride())]
    strides[-1] = 1
    t = t.view(torch.uint8).as_strided(t.shape, strides)
    view = StridedMemoryView.from_dlpack(t, stream_ptr=-1)
    swizzle = {128: TensorMapSwizzle.SWIZZLE_128B, 64: TensorMapSwizzle.SWIZZLE_64B, 32: TensorMapSwizzle.SWIZZLE_32B}[inner]
    return view.as_tensor_map((1, 1, rows, inner), swizzle=swizzle)


def _check_arch(q) -> None:
    cc = torch.cuda.get_device_capability(q.device)
    if cc != (9, 0):
        raise GPUTooOldError(f"stage 7 is built for sm_90a and needs compute capability 9.0 exactly "
                             f"(H100, H200); {torch.cuda.get_device_name(q.device)} has {cc[0]}.{cc[1]}")


@lru_cache(maxsize=None)
def _kernel(out_dtype, D, defines, smem):
    """The attention kernel, and with TAIL_SPLIT its tail's combine kernel (else None)."""
    compiled = nvrtc.compile_stage(SOURCE, arch=ARCH, dtype=out_dtype, head_dim=D, defines=dict(defines))
    combine = nvrtc.load_kernel(compiled, "attention_fp8_combine_tail") if dict(defines)["TAIL_SPLIT"] else None
    return nvrtc.load_kernel(compiled, "attention_fp8", max_dynamic_smem=smem), combine


_queues: dict = {}
_tails: dict = {}


def _queue(device) -> torch.Tensor:
    """DYNAMIC_WORK's counter (next, blocks done), zero between launches, one per stream."""
    stream = torch.cuda.current_stream(device).cuda_stream
    q = _queues.get(stream)
    if q is None:
        q = _queues[stream] = torch.zeros(2, dtype=torch.int32, device=device)
    return q


def _tail_parts(device, pieces: int, block_m: int, D: int) -> tuple[int, int]:
    """TAIL_SPLIT's fp32 partial rows [pieces, block_m, D] and their log2-sum-exps, one pair per
    stream (calls on one stream run in order), grown when a call needs more."""
    stream = torch.cuda.current_stream(device).cuda_stream
    have = _tails.get(stream)
    if have is None or have[1].numel() < pieces * block_m or have[0].numel() < pieces * block_m * D:
        rows = max(pieces * block_m, have[1].numel() if have else 0)
        have = _tails[stream] = (torch.empty(max(rows * D, have[0].numel() if have else 0), dtype=torch.float32,
                                             device=device), torch.empty(rows, dtype=torch.float32, device=device))
    return have[0].data_ptr(), have[1].data_ptr()


@lru_cache(maxsize=None)
def _quantize_kernels(dtype, D):
    return nvrtc.stage_kernels(QUANTIZE_SOURCE, ("fp8_amax", "fp8_cast"), dtype, D)


def quantize(q, k, v, *, v_transposed: bool = True, pdl: bool | None = None):
    """fp16/bf16 q [B, H, Sq, D], k and v [B, H_kv, Sk, D] (checked by the caller) in e4m3 with
    their descales: (q8, k8, v_op, q_descale, k_descale, v_descale), the bytes lib.fp8.prepare
    and, for v_op, lib.fp8.v_for_pv give (v_transposed=False: v8 as prepare gives it). One scale
    per batch entry and K/V head; two launches over the three tensors (stages/stage7_quantize.cu):
    their slabs' amax, then the casts (V's into Vᵀ in key order; launched with PDL unless `pdl` is
    False, None: PDL). Inputs are made contiguous first."""
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    ts = [t.contiguous() for t in (q, k, v)]
    if any(t.numel() == 0 or t.data_ptr() % 16 for t in ts):  # nothing to reduce, or unaligned
        q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
        return q8, k8, (fp8.v_for_pv(v8) if v_transposed and v8.numel() else v8), qd, kd, vd
    kern = _quantize_kernels(q.dtype, D)
    slabs = B * Hk
    n_q, n_kv = ts[0].numel(), ts[1].numel()
    amax = torch.zeros(3, slabs, dtype=torch.int32, device=q.device)  # float bits, for atomicMax
    descale = torch.empty(3, B, Hk, dtype=torch.float32, device=q.device)
    # pass 1: each slab's amax, about 4 blocks of 256 threads per SM for each tensor
    per_q, per_kv = (max(1, min(-(-(n // slabs) // (8 * 256)), -(-4 * s6._sm_count(q.device) // slabs)))
                     for n in (n_q, n_kv))
    blocks = slabs * (per_q + 2 * per_kv)
    nvrtc.check_grid_x("stage 7 (quantize)", blocks)
    nvrtc.launch_prepared(kern["fp8_amax"], nvrtc.launch_config((blocks, 1, 1), (256, 1, 1)),
                          (*(t.data_ptr() for t in ts), amax.data_ptr(), np.int64(slabs), np.int64(n_q // slabs),
                           np.int64(n_kv // slabs), np.int64(per_q), np.int64(per_kv)))
    # pass 2: x / descale in e4m3; V's into Vᵀ [B, H_kv, D, Sk'] with the keys in key order
    q8, k8 = (torch.empty(t.shape, dtype=fp8.E4M3, device=q.device) for t in ts[:2])
    sk_pad = -(-Sk // 32) * 32 if v_transposed else 0
    v8 = torch.empty((B, Hk, D, sk_pad) if v_transposed else ts[2].shape, dtype=fp8.E4M3, device=q.device)
    blocks = -(-n_q // 2048) + -(-n_kv // 2048) + (slabs * (sk_pad // 32) if v_transposed else -(-n_kv // 2048))
    nvrtc.check_grid_x("stage 7 (quantize)", blocks)
    nvrtc.launch_prepared(kern["fp8_cast"], nvrtc.launch_config((blocks, 1, 1), (256, 1, 1), pdl=PDL if pdl is None else pdl),
                          (*(t.data_ptr() for t in ts), amax.data_ptr(), descale.data_ptr(), q8.data_ptr(),
                           k8.data_ptr(), v8.data_ptr(), np.int64(slabs), np.int64(n_q), np.int64(n_kv),
                           np.int32(Sk), np.int32(sk_pad)))
    return q8, k8, v8, descale[0], descale[1], descale[2]


def attention(q, k, v, *, causal=False, scale=None, attn_mask=None, is_causal=None, enable_gqa=True,
              q_descale=None, k_descale=None,
              v_descale=None, tiles=None, schedule=None, q_stages=None, lazy_rescale=None,
              p_offset=None, v_in_kernel=False, exp2_poly=0, row_sum_mma=None, pdl=None, seqlens_k=None,
              tail_waves=None, tail_split=None, skip_past_end=None):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True) for q [B, H, Sq, D], k/v [B, H_kv, Sk, D], computed in FP8.
    - fp16/bf16 inputs are quantized here (`quantize`, lib.fp8.prepare's arithmetic: one scale
      per batch entry and K/V head); the output is in their dtype.
    - e4m3 inputs (torch.float8_e4m3fn) come with q_descale, k_descale, v_descale: float32
      (B, H_kv) on their device, x ≈ x8 · descale (FlashAttention-3's convention); the output
      is bfloat16.
    `causal` and `attn_mask` as in stage 6 (either alignment). `tiles`, `schedule`, `q_stages`,
    `lazy_rescale` (-1 or 0), `p_offset` (False: P cast without the 2^8), `v_in_kernel` (the
    producer warpgroup transposes V's tiles, instead of a pass before the kernel) and
    `exp2_poly` (eighths of the exponentials by polynomial on the FMA pipes, stage 6's
    EXP2_POLY_EIGHTHS), `row_sum_mma` (ROW_SUM_MMA; None: the default), `pdl` (the cast and
    attention kernels launched with PDL; None: PDL) and `tail_waves` (causal work on the queue:
    its last tail_waves·SMs tiles handed out longest first; None: stage 6's TAIL_WAVES) and
    `tail_split` (TAIL_SPLIT: the queue's last partial wave split along the keys; None: the
    default) and `skip_past_end` (SKIP_ROWS_PAST_END; None: on) are for measuring the alternatives. Not supported: seqlens_k (NotImplementedError), inputs that require grad
    (NoBackwardError)."""
    if seqlens_k is not None:
        raise NotImplementedError("stage 7 has no per-entry key lengths (seqlens_k): stage 6 has them")
    causal = sdpa_causal(q, k, causal, is_causal, enable_gqa)  # SDPA's keywords
    if attn_mask is not None:
        causal = causal_from_mask(causal, attn_mask, q, k, INFO)
    refuse_grad(INFO, q, k, v)
    scale = validate(q, k, v, causal=causal, scale=scale, info=INFO)
    _check_arch(q)
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    causal = causal_mode(causal, Sq, Sk, INFO)
    if Sq <= 1 and causal == 2:
        causal = 0  # one query bottom-right is the last position: it sees every key
    e4m3 = fp8.prepare_check(q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    out_dtype = torch.bfloat16 if e4m3 else q.dtype
    if q.numel() == 0 or Sk == 0:  # no queries, or no keys: what SDPA returns
        return torch.zeros(q.shape, dtype=out_dtype, device=q.device)
    if e4m3:
        q8, k8, v8 = q, k, v
        # the kernel indexes the descales as [b·H_kv + hk]: a transposed view is made contiguous
        qd, kd, vd = (d.contiguous() for d in (q_descale, k_descale, v_descale))
        # B of P·V: Vᵀ [B, H_kv, D, Sk rounded up to 32], keys in key_order per k-step; or V itself
        v_op = v8 if v_in_kernel else fp8.v_for_pv(v8)
    else:
        q8, k8, v_op, qd, kd, vd = quantize(q, k, v, v_transposed=not v_in_kernel, pdl=pdl)
    return forward(q8, k8, v_op, qd, kd, vd, Sk=Sk, causal=causal, scale=scale, out_dtype=out_dtype,
                   tiles=tiles, schedule=schedule, q_stages=q_stages, lazy_rescale=lazy_rescale, p_offset=p_offset,
                   v_in_kernel=v_in_kernel, exp2_poly=exp2_poly, row_sum_mma=row_sum_mma, pdl=pdl,
                   tail_waves=tail_waves, tail_split=tail_split, skip_past_end=skip_past_end)


def forward(q8, k8, v_op, q_descale, k_descale, v_descale, *, Sk: int, causal: int, scale: float,
            out_dtype=torch.bfloat16, tiles=None, schedule=None, q_stages=None, lazy_rescale=None,
            p_offset=None, v_in_kernel=False, exp2_poly=0, row_sum_mma=None, pdl=None, tail_waves=None,
            tail_split=None, skip_past_end=None):
    """The kernel alone, on inputs already prepared (what attention() does after quantizing and
    transposing V; the benchmark times it apart from those passes): q8 [B, H, Sq, D] and k8
    [B, H_kv, Sk, D] e4m3, v_op = lib.fp8.v_for_pv(v8) (or, v_in_kernel, v8 itself), the
    descales float32 (B, H_kv); `causal` the kernel's code (lib.inputs.causal_mode), `scale` a
    float. Checks nothing: attention() has."""
    B, H, Sq, D = q8.shape
    Hk = k8.shape[1]
    out = new_output(q8, dtype=out_dtype)
    sms = s6._sm_count(q8.device)
    ch = choose(B, H, Sq, Sk, D, bool(causal), sms, tiles=tiles, schedule=schedule, v_in_kernel=v_in_kernel)
    cfg = config(D, ch["tiles"], ch["schedule"], q_stages, lazy_rescale, p_offset, exp2_poly, v_in_kernel, row_sum_mma,
                 tail_split, skip_past_end)
    n_work = ch["work"]
    if n_work >= 2**31:
        raise NotImplementedError(f"stage 7: {n_work} work tiles exceed the grid's 2^31 - 1 blocks")
    bn = ch["tiles"][0]
    v_map = tensor_map(v_op, bn, D) if v_in_kernel else tensor_map(v_op, D, vt_atom(bn))  # V's tiles as K's, or Vᵀ's sub-tiles
    maps = (tensor_map(q8, cfg["block_m"], D), tensor_map(k8, bn, D), v_map)
    kernel, combine = _kernel(out_dtype, D, cfg["defines"], cfg["smem"])
    grid = min(n_work, sms) if cfg["persistent"] else n_work
    queue = _queue(q8.device).data_ptr() if dict(cfg["defines"])["DYNAMIC_WORK"] else 0
    n_qb = -(-Sq // cfg["block_m"])
    defines = dict(cfg["defines"])
    tail_heads = s6.tail_heads_for(bool(causal), bool(defines["DYNAMIC_WORK"]), n_work // n_qb, n_qb,
                                   sms, tail_waves)  # stage 6's rule: the queue's last waves longest first
    pieces = tail_pieces(n_work, -(-Sk // bn), grid, bool(causal)) if defines["TAIL_SPLIT"] else 1
    tail_first = n_work - n_work % grid if pieces > 1 else n_work
    parts = _tail_parts(q8.device, (n_work - tail_first) * pieces, cfg["block_m"], D) if pieces > 1 else (0, 0)
    nvrtc.launch_prepared(kernel, nvrtc.launch_config((grid, 1, 1), (cfg["threads"], 1, 1), cfg["smem"],
                                                      pdl=PDL if pdl is None else pdl),
                          (*maps, out.data_ptr(), q_descale.data_ptr(), k_descale.data_ptr(), v_descale.data_ptr(),
                           np.int32(Sq), np.int32(Sk), np.int32(H), np.int32(H // Hk),
                           np.float32(scale * math.log2(math.e)), np.int32(causal), np.int32(n_work),
                           np.int32(tail_heads), queue, np.int32(tail_first), np.int32(pieces), *parts))
    if pieces > 1:  # the tail's pieces weighed into its rows, after the kernel (PDL: waits on the GPU)
        n = (n_work - tail_first) * cfg["block_m"] * (D // 4)
        nvrtc.launch_prepared(combine, nvrtc.launch_config((-(-n // 256), 1, 1), (256, 1, 1), pdl=True),
                              (*parts, out.data_ptr(), np.int32(Sq), np.int32(Sk), np.int32(H), np.int32(H // Hk),
                               np.int32(n_work), np.int32(tail_first), np.int32(pieces)))
    return out

