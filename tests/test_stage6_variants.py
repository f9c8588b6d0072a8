"""Stage 6's model variants (issue 51: stages/stage6_variants.py, the SOFTCAP, WINDOW and SINKS
switches of stages/stage6.cu): the arguments checked, the builds chosen and compiled (offline,
no GPU), the build without any variant unchanged, and (GPU) each variant and combinations against
the float64 reference by the error rule (lib.reference.check_output with the same variant)."""
import math
from operator import itemgetter

import numpy as np
import pytest
import torch

import stages.stage6 as s6
import stages.stage6_variants as sv
from conftest import compile_cases, cpu_only, gpu
from lib.inputs import make_qkv, poisoned_outputs
from lib.reference import check_output
from lib.sass import instruction_mix, sass_text
from lib.simulator import HAS_GPU

on_hopper = pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability() != (9, 0),
                               reason="stage 6 needs an sm_90 GPU (H100/H200)")
SERIALIZING = __import__("re").compile(r"C75(08|10|11|12|15)|wgmma.*serializ", __import__("re").I)
VARIANT_DEFINES = ("SOFTCAP", "WINDOW", "SINKS")


# --------------------------------------------------------------------------------------------
# the arguments

def _qkv(B=1, H=4, Sq=70, Sk=90, D=64, Hkv=2, dtype=torch.float16):
    return make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, device="cpu")


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.inf, math.nan, True, "5", [5.0]])
def test_softcap_refused_unless_finite_and_positive(bad):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="softcap must be a finite number > 0"):
        s6.attention(q, k, v, softcap=bad)


def test_softcap_tanh_choice_checked():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="softcap_tanh must be one of"):
        s6.attention(q, k, v, softcap=5.0, softcap_tanh="fast")
    with pytest.raises(ValueError, match="give softcap too"):
        s6.attention(q, k, v, softcap_tanh="approx")
    assert sv.softcap_build(torch.float16) == sv.SOFTCAP_TANH[torch.float16]
    assert sv.softcap_build(torch.bfloat16, "exp2") == 2 and sv.softcap_build(torch.float16, "approx") == 1


def test_variants_normalised():
    q = _qkv()[0]
    assert sv.check_variants(q) is sv.NONE and not sv.NONE.any
    assert sv.check_variants(q, window=(-1, -1)) is sv.NONE  # no bound on either side: no window
    v = sv.check_variants(q, softcap=30)
    assert v.softcap == 30.0 and isinstance(v.softcap, float) and v.window is None and not v.sinks
    assert v.softcap_build == sv.SOFTCAP_TANH[torch.float16]
    assert sv.finite_window((-1, 0), 70, 90) == (90, 0) and sv.finite_window((5, -1), 70, 90) == (5, 70)
    assert sv.finite_window((10**9, 10**9), 70, 90) == (90, 70)


def test_softcap_args_put_the_cap_in_the_softmax_units():
    """What the kernel computes from cap_mul and cap_log2 (stages/stage6.cu: cap_scores, then the
    softmax's exp2(t·scale_log2 − base)) is c·tanh(s / c)·log2 e for s = q·k·scale, both tanh forms,
    any sign of scale (the kernel flips Q for a negative one and takes |scale|)."""
    raw = torch.linspace(-300, 300, 2001, dtype=torch.float64)  # q·k
    for scale in (0.125, 1 / math.sqrt(128), -0.125, 0.0):
        for c in (0.5, 5.0, 50.0):
            want = c * torch.tanh(raw * abs(scale) / c) * math.log2(math.e)
            for build, tanh in ((1, torch.tanh), (2, lambda x: 1 - 2 / (torch.exp2(x) + 1))):
                mul, log2c = s6.softcap_args(sv.Variants(softcap=c, softcap_build=build), scale)
                assert isinstance(mul, np.float32) and isinstance(log2c, np.float32)
                got = tanh(raw * float(mul)) * float(log2c)
                assert (got - want).abs().max() < 1e-5 * c, (scale, c, build)


# --------------------------------------------------------------------------------------------
# the builds

def test_default_defines_have_no_variant_switch():
    for D in (64, 128):
        for cfg in (s6.config(D), s6.config(D, schedule="+ work queue"), s6.config(D, pack_gqa=True,
                    tiles=s6.DECODE_TILES[D], schedule=s6.DECODE_SCHEDULE), s6.config(D, seqs=True)):
            assert not set(dict(cfg["defines"])) & set(VARIANT_DEFINES), cfg["defines"]
    base = s6.config(64)["defines"]
    assert s6.config(64, softcap=2)["defines"] == base + (("SOFTCAP", 2),)
    with pytest.raises(ValueError, match="SOFTCAP build"):
        s6.config(64, softcap=3)


def _plan_env(monkeypatch):
    """stage 6's launcher without a GPU (as tests/test_stage6.py's plan tests): what it would
    compile and launch, recorded."""
    from lib import inputs
    built, launched = [], []
    monkeypatch.setattr(s6, "_plans", {})
    monkeypatch.setattr(s6, "_check_arch", lambda q: None)
    monkeypatch.setattr(s6, "_kernel", lambda dtype, D, cfg: built.append(dict(cfg["defines"])) or ("kernel", "combine"))
    monkeypatch.setattr(s6, "_sm_count", lambda d: 132)
    monkeypatch.setattr(s6, "_queue", lambda plan, device: 0)
    monkeypatch.setattr(s6, "tensor_map", lambda t, rows: object())
    monkeypatch.setattr(s6, "_partials", lambda plan, device: (1111, 2222, 0))
    monkeypatch.setattr(s6, "validate_cached", lambda *a, **kw: inputs.validate(*a, **kw, check_device=False))
    monkeypatch.setattr(s6.nvrtc, "launch_prepared", lambda kernel, config, params: launched.append((kernel, params)))
    return built, launched


def test_softcap_plan_and_launch_on_the_cpu(monkeypatch):
    built, launched = _plan_env(monkeypatch)
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _qkv(dtype=dtype)
        s6.attention(q, k, v, causal=True)
        n_plain = len(launched[-1][1])
        assert not set(built[-1]) & set(VARIANT_DEFINES)
        s6.attention(q, k, v, causal=True, softcap=20.0)
        assert built[-1]["SOFTCAP"] == sv.SOFTCAP_TANH[dtype] and "WINDOW" not in built[-1]
        params = launched[-1][1]
        assert len(params) == n_plain + 5  # cap_mul, cap_log2, win_left, win_right, sinks
        mul, log2c, left, right, sinks = params[-5:]
        scale = 64 ** -0.5
        want_mul = scale / 20.0 * (2 * math.log2(math.e) if sv.SOFTCAP_TANH[dtype] == 2 else 1)
        assert float(mul) == pytest.approx(want_mul, rel=1e-6) and float(log2c) == pytest.approx(20 * math.log2(math.e))
        assert (int(left), int(right), sinks) == (90, 70, 0)  # no window: every key, no sinks
        n_plans = len(s6._plans)
        s6.attention(q, k, v, causal=True, softcap=20.0)  # the same plan again
        other = "approx" if sv.SOFTCAP_TANH[dtype] == 2 else "exp2"
        s6.attention(q, k, v, causal=True, softcap=20.0, softcap_tanh=other)  # the other tanh: another build
        assert len(s6._plans) == n_plans + 1 and built[-1]["SOFTCAP"] == sv.SOFTCAP_TANH_NAMES[other]


# Each variant's build of the launch the head dim runs by default (its tiles as variant_tiles
# gives them), and all three together: none may spill. Every build the launcher runs, with and
# without each variant: experiments/model_variants/variant_builds.py (experiments/model_variants/branch_notes.md's table).
VARIANT_BUILDS = [(D, dtype, name) for D in (64, 128) for dtype in (torch.float16, torch.bfloat16)
                  for name in ("softcap approx", "softcap exp2", "window", "sinks", "all three")]


def _variants_named(name, dtype):
    return {"softcap approx": sv.Variants(softcap=5.0, softcap_build=1),
            "softcap exp2": sv.Variants(softcap=5.0, softcap_build=2),
            "window": sv.Variants(window=(100, 0)), "sinks": sv.Variants(sinks=True),
            "all three": sv.Variants(softcap=5.0, window=(100, 0), sinks=True,
                                     softcap_build=sv.softcap_build(dtype))}[name]


def _variant_build(D, dtype, name):
    var = _variants_named(name, dtype)
    (c,) = s6.compile_for(s6.ARCH, dtype, D, tiles=sv.variant_tiles(s6.TILES[D], var), softcap=var.softcap_build,
                          window=var.window is not None, sinks=var.sinks).values()
    return c


@cpu_only  # reads ptxas's log
@compile_cases("D,dtype,name", VARIANT_BUILDS, ids=[f"D{D}-{str(dt)[6:]}-{n.replace(' ', '_')}" for D, dt, n in VARIANT_BUILDS],
               build=_variant_build)
def test_variant_builds_compile_without_spills(D, dtype, name):
    c = _variant_build(D, dtype, name)
    assert not SERIALIZING.search(c.log), c.log
    for kernel, usage in c.resource_usage().items():
        assert usage["spill_stores"] == 0 and usage["stack_bytes"] == 0, (kernel, usage)
    sass = sass_text(c.cubin)
    mix = instruction_mix(sass)
    assert mix["HGMMA"] > 0 and mix["USETMAXREG"] > 0 and mix["LDL"] == 0 and mix["STL"] == 0, mix
    var = _variants_named(name, dtype)
    assert ("MUFU.TANH" in sass) == (var.softcap_build == 1)


@cpu_only  # reads the SASS of two builds
@pytest.mark.parametrize("D", [64, 128])
def test_switches_off_are_the_build_without_them(D):
    """Each variant define at 0 compiles to exactly the SASS of the build without it: the #if's
    that add the variants leave nothing behind when off (the build the launcher runs without a
    variant has none of the defines: test_default_defines_have_no_variant_switch)."""
    from lib import nvrtc
    defines = dict(s6.config(D)["defines"])
    plain = nvrtc.compile_stage(s6.SOURCE, arch=s6.ARCH, dtype=torch.float16, head_dim=D, defines=defines)
    off = nvrtc.compile_stage(s6.SOURCE, arch=s6.ARCH, dtype=torch.float16, head_dim=D,
                              defines={**defines, **{n: 0 for n in VARIANT_DEFINES}})
    assert sass_text(plain.cubin) == sass_text(off.cubin)


def _sinks(H, device="cpu"):
    return torch.randn(H, dtype=torch.float32, device=device) * 2


@pytest.mark.parametrize("make, what", [
    (lambda q: torch.zeros(q.shape[1], dtype=torch.float16), "float16"),
    (lambda q: torch.zeros(q.shape[1] + 1), "shape"),
    (lambda q: torch.zeros(q.shape[1], 2)[:, 0], "non-contiguous"),
    (lambda q: torch.zeros(1, q.shape[1]), "2-D"),
    (lambda q: [0.0] * q.shape[1], "a list"),
    (lambda q: torch.zeros(q.shape[1], device="meta"), "another device"),
])
def test_sinks_refused_unless_float32_h_on_qs_device(make, what):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="sinks must be a contiguous float32 tensor of shape"):
        s6.attention(q, k, v, sinks=make(q))


def test_sinks_that_require_grad_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="require grad"):
        s6.attention(q, k, v, sinks=torch.zeros(q.shape[1], requires_grad=True))


def test_sinks_plan_and_launch_on_the_cpu(monkeypatch):
    """A call with sinks: the SINKS build, the sinks' pointer as the kernel's last argument (a new
    tensor of the same shape reuses the plan), split as without sinks; the combine kernel, when
    it runs, gets the sinks, H, Sq and the rows' order after its own arguments."""
    built, launched = _plan_env(monkeypatch)
    q, k, v = make_qkv(1, 32, 1, 64, Sk=4096, Hkv=8, dtype=torch.bfloat16, device="cpu")  # decoding: split
    s6.attention(q, k, v)
    n_plain = int(launched[-1][1][14])  # n_splits without sinks
    assert n_plain > 1
    sinks = _sinks(32)
    s6.attention(q, k, v, sinks=sinks)
    assert built[-1]["SINKS"] == 1 and "WINDOW" not in built[-1] and "SOFTCAP" not in built[-1]
    params = launched[-1][1]
    assert int(params[14]) == n_plain and params[-1] == sinks.data_ptr()
    n_plans, other = len(s6._plans), _sinks(32)
    s6.attention(q, k, v, sinks=other)
    assert len(s6._plans) == n_plans and launched[-1][1][-1] == other.data_ptr()
    launched.clear()
    s6.attention(q, k, v, sinks=sinks, splits=4, combine_in_block=False)  # the combine kernel
    (k1, p1), (k2, p2) = launched
    assert k1 == "kernel" and k2 == "combine" and int(p1[14]) == 4
    assert p2[5] == sinks.data_ptr() and [int(x) for x in p2[6:]] == [32, 1, 0]
    s6.attention(q, k, v, sinks=sinks, window=(99, 0), softcap=30.0)
    assert {n: built[-1][n] for n in VARIANT_DEFINES} == {"SOFTCAP": sv.SOFTCAP_TANH[torch.bfloat16], "WINDOW": 1, "SINKS": 1}


def test_heavy_variants_take_tiles_that_do_not_spill():
    """variant_tiles: the softcap's ex2 form, or all three variants, move D64's three consumers to
    two and D128's 176-key tiles to 128 keys; lighter variants keep the tiles."""
    heavy = sv.Variants(softcap=5.0, softcap_build=2)
    light = sv.Variants(softcap=5.0, softcap_build=1, window=(5, 0))
    assert sv.variant_tiles((128, 2, 3), heavy) == (128, 2, 2) and sv.variant_tiles((176, 2, 2), heavy) == (128, 3, 2)
    assert sv.variant_tiles((128, 2, 3), light) == (128, 2, 3) and sv.variant_tiles((128, 3, 1), heavy) == (128, 3, 1)
    assert sv.heavy(sv.Variants(softcap=5.0, softcap_build=1, window=(5, 0), sinks=True))
    for D in (64, 128):
        for Sq, Sk, causal in ((2048, 2048, 1), (512, 512, 0), (1024, 1024, 1), (8192, 8192, 0)):
            ch = s6.choose(16, 16, 16, Sq, Sk, D, causal, 132, variants=heavy)
            assert ch["tiles"][2] < 3 and ch["tiles"][0] != 176, (D, Sq, causal, ch["tiles"])
            assert s6.fits(D, ch["tiles"], ch["q_stages"] or s6.q_buffers(D, ch["tiles"]))
            assert s6.choose(16, 16, 16, Sq, Sk, D, causal, 132, tiles=(128, 2, 3) if D == 64 else (176, 2, 2),
                             variants=heavy)["tiles"] in ((128, 2, 3), (176, 2, 2))  # given tiles are kept


def test_sinks_without_keys_give_zeros_and_the_sinks_lse(monkeypatch):
    _plan_env(monkeypatch)
    q, _, _ = _qkv(B=2, H=4, Sq=5)
    k = v = torch.zeros(2, 2, 0, 64, dtype=torch.float16)
    sinks, lse = _sinks(4), torch.empty(2, 4, 5)
    out = s6.attention(q, k, v, sinks=sinks, lse=lse)
    assert out.abs().max() == 0 and torch.equal(lse, sinks[None, :, None].expand(2, 4, 5))


# --------------------------------------------------------------------------------------------
# on the GPU: against the float64 reference with the same variant

def _check(q, k, v, *, label, causal=False, **kw):
    with poisoned_outputs():
        out = s6.attention(q, k, v, causal=causal, **kw)
    ref_kw = {n: kw[n] for n in ("window", "softcap", "sinks", "scale") if kw.get(n) is not None}
    c = check_output(out, q, k, v, causal=causal, **ref_kw)
    assert c.passed, f"{label}: {c.summary()}"


# (B, H, Hkv, Sq, Sk): Sq != Sk both ways, lengths no multiple of any tile, GQA, one query
ODD_SHAPES = [(2, 4, 2, 129, 77), (1, 6, 2, 300, 1000), (1, 2, 1, 1000, 300), (2, 4, 4, 257, 257), (3, 8, 2, 1, 333)]
CAUSALS = [False, True, "bottom_right"]


@gpu
@on_hopper
@pytest.mark.parametrize("softcap_tanh", [None, "approx", "exp2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
def test_softcap_matches_reference(D, dtype, softcap_tanh, seed):
    """Scores of order 10-30 (q scaled up) against caps of 5 and 30: the cap bends them."""
    for cap in (5.0, 30.0):
        for B, H, Hkv, Sq, Sk in ODD_SHAPES:
            for causal in CAUSALS:
                q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=seed)
                q = q * 4
                _check(q, k, v, causal=causal, softcap=cap, softcap_tanh=softcap_tanh,
                       label=f"softcap {cap} ({softcap_tanh}) {dtype} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}")


# --------------------------------------------------------------------------------------------
# WINDOW's tile ranges, in Python: stages/stage6.cu's integer logic (work_tile, my_tiles, the
# softmax's MASK test) run over every row, against lib.reference's masks

def _kernel_ranges(Sq, Sk, causal, window, bn, consumers, n_splits, per_split, pack=False):
    """For each query row: the key tiles its consumer computes (t0 … t0 + my_tiles − 1, over the
    splits) and, per tile, whether the softmax masks it; as stages/stage6.cu's WINDOW build works
    them out (win_left, win_right finite, as finite_window makes them)."""
    left, right = window
    block_m = 64 * consumers
    n_qb = 1 if pack else -(-Sq // block_m)
    diag = Sk - Sq if causal == 2 else 0
    wdiag = Sk - Sq
    rows = {}
    for qb in range(n_qb):
        q0 = qb * block_m
        rows_end_b = Sq if pack else min(q0 + block_m, Sq)
        n_keys = 0 if rows_end_b <= q0 else (max(0, min(Sk, rows_end_b + diag)) if causal else Sk)
        w_end = max(0, min(n_keys, rows_end_b + wdiag + right))
        first_tile = 0 if w_end == 0 else max(0, q0 + wdiag - left) // bn
        for split in range(n_splits):
            t0 = first_tile + split * per_split
            n_tiles = max(0, min(-(-w_end // bn), t0 + per_split) - t0)
            for c in range(1 if pack else consumers):
                first_row = 0 if pack else q0 + 64 * c
                rows_end = Sq if pack else first_row + 64
                if not pack and first_row >= Sq:
                    continue  # past_end: my_tiles 0
                hi_first = min(first_row + diag, first_row + wdiag + right) if causal else first_row + wdiag + right
                lo_last = rows_end - 1 + wdiag - left
                keys_end = max(0, min(min(Sk, rows_end + diag) if causal else Sk, rows_end + wdiag + right))
                my_tiles = max(0, min(n_tiles, -(-keys_end // bn) - t0))
                for i in range(first_row, min(rows_end, Sq)):
                    for j in range(my_tiles):
                        kt = t0 + j
                        masked = (kt + 1) * bn > Sk or (kt + 1) * bn - 1 > hi_first or kt * bn < lo_last
                        rows.setdefault(i, {})[kt] = masked
    return rows


WINDOW_CASES = [  # Sq, Sk, causal (kernel mode), (left, right) as given
    (129, 77, 0, (5, 3)), (300, 1000, 0, (100, 0)), (1000, 300, 2, (64, -1)), (257, 257, 1, (0, 0)),
    (1, 333, 0, (40, 0)), (500, 700, 1, (200, 50)), (700, 500, 2, (-1, 7)), (64, 4096, 0, (1000, 1000)),
    (300, 300, 0, (5000, 5000)), (200, 900, 2, (3, -1)), (5, 2000, 2, (511, 0)), (390, 390, 0, (-1, 0))]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: f"{c[0]}x{c[1]}-c{c[2]}-w{c[3][0]}_{c[3][1]}")
def test_window_tiles_cover_every_visible_key_and_skip_the_rest(case):
    """Every key a row sees (window ∩ causal, lib.reference) lies in a tile its consumer computes,
    and in a masked tile if the row does not see every key of it; the tiles computed for a block
    are those its rows' windows reach, plus at most the one tile on either side their rounding
    takes; the host's window_span holds them, so no split cuts any off."""
    from lib.reference import causal_mask, window_mask
    Sq, Sk, causal, window = case
    win = sv.finite_window(window, Sq, Sk)
    allowed = window_mask(Sq, Sk, window, "cpu")
    if causal:
        allowed &= causal_mask(Sq, Sk, "cpu", "bottom_right" if causal == 2 else True)
    for bn, consumers, pack in ((128, 3, False), (128, 2, False), (176, 2, False), (64, 1, False), (128, 1, True)):
        if pack and Sq > 64:
            continue
        span = s6.window_span(Sq if pack else min(Sq, 64 * consumers), Sk, bn, win)
        for n_splits in (1, 2, 3):
            per_split = -(-span // n_splits)
            rows = _kernel_ranges(Sq, Sk, causal, win, bn, consumers, n_splits, per_split, pack)
            for i in range(Sq):
                seen = allowed[i].nonzero().flatten().tolist()
                tiles = rows.get(i, {})
                for j in seen:
                    assert j // bn in tiles, (case, bn, consumers, n_splits, i, j)
                for kt, masked in tiles.items():
                    keys = allowed[i, kt * bn:(kt + 1) * bn]
                    if not masked:
                        assert keys.all() and (kt + 1) * bn <= Sk, (case, bn, i, kt)
            # no tile beyond what the block's rows reach, rounded out to whole tiles
            for i, tiles in rows.items():
                vis = allowed[i].nonzero().flatten()
                if len(vis) and len(tiles):
                    assert min(tiles) >= 0 and max(tiles) <= -(-Sk // bn) - 1


def test_window_span_bounds_the_work():
    """A sliding window of 4096 keys at S 32768 reads about 4096 / S of the keys per work tile."""
    win = sv.finite_window((4095, 0), 32768, 32768)
    assert s6.window_span(192, 32768, 128, win) == -(-(192 + 4095) // 128) + 1 == 35
    assert s6.window_span(192, 32768, 128, None) == 256
    assert s6.window_span(1, 300, 128, sv.finite_window((-1, -1 + 1), 1, 300)) == 3  # wider than Sk: all


def test_window_plan_and_launch_on_the_cpu(monkeypatch):
    built, launched = _plan_env(monkeypatch)
    q, k, v = _qkv(Sq=70, Sk=900)
    s6.attention(q, k, v, window=(99, 0))
    assert built[-1]["WINDOW"] == 1 and "SOFTCAP" not in built[-1]
    left, right, sinks = launched[-1][1][-3:]
    assert (int(left), int(right), sinks) == (99, 0, 0)
    s6.attention(q, k, v, window=(-1, 5), causal=True)
    assert [int(x) for x in launched[-1][1][-3:-1]] == [900, 5]  # unbounded left: every key
    s6.attention(q, k, v, window=(-1, -1))  # no bound at all: the build without a window
    assert "WINDOW" not in built[-1]
    # decoding against a long cache with a window: the splits are planned over the window's tiles
    q1, k1, v1 = make_qkv(1, 8, 1, 64, Sk=32768, Hkv=1, dtype=torch.bfloat16, device="cpu")
    launched.clear()
    s6.attention(q1, k1, v1)
    N_SPLITS, PER_SPLIT = 14, 15  # after 4 maps, out, o_part, lse_part, Sq, Sk, H, G, scale, causal, n_work
    full = int(launched[0][1][N_SPLITS])
    launched.clear()
    s6.attention(q1, k1, v1, window=(4095, 0))
    n, per_split = int(launched[0][1][N_SPLITS]), int(launched[0][1][PER_SPLIT])
    span = s6.window_span(1, 32768, s6.DECODE_TILES[64][0], (4095, 0))
    assert span == 33 and n * per_split >= span and (n - 1) * per_split < span and n <= full, (n, per_split, full)


def test_window_that_cuts_gets_the_window_launch():
    """A window narrower than the keys, with more work tiles than SMs: WINDOW_SCHEDULES (and at
    D128 WINDOW_TILES, or what a heavy variant makes of them), causal or not; a window as wide as
    the keys, too few work tiles, given tiles or a given schedule: what the call got before."""
    q = _qkv()[0]
    win = lambda w, **kw: sv.check_variants(q, window=w, **kw)  # noqa: E731
    for D in (64, 128):
        for causal in (1, 0):
            ch = s6.choose(1, 16, 16, 32768, 32768, D, causal, 132, variants=win((4096, 0)))
            assert ch["schedule"] == s6.WINDOW_SCHEDULES[D], (D, causal, ch)
            assert ch["tiles"] == s6.WINDOW_TILES.get(D, s6.TILES[D])
            assert ch["per_split"] == s6.window_span(64 * ch["tiles"][2], 32768, ch["tiles"][0], (4096, 0))
        plain = s6.choose(1, 16, 16, 32768, 32768, D, 1, 132)
        assert s6.choose(1, 16, 16, 32768, 32768, D, 1, 132, variants=win((40000, 0))) == plain  # cuts nothing
        few = s6.choose(1, 2, 2, 4096, 4096, D, 1, 132, variants=win((512, 0)))  # 64 work tiles: as without the window
        assert (few["tiles"], few["schedule"]) == itemgetter("tiles", "schedule")(s6.choose(1, 2, 2, 4096, 4096, D, 1, 132))
        given = s6.choose(1, 16, 16, 32768, 32768, D, 1, 132, tiles=s6.TILES[D], variants=win((4096, 0)))
        assert given["tiles"] == s6.TILES[D] and given["schedule"] == s6.WINDOW_SCHEDULES[D]
        asked = s6.choose(1, 16, 16, 32768, 32768, D, 1, 132, schedule=s6.default_schedule(D), variants=win((4096, 0)))
        assert asked["tiles"] == s6.TILES[D] and asked["schedule"] == s6.default_schedule(D)
        # per-sequence offsets or key lengths: the window's launch too (its GPU test passed at 14c418a)
        seqs = s6.choose(1, 16, 16, 32768, 32768, D, 1, 132, variants=win((4096, 0)), seqs=True)
        assert seqs["schedule"] == s6.WINDOW_SCHEDULES[D] and seqs["tiles"] == s6.WINDOW_TILES.get(D, s6.TILES[D])
    # a heavy variant's tiles (two consumers at D64: variant_tiles) with the window's launch
    all3 = win((4096, 0), softcap=5.0, sinks=torch.zeros(q.shape[1]))
    heavy = s6.choose(1, 16, 16, 32768, 32768, 64, 1, 132, variants=all3)
    assert sv.heavy(all3) and heavy["tiles"] == sv.variant_tiles(s6.TILES[64], all3) == (128, 2, 2)


@pytest.mark.parametrize("bad", [(1,), (1, 2, 3), (-2, 0), (0, -5), (1.5, 0), (True, 0), "ab", 7, {1: 2}])
def test_window_refused_unless_a_pair_of_ints(bad):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="window must be a pair"):
        s6.attention(q, k, v, window=bad)


# windows: narrower than a tile, one side only, both sides, wider than every sequence
WINDOWS = [(0, 0), (5, 3), (63, 0), (100, -1), (-1, 7), (300, 50), (5000, 5000)]


@gpu
@on_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
def test_window_matches_reference(D, dtype, seed):
    for window in WINDOWS:
        for B, H, Hkv, Sq, Sk in ODD_SHAPES:
            for causal in CAUSALS:
                q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=seed)
                _check(q, k, v, causal=causal, window=window,
                       label=f"window {window} {dtype} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}")


@gpu
@on_hopper
@pytest.mark.parametrize("schedule", list(s6.ALL_SCHEDULES))
@pytest.mark.parametrize("D", [64, 128])
def test_window_every_schedule(schedule, D, seed):
    """Each schedule is a build of its own (producer or none, ping-pong, persistent blocks, the
    work queue): the window's tile ranges and masks in each."""
    for B, H, Hkv, Sq, Sk in [(2, 4, 2, 700, 900), (3, 2, 1, 1000, 300)]:
        for causal in CAUSALS:
            for window in [(40, 0), (200, 30)]:
                q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16, seed=seed)
                _check(q, k, v, causal=causal, window=window, schedule=schedule,
                       label=f"window {window} {schedule} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}")


@gpu
@on_hopper
@pytest.mark.parametrize("D", [64, 128])
def test_window_launch_matches_reference(D, seed):
    """The launch a window narrower than the keys gets with more work tiles than SMs (persistent
    blocks or the work queue; D128's tiles with two Q buffers, O stored by TMA): odd lengths,
    windows on one side and both, causal or not, GQA, both dtypes."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for B, H, Hkv, Sq, Sk in [(2, 16, 4, 1000, 1000), (1, 24, 8, 1337, 1531), (3, 12, 12, 700, 2100)]:
        for window, causal in [((200, 0), True), ((97, 31), False), ((150, 150), "bottom_right")]:
            for dtype in (torch.float16, torch.bfloat16):
                q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=seed)
                var = sv.check_variants(q, window=window)
                ch = s6.choose(B, H, Hkv, Sq, Sk, D, 2 if causal == "bottom_right" else int(causal), sms, variants=var)
                assert ch["schedule"] == s6.WINDOW_SCHEDULES[D], (window, ch)  # each window cuts key tiles here
                _check(q, k, v, causal=causal, window=window,
                       label=f"window launch {window} {dtype} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}")


@gpu
@on_hopper
@pytest.mark.parametrize("D", [64, 128])
def test_window_launches_in_packed_sequences(D, seed, monkeypatch):
    """attention_varlen with a window gets the launch WINDOW_SCHEDULES gives other calls, with more
    work tiles than SMs: each sequence against its own reference, sequences without queries or keys
    among them."""
    from lib.reference import packed_inputs
    choose, chosen = s6.choose, []
    monkeypatch.setattr(s6, "choose", lambda *a, **kw: chosen.append(choose(*a, **kw)) or chosen[-1])
    monkeypatch.setattr(s6, "_plans", {})
    lens_q, lens_k = [1000, 1, 0, 777, 1300, 640], [1000, 513, 40, 0, 1301, 900]
    for causal in (False, "bottom_right"):
        for window in ((200, 0), (97, 31)):
            q, k, v, cu_q, cu_k = packed_inputs(lens_q, lens_k, 16, 4, D, dtype=torch.bfloat16, device="cuda", seed=seed)
            with poisoned_outputs():
                out = s6.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                          window=window)
            assert chosen[-1]["schedule"] == s6.WINDOW_SCHEDULES[D], chosen[-1]
            check_each_sequence(out, q, k, v, cu_q, cu_k, causal, f"window {window} D{D} seed {seed}", window=window)


@gpu
@on_hopper
@pytest.mark.parametrize("D", [64, 128])
def test_window_decoding_split_and_packed(D, seed):
    """Decoding against a long cache with a sliding window: packed GQA, the keys split over the
    window's tiles only (split-KV's combine in the block and as a kernel), one query and a few."""
    for B, H, Hkv, Sq, Sk in [(1, 32, 8, 1, 5000), (2, 8, 1, 4, 3001), (3, 6, 2, 1, 129)]:
        for window in [(1023, 0), (0, 0), (100, 100), (4999, 0)]:
            for opts in ({}, {"splits": 4}, {"splits": 3, "combine_in_block": False}, {"pack_gqa": False}):
                for causal in (False, "bottom_right"):
                    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.float16, seed=seed)
                    _check(q, k, v, causal=causal, window=window, **opts,
                           label=f"decode window {window} {opts} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}")


@gpu
@on_hopper
@pytest.mark.parametrize("D", [64, 128])
def test_window_and_softcap_together(D, seed):
    for dtype in (torch.float16, torch.bfloat16):
        for B, H, Hkv, Sq, Sk in ODD_SHAPES[:3]:
            for causal in CAUSALS:
                q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=seed)
                _check(q * 4, k, v, causal=causal, window=(37, 0), softcap=5.0,
                       label=f"window+softcap {dtype} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}")


def _reference_lse(q, k, *, causal=False, window=None, softcap=None, sinks=None):
    """Each row's natural log-sum-exp over its visible keys' scores and its sink, in float64: what
    stage 6 writes to `lse` (−∞ for a row with neither)."""
    from lib.reference import causal_mask, window_mask
    G = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(G, dim=1)
    s = q.double() @ kk.transpose(-1, -2) * q.shape[-1] ** -0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    Sq, Sk = q.shape[2], k.shape[2]
    allowed = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if causal:
        allowed &= causal_mask(Sq, Sk, q.device, causal)
    if window is not None:
        allowed &= window_mask(Sq, Sk, window, q.device)
    s = s.masked_fill(~allowed, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.double()[None, :, None, None].expand(q.shape[0], -1, Sq, 1)], dim=-1)
    return torch.logsumexp(s, dim=-1)


@gpu
@on_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
def test_sinks_match_reference_with_their_lse(D, dtype, seed):
    """Sinks near the rows' largest scores (they take real weight) and far below (no effect) and
    above (most weight): the output by the error rule, the lse within float32's rounding."""
    g = torch.Generator().manual_seed(seed)
    for B, H, Hkv, Sq, Sk in ODD_SHAPES:
        for causal in CAUSALS:
            for offset in (1.0, -30.0, 6.0):
                q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=seed)
                sinks = (torch.rand(H, generator=g) * 2 + offset).cuda()
                lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
                label = f"sinks +{offset} {dtype} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}"
                _check(q, k, v, causal=causal, sinks=sinks, lse=lse, label=label)
                want = _reference_lse(q, k, causal=causal, sinks=sinks)
                assert torch.isfinite(lse).all() and (lse.double() - want).abs().max() < 1e-3, label


@gpu
@on_hopper
@pytest.mark.parametrize("D", [64, 128])
def test_all_three_together_every_schedule_and_decoding(D, seed):
    """Softcap, window and sinks in one build, on every schedule, and decoding (packed, unsplit)."""
    for schedule in [None, *s6.ALL_SCHEDULES]:
        for B, H, Hkv, Sq, Sk in [(2, 4, 2, 700, 900), (3, 2, 1, 1000, 300), (2, 32, 8, 1, 3000), (1, 8, 1, 5, 777)]:
            if schedule is not None and Sq <= 5:
                continue
            for causal in CAUSALS:
                for dtype in (torch.float16, torch.bfloat16):
                    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=seed)
                    sinks = (torch.rand(H, device=q.device) * 2 + 4.0)
                    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
                    label = f"all three {schedule} {dtype} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}"
                    kw = dict(window=(200, 3), softcap=5.0, sinks=sinks)
                    _check(q * 3, k, v, causal=causal, lse=lse, schedule=schedule, label=label, **kw)
                    want = _reference_lse(q * 3, k, causal=causal, **kw)
                    assert (lse.double() - want).abs().max() < 1e-2, label


@gpu
@on_hopper
def test_sinks_rows_without_keys(seed):
    """Bottom-right with Sq > Sk and a window: rows that see no key give zeros, their lse the sink."""
    for D in (64, 128):
        q, k, v = make_qkv(2, 4, 300, D, Sk=100, Hkv=2, dtype=torch.bfloat16, seed=seed)
        sinks = torch.randn(4, device=q.device)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        _check(q, k, v, causal="bottom_right", window=(10, 0), sinks=sinks, lse=lse, label=f"D{D} seed {seed}")
        assert torch.allclose(lse[:, :, :200], sinks[None, :, None].expand(2, 4, 200))


@gpu
@on_hopper
@pytest.mark.parametrize("D", [64, 128])
def test_sinks_with_split_kv(D, seed):
    """Decoding with sinks, keys split: the sink counted once, by the combine in the last block
    or by the combine kernel; packed and not, one query and a few (speculative, bottom-right)."""
    for B, H, Hkv, Sq, Sk in [(1, 32, 8, 1, 4096), (2, 8, 1, 4, 3001), (1, 16, 16, 1, 20000)]:
        for opts in ({}, {"splits": 4}, {"splits": 7, "combine_in_block": False}, {"splits": 3, "pack_gqa": False}):
            for causal in (False, "bottom_right"):
                for offset in (0.0, 8.0):
                    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16, seed=seed)
                    sinks = torch.rand(H, device=q.device) * 2 + offset
                    _check(q, k, v, causal=causal, sinks=sinks, **opts,
                           label=f"sinks+{offset} split {opts} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}")
                    _check(q, k, v, causal=causal, sinks=sinks, window=(511, 0), softcap=20.0, **opts,
                           label=f"all three split {opts} {(B, H, Hkv, Sq, Sk, D)} causal={causal} seed {seed}")


@gpu
@on_hopper
@pytest.mark.parametrize("D", [64, 128])
def test_variants_in_packed_sequences(D, seed):
    """attention_varlen with each variant and all three: each sequence against its own reference
    (its window aligned to its own last query and key), sequences without queries or keys among
    them."""
    from lib.reference import packed_inputs
    lens_q, lens_k = [130, 1, 0, 77, 300], [90, 513, 40, 0, 301]
    for causal in (False, "bottom_right", "top_left"):
        for kw in ({"window": (17, 0)}, {"softcap": 5.0}, {"sinks": "yes"}, {"window": (50, 9), "softcap": 5.0, "sinks": "yes"}):
            q, k, v, cu_q, cu_k = packed_inputs(lens_q, lens_k, 8, 2, D, dtype=torch.float16, device="cuda", seed=seed)
            if "softcap" in kw:
                q = q * 4
            if kw.get("sinks") == "yes":
                kw = {**kw, "sinks": torch.randn(8, device="cuda") + 2}
            with poisoned_outputs():
                out = s6.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, **kw)
            check_each_sequence(out, q, k, v, cu_q, cu_k, causal, f"varlen {sorted(kw)} D{D} seed {seed}", **kw)


def check_each_sequence(out, q, k, v, cu_q, cu_k, causal, label, **variants):
    """lib.reference.check_varlen_output: every packed sequence within the error rule."""
    from lib.reference import check_varlen_output
    checks = check_varlen_output(out, q, k, v, cu_q, cu_k, causal=causal if causal != "top_left" else True, **variants)
    bad = [(i, c.summary()) for i, c in enumerate(checks) if not c.passed]
    assert not bad, f"{label} causal={causal}: sequences (counted among those with queries) {bad}"


@gpu
@on_hopper
@pytest.mark.parametrize("D", [64, 128])
def test_variants_with_seqlens_k_and_other_scales(D, seed):
    """Decoding against caches of different lengths (seqlens_k): the window aligned to each
    entry's own last used key, sinks and softcap per entry; and softcap with a negative and a zero
    scale (the kernel flips Q for a negative one; scale 0 weighs every visible key alike)."""
    B, H, Hkv, Sq, Sk = 3, 8, 2, 4, 2000
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.bfloat16, seed=seed)
    used = torch.tensor([2000, 7, 1100], dtype=torch.int32, device=q.device)
    sinks = torch.randn(H, device=q.device) + 3
    for kw in ({"window": (300, 0)}, {"sinks": sinks}, {"softcap": 5.0}, {"window": (50, 0), "sinks": sinks, "softcap": 5.0}):
        for causal in (False, "bottom_right"):
            with poisoned_outputs():
                out = s6.attention(q * 3, k, v, causal=causal, seqlens_k=used, **kw)
            for b in range(B):
                n = int(used[b])
                c = check_output(out[b:b + 1], q[b:b + 1] * 3, k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=causal, **kw)
                assert c.passed, f"seqlens_k {sorted(kw)} entry {b} causal={causal} D{D} seed {seed}: {c.summary()}"
    for scale in (-0.1, 0.0, 0.5):
        for causal in CAUSALS:
            q, k, v = make_qkv(2, 4, 129, D, Sk=77, Hkv=2, dtype=torch.float16, seed=seed)
            _check(q * 4, k, v, causal=causal, scale=scale, softcap=5.0, window=(20, 3), sinks=torch.randn(4, device=q.device),
                   label=f"scale {scale} causal={causal} D{D} seed {seed}")
