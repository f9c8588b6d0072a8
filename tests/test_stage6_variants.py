"""Stage 6's model variants (issue 51: stages/stage6_variants.py, the SOFTCAP, WINDOW and SINKS
switches of stages/stage6.cu): the arguments checked, the builds chosen and compiled (offline,
no GPU), the build without any variant unchanged, and (GPU) each variant and combinations against
the float64 reference by the error rule (lib.reference.check_output with the same variant)."""
import math

import numpy as np
import pytest
import torch

import stages.stage6 as s6
import stages.stage6_variants as sv
from conftest import compile_cases, cpu_only, gpu
from lib.inputs import make_qkv, poisoned_outputs
from lib.reference import check_output
from lib.sass import sass_text
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


# Spills ptxas reports for the variant builds of the default launch (config(D) with the switch),
# NVRTC 13.0: see BRANCH_NOTES.md for every shipped build. A build not listed must not spill.
KNOWN_SPILLS = {(64, "softcap", 2): 24}  # bytes of stack, fp16 and bf16 alike: D64's three consumers have 160 registers


VARIANT_BUILDS = [(D, dtype, name, value) for D in (64, 128) for dtype in (torch.float16, torch.bfloat16)
                  for name, value in (("softcap", 1), ("softcap", 2))]


def _variant_build(D, dtype, name, value):
    (c,) = s6.compile_for(s6.ARCH, dtype, D, **{name: value}).values()
    return c


@cpu_only  # reads ptxas's log
@compile_cases("D,dtype,name,value", VARIANT_BUILDS,
               ids=[f"D{D}-{str(dt)[6:]}-{n}{v}" for D, dt, n, v in VARIANT_BUILDS],
               build=_variant_build)
def test_variant_builds_compile(D, dtype, name, value):
    c = _variant_build(D, dtype, name, value)
    assert not SERIALIZING.search(c.log), c.log
    usage = c.resource_usage()["attention_wgmma"]
    assert usage["stack_bytes"] <= KNOWN_SPILLS.get((D, name, value), 0), usage
    sass = sass_text(c.cubin)
    assert "HGMMA" in sass and "SETMAXREG" in sass
    if name == "softcap":
        assert ("MUFU.TANH" in sass) == (value == 1)


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


# --------------------------------------------------------------------------------------------
# on the GPU: against the float64 reference with the same variant

def _check(q, k, v, *, label, causal=False, **kw):
    with poisoned_outputs():
        out = s6.attention(q, k, v, causal=causal, **kw)
    ref_kw = {n: kw[n] for n in ("window", "softcap", "sinks") if kw.get(n) is not None}
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
