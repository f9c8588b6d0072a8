"""stages/stage7_decode: FP8 decoding from an e4m3 cache with register widening (issue 50 item 2).

CPU: a lane-by-lane model of the kernel's fragments (which bytes each thread copies and reads,
the prmt selectors, the m16n8k16 layouts of the PTX ISA) multiplies one chunk and must give
Q·Kᵀ and P·V exactly; the builds compile without spills; bad calls get clear errors. GPU: the
output against the float64 reference of the dequantized cache (stage 6's e4m3 rule, check_fp8).
"""
from __future__ import annotations


import pytest
import torch

import stages.stage7_decode as d7
from lib import nvrtc
from lib.inputs import poisoned_outputs
from lib.simulator import HAS_GPU
from test_stage6_fp8_kv import FP8, check_fp8, check_over_shapes, every_code_first, fp8_inputs

on_hopper = pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability() < (9, 0),
                               reason="needs a Hopper GPU")

# --------------------------------------------------------------------------------------------
# CPU: the fragment model


def key_of(t, n):  # stages/stage7_decode.cu, key_of
    return 16 * (t // 2) + 4 * (n // 2) + 2 * (t % 2) + n % 2


def key_word_col(j, c):  # ... key_word_col
    return (j // 4) * 64 + 16 * c + 4 * (j % 4)


def same_word(b):  # ... SAME_WORD<B>
    return (0x8 | (b + 1)) << 12 | (b + 1) << 8 | (0x8 | b) << 4 | b


def two_words(b):  # ... TWO_WORDS<B>
    return (0x8 | (b + 4)) << 12 | (b + 4) << 8 | (0x8 | b) << 4 | b


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte sel[i] & 7 of (b:a), or that
    byte's sign copied into all 8 bits where sel[i] & 8."""
    src = a.to_bytes(4, "little") + b.to_bytes(4, "little")
    out = bytearray(4)
    for i in range(4):
        n = (sel >> (4 * i)) & 0xF
        x = src[n & 7]
        out[i] = (0xFF if x & 0x80 else 0) if n & 8 else x
    return int.from_bytes(out, "little")


def widen2(lo: int, hi: int, sel: int, bf16: bool) -> tuple[float, float]:
    """The kernel's widen2 (without FOLD): the two values of its 16-bit pair, as floats."""
    if bf16:
        x = (prmt(lo, hi, sel) << 4) & 0x87F087F0
        halves = [(x >> (16 * i)) & 0xFFFF for i in range(2)]
        vals = torch.tensor(halves, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float() * 2.0**120
    else:
        x = prmt(lo, hi, ((sel >> 4) & 0xF0) | (sel & 0xF))
        vals = torch.tensor([x & 0xFF, (x >> 8) & 0xFF], dtype=torch.uint8).view(FP8).float()
    return float(vals[0]), float(vals[1])


def mma(a_regs, b_regs):
    """m16n8k16 from 32 lanes' registers (PTX ISA's layouts): a_regs[lane] = 4 pairs, b_regs[lane]
    = 2 pairs; returns the 16x8 product and, per lane, its accumulators (c0, c1, c2, c3)."""
    A, B = torch.zeros(16, 16, dtype=torch.float64), torch.zeros(16, 8, dtype=torch.float64)
    for lane in range(32):
        g, c = lane // 4, lane % 4
        for reg, (row, col) in enumerate(((g, 2 * c), (g + 8, 2 * c), (g, 2 * c + 8), (g + 8, 2 * c + 8))):
            A[row, col], A[row, col + 1] = a_regs[lane][reg]
        for reg, row in enumerate((2 * c, 2 * c + 8)):
            B[row, g], B[row + 1, g] = b_regs[lane][reg]
    C = A @ B
    acc = [(C[l // 4, 2 * (l % 4)], C[l // 4, 2 * (l % 4) + 1], C[l // 4 + 8, 2 * (l % 4)], C[l // 4 + 8, 2 * (l % 4) + 1])
           for l in range(32)]
    return C, acc


@pytest.mark.parametrize("D,bf16", [(64, True), (128, True), (128, False)])
def test_fragment_model_multiplies_one_chunk_exactly(D, bf16):
    """One 32-key chunk through the kernel's lane-by-lane arithmetic: S = Q·Kᵀ for every key as
    key_of numbers it, and O = P·V with P taken from S's accumulators, each column where the
    output store puts it (n · D/8 + u), against the plain products of the widened values."""
    torch.manual_seed(D)
    CHUNK, KSTEPS, VB = 32, D // 16, D // 8
    codes = torch.randint(0, 256, (CHUNK, D), dtype=torch.uint8)
    codes[codes.view(FP8).float().isnan()] = 0
    vcodes = torch.randint(0, 256, (CHUNK, D), dtype=torch.uint8)
    vcodes[vcodes.view(FP8).float().isnan()] = 0
    K, V = codes.view(FP8).double(), vcodes.view(FP8).double()
    Q = torch.randn(16, D, dtype=torch.float64).to(torch.bfloat16 if bf16 else torch.float16).double()
    word = lambda t, row, col: int.from_bytes(bytes(t[row, col:col + 4].tolist()), "little")  # noqa: E731
    # S, n-tile by n-tile: lane (g, c) holds key key_of(t, g)'s words at key_word_col(j, c)
    S = torch.zeros(16, CHUNK, dtype=torch.float64)
    acc_of = {}
    for t in range(CHUNK // 8):
        total = torch.zeros(16, 8, dtype=torch.float64)
        accs = [[0.0] * 4 for _ in range(32)]
        for j in range(KSTEPS):
            a_regs, b_regs = [], []
            for lane in range(32):
                g, c = lane // 4, lane % 4
                col = key_word_col(j, c)
                a_regs.append([(float(Q[g, col]), float(Q[g, col + 1])), (float(Q[g + 8, col]), float(Q[g + 8, col + 1])),
                               (float(Q[g, col + 2]), float(Q[g, col + 3])), (float(Q[g + 8, col + 2]), float(Q[g + 8, col + 3]))])
                w = word(codes, key_of(t, g), col)
                b_regs.append([widen2(w, w, same_word(0), bf16), widen2(w, w, same_word(2), bf16)])
            C, acc = mma(a_regs, b_regs)
            total += C
            accs = [[x + float(y) for x, y in zip(accs[l], acc[l])] for l in range(32)]
        for n in range(8):
            S[:, key_of(t, n)] = total[:, n]
        acc_of[t] = accs
    assert torch.allclose(S, Q @ K.T, rtol=1e-12, atol=1e-12)
    # O = P·V with P = S (no softmax: the layout is what is checked), PSTEPS k-steps of 16 keys
    pdtype = torch.bfloat16 if bf16 else torch.float16
    P = S.to(pdtype).double()
    O = torch.zeros(16, D, dtype=torch.float64)
    for ks in range(CHUNK // 16):
        a_regs = []
        for lane in range(32):
            rd = lambda t, e: float(torch.tensor(acc_of[t][lane][e], dtype=torch.float64).to(pdtype))  # noqa: E731
            a_regs.append([(rd(2 * ks, 0), rd(2 * ks, 1)), (rd(2 * ks, 2), rd(2 * ks, 3)),
                           (rd(2 * ks + 1, 0), rd(2 * ks + 1, 1)), (rd(2 * ks + 1, 2), rd(2 * ks + 1, 3))])
        for u in range(D // 8):
            b_regs = []
            for lane in range(32):
                g, c = lane // 4, lane % 4
                rows = [16 * ks + 4 * c + r for r in range(4)]
                w = [word(vcodes, r, VB * g + 4 * (u // 4)) for r in rows]
                b_regs.append([widen2(w[0], w[1], two_words(u % 4), bf16), widen2(w[2], w[3], two_words(u % 4), bf16)])
            C, _ = mma(a_regs, b_regs)
            for n in range(8):
                O[:, n * VB + u] += C[:, n]
    assert torch.allclose(O, P @ V, rtol=1e-12, atol=1e-9)


def swizzled(row, col, D):  # stages/stage7_decode.cu, swizzled
    swz = 2 * ((row >> 2) & 3) ^ (4 * (row & 1) if D == 128 else 0)
    unit = ((row % (128 // D)) * D + col) // 16
    return (row // (128 // D)) * 128 + 16 * (unit ^ swz) + col % 16


@pytest.mark.parametrize("D", (64, 128))
def test_ring_layout_is_a_bijection_without_bank_conflicts(D):
    """swizzled() places every 16 bytes of a 32-key chunk once; a copy instruction's 8 lanes per
    line write one whole 128-byte line; the reads of S's K fragments (16 bytes a lane, a quarter
    warp at a time) and of P·V's V fragments (D/8 bytes a lane: quarter warps at D128, half warps
    of 8-byte reads at D64) hit distinct banks."""
    CHUNK = 32
    where = {swizzled(r, col, D) // 16 for r in range(CHUNK) for col in range(0, D, 16)}
    assert where == set(range(CHUNK * D // 16))
    for j in range(CHUNK * D // 512):  # copies: lanes 8q … 8q + 7 → one line
        for q in range(4):
            line = 4 * j + q
            units = {swizzled(line * (128 // D) + (16 * k) // D, (16 * k) % D, D) for k in range(8)}
            assert {u // 128 for u in units} == {line} and len(units) == 8
    for t in range(CHUNK // 8):  # K reads: 16 bytes a lane, quarter warps
        for p in range(D // 64):
            for quarter in range(4):
                lanes = range(8 * quarter, 8 * quarter + 8)
                banks = {(swizzled(key_of(t, l // 4), 64 * p + 16 * (l % 4), D) % 128) // 16 for l in lanes}
                assert len(banks) == 8, (t, p, quarter)
    vb, group = D // 8, (8 if D == 128 else 16)  # V reads: D/8 bytes a lane
    for ks in range(CHUNK // 16):
        for r in range(4):
            for first in range(0, 32, group):
                lanes = range(first, first + group)
                banks = {(swizzled(16 * ks + 4 * (l % 4) + r, vb * (l // 4), D) % 128) // vb for l in lanes}
                assert len(banks) == group, (ks, r, first)


@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("chunk", (16, 32))
def test_hoisted_addresses_are_the_swizzled_ones(D, chunk):
    """HOISTED_ADDRESSES: every address the loop uses, as the lane's part worked out once plus a
    constant, is swizzled()'s — copy j at copy[j % 4] + 2048·(j / 4), K piece p of n-tile t at
    key[p] + (lane 0's offset of t from n-tile 0), value row 16ks + 4c + r at value[r % 2] + (lane
    0's offset of that row from row r % 2) — for every lane."""
    lr, vb, copies = 128 // D, D // 8, chunk * D // 512
    rows = min(copies, 4)
    for lane in range(32):
        g, c = lane // 4, lane % 4
        row0, col = (lane // 8) * lr + (16 * (lane % 8)) // D, (16 * (lane % 8)) % D
        copy = [swizzled(row0 + 4 * lr * j, col, D) for j in range(rows)]
        for j in range(copies):
            assert swizzled(row0 + 4 * lr * j, col, D) == copy[j % rows] + 2048 * (j // rows), (lane, j)
        for t in range(chunk // 8):
            for p in range(D // 64):
                const = swizzled(key_of(t, 0), 64 * p, D) - swizzled(key_of(0, 0), 64 * p, D)
                assert swizzled(key_of(t, g), 64 * p + 16 * c, D) == swizzled(key_of(0, g), 64 * p + 16 * c, D) + const
        for ks in range(chunk // 16):
            for r in range(4):
                const = swizzled(16 * ks + r, 0, D) - swizzled(r % 2, 0, D)
                assert swizzled(16 * ks + 4 * c + r, vb * g, D) == swizzled(4 * c + r % 2, vb * g, D) + const


HINTS = (("EVICT_FIRST", 1), ("PREFETCH_256", 1))  # the copies' L2 hints, both on


@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
def test_builds_compile_without_spills(D, dtype):
    """The head dim's tiles and others, both row builds (bf16: with and without F16_PRODUCTS), the
    cluster merge's builds and those without the .cu's switches, at the launch bounds the launcher
    gives them (blocks_per_sm)."""
    packed = (("PACKED_ROWS", 1),)  # the launcher's build for a contiguous cache
    builds = [(tiles, qrows, f16, 0, packed) for tiles in {d7.TILES[D], d7.SMALL_TILES[D], d7.MANY_SHORT_TILES[D]}
              for qrows in (8, 16) for f16 in ((0, 1) if dtype == torch.bfloat16 else (0,))]
    builds += [(d7.TILES[D], qrows, 1, 1, packed) for qrows in (8, 16)]  # the cluster merge
    builds += [(d7.TILES[D], qrows, 1, 0, tuple((n, 0) for n in d7.SWITCHES)) for qrows in (8, 16)]
    builds += [(tiles, 8, 1, 0, packed + HINTS) for tiles in {d7.TILES[D], d7.SMALL_TILES[D], d7.MANY_SHORT_TILES[D]}]
    for tiles, qrows, f16, cluster, switches in builds:
        c = nvrtc.compile_stage(d7.SOURCE, arch="sm_90", dtype=dtype, head_dim=D,
                                defines={"CHUNK": tiles[0], "STAGES": tiles[1], "WARPS": tiles[2],
                                         "QROWS": qrows, "MIN_BLOCKS": d7.blocks_per_sm(D, tiles),
                                         "F16_PRODUCTS": f16, "CLUSTER_MERGE": cluster, **dict(switches)})
        for name, info in nvrtc.parse_ptxas_log(c.log).items():
            assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (D, dtype, tiles, qrows, f16, cluster,
                                                                           switches, name, info)


def test_evict_first_rule():
    """The copies' evict_first hint up to EVICT_FIRST_L2S L2s of cache and not past: the H200's
    60 MB L2 takes it at B 64 Sk 1k (134 MB of e4m3) and not at B 8 Sk 16k (268 MB)."""
    l2 = 60 << 20
    assert d7.evict_first(64, 8, 1024, 128, l2) and d7.evict_first(1, 8, 32768, 128, l2)
    assert not d7.evict_first(8, 8, 16384, 128, l2) and not d7.evict_first(64, 8, 4096, 128, l2)
    limit = d7.EVICT_FIRST_L2S * l2 // (2 * 8 * 128)  # keys at B 1, H_kv 8, D 128
    assert d7.evict_first(1, 8, limit, 128, l2) and not d7.evict_first(1, 8, limit + 1, 128, l2)


def test_split_rule():
    """Every SM's block slots filled without a partial second wave, within MAX_SPLITS and
    MIN_CHUNKS_PER_WARP; the warps an SM holds within MAX_WARPS_PER_SM."""
    t = d7.TILES[128]
    slots = 132 * d7.blocks_per_sm(128, t)
    assert d7.blocks_per_sm(128, t) * t[2] <= d7.MAX_WARPS_PER_SM[128]
    assert d7.plan_splits(64, 8, 32768, 128, t, 132) == 1  # 512 blocks already
    n = d7.plan_splits(8, 8, 32768, 128, t, 132)
    assert 64 * n <= slots < 64 * (n + 1)
    assert d7.plan_splits(1, 8, 512, 128, t, 132) == 1  # few chunks: a split would leave a warp too few
    assert d7.plan_splits(1, 1, 10**6, 128, t, 132) == min(d7.MAX_SPLITS, slots)


@pytest.mark.parametrize("D", (64, 128))
def test_launch_smem_caps_the_blocks_an_sm_holds(D):
    """launch_smem: blocks_per_sm blocks fit an SM's shared memory and one more does not, whatever
    the registers would allow, for every tile choice whose blocks fit at all."""
    for tiles in d7.TILE_CHOICES:
        if d7.shared_bytes(D, tiles) > d7.SMEM_MAX:
            continue
        n = d7.blocks_per_sm(D, tiles)
        for cluster in (False, True):
            smem = d7.launch_smem(D, tiles, cluster)
            assert smem >= d7.shared_bytes(D, tiles, cluster) and smem <= d7.SMEM_MAX, (tiles, cluster)
            assert (n + 1) * (smem + 1024) > d7.SMEM_PER_SM, (tiles, cluster, n, smem)
            if not cluster:
                assert n * (smem + 1024) <= d7.SMEM_PER_SM, (tiles, n, smem)


@pytest.mark.parametrize("D", (64, 128))
def test_launch_rule(D):
    """plan_launch: a few work tiles split down to a chunk or two a warp, merged in one cluster at
    most; many short tiles in two 4-warp blocks an SM; the rest as plan_splits says, within a
    cluster; never a split without a chunk for each warp, never a grid past one wave."""
    small, big = d7.SMALL_TILES[D], d7.TILES[D]
    assert d7.plan_launch(1, 8, 1024, D, 132) == (small, 8)       # 32 chunks: 4 a split, one a warp
    assert d7.plan_launch(1, 8, 4096, D, 132) == (big, 8)         # 16 a split: two a warp of 8
    assert d7.plan_launch(1, 8, 32, D, 132) == (small, 1)         # one chunk: nothing to split
    assert d7.plan_launch(8, 8, 1024, D, 132) == (big, 1)         # 64 tiles: 4 chunks a warp unsplit
    assert d7.plan_launch(8, 8, 32768, D, 132) == (big, 2)
    many = d7.MANY_SHORT_TILES[D]
    assert d7.plan_launch(64, 8, 1024, D, 132) == (many, 1)       # 512 short tiles: several blocks an SM
    assert d7.plan_launch(64, 8, 4096, D, 132) == ((many, 1) if D == 128 else (big, 1))  # D 64: 128 chunks are long
    assert d7.plan_launch(64, 8, 16384, D, 132) == (big, 1)
    assert d7.plan_launch(1, 1, 10**6, D, 132, cluster_merge=False)[1] == d7.MAX_SPLITS
    for B in (1, 2, 3, 8, 17, 64):
        for Hk in (1, 2, 8):
            for Sk in (1, 31, 100, 1024, 5000, 40000):
                tiles, n = d7.plan_launch(B, Hk, Sk, D, 132)
                assert tiles in d7.TILE_CHOICES and 1 <= n <= d7.CLUSTER_MAX, (B, Hk, Sk)
                assert n == 1 or -(-Sk // tiles[0]) >= n * tiles[2], (B, Hk, Sk, tiles, n)  # a chunk a warp
                assert n == 1 or B * Hk * n <= 132 * d7.blocks_per_sm(D, tiles), (B, Hk, Sk, tiles, n)


# --------------------------------------------------------------------------------------------
# bad input (CPU: refused before any launch)

def _cpu_call(**over):
    B, H, Hk, Sq, Sk, D = 2, 8, 2, 1, 64, 128
    q = torch.zeros(B, H, Sq, D, dtype=torch.bfloat16)
    k8 = torch.zeros(B, Hk, Sk, D, dtype=FP8)
    kw = dict(k_descale=torch.ones(B, Hk), v_descale=torch.ones(B, Hk))
    kw.update(over)
    return q, k8, k8.clone(), kw


def test_refuses_too_many_rows_and_bad_tiles(monkeypatch):
    import stages.stage7_decode as mod
    monkeypatch.setattr(mod, "check_kv_fp8", lambda *a, **k: 0.1)  # the shared checks have their own tests
    q, k8, v8, kw = _cpu_call()
    q17 = torch.zeros(2, 8, 5, 128, dtype=torch.bfloat16)  # group 4 x Sq 5 = 20 rows
    with pytest.raises(NotImplementedError, match="16 query rows"):
        d7.attention(q17, k8, v8, **kw)
    with pytest.raises(ValueError, match="tiles must be one of"):
        d7.attention(q, k8, v8, tiles=(24, 3, 4), **kw)
    with pytest.raises(ValueError, match="seqlens_k must be"):
        d7.attention(q, k8, v8, seqlens_k=torch.ones(2, dtype=torch.int64), **kw)
    with pytest.raises(ValueError, match="seqlens_k must be a contiguous int32.* strided"):
        d7.attention(q, k8, v8, seqlens_k=torch.ones(2, 2, dtype=torch.int32)[:, 0], **kw)


# --------------------------------------------------------------------------------------------
# GPU: against the float64 reference of the dequantized cache

GPU_SHAPES = [(5, 32, 8, 1, 3001), (3, 8, 2, 4, 1000), (4, 8, 8, 1, 777), (3, 32, 8, 4, 2049),
              (2, 8, 2, 1, 130), (2, 16, 1, 1, 5000), (1, 32, 8, 2, 40000)]


@on_hopper
@pytest.mark.parametrize("D", (64, 128))
def test_matches_dequantized_reference(D, seed):
    """GQA groups 1, 4, 8 and 16; Sq 1, 2 and 4 (bottom-right, 16 packed rows at most); odd
    lengths, seqlens_k with zeros and ones; splits as planned, one, and forced, merged in a
    cluster (2-8) and by the last block (2-8 without the cluster, and 9-16); other tiles; both
    dtypes; the .cu's switches off, and its L2 hints on; descales per (entry, K/V head), one negative
    and one zero."""
    check_over_shapes(d7.attention, D, seed, GPU_SHAPES,
                      lambda g: ({}, {"splits": 1}, {"splits": g.randrange(2, 9)},
                                 {"splits": g.randrange(2, 9), "cluster_merge": False},
                                 {"splits": g.randrange(9, 17)}, {"tiles": (16, 4, 4)},
                                 {"tiles": (32, 3, 4), "splits": 3}, {"tiles": d7.MANY_SHORT_TILES[D]},
                                 {"f16_products": False},
                                 {"switches": tuple((name, 0) for name in d7.SWITCHES)},
                                 {"switches": HINTS}), signs=True)


@on_hopper
def test_top_left_causal(seed):
    """causal True / "top_left" (query i sees keys up to i, SDPA's is_causal; the kernel's causal 1)
    at Sq 1, 2 and 4, with seqlens_k shorter and longer than Sq, split and not. (Written after the
    GPU session that made the kernel: first run in the next one.)"""
    for B, H, Hk, Sq, Sk in ((3, 8, 2, 4, 300), (3, 8, 8, 1, 100), (2, 16, 4, 2, 1000)):
        q, k8, v8, kd, vd = fp8_inputs(B, H, Hk, Sq, Sk, 128, torch.bfloat16, seed + Sq)
        lens = [Sk, 3, 1][:B]
        seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
        for causal in (True, "top_left"):
            for opts in ({}, {"splits": 3}, {"splits": 3, "cluster_merge": False}):
                with poisoned_outputs():
                    out = d7.attention(q, k8, v8, causal=causal, seqlens_k=seqlens, k_descale=kd, v_descale=vd, **opts)
                check_fp8(out, q, k8, v8, kd, vd, lens, causal, f"top-left {(B, H, Hk, Sq, Sk)} {causal} {opts} seed {seed}")


@on_hopper
@pytest.mark.parametrize("D", (64, 128))
def test_large_descales_and_strided_cache(D, seed):
    """Descales too large to fold (the bf16 bit placement then multiplies by 2^120) beside ordinary
    ones, query rows of 2^-70 and 2^30 and one whose elements lie 2^40 apart (F16_PRODUCTS scales
    each row into fp16), and a cache that is a [B, S, H_kv, D] tensor's transposed view."""
    B, H, Hk, Sq, Sk = 3, 32, 8, 1, 1500
    q, k8, v8, kd, vd = fp8_inputs(B, H, Hk, Sq, Sk, D, torch.bfloat16, seed)
    kd[0, 0], vd[0, 1], kd[1, 2] = 5000.0, 300.0, -3000.0
    k8, v8 = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k8, v8))
    q = q.clone()
    q[0, :4] *= 2.0 ** -70  # rows far from fp16's range both ways: F16_PRODUCTS scales each row
    q[1, 4:8] *= 2.0 ** 30
    q[2, 8:12, :, ::3] *= 2.0 ** -40  # one row's elements 2^40 apart
    lens = [Sk, 777, 1]
    seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
    for opts in ({}, {"splits": 5}, {"f16_products": False}):
        with poisoned_outputs():
            out = d7.attention(q, k8, v8, seqlens_k=seqlens, k_descale=kd, v_descale=vd, **opts)
        assert torch.isfinite(out).all(), opts
        check_fp8(out, q, k8, v8, kd, vd, lens, False, f"large descales / strided D{D} {opts} seed {seed}")


@on_hopper
@pytest.mark.parametrize("D", (64, 128))
def test_every_e4m3_value_comes_back(D):
    """seqlens_k 1: each output row is its head's first V row exactly, with all 254 finite e4m3
    values in those rows (descales 1), in both dtypes, split and not."""
    G = 4
    for dtype in (torch.float16, torch.bfloat16):
        q, k8, v8, kd, vd, lens = every_code_first(D, dtype, G)
        for opts in ({}, {"splits": 2}):
            with poisoned_outputs():
                out = d7.attention(q, k8, v8, seqlens_k=lens, k_descale=kd, v_descale=vd, **opts)
            want = v8[:, :, 0].float().repeat_interleave(G, dim=1)[:, :, None]
            assert torch.equal(out.float(), want.to(dtype).float()), (dtype, opts)
