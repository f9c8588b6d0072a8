"""The stages as Hugging Face attention implementations (lib.hf). Needs transformers (the `hf`
extra): without it these tests skip. The adapter's logic (GQA, scale, causal, masks, the output
layout) is tested on the CPU with a stand-in stage that computes attention with torch; the real
stages run in a tiny Llama on the GPU."""
import dataclasses

import pytest
import torch

pytest.importorskip("transformers", reason="lib.hf needs transformers (pip install '.[hf]')")

import stages  # noqa: E402
from conftest import gpu  # noqa: E402
from lib import hf  # noqa: E402
from lib.reference import reference_attention  # noqa: E402
from lib.simulator import HAS_GPU  # noqa: E402


class StandIn:
    """A stage module's interface (attention() and INFO), computing with torch on any device and
    recording what it was given."""

    def __init__(self, gqa: bool):
        self.INFO = dataclasses.replace(stages.get(0).INFO, number=90 + gqa, gqa=gqa)
        self.calls = []

    def attention(self, q, k, v, *, causal=False, scale=None):
        self.calls.append({"q": q.shape, "k": k.shape, "causal": causal, "scale": scale})
        return reference_attention(q, k, v, causal=causal, scale=scale).to(q.dtype)


@pytest.fixture(scope="module")
def model():
    return hf.tiny_llama(torch.float32, "cpu")


def _ids(batch=2, seq=19):
    return torch.randint(0, 1000, (batch, seq))


@pytest.mark.parametrize("gqa", [True, False])
def test_adapter_matches_sdpa_on_cpu(model, gqa):
    stage = StandIn(gqa)
    name = hf.register_stage(stage, f"fa_test_{'gqa' if gqa else 'mha'}")
    ids = _ids()
    hf.set_attention(model, "sdpa")
    with torch.inference_mode():
        want = model(ids, use_cache=False).logits
        hf.set_attention(model, name)
        got = model(ids, use_cache=False).logits
    hf.set_attention(model, "sdpa")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(stage.calls) == model.config.num_hidden_layers
    for call in stage.calls:
        # 4 query heads; 2 K/V heads reach a GQA stage as they are, 4 (repeated) any other
        assert call["q"] == (2, 4, 19, 64) and call["k"] == (2, 2 if gqa else 4, 19, 64)
        assert call["causal"] is True and call["scale"] == pytest.approx(64 ** -0.5)


def test_adapter_decodes_with_a_cache(model):
    """One new token against a cache: no mask, not causal (the query sees every key)."""
    stage = StandIn(True)
    name = hf.register_stage(stage, "fa_test_decode")
    ids = _ids(1, 12)
    results = []
    for impl in ("sdpa", name):
        hf.set_attention(model, impl)
        with torch.inference_mode():
            first = model(ids[:, :-1], use_cache=True)
            results.append(model(ids[:, -1:], past_key_values=first.past_key_values).logits)
    hf.set_attention(model, "sdpa")
    torch.testing.assert_close(results[1], results[0], rtol=1e-4, atol=1e-4)
    assert stage.calls[-1]["causal"] is False and stage.calls[-1]["k"][2] == 12


def test_adapter_refuses_padding(model):
    """A padding mask is something the stages cannot honour: a clear error, not wrong logits."""
    name = hf.register_stage(StandIn(True), "fa_test_padding")
    ids = _ids(2, 9)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    hf.set_attention(model, name)
    try:
        with torch.inference_mode(), pytest.raises(NotImplementedError, match="padding"):
            model(ids, attention_mask=mask, use_cache=False)
        with torch.inference_mode():  # an all-ones mask is no padding: fine
            model(ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        hf.set_attention(model, "sdpa")


def test_registers_every_stage():
    from transformers import AttentionInterface
    names = hf.register()
    assert names == [f"fa_stage{n}" for n in stages.NUMBERS]
    assert all(n in AttentionInterface._global_mapping for n in names)


def test_compare_forward_on_cpu(model):
    hf.register_stage(StandIn(True), "fa_test_compare")
    results = hf.compare_forward(["fa_test_compare"], dtype=torch.float32, device="cpu",
                                 seq=17, model=model)
    assert [r.implementation for r in results] == ["sdpa", "fa_test_compare"]
    assert all(r.passed for r in results), hf.table(results)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiny_llama_with_every_stage(dtype):
    """The CUDA stages inside a whole model: logits within the rule of SDPA's error, every
    stage that takes the dtype, timed."""
    cap = torch.cuda.get_device_capability()
    numbers = [n for n in stages.NUMBERS if dtype in stages.get(n).INFO.dtypes
               and cap >= stages.get(n).INFO.min_cc and 64 in stages.get(n).INFO.head_dims]
    results = hf.compare_forward(hf.register(numbers), dtype=dtype, device="cuda", seq=300,
                                 runs=5)
    print("\n" + hf.table(results))
    assert all(r.passed for r in results), hf.table(results)


@gpu
@pytest.mark.parametrize("n", [5, 6])
def test_training_through_a_stage_is_refused(n):
    """issue 23: a model in train() mode with grad on runs attention on inputs that require
    grad. With no backward, the stage refuses the call (the layer's q/k/v projections would
    otherwise get no gradient from attention, silently); SDPA's run of the same step works."""
    from lib.inputs import NoBackwardError
    info = stages.get(n).INFO
    if torch.cuda.get_device_capability() < info.min_cc:
        pytest.skip(f"stage {n} needs compute capability {info.min_cc}")
    model = hf.tiny_llama(torch.bfloat16, "cuda")
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, 37), device="cuda")
    hf.set_attention(model, "sdpa")
    model(ids, labels=ids, use_cache=False).loss.backward()  # the reference step works
    assert model.model.layers[0].self_attn.q_proj.weight.grad is not None
    name = hf.register([n])[0]
    hf.set_attention(model, name)
    try:
        with pytest.raises(NoBackwardError, match=f"stage {n} has no backward"):
            model(ids, labels=ids, use_cache=False)
        with torch.no_grad():  # inference through the same model still runs
            assert torch.isfinite(model(ids, use_cache=False).logits).all()
    finally:
        hf.set_attention(model, "sdpa")
