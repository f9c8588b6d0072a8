"""Stage 8, the backward pass (issue 23), and autograd through stage 5: gradients against
float64 autograd of the reference, by the error rule (lib.reference.check_gradients), on fresh
random inputs at odd sizes, GQA, both causal alignments and strided views."""
import math
from functools import partial

import pytest
import torch

from conftest import compile_cases, cpu_only, gpu
from lib.inputs import make_qkv
from lib.reference import attention_lse, check_gradients
from stages import autograd, autograd_node, stage5, stage6, stage8

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)

# (B, H, H_kv, Sq, Sk, D, causal): one element; partial tiles everywhere; GQA 2, 4 and 16;
# bottom-right with Sq > Sk (rows that see no key); a K/V ring of many query blocks.
SHAPES = [
    (1, 1, 1, 1, 1, 64, False),
    (2, 4, 2, 37, 45, 64, True),
    (1, 8, 2, 129, 67, 128, "bottom_right"),
    (1, 4, 1, 200, 130, 64, "bottom_right"),
    (2, 2, 2, 64, 64, 128, False),
    (1, 16, 1, 77, 300, 128, True),
    (1, 2, 2, 333, 333, 64, True),
]


@compile_cases("dtype,D,atomics", [(dtype, D, atomics) for atomics in (1, 0) for D in (64, 128)
                                   for dtype in (torch.float16, torch.bfloat16)],
               build=lambda dtype, D, atomics: stage8.compile_for("sm_90a", dtype, D, dq_atomics=atomics, wgmma=0))
def test_compiles_offline_without_spills(D, dtype, atomics):
    """Both kernels build for Hopper without a GPU, and ptxas spills at most what INFO allows
    (8 bytes at D 128 with some NVRTCs, none at D 64) in the stage's tiles."""
    use = stage8.compile_for("sm_90a", dtype, D, dq_atomics=atomics, wgmma=0)["attention_backward"].resource_usage()
    allowed = stage8.INFO.extra.get("spill_bytes_allowed", {}).get(D, 0)
    assert set(use) == {"attention_backward", "attention_backward_dq"}
    for kernel, u in use.items():
        assert u["spill_stores"] <= allowed and u["spill_loads"] <= allowed, (kernel, u)


def _run(B, H, Hk, Sq, Sk, D, causal, dtype, seed, *, scale=None, strided=False, forward=stage5):
    """Inputs, the output and lse of `forward` (stage 5's, or stage 6's where stage 5 lacks the head
    dim), and a random dO: what a backward starts from."""
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dtype, seed=seed)
    if strided:  # a model's [B, S, H, D] tensors seen as [B, H, S, D]
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=dtype)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device="cuda")
    out = forward.attention(q, k, v, causal=causal, scale=scale, lse=lse)
    return q, k, v, out, dout, lse


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_backward_matches_reference(shape, dtype, seed):
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v, out, dout, lse = _run(*shape, dtype, seed)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal)
    for name, c in check_gradients(grads, q, k, v, dout, causal=causal).items():
        assert c.passed, f"{name} {shape} {dtype} seed {seed}: {c.summary()}"


@gpu
@pytest.mark.parametrize("D", [64, 128])
def test_every_build_matches_reference(D, seed):
    """Every tile choice of the mma.sync build, with dQ by atomics and by its own pass, on an odd
    GQA shape (the WGMMA build, the default on an H100, runs in every other test here)."""
    for tiles in stage8.CHOICES:
        for atomics in stage8.SWITCHES["DQ_ATOMICS"]:
            for causal in (False, True):
                shape = (2, 6, 3, 83, 141, D, causal)
                q, k, v, out, dout, lse = _run(*shape, torch.bfloat16, seed)
                grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, tiles=tiles,
                                                  dq_atomics=atomics, wgmma=0)
                for name, c in check_gradients(grads, q, k, v, dout, causal=causal).items():
                    assert c.passed, f"{name} {tiles} atomics={atomics} causal={causal} seed {seed}: {c.summary()}"


# The WGMMA build's switches besides OVERLAP: (warpgroups, dq_atomics, dq_bulk, tma_loads). The
# stage's builds (stage8.WGMMA_BUILD) are the last two rows at D 64 and D 128; the first row was
# the stage's WGMMA build before them.
WGMMA_SWITCHES = [(1, 0, 0, 0), (2, 0, 0, 0), (1, 1, 0, 0), (2, 1, 0, 0), (1, 1, 1, 0), (2, 1, 1, 0),
                  (1, 0, 0, 1), (2, 1, 0, 1), (1, 1, 1, 1), (2, 1, 1, 1)]
_switch_id = "wg{}-atomics{}-bulk{}-tma{}".format
_switch_kw = lambda w, a, b, t, turns=0, early=0: {"warpgroups": w, "dq_atomics": a, "dq_bulk": b,  # noqa: E731
                                                   "tma_loads": t, "dq_turns": turns, "dq_early": early}
# two warpgroups at D 64 taking turns at dQ (DQ_TURNS), with and without bulk reductions
TURNS = [(2, 1, 1, 1, 1), (2, 1, 0, 1, 1)]
# the dQ product issued while dV and dK still run (DQ_EARLY): the stages' builds and vector reductions
EARLY = [(1, 1, 1, 1, 0, 1), (2, 1, 1, 1, 0, 1), (2, 1, 0, 1, 0, 1)]
_variant_id = lambda x: _switch_id(*x[:4]) + ("-turns" if len(x) == 5 else "-early" if len(x) == 6 else "")  # noqa: E731


# Without a GPU, each switch value, dtype and head dim in one build at least, and the stage's own
# builds (stage8.WGMMA_BUILD) in fp16 (conftest.compile_cases); FA_ALL_BUILDS=1 compiles all 24.
WGMMA_CASES = [(D, s, dtype) for D in (64, 128) for s, dtype in
               [(s, torch.float16) for s in WGMMA_SWITCHES[-2:]] + [(s, torch.bfloat16) for s in WGMMA_SWITCHES]]


def _stage_build(D, switches) -> bool:
    own = stage8.WGMMA_BUILD[D]
    return switches == (own["WARPGROUPS"], own["DQ_ATOMICS"], own["DQ_BULK"], own["TMA_LOADS"])


def _offline_wgmma(D, dtype, switches):
    """The Hopper build with these switches, compiled with a define of its own: a fresh compile
    with ptxas's report, not a cached build (NVRTC on the H100 machine has left the log empty)."""
    from lib import nvrtc
    cfg = stage8.config(D, wgmma=1, **_switch_kw(*switches))
    return nvrtc.compile_stage(stage8.WGMMA_SOURCE, arch="sm_90a", dtype=dtype, head_dim=D,
                               defines={"STAGE8_OFFLINE_CHECK": 1, **dict(cfg["defines"])})


@cpu_only
@compile_cases("D,switches,dtype", WGMMA_CASES, ids=[f"{s}-{dt}-{D}" for D, s, dt in WGMMA_CASES],
               keep=lambda c: c[2] == torch.float16 and _stage_build(c[0], c[1]),
               build=lambda D, switches, dtype: _offline_wgmma(D, dtype, switches))
def test_wgmma_build_compiles_offline(D, dtype, switches):
    """The Hopper build compiles for sm_90a without a GPU, with each of its switches: no spills,
    ptxas does not report its wgmma serialized, and the dQ sum is sm_90's vector reduction. CPU
    mode only: on the H100 machine NVRTC handed back this build's cubin with an empty log (calls
    6-8 of 2026-11-25, not yet understood), while the kernels ran and passed every check there."""
    from lib import sass
    wgs, atomics, bulk, tma = switches
    compiled = _offline_wgmma(D, dtype, switches)
    use = compiled.resource_usage()
    assert set(use) == {"attention_backward", "attention_backward_dq"}, compiled.log[-2000:]
    # NVRTC 13.0 (the CUDA wheels torch 2.11-2.14 pin, and the GPU machines') spills 8-16 bytes in
    # two builds that are not the stage's (one warpgroup at D 128, dQ by reductions; 16 since
    # LONGEST_FIRST's block order joined the build); 13.5 none. The stage's own builds may not
    # spill under either.
    from lib.nvrtc import nvrtc_version
    allowed = 0 if _stage_build(D, switches) or tuple(map(int, nvrtc_version().split("."))) >= (13, 5) else 16
    for kernel, u in use.items():
        assert u["spill_stores"] <= allowed and u["spill_loads"] <= allowed, (kernel, u, nvrtc_version())
    assert "serializ" not in compiled.log.lower(), compiled.log
    body = next(part for part in sass.sass_text(compiled.cubin).split("Function : ")[1:]
                if part.split("\n", 1)[0].strip() == "attention_backward")  # the dK/dV kernel, not _dq
    reds = [line for line in body.splitlines() if "REDG" in line]
    bulk_reds = [line for line in body.splitlines() if "UBLKRED" in line]
    tiles = D // 64 if wgs == 1 else 1  # 64-column dQ tiles per warpgroup and step
    assert len(reds) == (16 * tiles if atomics and not bulk else 0), reds[:4]
    assert all("F32x2" in line for line in reds), reds[:4]
    assert len(bulk_reds) == (tiles if bulk else 0), bulk_reds
    assert ("UTMALDG" in body) == bool(tma), "TMA loads exactly in the TMA_LOADS build"
    assert " ST.E" not in body, "generic stores: the shared struct's address was lost"


@cpu_only
@pytest.mark.parametrize("switches", TURNS, ids=lambda s: _switch_id(*s[:4]) + "-turns")
def test_dq_turns_compiles_offline(switches):
    """DQ_TURNS at D 64 (the only head dim it takes): no spills, wgmma not serialized, and the
    dQ sum made once per step by one warpgroup (one bulk reduction or 16 vector reductions)."""
    from lib import nvrtc, sass
    cfg = stage8.config(64, wgmma=1, **_switch_kw(*switches))
    compiled = nvrtc.compile_stage(stage8.WGMMA_SOURCE, arch="sm_90a", dtype=torch.bfloat16, head_dim=64,
                                   defines={"STAGE8_OFFLINE_CHECK": 1, **dict(cfg["defines"])})
    for kernel, u in compiled.resource_usage().items():
        assert u["spill_stores"] == 0 and u["spill_loads"] == 0, (kernel, u)
    assert "serializ" not in compiled.log.lower(), compiled.log
    body = next(part for part in sass.sass_text(compiled.cubin).split("Function : ")[1:]
                if part.split("\n", 1)[0].strip() == "attention_backward")
    bulk = switches[2]
    assert body.count("UBLKRED") == bulk and body.count("REDG") == (0 if bulk else 16)
    with pytest.raises(ValueError, match="dq_turns"):
        stage8.config(128, wgmma=1, **_switch_kw(*switches))


@cpu_only
@compile_cases("D,switches", [(D, s) for s in EARLY for D in (64, 128)],
               ids=[f"{D}-{_variant_id(s)}" for s in EARLY for D in (64, 128)],
               build=lambda D, switches: _offline_wgmma(D, torch.bfloat16, switches))
def test_dq_early_compiles_offline(D, switches):
    """DQ_EARLY: dQ's accumulators beside the registers the running dV and dK products read,
    without spills and without ptxas serializing a wgmma; refused without dQ in the kernel."""
    assert dict(stage8.config(D, wgmma=1, **_switch_kw(*switches))["defines"])["DQ_EARLY"] == 1
    compiled = _offline_wgmma(D, torch.bfloat16, switches)
    for kernel, u in compiled.resource_usage().items():
        assert u["spill_stores"] == 0 and u["spill_loads"] == 0, (kernel, u)
    assert "serializ" not in compiled.log.lower(), compiled.log
    with pytest.raises(ValueError, match="dq_early"):
        stage8.config(D, wgmma=1, dq_atomics=0, dq_early=1)


@gpu
def test_wgmma_and_mma_sync_builds_agree(seed):
    """On an H100 both builds run (the WGMMA one with and without its overlap): each passes the rule."""
    if not stage8.wgmma_here():
        pytest.skip("the WGMMA build needs sm_90")
    for D in (64, 128):
        shape = (1, 4, 2, 200, 150, D, True)
        q, k, v, out, dout, lse = _run(*shape, torch.float16, seed)
        for kw in ({"wgmma": 1}, {"wgmma": 1, "overlap": 0}, {"wgmma": 0},
                   *({"wgmma": 1, **_switch_kw(*s)} for s in WGMMA_SWITCHES)):
            grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=True, **kw)
            for name, c in check_gradients(grads, q, k, v, dout, causal=True).items():
                assert c.passed, f"{name} D{D} {kw} seed {seed}: {c.summary()}"


@gpu
@pytest.mark.parametrize("shape, switches",
                         [(shape, s) for s in WGMMA_SWITCHES for shape in SHAPES]
                         + [(shape, s) for s in TURNS for shape in SHAPES if shape[5] == 64]  # D 64 only
                         + [(shape, s) for s in EARLY for shape in SHAPES],
                         ids=lambda x: str(x) if len(x) == 7 else _variant_id(x))
def test_wgmma_switches_match_reference(shape, switches, seed):
    """Two warpgroups per key block, dQ by reductions (vector or bulk), TMA loads, the dQ product
    issued early and, at D 64, dQ in turns, at every shape of the stage's test: odd lengths (key blocks of 128 keys half
    empty), GQA, both causal alignments."""
    if not stage8.wgmma_here():
        pytest.skip("the WGMMA build needs sm_90")
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v, out, dout, lse = _run(*shape, torch.bfloat16, seed)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, wgmma=1, **_switch_kw(*switches))
    for name, c in check_gradients(grads, q, k, v, dout, causal=causal).items():
        assert c.passed, f"{name} {shape} {switches} seed {seed}: {c.summary()}"


# three one-warpgroup blocks per SM at D 64 (BLOCKS_PER_SM, without the overlap)
THREE_BLOCKS = {"wgmma": 1, "warpgroups": 1, "dq_atomics": 1, "dq_bulk": 1, "tma_loads": 1, "overlap": 0,
                "blocks_per_sm": 3}


@cpu_only
def test_three_blocks_per_sm_compile_offline():
    """BLOCKS_PER_SM 3 at D 64: 168 registers or fewer, so that three 128-thread blocks fit an SM's
    65,536, and shared memory for three; wgmma not serialized; refused where it cannot fit."""
    from lib import nvrtc
    cfg = stage8.config(64, **THREE_BLOCKS)
    compiled = nvrtc.compile_stage(stage8.WGMMA_SOURCE, arch="sm_90a", dtype=torch.bfloat16, head_dim=64,
                                   defines={"STAGE8_OFFLINE_CHECK": 1, **dict(cfg["defines"])})
    use = compiled.resource_usage()["attention_backward"]
    assert 3 * 128 * use["registers"] <= 65536, use
    assert use["spill_stores"] <= 8, use  # two 4-byte values (ptxas, NVRTC 13.0)
    assert 3 * (cfg["smem"] + 1024) <= 233472, cfg["smem"]  # 228 KB an SM, 1 KB reserved per block
    assert "serializ" not in compiled.log.lower(), compiled.log
    for bad in ({"overlap": 1}, {"warpgroups": 2}):
        with pytest.raises(ValueError, match="blocks_per_sm"):
            stage8.config(64, **{**THREE_BLOCKS, **bad})
    with pytest.raises(ValueError, match="blocks_per_sm"):
        stage8.config(128, **THREE_BLOCKS)


@gpu
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[5] == 64], ids=str)
def test_three_blocks_per_sm_match_reference(shape, seed):
    """BLOCKS_PER_SM 3 (one buffer of dQ tiles) at every D 64 shape of the stage's test."""
    if not stage8.wgmma_here():
        pytest.skip("the WGMMA build needs sm_90")
    q, k, v, out, dout, lse = _run(*shape, torch.bfloat16, seed)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=shape[6], **THREE_BLOCKS)
    for name, c in check_gradients(grads, q, k, v, dout, causal=shape[6]).items():
        assert c.passed, f"{name} {shape} three blocks seed {seed}: {c.summary()}"


@gpu
@pytest.mark.parametrize("D", [64, 128])
def test_plan_follows_new_tensors(D, seed):
    """A plan's tensor maps of q and dO point where the last call's tensors were (a retarget is
    skipped when the address is the same): calls with another pair of tensors of the same layout,
    then the first pair again, each match the reference. A map left pointing at the previous
    tensors would give that call the other inputs' gradients."""
    a = _run(2, 4, 2, 130, 200, D, "bottom_right", torch.bfloat16, seed)
    b = _run(2, 4, 2, 130, 200, D, "bottom_right", torch.bfloat16, seed + 7)
    for q, k, v, out, dout, lse in (a, b, a, b):
        grads = stage8.attention_backward(q, k, v, out, dout, lse, causal="bottom_right")
        for name, c in check_gradients(grads, q, k, v, dout, causal="bottom_right").items():
            assert c.passed, f"{name} D{D} seed {seed}: {c.summary()}"
    q, k, v, out, dout, lse = b  # dO alone moves: q's map stays, dO's follows
    dout2 = torch.randn_like(dout)
    grads = stage8.attention_backward(q, k, v, out, dout2, lse, causal="bottom_right")
    for name, c in check_gradients(grads, q, k, v, dout2, causal="bottom_right").items():
        assert c.passed, f"{name} D{D} new dO seed {seed}: {c.summary()}"


@gpu
def test_deterministic_dq_pass(seed):
    """dq_atomics=0 (the dQ pass) gives the same bits for the same inputs, at both head dims;
    the stage's build (dQ summed by reductions) passes the rule there too."""
    if not stage8.wgmma_here():
        pytest.skip("the WGMMA build needs sm_90")
    for D in (64, 128):
        q, k, v, out, dout, lse = _run(1, 8, 2, 300, 333, D, True, torch.bfloat16, seed)
        first, again = (stage8.attention_backward(q, k, v, out, dout, lse, causal=True, dq_atomics=0)
                        for _ in range(2))
        assert all(torch.equal(a, b) for a, b in zip(first, again)), f"D{D}: the dQ pass is not deterministic"
        for name, c in check_gradients(first, q, k, v, dout, causal=True).items():
            assert c.passed, f"{name} D{D} dQ pass seed {seed}: {c.summary()}"


@gpu
@pytest.mark.parametrize("D", [64, 96, 128])
def test_preprocess_matches_torch(D, seed):
    """The preprocess kernel's δ and lse·log2 e against PyTorch, float64: odd Sq (padding rows),
    a strided dO, rows whose lse is −∞ (they see no key)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    B, H, Sq, sq_pad = 2, 3, 77, 128
    out = torch.randn(B, H, Sq, D, device="cuda", generator=gen).to(torch.bfloat16)
    dout = torch.randn(B, Sq, H, D, device="cuda", generator=gen).to(torch.bfloat16).transpose(1, 2)
    lse = torch.randn(B, H, Sq, device="cuda", generator=gen)
    lse[0, 1, :5] = -math.inf
    dq_zero = torch.full((B, H, sq_pad, stage8.tile_width(D)), math.nan, device="cuda")  # D 96: 128 wide
    delta, lse2 = stage8.preprocess(out, dout, lse, sq_pad, dq_zero)
    assert torch.all(dq_zero == 0), "the float32 dQ is zeroed in the same pass"
    want = (dout.double() * out.double()).sum(-1)
    assert torch.allclose(delta[..., :Sq].double(), want, rtol=1e-5, atol=1e-4), (delta[..., :Sq] - want).abs().max()
    assert torch.all(delta[..., Sq:] == 0) and torch.all(torch.isposinf(lse2[..., Sq:]))
    assert torch.all(torch.isposinf(lse2[0, 1, :5]))
    finite = ~torch.isneginf(lse)
    assert torch.allclose(lse2[..., :Sq][finite].double(), lse[finite].double() * math.log2(math.e), rtol=1e-6)


@gpu
@pytest.mark.parametrize("D", [64, 96, 128])
def test_postprocess_matches_tiles_in_order(D, seed):
    """The postprocess kernel puts bulk-summed dQ tiles back in row order as tiles_in_order does
    (itself checked element by element on the CPU), converted to bf16, dropping padding rows (and at
    D 96 the tiles' columns 96-127); with a scale, multiplied by it first."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    B, H, Sq, sq_pad = 2, 3, 77, 128
    acc = torch.randn(B, H, sq_pad, stage8.tile_width(D), device="cuda", generator=gen)
    got = stage8.postprocess(acc, Sq, torch.bfloat16, head_dim=D)
    want = stage8.tiles_in_order(acc, torch.bfloat16)[:, :, :Sq, :D]
    assert got.shape == (B, H, Sq, D) and got.is_contiguous() and torch.equal(got, want)
    scale = D ** -0.5  # SCALE_AT_END's: the sum times the softmax scale, then rounded
    got = stage8.postprocess(acc, Sq, torch.bfloat16, head_dim=D, scale=scale)
    assert torch.equal(got, stage8.tiles_in_order(acc * scale, torch.bfloat16)[:, :, :Sq, :D])


@gpu
@pytest.mark.parametrize("D", [96, 128])
@pytest.mark.parametrize("Sq", [77, 160, 239])
def test_postprocess_matches_tiles_in_order_rows80(D, Sq, seed):
    """The same for ROWS80's tiles of dQᵀ (80 query rows each), padding rows dropped, with a scale."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    B, H, sq_pad = 2, 3, -(-Sq // 80) * 80
    acc = torch.randn(B, H, sq_pad, stage8.tile_width(D), device="cuda", generator=gen)
    scale = D ** -0.5
    got = stage8.postprocess(acc, Sq, torch.float16, head_dim=D, scale=scale, rows=80)
    want = stage8.tiles_in_order(acc * scale, torch.float16, rows=80)[:, :, :Sq, :D]
    assert got.shape == (B, H, Sq, D) and got.is_contiguous() and torch.equal(got, want)


def test_backward_table_shows_the_dtype_when_the_record_has_both(monkeypatch):
    """A record made with --dtype both (bf16 rows, then fp16 rows) gets a dtype column in the
    notebook's table, and its fp16 rows (no variants timed) stay out of the variants table."""
    import IPython.display
    from lib import notebook_backward as nbb
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda m: shown.append(m.data))
    monkeypatch.setattr(nbb, "record_line", lambda rec: "provenance")
    row = {"B": 4, "H": 16, "S": 8192, "D": 128, "causal": False, "us": 100.0, "tflops": 1.0,
           "sdpa_default_us": 90.0, "sdpa_flash_us": 150.0, "passed": True,
           "max_grad_err": {"dq": 1.0}, "grad_tolerance": {"dq": 4.0}}
    rec = {"rows": [{**row, "dtype": "bfloat16", "variants": {"X": {"us": 110.0}}},
                    {**row, "dtype": "float16", "variants": {}}]}
    nbb.show_backward_table(rec)
    assert "| dtype |" in shown[-1] and "| float16 |" in shown[-1] and "1.50×" in shown[-1]
    nbb.show_variants_table(rec)
    assert shown[-1].count("B4 S8192 D128") == 1  # one column: the bf16 row
    nbb.show_backward_table({"rows": rec["rows"][:1]})
    assert "| dtype |" not in shown[-1]


def test_bad_choices_are_refused():
    with pytest.raises(ValueError, match="tiles"):
        stage8.config(64, (32, 32))
    with pytest.raises(ValueError, match="dq_atomics"):
        stage8.config(64, None, 2)
    with pytest.raises(ValueError, match="WGMMA build"):
        stage8.config(64, (128, 64), None, 1)
    with pytest.raises(ValueError, match="overlap"):
        stage8.config(64, None, None, 0, overlap=0)
    with pytest.raises(ValueError, match="overlap"):
        stage8.config(64, None, None, 1, overlap=2)
    with pytest.raises(ValueError, match="warpgroups"):
        stage8.config(64, None, None, 1, warpgroups=3)
    with pytest.raises(ValueError, match="warpgroups"):
        stage8.config(64, None, None, 0, warpgroups=2)
    with pytest.raises(ValueError, match="dq_atomics"):
        stage8.config(64, None, True, 1)
    with pytest.raises(ValueError, match="dq_atomics=1"):
        stage8.config(64, None, 0, 1, dq_bulk=1)
    with pytest.raises(TypeError, match="unknown switch"):
        stage8.config(64, None, None, 1, warpgroup=2)


def test_the_stages_wgmma_build_per_head_dim():
    """The WGMMA build's defaults are the measured ones, and config honours them: two warpgroups
    that multiply and a producer warpgroup, bulk dQ and TMA loads at both head dims, taking turns
    at dQ at D 64."""
    for D, wgs in ((64, 2), (128, 2)):
        cfg = stage8.config(D, wgmma=1)
        assert dict(cfg["defines"]) == stage8.WGMMA_BUILD[D]
        assert stage8.WGMMA_BUILD[D]["PRODUCER"] == 1 and stage8.WGMMA_BUILD[D]["DQ_TURNS"] == (D == 64)
        assert cfg["threads"] == 128 * (wgs + 1) and cfg["block_n"] == 64 * wgs and cfg["dq_smem"] == 0
        assert cfg["smem"] <= 227 * 1024  # what one block may have on an H100
        deterministic = stage8.config(D, None, 0, 1)  # dq_atomics=0: the dQ pass, nothing in bulk
        assert dict(deterministic["defines"])["DQ_BULK"] == 0 and deterministic["dq_smem"] > 0


def test_bulk_tiles_back_in_order():
    """tiles_in_order undoes the order the kernel's bulk reductions store dQ in (written here
    from the kernel's indexing, element by element, on a random matrix): thread t = 32w + 4g +
    i4 of a warpgroup puts its accumulator element i = 4n + j — row 16w + g + 8·(j / 2), column
    8n + 2·i4 + j % 2 of a 64 × 64 tile — at (128n + t)·4 + j of the tile."""
    B, H, S, D = 2, 3, 128, 128
    want = torch.randn(B, H, S, D)
    acc = torch.empty(B * H * S * D)
    for bh in range(B * H):
        for qb in range(S // 64):
            for atom in range(D // 64):
                base = ((bh * (S // 64) + qb) * (D // 64) + atom) * 4096
                for t in range(128):
                    w, g, i4 = t // 32, t % 32 // 4, t % 4
                    for n in range(8):
                        for j in range(4):
                            row, col = 64 * qb + 16 * w + g + 8 * (j // 2), 64 * atom + 8 * n + 2 * i4 + j % 2
                            acc[base + (128 * n + t) * 4 + j] = want[bh // H, bh % H, row, col]
    assert torch.equal(stage8.tiles_in_order(acc.reshape(B, H, S, D)), want)


def test_bulk_tiles_back_in_order_rows80():
    """The same for ROWS80's tiles, 64 columns of D × 80 query rows each, which hold dQᵀ: thread t
    = 32w + 4g + i4 puts element i = 4n + j (n < 10) — column 16w + g + 8·(j / 2) of the tile's 64,
    row 8n + 2·i4 + j % 2 of its 80 — at (128n + t)·4 + j."""
    B, H, S, D = 1, 2, 160, 128
    want = torch.randn(B, H, S, D)
    acc = torch.empty(B * H * S * D)
    for bh in range(B * H):
        for qb in range(S // 80):
            for atom in range(D // 64):
                base = ((bh * (S // 80) + qb) * (D // 64) + atom) * 64 * 80
                for t in range(128):
                    w, g, i4 = t // 32, t % 32 // 4, t % 4
                    for n in range(10):
                        for j in range(4):
                            row, col = 80 * qb + 8 * n + 2 * i4 + j % 2, 64 * atom + 16 * w + g + 8 * (j // 2)
                            acc[base + (128 * n + t) * 4 + j] = want[bh // H, bh % H, row, col]
    assert torch.equal(stage8.tiles_in_order(acc.reshape(B, H, S, D), rows=80), want)


@gpu
def test_backward_strided_and_negative_scale(seed):
    """Views with a model's strides, read in place, and a negative scale."""
    for scale in (None, -0.3):
        shape = (2, 4, 2, 90, 70, 64, True)
        q, k, v, out, dout, lse = _run(*shape, torch.bfloat16, seed, scale=scale, strided=True)
        assert q.stride(2) != q.shape[3]
        grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=True, scale=scale)
        for name, c in check_gradients(grads, q, k, v, dout, causal=True, scale=scale).items():
            assert c.passed, f"{name} scale {scale} seed {seed}: {c.summary()}"


@gpu
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_forward_saves_the_log_sum_exp(causal, seed):
    """Stage 5's lse against the float64 log-sum-exp (−∞ exactly where a row sees no key)."""
    q, k, v, out, dout, lse = _run(2, 4, 2, 150, 97, 64, causal, torch.float16, seed)
    want = attention_lse(q, k, causal=causal)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want))
    fin = torch.isfinite(want)
    assert float((lse.double()[fin] - want[fin]).abs().max()) < 1e-4, seed


@gpu
@pytest.mark.skipif(not HOPPER, reason="stage 6 needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("shape", [(2, 4, 2, 150, 97, 64, False), (2, 4, 2, 150, 97, 128, True),
                                   (1, 8, 1, 300, 129, 64, "bottom_right"),  # rows that see no key
                                   (1, 8, 8, 512, 512, 64, False),          # blocks of one consumer
                                   (16, 16, 4, 700, 700, 64, False),        # persistent blocks
                                   (16, 16, 16, 515, 515, 128, True),       # the work queue
                                   (3, 32, 8, 1, 4096, 128, False),         # decoding: packed GQA
                                   (2, 32, 8, 4, 333, 64, "bottom_right")], ids=str)
def test_stage6_saves_the_log_sum_exp(shape, seed):
    """Stage 6's lse on every launch path (one consumer, persistent blocks with the TMA store,
    the work queue, packed decoding, whose keys are then not split) against the float64
    log-sum-exp, −∞ exactly where a row sees no key; its output is the call's without lse."""
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=torch.bfloat16, seed=seed)
    lse = torch.full((B, H, Sq), float("nan"), device="cuda")
    out = stage6.attention(q, k, v, causal=causal, lse=lse)
    want = attention_lse(q, k, causal=causal)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want))
    fin = torch.isfinite(want)
    assert float((lse.double()[fin] - want[fin]).abs().max()) < 1e-4, seed
    if Sq > 4:  # decoding without lse may split the keys: other bits
        assert torch.equal(out, stage6.attention(q, k, v, causal=causal))


# Head dims 96 (D 128's tiles, columns 96-127 zero) and 256 (two warpgroups that split D, the dQ
# pass): one element, partial tiles, GQA, both causal alignments, rows that see no key, many blocks.
HEAD_DIM_SHAPES = [
    (1, 1, 1, 1, 1, 256, False),
    (2, 4, 2, 37, 45, 256, True),
    (1, 4, 1, 200, 130, 256, "bottom_right"),
    (1, 2, 2, 333, 333, 256, False),
    (2, 8, 2, 300, 515, 256, True),
    (1, 1, 1, 1, 1, 96, False),
    (2, 4, 2, 37, 45, 96, True),
    (1, 8, 2, 129, 67, 96, "bottom_right"),
    (1, 2, 2, 333, 300, 96, False),
]


@gpu
@pytest.mark.skipif(not HOPPER, reason="stage 6's forward and stage 8's D256 build need an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", HEAD_DIM_SHAPES, ids=str)
def test_backward_at_head_dims_96_and_256(shape, dtype, seed):
    """Stage 8 at the head dims stage 6's forward adds (issue 51): dq, dk and dv from stage 6's
    output and lse against float64 autograd, new tensors of the inputs' shapes."""
    causal = shape[-1]
    q, k, v, out, dout, lse = _run(*shape, dtype, seed, forward=stage6)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal)
    assert [tuple(g.shape) for g in grads] == [tuple(q.shape), tuple(k.shape), tuple(v.shape)]
    assert all(g.is_contiguous() and g.dtype == dtype for g in grads)
    for name, c in check_gradients(grads, q, k, v, dout, causal=causal).items():
        assert c.passed, f"{name} {shape} {dtype} seed {seed}: {c.summary()}"


@gpu
@pytest.mark.skipif(not HOPPER, reason="stage 6's forward (the lse at D 96) needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("shape", [(2, 4, 2, 37, 45, 96, True), (1, 2, 2, 150, 97, 96, "bottom_right")], ids=str)
def test_mma_sync_build_at_head_dim_96_pads_copies(shape, seed):
    """The mma.sync build has no D 96 tiles: it runs D 128's on zero-padded copies (stage8.PADDED),
    against float64 like the WGMMA build's D 96 above."""
    q, k, v, out, dout, lse = _run(*shape, torch.bfloat16, seed, forward=stage6)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=shape[-1], wgmma=0)
    assert [tuple(g.shape) for g in grads] == [tuple(q.shape), tuple(k.shape), tuple(v.shape)]
    for name, c in check_gradients(grads, q, k, v, dout, causal=shape[-1]).items():
        assert c.passed, f"{name} {shape} seed {seed}: {c.summary()}"


def test_head_dim_256_build_and_its_refusals():
    """D 256's one build (two warpgroups sharing 64 keys, the dQ pass, within an H100's shared
    memory) and what it refuses."""
    cfg = stage8.config(256, wgmma=1)
    d = dict(cfg["defines"])
    assert d["WARPGROUPS"] == 2 and d["DQ_ATOMICS"] == 0 and d["PRODUCER"] == 0
    assert cfg["block_n"] == 64 and cfg["threads"] == 256 and cfg["dq_smem"] > 0
    assert max(cfg["smem"], cfg["dq_smem"]) <= 227 * 1024
    for bad in ({"warpgroups": 1}, {"dq_atomics": 1, "dq_bulk": 0}):
        with pytest.raises(ValueError, match="D 256 has one build"):
            stage8.config(256, wgmma=1, **bad)


@gpu
def test_head_dim_256_refused_by_the_mma_sync_build():
    q = torch.zeros(1, 1, 4, 256, dtype=torch.float16, device="cuda")
    with pytest.raises(NotImplementedError, match="WGMMA build only"):
        stage8.attention_backward(q, q, q, q, q, torch.zeros(1, 1, 4, device="cuda"), wgmma=0)


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [96, 256])
@pytest.mark.parametrize("variant", [{}, {"softcap": 1, "window": True}, {"softcap": 2, "window": True}], ids=str)
def test_head_dims_96_and_256_compile_offline_without_spills(variant, D, dtype):
    """D 96's and D 256's kernels (the dK/dV kernel and the dQ pass, with the models' variants too,
    with the switches the launcher gives those: variant_switches) build for sm_90a without a GPU:
    no spills, no serialized wgmma."""
    from lib import nvrtc
    from stages.stage6_variants import Variants
    var = Variants(softcap=30.0 if variant else None, window=(8, 0) if variant else None,
                   softcap_build=variant.get("softcap", 0))
    cfg = stage8.config(D, wgmma=1, **variant, **stage8.variant_switches(D, var))
    compiled = nvrtc.compile_stage(stage8.WGMMA_SOURCE, arch="sm_90a", dtype=dtype, head_dim=D,
                                   defines={"STAGE8_OFFLINE_CHECK": 1, **dict(cfg["defines"])})
    use = compiled.resource_usage()
    assert set(use) == {"attention_backward", "attention_backward_dq"}, compiled.log[-2000:]
    for kernel, u in use.items():
        assert u["spill_stores"] == 0 and u["spill_loads"] == 0, (kernel, u)
    assert "serializ" not in compiled.log.lower(), compiled.log


@gpu
@pytest.mark.parametrize("entry", ["stage5", "stage6", "stage6-python", "stage8"])
def test_autograd_through_the_stages(entry, seed, monkeypatch):
    """attention() on inputs that require grad: an output with a grad_fn whose backward gives
    the reference's gradients; the same call under no_grad gives a plain output; a second
    backward through the gradients raises instead of returning something wrong. Stage 6's
    backward node is C++ on an H100/H200 (stages/autograd_node.py); "stage6-python" forces the
    Python autograd.Function (FA_AUTOGRAD_NODE=0)."""
    if entry.startswith("stage6") and not HOPPER:
        pytest.skip("stage 6 needs an sm_90 GPU (H100/H200)")
    monkeypatch.setenv("FA_AUTOGRAD_NODE", "0" if entry == "stage6-python" else "1")
    attend = {"stage5": partial(autograd.attention, forward=5), "stage6": partial(autograd.attention, forward=6),
              "stage6-python": partial(autograd.attention, forward=6), "stage8": stage8.attention}[entry]
    node = entry == "stage6"
    for causal in (False, True):
        q, k, v = make_qkv(2, 8, 75, 128, Sk=75, Hkv=2, dtype=torch.bfloat16, seed=seed)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = attend(*leaves, is_causal=causal)  # SDPA's keyword, as a port from SDPA writes it
        assert out.grad_fn is not None
        assert (out.grad_fn.name() == autograd_node.NODE_NAME) == node, out.grad_fn.name()
        dout = torch.randn_like(out)
        out.backward(dout)
        grads = [t.grad for t in leaves]
        for name, c in check_gradients(grads, q, k, v, dout, causal=causal).items():
            assert c.passed, f"{entry} {name} causal={causal} seed {seed}: {c.summary()}"
        with torch.no_grad():
            assert attend(*leaves, causal=causal).grad_fn is None
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = attend(*leaves)
    (g,) = torch.autograd.grad(out.sum(), leaves[0], create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


@gpu
def test_only_some_inputs_require_grad(seed):
    """A gradient only where one is asked for: k alone requires grad. dK does not go through
    atomics, so it is the same bits as a direct call of the backward, and it passes the rule."""
    q, k, v = make_qkv(1, 4, 50, 64, dtype=torch.float16, seed=seed)
    kq = k.clone().requires_grad_(True)
    out = autograd.attention(q, kq, v, forward=5, causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    stage5.attention(q, k, v, causal=True, lse=lse)
    grads = stage8.attention_backward(q, k, v, out.detach(), dout, lse, causal=True)
    assert torch.equal(kq.grad, grads[1])
    c = check_gradients(grads, q, k, v, dout, causal=True)["dk"]
    assert c.passed, f"seed {seed}: {c.summary()}"


@gpu
def test_bad_backward_inputs_are_refused():
    q, k, v, out, dout, lse = _run(1, 2, 2, 10, 10, 64, False, torch.float16, 1)
    with pytest.raises(ValueError, match="dout"):
        stage8.attention_backward(q, k, v, out, dout[:, :, :5], lse)
    with pytest.raises(ValueError, match="lse"):
        stage8.attention_backward(q, k, v, out, dout, lse[:, :1])
    with pytest.raises(ValueError, match="lse"):
        stage5.attention(q, k, v, lse=lse.double())


@gpu
def test_empty_inputs_give_empty_or_zero_gradients():
    q, k, v = make_qkv(1, 2, 0, 64, Sk=5, dtype=torch.float16)
    lse = torch.empty((1, 2, 0), device="cuda")
    dq, dk, dv = stage8.attention_backward(q, k, v, torch.empty_like(q), torch.empty_like(q), lse)
    assert dq.shape == q.shape and dk.shape == k.shape and not dk.any() and not dv.any()


@gpu
@pytest.mark.skipif(not HOPPER, reason="stage 6 needs an sm_90 GPU (H100/H200)")
def test_stage6_what_has_no_backward_is_refused():
    """Per-entry key lengths (seqlens_k) and packed sequences with grad: a clear error; a bad lse
    tensor: a clear error."""
    from lib.inputs import NoBackwardError, offsets_tensor
    q, k, v = make_qkv(2, 4, 20, 64, dtype=torch.float16)
    used = torch.tensor([5, 20], dtype=torch.int32, device="cuda")
    with pytest.raises(NoBackwardError, match="seqlens_k"):
        autograd.attention(q.clone().requires_grad_(True), k, v, forward=6, seqlens_k=used)
    with pytest.raises(NoBackwardError, match="stages.autograd.attention"):  # the forward alone
        stage6.attention(q.clone().requires_grad_(True), k, v)
    for bad in (torch.empty(2, 4, 20, device="cuda", dtype=torch.float64), torch.empty(2, 4, 19, device="cuda"),
                torch.empty(2, 4, 40, device="cuda")[..., ::2]):
        with pytest.raises(ValueError, match="lse"):
            stage6.attention(q, k, v, lse=bad)
    qp, kp, vp = (torch.randn(30, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    cu = offsets_tensor([0, 12, 30], "cuda")
    _packed_grad_refused_by_the_stage_not_by_autograd(stage6, qp, kp, vp, cu)


def _packed_grad_refused_by_the_stage_not_by_autograd(stage, q, k, v, cu):
    """The stage's own attention_varlen is the forward alone: grad refused, naming the
    composition; stages.autograd.attention_varlen on the same inputs gives an output with a
    grad_fn and finite gradients of every input."""
    from lib.inputs import NoBackwardError
    n = stage.INFO.number
    with pytest.raises(NoBackwardError, match=rf"attention_varlen.*stages\.autograd\.attention_varlen.*forward={n}"):
        stage.attention_varlen(q.clone().requires_grad_(True), k, v, cu, cu, 18, 18)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = autograd.attention_varlen(*leaves, cu, cu, 18, 18, forward=n, causal="bottom_right")
    assert out.grad_fn is not None and out.shape == q.shape
    out.backward(torch.randn_like(out))
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in leaves)


@gpu
def test_packed_sequences_with_grad_are_refused():
    """Stage 5's attention_varlen is the forward alone: a clear error, not a detached output;
    stages.autograd.attention_varlen trains on the same packed sequences."""
    from lib.inputs import offsets_tensor
    q, k, v = (torch.randn(30, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    cu = offsets_tensor([0, 12, 30], "cuda")
    _packed_grad_refused_by_the_stage_not_by_autograd(stage5, q, k, v, cu)


# Packed sequences with gradients (issue 48, item 4): stages.autograd.attention_varlen runs the
# forward stage and stage 8's backward one sequence at a time. Lengths (queries, keys) per
# sequence: odd lengths and partial tiles; an empty sequence; keys without queries; queries
# without keys (zero output and gradient); more queries than keys (bottom-right rows that see
# no key); one query; a sequence of many tiles.
VARLEN_LENS = [(37, 45), (0, 0), (0, 13), (5, 0), (70, 33), (1, 1), (129, 129), (3, 200)]


def _packed_leaves(lens, H, Hk, D, dtype, device, seed):
    from lib.reference import packed_inputs
    q, k, v, cu_q, cu_k = packed_inputs([a for a, _ in lens], [b for _, b in lens], H, Hk, D, dtype=dtype,
                                        device=device, seed=seed)
    return q, k, v, cu_q, cu_k


def _judge_packed_gradients(grads, q, k, v, dout, cu_q, cu_k, *, causal, label, judge=None):
    """Each sequence's rows of (dq, dk, dv) against float64 autograd of the reference on that
    sequence alone, as [1, H, S, D] views (check_gradients' rule, or `judge`); the rows of a
    sequence without queries or without keys must be exactly zero."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    dq, dk, dv = grads
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape, label
    for b in range(len(cq) - 1):
        (q0, q1), (k0, k1) = (cq[b], cq[b + 1]), (ck[b], ck[b + 1])
        if q1 == q0 or k1 == k0:
            for name, g, (a, z) in (("dq", dq, (q0, q1)), ("dk", dk, (k0, k1)), ("dv", dv, (k0, k1))):
                assert not g[a:z].any(), f"{label}: sequence {b} ({q1 - q0} queries, {k1 - k0} keys): {name} not zero"
            continue
        seq = lambda t, a, z: t[a:z].transpose(0, 1)[None]  # noqa: E731
        views = (seq(q, q0, q1), seq(k, k0, k1), seq(v, k0, k1))
        got = (seq(dq, q0, q1), seq(dk, k0, k1), seq(dv, k0, k1))
        if judge is not None:
            judge(got, *views, seq(dout, q0, q1), causal=causal, label=f"{label} sequence {b}")
            continue
        for name, c in check_gradients(got, *views, seq(dout, q0, q1), causal=causal).items():
            assert c.passed, f"{label}: sequence {b} ({q1 - q0} queries, {k1 - k0} keys) {name}: {c.summary()}"


@gpu
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("forward", [5, 6])
def test_packed_sequences_train(forward, D, causal, seed):
    """stages.autograd.attention_varlen with gradients: an output with a grad_fn, its rows each
    sequence's attention (the forward's rule), and dq, dk, dv per sequence against float64
    autograd of the reference (check_gradients), on fresh packed sequences with GQA 4:1 in
    both dtypes; zeros for sequences without queries or keys; under no_grad the stage's own
    varlen call, with no grad_fn."""
    from lib.reference import check_varlen_output
    if forward == 6 and not HOPPER:
        pytest.skip("stage 6 needs an sm_90 GPU (H100/H200)")
    for i, dtype in enumerate((torch.bfloat16, torch.float16)):
        q, k, v, cu_q, cu_k = _packed_leaves(VARLEN_LENS, 8, 2, D, dtype, "cuda", seed + i)
        max_q, max_k = (max(x[j] for x in VARLEN_LENS) for j in (0, 1))
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = autograd.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, forward=forward, causal=causal)
        assert out.grad_fn is not None and out.shape == q.shape and out.dtype == dtype
        label = f"stage {forward} D {D} {dtype} causal={causal} seed {seed + i}"
        for c in check_varlen_output(out.detach(), q, k, v, cu_q, cu_k, causal=causal):
            assert c.passed, f"{label}: output {c.summary()}"
        dout = torch.randn(out.shape, generator=torch.Generator(device="cuda").manual_seed(seed + 7 + i),
                           device="cuda", dtype=dtype)
        grads = torch.autograd.grad(out, leaves, dout)
        _judge_packed_gradients(grads, q, k, v, dout, cu_q, cu_k, causal=causal, label=label)
        with torch.no_grad():
            plain = autograd.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, forward=forward, causal=causal)
        assert plain.grad_fn is None
        for c in check_varlen_output(plain, q, k, v, cu_q, cu_k, causal=causal):
            assert c.passed, f"{label}: no_grad output {c.summary()}"


@gpu
def test_packed_sequences_train_from_strided_views(seed):
    """Packed q, k, v that are views (every other row of a larger tensor: strides of their own,
    read in place), and only k's larger tensor requiring grad: dk by the rule in k's rows, zeros
    in the rows between them and in the keys of a sequence without queries."""
    forward = 6 if HOPPER else 5
    lens = [(40, 40), (0, 7), (23, 61)]
    q, k, v, cu_q, cu_k = _packed_leaves(lens, 4, 4, 64, torch.bfloat16, "cuda", seed)
    wide = [torch.stack([t, torch.randn_like(t)], 1).flatten(0, 1) for t in (q, k, v)]
    wide[1].requires_grad_(True)
    qs, ks, vs = (t[::2] for t in wide)
    assert ks.stride(0) == 2 * 4 * 64 and torch.equal(ks, k) and torch.equal(qs, q)
    out = autograd.attention_varlen(qs, ks, vs, cu_q, cu_k, 40, 61, forward=forward, causal="top_left")
    assert out.grad_fn is not None
    dout = torch.randn_like(out)
    (dwide,) = torch.autograd.grad(out, wide[1], dout)
    assert not dwide[1::2].any()
    dk = dwide[::2]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    seq = lambda t, a, z: t[a:z].transpose(0, 1)[None]  # noqa: E731
    for b in (0, 2):
        views = (seq(q, cq[b], cq[b + 1]), seq(k, ck[b], ck[b + 1]), seq(v, ck[b], ck[b + 1]))
        got = (torch.zeros_like(views[0]), seq(dk, ck[b], ck[b + 1]), torch.zeros_like(views[2]))
        c = check_gradients(got, *views, seq(dout, cq[b], cq[b + 1]), causal="top_left")["dk"]
        assert c.passed, f"sequence {b} seed {seed}: {c.summary()}"
    assert not dk[ck[1]:ck[2]].any()


def fake_kernels(monkeypatch, calls=None):
    """Stage 5's forward and stage 8's backward replaced by PyTorch on any device (the forward:
    float64 reference attention, writing the log-sum-exp into `lse`; the backward:
    lib.reference.flash_backward in float64 from the saved output and log-sum-exp), and
    stages.autograd's varlen checks without the device check: the per-sequence composition of
    stages.autograd.attention_varlen then runs on the CPU. `calls` (a list) records each
    kernel call as ("forward" | "backward", q view)."""
    from functools import partial as bind

    from lib import inputs
    from lib.reference import attention_lse, flash_backward, reference_attention
    calls = [] if calls is None else calls

    def forward(q, k, v, *, causal=False, scale=None, lse=None, **options):
        assert not options, options
        assert lse is not None and lse.dtype == torch.float32 and lse.is_contiguous()
        assert tuple(lse.shape) == tuple(q.shape[:3]) and q.shape[0] == 1, (lse.shape, q.shape)
        calls.append(("forward", q))
        lse.copy_(attention_lse(q, k, causal=causal, scale=scale))
        return reference_attention(q, k, v, causal=causal, scale=scale).to(q.dtype)

    def backward(q, k, v, out, dout, lse, *, causal=False, scale=None, deterministic=False):
        calls.append(("backward", q))
        grads = flash_backward(q, k, v, out, dout, lse, causal=causal, scale=scale, dtype=torch.float64)
        return tuple(g.to(q.dtype) for g in grads)

    monkeypatch.setattr(stage5, "attention", forward)
    monkeypatch.setattr(stage8, "attention_backward", backward)
    monkeypatch.setattr(autograd, "validate_varlen", bind(inputs.validate_varlen, check_device=False))
    return calls


def _close_to_reference(grads, q, k, v, dout, *, causal, label):
    """Fake kernels compute in float64: each gradient within two bf16 roundings of the float64
    reference's (a wrong row, sequence or log-sum-exp is off by O(1))."""
    from lib.reference import reference_backward
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference_backward(q, k, v, dout, causal=causal)):
        err = float((got.double() - want).abs().max())
        assert err <= 2 * 2 ** -8 * (1 + float(want.abs().max())), f"{label} {name}: error {err:.3e}"


@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
def test_packed_sequences_train_one_sequence_at_a_time(monkeypatch, causal):
    """The composition of stages.autograd.attention_varlen on the CPU, with fake kernels: each
    sequence that has queries and keys is one forward and one backward call on [1, H, S, D]
    views of the packed tensors (no copies: pointers inside the packed q), with its own slice of
    the log-sum-exp; the gradients are the float64 reference's per sequence, zeros for the
    sequences without queries or keys; under no_grad it is the stage's own attention_varlen."""
    calls = fake_kernels(monkeypatch)
    q, k, v, cu_q, cu_k = _packed_leaves(VARLEN_LENS, 4, 2, 64, torch.bfloat16, "cpu", 11)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = autograd.attention_varlen(*leaves, cu_q, cu_k, 129, 200, forward=5, causal=causal)
    assert out.grad_fn is not None and out.shape == q.shape
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    out.backward(dout)
    both = [(a, b) for a, b in VARLEN_LENS if a and b]
    assert [c[0] for c in calls] == ["forward"] * len(both) + ["backward"] * len(both)
    cq = cu_q.tolist()
    starts = [cq[i] for i, (a, b) in enumerate(VARLEN_LENS) if a and b]
    item, row = q.element_size(), q.stride(0)
    for (kind, view), start, (a, _) in zip(calls, starts * 2, both * 2):
        assert view.shape == (1, 4, a, 64) and view.stride()[1:] == (64, row, 1), (kind, view.stride())
        assert view.data_ptr() == leaves[0].data_ptr() + start * row * item, kind  # a view, not a copy
    grads = [t.grad for t in leaves]
    label = f"causal={causal}"
    _judge_packed_gradients(grads, q, k, v, dout, cu_q, cu_k, causal=causal, label=label,
                            judge=lambda got, *a, label, **kw: _close_to_reference(got, *a, label=label, **kw))
    assert not out[cq[3]:cq[4]].any()  # queries without keys: zero output
    varlen_calls = []
    monkeypatch.setattr(stage5, "attention_varlen", lambda *a, **kw: varlen_calls.append(kw) or a[0].detach())
    with torch.no_grad():
        autograd.attention_varlen(*leaves, cu_q, cu_k, 129, 200, forward=5, causal=causal)
    autograd.attention_varlen(q, k, v, cu_q, cu_k, 129, 200, forward=5, causal=causal)  # nothing requires grad
    assert varlen_calls == [{"causal": causal, "scale": None}] * 2


def test_packed_sequences_with_grad_bad_arguments(monkeypatch):
    """With gradients, attention_varlen's arguments are checked as the stage checks them, before
    anything runs: the forward stage, causal=True (ambiguous), offsets that do not fit, a
    max_seqlen below the longest; with no sequences at all the output and gradients are empty."""
    calls = fake_kernels(monkeypatch)
    q, k, v, cu_q, cu_k = _packed_leaves([(5, 7), (3, 2)], 2, 2, 64, torch.bfloat16, "cpu", 1)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    with pytest.raises(ValueError, match="forward must be one of"):
        autograd.attention_varlen(*leaves, cu_q, cu_k, 5, 7, forward=4)
    with pytest.raises(TypeError, match="top_left"):
        autograd.attention_varlen(*leaves, cu_q, cu_k, 5, 7, forward=5, causal=True)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        autograd.attention_varlen(*leaves, cu_k, cu_k, 5, 7, forward=5)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        autograd.attention_varlen(*leaves, cu_q, cu_k, 5, 6, forward=5)
    with pytest.raises(ValueError, match="rank 3"):
        autograd.attention_varlen(*(t[None] for t in leaves), cu_q, cu_k, 5, 7, forward=5)
    assert calls == []
    empty = [t[:0].detach().requires_grad_(True) for t in (q, k, v)]
    zero = torch.zeros(1, dtype=torch.int32)
    out = autograd.attention_varlen(*empty, zero, zero, 0, 0, forward=5)
    assert out.shape == (0, 2, 64) and out.grad_fn is not None
    grads = torch.autograd.grad(out, empty, torch.zeros_like(out))
    assert [g.shape for g in grads] == [t.shape for t in empty] and calls == []


def test_launch_arguments_match_kernel_signature(monkeypatch):
    """What attention_backward passes has the count and sizes of both kernels' parameters (read
    from the cubin, no GPU): pointers, sizes, scale, causal, heads and four tensors' strides —
    q's and dout's own (a strided dout is read in place too)."""
    from lib import inputs, nvrtc
    from test_stages import _arg_size, _param_sizes
    launches = []
    monkeypatch.setattr(stage8, "_launches", {})  # no plan of real kernels from an earlier test, none left behind
    monkeypatch.setattr(stage8, "validate_cached", lambda *a, **kw: inputs.validate(*a, **kw, check_device=False))
    monkeypatch.setattr(nvrtc, "stage_kernels", lambda source, names, *a, **kw: {k: k for k in names})
    monkeypatch.setattr(nvrtc, "launch_prepared", lambda kernel, config, params: launches.append((config, params)))
    for cached in (stage8._kernels, stage8._preprocess_kernel):  # no fake kernel left for later tests
        cached.cache_clear()
        monkeypatch.setattr(stage8, cached.__name__, cached.__wrapped__)
    q, k, v = make_qkv(2, 4, 40, 64, Sk=33, Hkv=2, dtype=torch.float16, device="cpu")
    q = q.transpose(1, 2).contiguous().transpose(1, 2)
    dout = torch.randn(2, 40, 4, 64, dtype=torch.float16).transpose(1, 2)
    # the mma.sync build, whose kernels _param_sizes reads (on an H100 the default is the WGMMA
    # build, whose launch takes tensor maps of the device tensors)
    stage8.attention_backward(q, k, v, torch.randn_like(q), dout, torch.zeros(2, 4, 40), causal=True, wgmma=0)
    (pre_config, pre_params), (config, params), (dq_config, dq_params) = launches
    want = _param_sizes(stage8, torch.float16, 64)
    assert [_arg_size(a) for a in pre_params] == want["attention_backward_preprocess"]
    stage8.postprocess(torch.zeros(2, 4, 64, 64), 40, torch.float16)  # the WGMMA build's, after bulk reductions
    assert [_arg_size(a) for a in launches[-1][1]] == want["attention_backward_postprocess"]
    assert pre_params[0] == dout.data_ptr() and [int(s) for s in pre_params[-3:]] == list(dout.stride()[:3])
    assert [_arg_size(a) for a in params] == want["attention_backward"]
    assert [_arg_size(a) for a in dq_params] == want["attention_backward_dq"]
    assert params[3] == dout.data_ptr() and [int(s) for s in params[-3:]] == list(dout.stride()[:3])
    assert params[6] == 0  # no float32 dQ sum: the dQ pass writes dQ itself
    assert config.grid == (-(-33 // stage8.TILES[64][0]) * 2 * 2, 1, 1)
    assert dq_config.grid == (-(-40 // stage8.DQ_ROWS) * 2 * 4, 1, 1)
    # The same layout again, new tensors: the plan made by the first call, this call's pointers
    launches.clear()
    q2, dout2 = q.clone(), torch.randn_like(dout)
    assert len(stage8._launches) == 1
    stage8.attention_backward(q2, k, v, torch.randn_like(q2), dout2, torch.zeros(2, 4, 40), causal=True, wgmma=0)
    assert len(stage8._launches) == 1 and len(launches) == 3
    (_, pre2), (_, params2), _ = launches
    assert pre2[0] == dout2.data_ptr() and params2[0] == q2.data_ptr() and params2[3] == dout2.data_ptr()
    assert pre2[6:] == pre_params[6:] and params2[9:] == params[9:]  # the scalars: the plan's


def test_gradient_of_another_dtype_is_refused(monkeypatch):
    """A dout in another dtype than q would be read as q's element type by the kernels (garbage,
    silently): refused with a TypeError naming it, before anything runs."""
    from lib import inputs
    monkeypatch.setattr(stage8, "validate_cached", lambda *a, **kw: inputs.validate(*a, **kw, check_device=False))
    q, k, v = make_qkv(1, 2, 10, 64, dtype=torch.bfloat16, device="cpu")
    out, lse = torch.zeros_like(q), torch.zeros(1, 2, 10)
    with pytest.raises(TypeError, match="dout"):
        stage8.attention_backward(q, k, v, out, torch.zeros(q.shape), lse)
    with pytest.raises(TypeError, match="out"):
        stage8.attention_backward(q, k, v, out.half(), torch.zeros_like(q), lse)



# Run in a fresh process (a context bound by an earlier test would hide the bug). Each step does
# its launches on a thread that has never bound a CUDA context: autograd's own backward thread,
# and a plain new Python thread; issue 48 reproduced CUDA_ERROR_INVALID_CONTEXT both ways.
_FRESH_THREAD_SCRIPT = r'''
import sys, threading
import torch
from lib.inputs import make_qkv
from lib.reference import check_gradients
from stages import autograd, autograd_node, stage2, stage3, stage4, stage5, stage6, stage8
seed, hopper = int(sys.argv[1]), sys.argv[2] == "1"
fwd = 6 if hopper else 5
q, k, v = make_qkv(2, 4, 70, 64, Sk=90, Hkv=2, dtype=torch.bfloat16, seed=seed)
dout = torch.randn_like(q)

def check(grads, label):
    for name, c in check_gradients(grads, q, k, v, dout, causal=False).items():
        assert c.passed, f"{label} {name} seed {seed}: {c.summary()}"

# (a) a direct backward call on this thread, then a backward through autograd (its own thread)
lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
out = stage5.attention(q, k, v, lse=lse)
check(stage8.attention_backward(q, k, v, out, dout, lse), "a direct call")
leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
out = autograd.attention(*leaves, forward=fwd)
want = autograd_node.NODE_NAME if hopper and autograd_node.enabled() else "_AttentionBackward"
assert out.grad_fn.name() == want, (out.grad_fn.name(), want, autograd_node.route(*leaves))
out.backward(dout)
check([t.grad for t in leaves], f"autograd after a direct call (stage {fwd}, {want})")
# (b) forward calls of stages 2-4, then torch.autograd.grad through stage 5
for s in (stage2, stage3, stage4):
    s.attention(q, k, v)
leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
check(torch.autograd.grad(autograd.attention(*leaves, forward=5), leaves, dout), "autograd.grad (stage5)")
# (c) forward and backward on a new Python thread
box = {}
def step():
    try:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        autograd.attention(*leaves, forward=fwd).backward(dout)
        box["grads"] = [t.grad for t in leaves]
    except BaseException as e:
        box["error"] = e
t = threading.Thread(target=step)
t.start(); t.join()
if "error" in box:
    raise box["error"]
check(box["grads"], "a new thread")
# (d) the mechanism itself: a thread whose context was unbound (cuCtxSetCurrent(NULL)) launches
# stage 8's whole backward before anything else could bind one; the runtime calls torch makes
# (allocations, its own kernels) bind the primary context implicitly, which is why (a)-(c) can
# pass without the fix on some machines
from cuda.bindings import driver
lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
out = stage5.attention(q, k, v, lse=lse)
torch.cuda.synchronize()
def on_a_bare_thread(backward, what):
    """`backward()` on a new thread whose context was unbound (cuCtxSetCurrent(NULL)), checked."""
    def run():
        try:
            (err,) = driver.cuCtxSetCurrent(driver.CUcontext(0))
            assert err == driver.CUresult.CUDA_SUCCESS, err
            box["bare"] = backward()
            torch.cuda.synchronize()
        except BaseException as e:
            box["error"] = e
    t = threading.Thread(target=run)
    t.start(); t.join()
    if "error" in box:
        raise box["error"]
    check(box["bare"], what)
on_a_bare_thread(lambda: stage8.attention_backward(q, k, v, out, dout, lse), "a thread without a context")
if want == autograd_node.NODE_NAME:  # the node's own backward (its plan, no autograd) on such a thread
    plan = autograd_node.plan_for(q, k, v)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = stage6.attention(q, k, v, lse=lse)
    torch.cuda.synchronize()
    on_a_bare_thread(lambda: autograd_node.backward(plan, q, k, v, out, dout, lse),
                     "the node's plan on a thread without a context")
print("fresh-thread backward ok")
'''


@gpu
@pytest.mark.parametrize("path", ["node", "python"])
def test_backward_on_a_thread_without_a_context(seed, path):
    """Issue 48's crash: launches on a thread where no CUDA context is bound yet (autograd's
    backward thread, a new Python thread) bind the device's primary context first. On an
    H100/H200 stage 6's backward is the C++ node ("node": stages/stage8_node.cpp binds the
    context itself) or the Python autograd.Function ("python": FA_AUTOGRAD_NODE=0)."""
    import subprocess
    import sys
    from pathlib import Path
    if path == "node" and not HOPPER:
        pytest.skip("the C++ node runs on an sm_90 GPU (H100/H200); the python case covers this GPU")
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", _FRESH_THREAD_SCRIPT, str(seed), "1" if HOPPER else "0"],
                       cwd=root, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "PYTHONPATH": str(root),
                            "FA_AUTOGRAD_NODE": "1" if path == "node" else "0"})
    assert r.returncode == 0 and "fresh-thread backward ok" in r.stdout, r.stdout[-3000:] + r.stderr[-5000:]


# FlashAttention-3's own backward cases (hopper/test_flash_attn.py): batch 9, 6 query heads as MHA,
# GQA 3:1 and MQA, inputs made as [B, S, H, D] and passed as views, causal bottom-right or not,
# judged by its rule (lib.reference.fa3_gradient_rule) beside this curriculum's float64 rule. Issue
# 52 reported dV failing FA3's rule at Sq 239, Sk 1 with grouped heads; measured on the H200
# (experiments/gqa_one_key_backward/) stage 8's dV there is the once-rounded sum (error 0), and it
# is the 16-bit baseline that is off by 4 units in the last place.
FA3_SEQLENS = [(239, 1), (1, 239), (113, 203), (3, 799)]


@gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [(6, 6), (6, 2), (6, 1)], ids=["mha", "gqa3", "mqa"])
@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_flashattention3s_backward_cases(D, dtype, heads, causal, seed):
    from lib.reference import fa3_gradient_rule
    forward = 6 if HOPPER else 5
    H, Hk = heads
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for Sq, Sk in FA3_SEQLENS:
        q, k, v = (torch.randn(9, S, h, D, generator=gen).to("cuda", dtype).requires_grad_()
                   for S, h in ((Sq, H), (Sk, Hk), (Sk, Hk)))
        out = autograd.attention(*(t.transpose(1, 2) for t in (q, k, v)), forward=forward,
                                 causal=causal).transpose(1, 2)
        g = torch.randn(out.shape, generator=gen).to("cuda", dtype)
        grads = torch.autograd.grad(out, (q, k, v), g)
        views = [t.detach().transpose(1, 2) for t in (q, k, v)]
        dout, grads = g.transpose(1, 2), [t.transpose(1, 2) for t in grads]
        label = f"Sq {Sq} Sk {Sk} H {H}/{Hk} D {D} {dtype} causal={causal} seed {seed}"
        for name, (err, allow) in fa3_gradient_rule(grads, *views, dout, causal=causal).items():
            assert err <= allow, f"{label}: {name} error {err:.4g} > FA3's allowance {allow:.4g}"
        for name, c in check_gradients(grads, *views, dout, causal=causal).items():
            assert c.passed, f"{label}: {name} {c.summary()}"


# ---- DS_GUARD: the dSᵀ store ordered after the step before's dQ product ----------------------
# the builds whose dQ product reads both warpgroups' dSᵀ: the stage's at D 64 (dQ in turns) and at
# D 128 (two warpgroups splitting D), with and without the producer warpgroup
GUARDED = [(64, {}), (128, {}), (64, {"producer": 0}), (128, {"producer": 0})]


def _guarded_build(D, dtype, extra):
    from lib import nvrtc
    cfg = stage8.config(D, wgmma=1, ds_guard=1, **extra)
    return nvrtc.compile_stage(stage8.WGMMA_SOURCE, arch="sm_90a", dtype=dtype, head_dim=D,
                               defines={"STAGE8_OFFLINE_CHECK": 1, **dict(cfg["defines"])})


@compile_cases("D,extra,dtype", [(D, e, dt) for D, e in GUARDED for dt in (torch.float16, torch.bfloat16)],
               keep=lambda c: True, build=lambda D, extra, dtype: _guarded_build(D, dtype, extra))
def test_ds_guard_compiles_offline(D, extra, dtype):
    """DS_GUARD adds named barriers 4 and 5 to the dK/dV kernel (a wait before the dSᵀ store, an
    arrival after the dQ product) and nothing that spills; it is on in the stage's builds at both
    head dims and off where a call's switches leave nothing to guard; builds with nothing to guard
    that ask for it are refused."""
    from conftest import assert_no_local_memory
    from lib.sass import sass_text
    assert dict(stage8.config(D, wgmma=1)["defines"])["DS_GUARD"] == 1
    assert dict(stage8.config(D, wgmma=1, warpgroups=1)["defines"])["DS_GUARD"] == 0
    compiled = _guarded_build(D, dtype, extra)
    assert_no_local_memory(compiled, ("attention_backward",), (D, extra, dtype))
    body = sass_text(compiled.cubin).split("Function : attention_backward\n")[-1].split("Function : ")[0]
    lines = body.splitlines()
    assert any("BAR.SYNC" in line for line in lines), "no barrier wait"
    assert any("BAR.ARV" in line for line in lines), "no barrier arrival"
    with pytest.raises(ValueError, match="ds_guard=1"):
        stage8.config(D, None, 0, 1, ds_guard=1)  # the dQ pass: no dSᵀ exchange to guard
    with pytest.raises(ValueError, match="ds_guard=1"):
        stage8.config(D, wgmma=1, warpgroups=1, ds_guard=1)  # one warpgroup reads only its own dSᵀ


@gpu
@pytest.mark.parametrize("extra", [{}, {"producer": 0}], ids=["stage", "no-producer"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_ds_guard_matches_and_equals_unguarded(shape, extra, seed):
    """With DS_GUARD the gradients pass the rule against float64 autograd, and dK and dV are the
    unguarded build's bits (the same products in the same order; a barrier changes no arithmetic)."""
    if not stage8.wgmma_here():
        pytest.skip("the WGMMA build needs sm_90")
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v, out, dout, lse = _run(*shape, torch.bfloat16, seed)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, ds_guard=1, **extra)
    for name, c in check_gradients(grads, q, k, v, dout, causal=causal).items():
        assert c.passed, f"{name} {shape} {extra} seed {seed}: {c.summary()}"
    plain = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, ds_guard=0, **extra)
    assert torch.equal(grads[1], plain[1]) and torch.equal(grads[2], plain[2]), f"{shape} {extra} seed {seed}"


# ---- LONGEST_FIRST: causal key blocks handed out longest first across a section's heads ---------
# (B, H, Hk, Sq, Sk, D): S 8192 at D 128 makes sections of 4 heads (Q, dO and dQ 8 MB a head), so
# 6 heads leave the last section part-full; GQA 3:1 with 5 K/V heads; D 64 with Sk > Sq (bottom-
# right) and a short ragged S
LONGEST_FIRST_SHAPES = [(1, 6, 6, 8192, 8192, 128), (1, 15, 5, 4500, 4500, 64), (3, 4, 2, 333, 1000, 128),
                        (2, 3, 3, 200, 77, 64)]


def test_longest_first_config():
    """LONGEST_FIRST is a switch a call may flip, changing no other define; on in D 64's, 96's and
    128's builds, off in D 256's; a call that leaves it unsaid turns it off without grouped heads
    below LONGEST_FIRST_MIN_SQ query rows and keeps the build's otherwise."""
    for D in (64, 96, 128, 256):
        flipped = dict(stage8.config(D, wgmma=1, longest_first=1)["defines"])
        assert flipped == {**dict(stage8.config(D, wgmma=1, longest_first=0)["defines"]), "LONGEST_FIRST": 1}
    assert [stage8.WGMMA_BUILD[D]["LONGEST_FIRST"] for D in (64, 96, 128, 256)] == [1, 1, 1, 0]
    n = stage8.LONGEST_FIRST_MIN_SQ
    assert stage8.longest_first(n - 1, 1) == 0 and stage8.longest_first(512, 1) == 0
    assert stage8.longest_first(n, 1) is None and stage8.longest_first(512, 4) is None
    assert stage8.longest_first(n - 1, 2) is None


@gpu
@pytest.mark.parametrize("causal", [1, 2], ids=["top-left", "bottom-right"])
@pytest.mark.parametrize("shape", LONGEST_FIRST_SHAPES, ids=str)
def test_longest_first_equals_head_by_head(shape, causal, seed):
    """The order blocks start in changes no block's sums: dK and dV are head by head's bits, dQ
    (float32 additions in another order) within a few ulps of its largest value, and the gradients
    pass the rule against float64 autograd on a slice of the heads."""
    if not stage8.wgmma_here():
        pytest.skip("the WGMMA build needs sm_90")
    B, H, Hk, Sq, Sk, D = shape
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=torch.bfloat16, device="cuda", seed=seed)
    dout = torch.randn_like(q)
    mode = "bottom_right" if causal == 2 else True
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = stage5.attention(q, k, v, causal=mode, lse=lse)
    first = stage8.attention_backward(q, k, v, out, dout, lse, causal=mode, longest_first=1)
    plain = stage8.attention_backward(q, k, v, out, dout, lse, causal=mode, longest_first=0)
    assert torch.equal(first[1], plain[1]) and torch.equal(first[2], plain[2]), f"{shape} {mode} seed {seed}"
    gap = (first[0].float() - plain[0].float()).abs().max().item()
    assert gap <= 2 ** -6 * plain[0].float().abs().max().item(), f"dq {gap} {shape} {mode} seed {seed}"
    g = H // Hk  # one K/V head and its query heads
    sl = [t[:1, :g].contiguous() for t in (q, dout)] + [t[:1, :1].contiguous() for t in (k, v)]
    lse_s = torch.empty(sl[0].shape[:3], dtype=torch.float32, device="cuda")
    out_s = stage5.attention(sl[0], sl[2], sl[3], causal=mode, lse=lse_s)
    grads = stage8.attention_backward(sl[0], sl[2], sl[3], out_s, sl[1], lse_s, causal=mode, longest_first=1)
    for name, c in check_gradients(grads, sl[0], sl[2], sl[3], sl[1], causal=mode).items():
        assert c.passed, f"{name} {shape} {mode} seed {seed}: {c.summary()}"


# ---- deterministic=True: the same bits every run (dQ by its own pass) -------------------------

def test_deterministic_is_the_dq_pass(monkeypatch):
    """attention_backward(deterministic=True) runs the dQ pass (dq_atomics=0), refuses dq_atomics=1
    and anything but a bool; stages.autograd takes it to stage 8's Python Function (not the C++
    node), whose backward then asks for the dQ pass; varlen passes it to every sequence's backward.
    (Checked on the host: the kernels are replaced by a recorder.)"""
    seen = []

    def fake_backward(q, k, v, out, dout, lse, **kw):
        seen.append(kw)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(stage8, "_backward", fake_backward)
    q = torch.randn(1, 2, 5, 64)
    k = v = torch.randn(1, 2, 7, 64)
    lse = torch.zeros(1, 2, 5)
    stage8.attention_backward(q, k, v, q, q, lse, deterministic=True)
    assert seen[-1]["dq_atomics"] == 0
    stage8.attention_backward(q, k, v, q, q, lse)
    assert seen[-1]["dq_atomics"] is None  # the stage's build
    with pytest.raises(ValueError, match="dq_atomics=1 contradicts"):
        stage8.attention_backward(q, k, v, q, q, lse, deterministic=True, dq_atomics=1)
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="deterministic must be True or False"):
            stage8.attention_backward(q, k, v, q, q, lse, deterministic=bad)
        with pytest.raises(ValueError, match="deterministic must be True or False"):
            autograd.attention(q, k, v, deterministic=bad)

    # the Python Function: a forward that writes lse, the recorder as the backward
    def forward(q, k, v, *, causal, scale, lse, **variants):
        lse.zero_()
        return q.detach().clone()

    for det in (False, True):
        qg = q.clone().requires_grad_()
        stage8.with_grad(forward, qg, k, v, causal=False, scale=None, deterministic=det).sum().backward()
        assert seen[-1].get("dq_atomics") == (0 if det else None), (det, seen[-1])
    qg = q.clone().requires_grad_()
    stage8.with_grad(forward, qg, k, v, causal=False, scale=None, window=(3, 0), deterministic=True).sum().backward()
    assert seen[-1]["dq_atomics"] == 0


@gpu
@pytest.mark.parametrize("shape", [(2, 4, 2, 300, 1000, 64, False), (1, 8, 8, 700, 700, 128, True),
                                   (1, 16, 4, 129, 2049, 128, "bottom_right")], ids=str)
def test_deterministic_backward_is_the_same_bits_every_run(shape, seed):
    """deterministic=True: gradients within the rule against float64 autograd, and dq, dk, dv the
    same bits on three runs, directly and through stages.autograd (many key blocks add into each
    dQ row, where the stage's build sums them in the order the blocks arrive)."""
    if not stage8.wgmma_here():
        pytest.skip("the WGMMA build needs sm_90")
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v, out, dout, lse = _run(*shape, torch.bfloat16, seed)
    runs = [stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, deterministic=True) for _ in range(3)]
    for name, c in check_gradients(runs[0], q, k, v, dout, causal=causal).items():
        assert c.passed, f"{name} {shape} seed {seed}: {c.summary()}"
    for again in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], again)), f"{shape} seed {seed}"
    grads = []
    for _ in range(2):
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        autograd.attention(qg, kg, vg, causal=causal, deterministic=True).backward(dout)
        grads.append((qg.grad, kg.grad, vg.grad))
    assert all(torch.equal(a, b) for a, b in zip(*grads)), f"autograd {shape} seed {seed}"
