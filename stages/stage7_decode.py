"""FP8 decoding: attention of a few query rows over an e4m3 KV cache (issue 50 item 2), FP8's
own path beside stage 7's prefill kernel. The kernel is stages/stage7_decode.cu; this file
holds its launcher and the rules it launches by.

    out = stages.stage7_decode.attention(q, k8, v8, k_descale=kd, v_descale=vd, seqlens_k=lens)

The contract is stage 6's e4m3 call (stages/stage6_kv_fp8.py, checked by the same check_kv_fp8):
q fp16 or bf16 [B, H, Sq, D]; k and v torch.float8_e4m3fn [B, H_kv, Sk, D] (unit-stride head dim,
16-byte aligned); k_descale and v_descale float32 [B, H_kv] (FlashAttention-3's convention: the
true K is k8 · k_descale[b, h_kv]); seqlens_k contiguous int32 [B] (each entry's first seqlens_k[b] keys;
not read back on the host: trusted, as under CUDA graphs); causal False, "top_left" or
"bottom_right" (True: top-left, SDPA's). The products are 16-bit with exact widening, so the
accuracy is stage 6's e4m3 build's (the same error rule, tests/test_stage7_decode.py).

Why another kernel: stage 6's e4m3 build widens each tile into shared memory for its wgmma
consumers and read 2.5 TB/s of e4m3 at best (experiments/fp8_kv_decode). Here each thread widens
its own bytes in registers into mma.sync operands (the .cu's header says how no transpose is
needed), so the e4m3 bytes are copied once into shared memory and read once from it.
Scope: G·Sq ≤ 16 query rows per K/V head (one m16 tile), D 64 and 128.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from lib import nvrtc
from lib.inputs import NO_MASK, causal_mode
from stages import stage6 as s6
from stages.stage6_decoding import check_seqlens_k
from stages.stage6_kv_fp8 import check_kv_fp8

SOURCE = Path(__file__).with_name("stage7_decode.cu")
# what the fp8_decode record's sha256 covers (lib.results.stage_sha256)
SOURCES = ("stages/stage7_decode.py", "stages/stage7_decode.cu", "stages/mma.cuh", "stages/attention.cuh")
ROWS = 16  # query rows per K/V head the kernel holds: one m16 tile (the partial rows' layout)
HEAD_DIMS = (64, 128)
# (CHUNK keys a warp takes at a time, STAGES chunks in a warp's ring, WARPS per block), by head
# dim: one block of 8 warps an SM, one chunk in flight while the other is multiplied; the fastest
# at most of the probe's rows (experiments/fp8_decode_registers/README.md). plan_launch takes
# SMALL_TILES, blocks of 4 warps, where a block of 8 would leave warps without work or an SM
# without a second block to overlap a short one's start and end.
TILES = {64: (32, 2, 8), 128: (32, 2, 8)}
SMALL_TILES = {64: (32, 2, 4), 128: (32, 2, 4)}
# plan_launch's many short work tiles: blocks of 2 warps at D 128, four an SM (B 64 Sk 1k with
# EVICT_FIRST: 1.018x SMALL_TILES, experiments/fp8_decode_evict_first, "Tiles with the hint"; 1.004x
# at Sk 4k without it, experiments/fp8_decode_registers/h200_grid_warps2_9d3135c.log); D 64's as measured there.
MANY_SHORT_TILES = {64: (32, 2, 4), 128: (32, 2, 2)}
# plan_launch's "many short work tiles": at most this many chunks a tile, by head dim. D 128's
# from the grid probe (B 64 Sk 1k-4k: 2-6% over TILES); D 64's from probe.py --rule --D 64 at d03da32
# (experiments/fp8_decode_registers/h200_rule64_d03da32.log): SMALL_TILES 1.05x TILES at B 64 Sk 1k
# (32 chunks), 0.88x at Sk 4k.
SMALL_MAX_CHUNKS = {64: 32, 128: 128}
TILE_CHOICES = tuple((c, s, w) for c in (16, 32) for s in (2, 3, 4, 6) for w in (2, 4, 8))
MAX_SPLITS = 64
SMEM_MAX = 227 * 1024  # a block's shared memory on sm_90
SMEM_PER_SM = 228 * 1024
# The most warps an SM is asked to hold, by head dim: the launch bounds then give each thread
# 65,536 / 32 / warps registers, 170 at 12 (D64's builds take 114-150), 256 at 8 (D128's take
# 157-219: at 12 warps, 168, the 16-row builds of 4 warps spill, and the 8-row ones that fit ran
# slower than at 8 warps an SM: launch_smem).
MAX_WARPS_PER_SM = {64: 12, 128: 8}
MIN_CHUNKS_PER_WARP = 4  # a split leaves each warp at least this many chunks
# CLUSTER_MERGE (stages/stage7_decode.cu): split-KV with 2 … CLUSTER_MAX splits launched as one
# thread-block cluster per work tile, its splits merged through distributed shared memory; more
# splits, or False: the last block to finish merges them from global memory.
CLUSTER_MERGE = True
CLUSTER_MAX = 8  # the portable cluster size
# EVICT_FIRST (the .cu): the cache's copies marked evict_first in L2, taken by a call whose cache
# (K and V, e4m3, at Sk) is at most this many L2s. On the H200 with the records' flush, which leaves
# L2 full of dirty lines (experiments/fp8_decode_evict_first): 1.06-1.10x at caches of 34-134 MB
# (the dirty lines' write-back no longer shares the read), level at 268 MB, 0.96-0.97x at 537 MB and
# more; level everywhere with clean lines in L2. The H100 follows the rule unmeasured.
EVICT_FIRST_L2S = 3


class _Info:
    """The fields lib.results.stage_sha256 reads."""
    sources = SOURCES

    def source_paths(self):
        root = Path(__file__).resolve().parent.parent
        return [root / s for s in self.sources]


INFO = _Info()


def shared_bytes(D: int, tiles, cluster: bool = False) -> int:
    """A block's shared memory: its warps' rings, or the merge of their rows at the end (the
    rings' bytes reused; with CLUSTER_MERGE the block's merged rows and their log-sum-exps past
    it), whichever is larger."""
    chunk, stages, warps = tiles
    merge = warps * ROWS * (D + 4 + 2) * 4 + 16  # MERGE_STRIDE = D + 4; a flag
    return max(warps * stages * 2 * chunk * D, merge + (ROWS * D + ROWS) * 4 * cluster)


def blocks_per_sm(D: int, tiles) -> int:
    """Blocks an SM holds: by shared memory (1 KB of it reserved per block), and at most
    MAX_WARPS_PER_SM warps (the kernel's launch bounds ask the compiler for that many)."""
    by_smem = SMEM_PER_SM // (shared_bytes(D, tiles) + 1024)
    return max(1, min(by_smem, MAX_WARPS_PER_SM[D] // tiles[2]))


def launch_smem(D: int, tiles, cluster: bool = False) -> int:
    """The dynamic shared memory a launch asks for: shared_bytes, padded so that an SM holds no more
    than blocks_per_sm blocks. A build whose registers leave room for one block more would
    otherwise get it: the PACKED_ROWS build of SMALL_TILES at D128 (168 registers) ran three blocks
    of 4 warps an SM, 1.08-1.13x slower than two at B 64 Sk 1k-4k (experiments/fp8_decode_registers/h200_rule_c73887c.log)."""
    own, n = shared_bytes(D, tiles, cluster), blocks_per_sm(D, tiles)
    if n * (own + 1024) > SMEM_PER_SM:  # the merge rows of a cluster build may take past it: as it is
        return own
    least = SMEM_PER_SM // (n + 1) - 1024 + 1  # n + 1 blocks of this much do not fit
    return max(own, -(-least // 128) * 128)


def plan_splits(B: int, Hk: int, Sk: int, D: int, tiles, sms: int, most: int = MAX_SPLITS) -> int:
    """Key splits per (batch entry, K/V head) for given tiles: as many as fill every SM's block
    slots without starting a second, partial wave (the slots over the work tiles, rounded down),
    at most `most`, each warp keeping MIN_CHUNKS_PER_WARP chunks."""
    chunk, _, warps = tiles
    slots = sms * blocks_per_sm(D, tiles)
    enough = max(1, -(-Sk // chunk) // (warps * MIN_CHUNKS_PER_WARP))
    return max(1, min(most, enough, slots // max(1, B * Hk)))


def plan_launch(B: int, Hk: int, Sk: int, D: int, sms: int, cluster_merge: bool = True) -> tuple[tuple, int]:
    """(tiles, splits) of a call: the rule the probe's grid of tiles and splits chose at H32/8
    Sq1 D128 (experiments/fp8_decode_registers/README.md, "The small caches"; D64 follows it
    unmeasured). Splits merge in a cluster (cluster_merge) up to CLUSTER_MAX, which beat more
    splits merged by the last block at every B 1 row.
      - A few work tiles (B·H_kv ≤ SMs/4, B 1): each split down to at least a chunk a warp, the
        SMs over the tiles at most; 8 warps a block where each keeps 2 chunks, else 4.
      - Many short ones (B·H_kv ≥ 2 SMs, at most SMALL_MAX_CHUNKS: B 64 Sk ≤ 4k at D 128, Sk ≤ 1k
        at D 64): MANY_SHORT_TILES, several blocks an SM, so one's start and end overlap the others' copies.
      - Otherwise TILES, split by plan_splits."""
    most = CLUSTER_MAX if cluster_merge else MAX_SPLITS
    work, chunk = B * Hk, TILES[D][0]
    chunks = -(-Sk // chunk)
    if 4 * work <= sms:
        small = SMALL_TILES[D]
        n = max(1, min(most, sms // work, chunks // small[2]))
        return (TILES[D] if -(-chunks // n) >= 2 * TILES[D][2] else small), n
    tiles = MANY_SHORT_TILES[D] if work >= 2 * sms and chunks <= SMALL_MAX_CHUNKS[D] else TILES[D]
    return tiles, plan_splits(B, Hk, Sk, D, tiles, sms, most)


def evict_first(B: int, Hk: int, Sk: int, D: int, l2_bytes: int) -> bool:
    """Whether a call's copies carry the evict_first hint: its cache at most EVICT_FIRST_L2S L2s."""
    return 2 * B * Hk * Sk * D <= EVICT_FIRST_L2S * l2_bytes


@lru_cache(maxsize=None)
def _l2_bytes(device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size


def query_rows_build(G: int, Sq: int) -> int:
    """QROWS of the build a call runs: 8 where its G·Sq rows fit half the m16 tile, else 16."""
    return 8 if G * Sq <= 8 else 16


# F16_PRODUCTS for bf16 Q (stages/stage7_decode.cu): the products in fp16, Q scaled into fp16 by a
# power of two per row, K and V widened by the hardware's cvt (one instruction per two values, where
# bf16's bit placement takes three). The fp16 build's products are fp16 anyway.
F16_PRODUCTS = True


@lru_cache(maxsize=None)
def _kernel(dtype, D: int, tiles, qrows: int, f16_products: bool, cluster: bool = False, switches=()):
    """The build; `switches`: ((name, 0 or 1), ...) of the .cu's other compile-time ideas, for measuring."""
    chunk, stages, warps = tiles
    return nvrtc.stage_kernels(SOURCE, ("decode_e4m3",), dtype, D, max_dynamic_smem=launch_smem(D, tiles, cluster),
                               defines=(("CHUNK", chunk), ("STAGES", stages), ("WARPS", warps), ("QROWS", qrows),
                                        ("MIN_BLOCKS", blocks_per_sm(D, tiles)),
                                        ("F16_PRODUCTS", int(f16_products)), ("CLUSTER_MERGE", int(cluster)),
                                        ("CLUSTER_MAX", CLUSTER_MAX),
                                        *switches))["decode_e4m3"]


# the .cu's ideas a call may set (probe); PACKED_ROWS only off: the launcher turns it on where the
# cache's rows lie D bytes apart; EVICT_FIRST: evict_first() unless given
SWITCHES = ("IDLE_ACCUMULATORS", "WHOLE_CHUNK_COPIES", "SPLIT_S_CHAIN", "PACKED_ROWS", "HOISTED_ADDRESSES",
            "EVICT_FIRST", "PREFETCH_256")


class _Plan:
    __slots__ = ("kernel", "config", "splits", "tail", "out_shape", "trivial", "parts", "n_parts")


_plans: dict = {}


def _plan(q, k, v, k_descale, v_descale, seqlens_k, causal, scale, splits, tiles, f16_products,
          cluster_merge=None, switches=()) -> _Plan:
    """Everything a call's launch needs that its tensors' shapes, strides and types decide; the
    checks run here, once per such key (attention caches the plan: a decoding step's host time)."""
    scale = check_kv_fp8(q, k, v, k_descale, v_descale, causal=causal, scale=scale, info=s6.INFO)
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    if (H // Hk) * Sq > ROWS:
        raise NotImplementedError(f"stages.stage7_decode holds {ROWS} query rows per K/V head (group "
                                  f"{H // Hk} x Sq {Sq} = {(H // Hk) * Sq}): use stages.stage6.attention")
    if cluster_merge not in (None, True, False):
        raise ValueError(f"cluster_merge must be True, False or None (CLUSTER_MERGE), got {cluster_merge!r}")
    cluster_ok = CLUSTER_MERGE if cluster_merge is None else cluster_merge
    if tiles is not None:
        tiles = tuple(tiles)
        if tiles not in TILE_CHOICES:
            raise ValueError(f"tiles must be one of {TILE_CHOICES}, got {tiles}")
        if shared_bytes(D, tiles) > SMEM_MAX:
            raise ValueError(f"tiles {tiles} need {shared_bytes(D, tiles):,} bytes of shared memory at D{D}, "
                             f"more than a block's {SMEM_MAX:,}")
    mode = causal_mode(causal, Sq, Sk, s6.INFO)
    if Sq == 1 and mode == 2:
        mode = NO_MASK  # one query is the last position: it sees every key
    if seqlens_k is not None:
        check_seqlens_k(seqlens_k, q)
    if tiles is None and splits is None:
        tiles, n = plan_launch(B, Hk, Sk, D, s6._sm_count(q.device), cluster_ok)
    else:
        tiles = TILES[D] if tiles is None else tiles
        n = (plan_splits(B, Hk, Sk, D, tiles, s6._sm_count(q.device), CLUSTER_MAX if cluster_ok else MAX_SPLITS)
             if splits is None else int(splits))
    if not 1 <= n <= MAX_SPLITS:
        raise ValueError(f"splits must be 1 … {MAX_SPLITS}, got {splits}")
    plan = _Plan()
    plan.out_shape, plan.splits, plan.parts = (B, H, Sq, D), n, {}
    plan.trivial = "empty" if B * H * Sq == 0 else "zeros" if Sk == 0 else None
    if plan.trivial:
        return plan
    if f16_products not in (None, True, False):
        raise ValueError(f"f16_products must be True, False or None (F16_PRODUCTS), got {f16_products!r}")
    for name, on in switches:
        if name not in SWITCHES or on not in (0, 1) or (name == "PACKED_ROWS" and on):
            raise ValueError(f"switches are (name, 0 or 1) with name in {SWITCHES} (PACKED_ROWS: 0 only), "
                             f"got {(name, on)!r}")
    packed = k.stride(2) == D and v.stride(2) == D and ("PACKED_ROWS", 0) not in switches
    switches = (*(sw for sw in switches if sw[0] != "PACKED_ROWS"), ("PACKED_ROWS", int(packed)))
    if not any(name == "EVICT_FIRST" for name, _ in switches):
        switches += (("EVICT_FIRST", int(evict_first(B, Hk, Sk, D, _l2_bytes(q.device)))),)
    cluster = 1 < n <= CLUSTER_MAX and cluster_ok
    plan.kernel = _kernel(q.dtype, D, tiles, query_rows_build(H // Hk, Sq),
                          F16_PRODUCTS if f16_products is None else f16_products, cluster, tuple(switches))
    blocks = B * Hk * n
    nvrtc.check_grid_x("stage 7 (decode)", blocks)
    plan.config = nvrtc.launch_config((blocks, 1, 1), (32 * tiles[2], 1, 1), launch_smem(D, tiles, cluster),
                                      cluster=n if cluster else 1)
    plan.n_parts = B * Hk * n if n > 1 and not cluster else 0
    plan.tail = (*(np.int64(st) for t in (q, k, v) for st in t.stride()[:3]),
                 np.int32(H), np.int32(Hk), np.int32(Sq), np.int32(Sk), np.int32(n), np.int32(mode),
                 np.float32(scale * math.log2(math.e)))
    return plan


def _partials(plan: _Plan, device) -> tuple[int, int, int]:
    """Split-KV's partial rows (fp32), their log2-sum-exps and a counter per (batch entry, K/V
    head), made once per plan and stream, as stage 6 keeps its own (stages/stage6.py, _partials):
    calls on one stream run in order and may share them; the counters are zero between launches
    (the last block resets its own)."""
    stream = torch.cuda.current_stream(device).cuda_stream
    parts = plan.parts.get(stream)
    if parts is None:
        D = plan.out_shape[3]
        parts = plan.parts[stream] = (torch.empty(plan.n_parts * ROWS * D, dtype=torch.float32, device=device),
                                      torch.empty(plan.n_parts * ROWS, dtype=torch.float32, device=device),
                                      torch.zeros(plan.n_parts // plan.splits, dtype=torch.int32, device=device))
    return parts[0].data_ptr(), parts[1].data_ptr(), parts[2].data_ptr()


def attention(q, k, v, *, k_descale, v_descale, seqlens_k=None, causal=False, scale=None,
              splits: int | None = None, tiles=None, f16_products: bool | None = None,
              cluster_merge: bool | None = None, switches=()):
    """softmax(q·Kᵀ·scale)·V over an e4m3 cache (the module's docstring has the contract).
    `tiles` ((chunk, stages, warps)) and `splits` (None: plan_launch; tiles given: plan_splits),
    `f16_products` (bf16 Q: the products in fp16; None: F16_PRODUCTS), `cluster_merge` (None:
    CLUSTER_MERGE) and `switches` (((name, 0 or 1), ...) of SWITCHES; the .cu's defaults
    otherwise) are for measuring. The checks run once per shapes, strides, dtypes and options (a cached plan);
    every call checks that its tensors' data start 16 bytes aligned. One launch: with split-KV
    each (batch entry, K/V head)'s splits are merged by its cluster, or by its last block."""
    key = (*((t.shape, t.stride(), t.dtype, t.device, t.requires_grad) if isinstance(t, torch.Tensor) else (type(t),)
             for t in (q, k, v, k_descale, v_descale, seqlens_k)),
           causal if isinstance(causal, (bool, str)) else id(causal), scale, splits,
           None if tiles is None else tuple(tiles), f16_products, cluster_merge, tuple(switches))
    plan = _plans.get(key)
    if plan is None:
        plan = _plan(q, k, v, k_descale, v_descale, seqlens_k, causal, scale, splits, tiles, f16_products,
                     cluster_merge, tuple(switches))
        if len(_plans) > 1024:
            _plans.clear()
        _plans[key] = plan
    if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16:
        raise ValueError("q, k and v must start 16-byte aligned (the kernel's vector copies)")
    out = torch.empty(plan.out_shape, dtype=q.dtype, device=q.device)
    if plan.trivial:
        return out if plan.trivial == "empty" else out.zero_()
    parts = _partials(plan, q.device) if plan.n_parts else (0, 0, 0)
    nvrtc.launch_prepared(plan.kernel, plan.config,
                          (q.data_ptr(), k.data_ptr(), v.data_ptr(), k_descale.data_ptr(), v_descale.data_ptr(),
                           0 if seqlens_k is None else seqlens_k.data_ptr(), out.data_ptr(), *parts, *plan.tail))
    return out
