"""Stage 6's paged KV cache (issue 50, stages/stage6_paged.py and PAGE_SIZE in stages/stage6.cu): on the
CPU, the arguments' checks, the launcher's choices, a Python model of the producer's page addressing
against a gather of the cache, the paged builds' compiles (no spills, no serialized wgmma) and the
default builds' SASS unchanged; on an H100/H200, outputs against the reference of the gathered cache."""
import functools
import random
import re
import subprocess
from pathlib import Path

import pytest
import torch

import stages.stage6 as s6
import stages.stage6_paged as sp
from conftest import assert_sass_as_source, captured, compile_cases, cpu_only, stub_stage6_launcher
from lib import nvrtc
from lib.inputs import make_qkv, paged_cache, poisoned_outputs
from lib.sass import inspect_cubin
from lib.simulator import HAS_GPU

on_hopper = pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability() != (9, 0),
                               reason="stage 6 needs an sm_90 GPU (H100/H200)")
SERIALIZING = re.compile(r"C75(08|10|11|12|15)|wgmma.*serializ", re.I)  # tests/test_stage6.py's
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# helpers: a paged cache made from a contiguous one, and back

def gather(cache, table_row, n):
    """Entry's first n keys from a paged cache, as [H_kv, n, D]: row j of page table_row[j // page_size]."""
    ps = cache.shape[1]
    j = torch.arange(n)
    pages = table_row.cpu().long()[j // ps]
    return cache[pages.to(cache.device), (j % ps).to(cache.device)].transpose(0, 1)


def test_paged_cache_helper_gathers_back():
    """The GPU tests' cache (paged_cache) holds each entry's keys where its table says, shared
    first page included."""
    k, v = torch.randn(3, 2, 100, 8), torch.randn(3, 2, 100, 8)
    lens = [100, 37, 0]
    for ps in (16, 32, 64):
        kc, vc, table = paged_cache(k, v, lens, ps, generator=random.Random(ps))
        assert table.dtype == torch.int32 and table.shape == (3, -(-100 // ps))
        if ps <= 37:
            assert table[1, 0] == table[0, 0]
        for b, n in enumerate(lens):
            assert torch.equal(gather(kc, table[b], n), k[b, :, :n]) and torch.equal(gather(vc, table[b], n), v[b, :, :n])


# --------------------------------------------------------------------------------------------
# CPU: arguments

@pytest.fixture
def on_cpu(monkeypatch):
    """stage 6's launcher with the GPU parts stubbed: launches recorded, not run."""
    return stub_stage6_launcher(monkeypatch, lambda t, rows: (tuple(t.shape), tuple(t.stride()), rows))


def _call(B=2, H=8, Hk=2, Sq=1, D=128, page_size=16, num_pages=40, max_pages=12, dtype=torch.bfloat16):
    q = torch.randn(B, H, Sq, D, dtype=dtype)
    kc = torch.randn(num_pages, page_size, Hk, D, dtype=dtype)
    vc = torch.randn_like(kc)
    table = torch.randint(0, num_pages, (B, max_pages), dtype=torch.int32)
    lens = torch.full((B,), max_pages * page_size - 3, dtype=torch.int32)
    return q, kc, vc, table, lens


def test_bad_arguments_get_clear_errors(on_cpu):
    q, kc, vc, table, lens = _call()
    ok = dict(seqlens_k=lens, page_table=table)
    s6.attention(q, kc, vc, **ok)  # the valid call goes through
    cases = [
        (ValueError, "needs seqlens_k", dict(page_table=table)),
        (ValueError, "page_table must be an int32", dict(seqlens_k=lens, page_table=table.long())),
        (ValueError, r"page_table must be an int32 \[B, max_pages\] tensor with B = 2", dict(seqlens_k=lens, page_table=table[:1])),
        (ValueError, "page_table must be an int32", dict(seqlens_k=lens, page_table=table[0])),
        (ValueError, "page_table must be contiguous", dict(seqlens_k=lens, page_table=torch.zeros(12, 2, dtype=torch.int32).t())),
        (TypeError, "page_table must be a torch.Tensor", dict(seqlens_k=lens, page_table=[[0]])),
        (ValueError, "seqlens_k must be a contiguous int32", dict(seqlens_k=lens.long(), page_table=table)),
        (ValueError, "seqlens_k must be a contiguous int32.* strided",  # a column of a [B, 2] tensor
         dict(seqlens_k=torch.stack([lens, lens], 1)[:, 0], page_table=table)),
        (NotImplementedError, "attn_mask", dict(ok, attn_mask=torch.zeros(1, 1))),
        (ValueError, "lse is not written with page_table", dict(ok, lse=torch.zeros(2, 8, 1))),
        (ValueError, "whole pages", dict(ok, tiles=(176, 2, 2))),
    ]
    for exc, msg, kw in cases:
        with pytest.raises(exc, match=msg):
            s6.attention(q, kc, vc, **kw)
    bad_caches = [
        (ValueError, "one shape", kc, vc[:-1]),
        (ValueError, "rank 4, \\[num_pages, page_size", kc[0], vc[0]),
        (TypeError, "k_cache must have q's dtype", kc.half(), vc),
        (ValueError, "head dims differ", kc[..., :64], vc[..., :64]),
        (ValueError, "multiple of the caches'", kc[:, :, :1].expand(-1, -1, 3, -1), vc[:, :, :1].expand(-1, -1, 3, -1)),
        (NotImplementedError, "pages of 16, 32, 64, 128, 256 keys", kc[:, :8], vc[:, :8]),
        (NotImplementedError, "pages of 16, 32, 64, 128, 256 keys", torch.cat([kc, kc[:, :8]], 1), torch.cat([vc, vc[:, :8]], 1)),
        (ValueError, "unit-stride last dimension", kc.transpose(2, 3).contiguous().transpose(2, 3), vc),
    ]
    for exc, msg, k_, v_ in bad_caches:
        with pytest.raises(exc, match=msg):
            s6.attention(q, k_, v_, **ok)
    with pytest.raises(ValueError, match="scale must be finite"):
        s6.attention(q, kc, vc, scale=float("nan"), **ok)
    with pytest.raises(NotImplementedError, match="head dims"):
        s6.attention(*_call(D=80)[:3], **ok)


def test_page_ids_checked_on_request(on_cpu):
    """check_pages=True reads the table back: an id out of [0, num_pages) among an entry's used
    pages, or a length past the table, is refused; ids past the used pages are never looked at."""
    q, kc, vc, table, lens = _call(num_pages=40, max_pages=12)
    lens = torch.tensor([33, 0], dtype=torch.int32)  # entry 0: pages 0-2; entry 1: none
    table[0, :3] = torch.tensor([39, 0, 7])
    table[0, 3:] = -1
    table[1] = 1000  # unused: fine
    s6.attention(q, kc, vc, seqlens_k=lens, page_table=table, check_pages=True)
    for bad, msg in ((40, r"page_table\[0, 2\] = 40 is not a page"), (-1, r"page_table\[0, 2\] = -1")):
        t = table.clone()
        t[0, 2] = bad
        with pytest.raises(ValueError, match=msg):
            s6.attention(q, kc, vc, seqlens_k=lens, page_table=t, check_pages=True)
        s6.attention(q, kc, vc, seqlens_k=lens, page_table=t)  # trusted without the check
    with pytest.raises(ValueError, match=r"seqlens_k\[1\] = 193 is outside 0 … 192"):
        s6.attention(q, kc, vc, seqlens_k=torch.tensor([3, 193], dtype=torch.int32), page_table=table, check_pages=True)


def test_trivial_calls(on_cpu):
    launched, _, _ = on_cpu
    q, kc, vc, table, lens = _call()
    out = s6.attention(q, kc[:0], vc[:0], seqlens_k=lens * 0, page_table=table)  # no pages at all
    assert out.shape == q.shape and bool((out == 0).all())
    out = s6.attention(q, kc, vc, seqlens_k=lens, page_table=table[:, :0])  # a table of no pages
    assert bool((out == 0).all()) and not launched


# --------------------------------------------------------------------------------------------
# CPU: what the launcher runs

PARAMS_TAIL = 2  # the PAGE_SIZE build's last kernel parameters: page_table, max_pages


@pytest.mark.parametrize("page_size", sp.PAGE_SIZES)
def test_launcher_choice(on_cpu, page_size):
    """Decoding (packed, split) and prefill (two consumers; D128's 176-key tiles become 128) take the
    PAGE_SIZE build with tiles that divide the page or that the page divides; the K/V maps are
    the caches' [num_pages, H_kv, page_size, D] views with boxes of min(page_size, BLOCK_N) rows;
    Sk is the table's capacity; the table's pointer and row length come last, per call."""
    launched, boxes, cfgs = on_cpu
    for D, Sq, causal, opts in ((128, 1, False, {}), (128, 1, False, {"splits": 5}), (64, 1, False, {}),
                                (128, 4, "bottom_right", {}), (128, 16, "bottom_right", {"pack_gqa": False}),
                                (128, 700, "bottom_right", {}), (64, 900, False, {}), (128, 2100, False, {})):
        launched.clear(), boxes.clear(), cfgs.clear()
        q, kc, vc, table, lens = _call(B=3, H=32, Hk=8, Sq=Sq, D=D, page_size=page_size, num_pages=50,
                                       max_pages=-(-4096 // page_size))
        s6.attention(q, kc, vc, causal=causal, seqlens_k=lens, page_table=table, **opts)
        d = dict(cfgs[-1]["defines"])
        bn = d["BLOCK_N"]
        assert d["PAGE_SIZE"] == page_size and d["SEQS"] == 1, d
        assert bn in (64, 128) and (bn % page_size == 0 or page_size % bn == 0) and d["CONSUMERS"] <= 2, d
        assert boxes[1:] == [((50, 8, page_size, D), tuple(sp.cache_view(kc).stride()), min(page_size, bn))] * 2
        params = launched[0][2]
        assert params[-PARAMS_TAIL] == table.data_ptr() and int(params[-1]) == table.shape[1]
        assert int(params[8]) == table.shape[1] * page_size  # Sk: the capacity
        if opts.get("splits"):
            assert int(params[14]) == 5 and launched[0][1].grid[0] == 8 * 3 * 5  # n_splits; packed work × 5
    # a new table of the same shape: same plan, its pointer passed
    launched.clear(), cfgs.clear()
    q, kc, vc, table, lens = _call(B=3, H=32, Hk=8, Sq=1, D=128, page_size=page_size, num_pages=50,
                                   max_pages=-(-4096 // page_size))
    s6.attention(q, kc, vc, seqlens_k=lens, page_table=table)
    first = len(launched)  # the attention kernel, and the combine kernel where the splits need one
    t2 = table.clone()
    s6.attention(q, kc, vc, seqlens_k=lens, page_table=t2)
    assert launched[first][2][-PARAMS_TAIL] == t2.data_ptr() and not cfgs  # the first loop case's plan, reused


def test_default_builds_take_no_page_define():
    """Without a page table nothing changes: no PAGE_SIZE define (the build, its cache key and its
    SASS are today's), and the tiles rules are untouched."""
    for D in (64, 128):
        assert "PAGE_SIZE" not in dict(s6.config(D)["defines"])
        assert "PAGE_SIZE" not in dict(s6.config(D, seqs=True)["defines"])
        assert dict(s6.config(D, (128, 3, 2), seqs=True, page_size=16)["defines"])["PAGE_SIZE"] == 16
    with pytest.raises(ValueError, match="page_size"):
        s6.config(128, (176, 2, 2), seqs=True, page_size=32)  # 176 = 11 pages of 16, no whole number of 32
    with pytest.raises(ValueError, match="page_size"):
        s6.config(128, (128, 3, 2), seqs=False, page_size=16)
    with pytest.raises(ValueError, match="page_size"):
        s6.config(128, (128, 3, 2), seqs=True, page_size=48)
    assert s6.TILES[128][0] == 176 and sp.paged_tiles(s6.TILES[128]) == (128, 3, 2)
    assert s6.choose(4, 16, 16, 8192, 8192, 128, 0, 132)["tiles"][0] == 176
    assert s6.choose(4, 16, 16, 8192, 8192, 128, 0, 132, paged=64)["tiles"][0] == 128


def test_page_ids_ahead_rule(on_cpu):
    """PAGE_IDS_AHEAD (the producer's page ids in shared memory, stages/stage6_paged.py: ids_ahead):
    defined only where the rule turns it on (pages of 16 and 32 keys, a producer warpgroup) or a
    call asks for it; its shared memory counted; off (0) leaves the build of the page size as it was;
    asked for without a table or a producer, refused."""
    for D in (64, 128):
        for ps in sp.PAGE_SIZES:
            tiles = (128 if D == 128 else 64, 2, 1)
            d = dict(s6.config(D, tiles, s6.DECODE_SCHEDULE, seqs=True, pack_gqa=True, page_size=ps)["defines"])
            want = sp.IDS_AHEAD if ps < sp.IDS_AHEAD_BELOW else None
            assert d.get("PAGE_IDS_AHEAD") == want, (D, ps, d)
            off = s6.config(D, tiles, s6.DECODE_SCHEDULE, seqs=True, pack_gqa=True, page_size=ps, page_ids_ahead=0)
            assert "PAGE_IDS_AHEAD" not in dict(off["defines"])
            on = s6.config(D, tiles, s6.DECODE_SCHEDULE, seqs=True, pack_gqa=True, page_size=ps, page_ids_ahead=2)
            assert dict(on["defines"])["PAGE_IDS_AHEAD"] == 2
            assert on["smem"] - off["smem"] == 4 * 2 * (tiles[0] // min(tiles[0], ps))
        assert "PAGE_IDS_AHEAD" not in dict(s6.config(D, seqs=True)["defines"])  # no pages: nothing
        assert "PAGE_IDS_AHEAD" not in dict(s6.config(D, seqs=True, page_ids_ahead=0)["defines"])
    with pytest.raises(ValueError, match="page_ids_ahead"):
        s6.config(128, seqs=True, page_ids_ahead=4)  # no page table
    with pytest.raises(ValueError, match="page_ids_ahead"):
        s6.config(128, (128, 2, 1), "no warp specialization", seqs=True, page_size=16, page_ids_ahead=4)
    with pytest.raises(ValueError, match="page_ids_ahead"):
        s6.config(128, (128, 2, 1), s6.DECODE_SCHEDULE, seqs=True, page_size=16, page_ids_ahead=9)
    assert "PAGE_IDS_AHEAD" not in dict(s6.config(128, (128, 2, 1), "no warp specialization", seqs=True, page_size=16)["defines"])
    launched, boxes, cfgs = on_cpu
    for ps, ahead, want in ((16, None, sp.IDS_AHEAD), (16, 0, None), (32, 3, 3), (64, None, None), (64, 1, 1)):
        cfgs.clear()
        q, kc, vc, table, lens = _call(B=3, H=32, Hk=8, page_size=ps, num_pages=50, max_pages=-(-4096 // ps))
        s6.attention(q, kc, vc, seqlens_k=lens, page_table=table, page_ids_ahead=ahead)
        assert dict(cfgs[-1]["defines"]).get("PAGE_IDS_AHEAD") == want, (ps, ahead)


def test_doubled_splits_rule():
    """doubles_splits: a paged call of 16- or 32-key pages runs twice plan_splits' count where its
    blocks fill at most one per SM, with at least SPLITS_TWICE_KEYS keys, and either at most
    SPLITS_TWICE_ROWS packed rows or at least SPLITS_TWICE_SPLIT_KEYS keys in each doubled split;
    nowhere else. Checked through choose() at the paged entry's rows (D128 H32/8) against the same
    call without pages."""
    rows = [(B, 1, Sk) for B in (1, 8, 64) for Sk in (1024, 4096, 16384)] + [(1, 4, 8192), (8, 4, 4096),
                                                                               (1, 16, 8192), (8, 16, 4096)]
    doubled = []
    for B, Sq, Sk in rows:
        causal = 2 if Sq > 1 else False
        plain = s6.choose(B, 32, 8, Sq, Sk, 128, causal, 132)
        for ps in sp.PAGE_SIZES:
            paged = s6.choose(B, 32, 8, Sq, Sk, 128, causal, 132, paged=ps)
            twice = paged["splits"] == 2 * plain["splits"]
            want = (ps < sp.IDS_AHEAD_BELOW and plain["work"] * plain["splits"] <= 132 and Sk >= sp.SPLITS_TWICE_KEYS
                    and (4 * Sq <= sp.SPLITS_TWICE_ROWS or Sk // (2 * plain["splits"]) >= sp.SPLITS_TWICE_SPLIT_KEYS))
            assert twice == want, (B, Sq, Sk, ps, plain["splits"], paged["splits"])
            if twice and ps == 16:
                doubled.append((B, Sq, Sk))
    # the rows the rule was chosen at: B1 Sq16 (16 splits of 512 keys) keeps its count, B8 Sq16 doubles
    assert (8, 16, 4096) in doubled and (1, 16, 8192) not in doubled and (1, 4, 8192) in doubled
    assert not any(B == 64 for B, _, _ in doubled) and (8, 1, 1024) not in doubled


# --------------------------------------------------------------------------------------------
# CPU: the producer's addressing, modelled

@pytest.mark.parametrize("page_size", sp.PAGE_SIZES)
@pytest.mark.parametrize("block_n", (64, 128))
def test_page_addressing_model_gathers_the_cache(page_size, block_n):
    """tile_sources (stages/stage6_paged.py), the kernel's tile_pages and load_tile in Python: for
    odd lengths (1, a page and one, a tile and one, not a multiple of either, the whole table) and
    shuffled tables with shared pages and garbage past the used pages, every ring row of every key
    tile a work tile reads holds the gathered cache's key (rows of used keys), or zeros / a used
    page's rows (keys past the end, masked); no table index past the row is read; each copy lands on
    a multiple of 16 rows (the 128-byte swizzle's 8-row period)."""
    g = random.Random(page_size * 1000 + block_n)
    Hk, D = 1, 4
    for max_pages in (1, 3, 17):
        cap = max_pages * page_size
        lens = sorted({1, min(cap, page_size + 1), min(cap, block_n + 1), min(cap, 3 * page_size // 2 + 5), cap,
                       g.randrange(1, cap + 1)})
        num_pages = max_pages * 2 + 1
        cache = torch.randn(num_pages, page_size, Hk, D, dtype=torch.float64)
        for n in lens:
            row = [g.randrange(num_pages) for _ in range(max_pages)]
            row[-(-n // page_size):] = [g.randrange(-3, 3 * num_pages) for _ in range(max_pages - -(-n // page_size))]
            want = gather(cache, torch.tensor(row), n)[0]  # [n, D]
            used = set(row[:-(-n // page_size)])
            for kt in range(-(-n // block_n)):
                rows, read = sp.tile_sources(row, n, kt, block_n, page_size)
                assert len(rows) == block_n and all(0 <= i < max_pages for i in read)
                box = min(page_size, block_n)
                assert box % 16 == 0 and len(read) == block_n // box
                for r, (pid, prow) in enumerate(rows):
                    key = kt * block_n + r
                    if key < n:
                        assert 0 <= pid < num_pages and torch.equal(cache[pid, prow, 0], want[key]), (n, kt, r)
                    else:  # masked: zero-filled (a page wholly past the end) or a used page's row
                        assert pid == -1 or pid in used, (n, kt, r, pid)
                        assert 0 <= prow < page_size


# --------------------------------------------------------------------------------------------
# CPU: the builds

SHAPES = [(1, 32, 8, 1, 4096), (64, 32, 8, 1, 1024), (8, 8, 1, 1, 1024), (1, 8, 1, 1, 32768), (1, 32, 8, 4, 8192),
          (1, 8, 1, 16, 4096), (1, 8, 8, 512, 512), (8, 32, 8, 2048, 2048), (16, 16, 16, 1024, 1024)]


def paged_builds():
    """(D, dtype name, defines) of every PAGE_SIZE build the launcher picks at SHAPES, each causal
    mode, each page size, PAGE_IDS_AHEAD by the rule and off."""
    seen = {}
    for D in (64, 128):
        for B, H, Hk, Sq, Sk in SHAPES:
            for causal in (0, 1, 2):
                mode = causal if Sq > 1 else (0 if causal == 2 else causal)
                for ps in sp.PAGE_SIZES:
                    try:
                        ch = s6.choose(B, H, Hk, Sq, Sk, D, mode, 132, paged=ps)
                    except (ValueError, NotImplementedError):
                        continue
                    for ahead in (None, 0):  # the rule's build, and PAGE_IDS_AHEAD off (--paged-ideas)
                        cfg = s6.config(D, ch["tiles"], ch["schedule"], False, None, None, ch["pack_gqa"], True,
                                        ch["q_stages"], None, None, None, ch["blocks_per_sm"], None, page_size=ps,
                                        page_ids_ahead=ahead)
                        for dt in ("float16", "bfloat16"):
                            seen[(D, dt, cfg["defines"])] = None
    return list(seen)


BUILDS = paged_builds()


def _paged_build(D, dt, defines):
    return nvrtc.compile_stage(s6.SOURCE, arch=s6.ARCH, dtype=getattr(torch, dt), head_dim=D, defines=dict(defines))


@cpu_only  # reads ptxas's log
@compile_cases("D,dt,defines", BUILDS, ids=[f"D{D}-{dt}-{i}" for i, (D, dt, _) in enumerate(BUILDS)],
               switches=lambda c: {("D", c[0]), ("dt", c[1])} | set(c[2]),
               build=lambda D, dt, defines: _paged_build(D, dt, defines))
def test_paged_builds_compile_clean(D, dt, defines):
    """Every PAGE_SIZE build the launcher picks: no spills, no local memory, wgmma not serialized,
    and the K/V copies one bulk tensor copy per page (UTMALDG)."""
    compiled = _paged_build(D, dt, defines)
    ins = inspect_cubin(compiled.cubin, s6.ARCH, compiled.resource_usage())
    usage = compiled.resource_usage()["attention_wgmma"]
    assert usage["spill_stores"] == 0 and usage["spill_loads"] == 0 and usage["stack_bytes"] == 0, (defines, usage)
    assert ins.mix["LDL"] == 0 and ins.mix["STL"] == 0
    assert not SERIALIZING.search(compiled.log), compiled.log
    assert ins.mix["UTMALDG"] > 0
    ahead = dict(defines).get("PAGE_IDS_AHEAD", 0)
    assert (ins.mix["LDGSTS"] > 0) == bool(ahead), (defines, ins.mix["LDGSTS"])  # the ids' cp.async, only with it


PAGED_BASE = "98ede15"  # main before PAGE_IDS_AHEAD: the paged builds it leaves off must not change


@functools.lru_cache(maxsize=None)
def _source_at(commit: str):
    """stages/stage6.cu as it was at `commit`, or None where git or the commit is not here."""
    try:
        return subprocess.run(["git", "show", f"{commit}:stages/stage6.cu"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def _assert_sass_as_at(commit: str, D, dt, defines):
    """The build compiles to the SASS it had at `commit`, byte for byte."""
    assert_sass_as_source(_paged_build(D, dt, defines), _source_at(commit), D, dt, defines, f"commit {commit}")


OFF_BUILDS = [b for b in BUILDS if "PAGE_IDS_AHEAD" not in dict(b[2])]


@cpu_only  # an offline check: 300 compiles the GPU session need not spend its time on
@compile_cases("D,dt,defines", OFF_BUILDS, ids=[f"D{D}-{dt}-{i}" for i, (D, dt, _) in enumerate(OFF_BUILDS)],
               switches=lambda c: {("D", c[0]), ("dt", c[1])} | set(c[2]))
def test_paged_builds_without_ids_ahead_unchanged(D, dt, defines):
    """The paged builds without PAGE_IDS_AHEAD (pages of 64-256 keys, and 16/32 with it off)
    compile to the SASS of the commit before it, byte for byte."""
    _assert_sass_as_at(PAGED_BASE, D, dt, defines)


BASE = "56cb79d"  # the commit this branch (issue 50's paged cache) started from


DEFAULT_BUILDS = [(D, dt, defines) for D in (64, 128) for dt in ("float16", "bfloat16")
                  for defines in sorted({tuple(dict(d).items()) for d in (
                      s6.config(D)["defines"], s6.config(D, seqs=True)["defines"],
                      s6.config(D, s6.DECODE_TILES[D], s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True)["defines"],
                      s6.config(D, s6.DECODE_SHARED_TILES[D], s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True,
                                blocks_per_sm=2)["defines"])}, key=repr)
                  ] + [(64, "bfloat16", s6.config(64, s6.FEW_KEYS_TILES[64], s6.FEW_KEYS_SCHEDULE, pack_gqa=True,
                                                   seqs=True, blocks_per_sm=s6.FEW_KEYS_BLOCKS)["defines"])]


@compile_cases("D,dt,defines", DEFAULT_BUILDS, ids=[f"D{D}-{dt}-{i}" for i, (D, dt, _) in enumerate(DEFAULT_BUILDS)],
               switches=lambda c: {("D", c[0]), ("dt", c[1])} | set(c[2]))
def test_default_builds_sass_unchanged(D, dt, defines):
    """The builds without PAGE_SIZE compile to the SASS of the commit before it, byte for byte
    (prefill, SEQS, decoding packed, two blocks per SM, blocks without a producer). A guard of
    this branch's change: once the default kernel changes on purpose, move BASE to that commit."""
    _assert_sass_as_at(BASE, D, dt, defines)


# --------------------------------------------------------------------------------------------
# GPU: against the reference of the gathered cache

def _check_entries(out, q, k, v, lens, causal, label):
    from lib.reference import check_output
    for b, n in enumerate(lens):
        n = int(n)
        if n == 0:
            assert bool((out[b] == 0).all()), f"{label} entry {b}: no key, zeros"
            continue
        c = check_output(out[b:b + 1], q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=causal)
        assert c.passed, f"{label} entry {b} ({n} keys): {c.summary()}"


GPU_CASES = [(D, ps) for D in (64, 128) for ps in sp.PAGE_SIZES]


@on_hopper
@pytest.mark.parametrize("D,page_size", GPU_CASES, ids=[f"D{D}-p{ps}" for D, ps in GPU_CASES])
def test_paged_matches_gathered_reference(D, page_size, seed):
    """Shuffled pages, a shared page, garbage past the used pages; Sq 1, 4, 16 (bottom-right) and
    a prefill; GQA packed and not; split-KV forced (3-7 splits); lengths 0, 1, not a multiple of
    the page, the whole table; both dtypes: against the float64 reference of the gathered keys."""
    g = random.Random(seed)
    for dtype in s6.INFO.dtypes:
        for B, H, Hk, Sq, Sk in ((5, 32, 8, 1, 3000), (3, 8, 1, 4, 1000), (3, 16, 4, 16, 777), (2, 8, 2, 300, 700)):
            cap = -(-Sk // page_size) * page_size
            lens = [0, 1, cap, page_size + 3, g.randrange(1, cap + 1)][:B]
            q, k, v = make_qkv(B, H, Sq, D, Sk=cap, Hkv=Hk, dtype=dtype, seed=seed)
            kc, vc, table = paged_cache(k, v, lens, page_size, generator=g)
            seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
            for causal in ((False, "bottom_right") if Sq > 1 else (False,)):
                for opts in ({}, {"splits": g.randrange(3, 8)}, {"pack_gqa": False}, {"check_pages": True}):
                    if Sq > 16 and ("splits" in opts or causal):
                        continue
                    with poisoned_outputs():
                        out = s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=table, **opts)
                    _check_entries(out, q, k, v, lens, causal, f"D{D} p{page_size} {dtype} {(B, H, Hk, Sq, Sk)} "
                                   f"{causal} {opts} seed {seed}")


@on_hopper
def test_paged_equals_contiguous_bits():
    """The same cache paged and contiguous (seqlens_k): the same kernel schedule reads the same
    keys in the same order, so the outputs are equal bit for bit where the tiles are (D64; at D128
    the paged build runs 128-key tiles where prefill ran 176)."""
    B, H, Hk, Sq, D, ps = 4, 32, 8, 1, 64, 16
    lens = [5, 4096, 1000, 17]
    q, k, v = make_qkv(B, H, Sq, D, Sk=4096, Hkv=Hk, dtype=torch.bfloat16, seed=1)
    kc, vc, table = paged_cache(k, v, lens, ps, shared=False)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
    for splits in (1, 4):
        a = s6.attention(q, kc, vc, seqlens_k=seqlens, page_table=table, splits=splits)
        b = s6.attention(q, k, v, seqlens_k=seqlens, splits=splits)
        assert torch.equal(a, b), splits


@on_hopper
def test_paged_nan_past_the_used_pages():
    """Pages wholly past an entry's keys are zero-filled by the copy engine (id -1), never read: a
    cache whose unused pages hold NaN, and a table whose unused entries point at them, still gives
    finite, right outputs (the slots of the last used page past the end stay finite)."""
    B, H, Hk, D, ps = 3, 16, 4, 128, 16
    lens = [17, 1, 130]
    q, k, v = make_qkv(B, H, 1, D, Sk=256, Hkv=Hk, dtype=torch.bfloat16, seed=2)
    kc, vc, table = paged_cache(k, v, lens, ps, spare=4, shared=False)
    used = {int(table[b, p]) for b in range(B) for p in range(-(-lens[b] // ps))}
    spare = [p for p in range(kc.shape[0]) if p not in used]
    kc[spare], vc[spare] = float("nan"), float("nan")
    for b in range(B):
        table[b, -(-lens[b] // ps):] = spare[b % len(spare)]
    out = s6.attention(q, kc, vc, seqlens_k=torch.tensor(lens, dtype=torch.int32, device=q.device), page_table=table)
    _check_entries(out, q, k, v, lens, False, "NaN past the used pages")


@on_hopper
def test_paged_graph_replays_new_tables():
    """Captured in a CUDA graph and replayed with new page tables and lengths copied into the same
    tensors: each replay reads the new ones (nothing about them is baked in on the host)."""
    B, H, Hk, D, ps = 4, 32, 8, 128, 64
    q, k, v = make_qkv(B, H, 1, D, Sk=2048, Hkv=Hk, dtype=torch.bfloat16, seed=3)
    lens = [2048, 1, 700, 64]
    kc, vc, table = paged_cache(k, v, lens, ps, spare=20, shared=False)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
    call = lambda: s6.attention(q, kc, vc, seqlens_k=seqlens, page_table=table)  # noqa: E731
    graph, out = captured(call)
    for lens2, perm in (([5, 2048, 1, 1000], True), ([0, 64, 65, 2047], False)):
        g = random.Random(len(lens2))
        kc2, vc2, table2 = paged_cache(k, v, lens2, ps, spare=kc.shape[0] - sum(-(-n // ps) for n in lens2),
                                       shared=False, generator=g)
        kc.copy_(kc2), vc.copy_(vc2), table.copy_(table2), seqlens.copy_(torch.tensor(lens2, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check_entries(out, q, k, v, lens2, False, f"replay {lens2}")


IDS_CASES = [(D, ps) for D in (64, 128) for ps in (16, 32)]


@on_hopper
@pytest.mark.parametrize("D,page_size", IDS_CASES, ids=[f"D{D}-p{ps}" for D, ps in IDS_CASES])
def test_page_ids_ahead_matches_and_equals_off(D, page_size, seed):
    """PAGE_IDS_AHEAD on (1, 2, the rule's 4, 8 tiles ahead) at pages of 16 and 32 keys: lengths
    0, 1, a page and three, fewer tiles than the ids ahead, not a multiple of the page, the whole
    table; Sq 1 (packed GQA, split-KV forced, unpacked) and 4 (bottom-right); against the float64
    reference of the gathered keys, and bit for bit the build with it off (same keys, same order)."""
    g = random.Random(seed + page_size)
    ran, refused = [], []
    for B, H, Hk, Sq, Sk in ((6, 32, 8, 1, 3000), (3, 8, 1, 4, 1000)):
        cap = -(-Sk // page_size) * page_size
        lens = [0, 1, page_size + 3, 3 * 64 + 5, cap, g.randrange(1, cap + 1)][:B]
        q, k, v = make_qkv(B, H, Sq, D, Sk=cap, Hkv=Hk, dtype=torch.bfloat16, seed=seed)
        kc, vc, table = paged_cache(k, v, lens, page_size, generator=g)
        seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
        causal = "bottom_right" if Sq > 1 else False
        for opts in ({}, {"splits": g.randrange(3, 8)}, {"splits": 2}, {"pack_gqa": False}):
            off = s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=table, page_ids_ahead=0, **opts)
            for ahead in (1, 2, None, 8):
                with poisoned_outputs():
                    try:
                        out = s6.attention(q, kc, vc, causal=causal, seqlens_k=seqlens, page_table=table,
                                           page_ids_ahead=ahead, **opts)
                    except ValueError as e:  # the call's schedule has no producer warpgroup: refused, not run
                        assert ahead and "producer warpgroup" in str(e), (ahead, opts, e)
                        refused.append((B, Sq, ahead, str(opts)))
                        continue
                ran.append((B, Sq, ahead, str(opts)))
                label = f"D{D} p{page_size} ahead {ahead} {(B, H, Hk, Sq, Sk)} {opts} seed {seed}"
                _check_entries(out, q, k, v, lens, causal, label)
                assert torch.equal(out, off), label
    # refused only where the chosen schedule has no producer (D64's decoding may run blocks
    # without one); at least one call ran each case with the ids ahead
    assert any(a for _, _, a, _ in ran), (ran, refused)
