"""issue 51, item 2: the Hugging Face adapter (lib.hf) on models with sliding windows (Mistral,
Gemma 2 and 3, gpt-oss), attention logit soft-capping (Gemma 2) and attention sinks (gpt-oss).
On the CPU: the mask reader on masks built by transformers' own sdpa_mask with its sliding-window
rule, the mapping of the layers' arguments onto stage 6's keywords (a stand-in stage 6 computing
lib.reference), whole tiny models through it against transformers' own attention, the
refusals, and (issue 51 item 3) training through stage 6 and stage 8 with both replaced by
float64 PyTorch. On the GPU: stage 6 itself in the tiny models, logits and generate(), and a
training step through stage 6's forward and stage 8's backward, gradients per parameter."""
import dataclasses

import pytest
import torch

pytest.importorskip("transformers", reason="lib.hf needs transformers (pip install '.[hf]')")

from transformers.masking_utils import (causal_mask_function, sdpa_mask,  # noqa: E402
                                        sliding_window_causal_mask_function)

import stages  # noqa: E402
from stages import stage8  # noqa: E402
from conftest import gpu  # noqa: E402
from lib import hf  # noqa: E402
from lib.inputs import NoBackwardError  # noqa: E402
from lib.reference import reference_attention, reference_varlen  # noqa: E402
from test_backward_variants import fake_stage6_and_backward  # noqa: E402
from test_hf import PADDED_LENGTHS, assert_training_step_within_rule  # noqa: E402


class Stage6StandIn:
    """Stage 6's interface (attention() with seqlens_k and the variants' keywords,
    attention_varlen(), INFO), computed by lib.reference on any device; records every call."""

    def __init__(self, number=96):
        self.INFO = dataclasses.replace(stages.get(0).INFO, number=number, gqa=True, varlen=True,
                                        causal_alignments=("top_left", "bottom_right"))
        self.calls = []

    def attention(self, q, k, v, *, causal=False, scale=None, seqlens_k=None, window=None,
                  softcap=None, sinks=None):
        self.calls.append(dict(path="one", q=tuple(q.shape), k=tuple(k.shape), causal=causal,
                               window=window, softcap=softcap, sinks=sinks, seqlens_k=seqlens_k))
        kw = dict(causal=causal, scale=scale, window=window, softcap=softcap, sinks=sinks)
        if seqlens_k is None:
            return reference_attention(q, k, v, **kw).to(q.dtype)
        out = torch.zeros_like(q)
        for b, n in enumerate(seqlens_k.tolist()):
            out[b:b + 1] = reference_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], **kw)
        return out

    def attention_varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, scale=None,
                         window=None, softcap=None, sinks=None):
        self.calls.append(dict(path="varlen", cu=(cu_q.tolist(), cu_k.tolist()), causal=causal,
                               window=window, softcap=softcap, sinks=sinks))
        return reference_varlen(q, k, v, cu_q, cu_k, causal=causal, scale=scale, window=window,
                                softcap=softcap, sinks=sinks)


class PlainStandIn(Stage6StandIn):
    """A stage without the variants' keywords (stages 0-5 and 7)."""

    def attention(self, q, k, v, *, causal=False, scale=None):
        return super().attention(q, k, v, causal=causal, scale=scale)


# --------------------------------------------------------------------------------------------
# the mask reader on transformers' masks

def _hf_mask(padding, q_length, kv_length, q_offset, window=None):
    """transformers' own boolean mask [B, 1, Sq, Sk] (sdpa_mask, as the adapter registers it,
    never skipped) for a 2-D padding mask, causal, with its sliding window of `window` keys."""
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    return sdpa_mask(batch_size=padding.shape[0], q_length=q_length, kv_length=kv_length,
                     q_offset=q_offset, mask_function=fn, attention_mask=padding.bool(),
                     local_size=window, allow_is_causal_skip=False)


def _rebuild(layout: hf.MaskLayout) -> torch.Tensor:
    """The mask [B, Sq, Sk] the stages compute for a layout: per entry, its packed sequence of
    rows q_start … q_end − 1 and keys k_start … k_end − 1, full or causal aligned bottom-right
    within it, with the window (left keys) behind each row's diagonal."""
    B = len(layout.q_start)
    out = torch.zeros(B, layout.Sq, layout.Sk, dtype=torch.bool)
    for b in range(B):
        qs, qe, ks, ke = layout.q_start[b], layout.q_end[b], layout.k_start[b], layout.k_end[b]
        for i in range(qs, qe):
            for j in range(ks, ke):
                diag = ks + (i - qs) + (ke - ks) - (qe - qs)
                ok = not layout.causal or j <= diag
                if layout.window is not None:
                    ok = ok and j >= diag - layout.window
                out[b, i, j] = ok
    return out


def _check(mask, window_keys, *, window_cuts: bool):
    """mask_layout with the layer's window (W − 1 left keys) recovers a layout that rebuilds the
    mask on every real row; rows outside the layout's query ranges are padding."""
    Sq, Sk = mask.shape[-2:]
    layout = hf.mask_layout(mask, Sq, Sk, None if window_keys is None else window_keys - 1)
    rebuilt = _rebuild(layout)
    for b in range(mask.shape[0]):
        rows = slice(layout.q_start[b], layout.q_end[b])
        assert torch.equal(rebuilt[b, rows], mask[b, 0, rows]), (b, layout)
        # a row the layout calls padding may see keys only where a right-padded query does
        # (transformers lets it see the real keys; its output is never used)
        assert not mask[b, 0, :layout.q_start[b]].any(), (b, layout)
    assert (layout.window is not None) == window_cuts, layout
    return layout


W = 8  # the tiny models' sliding window


def _left(lengths, S):
    m = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        m[b, S - n:] = 1
    return m


def test_mask_layout_sliding_window_left_padding():
    """Prefill of a left-padded batch longer than the window: causal with the window, per entry
    (every entry's keys start at its first real token)."""
    pad = _left([20, 13, 3, 1], 20)
    lay = _check(_hf_mask(pad, 20, 20, 0, W), W, window_cuts=True)
    assert lay.causal and lay.window == W - 1
    assert lay.q_start == [0, 7, 17, 19] and lay.k_start == [0, 7, 17, 19] and lay.k_end == [20] * 4
    # without the window the same mask is an arbitrary pattern
    with pytest.raises(NotImplementedError, match="arbitrary pattern"):
        hf.mask_layout(_hf_mask(pad, 20, 20, 0, W), 20, 20)
    # and a window the mask does not have is refused, not applied
    with pytest.raises(NotImplementedError, match="sliding window of 8 keys"):
        hf.mask_layout(_hf_mask(pad, 20, 20, 0), 20, 20, W - 1)


def test_mask_layout_sliding_window_right_padding():
    pad = _left([20, 13, 3], 20).flip(1)
    lay = _check(_hf_mask(pad, 20, 20, 0, W), W, window_cuts=True)
    assert lay.q_end == [20, 13, 3] and lay.k_end == [20, 13, 3] and lay.k_start == [0, 0, 0]


def test_mask_layout_decoding_past_the_window():
    """One query against a cache longer than the window is causal with the window (it sees the
    last W keys), not full; where the window alone hides an entry's padding its keys start at 0,
    so an unpadded cache runs as one call. An entry with fewer real keys than the window keeps
    its padding."""
    Sk = 30
    pad = _left([30, 25], Sk)
    lay = _check(_hf_mask(pad, 1, Sk, Sk - 1, W), W, window_cuts=True)
    assert lay.causal and lay.unpadded and lay.k_end == [Sk, Sk]
    pad = _left([30, 25, 5], Sk)
    lay = _check(_hf_mask(pad, 1, Sk, Sk - 1, W), W, window_cuts=True)
    assert lay.k_start == [0, 0, 25] and not lay.unpadded
    # a few queries at once (speculative decoding, chunked prefill) against the cache
    lay = _check(_hf_mask(pad, 4, Sk, Sk - 4, W), W, window_cuts=True)
    assert lay.q_start == [0, 0, 0] and lay.q_end == [4, 4, 4]


def test_mask_layout_window_past_the_sequence():
    """A window at least as long as the sequence cuts nothing: the layout of plain causal
    attention (no window for the stage), decoding's one query reading as full attention."""
    pad = _left([20, 13, 3], 20)
    lay = _check(_hf_mask(pad, 20, 20, 0, 64), 64, window_cuts=False)
    assert lay == hf.mask_layout(_hf_mask(pad, 20, 20, 0), 20, 20)
    lay = _check(_hf_mask(pad, 1, 20, 19, 20), 20, window_cuts=False)
    assert not lay.causal
    # a static cache not full yet: keys past the end are padding
    lay = _check(_hf_mask(_left([20, 13, 3], 20), 20, 32, 0, W), W, window_cuts=True)
    assert lay.k_end == [20, 20, 20]


def test_mask_layout_keeps_a_layout_per_mask_and_window():
    """Sliding and full layers alternate two masks: both layouts are kept (one host copy per
    mask and window), and a window is part of the key."""
    pad = _left([20, 13], 20)
    sliding, full = _hf_mask(pad, 20, 20, 0, W), _hf_mask(pad, 20, 20, 0)
    a, b = hf.mask_layout(sliding, 20, 20, W - 1), hf.mask_layout(full, 20, 20)
    assert hf.mask_layout(sliding, 20, 20, W - 1) is a and hf.mask_layout(full, 20, 20) is b
    c = hf.mask_layout(full, 20, 20, 63)  # a window that cuts nothing: read again, same layout
    assert c is not b and c == b


# --------------------------------------------------------------------------------------------
# the mapping of the layers' arguments

class _Module(torch.nn.Module):
    is_causal = True


def _qkv(Sq=12, Sk=12, H=4, Hk=2, D=64, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, H, Sq, D, generator=g, dtype=dtype),
            torch.randn(1, Hk, Sk, D, generator=g, dtype=dtype),
            torch.randn(1, Hk, Sk, D, generator=g, dtype=dtype))


def test_arguments_map_onto_stage6_keywords():
    stage = Stage6StandIn()
    f = hf.attention_function(stage)
    sinks = torch.nn.Parameter(torch.randn(4, dtype=torch.bfloat16))
    q, k, v = _qkv()
    with torch.no_grad():
        f(_Module(), q, k, v, None, scaling=0.125, sliding_window=W, softcap=50, s_aux=sinks)
    call = stage.calls[-1]
    assert call["window"] == (W - 1, 0) and call["causal"] == "bottom_right"  # Sq == Sk: either
    assert call["softcap"] == 50.0 and isinstance(call["softcap"], float)
    s = call["sinks"]
    assert s.dtype == torch.float32 and s.is_contiguous() and not s.requires_grad
    assert torch.equal(s, sinks.detach().float())
    with torch.no_grad():  # decoding one query, no mask: bottom-right window, not causal
        f(_Module(), q[:, :, -1:], k, v, None, scaling=0.125, sliding_window=W)
    assert stage.calls[-1]["window"] == (W - 1, 0) and stage.calls[-1]["causal"] is False
    with torch.no_grad():  # no more keys than the window: nothing to cut, no variant build
        f(_Module(), q, k, v, None, scaling=0.125, sliding_window=12)
    assert stage.calls[-1]["window"] is None and stage.calls[-1]["causal"] is True
    with pytest.raises(NotImplementedError, match="top-left causal"):
        f(_Module(), q[:, :, :5], k, v, None, scaling=0.125, sliding_window=W)


def test_refusals():
    q, k, v = _qkv()
    f = hf.attention_function(Stage6StandIn())
    with pytest.raises(NotImplementedError, match="dropout"):
        f(_Module(), q, k, v, None, dropout=0.1, sliding_window=W)
    plain = hf.attention_function(PlainStandIn(number=95))
    for kw in (dict(sliding_window=W), dict(softcap=50.0), dict(s_aux=torch.zeros(4))):
        with pytest.raises(NotImplementedError, match="stage 95 computes plain.*stage 6 computes"):
            plain(_Module(), q, k, v, None, **kw)
    plain(_Module(), q, k, v, None, sliding_window=12)  # a window that cuts nothing: fine


def test_sinks_keep_their_graph():
    """With grad mode on, the sinks reach the stage as a differentiable float32 copy of the
    module's parameter (stages.autograd gives them their gradient): a stand-in computing with
    torch passes the gradient back to the bf16 parameter, as autograd's own sinks."""
    stage = Stage6StandIn()
    f = hf.attention_function(stage)
    sinks = torch.nn.Parameter(torch.randn(4, dtype=torch.bfloat16))
    q, k, v = _qkv()
    out, _ = f(_Module(), q, k, v, None, scaling=0.125, s_aux=sinks)
    assert stage.calls[-1]["sinks"].dtype == torch.float32 and stage.calls[-1]["sinks"].requires_grad
    out.sum().backward()
    plain = sinks.detach().float().requires_grad_()
    reference_attention(q, k, v, causal=True, scale=0.125, sinks=plain).sum().backward()
    assert sinks.grad is not None and sinks.grad.dtype == torch.bfloat16 and plain.grad.abs().max() > 0
    torch.testing.assert_close(sinks.grad, plain.grad.to(torch.bfloat16))


# --------------------------------------------------------------------------------------------
# whole tiny models through the stand-in, against transformers' own attention

KINDS = ["mistral", "gemma2", "gemma3", "gpt_oss"]
FEATURES = {"mistral": {"window"}, "gemma2": {"window", "softcap"}, "gemma3": {"window"},
            "gpt_oss": {"window", "sinks"}}


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_models_through_the_adapter_on_cpu(kind):
    """A left-padded batch longer than the window and one unpadded prompt: the logits at real
    tokens as transformers' (eager for Gemma 2 and gpt-oss), and the layers' arguments reached
    the stand-in: the window on sliding layers only, the softcap, the sinks. Gemma 2's softcap is
    1.0 here so that it changes the logits (at 50 random weights never reach it)."""
    stage = Stage6StandIn()
    name = hf.register_stage(stage, f"fa_test_variants_{kind}")
    model = hf.tiny_model(kind, torch.float32, "cpu", softcap=1.0)
    base = hf.baseline(model)
    ids, mask = hf.left_padded_prompts((20, 13, 3, 1), model.config.vocab_size, "cpu")
    real = mask.bool()
    with torch.no_grad():
        want = (model(ids, attention_mask=mask).logits[real], model(ids[:1]).logits)
        hf.set_attention(model, name)
        got = (model(ids, attention_mask=mask).logits[real], model(ids[:1]).logits)
    hf.set_attention(model, base)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    layers = model.config.num_hidden_layers
    types = getattr(model.config, "layer_types", None) or ["sliding_attention"] * layers
    for call, t in zip(stage.calls, types * 2):  # the padded batch, then the prompt
        assert call["window"] == ((W - 1, 0) if t == "sliding_attention" else None), (call, t)
        assert call["causal"] in ("bottom_right", True)
        assert (call["softcap"] == 1.0) == ("softcap" in FEATURES[kind])
        assert (call["sinks"] is not None) == ("sinks" in FEATURES[kind])
    assert [c["path"] for c in stage.calls] == ["varlen"] * layers + ["one"] * layers


def test_softcap_and_sinks_matter_in_the_tiny_models():
    """The comparison above would see a dropped softcap or sinks: without them the logits move
    by more than ten times its tolerance (1e-4 + 1e-4 of logits below 2)."""
    ids = torch.randint(3, 1000, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        g = hf.tiny_model("gemma2", torch.float32, "cpu", softcap=1.0)
        a = g(ids).logits
        for layer in g.model.layers:
            layer.self_attn.attn_logit_softcapping = None
        assert (g(ids).logits - a).abs().max() > 2e-3
        o = hf.tiny_model("gpt_oss", torch.float32, "cpu")
        a = o(ids).logits
        for layer in o.model.layers:
            layer.self_attn.sinks.fill_(-1e4)
        assert (o(ids).logits - a).abs().max() > 2e-3


@pytest.mark.parametrize("kind", ["mistral", "gpt_oss"])
def test_generate_through_the_adapter_on_cpu(kind):
    """generate() on left-padded prompts longer than the window, both caches (a sliding layer's
    cache keeps the last W − 1 keys): the stand-in gives transformers' tokens and logits."""
    stage = Stage6StandIn()
    name = hf.register_stage(stage, f"fa_test_variants_generate_{kind}")
    model = hf.tiny_model(kind, torch.float32, "cpu")
    res = hf.compare_generate([name], dtype=torch.float32, device="cpu", lengths=(3, 8, 13),
                              new_tokens=8, model=model)
    print("\n" + hf.generate_table(res))
    for r in res:
        assert r.tokens_equal and r.logits_ok and r.compared >= 9, hf.generate_table(res)
    assert any(c["window"] == (W - 1, 0) for c in stage.calls)


def _layer_variants(model, kind: str) -> list[tuple]:
    """Per layer, what the adapter must hand stage 6 on a batch longer than the window:
    (window, softcap, sinks given)."""
    layers = model.config.num_hidden_layers
    types = getattr(model.config, "layer_types", None) or ["sliding_attention"] * layers
    return [((W - 1, 0) if t == "sliding_attention" else None, 1.0 if "softcap" in FEATURES[kind] else None,
             "sinks" in FEATURES[kind]) for t in types]


TRAIN_LENGTHS = {"unpadded": (13, 13), "left-padded": (13, 6, 1)}  # longer than the window (8)


def _batches(lengths, vocab, device, seed):
    """Two batches of prompts of `lengths`, left-padded (mask None when nothing is): the rule is
    judged over both (test_hf.assert_training_step_within_rule says why)."""
    out = []
    for s in (seed, seed + 1):
        ids, mask = hf.left_padded_prompts(lengths, vocab, device, seed=s)
        out.append((ids, mask if len(set(lengths)) > 1 else None))
    return out


@pytest.mark.parametrize("padding", TRAIN_LENGTHS)
@pytest.mark.parametrize("kind", KINDS)
def test_training_through_stage6_on_cpu(kind, padding, monkeypatch):
    """issue 51 item 3, the adapter's part on the CPU: model.train() through fa_stage6 with stage
    6's forward and stage 8's backward replaced by float64 PyTorch (test_backward_variants'
    fake_stage6_and_backward), on prompts longer than the window, unpadded (one call per layer)
    or left-padded (packed sequences: one call per sequence and layer): every forward and
    backward got its layer's window, softcap and sinks, the kernels saw the sinks detached, and
    every parameter's gradient (gpt-oss's sinks included) is within lib.hf.gradient_rule."""
    calls = fake_stage6_and_backward(monkeypatch, [])
    name = hf.register([6])[0]
    model = hf.tiny_model(kind, torch.bfloat16, "cpu", softcap=1.0, seed=3).train()
    lengths = TRAIN_LENGTHS[padding]
    batches = _batches(lengths, model.config.vocab_size, "cpu", seed=5)
    assert_training_step_within_rule(model, batches, name, torch.bfloat16, f"{kind} {padding}, fake kernels")
    calls_per_layer = len(lengths) if padding == "left-padded" else 1
    want = [v for v in _layer_variants(model, kind) for _ in range(calls_per_layer)] * len(batches)
    seen = {d: [(c["window"], c["softcap"], c["sinks"] is not None) for d_, c in calls if d_ == d]
            for d in ("forward", "backward")}
    assert seen["forward"] == want, seen["forward"]
    assert sorted(seen["backward"], key=repr) == sorted(want, key=repr), seen["backward"]


def test_training_at_a_head_dim_without_backward_is_refused(monkeypatch):
    """Stage 8's backward has D256 (real Gemma 2's) in its WGMMA build only: off an sm_90 GPU a
    training step through fa_stage6 at D256 is refused before any forward runs (NoBackwardError
    naming the head dims it has here), unpadded and padded. (Training at D256 and D96: the GPU
    test of tiny models; D96 through the fakes: the test below.)"""
    head_dim = 256
    calls = fake_stage6_and_backward(monkeypatch, [])
    monkeypatch.setattr(stage8, "wgmma_here", lambda: False)
    name = hf.register([6])[0]
    model = hf.tiny_model("gemma2", torch.bfloat16, "cpu", head_dim=head_dim).train()
    hf.set_attention(model, name)
    ids, mask = hf.left_padded_prompts((12, 5), model.config.vocab_size, "cpu")
    try:
        for m in (None, mask):
            with pytest.raises(NoBackwardError, match=f"head dims 64, 96, 128 on this GPU .*; got {head_dim}"):
                model(ids, attention_mask=m, labels=ids, use_cache=False)
    finally:
        hf.set_attention(model, hf.baseline(model))
    assert not calls


def test_training_at_head_dim_96_reaches_the_backward(monkeypatch):
    """D96 (Phi-3's) trains: stage 8 runs it as D128 on zero-padded copies, so the adapter does not
    refuse it; with the kernels faked, a training step's gradients are within the rule."""
    calls = fake_stage6_and_backward(monkeypatch, [])
    name = hf.register([6])[0]
    model = hf.tiny_model("mistral", torch.bfloat16, "cpu", head_dim=96, seed=3).train()
    batches = _batches(TRAIN_LENGTHS["unpadded"], model.config.vocab_size, "cpu", seed=5)
    assert_training_step_within_rule(model, batches, name, torch.bfloat16, "mistral D96, fake kernels")
    assert any(kind == "backward" for kind, _ in calls)


# --------------------------------------------------------------------------------------------
# stage 6 in the tiny models (GPU)

def _need_stage6():
    info = stages.get(6).INFO
    if torch.cuda.get_device_capability() < info.min_cc:
        pytest.skip(f"stage 6 needs compute capability {info.min_cc}")
    return hf.register([6])[0]


GPU_MODELS = [("mistral", 64), ("gemma2", 64), ("gemma2", 256), ("gpt_oss", 64), ("gemma3", 128)]


@gpu
@pytest.mark.parametrize("kind,head_dim", GPU_MODELS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stage6_logits_in_tiny_models(kind, head_dim, dtype):
    """Stage 6 in tiny random Mistral / Gemma 2 (head dim 64, and 256 as the real Gemma 2's: the
    D256 build) / gpt-oss / Gemma 3 (D128) with a window of 8 keys: a left-padded batch of
    prompts of 300, 37, 9 and 1 tokens, and one unpadded prompt of 300, logits at the real tokens
    within the project's rule against a float64 copy (lib.hf.compare_forward: at most twice the
    baseline's error, SDPA or eager for Gemma 2 and gpt-oss, plus 4 roundings of the dtype)."""
    name = _need_stage6()
    model = hf.tiny_model(kind, dtype, "cuda", head_dim=head_dim, softcap=1.0)
    for lengths in ((300, 37, 9, 1), (300,)):
        res = hf.compare_forward([name], dtype=dtype, device="cuda", runs=3, seed=0, model=model,
                                 lengths=lengths)
        print(f"\n{kind} D{head_dim} {lengths}\n" + hf.table(res))
        assert all(r.passed for r in res), hf.table(res)


@gpu
@pytest.mark.parametrize("kind,head_dim", GPU_MODELS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stage6_generate_in_tiny_models(kind, head_dim, dtype):
    """generate() through stage 6: 4 left-padded prompts of 5, 37, 128 and 300 tokens, 32 new
    tokens greedy, static and dynamic caches: the baseline's tokens (but at its near ties) and,
    teacher-forced, its logits within the rule (lib.hf.compare_generate)."""
    name = _need_stage6()
    model = hf.tiny_model(kind, dtype, "cuda", head_dim=head_dim, softcap=1.0)
    res = hf.compare_generate([name], dtype=dtype, device="cuda", new_tokens=32, rounds=1, model=model)
    print(f"\n{kind} D{head_dim}\n" + hf.generate_table(res))
    for r in res:
        assert r.tokens_equal and r.logits_ok, hf.generate_table(res)


# D256 as real Gemma 2's (stage 8's build of its own), D96 as Phi-3's (D128's build, zero-padded)
TRAIN_MODELS = [("mistral", 64), ("gemma2", 64), ("gemma3", 128), ("gpt_oss", 64), ("gemma2", 256), ("mistral", 96)]


@gpu
@pytest.mark.parametrize("padding", ["unpadded", "left-padded"])
@pytest.mark.parametrize("kind,head_dim", TRAIN_MODELS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stage6_training_step_in_tiny_models(kind, head_dim, dtype, padding, seed):
    """issue 51 item 3: a training step of tiny random Mistral / Gemma 2 (softcap 1.0) / Gemma 3
    (D128) / gpt-oss (sinks) through stage 6's forward and stage 8's backward (the variants'
    Python Function; packed sequences one at a time when left-padded: prompts of 93, 40, 7 and 1
    tokens), on two batches: each loss within the rule of the baseline's (SDPA, or eager for
    Gemma 2 and gpt-oss), and every parameter's gradient, gpt-oss's sinks included, within
    lib.hf.gradient_rule against a float64 copy of the model (test_hf.assert_training_step_within_rule)."""
    name = _need_stage6()
    model = hf.tiny_model(kind, dtype, "cuda", head_dim=head_dim, softcap=1.0, seed=seed % 1000).train()
    lengths = (93, 93) if padding == "unpadded" else PADDED_LENGTHS
    batches = _batches(lengths, model.config.vocab_size, "cuda", seed)
    assert_training_step_within_rule(model, batches, name, dtype, f"{kind} D{head_dim} {padding}, seed {seed}")
