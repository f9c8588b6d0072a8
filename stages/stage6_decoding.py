"""Stage 6's serving paths: how the prefill kernel (stages/stage6.py, stages/stage6.cu) is
launched for decoding and for caches, the rules apart from the kernel's launcher so that the
file a learner reads for FlashAttention-3's structure is about that structure.

Decoding and other calls with few work tiles (flash-decoding, chosen by `plan_splits` and
`packs_gqa`): with few query rows per K/V head (G·Sq ≤ 64), a block takes the rows of all G
query heads that share a K/V head (PACK_GQA, one consumer warpgroup: DECODE_TILES), and when the
blocks would not fill the GPU, each head's keys are split over several blocks whose partial
results the last of them, or a second kernel, combines (split-KV; causal calls only when packed
and aligned bottom-right, as speculative decoding is, or unpacked with one consumer and one query
block: `splits_causal`).
When those blocks do fill the GPU, two share each SM (`shares_sms`, DECODE_SHARED_TILES), so
one block's start and end overlap the other's streaming, as cuDNN's decoding kernels do. Where
each block reads only one or two key tiles (D64), there is nothing for a producer to copy ahead:
those blocks are one warpgroup without one, three per SM (`few_keys_per_block`).

Serving (issue 22): causal attention in either alignment, SDPA's top-left (causal=True) or
bottom-right (causal="bottom_right", or attn_mask=causal_lower_right(Sq, Sk): the Sq queries are
the last Sq key positions; one query bottom-right sees every key and may be split); packed
sequences of different lengths through `attention_varlen` (FlashAttention's
flash_attn_varlen_func, the same kernel with each work tile starting its copies at its
sequence's offset); and decoding against caches of different lengths per batch entry with
attention(..., seqlens_k=...) (FlashAttention's seqused_k).

The combine (split-KV's partial rows merged into the output) is in stages/stage6.cu, as a kernel
of its own or in the last block of each work tile (COMBINE_IN_BLOCK). Every rule here is a pure
function of the call's shape and the GPU's SM count; stage6.choose() applies them.
"""
from __future__ import annotations

import torch

# Decoding (PACK_GQA: G·Sq ≤ 64 query rows per K/V head): one consumer warpgroup holds them all,
# so a second would only multiply zeros; its registers and the shared memory go to a deeper ring
# (the producer keeps STAGES tiles in flight while the one consumer works).
DECODE_TILES = {64: (128, 4, 1), 128: (128, 3, 1)}
# D96 as D128 (the same shared memory and O registers); D256: 64-key tiles (O is 128 registers, a
# 128-key S and P 96 more), three stages (230.5 of 232.4 KB). Compiled offline, not yet measured
# (experiments/model_variants/head_dims.md).
DECODE_TILES.update({96: DECODE_TILES[128], 256: (64, 3, 1)})
# Decoding whose blocks fill the GPU (shares_sms): two blocks per SM (BLOCKS_PER_SM), each with a
# ring small enough for both to fit in the SM's shared memory (two buffers of 64 keys at D128: 83
# KB; of 128 keys at D64: 75 KB).
DECODE_SHARED_TILES = {64: (128, 2, 1), 96: (64, 2, 1), 128: (64, 2, 1)}  # none at D256: one block per SM
DECODE_SCHEDULE = "overlap without ping-pong"  # one consumer: nobody to take turns with

MAX_SPLITS = 128  # key splits per work tile (split-KV); each adds a partial O row in fp32
# What splitting costs beyond the blocks' own tiles, in key tiles: the fp32 partial rows and the
# combine. First measured at B1 H8 S512 D64 fp16 (split in 4: 14.1 µs, results/logs/2026-11-24-
# fd94088-call3; unsplit 13.7): about 3. Then at the 29 decode shapes of issue 21's splits
# experiment (results/logs/2026-11-25-6ac4cb0-h100/splits.json, every split count at each):
# with 3, work of 64 blocks over 8 key tiles (B64 H8/1 Sk1024) was split in 2 and ran 8% slower
# than unsplit; 4 leaves it whole, and changes no other choice there. Over 32 key tiles the same
# split still ran 5-7% slower than unsplit, which this count of waves and tiles does not see.
COMBINE_TILES = 4
# Split-KV's combine in the kernel: the last block of a work tile to finish reads every split's
# partial rows (rows · splits · D floats) and writes the output (combine_part in stages/stage6.cu:
# each thread four columns of a row, its splits read eight at a time), instead of a second
# launch. Worth it while they are few. The splits experiment (with the warp-per-row combine of
# the time) put the line here: at 64 partial rows of D64 (16 KB) the
# two ran level (in block − kernel: −1.4 to +0.6 µs), at 128 or more the kernel won (by up to
# 2.5 µs; 5.7 µs at Sq 4's 32-row groups, 9.3 µs at 128 splits); 64 KB, the rule before it, took
# those too.
COMBINE_IN_BLOCK_BYTES = 16 * 1024
# Split-KV's combine kernel launched with programmatic dependent launch (PDL): scheduled while
# the split blocks still run, it waits on the GPU (griddepcontrol.wait) instead of being
# launched after them, so the stream's gap between the two kernels overlaps the first's work.
# Predicted about a microsecond at the short decoding rows whose partial rows exceed
# COMBINE_IN_BLOCK_BYTES (B1 and B8 with one K/V head: 11-15 µs). Measured against the same
# launch without PDL at the shape map's 14 decoding rows that run the combine kernel (same
# rounds, L2 flushed, results/logs/2026-11-26-c95969d-h100): 0.7-1.4 µs saved, 1.016-1.146x
# (median 1.066x).
PDL_COMBINE = True
# The split kernel itself launched with PDL (griddep_wait after its barriers are set up), so its
# launch and blocks' start overlap the end of the kernel before it in the stream (in the
# benchmarks, the L2 flush; in a model, the previous layer's last kernel). Predicted under a
# microsecond, which only the shortest calls would see; measured against PDL on the combine
# kernel only, same rounds, at 12 rows (nine decoding, the latency shape, two prefill):
# 0.992-1.002x, median 1.000x (results/logs/2026-11-26-87cc4cc-h100). Off: the kernel before it
# (here the L2 flush) does not let its dependents go early, so nothing overlaps.
PDL_KERNEL = False


def pdl_launches(pdl) -> tuple[bool, bool]:
    """(the split kernel, the combine kernel) launched with PDL, for attention()'s `pdl`: None
    the defaults (PDL_KERNEL, PDL_COMBINE), True both, False neither, "combine" that one only."""
    if pdl is None:
        return PDL_KERNEL, PDL_COMBINE
    if pdl == "combine":
        return False, True
    if pdl in (True, False):
        return bool(pdl), bool(pdl)
    raise ValueError(f'pdl must be None (PDL_KERNEL, PDL_COMBINE), True, False or "combine", got {pdl!r}')


def combines_in_block(rows: int, n_splits: int, head_dim: int) -> bool:
    """Whether split-KV's combine runs in the last block of each work tile (rows: the work
    tile's query rows, G·Sq packed) rather than as a second kernel: COMBINE_IN_BLOCK_BYTES."""
    return n_splits > 1 and rows * n_splits * head_dim * 4 <= COMBINE_IN_BLOCK_BYTES


def combine_in_last_block(rows: int, n_splits: int, head_dim: int, defines: dict, given=None) -> bool:
    """Whether a launch's partial rows are combined by the last block of each work tile (else,
    when split, by the combine kernel): its build must have COMBINE_IN_BLOCK, and then `given`
    (the call's combine_in_block) or, if None, combines_in_block's rule decides."""
    return n_splits > 1 and bool(defines["COMBINE_IN_BLOCK"]) and (
        combines_in_block(rows, n_splits, head_dim) if given is None else given)


def packed_queries(q: torch.Tensor, group: int) -> torch.Tensor:
    """q [B, H, Sq, D] seen as [B, H/group, group, Sq, D] (no copy): the query rows of each K/V
    head's group of query heads, which PACK_GQA loads as one box."""
    B, H, Sq, D = q.shape
    sb, sh, ss, sd = q.stride()
    return q.as_strided((B, H // group, group, Sq, D), (sb, group * sh, sh, ss, sd))


def packs_gqa(H: int, Hk: int, Sq: int) -> bool:
    """Whether a call runs the packed (decoding) build: all G·Sq query rows of a K/V head's group
    fit in one consumer warpgroup's 64 rows (G = H/Hk). Then one block reads each K/V tile once for
    the whole group, where unpacked blocks would read it G times with 64 − Sq rows of every
    wgmma idle. With more rows per group the prefill build's blocks are full anyway."""
    return (H // Hk) * Sq <= 64


def splits_causal(pack: bool, causal, consumers: int = 0, query_blocks: int = 0) -> bool:
    """Whether a causal call may have its keys split: only aligned bottom-right (the kernel's
    causal mode 2), as speculative decoding and chunked prefill against a cache are, and only
    where each block's one consumer holds rows that include the last query: when it packs a
    group's queries (G·Sq rows in one block of one consumer), or, unpacked, when its blocks have
    one consumer and the call one query block (Sq <= 64: the work tile's rows are all of a head's
    queries). Such a consumer's causal tile count, counted from key 0 (stages/stage6.cu: my_tiles),
    covers every key up to the last, so a split's block does exactly its range's tiles, and each
    tile masks its keys by their absolute positions (softmax with kt = t0 + j). Blocks of several
    consumers, or of an earlier query block, count tiles from key 0 that a split starting later
    does not have, and are not split; a top-left call sees only its first Sq keys: nothing to
    split."""
    return causal == 2 and (bool(pack) or (consumers == 1 and query_blocks == 1))


def plan_splits(work: int, key_tiles: int, sms: int, unsplittable: bool) -> int:
    """How many blocks share each work tile's keys (split-KV). The rule, from how the kernel
    runs: one block per SM at a time; a block costs about its key tiles plus one tile's worth of
    fixed work (Q's load, the ring filling, the epilogue), so `work`·n blocks of
    ceil(key_tiles / n) tiles take about ceil(work·n / sms) waves × (ceil(key_tiles / n) + 1)
    tiles, and splitting at all adds COMBINE_TILES for the partial rows and the combine kernel's
    launch. The n from 1 to key_tiles (at most MAX_SPLITS) with the least is taken, the smallest
    on a tie. Work that already
    fills 80% of the SMs is not split (FlashAttention-3's threshold): there the waves' rounding
    may still favour a split, but the partial rows in fp32 and their combine cost more than it
    gains. An `unsplittable` call is not split: a causal one, unless splits_causal says it may
    (unpacked causal work tiles have different lengths, and their queries are long)."""
    if unsplittable or work <= 0 or work >= 0.8 * sms:
        return 1
    best, best_cost = 1, None
    for n in range(1, min(key_tiles, MAX_SPLITS) + 1):
        cost = -(-work * n // sms) * (-(-key_tiles // n) + 1) + (COMBINE_TILES if n > 1 else 0)
        if best_cost is None or cost < best_cost:
            best, best_cost = n, cost
    return best


def shares_sms(work: int, n_splits: int, sms: int) -> bool:
    """Whether a decoding launch runs two blocks per SM (DECODE_SHARED_TILES, BLOCKS_PER_SM=2)
    rather than one with a deeper K/V ring (DECODE_TILES): when its blocks, split as for one
    per SM, already fill 80% of the SMs. Then one block per SM spends its start (Q's copy, the
    first tiles' wait) and its end (the stores, the split counter) streaming nothing, and with
    more blocks than SMs the last wave leaves SMs idle (512 work tiles on 132 SMs: 3.88 waves);
    a second block per SM streams through the first one's start and end, and halves the waves'
    rounding. cuDNN decodes so: 512 blocks of 128 threads, 2 per SM at D128 and 4 at D64, every
    work tile resident at once (Nsight Compute, results/logs/2026-11-26-c09b29e-h100). With fewer
    blocks the GPU is not full and each SM streams for one block: the deeper ring (192 KB in
    flight at D128 against 64 KB) is what keeps its copies going. The split count stays the one
    planned for one block per SM: the second block is there to overlap, not to split finer.
    Measured at the map's 36 Sq 1 rows against one block per SM (results/logs/2026-11-26-e2d106f-h100,
    same rounds): at the 24 rows where this rule takes two blocks, 0.992-1.033x (median 1.02x;
    replanning the splits for twice the slots instead: 0.954-1.067x, median 1.008x); at the rows
    of 64 blocks it leaves alone, two blocks ran 0.90-0.95x (B8 H32/8 and B64 H8/1 at Sk 1024:
    64 unsplit work tiles of 8 key tiles each)."""
    return work * n_splits >= 0.8 * sms
# Tried for the decoding rows still under SDPA and not kept (results/logs/2026-11-26-d8ee25e-h100, the
# change: experiments/decode_launch/l2_prefetch_persistent_two_blocks.patch; at the map's 36 Sq 1 rows and two Sq 4
# rows, bf16, same rounds as the launch as called): (a) the producer prefetching the key tiles up
# to 2 or 4 past the one it loads into L2 (cp.async.bulk.prefetch.tensor, ahead of the two-deep
# ring), predicted to help where a block starts with an empty ring: same bits, sanitizers clean,
# and 0.76-1.01x with 2 tiles ahead (median 0.92x), 0.62-1.02x with 4; the longer the stream, the
# worse (B64 H32/8 Sk32768 D64: 1,849 against 1,400 µs), as if the prefetched lines were evicted
# before their load and read twice (not profiled). (b) These two blocks per SM made persistent (each takes work
# tiles from the queue and copies the next one's Q, K and V while its consumer ends this one, so
# no wave boundary has both of an SM's blocks starting at once): 0.963-0.998x at the 24 rows
# where the rule takes two blocks (median 0.991x), B64 H32/8 Sk1024 D64 0.976x.
# What is left at the two rows furthest under SDPA (Nsight Compute, results/logs/
# 2026-11-26-96dd84c-h100, clocks as the GPU sets them): at B64 H32/8 Sk1024 D64 cuDNN runs an sm80
# kernel of 512 blocks of 128 threads (16 query rows, 45 KB), one wave at four per SM, 49.7 µs at
# 2.75 TB/s, against stage 6's 512 blocks of 256 threads, two per SM in 1.94 waves, 50.9 µs at 2.70 TB/s;
# at B8 H32/8 Sk32768 D64 it splits the keys in four (256 blocks, and a 3.8 µs reduction kernel)
# and reads at 3.06 TB/s, 176.1 µs, where stage 6's two splits (128 blocks, one per SM) read at
# 2.92 TB/s, 184.6 µs. Four splits for stage 6 there measured 1.006-1.008x of two
# (2026-11-26-e2d106f-h100, 2026-11-26-70e26ce-h100).

# Decoding blocks of one or two key tiles at D64 (few_keys_per_block): one warpgroup without a
# producer, three per SM.
FEW_KEYS_TILES = {64: (128, 2, 1)}
FEW_KEYS_BLOCKS = 3
FEW_KEYS_SCHEDULE = "no warp specialization"


def few_keys_per_block(head_dim: int, per_split: int) -> bool:
    """Whether a packed decoding launch runs blocks of one warpgroup without a producer
    (FEW_KEYS_SCHEDULE: its first thread issues the copies), FEW_KEYS_BLOCKS per SM with
    FEW_KEYS_TILES, instead of a producer and a consumer: at D64 when each block reads at most two
    key tiles of 128 (per_split, the split count kept as planned). A producer is there to copy
    the next tiles while the consumer computes; a block of one or two tiles has no next tile, and
    pays for it anyway: twice the threads, setmaxnreg, and every tile handed over through a
    barrier. cuDNN's decoding blocks are 128 threads without one (Nsight Compute,
    results/logs/2026-11-26-c09b29e-h100). Measured against the launch before, same rounds, at the
    map's Sq 1 rows and two Sq 4 rows (results/logs/2026-11-26-f8b943b-h100): at the eight D64 rows of
    one or two tiles a block 1.007-1.048x (B1 H8/1 Sk1024 1.048x, B1 H32/8 Sk4096 1.037x, B8
    H8/1 Sk1024 1.032x); with more tiles a block the producer's copies ahead win (0.85-0.99x at
    the long streaming rows, 0.90-0.92x at 64 unsplit blocks of 8 tiles); at D128 (two blocks of
    64-key tiles per SM) 0.98-1.04x, so not there. Four blocks per SM with 64-key tiles ran
    1.006-1.050x at the same eight rows but 0.98x at one, and far slower with more tiles."""
    return head_dim in FEW_KEYS_TILES and per_split <= 2


def check_seqlens_k(seqlens_k, q) -> int:
    # contiguous: the kernels read entry b at the data pointer plus b (a strided view, such as
    # lens2d[:, 0], would be read at the wrong places without an error)
    if not (isinstance(seqlens_k, torch.Tensor) and seqlens_k.dtype == torch.int32
            and seqlens_k.shape == (q.shape[0],) and seqlens_k.device == q.device and seqlens_k.is_contiguous()):
        strided = isinstance(seqlens_k, torch.Tensor) and not seqlens_k.is_contiguous()
        raise ValueError(f"seqlens_k must be a contiguous int32 tensor of shape [B] = [{q.shape[0]}] on "
                         f"{q.device}, got {getattr(seqlens_k, 'dtype', type(seqlens_k).__name__)} "
                         f"{tuple(getattr(seqlens_k, 'shape', ()))}{' strided' if strided else ''} on "
                         f"{getattr(seqlens_k, 'device', '-')}")
    return seqlens_k.data_ptr()
