"""The stages inside a Hugging Face model: each registered as a transformers attention
implementation ("fa_stage5", ...), tiny randomly initialised models to run them in
(lib.hf_models: Llama, Mistral, Gemma 2 and 3, gpt-oss), and comparisons of whole forward passes
and of generate() (logits, tokens and time) against SDPA (eager for Gemma 2 and gpt-oss, which
transformers runs no other way).

    import lib.hf
    lib.hf.register()                                   # every stage, as "fa_stage0" ...
    model = lib.hf.tiny_model("mistral", torch.float16, "cuda")
    model.set_attn_implementation("fa_stage6")
    logits = model(input_ids).logits

transformers is optional (the `hf` extra): importing this module works without it, and the
functions that need it say so.

What the adapter does with what transformers hands an attention function: q [B, H, S, D] and
k, v [B, H_kv, S_kv, D] (GQA: fewer K/V heads; the stages take them as they are, a stage without
GQA would get them repeated), the module's scale, and the attention mask, built as SDPA's (None
exactly when is_causal says it all). A mask is read (mask_layout) as padding plus full or
bottom-right causal attention per batch entry, with the layer's sliding window if it has one:
one call when nothing is padded, else packed sequences (attention_varlen). The models' variants
(model_variants) go to stage 6: sliding_window, softcap (Gemma 2) and s_aux (gpt-oss's sinks),
in model.train() through stages.autograd (stage 8's backward; the sinks' gradient reaches s_aux).
Refused with a clear error, never a silently wrong answer: an arbitrary mask pattern, dropout,
the variants on a stage without them, gradients at a head dim stage 8 lacks, padding on a stage
without packed sequences. The output goes back as transformers expects: [B, S, H, D], contiguous.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import time
from dataclasses import dataclass
from functools import partial

import torch

from lib.hf_masks import MaskLayout, mask_layout  # noqa: F401
from lib.hf_models import (BASELINE, KINDS, require_transformers, tiny_config, tiny_llama,  # noqa: F401
                           tiny_model)
from lib.inputs import wants_grad

PREFIX = "fa_stage"


def trainable(stage):
    """stage.attention, or for a forward stage that has a backward (stages 5 and 6, with stage
    8's) the composition stages.autograd makes of the two, so that a model trains through it."""
    from stages import autograd
    if autograd.FORWARDS.get(stage.INFO.number) is stage:
        return partial(autograd.attention, forward=stage.INFO.number)
    return stage.attention


def trainable_varlen(stage):
    """stage.attention_varlen, or for stages 5 and 6 stages.autograd.attention_varlen: the
    stage's own call without gradients; with them, its forward and stage 8's backward one packed
    sequence at a time (correct, not fast), so that a model trains on a padded batch."""
    from stages import autograd
    if autograd.FORWARDS.get(stage.INFO.number) is stage:
        return partial(autograd.attention_varlen, forward=stage.INFO.number)
    return stage.attention_varlen


VARIANTS = ("window", "softcap", "sinks")  # the model variants' keywords of a stage's attention()


def takes_variants(stage) -> bool:
    """Whether the stage's attention() takes window=, softcap= and sinks= (stage 6)."""
    return all(k in inspect.signature(stage.attention).parameters for k in VARIANTS)


def model_variants(info, takes: bool, query, key, value, sliding_window=None, softcap=None,
                   s_aux=None) -> tuple[int | None, dict]:
    """What a layer asks for beyond plain attention, as stage 6 takes it: (the sliding window's
    left keys, W − 1 for transformers' window of W keys, or None; {softcap=, sinks=}). The window
    is dropped when the keys are no more than W (it cannot cut one: transformers' own
    FlashAttention path has the same rule). Refused: a stage without the keywords. The sinks, a
    float32 copy that keeps its graph, pass their gradient (stages.autograd's) back to s_aux."""
    window = None
    if sliding_window is not None and key.shape[2] > sliding_window:
        window = int(sliding_window) - 1
    asked = [f"sliding_window={sliding_window}"] if window is not None else []
    asked += [f"softcap={softcap}"] if softcap is not None else []
    asked += ["s_aux (attention sinks)"] if s_aux is not None else []
    if not asked:
        return None, {}
    if not takes:
        raise NotImplementedError(
            f"stage {info.number} computes plain causal or full attention; this layer asks for "
            f"{', '.join(asked)}, which stage 6 computes (attn_implementation='{PREFIX}6')")
    extra = {}
    if softcap is not None:
        extra["softcap"] = float(softcap)
    if s_aux is not None:  # a parameter in the model's dtype: the kernel takes float32 logits
        extra["sinks"] = s_aux.to(device=query.device, dtype=torch.float32).contiguous()
    return window, extra


def attention_function(stage):
    """A transformers attention function that runs `stage` (a stage module: attention() and INFO).

    transformers calls it as f(module, query, key, value, attention_mask, scaling=..., dropout=...,
    sliding_window=..., softcap=..., s_aux=..., **kwargs) and expects (output [B, S, H, D],
    attention weights or None). The models' variants go to a stage whose attention() takes them
    (stage 6: model_variants): sliding_window W → window=(W − 1, 0) with causal (transformers
    keeps keys kv_idx > q_idx − W), softcap → softcap (Gemma 2), s_aux → sinks, float32 (gpt-oss);
    with gradients through stages.autograd for stage 6 (trainable), as plain attention."""
    info = stage.INFO
    takes_seqlens = "seqlens_k" in inspect.signature(stage.attention).parameters
    takes = takes_variants(stage)
    attend = trainable(stage)

    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                sliding_window=None, softcap=None, s_aux=None, **kwargs):
        if dropout:
            raise NotImplementedError(f"stage {info.number} has no attention dropout (got "
                                      f"dropout={dropout}): run the model in eval() mode")
        window, extra = model_variants(info, takes, query, key, value, sliding_window, softcap, s_aux)
        Sq, Sk = query.shape[2], key.shape[2]
        if key.shape[1] != query.shape[1] and not info.gqa:
            group = query.shape[1] // key.shape[1]
            key, value = (t.repeat_interleave(group, dim=1) for t in (key, value))
        if attention_mask is None:
            is_causal = kwargs.get("is_causal")
            is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
            # As SDPA's adapter: one query (decoding) sees every key, causal or not.
            causal = bool(is_causal) and Sq > 1
            if window is not None:  # stage 6's window is aligned bottom-right, as FlashAttention's
                if not is_causal or (causal and Sq != Sk):
                    raise NotImplementedError(
                        f"a sliding window without a mask on {'full' if not is_causal else 'top-left causal'} "
                        f"attention (Sq {Sq}, Sk {Sk}): the stages' window is causal and aligned "
                        "bottom-right (register the adapter's mask function: lib.hf.register)")
                extra["window"] = (window, 0)
                causal = "bottom_right" if causal else False
            out = attend(query, key, value, causal=causal, scale=scaling, **extra)
            return out.transpose(1, 2).contiguous(), None
        layout = mask_layout(attention_mask, Sq, Sk, window)
        return run_layout(stage, layout, query, key, value, scaling, takes_seqlens, **extra), None

    forward.__name__ = f"{PREFIX}{info.number}_attention"
    forward.__doc__ = f"transformers attention function running stage {info.number} ({info.title})."
    return forward


def run_layout(stage, layout: MaskLayout, q, k, v, scale, takes_seqlens: bool = False, **variants):
    """Attention as `layout` says, output [B, Sq, H, D] (what transformers takes) with zeros in
    padding rows: one call on the tensors as they are when nothing is padded (bottom-right
    causal for a cache offset; the keys cut to their common end, a view, when a static cache
    is not full yet; with stage 6's seqlens_k when the key ends differ);
    otherwise the real rows are packed into sequences (unpad), run by the stage's
    attention_varlen and put back (pad), as transformers' own FlashAttention-2 path does. With
    gradients (a model in train()), stages 5 and 6 run through stages.autograd (trainable,
    trainable_varlen), and key ends that differ go through the packed path too: seqlens_k has
    no backward. `variants` (softcap=, sinks=: model_variants) and the layout's window go to
    every path as they are (stage 6's, with gradients too)."""
    info = stage.INFO
    if layout.window is not None:
        variants["window"] = (layout.window, 0)
    attend = trainable(stage)
    grad = wants_grad(q, k, v)
    B, H, Sq, D = q.shape
    causal = "bottom_right" if layout.causal else False
    if layout.unpadded and len(set(layout.k_end)) == 1:
        end = layout.k_end[0]
        if end < k.shape[2]:
            k, v = k[:, :, :end], v[:, :, :end]
        out = attend(q, k, v, causal=causal, scale=scale, **variants)
        return out.transpose(1, 2).contiguous()
    if layout.unpadded and takes_seqlens and not grad:
        lens = torch.tensor(layout.k_end, dtype=torch.int32, device=q.device)
        out = attend(q, k, v, causal=causal, scale=scale, seqlens_k=lens, **variants)
        return out.transpose(1, 2).contiguous()
    if not info.varlen:
        from lib.inputs import stages_with
        raise NotImplementedError(
            f"stage {info.number} takes whole batches only; this attention mask pads the batch's "
            f"sequences to one length, which needs packed sequences (attention_varlen: stages "
            f"{stages_with(lambda i: i.varlen)}). Run one prompt at a time, or use "
            "attn_implementation='sdpa'")
    (qb, qi), (kb, kj), cu_q, cu_k, max_q, max_k = layout.packing(q.device)
    packed = trainable_varlen(stage)(q.transpose(1, 2)[qb, qi], k.transpose(1, 2)[kb, kj],
                                     v.transpose(1, 2)[kb, kj], cu_q, cu_k, max_q, max_k,
                                     causal=causal, scale=scale, **variants)
    out = torch.zeros(B, Sq, H, D, dtype=q.dtype, device=q.device)
    out[qb, qi] = packed
    return out


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


def baseline(model) -> str:
    """The implementation to judge the stages against in `model`: SDPA, or eager for a model
    transformers runs no other way (Gemma 2's softcap, gpt-oss's sinks), and for any model whose
    config softcaps the scores: SDPA cannot, and transformers before 5.24 let Gemma 2 run SDPA
    without its softcap (5.17 does: its float64 reference then lacked the softcap too)."""
    cfg = getattr(model, "config", None)
    softcap = getattr(getattr(cfg, "get_text_config", lambda: cfg)(), "attn_logit_softcapping", None)
    return "sdpa" if getattr(model, "_supports_sdpa", True) and softcap is None else "eager"


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


def _time_forward(model, ids, runs: int, mask=None) -> float:
    """Median wall time of a forward pass in ms, synchronised (the model waits on every call)."""
    times = []
    with torch.inference_mode() if mask is None else torch.no_grad():  # as compare_forward
        for _ in range(runs):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids, attention_mask=mask, use_cache=False)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def compare_forward(implementations=None, *, dtype=torch.float16, device="cuda", batch: int = 2,
                    seq: int = 256, runs: int = 20, seed: int | None = None,
                    model=None, lengths=None) -> list[ForwardResult]:
    """Run the tiny Llama (or `model`) on random tokens with each attention implementation and
    with SDPA, and judge the logits against the same weights in float64 with SDPA. `lengths`
    (prompt lengths): a left-padded batch of them instead (left_padded_prompts), judged at the
    real tokens.

    The rule is the project's one, at the level of the model: an implementation passes when
    max|logits − ref| ≤ 2·max|logits_sdpa − ref| + noise, noise = 4 roundings of `dtype` at the
    logits' magnitude (the last layers' rounding, which no attention implementation avoids).
    SDPA in `dtype` shows how far a correct attention in that dtype lands from float64. A model
    without an SDPA path (Gemma 2, gpt-oss) has eager in SDPA's place throughout (baseline)."""
    require_transformers()
    implementations = register() if implementations is None else list(implementations)
    model = tiny_llama(dtype, device) if model is None else model
    base = baseline(model)
    gen = torch.Generator().manual_seed(seed if seed is not None else
                                        int.from_bytes(__import__("os").urandom(4), "little"))
    if lengths is None:
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen).to(device)
        mask, real, grad_off = None, slice(None), torch.inference_mode
    else:  # no_grad, as generate(): packed offsets want tensors with a version counter
        ids, mask = left_padded_prompts(lengths, model.config.vocab_size, device, gen.initial_seed())
        real, grad_off = mask.bool(), torch.no_grad
    ref_model = _float64_copy(model)
    with grad_off():
        ref = ref_model(ids, attention_mask=mask, use_cache=False).logits.double()[real]
    del ref_model

    def logits(name):
        set_attention(model, name)
        with grad_off():
            return model(ids, attention_mask=mask, use_cache=False).logits.double()[real]

    sdpa_err = (logits(base) - ref).abs().max().item()
    noise = 4 * torch.finfo(dtype).eps * ref.abs().max().item()
    timed = torch.cuda.is_available() and torch.device(device).type == "cuda"
    results = []
    for name in [base, *implementations]:
        out = logits(name)
        err = (out - ref).abs().max().item() if torch.isfinite(out).all() else math.inf
        bound = 2 * sdpa_err + noise
        ms = _time_forward(model, ids, runs, mask) if timed else None
        results.append(ForwardResult(name, err, bound, err <= bound, ms))
    set_attention(model, base)
    return results


@dataclass
class GenerateResult:
    """One implementation's generate() against SDPA's on the same left-padded batch."""

    stage: str              # the attention implementation
    dtype: str
    cache: str              # "static" or "dynamic"
    tokens_equal: bool      # every token SDPA's, except after a near tie in SDPA's own logits
    matched: int            # tokens compared and equal (up to each entry's first near tie)
    compared: int           # tokens compared
    near_ties: int          # entries whose comparison stopped at a near tie
    max_logit_err: float    # teacher-forced on SDPA's tokens: max |logits − float64 reference|
    bound: float            # 2·max|logits_sdpa − reference| + noise
    logits_ok: bool
    ms_per_token: float | None
    sdpa_ms_per_token: float | None
    tokens: list            # the first SAMPLE_TOKENS tokens of each entry, this implementation's
    sdpa_tokens: list       # and SDPA's

    def as_row(self) -> dict:
        return dataclasses.asdict(self)


SAMPLE_TOKENS = 16  # generated tokens per entry kept in a GenerateResult, for showing side by side


class _ForceTokens:
    """A logits processor that makes greedy generation pick `tokens[:, step]`: generate() then
    runs its usual path (cache, padding, positions) on SDPA's tokens, and output_logits keeps the
    raw logits of every step (teacher forcing through generate() itself)."""

    def __init__(self, tokens):
        self.tokens, self.step = tokens, 0

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, -math.inf)
        forced.scatter_(1, self.tokens[:, self.step:self.step + 1], 0.0)
        self.step += 1
        return forced


def left_padded_prompts(lengths, vocab: int, device, seed: int = 0):
    """Random prompts of the given lengths, left-padded into one batch: ids and attention mask."""
    gen = torch.Generator().manual_seed(seed)
    S = max(lengths)
    ids = torch.zeros(len(lengths), S, dtype=torch.long)
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, S - n:] = torch.randint(3, vocab, (n,), generator=gen)
        mask[b, S - n:] = 1
    return ids.to(device), mask.to(device)


def _generate(model, ids, mask, new_tokens, cache, force=None):
    from transformers import LogitsProcessorList
    kw = dict(attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
              eos_token_id=None, cache_implementation=cache, return_dict_in_generate=True,
              output_logits=True, disable_compile=True)
    if force is not None:
        kw["logits_processor"] = LogitsProcessorList([_ForceTokens(force)])
    with torch.no_grad():  # as generate() itself; not inference_mode, whose tensors have no
        out = model.generate(ids, **kw)  # version counter (lib.inputs.offsets_tensor needs one)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits).double()  # [B, T], [T, B, V]


def _ms_per_token(model, ids, mask, new_tokens, cache) -> float:
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    _generate(model, ids, mask, new_tokens, cache)
    sync()
    return (time.perf_counter() - t0) * 1e3 / new_tokens


def compare_generate(implementations, *, dtype=torch.float16, device="cuda", caches=("static", "dynamic"),
                     lengths=(5, 37, 128, 300), new_tokens: int = 64, rounds: int = 3,
                     seed: int = 0, model=None) -> list[GenerateResult]:
    """generate() with each implementation against SDPA's on the tiny Llama (GQA): a batch of
    prompts of `lengths`, left-padded, greedy, `new_tokens` tokens, with each cache.

    Tokens: equal to SDPA's, except that an entry's comparison stops at the first step where
    SDPA's own two best logits are within the error rule of each other (a near tie: a correct
    attention in this dtype could pick either; random small models have them). Logits: every
    step teacher-forced on SDPA's tokens (through generate() itself, _ForceTokens) against the
    same weights in float64 with SDPA, within 2·max|logits_sdpa − ref| + noise (noise as in
    compare_forward). Time: generate()'s wall time per new token, the implementations and SDPA
    in interleaved rounds, medians (GPU only). A model without an SDPA path (Gemma 2, gpt-oss)
    has eager in SDPA's place throughout (baseline)."""
    require_transformers()
    model = tiny_llama(dtype, device) if model is None else model
    base = baseline(model)
    ids, mask = left_padded_prompts(lengths, model.config.vocab_size, device, seed)
    ref_model = _float64_copy(model)
    timed = torch.device(device).type == "cuda" and torch.cuda.is_available()
    results = []
    for cache in caches:
        set_attention(model, base)
        tokens, sdpa_logits = _generate(model, ids, mask, new_tokens, cache)
        _, ref = _generate(ref_model, ids, mask, new_tokens, cache, force=tokens)
        noise = 4 * torch.finfo(dtype).eps * ref.abs().max().item()
        bound = 2 * (sdpa_logits - ref).abs().max().item() + noise
        top2 = sdpa_logits.topk(2, dim=-1).values
        near_tie = (top2[..., 0] - top2[..., 1]) <= bound  # [T, B]
        for name in implementations:
            set_attention(model, name)
            own, _ = _generate(model, ids, mask, new_tokens, cache)
            _, forced = _generate(model, ids, mask, new_tokens, cache, force=tokens)
            err = (forced - ref).abs().max().item() if torch.isfinite(forced).all() else math.inf
            matched = compared = ties = 0
            equal = True
            for b in range(ids.shape[0]):
                for t in range(new_tokens):
                    if own[b, t] == tokens[b, t]:
                        matched += 1
                        compared += 1
                        continue
                    if bool(near_tie[t, b]):
                        ties += 1  # from here on the two runs continue different texts
                    else:
                        compared += 1
                        equal = False
                    break
            ms = sdpa_ms = None
            if timed:
                mine, theirs = [], []
                for _ in range(rounds):  # interleaved: SDPA, this implementation, SDPA, ...
                    set_attention(model, base)
                    theirs.append(_ms_per_token(model, ids, mask, new_tokens, cache))
                    set_attention(model, name)
                    mine.append(_ms_per_token(model, ids, mask, new_tokens, cache))
                ms, sdpa_ms = sorted(mine)[rounds // 2], sorted(theirs)[rounds // 2]
            results.append(GenerateResult(name, str(dtype)[6:], cache, equal, matched, compared,
                                          ties, err, bound, err <= bound, ms, sdpa_ms,
                                          own[:, :SAMPLE_TOKENS].tolist(),
                                          tokens[:, :SAMPLE_TOKENS].tolist()))
    set_attention(model, base)
    return results


def generate_table(results: list[GenerateResult]) -> str:
    """The generate() comparison as a markdown table (for notebooks and logs)."""
    lines = ["| implementation | dtype | cache | tokens equal | matched / compared | near ties | "
             "max logit err | bound | ms/token | SDPA ms/token |", "|" + "---|" * 10]
    for r in results:
        ms = f"{r.ms_per_token:.2f}" if r.ms_per_token is not None else "—"
        sd = f"{r.sdpa_ms_per_token:.2f}" if r.sdpa_ms_per_token is not None else "—"
        lines.append(f"| {r.stage} | {r.dtype} | {r.cache} | {r.tokens_equal} | {r.matched} / "
                     f"{r.compared} | {r.near_ties} | {r.max_logit_err:.2e} | {r.bound:.2e} | "
                     f"{ms} | {sd} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# the recorded generate() comparison (results/<gpu>.json, "generate"), for the notebooks:
# none of these needs transformers or a GPU

def record_provenance(rec: dict) -> str:
    env = rec["env"]
    return (f"generate() recorded {env['date']} on {env['gpu']}, commit {env['commit']}: "
            f"{rec['model']}; prompts of {', '.join(map(str, rec['prompts']))} tokens, left-padded, "
            f"{rec['new_tokens']} new tokens, greedy; time per token the median of {rec['rounds']} "
            "interleaved rounds (SDPA, stage, SDPA, ...)")


def record_table(rec: dict) -> str:
    """The recorded rows as a markdown table, with each stage's time per token over SDPA's."""
    lines = ["| stage | dtype | cache | tokens equal | matched / compared | near ties | "
             "max logit err (bound) | ms/token | SDPA ms/token | × SDPA's time |", "|---" * 10 + "|"]
    for r in rec["rows"]:
        ratio = r["ms_per_token"] / r["sdpa_ms_per_token"] if r["sdpa_ms_per_token"] else None
        lines.append(f"| {r['stage']} | {r['dtype']} | {r['cache']} | **{r['tokens_equal']}** | "
                     f"{r['matched']} / {r['compared']} | {r['near_ties']} | {r['max_logit_err']:.2e} "
                     f"({r['bound']:.2e}) | {r['ms_per_token']:.2f} | {r['sdpa_ms_per_token']:.2f} | "
                     f"{ratio:.2f}× |" if ratio else "—")
    return "\n".join(lines)


def tokens_side_by_side(rec: dict, stage: int, dtype: str, cache: str, entry: int) -> str:
    """One prompt's first generated tokens from SDPA and from a stage, as a markdown table
    (a differing token in bold)."""
    r = next(x for x in rec["rows"] if (x["stage"], x["dtype"], x["cache"]) == (stage, dtype, cache))
    ours, theirs = r["tokens"][entry], r["sdpa_tokens"][entry]
    cell = lambda a, b: str(a) if a == b else f"**{a}**"  # noqa: E731
    return "\n".join([
        "| step | " + " | ".join(str(i + 1) for i in range(len(ours))) + " |",
        "|---" * (len(ours) + 1) + "|",
        "| SDPA | " + " | ".join(map(str, theirs)) + " |",
        f"| stage {stage} | " + " | ".join(cell(a, b) for a, b in zip(ours, theirs)) + " |"])


def plot_ms_per_token(rec: dict):
    """Time per generated token, each stage beside SDPA's from the same interleaved rounds."""
    import matplotlib.pyplot as plt
    rows = rec["rows"]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    short = {"float16": "fp16", "bfloat16": "bf16"}
    labels = [f"stage {r['stage']}\n{short.get(r['dtype'], r['dtype'])} {r['cache']}" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["sdpa_ms_per_token"] for r in rows], 0.4, label="SDPA", color="0.6")
    ax.bar([i + 0.2 for i in x], [r["ms_per_token"] for r in rows], 0.4, label="stage", color="tab:blue")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("ms per generated token")
    ax.set_title("generate(): tiny Llama, 4 left-padded prompts, 64 tokens (same rounds)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _float64_copy(model):
    """The model in float64, run by its baseline implementation (eager as EAGER64 for the models
    that have no SDPA path) and, for a mixture of experts, by the eager experts (torch's grouped
    matrix product takes no float64)."""
    import copy
    ref = copy.deepcopy(model).double()
    base = baseline(model)
    set_attention(ref, _register_eager64() if base == "eager" else base)
    if hasattr(ref, "set_experts_implementation") and getattr(ref.config, "_experts_implementation", None):
        ref.set_experts_implementation("eager")
    return ref


EAGER64 = "eager_float64"


def _register_eager64() -> str:
    """Register EAGER64: a model's own eager attention, with the eager additive mask made of
    float32's most negative number rather than float64's. transformers' eager softmax runs in
    float32, which turns float64's into -inf, so that a padding row that sees no key becomes NaN
    and spreads to every row through the cache (Gemma 2 in float64, left-padded)."""
    import sys
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def attention(module, *args, **kwargs):
        return sys.modules[type(module).__module__].eager_attention_forward(module, *args, **kwargs)

    def mask(*args, dtype=torch.float32, **kwargs):
        m = eager_mask(*args, dtype=torch.float32, **kwargs)
        return None if m is None else m.to(dtype)

    AttentionInterface.register(EAGER64, attention)
    AttentionMaskInterface.register(EAGER64, mask)
    return EAGER64


def loss_and_gradients(model, ids, attention: str | None, attention_mask=None) -> tuple[float, dict]:
    """One training step's loss and every parameter's gradient (float64 copies), with the
    attention implementation `attention` (None: the one the model has, as _float64_copy set it)
    and the tokens as their own labels. With an `attention_mask` (a padded batch: 1 for real
    tokens, 0 for padding) no label is padding or predicted at a padding position (a left-padded
    entry's first token): such a row sees no key, and what attention gives it is each
    implementation's own (the stages zeros, eager an average). A trained parameter left without
    a gradient (a detached path) raises."""
    if attention is not None:
        set_attention(model, attention)
    model.zero_grad(set_to_none=True)
    labels = ids
    if attention_mask is not None:
        keep = attention_mask.bool().clone()  # (a bool mask: .bool() is the same tensor)
        keep[:, 1:] &= attention_mask[:, :-1].bool()  # label t is predicted at position t − 1
        labels = ids.masked_fill(~keep, -100)
    loss = model(ids, attention_mask=attention_mask, labels=labels, use_cache=False).loss
    loss.backward()
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in trained if p.grad is None]
    if missing:
        raise RuntimeError(f"no gradient reached {', '.join(missing)} (attention "
                           f"{attention or 'as set'}): something on the way detached them")
    return float(loss.detach()), {n: p.grad.double() for n, p in trained}


def gradient_rule(got: dict, sdpa: dict, ref: dict, dtype) -> dict:
    """The error rule per parameter: {name: (max|got − ref|, tolerance)} with tolerance
    2·max|sdpa − ref| + the dtype's rounding at the gradient's magnitude; `ref` from a float64
    copy of the model. A bias, the weight of a constant input, takes the larger of its own and its
    weight's SDPA error and magnitude: its gradient sums the same per-token terms but can cancel
    to one number (gpt-oss's router bias, [x, −x]), whose own yardstick an exact attention
    (float64, rounded once) broke in 11 of 60 seeds (tiny gpt-oss, bf16, CPU)."""
    eps = torch.finfo(dtype).eps
    rule = {}
    for n, want in ref.items():
        group = [n] + ([n[:-4] + "weight"] if n.endswith(".bias") and n[:-4] + "weight" in ref else [])
        sdpa_err = max(float((sdpa[m] - ref[m]).abs().max()) for m in group)
        rule[n] = (float((got[n] - want).abs().max()),
                   2 * sdpa_err + eps * max(float(ref[m].abs().max()) for m in group))
    return rule


def table(results: list[ForwardResult]) -> str:
    """The comparison as a text table (for notebooks)."""
    sdpa_ms = next((r.ms for r in results if r.implementation in ("sdpa", "eager")), None)
    lines = [f"{'implementation':<14} {'max|err|':>10} {'bound':>10} {'passed':>6} {'ms':>8} "
             f"{'vs sdpa':>8}"]
    for r in results:
        ms = f"{r.ms:8.3f}" if r.ms is not None else f"{'—':>8}"
        ratio = f"{r.ms / sdpa_ms:7.2f}×" if r.ms and sdpa_ms else f"{'—':>8}"
        lines.append(f"{r.implementation:<14} {r.max_abs_err:10.2e} {r.bound:10.2e} "
                     f"{str(r.passed):>6} {ms} {ratio}")
    return "\n".join(lines)
