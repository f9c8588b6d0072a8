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

import dataclasses
import inspect
import itertools
import math
import time
import weakref
from dataclasses import dataclass
from functools import partial

import torch

from lib.inputs import wants_grad

PREFIX = "fa_stage"


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("lib.hf needs transformers: pip install 'transformers>=4.45' "
                          "(the project's `hf` extra)") from None
    return transformers


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


def attention_function(stage):
    """A transformers attention function that runs `stage` (a stage module: attention() and INFO).

    transformers calls it as f(module, query, key, value, attention_mask, scaling=..., dropout=...,
    **kwargs) and expects (output [B, S, H, D], attention weights or None)."""
    info = stage.INFO
    takes_seqlens = "seqlens_k" in inspect.signature(stage.attention).parameters
    attend = trainable(stage)

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
        if key.shape[1] != query.shape[1] and not info.gqa:
            group = query.shape[1] // key.shape[1]
            key, value = (t.repeat_interleave(group, dim=1) for t in (key, value))
        if attention_mask is None:
            is_causal = kwargs.get("is_causal")
            is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
            # As SDPA's adapter: one query (decoding) sees every key, causal or not.
            out = attend(query, key, value, causal=bool(is_causal) and Sq > 1, scale=scaling)
            return out.transpose(1, 2).contiguous(), None
        layout = mask_layout(attention_mask, Sq, Sk)
        return run_layout(stage, layout, query, key, value, scaling, takes_seqlens), None

    forward.__name__ = f"{PREFIX}{info.number}_attention"
    forward.__doc__ = f"transformers attention function running stage {info.number} ({info.title})."
    return forward


@dataclass
class MaskLayout:
    """What a transformers attention mask [B, 1 or H, Sq, Sk] says, as the stages take it:
    batch entry b's real queries are rows q_start[b] … q_end[b] − 1 and they see keys
    k_start[b] … k_end[b] − 1 — all of them (causal False), or bottom-right causal within
    those ranges (query row q_end − 1 sees key k_end − 1; one row back, one key fewer).
    Rows outside a q range (padding) see no key."""

    causal: bool
    q_start: list[int]
    q_end: list[int]
    k_start: list[int]
    k_end: list[int]
    Sq: int
    Sk: int

    @property
    def unpadded(self) -> bool:
        """Every entry has all its rows and starts its keys at 0 (only the key ends may differ)."""
        return (all(s == 0 for s in self.q_start + self.k_start)
                and all(e == self.Sq for e in self.q_end))

    def cu(self, starts, ends):
        return [0, *itertools.accumulate(e - s for s, e in zip(starts, ends))]

    def packing(self, device):
        """The unpad/pad indices and offsets of attention_varlen for this layout, made once
        (every layer of a forward pass gets the same mask): (q rows, k rows, cu_q, cu_k,
        max_q, max_k), the rows as (batch index, position) tensors."""
        if getattr(self, "_packing", None) is None:
            from lib.inputs import offsets_tensor  # made from host values: checked without a read-back
            self._packing = (_rows(self.q_start, self.q_end, device), _rows(self.k_start, self.k_end, device),
                             offsets_tensor(self.cu(self.q_start, self.q_end), device),
                             offsets_tensor(self.cu(self.k_start, self.k_end), device),
                             max((e - s for s, e in zip(self.q_start, self.q_end)), default=0),
                             max((e - s for s, e in zip(self.k_start, self.k_end)), default=0))
        return self._packing


_last_layout: list = [None]  # (weakref to the mask, its version, Sq, Sk, layout): the last one read


def mask_layout(mask: torch.Tensor, Sq: int, Sk: int) -> MaskLayout:
    """Read a boolean or additive attention mask as padding (a key range per entry, and the
    query rows that see any key) plus either full attention or causal attention aligned to the
    bottom right within each entry (a cache offset), by building that mask from the ranges and
    comparing. Anything else (an arbitrary pattern) is refused. One copy to the host per mask:
    a model's layers get the same mask object, and the layout read for it is kept."""
    last = _last_layout[0]
    # An inference tensor has no version counter: a model builds a new mask per forward anyway.
    version = -1 if mask.is_inference() else mask._version
    if last is not None and last[0]() is mask and last[1] == version and last[2:4] == (Sq, Sk):
        return last[4]
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    if visible.dim() != 4 or visible.shape[-2:] != (Sq, Sk):
        raise NotImplementedError(f"an attention mask of shape {tuple(mask.shape)}: the stages "
                                  f"read masks of shape [B, 1 or H, {Sq}, {Sk}]")
    heads_differ = visible.shape[1] > 1 and not bool((visible == visible[:, :1]).all())
    vis = visible[:, 0]  # [B, Sq, Sk]
    i = torch.arange(Sq, device=vis.device)[:, None]
    j = torch.arange(Sk, device=vis.device)
    seen_key = vis.any(1)                                                # [B, Sk]
    ks = torch.where(seen_key.any(1), seen_key.int().argmax(1), Sk)      # first key anyone sees
    ke = torch.where(seen_key.any(1), Sk - 1 - seen_key.flip(1).int().argmax(1), -1)  # last
    row_any = vis.any(2)                                                 # [B, Sq]
    row_last = torch.where(row_any, Sk - 1 - vis.flip(2).int().argmax(2), -1)
    first_row = row_any.int().argmax(1)                                  # first row seeing a key
    off = row_last.gather(1, first_row[:, None])[:, 0] - first_row       # its diagonal: j <= i + off
    in_range = (j >= ks[:, None, None]) & (j <= ke[:, None, None])
    causal_mask = in_range & (j <= i + off[:, None, None])
    full_mask = in_range & row_any[:, :, None]
    facts = torch.stack([ks, ke, off, (vis == causal_mask).all((1, 2)).long(),
                         (vis == full_mask).all((1, 2)).long()]).tolist()  # the one sync
    ks_, ke_, off_, is_causal, is_full = facts
    B = vis.shape[0]
    if heads_differ or not (all(is_causal) or all(is_full)):
        raise NotImplementedError(
            f"this attention mask (shape {tuple(mask.shape)}) is neither padding nor causal "
            "attention aligned to the cache (bottom-right), per batch entry: an arbitrary pattern "
            "that the stages do not compute. Use attn_implementation='sdpa' for it")
    # Full attention also passes the causal test when every row's diagonal lies past the last key:
    # read it as full then (decoding's one query included).
    causal = not all(is_full)
    q_start, q_end = [], []
    for b in range(B):
        if ke_[b] < 0:  # an entry that sees nothing
            q_start.append(0), q_end.append(0)
        elif causal:  # rows whose diagonal reaches the first and the last key
            q_start.append(max(0, ks_[b] - off_[b])), q_end.append(min(Sq, ke_[b] - off_[b] + 1))
        else:
            rows = row_any[b].nonzero()[:, 0].tolist()
            if rows != list(range(rows[0], rows[-1] + 1)):
                raise NotImplementedError("this attention mask pads rows in the middle of a "
                                          "sequence: the stages take one range of rows per entry")
            q_start.append(rows[0]), q_end.append(rows[-1] + 1)
    layout = MaskLayout(causal, q_start, q_end, [min(s, e + 1) for s, e in zip(ks_, ke_)],
                        [e + 1 for e in ke_], Sq, Sk)
    _last_layout[0] = (weakref.ref(mask), version, Sq, Sk, layout)
    return layout


def run_layout(stage, layout: MaskLayout, q, k, v, scale, takes_seqlens: bool = False):
    """Attention as `layout` says, output [B, Sq, H, D] (what transformers takes) with zeros in
    padding rows: one call on the tensors as they are when nothing is padded (bottom-right
    causal for a cache offset; the keys cut to their common end, a view, when a static cache
    is not full yet; with stage 6's seqlens_k when the key ends differ);
    otherwise the real rows are packed into sequences (unpad), run by the stage's
    attention_varlen and put back (pad), as transformers' own FlashAttention-2 path does. With
    gradients (a model in train()), stages 5 and 6 run through stages.autograd (trainable,
    trainable_varlen), and key ends that differ go through the packed path too: seqlens_k has
    no backward."""
    info = stage.INFO
    attend = trainable(stage)
    grad = wants_grad(q, k, v)
    B, H, Sq, D = q.shape
    causal = "bottom_right" if layout.causal else False
    if layout.unpadded and len(set(layout.k_end)) == 1:
        end = layout.k_end[0]
        if end < k.shape[2]:
            k, v = k[:, :, :end], v[:, :, :end]
        out = attend(q, k, v, causal=causal, scale=scale)
        return out.transpose(1, 2).contiguous()
    if layout.unpadded and takes_seqlens and not grad:
        lens = torch.tensor(layout.k_end, dtype=torch.int32, device=q.device)
        out = attend(q, k, v, causal=causal, scale=scale, seqlens_k=lens)
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
                                     causal=causal, scale=scale)
    out = torch.zeros(B, Sq, H, D, dtype=q.dtype, device=q.device)
    out[qb, qi] = packed
    return out


def _rows(starts, ends, device):
    """(batch index, row index) of every row start[b] … end[b] − 1, in order, for gathering."""
    b = [bb for bb, (s, e) in enumerate(zip(starts, ends)) for _ in range(s, e)]
    r = [x for s, e in zip(starts, ends) for x in range(s, e)]
    return (torch.tensor(b, dtype=torch.long, device=device),
            torch.tensor(r, dtype=torch.long, device=device))


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
    in interleaved rounds, medians (GPU only)."""
    require_transformers()
    model = tiny_llama(dtype, device) if model is None else model
    ids, mask = left_padded_prompts(lengths, model.config.vocab_size, device, seed)
    ref_model = _float64_copy(model)
    timed = torch.device(device).type == "cuda" and torch.cuda.is_available()
    results = []
    for cache in caches:
        set_attention(model, "sdpa")
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
                    set_attention(model, "sdpa")
                    theirs.append(_ms_per_token(model, ids, mask, new_tokens, cache))
                    set_attention(model, name)
                    mine.append(_ms_per_token(model, ids, mask, new_tokens, cache))
                ms, sdpa_ms = sorted(mine)[rounds // 2], sorted(theirs)[rounds // 2]
            results.append(GenerateResult(name, str(dtype)[6:], cache, equal, matched, compared,
                                          ties, err, bound, err <= bound, ms, sdpa_ms,
                                          own[:, :SAMPLE_TOKENS].tolist(),
                                          tokens[:, :SAMPLE_TOKENS].tolist()))
    set_attention(model, "sdpa")
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
    import copy
    ref = copy.deepcopy(model).double()
    set_attention(ref, "sdpa")
    return ref


def loss_and_gradients(model, ids, attention: str, attention_mask=None) -> tuple[float, dict]:
    """One training step's loss and every parameter's gradient (float64 copies), with the
    attention implementation `attention` and the tokens as their own labels. With an
    `attention_mask` (a padded batch: 1 for real tokens, 0 for padding) the padding is no label
    (-100), as a training loop on padded batches has it."""
    set_attention(model, attention)
    model.zero_grad(set_to_none=True)
    labels = ids if attention_mask is None else ids.masked_fill(attention_mask == 0, -100)
    loss = model(ids, attention_mask=attention_mask, labels=labels, use_cache=False).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.double() for n, p in model.named_parameters()}


def gradient_rule(got: dict, sdpa: dict, ref: dict, dtype) -> dict:
    """The error rule per parameter: {name: (max|got − ref|, tolerance)} with tolerance
    2·max|sdpa − ref| + the dtype's rounding at the gradient's magnitude; `ref` from a float64
    copy of the model."""
    eps = torch.finfo(dtype).eps
    return {n: (float((got[n] - want).abs().max()),
                2 * float((sdpa[n] - want).abs().max()) + eps * float(want.abs().max()))
            for n, want in ref.items()}


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
