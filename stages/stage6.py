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

Serving — decoding (split-KV, packed GQA, the combine), per-entry key lengths (`seqlens_k`) and
packed sequences — is planned by the rules in stages/stage6_decoding.py: the same kernel, launched
differently. This file is the prefill kernel's launcher: FlashAttention-3's structure.

Training: the kernel also writes each row's log-sum-exp when asked (`lse=`), which stage 8's
backward starts from; `stages.autograd.attention(q, k, v, forward=6)` composes the two for
autograd. This file is the forward alone.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from lib import nvrtc
from lib.tma import Address, tensor_map
from stages.stage6_decoding import (DECODE_SCHEDULE, DECODE_SHARED_TILES, DECODE_TILES, FEW_KEYS_BLOCKS,
                                    FEW_KEYS_SCHEDULE, FEW_KEYS_TILES, MAX_SPLITS, check_seqlens_k,
                                    combine_in_last_block, few_keys_per_block, packed_queries, packs_gqa,
                                    pdl_launches, plan_splits, shares_sms, splits_causal)
from stages.stage6_paged import PAGE_SIZES, Paged, check_page_ids, check_paged, doubles_splits, ids_ahead, paged_tiles
from stages.stage6_kv_fp8 import (FP8_SHARED_TILES, FP8_SWITCHES, KV_FP8_HEAD_DIMS, STAGED_CHOICES,
                                  check_fp8_switches, check_kv_fp8, fp8_doubles_splits, fp8_map, fp8_shares_sms,
                                  fp8_switches_on, fp8_tiles, is_fp8_call, refuse_options, staged_buffers,
                                  staging_bytes)
from stages.stage6_variants import NONE as NO_VARIANTS, Variants, check_variants, finite_window, variant_tiles
from lib.inputs import (NO_MASK, GPUTooOldError, StageInfo, causal_from_mask, causal_mode,
                        new_output, refuse_grad, sdpa_causal, trivial_output, validate_cached,
                        validate_varlen)

SOURCE = Path(__file__).with_suffix(".cu")
ARCH = "sm_90a"  # wgmma and setmaxnreg exist only in the arch-specific target
# (BLOCK_N, STAGES, CONSUMERS) per head dim: keys per tile, K/V ring depth, consumer warpgroups
# (64 query rows each), picked from CHOICES on the H100 (scripts/stage6_schedules.py): at D64
# three consumers (192 rows per block: two thirds of the K/V traffic per row of two); at D128
# 176-key tiles (fewer per-tile fixed costs: barriers, shuffles, turns; 2 stages fit), within the
# noise of (128, 3, 2), which was faster causal.
TILES = {64: (128, 2, 3), 128: (176, 2, 2)}
# Head dims 96 and 256 (issue 51; the design: experiments/model_variants/head_dims.md). D96 is held in shared memory and in O's registers as
# D128 (two 64-column blocks, the second half zero-filled by the copy engine; P·V over 128
# columns, stages/stage6.cu: PV_N), so it takes D128's tables wherever they apply; only Q·Kᵀ is
# shorter (6 k-steps of 16 instead of 8). D256: O alone is 128 registers per consumer thread, so
# 64-key tiles (S 32 and P 16 registers) and the 196 KB of a 128-row Q and two 64-key K/V stages:
# see head_dim_tiles' rule.
TILES.update({96: TILES[128], 256: (64, 2, 2)})
# Head dims whose tables were tuned on the H100 (call_schedule's, short_tiles' rules): the others
# run the default schedule everywhere.
TUNED_HEAD_DIMS = (64, 128)
CHOICES = [(128, 2, 2), (128, 3, 2), (176, 2, 2), (64, 4, 2), (128, 2, 3), (128, 3, 3), (128, 4, 3), (128, 4, 2),
           (128, 4, 1), (128, 3, 1), (128, 2, 1), (64, 2, 1), (64, 4, 1)]
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
    # PINGPONG=2: the consumers take turns running their softmax instead of issuing their
    # products (cuDNN's Hopper kernels take them so, two consumers of 64 rows, no overlap within
    # a warpgroup): one warpgroup has the exp2 unit to itself while the other's products run.
    "softmax ping-pong": dict(_FA3, PINGPONG=2, PERSISTENT=0, DYNAMIC_WORK=0),
}
ALL_SCHEDULES = {**SCHEDULES, **VARIANTS}
# The schedule each head dim runs by default: the pick of `scripts/stage6_schedules.py --pick` on
# the H100 (candidates and rule fixed before measuring: PICK_CANDIDATES, PICK_RULE there; the
# rounds it timed are in results/logs/). Schedules a few percent apart need those repeated rounds.
DEFAULT_SCHEDULES = {64: "+ intra-warpgroup overlap", 96: "+ intra-warpgroup overlap",
                     128: "+ intra-warpgroup overlap", 256: "+ intra-warpgroup overlap"}


def default_schedule(head_dim: int) -> str:
    return DEFAULT_SCHEDULES[head_dim]


# Which launch a prefill call gets (call_schedule), from how its work tiles look: with more work
# tiles than SMs, full attention gets persistent blocks and causal attention with up to
# QUEUE_KEYS keys the work queue (CAUSAL_QUEUE); up to SHORT_KEYS keys, SHORT_TILES (short_tiles).
QUEUE_KEYS = {64: 2048, 128: 2048}
SHORT_KEYS = {64: 1024, 128: 2048}
SHORT_TILES = {(64, False): (128, 4, 3), (64, True): (128, 4, 2), (128, False): (128, 2, 2), (128, True): (128, 2, 2)}
CAUSAL_QUEUE = {64: "work queue without ping-pong", 128: "+ work queue"}
# A sliding window narrower than the keys (call_schedule), and at D128 its tiles (WINDOW_TILES):
# measured at B1 H16 S32768, causal, a 4096-key window, bf16 (experiments/window_schedule/, the
# H200, 2026-11-29, 7 interleaved rounds), against the default causal build's scores per µs: D128
# one block per work tile 0.896x, persistent blocks 0.908x, the work queue 0.926x; on 128-key
# tiles (two Q buffers fit: O stored by TMA) persistent blocks 1.005x, the queue 0.953x, three Q
# buffers with the P·V carried 0.958x; D64 (its default tiles) 0.914x, persistent blocks 0.963x,
# the queue 0.977x, without ping-pong 0.973x. Then at 7 other shapes against the launch each call
# got before (--rule): D128 1.07-1.29x; D64 1.06x at S 8192-32768 for the queue with ping-pong,
# 0.976x at S 2048 against the queue without it (the causal rule there): D64 takes the latter.
WINDOW_SCHEDULES = {64: "work queue without ping-pong", 128: "+ persistent blocks"}
WINDOW_TILES = {128: (128, 2, 2)}
# Tried at the short causal prompts and not kept (results/logs/2026-11-26-b0f0259-h100; the kernel
# change: experiments/half_last_tile/): a consumer's last key tile computed 64 keys wide where its
# upper half is masked for its rows (consumer 0 of two at each diagonal: 20% of its tile-products
# at S 512). Predicted 3-6% at D64 causal S 512; measured 1.01x there, 1.00-1.01x at S 1024 and
# 1.02x at S 2048, and 0.98-0.99x at full attention, where no tile is halved but the build carries
# the extra code. Consumer 0 finishes early, but its work tile ends with consumer 1's whole diagonal.
# Also tried there (results/logs/2026-11-26-2c45561-h100): the consumers taking turns at their softmax
# (PINGPONG=2, as cuDNN's kernel does) on the work queue, so that one consumer's exponentials run
# beside the other's products instead of both at once: 0.97-0.98x at D64 causal S 512, 0.96x at
# S 1024, 0.93x full, 0.97-0.98x at D128 causal S 512; without the overlap within a warpgroup
# (cuDNN's way) 0.95-0.98x. And (2026-11-26-46e0206-h100; experiments/causal_head_groups/) the queue
# handing out causal work longest first across groups of heads whose K and V fill a quarter of the
# L2 (every head's heaviest query block of the group, then every head's next), for a shorter tail: Nsight
# Compute at D64 causal S 512 had the SMs' busy cycles spread over 113-131k, about one heavy work
# tile. Same bits; against the per-head order in the same build: +1.4% and +4.5% at D64 causal
# S 512 and 1024 with 4 K/V heads, -3% and level with 16, -2.6% at S 2048, -2.5 to -4% at D128
# S 512-2048; and the group decode's registers made the builds with the carried P·V spill
# (16-48 bytes), D128's short prompts among them.


def call_schedule(head_dim: int, causal: bool, Sk: int, work: int, sms: int, window_cuts: bool = False) -> str:
    """The schedule a prefill call runs when none is asked for. DEFAULT_SCHEDULES is the kernel;
    what differs is what happens between a block's work tiles, which matters when work tiles are
    short and there are more of them than SMs (with `work` ≤ `sms` every block has one work
    tile: nothing to hide a start under, and the head dim's default launch is kept — at B1 H8
    S512, 24 work tiles, the persistent launches measured 8–13% slower: 14.1 → 15.3 µs full,
    13.7 → 15.5 causal, fp16, in the bench logs of results/logs/2026-11-24-fd94088-call3 and
    -dc99aa6-call7):
    - full attention: persistent blocks (one per SM, fixed stride). Every work tile has the same
      length, so the stride balances the SMs by itself; the producer copies the next tile's Q a
      work tile ahead (two Q buffers), the consumers' turns run on from one work tile to the
      next, and O leaves by TMA store (stores_by_tma), so a work tile's start and end cost the
      consumers little. Measured no slower at the long shapes, where a tile's work dwarfs both;
    - causal with up to QUEUE_KEYS keys: work tiles differ in length, so a fixed stride
      unbalances the SMs; a work queue hands the next tile to whichever block is free. At D64
      without ping-pong, at D128 with it: the faster of the two at S 512–2048 in the schedules
      part of scripts/shape_map.py (results/logs/2026-11-24-3463826-call5, and at D64 again in
      -2026-11-25-18b9a4f-call3, where the queue also beat one block per work tile at S 2048:
      198 against 205 µs);
    - causal with longer keys: the head dim's default (one block per work tile, heaviest
      first), where the tiles' own work dwarfs their start (D64 S 8192: 579 against 615 µs for
      the queue, in the same log);
    - a sliding window narrower than the keys (`window_cuts`), causal or not: WINDOW_SCHEDULES.
      Each work tile reads only the key tiles its rows' windows reach, about as many for every
      tile, so each block's start and end weigh on it as on a short prompt's, however long the
      sequence."""
    if work <= sms or head_dim not in TUNED_HEAD_DIMS:
        return DEFAULT_SCHEDULES[head_dim]
    if window_cuts:
        return WINDOW_SCHEDULES[head_dim]
    if not causal:
        return "+ persistent blocks"
    if Sk <= QUEUE_KEYS[head_dim]:
        return CAUSAL_QUEUE[head_dim]
    return DEFAULT_SCHEDULES[head_dim]


# Few work tiles: blocks of one consumer warpgroup (and a three-deep ring), see few_rows.
FEW_ROWS_TILES = {64: (128, 3, 1), 96: (128, 3, 1), 128: (128, 3, 1), 256: (64, 3, 1)}


def few_rows(B: int, H: int, Sq: int, sms: int) -> bool:
    """Whether a prefill call runs blocks of one consumer (64 query rows, FEW_ROWS_TILES, no
    ping-pong): when every such block gets an SM to itself (B·H·⌈Sq/64⌉ ≤ SMs). A block's
    consumers share one SM's tensor cores and exp2 unit, so with SMs to spare, three consumers
    in one block take longer than the same rows in three blocks side by side; once the blocks
    exceed one wave they queue for SMs, and a block of several consumers (ping-pong hiding one's
    softmax under another's products) gets more work through each SM. Measured at the latency
    shape, B1 H8 S512 (fp16): 14.7 → 10.8 µs at D64 (24 blocks of three consumers against 64 of
    one), 16.0 → 13.2 µs at D128 (results/logs/2026-11-25-fd50989-call2)."""
    return B * H * -(-Sq // 64) <= sms


def short_tiles(head_dim: int, Sk: int, schedule: str, causal: bool):
    """The tiles of a persistent launch with short keys (up to SHORT_KEYS), or None for the head
    dim's (SHORT_TILES):
    - D128: the 176-key tiles leave no room for a second Q buffer (q_buffers): a short work tile
      (up to 16 key tiles of 128) gains more from loading the next Q early than from fewer,
      longer key tiles (S 512–2048 in results/logs/2026-11-24-3463826-call5: 3–8% with the TMA
      store). A long one keeps the 176-key tiles;
    - D64 causal: blocks of two consumers (128 rows) instead of three. With 128-key tiles a
      192-row block's first consumer ends its diagonal a key tile before the last one, and
      idles a key tile of every short work tile; in a 128-row block both end on the same key
      tile. 94 → 87 µs at S 512 and 135 → 128 at S 1024 (results/logs/2026-11-25-18b9a4f-call3);
      at S 2048 three consumers are faster again (198 against 211 µs);
    - D64 full attention keeps three consumers, whose work tiles are all alike (104 against 113
      µs at S 512 for two);
    - D64, both: a ring of four K/V tiles instead of two. A short work tile has 1-8 key tiles;
      once its next Q no longer waits for a buffer (three Q buffers, q_stages_for), the ring's
      depth is what holds the producer back, and four tiles hold all of an S 512 work tile's
      keys, so the next work tile's first K and V are copied while this one runs. Measured with
      three Q buffers against the launch before, same rounds (results/logs/2026-11-26-3a0c235-h100,
      2026-11-26-cc922fc-h100): full S 512 (128, 4, 3) 1.054-1.061x, S 1024 1.011-1.015x; causal S 512
      (128, 4, 2) 1.037x, S 1024 1.016x; with two Q buffers the deeper ring alone was level
      (0.998-1.015x). At S 2048-4096 (not short here) the deeper rings were level (full) or
      slower (causal, against three consumers)."""
    persistent = ALL_SCHEDULES[schedule]["PERSISTENT"]
    return SHORT_TILES.get((head_dim, causal)) if persistent and Sk <= SHORT_KEYS.get(head_dim, 0) else None
# Causal work on the work queue: how many waves of work tiles at its end are handed out longest
# first (tail_heads_for); 0: none.
TAIL_WAVES = 2


def tail_heads_for(causal: bool, queue: bool, n_heads: int, n_qb: int, sms: int, waves: int | None = None) -> int:
    """The kernel's tail_heads, the rule: causal work tiles differ in length (1 to n_qb key
    tiles), and the work queue hands them out in order, (batch, head) pairs one after another,
    each head's heaviest query block first, which keeps a head's K and V in L2 while its query
    blocks run. But the last tiles handed out then include heavy ones, and the block that takes
    one finishes last while the others idle (Nsight Compute at D64 causal S 512: the SMs' busy
    cycles spread over 113-131k, about one heavy work tile; results/logs/2026-11-26-837362b-h100).
    Order matters only there: the last `waves`·SMs work tiles' heads are handed out longest first
    across them (every one's heaviest query block, then every one's next, ...), so the queue ends
    on the lightest tiles. Two waves: measured against the plain order in the same build, same
    rounds, both orders (results/logs/2026-11-26-4acecf5-h100, bf16, B·S = 16k): D64 causal S 512
    1.035-1.040x, S 1024 1.052-1.057x, S 2048 1.083x; D128 S 512 1.009-1.020x, S 1024 1.025x,
    S 2048 1.028-1.030x, MHA and GQA 4:1 alike. One wave gained 1.3-5.0%; four gained more at D64
    (1.043-1.104x) but lost at D128 S 512 MHA (0.983x), whose 132 tail heads' K and V no longer
    fit the L2 beside the rest. (Longest first across groups of heads through the whole queue,
    2026-11-26-46e0206-h100 and 2026-11-26-1d97035-h100, lost up to 3% where its groups were many:
    each group's light tiles then run together.) 0 for full attention and launches without the queue."""
    waves = TAIL_WAVES if waves is None else int(waves)
    if waves <= 0 or not causal or not queue or n_qb <= 1:
        return 0
    return min(n_heads, -(-waves * sms // n_qb))


# Eighths of the scores whose exp2 runs as a polynomial on the FMA pipes instead of MUFU.EX2
# (stages/stage6.cu: poly_exp2), per head dim.
EXP2_POLY = {64: 0, 96: 0, 128: 0, 256: 0}
# When the softmax rescales O (stages/stage6.cu: LAZY_RESCALE), per head dim: -1 every tile, as
# FlashAttention-3 does; 0 only in warps where a row's max grew; k > 0 keeps a row's max until a
# tile's exceeds it by more than 2^k (FlashAttention-4's threshold, 8), so O is almost never
# rescaled after the first tile (P up to 2^k: fine in fp16/bf16).
LAZY_RESCALE = {64: 8, 96: 8, 128: 8, 256: 8}
TIMELINE_TILES, TIMELINE_EVENTS = 16, 4  # stages/stage6.cu: TL_TILES, TL_EVENTS
MAX_SMEM = 232_448  # bytes of shared memory one block may have on sm_90 (227 KB)
SM_SMEM = 233_472  # bytes of shared memory of one SM (228 KB), 1 KB of it reserved per resident block


def smem_bytes(head_dim: int, tiles, q_stages: int = 1) -> int:
    """One block's dynamic shared memory: the Q buffers, the K and V rings, the barriers and work
    slots (Smem), and 1 KB of slack to align the tiles to 1024 bytes."""
    bn, stages, consumers = tiles
    return (q_stages * 64 * consumers + 2 * stages * bn) * smem_width(head_dim) * 2 + 8 * (3 * q_stages + 4 * stages) + 1024


def smem_width(head_dim: int) -> int:
    """Elements a row of Q, K or V takes in shared memory: whole 64-column (128-byte) blocks, so
    D96 takes 128 (stages/stage6.cu: ATOMS)."""
    return 64 * -(-head_dim // 64)


def fits(head_dim: int, tiles, q_stages: int = 1) -> bool:
    """Whether a tile choice fits in one block's shared memory at this head dim."""
    return smem_bytes(head_dim, tiles, q_stages) <= MAX_SMEM


def stores_by_tma(persistent: bool, q_stages: int, pack_gqa: bool = False, seqs: bool = False) -> bool:
    """O_TMA_STORE, the rule: a persistent launch with two Q buffers writes O through shared
    memory and a TMA store. Its blocks go on to another work tile, and the consumers' own
    scattered 4-byte stores held each one 2-3k clocks at S 512 (the timeline of
    results/logs/2026-11-24-8f1ecaa-call4), a fifth of a 4-key-tile work tile; the copy engine
    takes them off the consumers. O is staged in its work tile's Q buffer: with only one, the
    next tile's Q waits for the store (measured 3-10% slower at S 512, D128 176-key tiles, in
    results/logs/2026-11-24-3463826-call5). A block with one work tile has nothing to go on to,
    and keeps the plain stores (and Q's early release). The packed and varlen builds write rows
    the 4-D box does not describe: plain stores."""
    return persistent and q_stages >= 2 and not pack_gqa and not seqs


# Tried and not kept (results/logs/2026-11-26-837362b-h100, 2026-11-26-620899b-h100,
# 2026-11-26-7b7b641-h100 and 2026-11-26-37d9c70-h100; the changes: experiments/stage6_epilogue/):
# the TMA-store epilogue's O written by stmatrix (four 8x8 tiles an instruction, one LOP3 per
# address) instead of 2·D/8 4-byte stores, and O's zeroing for rows without keys moved into that
# branch (ptxas makes it 32 selects on every work tile). Nsight Compute at D64 causal S 512 had the
# epilogue at 191 instructions a work tile per warp and 6.5% of the consumers' stall samples;
# predicted 1-3% there. Same bits; against the sources before, in pairs in both orders: stmatrix
# alone 0.994-1.000x at D64 causal S 512, 0.984-0.991x at S 1024, 1.004-1.010x at D64 full S
# 512-1024, 1.008x at D128 causal S 512; the zeroing moved 0.980-0.990x at D64 causal. Nor was the
# epilogue worth hiding (2026-11-26-bfbb0f0-h100; experiments/stage6_epilogue/): each work tile's
# epilogue run under the next work tile's first S, issued once its last P·V is done (O / l packed to
# 16 bits first: reading o while that S ran made ptxas serialize every wgmma, C7517/C7518; a product
# left in flight across the work loop's back edge, C7515). Same bits, sanitizers clean; predicted
# 3-6% at D64 causal S 512-1024 (6.5% of the stall samples in the epilogue, 9.5% at a work tile's
# first S, both consumers waiting together); measured 0.977-0.983x there, 0.95-0.99x at D128 S
# 512-2048. Stall samples say where warps wait, not what holds the block back.
# CARRY_PV where carries_pv allows it: off, except at D128 with three Q buffers (below).
CARRY_PV_DEFAULT = False


def carries_pv(persistent: bool, switches: dict, consumers: int, q_stages: int, tma_store: bool,
               head_dim: int = 64) -> bool:
    """CARRY_PV, the rule: at D128 with three Q buffers (q_stages_for's short work tiles), else
    off (CARRY_PV_DEFAULT). Once each work tile's start and end cost less (magic-number work
    decode, f89a660), it was measured again at 9 short-prefill rows (results/logs/
    2026-11-26-94bdaa4-h100, same rounds as the launch without it): with three Q buffers at D128 it
    gained 1.029-1.036x at S 512 and causal S 1024 over the same launch with two (0.99-1.01x over three
    without it: 261.1 against 264.2 µs full S 512, 200.1 against 203.8 causal), level at full
    S 1024; at D64 it was level or slower (0.953-1.004x), with two Q buffers too. A D128 P·V is
    twice as long as a D64 one (a 128-wide O), so the last P·V that waits alone at each work
    tile's end is twice as long beside the softmax it could hide under; and the carried work
    tile holds its Q buffer (where its O is staged) into the next one, so with two buffers the
    next Q waited for it. Where it may be switched on, a persistent
    launch whose consumers overlap S with P·V carries each work tile's last P·V into the next
    work tile's first turn, issued with its first S. The prediction: without it the overlap
    drains at every work tile's end (the last P·V alone, the epilogue, then the next first S with
    nothing beside it), about 2.5k clocks of a 12k-clock work tile at S 512 D64 (the timeline of
    results/logs/2026-11-25-edf711c-call7), so up to 1.2× there. Measured at S 512 and 1024 (B·S
    = 16k, bf16, results/logs/2026-11-25-0a60c0e-call3, carry against no carry in the same
    rounds): with two Q buffers level, 0.95-1.04× over 14 pairs (D64 full 105.9 against 106.2 µs, D128 full
    277.8 against 278.9); with one Q buffer (D128's 176-key tiles) 0.89-0.98× over 6. The consumers'
    turns already put one consumer's products beside another's epilogue: the bubble the timeline
    shows per consumer is not one of the tensor cores. (First try, -3b3239f-call2: 0.85-0.99×,
    the producer then waited for the carried tile's Q buffer ahead of the second K.) Never with
    a block of one work tile (nothing to carry into), nor with three consumers and the work
    queue (their 160 registers spill 28-40 bytes, NVRTC 13.0's ptxas), nor with one Q buffer and
    the TMA-store epilogue (the carried O is staged in the Q buffer the next tile's Q must wait
    for: a deadlock, which config refuses)."""
    wanted = CARRY_PV_DEFAULT or (head_dim in (96, 128) and q_stages == 3)
    return (wanted and persistent and bool(switches["INTRA_OVERLAP"]) and bool(switches["WARP_SPECIALIZED"])
            and not (consumers == 3 and switches["DYNAMIC_WORK"]) and not (tma_store and q_stages == 1))


def q_buffers(head_dim: int, tiles) -> int:
    """Q_STAGES, the rule: two Q buffers wherever they fit in shared memory, else one. A block
    with several work tiles (a persistent launch) then loads the next tile's Q while this tile's
    last products run, instead of after its last S = Q·Kᵀ: the next tile starts without waiting
    for a copy. With one work tile per block the second buffer is never used and costs nothing
    but shared memory, which one block per SM has to spare (the 176-key ring at D128 does not:
    one buffer there). A persistent launch of short work tiles takes three where they fit:
    q_stages_for."""
    return 2 if fits(head_dim, tiles, 2) else 1


# Three Q buffers where a persistent launch's work tiles have at most Q3_KEYS keys (8 key tiles
# of 128) and they fit (q_stages_for).
Q3_KEYS = 1024


def q_stages_for(head_dim: int, tiles, schedule: str, Sk: int, pack_gqa: bool = False) -> int | None:
    """Q_STAGES for a call (None: q_buffers' rule): three for a persistent launch whose work
    tiles are short (Sk ≤ Q3_KEYS) where three fit in shared memory. With two, work tile n + 1's
    Q is copied into the buffer work tile n − 1 used, free only once its O has left through the
    copy engine (stores_by_tma): a work tile of one to eight key tiles leaves the copy little
    time. With three it waits on tile n − 2. Measured against two in the same rounds at 9
    short-prefill rows (results/logs/2026-11-26-6e4cb88-h100 and 2026-11-26-94bdaa4-h100, bf16, B·S
    = 16k): 1.017-1.033x at D128 S 512, 1.000-1.009x at D64 S 512-1024 and D128 S 1024, 0.996x at
    D64 causal S 2048 (where the rule no longer applies)."""
    persistent = ALL_SCHEDULES[schedule]["PERSISTENT"]
    return 3 if persistent and not pack_gqa and Sk <= Q3_KEYS and fits(head_dim, tiles, 3) else None

# SKIP_ROWS_PAST_END (stages/stage6.cu, at my_tiles): in the last query block of a sequence whose
# length is no multiple of the block's 64·CONSUMERS rows, a consumer whose 64 rows all lie past the
# end computes nothing, where it used to run every product on zero rows that are never stored. At
# D64 (192 rows a block) S 512 and 2048 leave one of the last block's three consumers without a
# row, S 1024 and 4096 two: 11% of the rows a call computed at S 512 and 1024 were padding
# (predicted from the count: up to that much faster there, where the others then have the SM's
# tensor cores and exp2 unit to themselves; nothing at D128's 128-row blocks). Measured against the
# build without, same rounds (experiments/rows_past_end/rows_past_end_ab.py,
# results/logs/2026-11-26-daf7855-h100): 1.024-1.035x at D64 causal S 2048-4096 (the work queue, or
# one block per work tile, hands the time saved to other work), but level at full attention: its
# persistent blocks walk a fixed stride of 132 work tiles, and with 3, 6 or 11 query blocks a head
# every SM gets the same query block each time, so the lighter last blocks fall on the same SMs,
# which then wait. The work queue took the saving there, 1.010-1.029x of as called at D64 full S 512-1024
# (2026-11-26-c3dea5d-h100); the launch rule (call_schedule) does not take it yet.
SKIP_ROWS_PAST_END = True

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
    head_dims=(64, 96, 128, 256),
    sources=("stages/stage6.py", "stages/stage6_decoding.py", "stages/stage6_variants.py",
             "stages/stage6_paged.py", "stages/stage6_kv_fp8.py", "lib/tma.py",
             "stages/stage6.cu", "stages/hopper.cuh",
             "stages/pdl.cuh", "stages/work_queue.cuh",
             "stages/attention.cuh"),
    gqa=True,
    causal_alignments=("top_left", "bottom_right"),
    varlen=True,
    saves_lse=True,  # for stage 8's backward
    align_bytes=16,  # the copy engine: 16-byte-aligned base and strides
    # The notebook's count at B16 H16 S2048 D64, as shares of the matmul ceiling (so that it
    # stays the same prediction whichever run measured the ceiling; the journey multiplies by the
    # recorded one): per key tile and consumer, two products of 512 tensor-core cycles and 512
    # of MUFU.EX2 (×2 for the rest of the softmax); three consumers with every softmax hidden
    # under the others' products keep the tensor cores busy (1), with nothing overlapped they
    # take 3 × (512 + 1024) cycles for 3 × 512 of products (1/3).
    prediction={"of_matmul_ceiling": (1 / 3, 1.0),
                "basis": "wgmma and MUFU.EX2 cycles per key tile and consumer warpgroup: softmax "
                         "serialized with the products (low) to hidden under the other consumers' "
                         "products (high), × the recorded matmul ceiling"},
    notes="sm_90a only (H100/H200): wgmma and setmaxnreg exist in no other target.",
    extra={"arch": ARCH, "tensor_core_op": "HGMMA"},
)


@lru_cache(maxsize=None)
def config(head_dim: int, tiles=None, schedule: str | None = None, timeline: bool = False,
           exp2_poly: int | None = None, lazy_rescale: int | None = None, pack_gqa: bool = False,
           seqs: bool = False, q_stages: int | None = None, tma_store: bool | None = None,
           combine_in_block: bool | None = None, carry_pv: bool | None = None,
           blocks_per_sm: int = 1, skip_past_end: bool | None = None, softcap: int = 0,
           window: bool = False, sinks: bool = False, page_size: int = 0,
           page_ids_ahead: int | None = None, kv_fp8: bool = False, fp8_staged: int | None = None,
           fp8_switches: tuple = ()) -> dict:
    """Launch settings for one choice of (BLOCK_N, STAGES, CONSUMERS) and schedule: query rows
    per block, threads, dynamic shared memory (smem_bytes) and the kernel's defines. seqs: the
    build that reads per-sequence offsets or key lengths (attention_varlen, seqlens_k);
    q_stages: Q buffers (None: q_buffers' rule); tma_store: the epilogue writes O through shared
    memory and a TMA store (None: stores_by_tma's rule); combine_in_block: the build whose last
    split-KV block of a work tile may combine (None: the packed build, which has registers to
    spare; at D64 the prefill build's consumers spill with it); carry_pv: a work tile's last
    P·V issued with the next one's first S (None: carries_pv's rule); skip_past_end:
    SKIP_ROWS_PAST_END (None: the module's default). The models' variants (stages/stage6_variants.py):
    softcap 0, 1 or 2 (SOFTCAP: off, tanh.approx, tanh from ex2), window and sinks (WINDOW,
    SINKS); each define is there only when on, so the build without any is the one before them.
    page_size: the paged cache's build (PAGE_SIZE, stages/stage6_paged.py), with seqs; 0: none
    (no define, the build before it); page_ids_ahead: PAGE_IDS_AHEAD, the page ids that many key
    tiles ahead in shared memory (None: ids_ahead's rule, small pages only; 0: off, no define);
    kv_fp8: the e4m3 cache's build (KV_FP8, stages/stage6_kv_fp8.py: packed decoding only; its
    staging buffers counted in the shared memory); False: no define, the build before it;
    fp8_staged: its staging buffers (KV_FP8_STAGED; None: staged_buffers' rule, as many as fit);
    fp8_switches: the e4m3 build's switches turned on (names of FP8_SWITCHES; () none: attention()
    gives FP8_RULE's, fp8_switches_on): "fold" (KV_FP8_FOLD, the bf16 widening without its multiply
    by 2^120, which the descales take where they leave room; no effect on the fp16 build's code)
    and "wide" (KV_FP8_WIDE, 16-byte staging loads: stages/stage6.cu, widen_tile)."""
    if head_dim not in INFO.head_dims:
        raise ValueError(f"stage 6 builds head dims {INFO.head_dims_text}; got {head_dim}")
    schedule = DEFAULT_SCHEDULES[head_dim] if schedule is None else schedule
    if schedule not in ALL_SCHEDULES:
        raise ValueError(f"schedule must be one of {list(ALL_SCHEDULES)}, got {schedule!r}")
    bn, stages, consumers = tiles or TILES[head_dim]
    sw = dict(ALL_SCHEDULES[schedule])
    if sw["PINGPONG"] and consumers < 2:
        raise ValueError(f"schedule {schedule!r} takes turns between consumer warpgroups; tiles "
                         f"{(bn, stages, consumers)} have one (use {DECODE_SCHEDULE!r})")
    persistent = bool(sw.pop("PERSISTENT"))
    assert persistent or not sw["DYNAMIC_WORK"], "a work queue is for a persistent launch"
    block_m = 64 * consumers
    most = 3 if sw["WARP_SPECIALIZED"] else 4  # blocks of one consumer per SM, with a producer or without
    if blocks_per_sm not in range(1, most + 1) or (blocks_per_sm > 1 and (consumers != 1 or persistent)):
        raise ValueError(f"blocks_per_sm is 1, or 2-3 blocks of one consumer and a producer, or 2-4 of one "
                         f"consumer without a producer, launched one per work tile; got {blocks_per_sm!r} with "
                         f"tiles {(bn, stages, consumers)} and schedule {schedule!r}")
    # several blocks per SM each run one work tile: one Q buffer is all they use
    qs = (1 if blocks_per_sm > 1 else q_buffers(head_dim, (bn, stages, consumers))) if q_stages is None else q_stages
    if qs not in (1, 2, 3):
        raise ValueError(f"q_stages is 1, 2 or 3 Q buffers, got {q_stages!r}")
    smem = smem_bytes(head_dim, (bn, stages, consumers), qs)
    tma = stores_by_tma(persistent, qs, pack_gqa, seqs) if tma_store is None else bool(tma_store)
    if tma and (pack_gqa or seqs or not sw["WARP_SPECIALIZED"]):
        raise ValueError("the TMA-store epilogue is for the [B, H, S, D] build with a producer warpgroup")
    if smem > MAX_SMEM or blocks_per_sm * (smem + 1024) > SM_SMEM:
        raise ValueError(f"tiles {(bn, stages, consumers)} with {qs} Q buffer(s) at D{head_dim} need {smem:,} "
                         f"bytes of shared memory; {blocks_per_sm} block(s) per SM get at most "
                         f"{min(MAX_SMEM, SM_SMEM // blocks_per_sm - 1024):,} each on sm_90")
    carry = carries_pv(persistent, sw, consumers, qs, tma, head_dim) if carry_pv is None else bool(carry_pv)
    if carry and not (sw["INTRA_OVERLAP"] and sw["WARP_SPECIALIZED"]):
        raise ValueError(f"carry_pv carries the overlap's last P·V; schedule {schedule!r} has no overlap")
    if carry and tma and qs == 1:
        raise ValueError("carry_pv with the TMA-store epilogue needs two Q buffers (q_stages=2): the "
                         "carried tile's O is staged in the Q buffer the next tile loads into")
    eighths = EXP2_POLY[head_dim] if exp2_poly is None else exp2_poly
    if not 0 <= eighths <= 8:
        raise ValueError(f"exp2_poly counts eighths of the score columns, 0 to 8; got {eighths}")
    lazy = LAZY_RESCALE[head_dim] if lazy_rescale is None else lazy_rescale
    if not (isinstance(lazy, int) and -1 <= lazy <= 10):
        raise ValueError(f"lazy_rescale is -1 (rescale every tile) or a threshold 0 to 10 (log2); got {lazy!r}")
    defines = (("BLOCK_N", bn), ("STAGES", stages), ("CONSUMERS", consumers),
               *sorted(sw.items()), ("TIMELINE", int(timeline)), ("EXP2_POLY_EIGHTHS", eighths),
               ("LAZY_RESCALE", lazy), ("PACK_GQA", int(pack_gqa)), ("SEQS", int(seqs)), ("Q_STAGES", qs),
               ("O_TMA_STORE", int(tma)), ("CARRY_PV", int(carry)),
               ("COMBINE_IN_BLOCK", int(pack_gqa if combine_in_block is None else combine_in_block)),
               ("BLOCKS_PER_SM", blocks_per_sm), ("SKIP_ROWS_PAST_END", int(SKIP_ROWS_PAST_END if skip_past_end is None else bool(skip_past_end))))
    if softcap not in (0, 1, 2):
        raise ValueError(f"softcap is the SOFTCAP build: 0 (off), 1 (tanh.approx) or 2 (tanh from ex2); got {softcap!r}")
    defines += ((("SOFTCAP", int(softcap)),) if softcap else ()) + ((("WINDOW", 1),) if window else ()) \
        + ((("SINKS", 1),) if sinks else ())
    if page_size:
        if page_size not in PAGE_SIZES or not seqs or (bn % page_size and page_size % bn):
            raise ValueError(f"page_size is one of {PAGE_SIZES}, with seqs and a key tile that is whole "
                             f"pages or a page whole key tiles; got {page_size!r} with tiles "
                             f"{(bn, stages, consumers)}, seqs={seqs!r}")
        defines += (("PAGE_SIZE", int(page_size)),)
    if kv_fp8:
        if not (pack_gqa and seqs and consumers == 1 and sw["WARP_SPECIALIZED"] and sw["SETMAXNREG"]
                and not persistent and not page_size and not timeline and not tma and not carry
                and not (softcap or window or sinks) and head_dim in KV_FP8_HEAD_DIMS):
            raise ValueError(f"kv_fp8 is the packed decoding build (pack_gqa, seqs, one consumer and a producer "
                             f"warpgroup, one block per work tile, no pages, variants or timeline) at D"
                             f"{', D'.join(map(str, KV_FP8_HEAD_DIMS))}; got D{head_dim} tiles {(bn, stages, consumers)} "
                             f"schedule {schedule!r}")
        most = min(MAX_SMEM, SM_SMEM // blocks_per_sm - 1024)  # a block's shared memory
        staged = staged_buffers(head_dim, (bn, stages, consumers), most - smem) if fp8_staged is None else fp8_staged
        if staged not in STAGED_CHOICES:
            raise ValueError(f"kv_fp8: tiles {(bn, stages, consumers)} at D{head_dim} leave no room for a staging "
                             f"buffer of K and V ({smem:,} of {most:,} bytes)" if staged == 0 else
                             f"fp8_staged must be one of {STAGED_CHOICES} or None, got {fp8_staged!r}")
        defines += (("KV_FP8", 1), ("KV_FP8_STAGED", staged)) + tuple(
            (FP8_SWITCHES[name], 1) for name in sorted(fp8_switches))
        smem += staging_bytes(head_dim, (bn, stages, consumers), staged)
        if smem > most:
            raise ValueError(f"kv_fp8: tiles {(bn, stages, consumers)} at D{head_dim} with {staged} staging buffers (fp8_staged) need "
                             f"{smem:,} bytes of shared memory; {blocks_per_sm} block(s) per SM get at most "
                             f"{most:,} each")
    elif fp8_staged is not None or fp8_switches:
        raise ValueError("fp8_staged and fp8_switches are the e4m3 cache's build's (kv_fp8)")
    ahead = ids_ahead(page_size, bool(sw["WARP_SPECIALIZED"]), page_ids_ahead)
    if ahead:
        defines += (("PAGE_IDS_AHEAD", ahead),)
        smem += 4 * ahead * (bn // min(bn, page_size))  # Smem.page_ids, within the slack's alignment
        if smem > MAX_SMEM or blocks_per_sm * (smem + 1024) > SM_SMEM:
            raise ValueError(f"page_ids_ahead={ahead}: {smem:,} bytes of shared memory do not fit")
    return {"block_m": block_m, "threads": 128 * (consumers + sw["WARP_SPECIALIZED"]), "persistent": persistent,
            "smem": smem, "defines": defines}


def compile_for(arch: str = ARCH, dtype=torch.float16, head_dim: int = 64, tiles=None,
                schedule: str | None = None, timeline: bool = False, exp2_poly: int | None = None,
                lazy_rescale: int | None = None, decode: bool = False, seqs: bool = False,
                q_stages: int | None = None, tma_store: bool | None = None,
                carry_pv: bool | None = None, blocks_per_sm: int = 1, softcap: int = 0,
                window: bool = False, sinks: bool = False, page_size: int = 0, kv_fp8: bool = False,
                fp8_switches: tuple = ()) -> dict:
    """The stage's kernel compiled without a GPU, for lib.sass (decode=True: the build decoding
    runs, DECODE_TILES with PACK_GQA; seqs=True: the build of packed sequences and per-entry key
    lengths; softcap, window, sinks: the models' variant builds, as config takes them; page_size:
    the paged cache's build, seqs implied, tiles as paged_tiles makes them; kv_fp8: the e4m3 cache's
    build, decode and seqs implied, tiles as fp8_tiles makes them for blocks_per_sm). Only
    sm_90a has the instructions; any other arch is refused."""
    if arch != ARCH:
        raise NotImplementedError(f"stage 6 compiles only for {ARCH} (wgmma, setmaxnreg); got {arch}")
    if kv_fp8:
        decode, seqs, tiles = True, True, tiles or fp8_tiles(head_dim, blocks_per_sm)
    if decode:
        tiles, schedule = tiles or DECODE_TILES[head_dim], schedule or DECODE_SCHEDULE
    if page_size:
        tiles, seqs = paged_tiles(tiles or TILES[head_dim]), True
    cfg = config(head_dim, None if tiles is None else tuple(tiles), schedule, timeline, exp2_poly,
                 lazy_rescale, decode, seqs, q_stages, tma_store, None, carry_pv, blocks_per_sm,
                 softcap=softcap, window=window, sinks=sinks, page_size=page_size, kv_fp8=kv_fp8,
                 fp8_switches=fp8_switches)
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
        k = _kernels[key] = (nvrtc.load_kernel(compiled, "attention_wgmma", max_dynamic_smem=cfg["smem"]),
                             nvrtc.load_kernel(compiled, "attention_combine_splits"))
    return k


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


def choose(B, H, Hk, Sq, Sk, D, causal, sms, *, tiles=None, schedule=None, splits=None,
           pack_gqa=None, blocks_per_sm=None, variants: Variants = NO_VARIANTS, paged: int = 0,
           kv_fp8: bool = False, seqs: bool = False) -> dict:
    """What a call runs: packed or not (packs_gqa's rule, when tiles and schedule are the
    defaults), its tiles and schedule, the work tiles before splitting, the key splits
    (plan_splits' rule unless `splits` is given; never an empty split; `causal` False, True or
    the kernel's mode 0-2, of which only bottom-right (2) calls may be split, packed or on
    blocks of one consumer with one query block: splits_causal) and, when packed, the
    blocks per SM (shares_sms' rule unless `blocks_per_sm` is given; their tiles
    DECODE_SHARED_TILES unless `tiles` are given), or blocks without a producer
    (few_keys_per_block, when none of tiles, schedule and blocks_per_sm is given). `variants`: the
    call's model variants (stages/stage6_variants.py): with a window, work tiles read only the key
    tiles their rows' windows reach (key_span), and the splits are planned over those; a window
    that leaves out key tiles gets call_schedule's WINDOW_SCHEDULES and, tiles not given,
    WINDOW_TILES, with per-sequence offsets or key lengths too (`seqs`: packed sequences,
    seqlens_k, a paged cache; tests/test_stage6_variants.py::test_window_launches_in_packed_sequences,
    passed on an H200 at 14c418a); tiles not given lose a consumer or their 176-key width where the variants'
    registers would spill (variant_tiles). `paged`: the page size of a paged cache's call
    (stages/stage6_paged.py; 0: none): tiles not given run as paged_tiles makes them, splits not
    given as doubles_splits says.
    `kv_fp8`: an e4m3 cache's call (stages/stage6_kv_fp8.py: packed only): its tiles fp8_tiles' (two
    blocks per SM by shares_sms' rule where they fit; at D128 twice the splits where
    fp8_doubles_splits says), never the blocks without a producer."""
    window = finite_window(variants.window, Sq, Sk) if variants.window is not None else None
    pack = packs_gqa(H, Hk, Sq) and tiles is None and schedule is None if pack_gqa is None else pack_gqa
    given_tiles, given_schedule = tiles is not None, schedule is not None
    few = not pack and not given_tiles and schedule is None and few_rows(B, H, Sq, sms)
    if few:
        tiles, schedule = FEW_ROWS_TILES[D], DECODE_SCHEDULE
    tiles = tuple(tiles) if tiles is not None else (DECODE_TILES[D] if pack else TILES[D])
    if kv_fp8 and not given_tiles:
        tiles = fp8_tiles(D, 1)
    if not given_tiles:
        tiles = variant_tiles(tiles, variants)
        if paged:
            tiles = paged_tiles(tiles)

    def key_span(tiles):  # the key tiles a work tile reads, at most
        return window_span(Sq if pack else min(Sq, 64 * tiles[2]), Sk, tiles[0], window)

    key_tiles = key_span(tiles)
    block_m = 64 * tiles[2]
    # Work tiles: (batch·head, block of query rows), or (batch·K/V head) when packed.
    work = B * Hk if pack else B * H * ((Sq + block_m - 1) // block_m)
    if schedule is None:
        cuts = key_tiles < -(-Sk // tiles[0])  # a window that leaves out key tiles
        schedule = DECODE_SCHEDULE if pack else call_schedule(D, bool(causal), Sk, work, sms, cuts)
        # the launch's own tiles: short_tiles' for short keys, else a window's (WINDOW_TILES)
        short = None if pack or given_tiles else (
            short_tiles(D, Sk, schedule, bool(causal))
            or (WINDOW_TILES.get(D) if cuts and schedule == WINDOW_SCHEDULES.get(D) else None))
        if short is not None:
            short = variant_tiles(short, variants)
            short = paged_tiles(short) if paged else short
            tiles, key_tiles = short, key_span(short)
            block_m = 64 * tiles[2]
            work = B * H * ((Sq + block_m - 1) // block_m)
    if pack and (H // Hk) * Sq > block_m:
        raise ValueError(f"pack_gqa: the {H // Hk}·{Sq} query rows of a K/V head's group exceed the "
                         f"block's {block_m} rows")
    split_ok = not causal or splits_causal(pack, causal, tiles[2], -(-Sq // block_m))
    n = plan_splits(work, key_tiles, sms, not split_ok) if splits is None else min(splits, key_tiles, MAX_SPLITS)
    if splits is None and doubles_splits(paged, pack, work, n, sms, Sk, (H // Hk) * Sq):
        n = min(2 * n, key_tiles, MAX_SPLITS)
    if (splits is None and kv_fp8 and blocks_per_sm is None and not given_tiles
            and fp8_doubles_splits(D, work, n, key_tiles, sms, MAX_SPLITS)):
        n = 2 * n
    if n > 1 and not split_ok:
        raise NotImplementedError("stage 6 splits the keys (split-KV) of full attention, and of bottom-right "
                                  "causal calls that pack a group's queries or run one query block on blocks of "
                                  "one consumer (speculative decoding), only; pass splits=None or 1 with this "
                                  "causal mask")
    if (pack and not given_tiles and not given_schedule and blocks_per_sm is None and not kv_fp8
            and few_keys_per_block(D, -(-key_tiles // n))):
        tiles, schedule, blocks_per_sm = FEW_KEYS_TILES[D], FEW_KEYS_SCHEDULE, FEW_KEYS_BLOCKS
        key_tiles = key_span(tiles)
    if pack and blocks_per_sm is None:
        blocks_per_sm = 2 if (schedule == DECODE_SCHEDULE and D in (FP8_SHARED_TILES if kv_fp8 else DECODE_SHARED_TILES)
                              and (fp8_shares_sms(D, work, n, sms) if kv_fp8 else shares_sms(work, n, sms))) else 1
    if pack and blocks_per_sm == 2 and not given_tiles and D not in (FP8_SHARED_TILES if kv_fp8 else DECODE_SHARED_TILES):
        shared = FP8_SHARED_TILES if kv_fp8 else DECODE_SHARED_TILES
        raise NotImplementedError(f"two decoding blocks per SM have no tiles at D{D} ({'an e4m3 cache: ' if kv_fp8 else ''}"
                                  f"D{', D'.join(map(str, shared))}); pass tiles, or blocks_per_sm=1")
    if pack and blocks_per_sm == 2 and not given_tiles:
        # the same blocks (the split count planned for one per SM), with the smaller ring
        tiles = fp8_tiles(D, 2) if kv_fp8 else DECODE_SHARED_TILES[D]
        key_tiles = key_span(tiles)
    per_split = -(-key_tiles // n)
    return {"pack_gqa": bool(pack), "tiles": tiles, "schedule": schedule, "work": work,
            "blocks_per_sm": blocks_per_sm or 1,
            "splits": -(-key_tiles // per_split), "per_split": per_split,
            "q_stages": q_stages_for(D, tiles, schedule, Sk, pack)}


def window_span(rows: int, Sk: int, bn: int, window=None) -> int:
    """The key tiles of bn keys a work tile of `rows` consecutive query positions reads: all
    ceil(Sk / bn), or with a window (finite (left, right): stages/stage6_variants.finite_window)
    those its rows' windows reach, rows + left + right keys starting anywhere in a tile (one tile
    more), at most all."""
    tiles = -(-Sk // bn)
    if window is None:
        return tiles
    return min(tiles, -(-(rows + window[0] + window[1]) // bn) + 1)


class _Plan:
    """Everything about a call except the data pointers, made once per input layout and
    option set: a model's many small calls then cost about what SDPA's do on the host. The
    tensor maps are kept too; when a later call brings new tensors of the same layout, only
    their addresses are replaced (cuTensorMapReplaceAddress), not the whole map encoded."""

    __slots__ = ("kernel", "combine", "config", "combine_config", "args", "rows", "maps", "ptrs",
                 "trivial", "queues", "splits", "group", "partial_shape", "parts", "varlen", "o_tma",
                 "combine_in_block", "variant_args", "combine_sink_args", "max_pages", "kv_fp8")


_plans: dict = {}


def _make_plan(q, k, v, causal, scale, tiles, schedule, timeline, exp2_poly, lazy_rescale,
               splits, pack_gqa, varlen=None, seqs=False, q_stages=None, tma_store=None,
               combine_in_block=None, carry_pv=None, blocks_per_sm=None, pdl=None, tail_waves=None,
               skip_past_end=None, variants: Variants = NO_VARIANTS, paged: Paged | None = None,
               page_ids_ahead=None, kv_fp8: bool = False, fp8_staged=None, fp8_switches=()) -> _Plan:
    if tiles is not None and tuple(tiles) not in CHOICES:
        raise ValueError(f"tiles must be one of {CHOICES}, got {tiles}")
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits must be a positive int or None (chosen per call), got {splits!r}")
    if pack_gqa not in (None, True, False):
        raise ValueError(f"pack_gqa must be True, False or None (chosen per call), got {pack_gqa!r}")
    if combine_in_block not in (None, True, False):
        raise ValueError(f"combine_in_block must be True, False or None (chosen per call), got {combine_in_block!r}")
    if carry_pv not in (None, True, False):
        raise ValueError(f"carry_pv must be True, False or None (carries_pv's rule), got {carry_pv!r}")
    kernel_pdl, combine_pdl = pdl_launches(pdl)
    plan = _Plan()
    plan.varlen, plan.variant_args, plan.combine_sink_args = varlen is not None, None, None
    plan.max_pages = None if paged is None else paged.max_pages
    plan.kv_fp8 = kv_fp8
    if kv_fp8:  # checked by check_kv_fp8 (the scale too): k, v e4m3 [B, H_kv, Sk, D]
        B, H, Sq, D = q.shape
        Hk, Sk = k.shape[1], k.shape[2]
        causal = causal_mode(causal, Sq, Sk, INFO)
    elif paged is not None:  # checked by check_paged; k, v: its [num_pages, H_kv, page_size, D] views
        if tiles is not None and tuple(tiles) != paged_tiles(tiles):
            raise ValueError(f"a paged cache runs key tiles that are whole pages or a page whole key "
                             f"tiles (64 or 128 keys); got tiles {tuple(tiles)}")
        B, H, Sq, D = q.shape
        Hk, Sk = k.shape[1], paged.capacity  # the keys a table row can address play Sk's part
        causal = causal_mode(causal, Sq, Sk, INFO)
    elif varlen is None:
        scale = validate_cached(q, k, v, causal=causal, scale=scale, info=INFO)
        B, H, Sq, D = q.shape
        Hk, Sk = k.shape[1], k.shape[2]
        causal = causal_mode(causal, Sq, Sk, INFO)
    else:  # validated by validate_varlen: [1, H, total, D] views, the longest lengths
        scale, causal = varlen.scale, varlen.causal
        B, H, Sq, D = varlen.n_seqs, q.shape[1], varlen.max_q, q.shape[3]
        Hk, Sk = k.shape[1], varlen.max_k
    _check_arch(q)
    win = finite_window(variants.window, Sq, Sk) if variants.window is not None else None  # the kernel's
    if Sq <= 1 and causal:
        # One query per sequence is its last position: bottom-right it sees every key (full
        # attention, which may be split), top-left only the first.
        causal = NO_MASK if causal == 2 else causal
    # no queries, or no keys: what SDPA returns (a cache of no pages: every id out of range reads zeros)
    plan.trivial = B * H * Sq == 0 or Sk == 0 or (paged is not None and paged.num_pages == 0)
    if plan.trivial:
        return plan
    G = H // Hk
    ch = choose(B, H, Hk, Sq, Sk, D, causal, _sm_count(q.device), tiles=tiles, schedule=schedule,
                splits=splits, pack_gqa=pack_gqa, blocks_per_sm=blocks_per_sm, variants=variants,
                paged=0 if paged is None else paged.page_size, kv_fp8=kv_fp8,
                seqs=seqs or varlen is not None or paged is not None)
    pack, n, per_split = ch["pack_gqa"], ch["splits"], ch["per_split"]
    cfg = config(D, ch["tiles"], ch["schedule"], timeline, exp2_poly, lazy_rescale, pack,
                 seqs or varlen is not None, ch["q_stages"] if q_stages is None else q_stages, tma_store,
                 combine_in_block, carry_pv, ch["blocks_per_sm"], skip_past_end,
                 softcap=variants.softcap_build, window=variants.window is not None, sinks=variants.sinks,
                 page_size=0 if paged is None else paged.page_size, page_ids_ahead=page_ids_ahead,
                 kv_fp8=kv_fp8, fp8_staged=fp8_staged, fp8_switches=fp8_switches)
    n_work = ch["work"] * n
    if n_work >= 2**31:
        raise NotImplementedError(f"stage 6: {n_work} work tiles exceed the grid's 2^31 - 1 blocks")
    grid = min(n_work, _sm_count(q.device)) if cfg["persistent"] else n_work
    plan.kernel, plan.combine = _kernel(q.dtype, D, cfg)
    plan.config = nvrtc.launch_config((grid, 1, 1), (cfg["threads"], 1, 1), cfg["smem"], pdl=kernel_pdl)
    plan.splits, plan.group = n, (G if pack else 0)
    n_qb = 1 if pack else -(-Sq // cfg["block_m"])
    tail_heads = tail_heads_for(bool(causal) and n == 1, bool(dict(cfg["defines"])["DYNAMIC_WORK"]),
                                ch["work"] // n_qb, n_qb, _sm_count(q.device), tail_waves)
    plan.args = (np.int32(Sq), np.int32(Sk), np.int32(H), np.int32(G),
                 np.float32(scale * math.log2(math.e)), np.int32(causal), np.int32(n_work),
                 np.int32(n), np.int32(per_split), np.int32(tail_heads))
    # A variant build's own arguments (VARIANT_PARAMS), the sinks' pointer added per call (_launch)
    left, right = win or (Sk, Sq)  # no window: every key
    plan.variant_args = ((*softcap_args(variants, scale), np.int32(left), np.int32(right))
                         if variants.any else None)
    # the SINKS build's combine kernel finds a row's head from H, Sq and the rows' order (sinks, H, Sq, by token)
    plan.combine_sink_args = (np.int32(H), np.int32(Sq), np.int32(varlen is not None)) if variants.sinks else None
    rows = H * q.shape[2] if varlen is not None else B * H * Sq  # the output's rows
    plan.partial_shape = (rows, n, D)
    block_rows = G * Sq if pack else cfg["block_m"]
    plan.combine_in_block = combine_in_last_block(block_rows, n, D, dict(cfg["defines"]), combine_in_block)
    # the combine kernel: a block per row
    plan.combine_config = (nvrtc.launch_config((rows, 1, 1), (128, 1, 1), 0, pdl=combine_pdl)
                           if n > 1 and not plan.combine_in_block else None)
    plan.parts = {}  # split-KV's partial rows, one pair of buffers per stream (_partials)
    bn = ch["tiles"][0]
    # boxes of q, k, v and (O_TMA_STORE) the output: its map is made on the first call and
    # pointed at each call's new output (_launch); other builds take q's map there, unread
    kv_rows = bn if paged is None else min(bn, paged.page_size)  # paged: a box per page, or a tile of a page
    plan.rows = ((G, Sq) if pack else cfg["block_m"], kv_rows, kv_rows, 64)
    plan.maps = [_map(plan, i, t) for i, t in enumerate((q, k, v))] + [None]
    plan.ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr(), 0]
    plan.o_tma = bool(dict(cfg["defines"])["O_TMA_STORE"])
    # DYNAMIC_WORK: the work counter (next, blocks done), zero between launches (the kernel's
    # last block resets it). One per stream: launches on two streams at once must not share one.
    plan.queues = {} if dict(cfg["defines"])["DYNAMIC_WORK"] else None
    return plan


def softcap_args(variants: Variants, scale: float) -> tuple:
    """The SOFTCAP build's cap_mul and cap_log2 (stages/stage6.cu: cap_scores): the raw product
    q·k times cap_mul is tanh's argument (|scale| / c; for the ex2 form, SOFTCAP=2, times 2·log2 e),
    and cap_log2 = c·log2 e the softmax's scale on t. Scale 0 gives cap_mul 0: every visible key the
    same weight, as the reference gives. (1, 1) without a softcap (unread)."""
    if variants.softcap is None:
        return np.float32(1.0), np.float32(1.0)
    c = variants.softcap
    mul = abs(scale) / c * (2 * math.log2(math.e) if variants.softcap_build == 2 else 1.0)
    return np.float32(mul), np.float32(c * math.log2(math.e))


def _q_view(q, plan: _Plan):
    return packed_queries(q, plan.group) if plan.group else q


def _partials(plan: _Plan, device) -> tuple[int, int, int]:
    """The fp32 partial rows and log2-sum-exps of split-KV, and (combine_in_block) a counter per
    work tile, zero between launches (the last block resets it), made once per plan and stream:
    calls on one stream run in order, so they can share them (a fresh pair per call cost the host
    two allocations); calls on two streams at once get their own."""
    stream = torch.cuda.current_stream(device).cuda_stream
    parts = plan.parts.get(stream)
    if parts is None:
        rows, n, _ = plan.partial_shape
        counts = torch.zeros(plan.args[6] // n, dtype=torch.int32, device=device) if plan.combine_in_block else None
        parts = plan.parts[stream] = (torch.empty(plan.partial_shape, dtype=torch.float32, device=device),
                                      torch.empty((rows, n), dtype=torch.float32, device=device), counts)
    return parts[0].data_ptr(), parts[1].data_ptr(), 0 if parts[2] is None else parts[2].data_ptr()


def _queue(plan: _Plan, device) -> int:
    if plan.queues is None:
        return 0
    stream = torch.cuda.current_stream(device).cuda_stream
    queue = plan.queues.get(stream)
    if queue is None:
        queue = plan.queues[stream] = torch.zeros(2, dtype=torch.int32, device=device)
    return queue.data_ptr()


def attention(q, k, v, *, causal=False, scale=None, attn_mask=None, is_causal=None, enable_gqa=True,
              seqlens_k=None, tiles=None, schedule=None, timeline=None, exp2_poly=None, lazy_rescale=None,
              splits=None, pack_gqa=None, q_stages=None, tma_store=None, combine_in_block=None, carry_pv=None, lse=None,
              blocks_per_sm=None, pdl=None, tail_waves=None, skip_past_end=None, window=None, softcap=None,
              sinks=None, softcap_tanh=None, page_table=None, check_pages=False, page_ids_ahead=None,
              k_descale=None, v_descale=None, fp8_staged=None, fp8_switches=None):
    """Same meaning as F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
    enable_gqa=True) for q [B, H, Sq, D], k/v [B, H_kv, Sk, D]; output in q's dtype. `causal` may
    also name the alignment, "top_left" or "bottom_right", and `attn_mask` may be SDPA's causal
    bias, causal_upper_left(Sq, Sk) or causal_lower_right(Sq, Sk) (lib.inputs.causal_mode:
    bottom-right rows that see no key get zeros). `seqlens_k` (contiguous int32 [B] on q's device, or
    None): batch entry b uses only its first seqlens_k[b] keys, as decoding against caches of
    different lengths does (FlashAttention's seqused_k; values are clamped to 0 … Sk, never
    read past the tensor; a bottom-right diagonal then ends at each entry's last used key).
    Packed sequences of different lengths: attention_varlen.
    `tiles` (one of CHOICES), `schedule` (a key of ALL_SCHEDULES; default: call_schedule's rule,
    on the head dim's kernel, DEFAULT_SCHEDULES), `exp2_poly` (eighths of the exponentials computed by polynomial, 0–8)
    and `lazy_rescale` (-1: rescale O every tile; k >= 0: only when a row max grew by more than
    2^k, see LAZY_RESCALE) are for measuring the alternatives; `timeline`, an int64 CUDA tensor of
    (1 + CONSUMERS)·16·4 elements, receives clock64 stamps of block 0's first work tile (see
    stages/stage6.cu). Decoding: `splits` (blocks per work tile's keys; None: plan_splits' rule,
    1 for causal unless bottom-right and packed or on blocks of one consumer with one query
    block: splits_causal), `pack_gqa` (None: packs_gqa's rule when tiles and schedule are the
    defaults; True: a group's query rows in one block, DECODE_TILES unless tiles are given) and
    `combine_in_block` (split-KV's combine in the last block of each work tile rather than a
    second kernel; None: combines_in_block's rule), `pdl` (programmatic dependent launch of the
    kernel and of that second kernel: pdl_launches);
    `q_stages` (1, 2 or 3 Q buffers; None: q_buffers' rule), `tma_store` (the epilogue through
    shared memory and a TMA store; None: stores_by_tma's rule) and `carry_pv` (a work tile's
    last P·V issued with the next one's first S; None: carries_pv's rule) and `blocks_per_sm`
    (2 or 3 blocks of one consumer per SM, decoding; None: 1) and `tail_waves` (causal work on
    the queue: its last tail_waves·SMs work tiles handed out longest first; 0: none; None:
    tail_heads_for's rule) and `skip_past_end` (SKIP_ROWS_PAST_END; None: on) for measuring them.
    Gradients: this is the forward alone (an input that requires grad is refused:
    lib.inputs.refuse_grad); stages.autograd.attention(q, k, v, forward=6) adds stage 8's
    backward, from the log-sum-exp this forward writes: `lse`, a contiguous float32 [B, H, Sq] tensor on q's device,
    receives the rows' log-sum-exp (natural log, −∞ for a row that sees no key; the keys are
    then never split).
    The models' variants (stages/stage6_variants.py, issue 51), each its own build of the kernel:
    `softcap` (a finite c > 0: the scaled scores become c·tanh(s / c) before the mask, Gemma 2;
    `softcap_tanh` "approx" or "exp2" picks the tanh, None SOFTCAP_TANH's rule per dtype);
    `sinks` (a contiguous float32 [H] tensor on q's device: one logit per query head in every row's
    softmax denominator, gpt-oss; with split-KV the combine adds it once; `lse` includes it);
    `window` (left, right), ints >= -1 (-1: unbounded): query i, at key position i + Sk − Sq,
    sees keys i + Sk − Sq − left … i + Sk − Sq + right (FlashAttention's window_size; transformers'
    sliding window of W keys is (W − 1, 0)), with `causal` the intersection; with seqlens_k, Sk is
    each entry's own key count. Key tiles outside every row's window are skipped.
    A paged KV cache (`page_table`, stages/stage6_paged.py, issue 50): k and v are then caches
    [num_pages, page_size, H_kv, D] (page_size 16, 32, 64, 128 or 256; any strides with a
    unit-stride head dim, 16-byte aligned), `page_table` a contiguous int32 [B, max_pages] tensor on
    q's device (entry b's key j: row j % page_size of page page_table[b, j // page_size]) and
    `seqlens_k` is required; the keys' capacity max_pages·page_size plays Sk's part (the causal
    alignment of a row is at its entry's own seqlens_k, as without pages). Splits, packed GQA and the
    variants work as without pages; `attn_mask` and `lse` are not taken. What the device trusts (no
    read-back: the call may be captured in a CUDA graph and replayed with new values in the same
    tensors): seqlens_k is clamped to 0 … max_pages·page_size as without pages; page ids are read
    only from each entry's row, and only those of its first ceil(seqlens_k[b] / page_size) pages are
    used (the others may hold anything); a used id outside [0, num_pages) reads zeros (the copy
    engine's out-of-bounds fill: no fault, a wrong result). The rows of an entry's last page past
    seqlens_k[b] are read and masked, so they must be finite (P·V multiplies them by 0): a cache
    allocated with torch.zeros, or slots written before. `check_pages=True` copies the table and
    seqlens_k to the host and refuses an out-of-range id or length with a ValueError (it waits for
    the GPU; not while capturing a graph). `page_ids_ahead` (None: ids_ahead's rule, on for pages
    of 16 and 32 keys; 0: off; 1-8: key tiles ahead) is for measuring PAGE_IDS_AHEAD, the
    producer's page ids copied into shared memory ahead (stages/stage6_paged.py: ids_ahead).
    An e4m3 KV cache (issue 50 item 2; stages/stage6_kv_fp8.py, KV_FP8 in stages/stage6.cu): k and v
    in torch.float8_e4m3fn, [B, H_kv, Sk, D] with any strides whose head dim is unit-stride (16-byte
    aligned), with `k_descale` and `v_descale`, contiguous float32 [B, H_kv] on q's device: the
    attention is that of q with K = k.float()·k_descale[b, h_kv] and V = v.float()·v_descale[b, h_kv]
    (FlashAttention-3's convention), output in q's dtype (float16 or bfloat16). Decoding only: a
    K/V head's query rows (H/H_kv · Sq) must fit in 64 (packed GQA), D 64 or 128; seqlens_k,
    causal (bottom-right for Sq > 1), splits, combine_in_block, pdl and blocks_per_sm work as with a
    16-bit cache; page_table, lse, attn_mask, the models' variants, schedule, timeline, carry_pv,
    tma_store and pack_gqa=False are refused. The descales are read on the device (no read-back:
    the call may be captured in a CUDA graph); a non-finite one gives non-finite outputs. (In the
    bf16 build an e4m3 NaN in the cache reads as 480, in the fp16 build as NaN: a cache holds none.)
    `fp8_staged` (None: as many as fit, staged_buffers' rule; 1-8) is for measuring KV_FP8_STAGED,
    the e4m3 staging buffers each of K and V; `fp8_switches` ({"fold": bool, "wide": bool}; None:
    stages/stage6_kv_fp8.py's FP8_RULE: both on, at D64 and D128) overrides the rule, for
    measuring: KV_FP8_FOLD, the bf16 widening that leaves its 2^120 to the descales in every work
    tile whose descales leave room (the key's times the call's scale and the value's below 2^7 in
    magnitude; other work tiles widen with the multiply), and KV_FP8_WIDE, 16-byte staging loads."""
    fp8 = is_fp8_call(k, v, k_descale, v_descale)
    fp8_switches = check_fp8_switches(fp8_switches)
    if fp8_switches and not fp8:
        raise ValueError("fp8_switches are for an e4m3 cache (k_descale, v_descale)")
    fp8_switches = fp8_switches_on(q.shape[-1], fp8_switches) if fp8 else ()
    if fp8:
        refuse_options(page_table=page_table, lse=lse, attn_mask=attn_mask, window=window, softcap=softcap,
                       sinks=sinks, schedule=schedule, timeline=timeline, carry_pv=carry_pv, tma_store=tma_store,
                       pack_gqa=pack_gqa, tiles=tiles)
    if page_table is not None:
        if attn_mask is not None:
            raise NotImplementedError("a paged cache takes causal= (False, True, 'top_left', "
                                      "'bottom_right'), not attn_mask")
        if lse is not None:
            raise ValueError("lse is not written with page_table (stage 8 takes every key of each entry)")
    causal = sdpa_causal(q, k.permute(0, 2, 1, 3) if page_table is not None and isinstance(k, torch.Tensor)
                         and k.dim() == 4 else k, causal, is_causal, enable_gqa)  # SDPA's keywords
    variants = check_variants(q, window=window, softcap=softcap, sinks=sinks, softcap_tanh=softcap_tanh)
    if attn_mask is not None:
        causal = causal_from_mask(causal, attn_mask, q, k, INFO)
    if lse is not None:
        if not (isinstance(lse, torch.Tensor) and isinstance(q, torch.Tensor) and q.dim() == 4
                and lse.dtype == torch.float32 and lse.is_contiguous() and lse.device == q.device
                and tuple(lse.shape) == tuple(q.shape[:3])):
            raise ValueError(f"lse must be a contiguous float32 [B, H, Sq] = "
                             f"{list(getattr(q, 'shape', [])[:3])} tensor on q's device")
        if seqlens_k is not None:
            raise ValueError("lse is not written with seqlens_k (stage 8 takes every key of each entry)")
        splits = 1  # one block per row's keys: its log-sum-exp is the kernel's own
    try:  # attributes a non-tensor lacks: the full validation in _make_plan says what is wrong
        key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
               v.shape, v.stride(), v.dtype, v.device, causal, type(causal), scale, type(scale),
               None if tiles is None else tuple(tiles), schedule, timeline is not None, exp2_poly,
               lazy_rescale, splits, type(splits), pack_gqa, seqlens_k is not None, q_stages, tma_store,
               combine_in_block, carry_pv, blocks_per_sm, pdl, tail_waves, skip_past_end, variants,
               None if page_table is None else (page_table.shape, page_table.stride(), page_table.dtype,
                                                page_table.device), page_ids_ahead, fp8_staged, fp8_switches,
               *((t.shape, t.stride(), t.dtype, t.device) for t in (k_descale, v_descale) if t is not None))
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
    paged = None
    if plan is None:
        if page_table is not None:  # the caches as the maps see them, [num_pages, H_kv, page_size, D]
            paged, scale = check_paged(q, k, v, page_table, seqlens_k, causal=causal, scale=scale, info=INFO)
        if fp8:  # the e4m3 cache: always the packed build that reads seqlens_k (none: every key)
            scale = check_kv_fp8(q, k, v, k_descale, v_descale, causal=causal, scale=scale, info=INFO)
        plan = _make_plan(q, k if paged is None else paged.k, v if paged is None else paged.v, causal, scale,
                          tiles, schedule, timeline is not None, exp2_poly,
                          lazy_rescale, splits, True if fp8 else pack_gqa, seqs=seqlens_k is not None or fp8,
                          q_stages=q_stages,
                          tma_store=tma_store, combine_in_block=combine_in_block, carry_pv=carry_pv,
                          blocks_per_sm=blocks_per_sm, pdl=pdl, tail_waves=tail_waves,
                          skip_past_end=skip_past_end, variants=variants, paged=paged,
                          page_ids_ahead=page_ids_ahead, kv_fp8=fp8, fp8_staged=fp8_staged, fp8_switches=fp8_switches)
        if key is not None:
            if len(_plans) > 1024:
                _plans.clear()
            _plans[key] = plan
    if plan.trivial:
        if lse is not None:
            lse.fill_(-math.inf)  # no key: the log of an empty sum
            if sinks is not None:
                lse.copy_(sinks[None, :, None].expand_as(lse))  # the sink's term alone
        if page_table is not None:  # no queries, no keys, or no pages
            return torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        return trivial_output(q, k)
    used_k = check_seqlens_k(seqlens_k, q) if seqlens_k is not None else 0
    if page_table is None:
        return _launch(plan, q, k, v, ptrs, new_output(q), (0, 0, used_k), timeline, lse, sinks,
                       descales=(k_descale, v_descale) if fp8 else None)
    if check_pages:
        check_page_ids(page_table, seqlens_k, k.shape[0], k.shape[1])
    return _launch(plan, q, k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3), ptrs, new_output(q), (0, 0, used_k),
                   timeline, lse, sinks, page_table)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, scale=None, splits=None, pack_gqa=None, window=None, softcap=None,
                     sinks=None, softcap_tanh=None):
    """Packed sequences of different lengths, as FlashAttention's flash_attn_varlen_func takes
    them: q [total_q, H, D], k and v [total_k, H_kv, D] (GQA: H a multiple of H_kv), sequence b
    being rows cu_seqlens_q[b] … cu_seqlens_q[b + 1] − 1 of q and cu_seqlens_k[b] … of k and v
    (int32 offsets on q's device, from 0, non-decreasing, to the total); max_seqlen_q and
    max_seqlen_k at least the longest. causal: False, "top_left" or "bottom_right" within each
    sequence (a row that sees no key, and every row of a sequence without keys, gives zeros).
    Output [total_q, H, D].

    The kernel is attention()'s: the tensor maps describe q, k, v as [1, H, total, D], and a
    work tile of sequence b starts its copies at row cu_seqlens[b] instead of 0. Rows a box
    brings past a sequence's end belong to the next one: its keys are masked (a sequence's key
    count, not the box, bounds the softmax) and its queries' rows are never stored. The grid is
    that of the longest sequence for every one; work tiles past a shorter one's end do nothing.
    Reads the offsets on the host to check them (lib.inputs.validate_varlen): one copy per call.
    `splits` and `pack_gqa` as in attention(); the rules use the longest lengths. `window`,
    `softcap`, `sinks` and `softcap_tanh` as in attention(), within each sequence (a window is
    aligned to each sequence's own last query and key)."""
    call = validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=causal, scale=scale, info=INFO)
    variants = check_variants(q, window=window, softcap=softcap, sinks=sinks, softcap_tanh=softcap_tanh)
    key = ("varlen", call.q.shape, call.q.stride(), q.dtype, q.device, call.k.shape, call.k.stride(),
           call.v.stride(), call.n_seqs, call.max_q, call.max_k, call.causal, call.scale, splits,
           pack_gqa, variants)
    plan = _plans.get(key)
    ptrs = [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    if plan is None:
        plan = _plans[key] = _make_plan(call.q, call.k, call.v, call.causal, call.scale, None, None,
                                        False, None, None, splits, pack_gqa, varlen=call, variants=variants)
        ptrs = None
    out = new_output(q)  # [total_q, H, D]
    if plan.trivial:
        return out.zero_()  # no query rows, or no keys anywhere: zeros, as SDPA gives
    return _launch(plan, call.q, call.k, call.v, ptrs, out,
                   (cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), 0), None, sinks=sinks)


def _launch(plan: _Plan, q, k, v, ptrs, out, seqs, timeline, lse=None, sinks=None, page_table=None, descales=None):
    """Run a plan on these tensors (same layout as it was made for): the kernel, and split-KV's
    combine. `seqs`: the kernel's cu_q, cu_k and used_k pointers (0: none); `lse`: the rows'
    log-sum-exp tensor, or None; `sinks`: the sinks tensor of a SINKS build, or None; `page_table`:
    a paged plan's table (k and v then the caches' [num_pages, H_kv, page_size, D] views);
    `descales`: an e4m3 plan's (k_descale, v_descale)."""
    if ptrs is not None:
        for i, t in enumerate((q, k, v)):
            if ptrs[i] != plan.ptrs[i]:  # same layout, new tensor: point its map at it
                _retarget(plan, i, t)
    o_part, lse_part, counts = _partials(plan, q.device) if plan.splits > 1 else (0, 0, 0)
    if plan.o_tma:
        _retarget(plan, 3, out)
    nvrtc.launch_prepared(plan.kernel, plan.config,
                          (*plan.maps[:3], plan.maps[3] if plan.o_tma else plan.maps[0], out.data_ptr(),
                           o_part, lse_part, *plan.args,
                           timeline.data_ptr() if timeline is not None else 0, _queue(plan, q.device),
                           counts, *seqs, 0 if lse is None else lse.data_ptr(),
                           *(() if plan.variant_args is None else
                             (*plan.variant_args, 0 if sinks is None else sinks.data_ptr())),
                           *(() if plan.max_pages is None else (page_table.data_ptr(), np.int32(plan.max_pages))),
                           *(() if not plan.kv_fp8 else (descales[0].data_ptr(), descales[1].data_ptr()))))
    if plan.combine_config is not None:
        nvrtc.launch_prepared(plan.combine, plan.combine_config,
                              (o_part, lse_part, out.data_ptr(), np.int32(plan.partial_shape[0]), np.int32(plan.splits),
                               *(() if plan.combine_sink_args is None else
                                 (0 if sinks is None else sinks.data_ptr(), *plan.combine_sink_args))))
    return out


def _retarget(plan: _Plan, i: int, t) -> None:
    """Point tensor map i of a plan (q, k, v, the output) at tensor t, of the layout it was made
    for; a map not made yet is encoded."""
    plan.ptrs[i] = t.data_ptr()
    if plan.maps[i] is not None:
        try:
            plan.maps[i].replace_address(Address(t))
            return
        except Exception:  # a cuda.core without replace_address, or one that reads more: encode
            pass
    plan.maps[i] = _map(plan, i, t)


def _map(plan: _Plan, i: int, t):
    """A new tensor map of tensor i (q, k, v, the output) for a plan: an e4m3 cache's K and V
    unswizzled, whole rows of D bytes (stages/stage6_kv_fp8.py: fp8_map); the others as lib.tma makes them."""
    if plan.kv_fp8 and i in (1, 2):
        return fp8_map(t, plan.rows[i])
    return tensor_map(_q_view(t, plan) if i == 0 else t, plan.rows[i])


_sms: dict = {}


def _sm_count(device) -> int:
    n = _sms.get(device.index)
    if n is None:
        n = _sms[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n
