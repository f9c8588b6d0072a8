"""Stage 6 beyond the shared suite: every schedule variant compiles to what the design says
(offline, no GPU needed) and computes attention (GPU), inputs with real strides, and the
timeline build."""
import re

import pytest
import torch

import stages.stage6 as s6
from conftest import gpu
from lib.inputs import make_qkv, poisoned_outputs
from lib.reference import check_output
from lib.sass import inspect_cubin, sass_text
from lib.simulator import HAS_GPU

on_hopper = pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability() != (9, 0),
                               reason="stage 6 needs an sm_90 GPU (H100/H200)")
# ptxas says so when it must serialize wgmma (C7510: pipeline crosses a function boundary,
# C7515: non-wgmma access to accumulators in the pipeline, C7511: too few registers) or when
# it ignores setmaxnreg (C7508): any of these makes the kernel slow without making it wrong.
SERIALIZING = re.compile(r"C75(08|10|11|12|15)|wgmma.*serializ", re.I)


def variants():
    for D in s6.INFO.head_dims:
        for dtype in s6.INFO.dtypes:
            for sched in s6.SCHEDULES:
                yield pytest.param(D, dtype, sched, id=f"D{D}-{str(dtype)[6:]}-{sched.strip('+ ').replace(' ', '_')}")


@pytest.mark.parametrize("D,dtype,schedule", list(variants()))
def test_compiles_to_hopper_instructions(D, dtype, schedule):
    (compiled,) = s6.compile_for(s6.ARCH, dtype, D, schedule=schedule).values()
    ins = inspect_cubin(compiled.cubin, s6.ARCH, compiled.resource_usage())
    assert ins.mix["HGMMA"] > 0, "the products must be wgmma (HGMMA)"
    assert ins.mix["HMMA"] == 0, "no mma.sync (HMMA) left"
    assert ins.mix["UTMALDG"] > 0, "Q, K, V must arrive by bulk tensor copies (UTMALDG)"
    assert ins.mix["SYNCS"] > 0, "the pipeline waits on mbarriers (SYNCS)"
    (usage,) = compiled.resource_usage().values()
    sw = s6.SCHEDULES[schedule]
    if sw["WARP_SPECIALIZED"] and not sw["SETMAXNREG"]:
        # The ablation step before setmaxnreg: consumers keep the launch's even share (168
        # registers at 3 warpgroups), too few for S, P and O at D128 — ptxas spills and
        # serializes there, which is what the next step (setmaxnreg) fixes. Reported, not failed.
        return
    assert not SERIALIZING.search(compiled.log), compiled.log
    if schedule == s6.DEFAULT_SCHEDULE:
        assert usage["spill_stores"] == 0 and usage["stack_bytes"] == 0, usage
        assert ins.mix["LDL"] == 0 and ins.mix["STL"] == 0, "no local memory"
        sass = sass_text(compiled.cubin)
        assert "SETMAXREG" in sass, "setmaxnreg must survive to the SASS"


def test_other_arch_refused():
    with pytest.raises(NotImplementedError, match="sm_90a"):
        s6.compile_for("sm_90", torch.float16, 64)


def test_config_checks_schedule_and_shared_memory():
    with pytest.raises(ValueError, match="schedule"):
        s6.config(64, schedule="fastest")
    with pytest.raises(ValueError, match="shared memory"):
        s6.config(128, (128, 3, 3))
    assert all(s6.fits(D, s6.TILES[D]) for D in s6.INFO.head_dims)


# --------------------------------------------------------------------------------------------
# on the GPU

SHAPES = [(1, 1, 1, 1), (2, 3, 129, 77), (1, 2, 300, 1000), (1, 1, 1000, 300), (2, 2, 257, 257)]


@on_hopper
@pytest.mark.parametrize("schedule", list(s6.SCHEDULES))
@pytest.mark.parametrize("D", s6.INFO.head_dims)
def test_every_schedule_matches_reference(schedule, D, seed):
    for dtype in s6.INFO.dtypes:
        for B, H, Sq, Sk in SHAPES:
            for causal in (False, True):
                q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, dtype=dtype, seed=seed)
                with poisoned_outputs():
                    out = s6.attention(q, k, v, causal=causal, schedule=schedule)
                c = check_output(out, q, k, v, causal=causal)
                assert c.passed, f"{schedule} {dtype} {(B, H, Sq, Sk, D)} causal={causal} seed {seed}: {c.summary()}"


@on_hopper
@pytest.mark.parametrize("tiles", s6.CHOICES)
def test_every_tile_choice_matches_reference(tiles, seed):
    for D in [d for d in s6.INFO.head_dims if s6.fits(d, tiles)]:
        for causal in (False, True):
            q, k, v = make_qkv(2, 2, 333, D, Sk=517, dtype=torch.bfloat16, seed=seed)
            out = s6.attention(q, k, v, causal=causal, tiles=tiles)
            c = check_output(out, q, k, v, causal=causal)
            assert c.passed, f"tiles {tiles} D{D} causal={causal} seed {seed}: {c.summary()}"


@on_hopper
@pytest.mark.parametrize("eighths", [2, 8])
def test_polynomial_exp2_matches_reference(eighths, seed):
    for D in s6.INFO.head_dims:
        for dtype in s6.INFO.dtypes:
            for causal in (False, True):
                q, k, v = make_qkv(2, 3, 300, D, Sk=517, dtype=dtype, seed=seed)
                out = s6.attention(q, k, v, causal=causal, exp2_poly=eighths)
                c = check_output(out, q, k, v, causal=causal)
                assert c.passed, f"exp2_poly={eighths} D{D} {dtype} causal={causal} seed {seed}: {c.summary()}"


def test_polynomial_exp2_on_the_cpu():
    """The same arithmetic as poly_exp2 in stages/stage6.cu, in float32 with numpy: within
    3e-6 of 2^x relative, and about 2^-125 (not garbage) for −∞ and very negative x."""
    import numpy as np
    x = np.concatenate([np.linspace(-30, 0, 100_001, dtype=np.float32), np.float32([-np.inf, -1e9, -200])])
    xc = np.maximum(x, np.float32(-125))
    t = xc + np.float32(12582912.0)
    f = xc - (t - np.float32(12582912.0))
    c = [np.float32(v) for v in (0.009571807, 0.055918004, 0.24024703, 0.69312179, 0.99999928)]
    p = c[0]
    for ci in c[1:]:
        p = p * f + ci
    y = ((p.view(np.int32) + (t.view(np.int32) << 23)).astype(np.int32)).view(np.float32)
    ref = np.exp2(xc.astype(np.float64))
    assert np.max(np.abs(y - ref) / ref) < 3e-6
    assert np.allclose(y[-3:], 2.0 ** -125, rtol=3e-6, atol=0)


@on_hopper
def test_strided_views_read_in_place(seed):
    """A model's [B, S, H, D] projections, transposed to [B, H, S, D] without a copy; a slice of
    heads; GQA with 2 K/V heads."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, S, H, Hk, D = 2, 301, 8, 2, 128
    x = torch.randn(B, S, H + 2 * Hk, D, generator=g).to("cuda", torch.float16)
    q, k, v = (x[:, :, :H].transpose(1, 2), x[:, :, H:H + Hk].transpose(1, 2),
               x[:, :, H + Hk:].transpose(1, 2))
    assert not q.is_contiguous()
    for causal in (False, True):
        out = s6.attention(q, k, v, causal=causal)
        assert out.is_contiguous()
        c = check_output(out, q, k, v, causal=causal)
        assert c.passed, c.summary()


@on_hopper
def test_many_heads_beyond_grid_limit(seed):
    q, k, v = make_qkv(70_000, 1, 3, 64, Sk=5, seed=seed)
    c = check_output(s6.attention(q, k, v), q, k, v)
    assert c.passed, c.summary()


@on_hopper
def test_timeline_stamps_are_ordered():
    bn, _, cons = s6.TILES[128]
    tl = torch.zeros((1 + cons) * s6.TIMELINE_TILES * s6.TIMELINE_EVENTS, dtype=torch.int64, device="cuda")
    q, k, v = make_qkv(1, 1, 64 * cons, 128, Sk=bn * 8)  # one work tile of 8 key tiles
    s6.attention(q, k, v, timeline=tl)
    torch.cuda.synchronize()
    t = tl.view(1 + cons, s6.TIMELINE_TILES, s6.TIMELINE_EVENTS).cpu()
    for c in range(1, 1 + cons):  # per tile: operands in, S ready, softmax done, P·V done
        for j in range(8):
            assert t[c, j, 0] <= t[c, j, 1] <= t[c, j, 2] <= t[c, j, 3], t[c, j]
    assert (t[0, :8, 0] > 0).all(), "the producer stamped every copy"
