"""Stage 6 decoding from an e4m3 KV cache (issue 50 item 2, stages/stage6_kv_fp8.py and KV_FP8 in
stages/stage6.cu): on the CPU, the define only when on, the builds without it unchanged (SASS byte
for byte), every KV_FP8 build the launcher picks compiled without spills, the bf16 widening's bit
manipulation against torch's conversion, the arguments' checks and the launcher's choices; on an
H100/H200, outputs against the float64 reference of the dequantized cache, every e4m3 value widened
exactly, and (descales 1) the same bits as the 16-bit build on the same cache."""
import math
import random
import re
import subprocess
from pathlib import Path

import pytest
import torch

import stages.stage6 as s6
import stages.stage6_kv_fp8 as f8
from conftest import assert_no_local_memory, assert_sass_as_source, captured, compile_cases, stub_stage6_launcher
from lib import nvrtc
from lib.inputs import make_qkv, poisoned_outputs
from lib.sass import inspect_cubin, sass_text
from lib.simulator import HAS_GPU

on_hopper = pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability() != (9, 0),
                               reason="stage 6 needs an sm_90 GPU (H100/H200)")
SERIALIZING = re.compile(r"C75(08|10|11|12|15)|wgmma.*serializ", re.I)  # tests/test_stage6.py's
ROOT = Path(__file__).resolve().parents[1]
FP8 = torch.float8_e4m3fn


# --------------------------------------------------------------------------------------------
# CPU: the widening, modelled

def test_bf16_widening_is_exact_for_every_e4m3_value():
    """widen4's bf16 branch (prmt with sign copies, shift by 4, mask; stages/stage6_kv_fp8.py:
    widen_bf16_bits models it bit for bit) gives the bf16 of value·2^-120 for all 254 finite e4m3
    values, subnormals and ±0 included, in column order; times 2^120 (exact) the value itself. And
    the kernel's source holds the model's constants."""
    codes = list(range(256))
    want = torch.tensor(codes, dtype=torch.uint8).view(FP8).double()
    for w0 in range(0, 256, 4):
        word = sum(c << (8 * j) for j, c in enumerate(codes[w0:w0 + 4]))
        bits = f8.widen_bf16_bits(word)
        got = torch.tensor(bits, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).double() * 2.0 ** 120
        for j in range(4):
            if not torch.isnan(want[w0 + j]):
                assert got[j] == want[w0 + j], (w0 + j, float(got[j]), float(want[w0 + j]))
    src = s6.SOURCE.read_text()
    for const in ("0x9180", "0xB3A2", "0x87F087F0u", "0x7B807B80u", "cvt.rn.f16x2.e4m3x2"):
        assert const in src, const
    assert torch.tensor([0x7B80], dtype=torch.int16).view(torch.bfloat16).double().item() == 2.0 ** 120


def test_quantize_round_trips_within_e4m3():
    """quantize: per (batch entry, K/V head) descale amax/448, e4m3 values within 2^-4 relative
    of the input (e4m3's 3 mantissa bits), the largest magnitude exactly 448."""
    t = torch.randn(2, 3, 50, 64) * torch.tensor([0.01, 1.0, 300.0])[None, :, None, None]
    t8, d = f8.quantize(t)
    assert t8.dtype == FP8 and d.dtype == torch.float32 and d.shape == (2, 3) and d.is_contiguous()
    back = f8.dequantized(t8, d)
    assert torch.all((back - t.double()).abs() <= t.double().abs() * 2.0 ** -4 + d.double()[:, :, None, None] * 2.0 ** -9)
    assert torch.equal(t8.float().abs().amax(dim=(2, 3)), torch.full((2, 3), 448.0))


# --------------------------------------------------------------------------------------------
# CPU: arguments and the launcher

@pytest.fixture
def on_cpu(monkeypatch):
    """stage 6's launcher with the GPU parts stubbed: launches recorded, not run."""
    return stub_stage6_launcher(monkeypatch, lambda t, rows: ("16", tuple(t.shape), rows))


def _call(B=2, H=8, Hk=2, Sq=1, Sk=300, D=128, dtype=torch.bfloat16):
    q = torch.randn(B, H, Sq, D, dtype=dtype)
    k8, kd = f8.quantize(torch.randn(B, Hk, Sk, D))
    v8, vd = f8.quantize(torch.randn(B, Hk, Sk, D))
    return q, k8, v8, kd, vd


FP8_TAIL = 2  # the KV_FP8 build's last kernel parameters: k_descale, v_descale


def test_bad_arguments_get_clear_errors(on_cpu):
    q, k8, v8, kd, vd = _call()
    ok = dict(k_descale=kd, v_descale=vd)
    s6.attention(q, k8, v8, **ok)  # the valid call goes through
    lens = torch.full((2,), 7, dtype=torch.int32)
    s6.attention(q, k8, v8, seqlens_k=lens, splits=3, **ok)
    bf = k8.to(torch.bfloat16)
    cases = [
        (ValueError, "needs v_descale", q, k8, v8, dict(k_descale=kd)),
        (ValueError, "needs k_descale", q, k8, v8, dict(v_descale=vd)),
        (ValueError, "needs k_descale", q, k8, v8, {}),
        (TypeError, "k must be torch.float8_e4m3fn", q, bf, v8, ok),
        (TypeError, "v must be torch.float8_e4m3fn", q, k8, bf, ok),
        (TypeError, "k_descale must be a torch.Tensor", q, k8, v8, dict(k_descale=[1.0], v_descale=vd)),
        (ValueError, r"k_descale must be a float32 \[B, H_kv\] = \[2, 2\]", q, k8, v8, dict(k_descale=kd.double(), v_descale=vd)),
        (ValueError, r"v_descale must be a float32 \[B, H_kv\]", q, k8, v8, dict(k_descale=kd, v_descale=vd[:, :1])),
        (ValueError, r"k_descale must be a float32 \[B, H_kv\]", q, k8, v8, dict(k_descale=kd.reshape(-1), v_descale=vd)),
        (ValueError, "v_descale must be contiguous", q, k8, v8,
         dict(k_descale=kd, v_descale=torch.zeros(2, 2).t().contiguous().t())),
        (TypeError, "q must be float16 or bfloat16", q.float(), k8, v8, ok),
        (ValueError, "rank 4", q, k8[0], v8[0], ok),
        (ValueError, "k and v must have the same sequence length", q, k8, v8[:, :, :-1], ok),
        (ValueError, "head dims differ", q, k8[..., :64], v8[..., :64], ok),
        (ValueError, "head dims differ", q[..., :64], k8, v8, ok),
        (ValueError, "multiple of k's and v's", q[:, :7], k8, v8, ok),
        (ValueError, "unit-stride last dimension", q, k8.transpose(2, 3).contiguous().transpose(2, 3), v8, ok),
        (ValueError, "16 bytes at a time", q, torch.zeros(2, 2, 300, 136, dtype=FP8)[..., :128], v8, ok),
        (NotImplementedError, "head dims 64, 128", *_call(D=96)[:3], ok),
        (NotImplementedError, "must fit one warpgroup's 64", *_call(H=32, Hk=2, Sq=5)[:3], ok),
        (NotImplementedError, "must fit one warpgroup's 64", *_call(Sq=300)[:3], ok),
        (NotImplementedError, "paged e4m3", q, k8, v8, dict(ok, page_table=torch.zeros(2, 3, dtype=torch.int32),
                                                            seqlens_k=lens)),
        (ValueError, "lse is not written from an e4m3", q, k8, v8, dict(ok, lse=torch.zeros(2, 8, 1))),
        (NotImplementedError, "not attn_mask", q, k8, v8, dict(ok, attn_mask=torch.zeros(1, 1))),
        (NotImplementedError, "variants", q, k8, v8, dict(ok, window=(8, 0))),
        (NotImplementedError, "variants", q, k8, v8, dict(ok, softcap=30.0)),
        (NotImplementedError, "variants", q, k8, v8, dict(ok, sinks=torch.zeros(8))),
        (NotImplementedError, "pack_gqa=False", q, k8, v8, dict(ok, pack_gqa=False)),
        (ValueError, "leave schedule=None", q, k8, v8, dict(ok, schedule=s6.DECODE_SCHEDULE)),
        (ValueError, "tiles with an e4m3 cache", q, k8, v8, dict(ok, tiles=(176, 2, 2))),
        (ValueError, "scale must be finite", q, k8, v8, dict(ok, scale=float("inf"))),
        (ValueError, "seqlens_k must be a contiguous int32", q, k8, v8, dict(ok, seqlens_k=lens.long())),
        (ValueError, "seqlens_k must be a contiguous int32.* strided", q, k8, v8,
         dict(ok, seqlens_k=torch.stack([lens, lens], 1)[:, 0])),
    ]
    for exc, msg, q_, k_, v_, kw in cases:
        with pytest.raises(exc, match=msg):
            s6.attention(q_, k_, v_, **kw)
    with pytest.raises(ValueError, match="kv_fp8 is the packed decoding build"):
        s6.config(128, (128, 2, 1), s6.DECODE_SCHEDULE, pack_gqa=False, seqs=True, kv_fp8=True)
    with pytest.raises(ValueError, match="kv_fp8 is the packed decoding build"):
        s6.config(96, (128, 2, 1), s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, kv_fp8=True)
    with pytest.raises(ValueError, match="kv_fp8: tiles"):  # the 16-bit decoding ring and its staging: too big
        s6.config(128, s6.DECODE_TILES[128], s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, kv_fp8=True)


def test_trivial_calls(on_cpu):
    launched, _, _ = on_cpu
    q, k8, v8, kd, vd = _call()
    out = s6.attention(q, k8[:, :, :0], v8[:, :, :0], k_descale=kd, v_descale=vd)
    assert out.shape == q.shape and out.dtype == q.dtype and bool((out == 0).all())
    out = s6.attention(q[:0], k8[:0], v8[:0], k_descale=kd[:0], v_descale=vd[:0])
    assert out.shape == (0, 8, 1, 128) and not launched


SHAPES = [  # (B, H, Hk, Sq, Sk): decoding over batch, groups 1/4/8, cache lengths, speculative Sq 4
    (1, 32, 8, 1, 4096), (64, 32, 8, 1, 1024), (8, 8, 1, 1, 1024), (1, 8, 1, 1, 32768), (1, 32, 8, 4, 8192),
    (16, 8, 8, 1, 2000), (8, 32, 8, 1, 32768), (4, 16, 4, 4, 777), (64, 32, 8, 1, 32768)]


def test_launcher_choice(on_cpu):
    """Every e4m3 call runs the packed SEQS build with KV_FP8 (a producer warpgroup: never the
    blocks without one), fp8_tiles' tiles for its blocks per SM; the K/V maps are e4m3 maps of the
    tensors with boxes of BLOCK_N rows, q's the packed 5-D view; the descales' pointers come last,
    per call (a new pair of the same layout: the same plan)."""
    launched, boxes, cfgs = on_cpu
    seen = set()
    for D in (64, 128):
        for B, H, Hk, Sq, Sk in SHAPES:
            for causal in ((False, "bottom_right") if Sq > 1 else (False,)):
                launched.clear(), boxes.clear(), cfgs.clear()
                q, k8, _, kd, vd = _call(B, H, Hk, Sq, 1, D)
                k8 = k8.expand(B, Hk, Sk, D)  # Sk keys without their memory (nothing reads them here)
                s6.attention(q, k8, k8, causal=causal, k_descale=kd, v_descale=vd)
                d = dict(cfgs[-1]["defines"])
                assert d["KV_FP8"] == 1 and d["PACK_GQA"] == 1 and d["SEQS"] == 1 and d["WARP_SPECIALIZED"] == 1, d
                bps = d["BLOCKS_PER_SM"]
                assert (d["BLOCK_N"], d["STAGES"], d["CONSUMERS"]) == f8.fp8_tiles(D, bps), (D, B, Sk, d)
                ch = s6.choose(B, H, Hk, Sq, Sk, D, 2 if causal else 0, 132, kv_fp8=True)
                assert ch["blocks_per_sm"] == bps and ch["splits"] == int(launched[0][2][14])
                if D == 128:  # two blocks only with more blocks than SMs (fp8_shares_sms)
                    assert bps == (2 if B * Hk * ch["splits"] > 132 else 1), (D, B, Sk, bps, ch)
                assert boxes[0][0] == "16" and boxes[1:] == [("e4m3", (B, Hk, Sk, D), FP8, d["BLOCK_N"])] * 2
                params = launched[0][2]
                assert params[-FP8_TAIL] == kd.data_ptr() and params[-1] == vd.data_ptr()
                seen.add((D, bps))
                # new descales of the same layout: the same plan, their pointers
                kd2, vd2 = kd.clone(), vd.clone()
                n, first = len(cfgs), len(launched)
                s6.attention(q, k8, k8, causal=causal, k_descale=kd2, v_descale=vd2)
                assert len(cfgs) == n  # no new plan
                assert launched[first][2][-FP8_TAIL] == kd2.data_ptr() and launched[first][2][-1] == vd2.data_ptr()
    assert {(64, 2), (128, 1), (128, 2)} <= seen, seen


def test_two_blocks_per_sm_rule():
    """fp8_shares_sms: D64 as the 16-bit decoding (blocks filling 80% of the SMs); D128 only with more
    blocks than SMs, where a second block per SM has work (its one staging buffer lost without one)."""
    from stages.stage6_decoding import shares_sms
    for work, n in ((64, 2), (106, 1), (132, 1), (133, 1), (512, 1), (8, 16), (1, 1)):
        assert f8.fp8_shares_sms(64, work, n, 132) == shares_sms(work, n, 132)
        assert f8.fp8_shares_sms(128, work, n, 132) == (work * n > 132), (work, n)


def test_finer_splits_rule():
    """fp8_doubles_splits: at D128 only, where the planned blocks fill at most one per SM and each
    of twice the splits keeps FP8_SPLIT_TILES key tiles; choose() then runs twice the splits on two
    blocks per SM. Not with splits, blocks per SM or tiles given, nor where blocks already
    outnumber the SMs."""
    for B, Sk, doubled in ((1, 16384, True), (1, 32768, True), (8, 4096, True), (8, 32768, True),
                           (1, 4096, False), (8, 1024, False), (64, 4096, False)):
        plain = s6.choose(B, 32, 8, 1, Sk, 128, 0, 132, kv_fp8=True, blocks_per_sm=1)
        ch = s6.choose(B, 32, 8, 1, Sk, 128, 0, 132, kv_fp8=True)
        if doubled:
            assert f8.fp8_doubles_splits(128, plain["work"], plain["splits"], plain["splits"] * plain["per_split"], 132, s6.MAX_SPLITS)
            assert (ch["splits"], ch["blocks_per_sm"]) == (2 * plain["splits"], 2), (B, Sk, ch)
            assert ch["per_split"] >= f8.FP8_SPLIT_TILES and ch["tiles"] == f8.fp8_tiles(128, 2)
        else:
            assert ch["splits"] == plain["splits"] or B == 64, (B, Sk, ch)
    assert not f8.fp8_doubles_splits(64, 8, 16, 1024, 132, s6.MAX_SPLITS)
    assert not f8.fp8_doubles_splits(128, 8, 16, 1024, 132, 16)  # MAX_SPLITS
    for given in ({"splits": 16}, {"blocks_per_sm": 1}, {"tiles": (64, 2, 1), "pack_gqa": True}):
        assert s6.choose(1, 32, 8, 1, 16384, 128, 0, 132, kv_fp8=True, **given)["splits"] == 16, given


def test_fp8_switches_define_and_refusals(on_cpu):
    """The e4m3 build turns on FP8_RULE's switches at each head dim (both, at D64 and D128);
    fp8_switches={"fold": bool, "wide": bool} overrides the rule name by name, each name one define
    (KV_FP8_FOLD, KV_FP8_WIDE) and nothing else changing; None, {} and a dict that says what the
    rule says give the rule's plan; refused without an e4m3 cache, and as anything but a dict of
    those names to bools."""
    launched, boxes, cfgs = on_cpu
    for D in (64, 128):
        q, k8, v8, kd, vd = _call(D=D)
        s6.attention(q, k8, v8, k_descale=kd, v_descale=vd, fp8_switches={"fold": False, "wide": False})
        plain = dict(cfgs[-1]["defines"])
        assert "KV_FP8_FOLD" not in plain and "KV_FP8_WIDE" not in plain
        rule = {f8.FP8_SWITCHES[n]: 1 for n, on in f8.FP8_RULE[D].items() if on}
        assert rule == {"KV_FP8_FOLD": 1, "KV_FP8_WIDE": 1}
        for switches, added in (({"fold": True, "wide": False}, {"KV_FP8_FOLD": 1}),
                                ({"fold": False, "wide": True}, {"KV_FP8_WIDE": 1}),
                                ({"fold": True, "wide": True}, {"KV_FP8_FOLD": 1, "KV_FP8_WIDE": 1}),
                                (None, rule)):
            s6._plans.clear()  # a new plan each time: cfgs[-1] is this call's build
            s6.attention(q, k8, v8, k_descale=kd, v_descale=vd, fp8_switches=switches)
            assert dict(cfgs[-1]["defines"]) == {**plain, **added}, (D, switches)
        n = len(cfgs)
        for same in ({}, dict(f8.FP8_RULE[D]), {"fold": True}, {"wide": True}):
            s6.attention(q, k8, v8, k_descale=kd, v_descale=vd, fp8_switches=same)
            assert len(cfgs) == n, (D, same)  # the rule's build's plan, made above
    with pytest.raises(ValueError, match="fp8_switches are for an e4m3 cache"):
        s6.attention(q, q, q, fp8_switches={"fold": True})
    for bad in ({"fold": 1}, {"fast": True}, ["fold"], "fold"):
        with pytest.raises(ValueError, match="fp8_switches is a dict"):
            s6.attention(q, k8, v8, k_descale=kd, v_descale=vd, fp8_switches=bad)
    with pytest.raises(ValueError, match="fp8_switches are the e4m3"):
        s6.config(128, (64, 2, 1), s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, fp8_switches=("fold",))


SWITCHES_BASE = "190541d"  # main when the fp8_switches were added: the KV_FP8 builds before them


@pytest.mark.parametrize("D", (64, 128))
def test_kv_fp8_builds_without_switches_sass_unchanged(D):
    """The launcher's KV_FP8 builds (one and two blocks per SM, both dtypes) with fp8_switches off
    compile to the SASS they had before the switches, byte for byte: off, each is the build the
    record measured before them."""
    try:
        base = subprocess.run(["git", "show", f"{SWITCHES_BASE}:stages/stage6.cu"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        base = None
    for B in (8, 64):
        ch = s6.choose(B, 32, 8, 1, 4096, D, 0, 132, kv_fp8=True)
        defines = s6.config(D, ch["tiles"], ch["schedule"], False, None, None, True, True, ch["q_stages"],
                            None, None, None, ch["blocks_per_sm"], None, kv_fp8=True)["defines"]
        for dt in ("float16", "bfloat16"):
            assert_sass_as_source(_build(D, dt, defines), base, D, dt, defines, f"commit {SWITCHES_BASE}")


@pytest.mark.parametrize("D", (64, 128))
def test_wide_loads_halve_the_staging_loads(D):
    """KV_FP8_WIDE: the widening threads' loads of the staging buffer are 16 bytes (LDS.128) where
    the launcher's build's are 8 (LDS.64), half as many, without local memory, both dtypes."""
    ch = s6.choose(64, 32, 8, 1, 4096, D, 0, 132, kv_fp8=True)
    defines = s6.config(D, ch["tiles"], ch["schedule"], False, None, None, True, True, ch["q_stages"],
                        None, None, None, ch["blocks_per_sm"], None, kv_fp8=True)["defines"]
    for dt in ("bfloat16", "float16"):
        wide = _build(D, dt, defines + (("KV_FP8_WIDE", 1),))
        assert_no_local_memory(wide, ["attention_wgmma"], f"D{D} {dt} wide")
        a, b = sass_text(_build(D, dt, defines).cubin), sass_text(wide.cubin)
        assert b.count("LDS.128") >= 1 and b.count("LDS.64") < a.count("LDS.64"), (dt, a.count("LDS.64"), b.count("LDS.64"))


@pytest.mark.parametrize("D", (64, 128))
def test_fold_drops_the_bf16_multiply(D):
    """The bf16 build with KV_FP8_FOLD has a second widening loop, without the multiply by 2^120
    (HMUL2.BF16): as many HMUL2.BF16 as the build without it (its loop for work tiles whose
    descales do not fold) and at least twice its PRMTs, without local memory; the fp16 build
    compiles to the same SASS with it as without (its widening is exact as it is)."""
    ch = s6.choose(64, 32, 8, 1, 4096, D, 0, 132, kv_fp8=True)
    defines = s6.config(D, ch["tiles"], ch["schedule"], False, None, None, True, True, ch["q_stages"],
                        None, None, None, ch["blocks_per_sm"], None, kv_fp8=True)["defines"]
    folded = defines + (("KV_FP8_FOLD", 1),)
    bf = _build(D, "bfloat16", folded)
    assert_no_local_memory(bf, ["attention_wgmma"], f"D{D} bf16 fold")
    sass, plain = sass_text(bf.cubin), sass_text(_build(D, "bfloat16", defines).cubin)
    assert sass.count("HMUL2.BF16") == plain.count("HMUL2.BF16") > 0
    assert sass.count("PRMT") >= 2 * plain.count("PRMT") > 0
    assert sass_text(_build(D, "float16", folded).cubin) == sass_text(_build(D, "float16", defines).cubin)


def test_define_only_when_on():
    """Without an e4m3 cache nothing changes: no KV_FP8 define (the build, its cache key and its
    SASS are the ones before it), the decoding rules untouched; the KV_FP8 build's shared memory
    is the 16-bit build's plus its staging buffers, and fits."""
    for D in (64, 128):
        for cfg in (s6.config(D), s6.config(D, seqs=True),
                    s6.config(D, s6.DECODE_TILES[D], s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True)):
            assert "KV_FP8" not in dict(cfg["defines"])
        for bps in (1, 2):
            tiles = f8.fp8_tiles(D, bps)
            if tiles is None:
                continue
            on = s6.config(D, tiles, s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, blocks_per_sm=bps, kv_fp8=True)
            off = s6.config(D, tiles, s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, blocks_per_sm=bps)
            staged = dict(on["defines"])["KV_FP8_STAGED"]
            assert dict(on["defines"]) == {**dict(off["defines"]), "KV_FP8": 1, "KV_FP8_STAGED": staged}
            assert on["smem"] - off["smem"] == f8.staging_bytes(D, tiles, staged) and on["smem"] <= s6.MAX_SMEM
            assert bps * (on["smem"] + 1024) <= s6.SM_SMEM
            # as many staging buffers as fit: one more does not (or the kernel's most, 8)
            most = min(s6.MAX_SMEM, s6.SM_SMEM // bps - 1024)
            assert staged == 8 or on["smem"] + f8.staging_bytes(D, tiles, 1) > most, (D, bps, staged)
            # a staging buffer refills while the other is widened; D128's two blocks per SM have room for one
            assert staged >= (1 if (D, bps) == (128, 2) else 2), (D, bps, staged)
            fixed = s6.config(D, tiles, s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, blocks_per_sm=bps,
                              kv_fp8=True, fp8_staged=1)
            assert dict(fixed["defines"])["KV_FP8_STAGED"] == 1
            assert fixed["smem"] == off["smem"] + f8.staging_bytes(D, tiles, 1)
    for B, H, Hk, Sq, Sk in SHAPES:
        for D in (64, 128):
            assert s6.choose(B, H, Hk, Sq, Sk, D, 0, 132) == s6.choose(B, H, Hk, Sq, Sk, D, 0, 132, kv_fp8=False)
    with pytest.raises(ValueError, match="fp8_staged"):  # more staging than fits
        s6.config(128, (64, 2, 1), s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, blocks_per_sm=2, kv_fp8=True,
                  fp8_staged=2)
    with pytest.raises(ValueError, match="fp8_staged"):  # the kernel takes 1-8
        s6.config(64, (64, 2, 1), s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, kv_fp8=True, fp8_staged=9)
    with pytest.raises(ValueError, match="fp8_staged"):  # a 16-bit build has none
        s6.config(64, (64, 2, 1), s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, fp8_staged=2)
    with pytest.raises(ValueError, match="no room"):  # not one staging buffer in half an SM
        s6.config(128, (64, 2, 1), s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, blocks_per_sm=2, kv_fp8=True,
                  q_stages=2)


# --------------------------------------------------------------------------------------------
# CPU: the builds

def fp8_builds():
    """(D, dtype name, defines) of every KV_FP8 build the launcher picks at SHAPES and a few
    more (each causal mode, splits as planned), and of FP8_CHOICES where they fit."""
    seen = {}
    for D in (64, 128):
        for B, H, Hk, Sq, Sk in SHAPES + [(128, 32, 8, 1, 4096), (2, 8, 8, 1, 100)]:
            for causal in ((0, 2) if Sq > 1 else (0,)):
                ch = s6.choose(B, H, Hk, Sq, Sk, D, causal, 132, kv_fp8=True)
                cfg = s6.config(D, ch["tiles"], ch["schedule"], False, None, None, True, True, ch["q_stages"],
                                None, None, None, ch["blocks_per_sm"], None, kv_fp8=True)
                for dt in ("float16", "bfloat16"):
                    seen[(D, dt, cfg["defines"])] = None
        for tiles in f8.FP8_CHOICES:
            try:
                cfg = s6.config(D, tiles, s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True, kv_fp8=True)
            except ValueError:
                continue
            seen[(D, "bfloat16", cfg["defines"])] = None
    return list(seen)


BUILDS = fp8_builds()


def _build(D, dt, defines):
    return nvrtc.compile_stage(s6.SOURCE, arch=s6.ARCH, dtype=getattr(torch, dt), head_dim=D, defines=dict(defines))


@compile_cases("D,dt,defines", BUILDS, ids=[f"D{D}-{dt}-{i}" for i, (D, dt, _) in enumerate(BUILDS)],
               switches=lambda c: {("D", c[0]), ("dt", c[1])} | set(c[2]),
               build=lambda D, dt, defines: _build(D, dt, defines))
def test_fp8_builds_compile_clean(D, dt, defines):
    """Every KV_FP8 build the launcher picks (and the tiles a call may ask for): no spills, no
    stack, no local memory (the producer's widening loop within its setmaxnreg budget), wgmma not
    serialized, the staged copies (UTMALDG), and the widening's instructions: F2FP.F16.E4M3 (fp16)
    or PRMT and HMUL2.BF16 (bf16)."""
    compiled = _build(D, dt, defines)
    assert_no_local_memory(compiled, ["attention_wgmma", "attention_combine_splits"], f"D{D} {dt} {dict(defines)}")
    ins = inspect_cubin(compiled.cubin, s6.ARCH, compiled.resource_usage())
    assert ins.mix["LDL"] == 0 and ins.mix["STL"] == 0
    assert not SERIALIZING.search(compiled.log), compiled.log
    assert ins.mix["UTMALDG"] > 0
    sass = sass_text(compiled.cubin)
    if dt == "float16":
        assert "F2FP.F16.E4M3.UNPACK_B" in sass
    else:
        assert "HMUL2.BF16" in sass and "PRMT" in sass


BASE = "a060b3c"  # the commit this branch (issue 50 item 2, KV_FP8) started from


def _base_source():
    try:
        return subprocess.run(["git", "show", f"{BASE}:stages/stage6.cu"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def _unchanged_builds():
    """The builds without KV_FP8 the launcher ships: prefill, SEQS, decoding packed, two blocks per
    SM, blocks without a producer, the work queue, a paged build, a variant build, D96 and D256."""
    out = {}
    for D in (64, 128):
        for dt in ("float16", "bfloat16"):
            for cfg in (s6.config(D), s6.config(D, seqs=True),
                        s6.config(D, s6.DECODE_TILES[D], s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True),
                        s6.config(D, s6.DECODE_SHARED_TILES[D], s6.DECODE_SCHEDULE, pack_gqa=True, seqs=True,
                                  blocks_per_sm=2),
                        s6.config(D, s6.SHORT_TILES[(D, True)], s6.CAUSAL_QUEUE[D]),
                        s6.config(D, (128, 3, 2), seqs=True, page_size=16),
                        s6.config(D, (128, 2, 2), softcap=1, window=True, sinks=True)):
                out[(D, dt, cfg["defines"])] = None
    out[(64, "bfloat16", s6.config(64, s6.FEW_KEYS_TILES[64], s6.FEW_KEYS_SCHEDULE, pack_gqa=True, seqs=True,
                                   blocks_per_sm=s6.FEW_KEYS_BLOCKS)["defines"])] = None
    for D in (96, 256):
        out[(D, "bfloat16", s6.config(D)["defines"])] = None
    return list(out)


UNCHANGED = _unchanged_builds()


@compile_cases("D,dt,defines", UNCHANGED, ids=[f"D{D}-{dt}-{i}" for i, (D, dt, _) in enumerate(UNCHANGED)],
               switches=lambda c: {("D", c[0]), ("dt", c[1])} | set(c[2]))
def test_builds_without_kv_fp8_sass_unchanged(D, dt, defines):
    """The builds without KV_FP8 compile to the SASS of the commit before it, byte for byte. A guard
    of this branch's change: once the default kernel changes on purpose, move BASE to that commit."""
    assert_sass_as_source(_build(D, dt, defines), _base_source(), D, dt, defines, f"commit {BASE}")


# --------------------------------------------------------------------------------------------
# GPU: against the float64 reference of the dequantized cache

def fp8_inputs(B, H, Hk, Sq, Sk, D, dtype, seed, unit_descale=False):
    """q in `dtype`; K and V quantized per (batch entry, K/V head) (quantize), descales between
    about 2^-9 and 2^-6 for randn·(0.3 … 3); or e4m3 straight from randn with descales 1."""
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=torch.float32, seed=seed)
    if unit_descale:
        ones = torch.ones(B, Hk, dtype=torch.float32, device=q.device)
        return q.to(dtype), k.to(FP8), v.to(FP8), ones, ones.clone()
    g = torch.Generator(device="cpu").manual_seed(seed)
    spread = (0.3 + 2.7 * torch.rand(B, Hk, 1, 1, generator=g)).to(q.device)
    (k8, kd), (v8, vd) = f8.quantize(k * spread), f8.quantize(v / spread)
    return q.to(dtype), k8, v8, kd, vd


def check_fp8(out, q, k8, v8, kd, vd, lens, causal, label):
    """Each entry's output against the float64 reference over its first lens[b] keys of the
    dequantized cache, the error rule's baseline SDPA on that cache rounded to q's dtype."""
    from lib.reference import check_output, sdpa
    k64, v64 = f8.dequantized(k8, kd), f8.dequantized(v8, vd)
    for b, n in enumerate(lens):
        n = int(n)
        if n == 0:
            assert bool((out[b] == 0).all()), f"{label} entry {b}: no key, zeros"
            continue
        kb, vb = k64[b:b + 1, :, :n], v64[b:b + 1, :, :n]
        base = sdpa(q[b:b + 1], kb.to(q.dtype), vb.to(q.dtype), causal=causal).nan_to_num(0.0)  # rows seeing no key: 0
        c = check_output(out[b:b + 1], q[b:b + 1], kb, vb, causal=causal, sdpa_out=base)
        assert c.passed, f"{label} entry {b} ({n} keys): {c.summary()}"


GPU_SHAPES = [(5, 32, 8, 1, 3001), (3, 8, 1, 4, 1000), (4, 8, 8, 1, 777), (3, 32, 8, 4, 2049),
              (16, 32, 8, 1, 1000), (2, 8, 2, 1, 130)]


def check_over_shapes(attention, D, seed, shapes, options, signs=False):
    """attention(q, k8, v8, causal=, seqlens_k=, k_descale=, v_descale=, **opts) against the float64
    reference (check_fp8) at each (B, H, H_kv, Sq, S_k) of `shapes` in both dtypes: seqlens_k with
    zeros, ones, the whole cache and odd lengths, and none; bottom-right causal where Sq > 1; each
    dict of options(g) (g: a random.Random). signs: one K/V head's k_descale negated, one v_descale 0."""
    g = random.Random(seed)
    for dtype in (torch.float16, torch.bfloat16):
        for B, H, Hk, Sq, Sk in shapes:
            q, k8, v8, kd, vd = fp8_inputs(B, H, Hk, Sq, Sk, D, dtype, seed + B)
            if signs:
                kd[0, 0], vd[-1, -1] = -kd[0, 0], 0.0
            lens = ([0, 1, Sk, 129, g.randrange(1, Sk + 1)] * B)[:B]
            for seqlens in (torch.tensor(lens, dtype=torch.int32, device=q.device), None):
                for causal in ((False, "bottom_right") if Sq > 1 else (False,)):
                    for opts in options(g):
                        with poisoned_outputs():
                            out = attention(q, k8, v8, causal=causal, seqlens_k=seqlens, k_descale=kd,
                                            v_descale=vd, **opts)
                        check_fp8(out, q, k8, v8, kd, vd, lens if seqlens is not None else [Sk] * B, causal,
                                  f"D{D} {dtype} {(B, H, Hk, Sq, Sk)} {causal} {opts} seqlens "
                                  f"{seqlens is not None} seed {seed}")


@on_hopper
@pytest.mark.parametrize("D", (64, 128))
def test_fp8_matches_dequantized_reference(D, seed):
    """GQA groups 1, 4, 8 (and 4 with Sq 4: 16 packed rows); Sq 1 and 4 (bottom-right); odd
    lengths; seqlens_k with zeros and ones, not a multiple of a tile, the whole cache, or none;
    split-KV as planned and forced (3-7 splits, and 2), the combine in the last block and in its
    kernel; two blocks per SM (B16 at D64); both dtypes; descales per (entry, K/V head)."""
    check_over_shapes(s6.attention, D, seed, GPU_SHAPES,
                      lambda g: ({}, {"splits": g.randrange(3, 8)}, {"splits": 2, "combine_in_block": False}))


@on_hopper
@pytest.mark.parametrize("D", (64, 128))
def test_fp8_switches_match_dequantized_reference(D, seed):
    """fp8_switches fold and wide (KV_FP8_FOLD: the bf16 widening leaves 2^-120 in each value, the
    descales take 2^120; KV_FP8_WIDE: 16-byte staging loads), each and both: within the error
    rule at GQA 4 and 8, Sq 1 and 4, one and two blocks per SM, split and not, with seqlens_k,
    both dtypes, negative and zero descales included."""
    g = random.Random(seed)
    for dtype in (torch.float16, torch.bfloat16):
        for B, H, Hk, Sq, Sk in ((5, 32, 8, 1, 3001), (3, 32, 8, 4, 2049), (16, 32, 8, 1, 1000)):
            q, k8, v8, kd, vd = fp8_inputs(B, H, Hk, Sq, Sk, D, dtype, seed + B)
            kd[0, 1], vd[-1, 0] = -kd[0, 1], 0.0
            lens = ([0, 1, Sk, 129, g.randrange(1, Sk + 1)] * B)[:B]
            seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
            for causal in ((False, "bottom_right") if Sq > 1 else (False,)):
                for switches in ({"fold": True, "wide": False}, {"fold": False, "wide": True}, {"fold": True, "wide": True}):
                    for opts in ({}, {"splits": g.randrange(3, 8)}):
                        with poisoned_outputs():
                            out = s6.attention(q, k8, v8, causal=causal, seqlens_k=seqlens, k_descale=kd,
                                               v_descale=vd, fp8_switches=switches, **opts)
                        check_fp8(out, q, k8, v8, kd, vd, lens, causal,
                                  f"{switches} D{D} {dtype} {(B, H, Hk, Sq, Sk)} {causal} {opts} seed {seed}")


@on_hopper
@pytest.mark.parametrize("D", (64, 128))
def test_fp8_descales_too_large_to_fold(D, seed):
    """KV_FP8_FOLD (the rule's, bf16) folds 2^120 into a work tile's descales only where the key's
    (times the call's scale, log2 units) and the value's are below 2^7 in magnitude; other work
    tiles widen with the multiply. Descales far past that (a key's 5000 and -3000, a value's 300)
    beside ordinary ones and ones just under the line, one K/V head each, split and not: every
    entry within the error rule."""
    B, H, Hk, Sq, Sk = 3, 32, 8, 1, 1500
    q, k8, v8, kd, vd = fp8_inputs(B, H, Hk, Sq, Sk, D, torch.bfloat16, seed)
    scale_log2 = math.log2(math.e) / math.sqrt(D)
    kd[0, 0], vd[0, 1], kd[1, 2], vd[1, 3] = 5000.0, 300.0, -3000.0, 127.0
    kd[2, 4] = 127.0 / scale_log2 * 0.999  # just under the line
    kd[2, 5] = 128.0 / scale_log2  # on it: not folded
    lens = [Sk, 777, 1]
    seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
    for opts in ({}, {"splits": 5}):
        with poisoned_outputs():
            out = s6.attention(q, k8, v8, seqlens_k=seqlens, k_descale=kd, v_descale=vd, **opts)
        assert torch.isfinite(out).all(), opts
        check_fp8(out, q, k8, v8, kd, vd, lens, False, f"large descales D{D} {opts} seed {seed}")


@on_hopper
def test_finer_splits_match_reference(seed):
    """The launch fp8_doubles_splits gives (twice the splits, two blocks per SM, the combine in the
    last block) against the float64 reference: odd lengths per entry (some shorter than a split,
    one empty), both dtypes."""
    g = random.Random(seed)
    for B, Sk in ((1, 16384), (3, 9001)):
        for dtype in (torch.float16, torch.bfloat16):
            q, k8, v8, kd, vd = fp8_inputs(B, 32, 8, 1, Sk, 128, dtype, seed + Sk)
            ch = s6.choose(B, 32, 8, 1, Sk, 128, 0, torch.cuda.get_device_properties(0).multi_processor_count, kv_fp8=True)
            assert ch["blocks_per_sm"] == 2 and ch["splits"] >= 2, ch
            lens = ([Sk, g.randrange(1, Sk), 0] * B)[:B]
            seqlens = torch.tensor(lens, dtype=torch.int32, device=q.device)
            with poisoned_outputs():
                out = s6.attention(q, k8, v8, seqlens_k=seqlens, k_descale=kd, v_descale=vd)
            check_fp8(out, q, k8, v8, kd, vd, lens, False, f"finer splits B{B} Sk{Sk} {dtype} seed {seed}")


@on_hopper
def test_fp8_descale_signs_and_zero(seed):
    """A negative k_descale (the scores' sign flips: Q negated for that work tile), a zero one
    (every key alike), a negative v_descale and a zero one, against the reference."""
    B, H, Hk, Sq, Sk, D = 2, 16, 4, 1, 700, 128
    q, k8, v8, kd, vd = fp8_inputs(B, H, Hk, Sq, Sk, D, torch.bfloat16, seed)
    kd[0, 1], kd[1, 2], vd[0, 3], vd[1, 0] = -kd[0, 1], 0.0, -vd[0, 3], 0.0
    for opts in ({}, {"splits": 4}):
        with poisoned_outputs():
            out = s6.attention(q, k8, v8, k_descale=kd, v_descale=vd, **opts)
        check_fp8(out, q, k8, v8, kd, vd, [Sk] * B, False, f"signs {opts} seed {seed}")


def every_code_first(D, dtype, G, B=4, Hk=2):
    """(q, k8, v8, k_descale, v_descale, seqlens_k) with descales 1 and seqlens_k 1, and V's first
    row of each (entry, K/V head) holding the 254 finite e4m3 codes between them (NaN's two codes
    as 0), rolled by D/2: each output row must be its head's first V row exactly."""
    codes = torch.arange(256, dtype=torch.uint8)
    codes[codes.view(FP8).float().isnan()] = 0
    slots = B * Hk * D
    v_first = codes.repeat(-(-slots // 256))[:slots].roll(D // 2).reshape(B, Hk, D)
    q, k8, v8, kd, vd = fp8_inputs(B, Hk * G, Hk, 1, 200, D, dtype, 7, unit_descale=True)
    v8 = v8.clone()
    v8.view(torch.uint8)[:, :, 0] = v_first.to(q.device)
    return q, k8, v8, kd, vd, torch.ones(B, dtype=torch.int32, device=q.device)


@on_hopper
@pytest.mark.parametrize("D", (64, 128))
def test_every_e4m3_value_widens_exactly(D):
    """One key per entry (seqlens_k 1): each output row is its head's first V row exactly (P = 1,
    l = 1), so V's first rows holding all 254 finite e4m3 values must come back as they are, in
    both dtypes: the widening, its column order and its swizzle, checked value by value. Keys
    past the first are finite (masked, multiplied by P = 0)."""
    G = 4
    for dtype in (torch.float16, torch.bfloat16):
        q, k8, v8, kd, vd, lens = every_code_first(D, dtype, G)
        for opts in ({}, {"splits": 2}, {"fp8_switches": {"fold": False, "wide": False}},
                     {"fp8_switches": {"fold": True, "wide": False}}, {"fp8_switches": {"fold": False, "wide": True}},
                     {"fp8_switches": {"fold": True, "wide": True}, "splits": 2}):
            with poisoned_outputs():
                out = s6.attention(q, k8, v8, seqlens_k=lens, k_descale=kd, v_descale=vd, **opts)
            want = v8[:, :, 0].float().repeat_interleave(G, dim=1)[:, :, None]
            assert torch.equal(out.float(), want), (dtype, opts, (out.float() - want).abs().max())


@on_hopper
@pytest.mark.parametrize("D", (64, 128))
def test_fp8_same_bits_as_16bit_cache(D, seed):
    """Descales 1: the e4m3 cache and the same cache in q's dtype (exact) through the same tiles,
    splits and blocks per SM give the same outputs bit for bit (the consumers' code is the same;
    only how the ring is filled differs), both dtypes, split and not, with seqlens_k."""
    g = random.Random(seed)
    for dtype in (torch.float16, torch.bfloat16):
        for B, H, Hk, Sq, Sk in ((4, 32, 8, 1, 2500), (2, 8, 1, 4, 1000), (16, 32, 8, 1, 600)):
            q, k8, v8, kd, vd = fp8_inputs(B, H, Hk, Sq, Sk, D, dtype, seed + Sk, unit_descale=True)
            lens = torch.tensor([g.randrange(1, Sk + 1) for _ in range(B)], dtype=torch.int32, device=q.device)
            causal = "bottom_right" if Sq > 1 else False
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            for splits in (None, 3):
                ch = s6.choose(B, H, Hk, Sq, Sk, D, 0 if Sq == 1 else 2, sms, splits=splits, kv_fp8=True)
                a = s6.attention(q, k8, v8, causal=causal, seqlens_k=lens, k_descale=kd, v_descale=vd, splits=splits)
                b = s6.attention(q, k8.to(dtype), v8.to(dtype), causal=causal, seqlens_k=lens, tiles=ch["tiles"],
                                 schedule=s6.DECODE_SCHEDULE, pack_gqa=True, splits=ch["splits"],
                                 blocks_per_sm=ch["blocks_per_sm"])
                assert torch.equal(a, b), (dtype, (B, H, Hk, Sq, Sk), splits, int((a != b).sum()),
                                           float((a.float() - b.float()).abs().max()))


@on_hopper
def test_fp8_graph_replays_new_descales():
    """Captured in a CUDA graph and replayed with new caches, descales and lengths copied into the
    same tensors: each replay reads the new ones."""
    B, H, Hk, D, Sk = 4, 32, 8, 128, 2048
    q, k8, v8, kd, vd = fp8_inputs(B, H, Hk, 1, Sk, D, torch.bfloat16, 3)
    lens = torch.tensor([Sk, 1, 700, 64], dtype=torch.int32, device=q.device)
    graph, out = captured(lambda: s6.attention(q, k8, v8, seqlens_k=lens, k_descale=kd, v_descale=vd))
    for i, lens2 in enumerate(([5, Sk, 1, 1000], [0, 64, 65, 2047])):
        _, k2, v2, kd2, vd2 = fp8_inputs(B, H, Hk, 1, Sk, D, torch.bfloat16, 10 + i)
        k8.copy_(k2), v8.copy_(v2), kd.copy_(kd2), vd.copy_(vd2), lens.copy_(torch.tensor(lens2, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_fp8(out, q, k8, v8, kd, vd, lens2, False, f"replay {lens2}")
