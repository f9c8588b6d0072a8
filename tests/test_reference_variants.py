"""The float64 reference's model variants (issue 51): sliding windows, logit softcapping and
attention sinks, each against transformers' eager attention, the definition the stages are to
match (Mistral's and Gemma's sliding window, Gemma 2's softcap, gpt-oss's sinks), on fresh random
inputs of odd sizes, GQA, prefill and decoding against a cache. CPU only, seconds."""
import math
import random
from types import SimpleNamespace

import pytest
import torch

from lib.inputs import make_qkv
from lib.reference import check_output, reference_attention, reference_backward, window_mask

transformers = pytest.importorskip("transformers")
from transformers.masking_utils import sliding_window_causal_mask_function  # noqa: E402
from transformers.models.gemma2 import modeling_gemma2  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

SHAPES = [(2, 4, 2, 37, 37, 64), (1, 8, 2, 5, 83, 32), (3, 6, 3, 19, 50, 16)]  # B, H, Hkv, Sq, Sk, D


def _inputs(B, H, Hkv, Sq, Sk, D, seed):
    torch.manual_seed(seed)
    return make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=torch.float64, device="cpu")


def _float32_softmax_tol(q, k, v, cap=None) -> float:
    """How far transformers' eager attention (softmax in float32 on float64 scores) may be from the
    float64 reference: each score rounded to float32 moves its probability by up to |score|·2⁻²⁴
    (relatively), the normalization as much again, and the output is a mix of V's rows."""
    scores = (q @ k.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)) * q.shape[-1] ** -0.5
    top = cap if cap is not None else scores.abs().max().item()
    return 2 * (top + 4) * 2 ** -24 * v.abs().max().item()


def _module(H, Hkv, D, sinks=None):
    return SimpleNamespace(num_key_value_groups=H // Hkv, head_dim=D, training=False, sinks=sinks)


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    """transformers' eager paths add the mask: 0 where a key is seen, -inf where not."""
    return torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, -math.inf)[None, None]


def _transformers_window(Sq, Sk, W) -> torch.Tensor:
    """transformers' causal sliding window of W keys at absolute positions: the queries are the
    cache's last Sq positions (cache_position), as in decoding."""
    fn = sliding_window_causal_mask_function(W)
    t = torch.tensor  # the mask functions take index tensors
    return torch.tensor([[bool(fn(t(0), t(0), t(Sk - Sq + i), t(j))) for j in range(Sk)] for i in range(Sq)])


@pytest.mark.parametrize("shape", SHAPES)
def test_window_matches_transformers_sliding_window(shape):
    B, H, Hkv, Sq, Sk, D = shape
    W = random.SystemRandom().randrange(1, Sk + 1)
    allowed = _transformers_window(Sq, Sk, W)
    assert torch.equal(window_mask(Sq, Sk, (W - 1, 0), "cpu"), allowed), W
    q, k, v = _inputs(B, H, Hkv, Sq, Sk, D, seed=W)
    want, _ = modeling_gemma2.eager_attention_forward(_module(H, Hkv, D), q, k, v, _additive(allowed),
                                                      scaling=D ** -0.5)
    got = reference_attention(q, k, v, window=(W - 1, 0))
    assert (got - want.transpose(1, 2)).abs().max() < _float32_softmax_tol(q, k, v), W
    # a window of every key on the left is causal bottom-right, and (-1, -1) is no mask at all
    assert torch.allclose(reference_attention(q, k, v, window=(Sk, 0)), reference_attention(q, k, v, causal="bottom_right"))
    assert torch.allclose(reference_attention(q, k, v, window=(-1, -1)), reference_attention(q, k, v))


def test_window_both_sides_and_causal_together():
    """A window open on both sides (left 3, right 2) keeps exactly |j − i'| within them; with
    causal it is the intersection."""
    ok = window_mask(4, 9, (3, 2), "cpu")
    for i in range(4):
        for j in range(9):
            assert bool(ok[i, j]) == (-3 <= j - (i + 5) <= 2)
    q, k, v = _inputs(1, 2, 2, 4, 9, 16, seed=1)
    both = reference_attention(q, k, v, window=(3, 2), causal="bottom_right")
    assert torch.allclose(both, reference_attention(q, k, v, window=(3, 0)))


@pytest.mark.parametrize("shape", SHAPES)
def test_softcap_matches_gemma2(shape):
    B, H, Hkv, Sq, Sk, D = shape
    cap = random.SystemRandom().uniform(0.5, 50.0)
    q, k, v = _inputs(B, H, Hkv, Sq, Sk, D, seed=int(cap * 1000))
    q = q * 4  # large scores, so that the cap bends them
    allowed = window_mask(Sq, Sk, (-1, 0), "cpu")  # causal, bottom-right
    want, _ = modeling_gemma2.eager_attention_forward(_module(H, Hkv, D), q, k, v, _additive(allowed),
                                                      scaling=D ** -0.5, softcap=cap)
    got = reference_attention(q, k, v, causal="bottom_right", softcap=cap)
    assert (got - want.transpose(1, 2)).abs().max() < _float32_softmax_tol(q, k, v, cap), cap  # float32 softmax
    assert (got - reference_attention(q, k, v, causal="bottom_right")).abs().max() > 1e-3  # it did bend them


@pytest.mark.parametrize("shape", SHAPES)
def test_sinks_match_gpt_oss(shape):
    B, H, Hkv, Sq, Sk, D = shape
    seed = random.SystemRandom().randrange(2 ** 31)
    q, k, v = _inputs(B, H, Hkv, Sq, Sk, D, seed=seed)
    sinks = torch.randn(H, dtype=torch.float64) * 2
    allowed = window_mask(Sq, Sk, (-1, 0), "cpu")
    want, _ = modeling_gpt_oss.eager_attention_forward(_module(H, Hkv, D, sinks), q, k, v, _additive(allowed),
                                                       scaling=D ** -0.5)
    got = reference_attention(q, k, v, causal="bottom_right", sinks=sinks)
    assert (got - want.transpose(1, 2)).abs().max() < 1e-12, seed
    # the sink takes weight from every key: a very negative sink is no sink
    assert torch.allclose(reference_attention(q, k, v, causal="bottom_right", sinks=torch.full((H,), -1e4)),
                          reference_attention(q, k, v, causal="bottom_right"))


def test_sinks_gradients_match_autograd_through_gpt_oss():
    """reference_backward's (dq, dk, dv, dsinks) against float64 autograd through transformers'
    gpt-oss eager attention, GQA, causal bottom-right with a window."""
    B, H, Hkv, Sq, Sk, D = 2, 4, 2, 7, 23, 16
    q, k, v = _inputs(B, H, Hkv, Sq, Sk, D, seed=3)
    sinks = torch.randn(H, dtype=torch.float64)
    dout = torch.randn(B, H, Sq, D, dtype=torch.float64)
    got = reference_backward(q, k, v, dout, causal="bottom_right", window=(5, 0), sinks=sinks)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
    allowed = window_mask(Sq, Sk, (5, 0), "cpu")
    out, _ = modeling_gpt_oss.eager_attention_forward(_module(H, Hkv, D, leaves[3]), *leaves[:3],
                                                      _additive(allowed), scaling=D ** -0.5)
    out.transpose(1, 2).backward(dout)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), got, leaves):
        assert (a - b.grad).abs().max() < 1e-10, name


def test_a_row_without_keys_is_zero_with_or_without_sinks():
    q, k, v = _inputs(1, 2, 2, 6, 3, 16, seed=5)  # Sq > Sk bottom-right: the first rows see no key
    for sinks in (None, torch.tensor([0.5, -1.0], dtype=torch.float64)):
        out = reference_attention(q, k, v, causal="bottom_right", sinks=sinks)
        assert torch.isfinite(out).all() and out[:, :, :3].abs().max() == 0
    with pytest.raises(ValueError, match="one logit per query head"):
        reference_attention(q, k, v, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="softcap must be"):
        reference_attention(q, k, v, softcap=0.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", [{"window": (11, 0)}, {"softcap": 3.0}, {"sinks": "random"},
                                     {"window": (6, 2), "softcap": 5.0, "sinks": "random"}])
def test_error_rule_for_variants_passes_a_16bit_kernel_and_fails_a_wrong_one(dtype, variant):
    """check_output with a variant: an output with a 16-bit kernel's roundings in another order
    (float32 throughout, rounded once at the end) passes; the same computation with the variant
    left out, or its window one key too narrow, fails."""
    B, H, Hkv, Sq, Sk, D = 2, 6, 3, 29, 61, 64
    torch.manual_seed(random.SystemRandom().randrange(2 ** 31))
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, device="cpu")
    kw = {**variant}
    if "softcap" in kw:
        q = q * 3  # scores large enough for the cap to bend them
    if kw.get("sinks") == "random":  # near the rows' largest scores, so that a sink takes real weight
        kw["sinks"] = torch.rand(H) * 2 + (4.0 if "softcap" in kw else 1.0)
    good = reference_attention(q, k, v, causal="bottom_right", dtype=torch.float32, **kw).to(dtype)
    c = check_output(good, q, k, v, causal="bottom_right", **kw)
    assert c.passed, c.summary()
    for drop in kw:
        wrong_kw = {n: val for n, val in kw.items() if n != drop}
        wrong = reference_attention(q, k, v, causal="bottom_right", dtype=torch.float32, **wrong_kw).to(dtype)
        assert not check_output(wrong, q, k, v, causal="bottom_right", **kw).passed, f"{drop} left out"
    if "window" in kw:
        left, right = kw["window"]
        narrow = reference_attention(q, k, v, causal="bottom_right", dtype=torch.float32,
                                     **{**kw, "window": (left - 1, right)}).to(dtype)
        assert not check_output(narrow, q, k, v, causal="bottom_right", **kw).passed, "window one key narrower"
