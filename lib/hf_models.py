"""Tiny randomly initialised Hugging Face causal LMs to run the stages in (lib.hf): no download,
a few layers, small hidden sizes, the attention features of the real models kept. transformers is
optional (the `hf` extra): importing this module works without it, and the builders say so.

    model = tiny_model("gemma2", torch.bfloat16, "cuda")   # softcap 50, sliding window 8 on layer 0
    model = tiny_llama(torch.float16, "cuda")              # = tiny_model("llama", ...)
"""
from __future__ import annotations

import torch

KINDS = ("llama", "mistral", "gemma2", "gemma3", "gpt_oss")
# The attention implementation transformers itself runs each kind with, the one to compare
# against: Gemma 2's softcap and gpt-oss's sinks have no SDPA path in transformers (eager only).
BASELINE = {"llama": "sdpa", "mistral": "sdpa", "gemma2": "eager", "gemma3": "sdpa", "gpt_oss": "eager"}


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("lib.hf needs transformers: pip install 'transformers>=4.45' "
                          "(the project's `hf` extra)") from None
    return transformers


def tiny_config(kind: str, *, layers: int = 2, head_dim: int = 64, sliding_window: int = 8,
                softcap: float = 50.0, attn_implementation: str | None = None):
    """The config of tiny_model(kind): hidden 256, 4 query heads and 2 K/V heads (GQA) of
    `head_dim`, `layers` layers, vocabulary 1000, and the kind's attention features:
    - "llama": plain causal attention;
    - "mistral": a sliding window of `sliding_window` keys on every layer (Mistral's config);
    - "gemma2": layers alternating sliding window / full (layer 0 sliding), attention logits
      soft-capped at `softcap` (Gemma 2's attn_logit_softcapping; 50 in the real models) and the
      final logits at 30, query_pre_attn_scalar = head_dim. Real Gemma 2 has head dim 256:
      head_dim=256 builds that (stage 6's D256 build);
    - "gemma3": Gemma 3's text model: no softcap, sliding layers then a full one (layer 0
      sliding, the last full), q/k norms;
    - "gpt_oss": layers alternating sliding window / full, a learnt sink logit per query head
      (s_aux), 2 experts, both used by every token: with fewer per token than there are, the
      router's top-k choice is discontinuous, and a rounding can send a token to another expert
      (bf16 logits moved by 0.5 at 300 tokens, in eager attention too), which no attention
      comparison can tell from an error.
    attn_implementation None: BASELINE[kind]."""
    require_transformers()
    import transformers as tf
    common = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=head_dim, num_hidden_layers=layers, vocab_size=1000, max_position_embeddings=4096)
    alternating = [("sliding_attention", "full_attention")[i % 2] for i in range(layers)]
    if kind == "llama":
        config = tf.LlamaConfig(**common)
    elif kind == "mistral":
        config = tf.MistralConfig(**common, sliding_window=sliding_window)
    elif kind == "gemma2":
        config = tf.Gemma2Config(**common, sliding_window=sliding_window, layer_types=alternating,
                                 attn_logit_softcapping=softcap, final_logit_softcapping=30.0,
                                 query_pre_attn_scalar=head_dim, pad_token_id=0)
    elif kind == "gemma3":
        types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        config = tf.Gemma3TextConfig(**common, sliding_window=sliding_window, layer_types=types,
                                     query_pre_attn_scalar=head_dim, pad_token_id=0)
    elif kind == "gpt_oss":
        config = tf.GptOssConfig(**{**common, "intermediate_size": 256}, sliding_window=sliding_window,
                                 layer_types=alternating, num_local_experts=2, num_experts_per_tok=2)
    else:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    config._attn_implementation = attn_implementation or BASELINE[kind]
    return config


def tiny_model(kind: str, dtype=torch.float16, device="cuda", *, seed: int = 0, layers: int = 2,
               head_dim: int = 64, sliding_window: int = 8, softcap: float = 50.0,
               attn_implementation: str | None = None):
    """A small causal LM of `kind` (KINDS; tiny_config says what each keeps of the real model)
    with random weights (seeded, no download), in `dtype` on `device`, in eval mode."""
    config = tiny_config(kind, layers=layers, head_dim=head_dim, sliding_window=sliding_window,
                         softcap=softcap, attn_implementation=attn_implementation)
    import transformers as tf
    cls = {"llama": tf.LlamaForCausalLM, "mistral": tf.MistralForCausalLM, "gemma2": tf.Gemma2ForCausalLM,
           "gemma3": tf.Gemma3ForCausalLM, "gpt_oss": tf.GptOssForCausalLM}[kind]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    if getattr(config, "_experts_implementation", None) and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")  # gpt-oss: a loop over experts, any dtype and device
    return model.to(device=device, dtype=dtype).eval()


def tiny_llama(dtype=torch.float16, device="cuda", *, seed: int = 0, layers: int = 2,
               attn_implementation: str = "sdpa"):
    """A small Llama-style causal LM with random weights (no download): hidden 256, 4 query heads
    and 2 K/V heads (GQA) of head dim 64, `layers` layers, vocabulary 1000; in eval mode."""
    return tiny_model("llama", dtype, device, seed=seed, layers=layers,
                      attn_implementation=attn_implementation)
