"""Stage 6's paged KV cache (issue 50): K and V in fixed-size pages found through a per-entry table,
as vLLM's and FlashAttention's `page_table` (block table). The kernel's build is PAGE_SIZE
(stages/stage6.cu: load_tile, tile_pages); this file holds the launcher's rules for it: what a call
must bring (check_paged), which tiles it runs (paged_tiles), the tensor maps' views (cache_view), an
optional host check of the table's values (check_page_ids), and a Python model of the producer's
addressing (tile_sources) that the CPU tests check against a gather of the cache.

    out = stages.stage6.attention(q, k_cache, v_cache, seqlens_k=lens, page_table=pt, causal=...)

q [B, H, Sq, D] as usual; k_cache, v_cache [num_pages, page_size, H_kv, D] (vLLM's and FlashAttention's
layout: a page's rows are consecutive keys, every head's); page_table int32 [B, max_pages], entry b's
key j being row j % page_size of page page_table[b, j // page_size]; seqlens_k int32 [B], entry b's
key count (required: a table says nothing about where an entry's keys end). The keys' capacity,
max_pages·page_size, plays Sk's part (causal alignment, split planning), as in FlashAttention-3.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lib import inputs
from lib.inputs import DTYPE_NAMES, check_layout

PAGE_SIZES = (16, 32, 64, 128, 256)  # powers of two: a key tile of 64 or 128 is whole pages, or a page whole tiles


@dataclass(frozen=True)
class Paged:
    """A validated paged call: the caches as the kernel's maps see them ([num_pages, H_kv,
    page_size, D] views, no copy), the page size, the table's row length and the keys' capacity."""

    k: torch.Tensor
    v: torch.Tensor
    page_size: int
    max_pages: int
    num_pages: int

    @property
    def capacity(self) -> int:  # Sk of the call: every key a table row can address
        return self.page_size * self.max_pages


def cache_view(cache: torch.Tensor) -> torch.Tensor:
    """[num_pages, page_size, H_kv, D] → [num_pages, H_kv, page_size, D], the [B, H, S, D] order
    lib.tma.tensor_map describes (innermost first D, page row, head, page): a page is the map's
    batch coordinate, a row within it the sequence coordinate."""
    return cache.permute(0, 2, 1, 3)


IDS_AHEAD = 4  # PAGE_IDS_AHEAD where ids_ahead's rule turns it on: key tiles of ids in shared memory
IDS_AHEAD_BELOW = 64  # ... for pages smaller than this (16 and 32 keys: 2-8 ids a key tile)


def ids_ahead(page_size: int, warp_specialized: bool, choice: int | None = None) -> int:
    """PAGE_IDS_AHEAD (stages/stage6.cu: fetch_page_ids), the rule: pages below IDS_AHEAD_BELOW keys
    with a producer warpgroup copy their ids IDS_AHEAD key tiles ahead into shared memory (cp.async),
    the others keep the register read-ahead one tile ahead (0, no define: the build before it).
    choice: None (the rule), 0 (off) or 1-8 (tiles ahead) — on needs a page table and a producer.
    Why: at 16-key pages the one-tile register read-ahead stalls the producer on its id loads
    whenever a table read outlasts its wait for a free buffer. Measured on the H200 at 16-key pages
    (shape_map.py --paged --paged-ideas, results/logs/2026-11-29-ee4594a-h200-branches/
    pagedideas.log): 0.96-1.10x the build without it, same rounds."""
    if choice is None:
        return IDS_AHEAD if page_size and page_size < IDS_AHEAD_BELOW and warp_specialized else 0
    if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice <= 8:
        raise ValueError(f"page_ids_ahead is None (the rule), 0 (off) or 1-8 key tiles; got {choice!r}")
    if choice and not (page_size and warp_specialized):
        raise ValueError("page_ids_ahead: the ids in shared memory are a paged build's producer's (a page "
                         "table and a schedule with a producer warpgroup)")
    return choice


SPLITS_TWICE_ROWS = 32          # doubles_splits: packed rows per work tile (G·Sq) at most,
SPLITS_TWICE_SPLIT_KEYS = 1024  # ... or more rows where each doubled split keeps at least these keys
SPLITS_TWICE_KEYS = 4096        # ... and the call's keys at least


def doubles_splits(page_size: int, pack: bool, work: int, splits: int, sms: int, Sk: int, rows: int) -> bool:
    """Whether a paged decoding call runs twice the splits plan_splits chose, the rule: pages below
    IDS_AHEAD_BELOW keys, packed work tiles whose blocks fill no more than one per SM, at least
    SPLITS_TWICE_KEYS keys, and at most SPLITS_TWICE_ROWS rows a work tile — or more rows where each
    of the doubled splits still walks SPLITS_TWICE_SPLIT_KEYS of the Sk keys (a split's merge costs
    in proportion to its rows, so it must have keys enough to pay for it). A 16-key page costs the producer 16
    copies and their ids a key tile where a contiguous cache costs 4, so a block spends longer
    per tile between a buffer's release and its refill; with one block per SM that latency is
    the rate (B8 decoding at 2 splits: 128 blocks). Twice the blocks keep two in flight per SM.
    Measured on the H200 at 16-key pages, D128 H32/8 bf16 (shape_map.py --paged --paged-ideas,
    the rule's build, ids ahead, at twice the splits against the chosen count): better at every
    row the rule takes, worse where it does not — B64 (512 blocks), Sk 1024 at B8, and B1 Sq16
    (64 packed rows, 16 splits of 512 keys: 0.90x contiguous doubled, 0.98x not); chosen from
    that one run, which the paged entry's re-record at 02e7c1d checked (every row at or above 0.95x
    but B8 Sq16 Sk4096, 64 packed rows in 2 splits of 2048 keys: 0.949x, where twice the splits had
    run 0.965x against the rule's 0.943x in the first run). The rows-or-keys condition takes that
    row and leaves B1 Sq16 alone: re-recorded at 8ab35c5, that row ran 0.993x and every row of the
    entry 0.954x or more (results/logs/2026-11-29-8ab35c5-h200/pagedbench.log)."""
    if not (0 < page_size < IDS_AHEAD_BELOW and pack and work * splits <= sms and Sk >= SPLITS_TWICE_KEYS):
        return False
    return rows <= SPLITS_TWICE_ROWS or Sk // (2 * splits) >= SPLITS_TWICE_SPLIT_KEYS


def paged_tiles(tiles):
    """The tiles of a paged call, the rule: a key tile must be whole pages or a page whole key
    tiles (the kernel copies a tile page by page, or a slice of one page), and the page sizes
    are powers of two, so 64- and 128-key tiles run as chosen and D128's 176-key tiles run 128
    keys, three stages (the choice variant_tiles makes for the same reason of its own; within the
    noise of the 176-key tiles at full attention on the H100, faster causal). D64's blocks of three
    consumers take two: their producer has 32 registers (128·32 + 384·160 = 64K), and the page ids
    spilled 8-44 bytes there (16-key pages; every page size with the work queue), as heavy variants'
    registers do (variant_tiles)."""
    bn, stages, consumers = tiles
    if consumers == 3:
        return (bn, stages, 2)
    return (128, 3, consumers) if bn == 176 else tuple(tiles)


def check_paged(q, k_cache, v_cache, page_table, seqlens_k, *, causal, scale, info) -> tuple[Paged, float]:
    """Everything about a paged call that the host can check without reading the GPU's memory,
    and the scale to use; TypeError / ValueError naming the argument, NotImplementedError for
    what stage 6 does not take. The table's values and seqlens_k's are the device's (see
    stages.stage6.attention's docstring). q, the machine, the scale and `causal` go through
    lib.inputs.validate, against a one-key stand-in of the caches' dtype and heads."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("page_table", page_table)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if seqlens_k is None:
        raise ValueError("page_table needs seqlens_k (int32 [B]): each entry's key count, which the "
                         "table alone does not say")
    inputs.check_machine(info, q)  # first, as lib.inputs.validate does
    if q.dim() != 4:
        raise ValueError(f"q must have rank 4, [batch, heads, seq_len, head_dim]; got shape {list(q.shape)}")
    inputs.refuse_grad(info, q, k_cache, v_cache)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4, [num_pages, page_size, heads_kv, head_dim] with "
                             f"page_table; got shape {list(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise ValueError(f"k_cache and v_cache must have one shape, [num_pages, page_size, heads_kv, "
                         f"head_dim]; got {list(k_cache.shape)} and {list(v_cache.shape)}")
    B, H, Sq, D = q.shape
    num_pages, page_size, Hk, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"head dims differ: q {list(q.shape)}, k_cache {list(k_cache.shape)}")
    if Hk == 0 or H % Hk:
        raise ValueError(f"q's heads ({H}) must be a multiple of the caches' ({Hk}, k_cache's dim 2)")
    if page_size not in PAGE_SIZES:
        raise NotImplementedError(f"stage 6 takes pages of {', '.join(map(str, PAGE_SIZES))} keys "
                                  f"(k_cache's dim 1); got {page_size}")
    if not (page_table.dtype == torch.int32 and page_table.dim() == 2 and page_table.shape[0] == B
            and page_table.device == q.device):
        raise ValueError(f"page_table must be an int32 [B, max_pages] tensor with B = {B} on {q.device}; got "
                         f"{DTYPE_NAMES.get(page_table.dtype, page_table.dtype)} {list(page_table.shape)} "
                         f"on {page_table.device}")
    if not page_table.is_contiguous():
        raise ValueError(f"page_table must be contiguous (rows of max_pages ids); its strides are "
                         f"{tuple(page_table.stride())}: call .contiguous() first")
    max_pages = page_table.shape[1]
    if page_size * max_pages >= 2**31:
        raise NotImplementedError(f"stage 6 addresses fewer than 2^31 keys per entry; page_table's "
                                  f"{max_pages} pages of {page_size} make {page_size * max_pages}")
    if num_pages >= 2**31:
        raise NotImplementedError(f"stage 6 addresses fewer than 2^31 pages; k_cache has {num_pages}")
    stand_in = torch.empty((B, Hk, 1, D), dtype=q.dtype, device=q.device)
    scale = inputs.validate(q, stand_in, stand_in, causal=causal, scale=scale, info=info)
    k4, v4 = cache_view(k_cache), cache_view(v_cache)
    for name, t in (("k_cache", k4), ("v_cache", v4)):
        check_layout(name, t, info)  # unit-stride head dim, 16-byte pointer and strides
    return Paged(k4, v4, int(page_size), int(max_pages), int(num_pages)), scale


def check_page_ids(page_table, seqlens_k, num_pages: int, page_size: int) -> None:
    """The host check of the values (attention's check_pages=True; one copy to the host, which
    waits for the GPU, and is not allowed while a CUDA graph is captured): every used entry of
    every row (pages 0 … ceil(seqlens_k[b] / page_size) − 1) in [0, num_pages), and seqlens_k[b]
    within 0 … max_pages·page_size. ValueError naming the first bad one."""
    table, lens = page_table.cpu(), seqlens_k.cpu()
    max_pages = table.shape[1]
    for b in range(table.shape[0]):
        n = int(lens[b])
        if not 0 <= n <= max_pages * page_size:
            raise ValueError(f"seqlens_k[{b}] = {n} is outside 0 … {max_pages * page_size} "
                             f"(page_table's {max_pages} pages of {page_size} keys)")
        used = table[b, :-(-n // page_size)]
        bad = ((used < 0) | (used >= num_pages)).nonzero()
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"page_table[{b}, {i}] = {int(used[i])} is not a page of the cache "
                             f"(0 … {num_pages - 1}); entry {b} uses pages 0 … {len(used) - 1}")


def tile_sources(table_row, len_k: int, key_tile: int, block_n: int, page_size: int):
    """The producer's addressing in Python (stages/stage6.cu: tile_pages, then load_tile's copies):
    for each of a key tile's block_n ring rows, (page id, row within the page), the page id −1
    for rows the copy engine zero-fills (a page wholly past the entry's len_k used keys); and the
    table indices read. `table_row`: one entry's ids (any sequence of ints)."""
    max_pages = len(table_row)
    box = min(page_size, block_n)
    key0 = key_tile * block_n
    first, last = key0 // page_size, (len_k - 1) // page_size  # C's division: len_k > 0 here
    row0 = key0 % page_size if page_size > block_n else 0
    rows, read = [], []
    for i in range(block_n // box):
        idx = min(first + i, max_pages - 1)
        read.append(idx)
        pid = int(table_row[idx]) if first + i <= last else -1
        rows += [(pid, row0 + r) for r in range(box)]
    return rows, read
