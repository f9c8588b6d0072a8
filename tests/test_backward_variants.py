"""Stage 8's backward with stage 6's model variants (issue 51, branch bwd-variants): window,
softcap and sinks. CPU: the builds' defines (present only when on), each variant build compiled
for sm_90a without spills or local memory, the window's query-block and key-tile ranges against
the mask, the host's sinks gradient against float64 autograd, and the plumbing through
stages.autograd with fake kernels. GPU (an H100/H200): gradients (dq, dk, dv, dsinks) against
float64 autograd by lib.reference.check_gradients's rule."""
import math
from functools import partial

import pytest
import torch

from conftest import assert_no_local_memory, compile_cases, gpu
from lib.inputs import make_qkv, validate_varlen
from lib.reference import causal_mask, check_gradients, reference_attention, reference_backward, window_mask
from stages import autograd, stage6, stage8
from stages.stage6_variants import Variants, finite_window, softcap_build

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
hopper = pytest.mark.skipif(not HOPPER, reason="stage 6 and stage 8's variant builds need an sm_90 GPU (H100/H200)")


# ---- CPU -------------------------------------------------------------------------------------

def test_defines_only_when_on():
    """The builds without variants have exactly the defines they had (so the same SASS:
    experiments/model_variants/sass_digest_backward.py); SOFTCAP and WINDOW appear only when on, and
    change no other define but PREP_EARLY, which a variant build at D 128 leaves off (it spills there;
    D 64's PREP_EARLY 3 and KV_REGS stay), and at D 128 a softcap's EPILOGUE_SMEM (its addresses spill);
    the mma.sync build refuses them."""
    for D in (64, 128):
        build = dict(stage8.config(D, wgmma=1)["defines"])
        assert not {"SOFTCAP", "WINDOW"} & set(build)
        assert set(build) == set(stage8.WGMMA_SWITCHES)
        assert build["PREP_EARLY"] == {64: 3, 128: 1}[D] and build["KV_REGS"] == (D == 64)
        plain = {**build, "PREP_EARLY": 0} if D == 128 else build  # the variant builds' other defines
        capped = {**plain, "EPILOGUE_SMEM": 0} if D == 128 else plain  # and those with a softcap
        assert dict(stage8.config(D, wgmma=1, softcap=1)["defines"]) == {**capped, "SOFTCAP": 1}
        assert dict(stage8.config(D, wgmma=1, softcap=2)["defines"]) == {**capped, "SOFTCAP": 2}
        assert dict(stage8.config(D, wgmma=1, window=True)["defines"]) == {**plain, "WINDOW": 1}
        assert dict(stage8.config(D, wgmma=1, softcap=2, window=True)["defines"]) == {**capped, "SOFTCAP": 2,
                                                                                      "WINDOW": 1}
        for bad in (3, -1, 1.5):
            with pytest.raises(ValueError, match="softcap"):
                stage8.config(D, wgmma=1, softcap=bad)
        with pytest.raises(NotImplementedError, match="WGMMA build only"):
            stage8.config(D, wgmma=0, window=True)
        with pytest.raises(NotImplementedError, match="WGMMA build only"):
            stage8.config(D, wgmma=0, softcap=1)
        assert "SOFTCAP" not in dict(stage8.config(D, wgmma=0)["defines"])


def test_variant_switches_and_args():
    """The launcher's rule (D 128, a softcap with a window: the build before the producer with
    dq_bulk=0, which does not spill) and the kernels' scalar arguments: cap_mul
    carries the scale's sign, the window made finite."""
    cap2_win = Variants(softcap=30.0, window=(5, 0), softcap_build=2)
    assert stage8.variant_switches(128, cap2_win) == {"producer": 0, "dq_bulk": 0}
    assert stage8.variant_switches(64, cap2_win) == {}
    assert stage8.variant_switches(128, Variants(softcap=30.0, window=(5, 0), softcap_build=1)) == {"producer": 0,
                                                                                                    "dq_bulk": 0}
    assert stage8.variant_switches(128, Variants(softcap=30.0, softcap_build=2)) == {}
    log2e = math.log2(math.e)
    mul, cap_log2, left, right = stage8.variant_args(Variants(softcap=5.0, softcap_build=1), -0.125, 10, 20)
    assert mul == pytest.approx(-0.125 / 5.0) and cap_log2 == pytest.approx(5.0 * log2e)
    assert (int(left), int(right)) == (20, 10)  # no window: every key
    mul, _, left, right = stage8.variant_args(Variants(softcap=5.0, window=(-1, 3), softcap_build=2), 0.125, 10, 20)
    assert mul == pytest.approx(0.125 / 5.0 * 2 * log2e)
    assert (int(left), int(right)) == finite_window((-1, 3), 10, 20) == (20, 3)
    _, cap_log2, left, right = stage8.variant_args(Variants(window=(7, 100)), 0.1, 10, 20)
    assert float(cap_log2) == 1.0 and (int(left), int(right)) == (7, 10)


# (D, dtype, softcap build, window): each dtype's own tanh (stage6_variants.SOFTCAP_TANH), the
# build the launcher runs (variant_switches)
VARIANT_BUILDS = [(D, dt, c, w) for D in (64, 96, 128, 256) for dt, cap in ((torch.float16, 2), (torch.bfloat16, 1))
                  for c, w in ((cap, False), (0, True), (cap, True))]


def _variant_build(D, dtype, softcap, window):
    from lib import nvrtc
    var = Variants(softcap=30.0 if softcap else None, window=(8, 0) if window else None, softcap_build=softcap)
    cfg = stage8.config(D, None, None, 1, softcap, window, **stage8.variant_switches(D, var))
    return nvrtc.compile_stage(stage8.WGMMA_SOURCE, arch="sm_90a", dtype=dtype, head_dim=D,
                               defines={"STAGE8_OFFLINE_CHECK": 1, **dict(cfg["defines"])})


@compile_cases("D,dtype,softcap,window", VARIANT_BUILDS, keep=lambda c: True,
               ids=[f"D{D}-{str(dt)[6:]}-softcap{c}-window{int(w)}" for D, dt, c, w in VARIANT_BUILDS],
               build=_variant_build)
def test_variant_builds_compile_without_spills(D, dtype, softcap, window):
    """Every variant build the launcher runs compiles for sm_90a without a GPU: no spills, no
    local memory, no serialized wgmma; the softcap's tanh is the forward's (MUFU.TANH for
    SOFTCAP 1, none for 2)."""
    from lib import sass
    compiled = _variant_build(D, dtype, softcap, window)
    use = assert_no_local_memory(compiled, ("attention_backward", "attention_backward_dq"), (D, dtype, softcap, window))
    assert not use or set(use) == {"attention_backward", "attention_backward_dq"}, compiled.log[-2000:]
    assert "serializ" not in compiled.log.lower(), compiled.log
    text = sass.sass_text(compiled.cubin)
    assert "LDL" not in text and "STL" not in text, "local memory"
    assert ("MUFU.TANH" in text) == (softcap == 1)


def _query_blocks(n0, keys, Sq, Sk, causal, left, right, rows=64):
    """stages/stage8_wgmma.cu's query blocks of the key block n0 (WINDOW), in Python."""
    diag = (Sk - Sq) if causal == "bottom_right" else 0
    n_q_blocks = (Sq + rows - 1) // rows
    hi_off = min(diag, Sk - Sq + right) if causal else Sk - Sq + right
    lo_off = Sk - Sq - left
    q_end = min(Sq, min(n0 + keys, Sk) - lo_off)
    first = min(n_q_blocks, max(0, n0 - hi_off) // rows)
    per_head = max(0, _cdiv(max(0, q_end) + rows - 1, rows) - first)
    return range(first, first + per_head)


def _key_tiles(m0, Sq, Sk, causal, left, right, rows=64):
    """... and the dQ pass's key tiles of the query block m0."""
    diag = (Sk - Sq) if causal == "bottom_right" else 0
    hi_off = min(diag, Sk - Sq + right) if causal else Sk - Sq + right
    lo_off = Sk - Sq - left
    n_tiles = _cdiv(max(0, min(Sk, m0 + rows + hi_off)) + rows - 1, rows)
    return range(min(n_tiles, max(0, m0 + lo_off) // rows), n_tiles)


def _cdiv(a, b):  # C's truncating division, as the kernel's int arithmetic
    return int(a / b)


@pytest.mark.parametrize("Sq, Sk", [(1, 1), (37, 45), (200, 130), (130, 333), (64, 64), (1, 300), (300, 1)])
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("window", [(0, 0), (5, 3), (-1, 0), (0, -1), (63, 0), (100, 7), (2, 200), (-1, 40)])
def test_window_ranges_cover_the_mask(Sq, Sk, causal, window):
    """The window's query-block range per key block (the mirror of the forward's key range) and
    the dQ pass's key-tile range per query block cover every visible (query, key) pair, and skip
    at least the blocks that see none when the window is narrow."""
    left, right = finite_window(window, Sq, Sk)
    visible = window_mask(Sq, Sk, window, "cpu")
    if causal:
        visible &= causal_mask(Sq, Sk, "cpu", causal)
    for keys in (64, 128):  # one or two warpgroups
        for n0 in range(0, Sk, keys):
            blocks = _query_blocks(n0, keys, Sq, Sk, causal, left, right)
            rows_seen = visible[:, n0:n0 + keys].any(dim=1).nonzero().flatten().tolist()
            assert all(r // 64 in blocks for r in rows_seen), (n0, keys, blocks, rows_seen[:5])
            if not rows_seen:
                assert len(blocks) == 0 or window[0] < 0 or window[1] < 0 or causal, (n0, blocks)
    for m0 in range(0, Sq, 64):
        tiles = _key_tiles(m0, Sq, Sk, causal, left, right)
        keys_seen = visible[m0:m0 + 64].any(dim=0).nonzero().flatten().tolist()
        assert all(j // 64 in tiles for j in keys_seen), (m0, tiles, keys_seen[:5])
        if keys_seen:
            assert tiles.start <= keys_seen[0] // 64 and tiles.stop - 1 >= keys_seen[-1] // 64


def _lse(q, k, *, causal, scale, window, softcap, sinks):
    """The forward's row log-sum-exp in float64, with the sink in its denominator."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    rep = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(rep, dim=1).transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    Sq, Sk = q.shape[2], k.shape[2]
    mask = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        mask &= causal_mask(Sq, Sk, "cpu", causal)
    if window is not None:
        mask &= window_mask(Sq, Sk, window, "cpu")
    s = s.masked_fill(~mask, -math.inf)
    sink = sinks.double()[None, :, None, None].expand(q.shape[0], -1, Sq, 1)
    return torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1)


@pytest.mark.parametrize("shape", [(2, 4, 2, 37, 45, 64, "bottom_right"), (1, 2, 1, 50, 20, 64, "bottom_right"),
                                   (2, 2, 2, 30, 30, 64, False), (1, 4, 4, 20, 70, 64, "top_left")], ids=str)
@pytest.mark.parametrize("variant", [{}, {"window": (5, 0)}, {"softcap": 5.0}, {"window": (3, 2), "softcap": 30.0}],
                         ids=lambda d: "-".join(d) or "sinks-only")
def test_sinks_gradient_matches_float64_autograd(shape, variant):
    """stage8.sinks_gradient, the host's dσ_h = −Σ_rows exp(σ_h − lse)·δ (δ = rowsum(dO ∘ O)),
    from the float64 forward's lse and O, equals float64 autograd's gradient of the sinks through
    lib.reference (on the CPU: the formula itself; the GPU tests take lse and δ from the kernels),
    including rows that see no key (bottom-right, Sq > Sk: their lse is the sink's alone)."""
    B, H, Hk, Sq, Sk, D, causal = shape
    g = torch.Generator().manual_seed(Sq * 7 + Sk)
    q, k, v = (torch.randn(B, h, s, D, generator=g, dtype=torch.float64) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
    q = q * 3
    sinks = torch.randn(H, generator=g, dtype=torch.float64) + 1.0
    dout = torch.randn(B, H, Sq, D, generator=g, dtype=torch.float64)
    out = reference_attention(q, k, v, causal=causal, sinks=sinks, **variant)
    lse = _lse(q, k, causal=causal, scale=None, sinks=sinks, window=variant.get("window"),
               softcap=variant.get("softcap"))
    delta = (dout * out).sum(-1)
    got = stage8.sinks_gradient(sinks, lse, delta)
    want = reference_backward(q, k, v, dout, causal=causal, sinks=sinks, **variant)[3]
    assert got.dtype == torch.float32 and got.shape == (H,)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    if not float(want.abs().max()):  # (top-left with a bottom-right window: no row sees a key, O = 0)
        return
    # and wrong ones fail: δ of the wrong sign, or a lse without the sink
    assert not torch.allclose(stage8.sinks_gradient(sinks, lse, -delta).double(), want, rtol=1e-3)
    lse_plain = _lse(q, k, causal=causal, scale=None, sinks=torch.full((H,), -math.inf, dtype=torch.float64),
                     window=variant.get("window"), softcap=variant.get("softcap"))
    assert not torch.allclose(stage8.sinks_gradient(sinks, lse_plain.clamp(min=-1e30), delta).double(), want,
                              rtol=1e-3)
    empty = torch.empty(B, H, 0)
    assert torch.equal(stage8.sinks_gradient(sinks, empty, empty), torch.zeros(H))


def fake_stage6_and_backward(monkeypatch, calls):
    """Stage 6's forward and stage 8's backward replaced by float64 PyTorch on the CPU, recording
    the keywords each gets (the forward writes lse with the sink; the backward's dsinks is the host
    formula's, its dq, dk, dv float64 autograd's). Every path of stages.autograd then runs on the
    CPU: the variants' Function, the plain one (stage8._Attention, which calls _backward) and
    packed sequences (their checks without the device check, as test_backward.fake_kernels)."""
    def forward(q, k, v, *, causal=False, scale=None, lse=None, window=None, softcap=None, sinks=None,
                softcap_tanh=None, **options):
        calls.append(("forward", dict(window=window, softcap=softcap, sinks=sinks, softcap_tanh=softcap_tanh,
                                      options=options)))
        assert sinks is None or not sinks.requires_grad, "stage 6 refuses sinks that require grad"
        assert lse is not None
        H = q.shape[1]
        s = sinks if sinks is not None else torch.full((H,), -math.inf)
        lse.copy_(_lse(q.detach(), k.detach(), causal=causal, scale=scale, window=window, softcap=softcap, sinks=s))
        return reference_attention(q, k, v, causal=causal, scale=scale, window=window, softcap=softcap,
                                   sinks=sinks).to(q.dtype)

    def backward(q, k, v, out, dout, lse, *, causal=False, scale=None, window=None, softcap=None, sinks=None,
                 softcap_tanh=None, deterministic=False):
        calls.append(("backward", dict(window=window, softcap=softcap, sinks=sinks, softcap_tanh=softcap_tanh,
                                       deterministic=deterministic)))
        with torch.enable_grad():  # the engine runs a backward with grad mode off
            g = reference_backward(q, k, v, dout, causal=causal, scale=scale, window=window, softcap=softcap,
                                   sinks=sinks)
        grads = tuple(t.to(q.dtype) for t in g[:3])
        if sinks is None:
            return grads
        delta = (dout.double() * out.double()).sum(-1)
        return grads + (stage8.sinks_gradient(sinks, lse, delta),)

    monkeypatch.setattr(stage6, "attention", forward)
    monkeypatch.setattr(stage8, "attention_backward", backward)
    monkeypatch.setattr(stage8, "_backward", lambda q, k, v, out, dout, lse, *, causal, scale:
                        backward(q, k, v, out, dout, lse, causal=causal, scale=scale))
    monkeypatch.setattr(autograd, "validate_varlen", partial(validate_varlen, check_device=False))
    return calls


@pytest.mark.parametrize("variant", [{"window": (4, 0)}, {"softcap": 5.0, "softcap_tanh": "exp2"},
                                     {"sinks": True}, {"window": (2, 3), "softcap": 30.0, "sinks": True}],
                         ids=lambda d: "-".join(d))
@pytest.mark.parametrize("sinks_grad", [True, False])
def test_autograd_carries_the_variants(monkeypatch, variant, sinks_grad):
    """stages.autograd.attention(forward=6, window=, softcap=, sinks=) with gradients: the same
    variants reach the forward and stage 8's backward (the Python Function, not the C++ node),
    the forward sees the sinks detached, and the sinks get their gradient when they require it
    (none when they do not); dq, dk, dv and dsinks are float64 autograd's through lib.reference."""
    from stages import autograd_node
    monkeypatch.setattr(autograd_node, "attention", lambda *a, **kw: pytest.fail("the C++ node was asked"))
    calls = fake_stage6_and_backward(monkeypatch, [])
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, h, s, 64, generator=g) for h, s in ((4, 20), (2, 33), (2, 33)))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    kw = dict(variant)
    if kw.get("sinks") is True:
        sinks = torch.randn(4, generator=g)
        kw["sinks"] = sinks.clone().requires_grad_(sinks_grad)
    out = autograd.attention(*leaves, forward=6, causal="bottom_right", **kw)
    assert out.grad_fn is not None
    dout = torch.randn(out.shape, generator=g)
    out.backward(dout)
    assert [c[0] for c in calls] == ["forward", "backward"]
    for name in ("window", "softcap", "softcap_tanh"):
        assert calls[0][1][name] == kw.get(name) and calls[1][1][name] == kw.get(name), name
    assert calls[0][1]["options"] == {}
    ref_kw = {n: kw[n] for n in ("window", "softcap", "sinks") if n in kw}
    want = reference_backward(q, k, v, dout, causal="bottom_right", **ref_kw)
    for name, got, w in zip(("dq", "dk", "dv"), [t.grad for t in leaves], want):
        torch.testing.assert_close(got.double(), w, rtol=1e-4, atol=1e-4, msg=name)
    if "sinks" in kw:
        assert calls[1][1]["sinks"] is not None and not calls[1][1]["sinks"].requires_grad
        if sinks_grad:
            torch.testing.assert_close(kw["sinks"].grad.double(), want[3], rtol=1e-4, atol=1e-4)
        else:
            assert kw["sinks"].grad is None


def test_sinks_alone_requiring_grad_train(monkeypatch):
    """Sinks that require grad, with q, k and v that do not: still a grad_fn (stage 6 alone would
    refuse such sinks), and only the sinks get a gradient."""
    fake_stage6_and_backward(monkeypatch, [])
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 10, 64, generator=g) for _ in range(3))
    sinks = torch.randn(2, generator=g).requires_grad_(True)
    out = autograd.attention(q, k, v, forward=6, sinks=sinks)
    assert out.grad_fn is not None
    dout = torch.randn(out.shape, generator=g)
    out.backward(dout)
    want = reference_backward(q, k, v, dout, sinks=sinks)[3]
    torch.testing.assert_close(sinks.grad.double(), want, rtol=1e-4, atol=1e-4)


def test_stage5_refuses_variants_with_gradients():
    q, k, v = (torch.randn(1, 2, 8, 64, requires_grad=True) for _ in range(3))
    with pytest.raises(NotImplementedError, match="stage 5"):
        autograd.attention(q, k, v, forward=5, window=(4, 0))


def test_backward_checks_its_variants():
    """attention_backward's own checks of the variants, before anything else (CPU tensors)."""
    q = torch.randn(1, 2, 8, 64)
    args = (q, q, q, q, q, torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match="sinks must be a float32 tensor of shape"):
        stage8.attention_backward(*args, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="softcap_tanh chooses"):
        stage8.attention_backward(*args, softcap_tanh="exp2")
    with pytest.raises(ValueError, match="softcap must be"):
        stage8.attention_backward(*args, softcap=-1.0)
    with pytest.raises(ValueError, match="window must be"):
        stage8.attention_backward(*args, window=(3,))


# ---- GPU (an H100/H200) -----------------------------------------------------------------------

# (B, H, H_kv, Sq, Sk, D, causal): odd lengths, Sq ≠ Sk both ways, GQA, both alignments
GPU_SHAPES = [
    (2, 4, 2, 37, 45, 64, "bottom_right"),
    (1, 8, 2, 200, 130, 128, "bottom_right"),
    (2, 2, 1, 130, 333, 64, "top_left"),
    (1, 4, 4, 129, 67, 128, False),
    (1, 4, 1, 300, 300, 64, True),
    (1, 2, 2, 1, 257, 128, "bottom_right"),
]
# windows: one side only, both, narrower than a tile, wider than the keys; softcaps 5 and 30
GPU_VARIANTS = [
    {"window": (5, 3)}, {"window": (-1, 0)}, {"window": (0, -1)}, {"window": (63, 0)}, {"window": (100, 7)},
    {"softcap": 5.0}, {"softcap": 30.0}, {"sinks": True},
    {"window": (20, 0), "softcap": 30.0}, {"window": (7, 7), "softcap": 5.0, "sinks": True},
    {"softcap": 30.0, "sinks": True},
]


def _variant_id(d):
    return "-".join(f"{k}{v}" if k != "sinks" else k for k, v in d.items()).replace(" ", "")


def _inputs(shape, dtype, seed, variant):
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dtype, seed=seed)
    if "softcap" in variant:
        q = (q.float() * 4).to(dtype)  # scores that reach the cap
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=dtype)
    kw = dict(variant)
    if kw.get("sinks") is True:
        kw["sinks"] = torch.randn(H, generator=gen, device="cuda") + 1.0
    return q, k, v, dout, causal, kw


def _check(grads, q, k, v, dout, causal, kw):
    """check_gradients for a variant call, told whether the build's softcap is tanh.approx."""
    approx = "softcap" in kw and softcap_build(q.dtype, kw.get("softcap_tanh")) == 1
    return check_gradients(grads, q, k, v, dout, causal=causal, approx_tanh=approx,
                           **{n: x for n, x in kw.items() if n != "softcap_tanh"})


def _assert_passes(checks, label):
    for name, c in checks.items():
        assert c.passed, f"{label} {name}: {c.summary()}"


@gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", GPU_VARIANTS, ids=_variant_id)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_variant_gradients_match_reference(shape, variant, dtype, seed):
    """attention_backward with the forward's variants, from stage 6's lse and output: dq, dk, dv
    (and dsinks) against float64 autograd of lib.reference by check_gradients's rule."""
    q, k, v, dout, causal, kw = _inputs(shape, dtype, seed, variant)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = stage6.attention(q, k, v, causal=causal, lse=lse, **kw)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw)
    assert len(grads) == (4 if "sinks" in kw else 3)
    _assert_passes(_check(grads, q, k, v, dout, causal, kw), f"{shape} {variant} seed {seed}")


@gpu
@hopper
@pytest.mark.parametrize("switches", [{"dq_atomics": 0}, {"dq_bulk": 0}, {"warpgroups": 1}, {"tma_loads": 0},
                                      {"overlap": 0}], ids=_variant_id)
@pytest.mark.parametrize("D", [64, 96, 128])
def test_variant_builds_with_other_switches(D, switches, seed):
    """The variant builds with the WGMMA build's other switches (the dQ pass among them, which
    has its own window range and mask): window, softcap and sinks at once."""
    shape = (2, 4, 2, 150, 97, D, "bottom_right")
    q, k, v, dout, causal, kw = _inputs(shape, torch.bfloat16, seed, {"window": (30, 5), "softcap": 20.0,
                                                                      "sinks": True})
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = stage6.attention(q, k, v, causal=causal, lse=lse, **kw)
    try:
        grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, **kw, **switches)
    except ValueError as e:  # a switch this head dim's build does not take
        pytest.skip(str(e))
    _assert_passes(_check(grads, q, k, v, dout, causal, kw), f"D{D} {switches} seed {seed}")


@gpu
@hopper
@pytest.mark.parametrize("variant", [{"window": (16, 0)}, {"softcap": 30.0, "sinks": True},
                                     {"window": (8, 8), "softcap": 5.0, "sinks": True}], ids=_variant_id)
@pytest.mark.parametrize("D", [64, 96, 128, 256])
def test_autograd_variants_train(D, variant, seed):
    """stages.autograd.attention(forward=6) with the variants and leaves that require grad
    (sinks too): .grad of each against float64 autograd."""
    q, k, v, dout, causal, kw = _inputs((2, 4, 2, 77, 140, D, "bottom_right"), torch.bfloat16, seed, variant)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    call_kw = dict(kw)
    if "sinks" in kw:
        call_kw["sinks"] = kw["sinks"].clone().requires_grad_(True)
    out = autograd.attention(*leaves, forward=6, causal=causal, **call_kw)
    out.backward(dout)
    grads = [t.grad for t in leaves] + ([call_kw["sinks"].grad] if "sinks" in kw else [])
    _assert_passes(_check(grads, q, k, v, dout, causal, kw), f"D{D} {variant} seed {seed}")


@gpu
@hopper
def test_packed_sequences_train_with_variants(seed):
    """stages.autograd.attention_varlen with a window, softcap and sinks: each sequence's
    gradients against float64 autograd of that sequence alone; dsinks the sum over sequences."""
    from lib.reference import packed_inputs
    lens = [(37, 80), (0, 10), (64, 64), (100, 30)]
    q, k, v, cu_q, cu_k = packed_inputs([a for a, _ in lens], [b for _, b in lens], 4, 2, 64,
                                        dtype=torch.bfloat16, device="cuda", seed=seed)
    H = q.shape[1]
    sinks = (torch.randn(H, device="cuda") + 1).requires_grad_(True)
    kw = {"window": (10, 2), "softcap": 20.0}
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = autograd.attention_varlen(*leaves, cu_q, cu_k, 100, 80, forward=6, causal="bottom_right", sinks=sinks, **kw)
    dout = torch.randn(out.shape, device="cuda", dtype=out.dtype)
    out.backward(dout)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    total_dsinks = torch.zeros(H, dtype=torch.float64, device="cuda")
    for b in range(len(lens)):
        if cq[b + 1] == cq[b] or ck[b + 1] == ck[b]:
            continue
        def seq(t, a, z):
            return t[a:z].unsqueeze(0).transpose(1, 2)
        views = (seq(q, cq[b], cq[b + 1]), seq(k, ck[b], ck[b + 1]), seq(v, ck[b], ck[b + 1]))
        got = tuple(seq(t.grad, *((cq[b], cq[b + 1]) if i == 0 else (ck[b], ck[b + 1]))) for i, t in enumerate(leaves))
        checks = check_gradients(got, *views, seq(dout, cq[b], cq[b + 1]), causal="bottom_right",
                                 sinks=sinks.detach(), **kw)  # three gradients: dsinks judged below
        _assert_passes(checks, f"sequence {b} seed {seed}")
        total_dsinks += reference_backward(*views, seq(dout, cq[b], cq[b + 1]), causal="bottom_right",
                                           sinks=sinks, **kw)[3]
    err = float((sinks.grad.double() - total_dsinks).abs().max())
    assert err <= 2e-2 * (1 + float(total_dsinks.abs().max())), f"dsinks error {err:.3e}"


@pytest.mark.parametrize("variant", [{"softcap": 5.0}, {"softcap": 30.0, "window": (6, 2)}, {"window": (0, -1)},
                                     {"softcap": 5.0, "sinks": True}], ids=lambda d: "-".join(d))
@pytest.mark.parametrize("scale", [None, -0.2])
def test_the_kernels_math_matches_float64_autograd(variant, scale):
    """The backward as stages/stage8_wgmma.cu computes it, in float64 on the CPU: t = tanh(q·k·scale
    / c) (cap_mul keeps the scale's sign), P = exp(c·t − lse) masked as the forward masks, dS =
    P ∘ (dP − δ) ∘ (1 − t²), dQ = dS·K·scale, dK = dSᵀ·Q·scale, dV = Pᵀ·dO, the sinks only through
    lse: equal to float64 autograd of lib.reference (GQA summed, bottom-right, Sq ≠ Sk)."""
    B, H, Hk, Sq, Sk, D = 1, 4, 2, 23, 41, 64
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, h, s, D, generator=g, dtype=torch.float64) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
    q = q * 3
    dout = torch.randn(B, H, Sq, D, generator=g, dtype=torch.float64)
    kw = dict(variant)
    if kw.get("sinks") is True:
        kw["sinks"] = torch.randn(H, generator=g, dtype=torch.float64)
    sc = 1 / math.sqrt(D) if scale is None else scale
    out = reference_attention(q, k, v, causal="bottom_right", scale=sc, **kw)
    lse = _lse(q, k, causal="bottom_right", scale=sc, window=kw.get("window"), softcap=kw.get("softcap"),
               sinks=kw.get("sinks", torch.full((H,), -math.inf, dtype=torch.float64)))
    kk, vv = (t.repeat_interleave(H // Hk, dim=1) for t in (k, v))
    raw = q @ kk.transpose(-1, -2)
    c = kw.get("softcap")
    t = torch.tanh(raw * (sc / c)) if c else None
    s = c * t if c else raw * sc
    visible = causal_mask(Sq, Sk, "cpu", "bottom_right")
    if "window" in kw:
        visible &= window_mask(Sq, Sk, kw["window"], "cpu")
    p = torch.exp(s - lse[..., None]).masked_fill(~visible, 0.0)
    delta = (dout * out).sum(-1, keepdim=True)
    ds = p * (dout @ vv.transpose(-1, -2) - delta) * ((1 - t * t) if c else 1.0) * sc
    dq = ds @ kk
    dk = (ds.transpose(-1, -2) @ q).view(B, Hk, H // Hk, Sk, D).sum(2)
    dv = (p.transpose(-1, -2) @ dout).view(B, Hk, H // Hk, Sk, D).sum(2)
    want = reference_backward(q, k, v, dout, causal="bottom_right", scale=sc, **kw)
    for name, got, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        torch.testing.assert_close(got, w, rtol=1e-9, atol=1e-9, msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", [{"window": (3, 3)}, {"softcap": 5.0}, {"window": (3, 3), "sinks": True},
                                     {"softcap": 30.0, "sinks": True}], ids=lambda d: "-".join(d))
def test_check_gradients_judges_the_variants(variant, dtype):
    """lib.reference.check_gradients with variants (the GPU tests' judge): the float64 gradients
    rounded to the dtype pass, and each one 5% off fails (dsinks too)."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, h, s, 64, generator=g).to(dtype) for h, s in ((4, 50), (2, 30), (2, 30)))
    if "softcap" in variant:
        q = (q.float() * 4).to(dtype)
    kw = dict(variant)
    if kw.get("sinks") is True:
        kw["sinks"] = torch.randn(4, generator=g) + 1
    dout = torch.randn(q.shape, generator=g).to(dtype)
    ref = reference_backward(q, k, v, dout, causal="bottom_right", **kw)
    grads = tuple(r.to(dtype) for r in ref[:3]) + tuple(r.float() for r in ref[3:])
    checks = check_gradients(grads, q, k, v, dout, causal="bottom_right", **kw)
    assert set(checks) == {"dq", "dk", "dv"} | ({"dsinks"} if "sinks" in kw else set())
    assert all(c.passed for c in checks.values()), {n: c.summary() for n, c in checks.items()}
    for i, name in enumerate(checks):
        bad = tuple(t * 1.05 if j == i else t for j, t in enumerate(grads))
        assert not check_gradients(bad, q, k, v, dout, causal="bottom_right", **kw)[name].passed, name


@pytest.mark.parametrize("deterministic", [True, False])
def test_packed_sequences_pass_deterministic_to_each_backward(monkeypatch, deterministic):
    """stages.autograd.attention_varlen(..., deterministic=): every sequence's stage 8 backward gets
    it, with the variants; the forward does not (it is the backward's alone)."""
    calls = fake_stage6_and_backward(monkeypatch, [])
    g = torch.Generator().manual_seed(3)
    q = torch.randn(30, 4, 64, generator=g).half().requires_grad_(True)
    k, v = (torch.randn(25, 2, 64, generator=g).half().requires_grad_(True) for _ in range(2))
    cu_q, cu_k = torch.tensor([0, 10, 30], dtype=torch.int32), torch.tensor([0, 12, 25], dtype=torch.int32)
    out = autograd.attention_varlen(q, k, v, cu_q, cu_k, 20, 13, forward=6, causal="bottom_right", window=(5, 0),
                                    deterministic=deterministic)
    out.sum().backward()
    assert [c[0] for c in calls] == ["forward", "forward", "backward", "backward"]
    assert all(c[1]["options"] == {} for c in calls if c[0] == "forward")
    assert [c[1]["deterministic"] for c in calls if c[0] == "backward"] == [deterministic] * 2
    assert all(c[1]["window"] == (5, 0) for c in calls)
