"""The stages inside a Hugging Face model: each registered as a transformers attention
implementation ("fa_stage5", ...), a tiny randomly initialised Llama-style model to run them in,
and a comparison of whole forward passes (logits and time) against SDPA.

    import lib.hf
    lib.hf.register()                                   # every stage, as "fa_stage0" ... 
    model = lib.hf.tiny_llama(torch.float16, "cuda")
    model.set_attn_implementation("fa_stage5")
    logits = model(input_ids).logits

transformers is optional (the `hf` extra): importing this module works without it, and the
functions that need it say so.

What the adapter does with what transformers hands an attention function: q [B, H, S, D] and
k, v [B, H_kv, S_kv, D] (GQA: fewer K/V heads; the stages take them as they are, a stage without
GQA would get them repeated), the module's scale, and the attention mask. The stages compute
causal attention (top-left aligned, SDPA's is_causal) or full attention, nothing else: the mask is
registered to be built like SDPA's, which leaves it out (None) exactly when is_causal says it all;
a real mask (padding, or queries offset into a longer cache) is a clear NotImplementedError,
never a silently wrong answer. The output goes back as transformers expects: [B, S, H, D],
contiguous.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

PREFIX = "fa_stage"


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("lib.hf needs transformers: pip install 'transformers>=4.45' "
                          "(the project's `hf` extra)") from None
    return transformers


def attention_function(stage):
    """A transformers attention function that runs `stage` (a stage module: attention() and INFO).

    transformers calls it as f(module, query, key, value, attention_mask, scaling=..., dropout=...,
    **kwargs) and expects (output [B, S, H, D], attention weights or None)."""
    info = stage.INFO

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if dropout:
            raise NotImplementedError(f"stage {info.number} has no attention dropout (got "
                                      f"dropout={dropout}): run the model in eval() mode")
        for name in ("softcap", "sliding_window"):
            if kwargs.get(name) is not None:
                raise NotImplementedError(f"stage {info.number} computes plain causal or full "
                                          f"attention; this layer asks for {name}="
                                          f"{kwargs[name]}")
        Sq, Sk = query.shape[2], key.shape[2]
        is_causal = kwargs.get("is_causal")
        is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
        # As SDPA's adapter: one query (decoding) sees every key, causal or not.
        causal = bool(is_causal) and Sq > 1
        if attention_mask is not None:
            causal = _mask_as_causal(attention_mask, Sq, Sk, info.number)
        if key.shape[1] != query.shape[1] and not info.gqa:
            group = query.shape[1] // key.shape[1]
            key, value = (t.repeat_interleave(group, dim=1) for t in (key, value))
        out = stage.attention(query, key, value, causal=causal, scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    forward.__name__ = f"{PREFIX}{info.number}_attention"
    forward.__doc__ = f"transformers attention function running stage {info.number} ({info.title})."
    return forward


def _mask_as_causal(mask: torch.Tensor, Sq: int, Sk: int, n: int) -> bool:
    """A mask a stage can honour is all-visible (full attention) or exactly SDPA's top-left causal
    mask; anything else (padding, a cache offset) is refused. Reads the mask: one sync."""
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    if visible.shape[-2:] == (Sq, Sk):  # [B or 1, H or 1, Sq, Sk]
        if bool(visible.all()):
            return False
        tril = torch.ones(Sq, Sk, dtype=torch.bool, device=mask.device).tril()
        if bool((visible == tril).all()):
            return True
    raise NotImplementedError(
        f"stage {n} computes causal or full attention over all keys, and this attention mask "
        f"(shape {tuple(mask.shape)}) is neither: padding, or queries offset into a longer "
        "cache. Run without padding (attention_mask None or all ones) and without a cache "
        "(use_cache=False), or use attn_implementation='sdpa'")


def names(numbers=None) -> list[str]:
    import stages
    return [f"{PREFIX}{n}" for n in (stages.NUMBERS if numbers is None else numbers)]


def register(numbers=None) -> list[str]:
    """Register stages (all by default) with transformers as attention implementations
    'fa_stage<n>', with SDPA's mask construction; returns the names."""
    import stages
    out = []
    for n in (stages.NUMBERS if numbers is None else numbers):
        out.append(register_stage(stages.get(n), f"{PREFIX}{n}"))
    return out


def register_stage(stage, name: str) -> str:
    """Register one stage module (or anything with attention() and INFO) under `name`."""
    require_transformers()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, attention_function(stage))
    # Without a mask function of its own, transformers would hand a custom implementation no
    # mask at all, padding included: SDPA's gives None exactly when is_causal says it all.
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def tiny_llama(dtype=torch.float16, device="cuda", *, seed: int = 0, layers: int = 2,
               attn_implementation: str = "sdpa"):
    """A small Llama-style causal LM with random weights (no download): hidden 256, 4 query heads
    and 2 K/V heads (GQA) of head dim 64, `layers` layers, vocabulary 1000; in eval mode."""
    require_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, num_hidden_layers=layers,
                         vocab_size=1000, max_position_embeddings=4096)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.to(device=device, dtype=dtype).eval()


def set_attention(model, name: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # older transformers
        model.config._attn_implementation = name


@dataclass
class ForwardResult:
    implementation: str
    max_abs_err: float      # max |logits − logits of the float64 reference|
    bound: float            # what it must stay within: 2 × SDPA's error + noise
    passed: bool
    ms: float | None        # median time of a whole forward pass (GPU only)


def _time_forward(model, ids, runs: int) -> float:
    """Median wall time of a forward pass in ms, synchronised (the model waits on every call)."""
    times = []
    with torch.inference_mode():
        for _ in range(runs):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids, use_cache=False)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def compare_forward(implementations=None, *, dtype=torch.float16, device="cuda", batch: int = 2,
                    seq: int = 256, runs: int = 20, seed: int | None = None,
                    model=None) -> list[ForwardResult]:
    """Run the tiny Llama (or `model`) on random tokens with each attention implementation and
    with SDPA, and judge the logits against the same weights in float64 with SDPA.

    The rule is the project's one, at the level of the model: an implementation passes when
    max|logits − ref| ≤ 2·max|logits_sdpa − ref| + noise, noise = 4 roundings of `dtype` at the
    logits' magnitude (the last layers' rounding, which no attention implementation avoids).
    SDPA in `dtype` shows how far a correct attention in that dtype lands from float64."""
    require_transformers()
    implementations = register() if implementations is None else list(implementations)
    model = tiny_llama(dtype, device) if model is None else model
    gen = torch.Generator().manual_seed(seed if seed is not None else
                                        int.from_bytes(__import__("os").urandom(4), "little"))
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen).to(device)
    ref_model = _float64_copy(model)
    with torch.inference_mode():
        ref = ref_model(ids, use_cache=False).logits.double()
    del ref_model

    def logits(name):
        set_attention(model, name)
        with torch.inference_mode():
            return model(ids, use_cache=False).logits.double()

    sdpa_err = (logits("sdpa") - ref).abs().max().item()
    noise = 4 * torch.finfo(dtype).eps * ref.abs().max().item()
    timed = torch.cuda.is_available() and torch.device(device).type == "cuda"
    results = []
    for name in ["sdpa", *implementations]:
        out = logits(name)
        err = (out - ref).abs().max().item() if torch.isfinite(out).all() else math.inf
        bound = 2 * sdpa_err + noise
        ms = _time_forward(model, ids, runs) if timed else None
        results.append(ForwardResult(name, err, bound, err <= bound, ms))
    set_attention(model, "sdpa")
    return results


def _float64_copy(model):
    import copy
    ref = copy.deepcopy(model).double()
    set_attention(ref, "sdpa")
    return ref


def table(results: list[ForwardResult]) -> str:
    """The comparison as a text table (for notebooks)."""
    sdpa_ms = next((r.ms for r in results if r.implementation == "sdpa"), None)
    lines = [f"{'implementation':<14} {'max|err|':>10} {'bound':>10} {'passed':>6} {'ms':>8} "
             f"{'vs sdpa':>8}"]
    for r in results:
        ms = f"{r.ms:8.3f}" if r.ms is not None else f"{'—':>8}"
        ratio = f"{r.ms / sdpa_ms:7.2f}×" if r.ms and sdpa_ms else f"{'—':>8}"
        lines.append(f"{r.implementation:<14} {r.max_abs_err:10.2e} {r.bound:10.2e} "
                     f"{str(r.passed):>6} {ms} {ratio}")
    return "\n".join(lines)
