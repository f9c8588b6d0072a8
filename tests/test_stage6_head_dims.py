"""Stage 6 at head dims 96 and 256 (issue 51 item 1): the tables and checks (CPU), the builds the
launcher picks compiled offline without spills or serialized wgmma, D64/D128's defines untouched,
and (GPU, sm_90 only) the outputs against the float64 reference by the error rule
(lib.reference.check_output) at odd shapes: full and causal (both alignments), GQA, one query,
decoding (packed, split-KV), packed sequences. Compiled here; none of it has run on a GPU yet."""
import pytest
import torch

import stages.stage6 as s6
from conftest import assert_no_local_memory, gpu
from lib.inputs import make_qkv, poisoned_outputs
from lib.reference import check_output
from lib.simulator import HAS_GPU

on_hopper = pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability() != (9, 0),
                               reason="stage 6 needs an sm_90 GPU (H100/H200)")
SERIALIZING = __import__("re").compile(r"C75(08|10|11|12|15)|wgmma.*serializ", __import__("re").I)
NEW_DIMS = (96, 256)
SMS = 132


# --------------------------------------------------------------------------------------------
# tables and checks (CPU)

def test_head_dims_listed_with_their_tables():
    assert s6.INFO.head_dims == (64, 96, 128, 256)
    for D in s6.INFO.head_dims:
        for table in (s6.TILES, s6.DEFAULT_SCHEDULES, s6.EXP2_POLY, s6.LAZY_RESCALE, s6.FEW_ROWS_TILES, s6.DECODE_TILES):
            assert D in table, (D, table)
        assert s6.fits(D, s6.TILES[D]) and s6.fits(D, s6.DECODE_TILES[D]) and s6.fits(D, s6.FEW_ROWS_TILES[D])
    # D96 is D128 in shared memory; the tuned D64/D128 tables are as they were
    assert s6.smem_width(96) == 128 and s6.smem_bytes(96, (176, 2, 2)) == s6.smem_bytes(128, (176, 2, 2))
    assert s6.smem_width(64) == 64 and s6.smem_width(256) == 256
    assert s6.TILES[64] == (128, 2, 3) and s6.TILES[128] == (176, 2, 2) and s6.TILES[96] == s6.TILES[128]
    assert s6.TILES[256] == (64, 2, 2) and s6.DECODE_TILES[256] == (64, 3, 1)
    assert s6.DECODE_TILES[64] == (128, 4, 1) and s6.DECODE_TILES[128] == (128, 3, 1)


@pytest.mark.parametrize("D", [32, 80, 160, 192])
def test_other_head_dims_refused(D):
    q, k, v = make_qkv(1, 2, 10, D, Sk=12, dtype=torch.float16, device="cpu")
    from lib.inputs import validate
    with pytest.raises(NotImplementedError, match="head dims 64, 96, 128, 256"):
        validate(q, k, v, causal=False, scale=None, info=s6.INFO, check_device=False)
    with pytest.raises(ValueError, match="head dims 64, 96, 128, 256"):
        s6.config(D)


def test_d64_d128_defines_unchanged():
    """The new dims add nothing to the D64/D128 builds' defines (no PV_N: the kernel's default is
    the head dim there); their SASS is compared offline by experiments/model_variants/sass_digest.py."""
    for D in (64, 128):
        for pack in (False, True):
            names = [k for k, _ in s6.config(D, pack_gqa=pack)["defines"]]
            assert "PV_N" not in names
    assert "PV_N" not in dict(s6.config(96)["defines"]) and "PV_N" not in dict(s6.config(256)["defines"])


@pytest.mark.parametrize("D", NEW_DIMS)
def test_choose_at_new_dims(D):
    # prefill: the default schedule at any length (no tuned persistent / queue rules at these dims)
    for causal in (False, True):
        for Sk in (512, 2048, 8192):
            ch = s6.choose(16, 16, 16, Sk, Sk, D, causal, SMS)
            assert ch["schedule"] == s6.DEFAULT_SCHEDULES[D] and ch["tiles"] == s6.TILES[D] and not ch["pack_gqa"]
    # few rows: one consumer
    ch = s6.choose(1, 8, 8, 100, 100, D, False, SMS)
    assert ch["tiles"] == s6.FEW_ROWS_TILES[D]
    # decoding: packed, split over a long cache
    ch = s6.choose(1, 32, 8, 1, 32768, D, False, SMS)
    assert ch["pack_gqa"] and ch["splits"] > 1 and ch["tiles"][2] == 1
    # many decoding blocks: two per SM at D96 (D128's tiles), one at D256 (no tiles for two)
    ch = s6.choose(64, 32, 8, 1, 1024, D, False, SMS)
    assert ch["blocks_per_sm"] == (2 if D == 96 else 1)
    if D == 256:
        with pytest.raises(NotImplementedError, match="two decoding blocks per SM have no tiles at D256"):
            s6.choose(64, 32, 8, 1, 1024, D, False, SMS, blocks_per_sm=2)


def _launcher_builds(D, dtype):
    """The builds choose + config give at a grid of shapes (prefill, few rows, decoding, split)."""
    out = set()
    for B, H, Hk, Sq, Sk in [(16, 16, 16, 2048, 2048), (1, 8, 8, 512, 512), (4, 16, 4, 8192, 8192),
                             (1, 32, 8, 1, 8192), (64, 32, 8, 1, 1024), (1, 8, 1, 16, 4096)]:
        for causal in (0, 1, 2):
            mode = causal if Sq > 1 else (0 if causal == 2 else causal)
            try:
                ch = s6.choose(B, H, Hk, Sq, Sk, D, mode, SMS)
            except (ValueError, NotImplementedError):
                continue
            for seqs in (False, True):
                cfg = s6.config(D, ch["tiles"], ch["schedule"], False, None, None, ch["pack_gqa"], seqs,
                                ch["q_stages"], None, None, None, ch["blocks_per_sm"])
                out.add(cfg["defines"])
    return sorted(out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", NEW_DIMS)
def test_launcher_builds_compile_without_spills(D, dtype):
    from lib import nvrtc
    builds = [nvrtc.Build(s6.SOURCE, s6.ARCH, dtype, D, d) for d in _launcher_builds(D, dtype)]
    assert len(builds) >= 3
    nvrtc.compile_many(builds)
    for b in builds:
        c = b.compile()
        assert_no_local_memory(c, ("attention_wgmma", "attention_combine_splits"), b)
        assert not SERIALIZING.search(c.log), (b, c.log)


# --------------------------------------------------------------------------------------------
# on the GPU

def _check(q, k, v, *, label, causal=False, **kw):
    with poisoned_outputs():
        out = s6.attention(q, k, v, causal=causal, **kw)
    c = check_output(out, q, k, v, causal=causal)
    assert c.passed, f"{label}: {c.summary()}"


# (B, H, Hkv, Sq, Sk): Sq != Sk both ways, lengths no multiple of any tile, GQA, one query
ODD_SHAPES = [(2, 4, 2, 129, 77), (1, 6, 2, 300, 1000), (1, 2, 1, 1000, 300), (2, 4, 4, 257, 257), (3, 8, 2, 1, 333)]
CAUSALS = [False, True, "bottom_right"]


@gpu
@on_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", NEW_DIMS)
def test_new_dims_match_reference(D, dtype, seed):
    for B, H, Hkv, Sq, Sk in ODD_SHAPES:
        for causal in CAUSALS:
            q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=seed)
            _check(q, k, v, causal=causal, label=f"{dtype} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}")


@gpu
@on_hopper
@pytest.mark.parametrize("D", NEW_DIMS)
def test_new_dims_every_prefill_launch(D, seed):
    """Many work tiles (the default schedule, several query blocks per head), one consumer (few
    rows), the persistent launch and the work queue when asked for, and a transposed [B, S, H, D]
    view (the tensor maps' strides)."""
    for B, H, Hkv, Sq, Sk in [(4, 16, 4, 700, 900), (1, 3, 1, 190, 250)]:
        for causal in CAUSALS:
            q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.float16, seed=seed)
            _check(q, k, v, causal=causal, label=f"default {(B, H, Hkv, Sq, Sk, D)} causal={causal}")
            for sched in ("+ persistent blocks", "+ work queue"):
                _check(q, k, v, causal=causal, schedule=sched, label=f"{sched} {(B, H, Hkv, Sq, Sk, D)} causal={causal}")
            qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
            _check(qt, kt, vt, causal=causal, label=f"[B,S,H,D] view {(B, H, Hkv, Sq, Sk, D)} causal={causal}")


@gpu
@on_hopper
@pytest.mark.parametrize("D", NEW_DIMS)
def test_new_dims_decoding(D, seed):
    """Packed GQA decoding, split-KV (combine in the block and as a kernel), unpacked, a few queries."""
    for B, H, Hkv, Sq, Sk in [(1, 32, 8, 1, 5000), (2, 8, 1, 4, 3001), (3, 6, 2, 1, 129), (64, 32, 8, 1, 1024)]:
        for opts in ({}, {"splits": 4}, {"splits": 3, "combine_in_block": False}, {"pack_gqa": False}):
            for causal in (False, "bottom_right"):
                q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16, seed=seed)
                _check(q, k, v, causal=causal, **opts, label=f"decode {opts} {(B, H, Hkv, Sq, Sk, D)} causal={causal}")


@gpu
@on_hopper
@pytest.mark.parametrize("D", NEW_DIMS)
def test_new_dims_packed_sequences(D, seed):
    lens_q, lens_k = [70, 1, 300], [90, 200, 300]
    H, Hkv = 4, 2
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), H, D, generator=g).half().cuda()
    k = torch.randn(sum(lens_k), Hkv, D, generator=g).half().cuda()
    v = torch.randn(sum(lens_k), Hkv, D, generator=g).half().cuda()
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    for causal in (False, "bottom_right"):
        out = s6.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
        for b in range(len(lens_q)):
            qb = q[cu_q[b]:cu_q[b + 1]].transpose(0, 1)[None]
            kb, vb = (t[cu_k[b]:cu_k[b + 1]].transpose(0, 1)[None] for t in (k, v))
            c = check_output(out[cu_q[b]:cu_q[b + 1]].transpose(0, 1)[None], qb, kb, vb, causal=causal)
            assert c.passed, f"varlen seq {b} D{D} causal={causal}: {c.summary()}"
