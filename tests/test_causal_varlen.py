"""Serving's shapes: bottom-right causal (queries at the end of a longer cache), packed sequences
of different lengths (varlen), and per-sequence key lengths (decoding against caches of
different lengths). Every output is judged against the float64 reference with the explicit mask
by the project's error rule, on fresh random inputs with NaN-poisoned outputs; the bad inputs
must fail with an error naming the argument."""
import pytest
import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

import stages
from conftest import gpu, runs_here
from lib.inputs import make_qkv, poisoned_outputs, validate, validate_varlen
from lib.reference import check_output, check_varlen_output, packed_inputs
from lib.simulator import HAS_GPU

MODULES = {n: stages.get(n) for n in stages.NUMBERS}
BOTTOM_RIGHT = [n for n, m in MODULES.items() if "bottom_right" in m.INFO.causal_alignments]
VARLEN = [n for n, m in MODULES.items() if m.INFO.varlen]


def need(mod):
    if not runs_here(mod):
        pytest.skip("CUDA C++ stages need a GPU of their compute capability here")


def test_declared():
    """Stages 2–6 align causal masks either way; stages 5 and 6 take packed sequences."""
    assert BOTTOM_RIGHT == [2, 3, 4, 5, 6]
    assert VARLEN == [5, 6]
    for n in VARLEN:
        assert "attention_varlen" in MODULES[n].attention_varlen.__doc__ or \
            "flash_attn_varlen_func" in MODULES[n].attention_varlen.__doc__
        assert "bottom_right" in MODULES[n].attention.__doc__


# ------------------------------------------------------------------------------------------
# validation (any machine)

@pytest.mark.parametrize("n", [0, 1])
def test_bottom_right_refused_by_early_stages(n):
    info = MODULES[n].INFO
    q, k, v = make_qkv(1, 2, 3, 64 if 64 in info.head_dims else 16, Sk=7, device="cpu")
    with pytest.raises(NotImplementedError, match="top-left only.*stages 2, 3, 4, 5, 6"):
        validate(q, k, v, causal="bottom_right", scale=None, info=info, check_device=False)
    # with Sq = Sk the two alignments are one mask: accepted
    q, k, v = make_qkv(1, 2, 7, q.shape[-1], device="cpu")
    validate(q, k, v, causal="bottom_right", scale=None, info=info, check_device=False)


@pytest.mark.parametrize("n", list(MODULES))
def test_mask_arguments(n):
    from lib.inputs import causal_from_mask
    info = MODULES[n].INFO
    q, k, _ = make_qkv(1, 2, 3, 64, Sk=7, device="cpu")
    assert causal_from_mask(False, causal_lower_right(3, 7), q, k, info) == "bottom_right"
    assert causal_from_mask(False, causal_upper_left(3, 7), q, k, info) == "top_left"
    assert causal_from_mask(True, None, q, k, info) is True
    with pytest.raises(ValueError, match="either causal or attn_mask"):
        causal_from_mask(True, causal_lower_right(3, 7), q, k, info)
    with pytest.raises(ValueError, match="Sq=3, Sk=9"):
        causal_from_mask(False, causal_lower_right(3, 9), q, k, info)
    with pytest.raises(NotImplementedError, match="no attention-mask tensor"):
        causal_from_mask(False, torch.ones(3, 7, dtype=torch.bool), q, k, info)
    with pytest.raises(TypeError, match="'top_left' or 'bottom_right'"):
        validate(*make_qkv(1, 1, 3, 64, device="cpu"), causal="lower", scale=None, info=info,
                 check_device=False)


def _packed(lens_q, lens_k, H, Hk, D, dtype, device, seed=None):
    return packed_inputs(lens_q, lens_k, H, Hk, D, dtype=dtype, device=device, seed=seed)


@pytest.mark.parametrize("n", VARLEN)
def test_varlen_bad_input(n):
    """Every bad argument is named (checked by validate_varlen, so on any machine)."""
    info = MODULES[n].INFO
    q, k, v, cq, ck = _packed([3, 0, 5], [4, 2, 5], 4, 2, 64, torch.float16, "cpu")

    def call(**kw):
        args = dict(q=q, k=k, v=v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=5, max_seqlen_k=5)
        args.update(kw)
        return validate_varlen(*args.values(), causal=False, scale=None, info=info, check_device=False)

    call()  # the good call passes
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32"):
        call(cu_seqlens_q=cq.long())
    with pytest.raises(ValueError, match="cu_seqlens_k must be non-decreasing"):
        call(cu_seqlens_k=torch.tensor([0, 4, 3, 11], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens_k must be contiguous.*stride 2"):  # right values, every other one
        call(cu_seqlens_k=torch.stack([ck, ck], 1).reshape(-1)[::2])
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        call(cu_seqlens_q=torch.tensor([1, 3, 3, 8], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[-1\] is 7.*8 tokens"):
        call(cu_seqlens_q=torch.tensor([0, 3, 3, 7], dtype=torch.int32))
    with pytest.raises(ValueError, match="max_seqlen_k is 4.*5 tokens"):
        call(max_seqlen_k=4)
    with pytest.raises(ValueError, match="3 sequences and cu_seqlens_k 2"):
        call(cu_seqlens_k=torch.tensor([0, 4, 11], dtype=torch.int32), max_seqlen_k=7)
    with pytest.raises(ValueError, match="rank 3"):
        call(q=q[None])
    with pytest.raises(TypeError, match="cu_seqlens_q must be a torch.Tensor"):
        call(cu_seqlens_q=[0, 3, 3, 8])
    with pytest.raises(TypeError, match="say the causal alignment"):
        validate_varlen(q, k, v, cq, ck, 5, 5, causal=True, scale=None, info=info, check_device=False)
    assert validate_varlen(q, k, v, cq, ck, 5, 5, causal="bottom_right", scale=None, info=info,
                           check_device=False).causal == 2
    if HAS_GPU:  # offsets on another device than q
        with pytest.raises(ValueError, match="cu_seqlens_q must be on q's device"):
            validate_varlen(q.cuda(), k.cuda(), v.cuda(), cq, ck.cuda(), 5, 5, causal=False,
                            scale=None, info=info)


def test_varlen_refused_by_other_stages():
    q, k, v, cq, ck = _packed([3], [3], 2, 2, 64, torch.float16, "cpu")
    with pytest.raises(NotImplementedError, match="no packed sequences.*stages 5, 6"):
        validate_varlen(q, k, v, cq, ck, 3, 3, causal=False, scale=None, info=MODULES[4].INFO,
                        check_device=False)


# ------------------------------------------------------------------------------------------
# bottom-right causal on the GPU

# (B, H, Hk, Sq, Sk): decoding and chunked prefill (Sq < Sk), Sq > Sk (rows that see no key),
# one query against one key and against 100,003, odd sizes
BR_SHAPES = [(2, 4, 2, 1, 1), (1, 4, 1, 1, 100_003), (2, 4, 4, 5, 300), (1, 8, 2, 37, 1000),
             (2, 2, 2, 129, 77), (1, 2, 1, 300, 1), (1, 4, 4, 200, 333)]


@gpu
@pytest.mark.parametrize("n", BOTTOM_RIGHT)
@pytest.mark.parametrize("shape", BR_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bottom_right_matches_reference(n, shape, seed):
    mod = MODULES[n]
    need(mod)
    B, H, Hk, Sq, Sk = shape
    if Sk > 10_000 and n < 5:
        pytest.skip("the long cache on the fast stages")
    for dtype in mod.INFO.dtypes[:2]:
        D = 64 if 64 in mod.INFO.head_dims else mod.INFO.head_dims[0]
        q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dtype, seed=seed)
        with poisoned_outputs():
            out = mod.attention(q, k, v, attn_mask=causal_lower_right(Sq, Sk))
        c = check_output(out, q, k, v, causal="bottom_right")
        assert c.passed, f"stage {n} {dtype} {shape} seed {seed}: {c.summary()}"
        if Sq > Sk:  # the rows that see no key are zeros, as SDPA's
            assert bool((out[:, :, :Sq - Sk] == 0).all())
        with poisoned_outputs():  # the same by name, and the upper-left bias is is_causal
            assert torch.equal(mod.attention(q, k, v, causal="bottom_right"), out)
            top = mod.attention(q, k, v, attn_mask=causal_upper_left(Sq, Sk))
        assert torch.equal(top, mod.attention(q, k, v, causal=True))


@gpu
@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_rows_without_keys_are_zeros_under_load(n, seed):
    """Bottom-right with Sq ≫ Sk: most blocks have no key tile at all and run no loop. Many such
    blocks per launch, launched again and again: every row that sees no key must be exactly
    zero. (Stage 5's blocks without a key tile passed no block barrier before writing their
    zeros into Q's place, which other warps' copies could still reach: once on the H100, a row of
    Q values in place of zeros.)"""
    mod = MODULES[n]
    need(mod)
    D = 64 if 64 in mod.INFO.head_dims else mod.INFO.head_dims[0]
    q, k, v = make_qkv(4, 16, 2000, D, Sk=3, Hkv=4 if mod.INFO.gqa else 16, dtype=mod.INFO.dtypes[0], seed=seed)
    for _ in range(5):
        with poisoned_outputs():
            out = mod.attention(q, k, v, causal="bottom_right")
        assert bool((out[:, :, :1997] == 0).all()), f"stage {n} seed {seed}"
        c = check_output(out[:, :, 1997:], q[:, :, 1997:], k, v, causal="bottom_right")
        assert c.passed, f"stage {n} seed {seed}: {c.summary()}"


@gpu
def test_stage6_bottom_right_head_dim_128(seed):
    mod = MODULES[6]
    need(mod)
    for B, H, Hk, Sq, Sk in [(2, 8, 2, 4, 1000), (1, 4, 4, 300, 200), (1, 2, 2, 700, 2049)]:
        q, k, v = make_qkv(B, H, Sq, 128, Sk=Sk, Hkv=Hk, dtype=torch.bfloat16, seed=seed)
        with poisoned_outputs():
            out = mod.attention(q, k, v, causal="bottom_right")
        c = check_output(out, q, k, v, causal="bottom_right")
        assert c.passed, f"{(B, H, Hk, Sq, Sk)} seed {seed}: {c.summary()}"


@gpu
def test_stage6_schedules_bottom_right(seed):
    """Every schedule (ping-pong turns, the work queue, no producer) with consumers whose rows
    see no key while the block's others do (Sq > Sk), and with bottom-right tiles."""
    mod = MODULES[6]
    need(mod)
    q, k, v = make_qkv(2, 4, 400, 64, Sk=150, dtype=torch.float16, seed=seed)
    q2, k2, v2 = make_qkv(1, 4, 250, 64, Sk=900, dtype=torch.float16, seed=seed + 1)
    for schedule in mod.ALL_SCHEDULES:
        for a, b, c_ in ((q, k, v), (q2, k2, v2)):
            with poisoned_outputs():
                out = mod.attention(a, b, c_, causal="bottom_right", schedule=schedule)
            c = check_output(out, a, b, c_, causal="bottom_right")
            assert c.passed, f"{schedule} {tuple(a.shape)} {tuple(b.shape)} seed {seed}: {c.summary()}"


# ------------------------------------------------------------------------------------------
# packed sequences and per-sequence key lengths on the GPU

def _check_varlen(out, q, k, v, cq, ck, causal, label):
    for i, c in enumerate(check_varlen_output(out, q, k, v, cq, ck, causal=causal)):
        assert c.passed, f"{label}, sequence with queries {i}: {c.summary()}"


# lengths of q and of k per sequence: empty sequences inside a batch, one token, odd lengths,
# more queries than keys, one long sequence among short ones
VARLEN_CASES = [([5, 0, 37, 128, 300], [5, 0, 37, 128, 300]),
                ([1, 1, 1, 1], [17, 1000, 0, 333]),
                ([3, 64, 10, 0], [200, 64, 7, 5]),
                ([1000, 1, 77], [1000, 2048, 77])]


@gpu
@pytest.mark.parametrize("n", VARLEN)
@pytest.mark.parametrize("case", range(len(VARLEN_CASES)))
@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
def test_varlen_matches_reference(n, case, causal, seed):
    mod = MODULES[n]
    need(mod)
    lens_q, lens_k = VARLEN_CASES[case]
    for dtype, H, Hk, D in ((torch.float16, 4, 2, 64), (torch.bfloat16, 8, 8, 128)):
        q, k, v, cq, ck = _packed(lens_q, lens_k, H, Hk, D, dtype, "cuda", seed)
        with poisoned_outputs():
            out = mod.attention_varlen(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal)
        _check_varlen(out, q, k, v, cq, ck, causal, f"stage {n} {dtype} D{D} {causal} seed {seed}")


@gpu
def test_stage6_varlen_splits_and_packing(seed):
    """The decode paths with packed sequences: split keys and packed GQA rows, forced and chosen."""
    mod = MODULES[6]
    need(mod)
    lens_q, lens_k = [1, 2, 1, 0, 3], [900, 33, 4000, 12, 0]
    q, k, v, cq, ck = _packed(lens_q, lens_k, 8, 2, 128, torch.bfloat16, "cuda", seed)
    for splits, pack in ((None, None), (7, True), (1, False), (128, False)):
        for causal in (False, "bottom_right"):
            if splits and splits > 1 and causal:
                continue
            with poisoned_outputs():
                out = mod.attention_varlen(q, k, v, cq, ck, 3, 4000, causal=causal, splits=splits,
                                           pack_gqa=pack)
            _check_varlen(out, q, k, v, cq, ck, causal, f"splits {splits} pack {pack} {causal}")


@gpu
def test_stage6_seqlens_k(seed):
    """Decoding against caches of different lengths: entry b uses its first seqlens_k[b] keys
    (0 and the whole cache included), split and packed, and bottom-right with a few queries."""
    mod = MODULES[6]
    need(mod)
    B, H, Hk, S, D = 5, 16, 4, 3000, 128
    used = [1, 0, 3000, 1234, 77]
    seqlens = torch.tensor(used, dtype=torch.int32, device="cuda")
    for Sq, causal in ((1, False), (1, "bottom_right"), (4, "bottom_right")):
        q, k, v = make_qkv(B, H, Sq, D, Sk=S, Hkv=Hk, dtype=torch.float16, seed=seed)
        for splits in (None, 1, 16):
            if splits and splits > 1 and Sq > 1:
                continue
            with poisoned_outputs():
                out = mod.attention(q, k, v, causal=causal, seqlens_k=seqlens, splits=splits)
            for b, n_k in enumerate(used):
                if n_k == 0:
                    assert bool((out[b] == 0).all())
                    continue
                kb, vb = k[b:b + 1, :, :n_k], v[b:b + 1, :, :n_k]
                c = check_output(out[b:b + 1], q[b:b + 1], kb, vb, causal=causal)
                assert c.passed, f"Sq {Sq} {causal} splits {splits} entry {b} ({n_k} keys): {c.summary()}"
    with pytest.raises(ValueError, match="seqlens_k must be a contiguous int32 tensor of shape"):
        mod.attention(q, k, v, seqlens_k=seqlens.long())
    with pytest.raises(ValueError, match="seqlens_k must be a contiguous int32 .* strided"):
        mod.attention(q, k, v, seqlens_k=torch.stack([seqlens, seqlens], 1)[:, 0])  # a column: stride 2


@gpu
@pytest.mark.parametrize("n", VARLEN)
def test_varlen_cuda_graph(n, seed):
    """A captured varlen call replays with new offsets written into the same tensors."""
    mod = MODULES[n]
    need(mod)
    q, k, v, cq, ck = _packed([7, 50, 3], [7, 90, 30], 4, 2, 64, torch.float16, "cuda", seed)
    mod.attention_varlen(q, k, v, cq, ck, 64, 128)  # compile and plan outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mod.attention_varlen(q, k, v, cq, ck, 64, 128, causal="bottom_right")
    cq.copy_(torch.tensor([0, 30, 31, 60], dtype=torch.int32))
    ck.copy_(torch.tensor([0, 100, 101, 127], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    _check_varlen(out, q, k, v, cq, ck, "bottom_right", f"stage {n} graph replay seed {seed}")


def test_offsets_made_from_host_values_are_not_read_back(monkeypatch):
    """lib.inputs.offsets_tensor: validate_varlen checks the host values it was made from (no
    copy back, which would make the host wait for the GPU), and reads the tensor again once it
    was changed in place; the checks themselves still run."""
    from lib import inputs
    q, k, v, _, _ = _packed([3, 5], [4, 6], 2, 2, 64, torch.float16, "cpu")
    cq, ck = inputs.offsets_tensor([0, 3, 8], "cpu"), inputs.offsets_tensor([0, 4, 10], "cpu")
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t) or real(t))
    info = MODULES[6].INFO
    validate_varlen(q, k, v, cq, ck, 5, 6, causal=False, scale=None, info=info, check_device=False)
    assert reads == []
    cq[1] = 1  # changed in place (lengths 1 and 7): read again, and the new values are checked
    with pytest.raises(ValueError, match="max_seqlen_q is 5"):
        validate_varlen(q, k, v, cq, ck, 5, 6, causal=False, scale=None, info=info, check_device=False)
    assert len(reads) == 1
