"""Stage 6 decoding from an e4m3 KV cache (issue 50 item 2): K and V in torch.float8_e4m3fn with
float32 descales per (batch entry, K/V head), FlashAttention-3's convention (the true K is
k_fp8 · k_descale[b, h_kv], V likewise); Q and the output stay 16-bit. The kernel's build is
KV_FP8 (stages/stage6.cu: load_staged, widen_tile); this file holds the launcher's rules for it:
what a call must bring (check_kv_fp8), its tiles and staging buffers (fp8_tiles, staged_buffers), the copy engine's
map of an e4m3 cache (fp8_map), and a Python model of the kernel's bf16 widening (widen_bf16_bits)
that the CPU tests check against torch's conversion.

    out = stages.stage6.attention(q, k_fp8, v_fp8, seqlens_k=lens, k_descale=kd, v_descale=vd)

Why: decoding multiplies each cached key by a few query rows, so its time is the cache's bytes
over the memory bandwidth; e4m3 halves them. The products stay 16-bit (the tensor cores take e4m3
only with both operands e4m3: stage 7's kernel): the producer warpgroup widens each tile in
shared memory on its way to the consumers, which run as in the 16-bit build.
"""
from __future__ import annotations

import torch

from lib import inputs
from lib.inputs import DTYPE_NAMES, check_layout
from stages.stage6_decoding import shares_sms

FP8 = torch.float8_e4m3fn
KV_FP8_HEAD_DIMS = (64, 128)
# (BLOCK_N, STAGES, CONSUMERS) of the KV_FP8 build, one block per SM, and beside the 16-bit ring
# KV_FP8_STAGED e4m3 staging buffers of K and of V (half a ring buffer's bytes each), as many as fit
# (staged_buffers). A staging buffer is freed once widened, so the staging buffers, not the ring,
# hold the cache's bytes on their way from memory. Chosen to fit, not measured.
FP8_TILES = {64: (128, 2, 1), 128: (64, 2, 1)}
# Two blocks per SM (shares_sms' rule): D64's (64, 2, 1) leaves room for 4 staging buffers in half
# an SM, D128's for one. At B64 H32/8 Sq1 D128 two blocks ran 1.33x one block per SM (Nsight Compute:
# one block, 8 warps an SM, read 38% of DRAM's bandwidth; experiments/fp8_kv_decode/README.md).
FP8_SHARED_TILES = {64: (64, 2, 1), 128: (64, 2, 1)}
# tiles= a call may ask for (for measuring): these, where they fit (config checks).
FP8_CHOICES = [(128, 2, 1), (64, 2, 1), (64, 3, 1), (64, 4, 1), (128, 4, 1)]
STAGED_CHOICES = tuple(range(1, 9))  # KV_FP8_STAGED: 1-8 (the kernel's static_assert)
# The e4m3 build's switches (stages/stage6.cu: widen4, widen_tile): the bf16 widening without its
# multiply by 2^120, which each work tile's descales take where they leave room (fold: KV_FP8_FOLD;
# nothing to fold in the fp16 build), and 16-byte staging loads (wide: KV_FP8_WIDE). FP8_RULE turns
# them on by head dim; attention(..., fp8_switches={name: bool}) overrides it, for measuring.
FP8_SWITCHES = {"fold": "KV_FP8_FOLD", "wide": "KV_FP8_WIDE"}
# Measured on the H200 against the build without them (bf16 Q, H32/8 Sq1, 5 interleaved rounds).
# With the fold all or nothing (experiments/fp8_kv_decode/h200_probe_7e975bb.log): fold 1.03-1.06x
# at every row of both head dims; at D128 fold and wide 1.13x at B8 Sk16384, 1.05-1.06x at B64,
# wide alone 0.89-1.10x. With the fold per work tile, as now (h200_probe_6195d90.log): D128 fold
# and wide 1.10x at B8, 1.06x at B64; D64 fold alone 0.98-0.99x, fold and wide 1.01-1.08x.
FP8_RULE = {64: {"fold": True, "wide": True}, 128: {"fold": True, "wide": True}}


def check_fp8_switches(switches) -> dict:
    """attention()'s fp8_switches checked: {} for None, else the dict itself; a clear error for
    anything but a dict of FP8_SWITCHES names to True or False."""
    if switches is None:
        return {}
    if not isinstance(switches, dict) or any(k not in FP8_SWITCHES or not isinstance(v, bool)
                                             for k, v in switches.items()):
        raise ValueError(f"fp8_switches is a dict of {sorted(FP8_SWITCHES)} to True or False, got {switches!r}")
    return switches


def fp8_switches_on(D: int, switches: dict) -> tuple:
    """The FP8_SWITCHES names an e4m3 call's build turns on: FP8_RULE's at head dim D, with the
    call's fp8_switches (checked) in place of the rule's where it names them; sorted."""
    on = {**FP8_RULE.get(D, {}), **switches}
    return tuple(sorted(k for k, v in on.items() if v))


def staging_bytes(head_dim: int, tiles, staged: int) -> int:
    """The KV_FP8 build's shared memory beyond the 16-bit build's (stages/stage6.cu: Smem.k8, v8 and
    their four barriers each): `staged` e4m3 tiles of K and of V."""
    bn = tiles[0]
    return 2 * staged * bn * head_dim + 32 * staged


def staged_buffers(head_dim: int, tiles, room: int) -> int:
    """KV_FP8_STAGED's rule: as many staging buffers as `room` bytes (a block's shared memory beyond
    the 16-bit build's) hold, at most 8; 0 where not even one fits."""
    return max([n for n in STAGED_CHOICES if staging_bytes(head_dim, tiles, n) <= room], default=0)


def fp8_shares_sms(D: int, work: int, n_splits: int, sms: int) -> bool:
    """Two blocks per SM for an e4m3 cache: at D64 the 16-bit rule (shares_sms: the blocks fill 80%
    of the SMs); at D128 only with more blocks than SMs. There half an SM holds one staging buffer
    against the one-block build's eight, and with no second block to run beside it that lost: B8
    H32/8 Sk16384 (128 blocks) ran 0.91x the one-block build, B64 (512 blocks) 1.33x
    (experiments/fp8_kv_decode/h200_probe_a8a8e21.log)."""
    return shares_sms(work, n_splits, sms) if D == 64 else work * n_splits > sms


# Twice the planned splits on two blocks per SM (fp8_doubles_splits) only where each split keeps at
# least this many key tiles: the shortest measured (B1 Sk16384: 8 tiles of 64 keys) gained.
FP8_SPLIT_TILES = 8


def fp8_doubles_splits(D: int, work: int, n_splits: int, key_tiles: int, sms: int, max_splits: int) -> bool:
    """Whether an e4m3 call at D128 runs twice the splits plan_splits chose, two blocks per SM
    (fp8_shares_sms then holds): where the planned blocks fill at most one per SM and each of
    twice the splits keeps FP8_SPLIT_TILES key tiles. With one block per SM, one block's three
    widening warps feed one consumer; a second block per SM gives the SM six. Measured on the H200
    (experiments/fp8_kv_decode/finer_splits.py, h200_finer_splits_508bef9.log; H32/8 Sq1, bf16,
    same rounds as the launch before): B1 Sk16384-32768 1.13-1.14x, B8 Sk4096 1.14x, Sk16384-32768
    1.23-1.25x; twice the splits on one block per SM 0.85-0.98x (the second block, not the
    shorter splits)."""
    return (D == 128 and work * n_splits <= sms and 2 * n_splits <= max_splits
            and key_tiles // (2 * n_splits) >= FP8_SPLIT_TILES)


def fp8_tiles(D: int, blocks_per_sm: int):
    """The KV_FP8 build's tiles for one or two blocks per SM (None: two do not fit at this head dim)."""
    return FP8_TILES[D] if blocks_per_sm == 1 else FP8_SHARED_TILES.get(D)


def is_fp8_call(k, v, k_descale, v_descale) -> bool:
    """Whether attention() was given an e4m3 cache: descales, or K or V in e4m3."""
    return (k_descale is not None or v_descale is not None
            or getattr(k, "dtype", None) == FP8 or getattr(v, "dtype", None) == FP8)


# what an e4m3 call refuses, by attention()'s keyword: the reason
REFUSED = {"page_table": (NotImplementedError, "a paged e4m3 cache is not built yet: pass a contiguous cache "
                                               "with seqlens_k, or a 16-bit paged cache"),
           "lse": (ValueError, "lse is not written from an e4m3 cache (stage 8's backward takes 16-bit K and V)"),
           "attn_mask": (NotImplementedError, "an e4m3 cache takes causal= (False, True, 'top_left', "
                                              "'bottom_right'), not attn_mask"),
           "window": (NotImplementedError, "the models' variants (window, softcap, sinks) are not built for an "
                                           "e4m3 cache yet"),
           "softcap": (NotImplementedError, "the models' variants (window, softcap, sinks) are not built for an "
                                            "e4m3 cache yet"),
           "sinks": (NotImplementedError, "the models' variants (window, softcap, sinks) are not built for an "
                                          "e4m3 cache yet"),
           "schedule": (ValueError, "an e4m3 cache runs its own decoding schedule: leave schedule=None"),
           "timeline": (ValueError, "the timeline is not recorded from an e4m3 cache"),
           "carry_pv": (ValueError, "carry_pv is a persistent launch's; an e4m3 cache runs one block per work tile"),
           "tma_store": (ValueError, "the TMA-store epilogue is not built for an e4m3 cache")}


def refuse_options(**given) -> None:
    """The e4m3 call's refusals (REFUSED) for the options given (not None; pack_gqa=False too)."""
    for name, value in given.items():
        if value is not None and name in REFUSED:
            exc, why = REFUSED[name]
            raise exc(f"{name}: {why}")
    if given.get("pack_gqa") is False:
        raise NotImplementedError("pack_gqa=False: an e4m3 cache is read by the packed decoding build only")
    tiles = given.get("tiles")
    if tiles is not None and tuple(tiles) not in FP8_CHOICES:
        raise ValueError(f"tiles with an e4m3 cache must be one of {FP8_CHOICES}, got {tiles}")


def check_kv_fp8(q, k, v, k_descale, v_descale, *, causal, scale, info) -> float:
    """Everything about an e4m3 call that the host can check without reading the GPU's memory,
    and the scale to use; TypeError / ValueError naming the argument, NotImplementedError for what
    stage 6 does not take. q, the machine, the scale, the shapes and `causal` go through
    lib.inputs.validate against 16-bit stand-ins of k's and v's shapes; k and v themselves are
    checked here (dtype, device, unit-stride head dim, 16-byte pointers and strides)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            raise ValueError(f"an e4m3 KV cache needs {name}: k and v in torch.float8_e4m3fn with "
                             f"k_descale and v_descale, float32 [B, H_kv]")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    inputs.check_machine(info, q)  # first, as lib.inputs.validate does
    inputs.refuse_grad(info, q, k, v)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != FP8:
            raise TypeError(f"{name} must be torch.float8_e4m3fn with k_descale/v_descale (an e4m3 KV "
                            f"cache), got {DTYPE_NAMES.get(t.dtype, t.dtype)}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have rank 4, [batch, heads_kv, seq_len, head_dim]; got shape "
                             f"{list(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"q must be float16 or bfloat16 with an e4m3 KV cache, got "
                        f"{DTYPE_NAMES.get(q.dtype, q.dtype)}")
    # the shapes, causal and the scale, against stand-ins of q's dtype with k's and v's shapes
    # (one row of D elements seen at every position: no memory the size of the cache)
    row = torch.empty(max(q.shape[-1], k.shape[-1], v.shape[-1], 1), dtype=q.dtype, device=q.device)
    k16, v16 = (row.as_strided(tuple(t.shape), (0, 0, 0, 1)) for t in (k, v))
    scale = inputs.validate(q, k16, v16, causal=causal, scale=scale, info=info)
    for name, t in (("k", k), ("v", v)):
        check_layout(name, t, info)  # unit-stride head dim, 16-byte pointer and strides
    B, H, Sq, D = q.shape
    Hk = k.shape[1]
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if not (t.dtype == torch.float32 and tuple(t.shape) == (B, Hk) and t.device == q.device):
            raise ValueError(f"{name} must be a float32 [B, H_kv] = [{B}, {Hk}] tensor on {q.device}; got "
                             f"{DTYPE_NAMES.get(t.dtype, t.dtype)} {list(t.shape)} on {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (one float per batch entry and K/V head); its strides "
                             f"are {tuple(t.stride())}: call .contiguous() first")
    if D not in KV_FP8_HEAD_DIMS:
        raise NotImplementedError(f"stage 6 reads an e4m3 cache at head dims "
                                  f"{', '.join(map(str, KV_FP8_HEAD_DIMS))}; got {D}")
    if (H // Hk) * Sq > 64:
        raise NotImplementedError(f"stage 6 reads an e4m3 cache when decoding: a K/V head's query rows "
                                  f"(group {H // Hk} x Sq {Sq}) must fit one warpgroup's 64; got {(H // Hk) * Sq}")
    return scale


# --------------------------------------------------------------------------------------------
# GPU only: the copy engine's map of an e4m3 tensor

def fp8_map(t: torch.Tensor, rows: int):
    """The copy engine's description of an e4m3 [B, H_kv, S, D] tensor with its real strides:
    boxes of `rows` × D bytes, unswizzled (the kernel's staging buffers; widen_tile applies the
    swizzle as it widens). As lib.tma.tensor_map does, a dimension of size 1 gets a stride the
    copy engine accepts."""
    from cuda.core.utils import StridedMemoryView
    from cuda.core._tensor_map import TensorMapSwizzle
    strides = [st if n > 1 else 16 * (t.numel() + 1) for n, st in zip(t.shape, t.stride())]
    strides[-1] = 1
    t = t.as_strided(t.shape, strides)
    view = StridedMemoryView.from_dlpack(t.view(torch.uint8), stream_ptr=-1)
    return view.as_tensor_map((1, 1, rows, t.shape[3]), swizzle=TensorMapSwizzle.NONE)


# --------------------------------------------------------------------------------------------
# the kernel's bf16 widening, modelled (stages/stage6.cu: widen4)

def prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode): byte n of the result is byte (s & 7) of {b, a} (a bytes 0-3),
    or, when s & 8, that byte's top bit copied through all 8 bits; s = nibble n of the selector."""
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    out = 0
    for n in range(4):
        s = (selector >> (4 * n)) & 0xF
        byte = (src >> (8 * (s & 7))) & 0xFF
        if s & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * n)
    return out


def widen_bf16_bits(word: int) -> list[int]:
    """widen4's bf16 branch on four e4m3 bytes (byte 0 first), before its multiply by 2^120: the
    four bf16 bit patterns of value·2^-120, in column order."""
    out = []
    for sel in (0x9180, 0xB3A2):
        pair = ((prmt(word, 0, sel) << 4) & 0xFFFFFFFF) & 0x87F087F0
        out += [pair & 0xFFFF, pair >> 16]
    return out


def quantize(t: torch.Tensor, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """A 16- or 32-bit [B, H_kv, S, D] cache as attention() takes it in e4m3: each (batch entry,
    K/V head) scaled so that its largest magnitude becomes e4m3's largest finite value, 448 (the
    descale is amax / 448, FlashAttention-3's per-head convention), rounded to nearest. Returns
    (t_fp8, descale float32 [B, H_kv]); t ≈ t_fp8.float() · descale[..., None, None]."""
    amax = t.float().abs().amax(dim=(2, 3))
    descale = (amax / 448.0).clamp_min(eps).to(torch.float32)
    t8 = (t.float() / descale[:, :, None, None]).clamp(-448.0, 448.0).to(FP8)
    return t8, descale.contiguous()


def dequantized(t8: torch.Tensor, descale: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """The cache an e4m3 call attends over: t8 · descale per (batch entry, K/V head), in `dtype`
    (float64: exact, the reference's)."""
    return t8.to(dtype) * descale.to(dtype)[:, :, None, None]
