"""Stage 7 (FP8, issue 25): offline on any machine (the kernel builds for sm_90a without spills
or serialized wgmma, the launch rules, the checks of bad input, the P·V fragment layout against
lib.fp8.v_for_pv), and on an H100/H200 against lib.fp8's emulation of the same arithmetic on the
same e4m3 inputs and against the float64 reference.

The rules a GPU run is held to: max |kernel − emulation| ≤ 2^-7 of max |emulation| (the loop
probe's, experiments/fp8_loop_probe/fp8_loop_probe.py: the emulation rounds P against each row's final max, the
kernel against its running max, and Hopper's FP8 wgmma keeps fewer mantissa bits in its sums
than float32 — 2^-11.4 to 2^-13 of the largest value, the tile probe found); the kernel's RMSE
against float64 within 1.5× the emulation's plus the output's own 16-bit rounding; and the FP8
error rule, lib.fp8.fp8_error_rule (RMSE ≤ 32× a bf16 kernel's, max error ≤ 2× the emulation's
plus one bf16 ulp; scripts/fp8_accuracy.py measured its margins)."""
import math
import re

import pytest
import torch

import stages.stage6 as s6
import stages.stage7 as s7
from conftest import captured, compile_cases, cpu_only, gpu
from lib import fp8
from lib.inputs import NoBackwardError, validate
from lib.reference import reference_attention
from lib.simulator import HAS_GPU

ON_HOPPER = HAS_GPU and torch.cuda.get_device_capability() == (9, 0)
hopper = pytest.mark.skipif(not ON_HOPPER, reason="stage 7 runs wgmma (sm_90a): needs an H100 or H200")


# ---- offline -----------------------------------------------------------------------------------

BUILDS = [  # (head dim, tiles, options): the defaults, and the launches their rules pick
    (64, None, {}), (128, None, {}),
    (128, None, {"schedule": "+ work queue"}), (64, None, {"schedule": "work queue without ping-pong"}),
    (128, None, {"schedule": "work queue without ping-pong"}),  # TAIL_SPLIT on (D128's default)
    (64, None, {"schedule": "work queue without ping-pong", "tail_split": True}),
    (64, s7.FEW_ROWS_TILES[64], {"schedule": s6.DECODE_SCHEDULE}),
    (128, None, {"schedule": "no warp specialization"}),
    (64, None, {"v_in_kernel": True}), (128, None, {"v_in_kernel": True}),
    (64, s7.FEW_ROWS_TILES[64], {"schedule": s6.DECODE_SCHEDULE, "v_in_kernel": True}),
    # wider key tiles (scripts/fp8_tiles.py times them): Vᵀ in sub-tiles of 32, 64 and 128 keys
    (64, (160, 3, 3), {}), (64, (192, 3, 2), {"schedule": "+ work queue"}),
    (128, (224, 2, 2), {}), (128, (192, 3, 2), {"schedule": "+ persistent blocks"}), (128, (160, 3, 2), {}),
    # the row sums by P·V (a row of ones under Vᵀ: N = D + 8)
    (64, None, {"row_sum_mma": True}), (128, None, {"row_sum_mma": True}),
    (128, None, {"row_sum_mma": True, "v_in_kernel": True}),
    (64, s7.FEW_ROWS_TILES[64], {"schedule": s6.DECODE_SCHEDULE, "row_sum_mma": True}),
]


# Without a GPU, each head dim, tile size and option value in one build at least, and the stage's
# two default builds (conftest.compile_cases); FA_ALL_BUILDS=1 compiles them all.
@cpu_only  # NVRTC on the H100 machine has handed back cubins with an empty log (stop 30's note)
@compile_cases("D,tiles,opts", BUILDS, ids=[f"D{d}-{o.get('schedule', 'default')}-{t}" for d, t, o in BUILDS],
               keep=lambda c: c[1] is None and not c[2],
               build=lambda D, tiles, opts: s7.compile_for(head_dim=D, tiles=tiles, **opts))
def test_builds_offline_without_spills_or_serialized_wgmma(D, tiles, opts):
    """Each build ptxas accepts as written: no spills, no wgmma serialized or split by waits it
    inserted (C7510-C7515), setmaxnreg kept (C7508), and the SASS runs the e4m3 tensor-core
    product (QGMMA: D/32 per S and BLOCK_N/32 per P·V, twice for the overlap's two paths) and
    converts P in pairs (F2FP), with no local memory."""
    from lib import sass
    (compiled,) = s7.compile_for(head_dim=D, tiles=tiles, **opts).values()
    use = compiled.resource_usage()["attention_fp8"]
    assert use["spill_stores"] == 0 and use["spill_loads"] == 0 and use["stack_bytes"] == 0, use
    assert not re.search(r"C75(0[0-9]|1[0-9])", compiled.log), compiled.log
    mix = sass.instruction_mix(sass.sass_text(compiled.cubin))
    assert mix["QGMMA"] >= D // 32 + 4 and mix["HGMMA"] == 0, mix
    assert mix["F2FP"] >= 32 and mix["LDL"] == 0 and mix["STL"] == 0, mix


@cpu_only  # reads ptxas's log, which NVRTC on the H100 machine has left empty
def test_three_consumers_at_d128_serialize_wgmma():
    """Why TILES keeps two consumers at D128: with three (160 registers each) ptxas serializes the
    products for want of registers — the warning the build test above refuses."""
    (compiled,) = s7.compile_for(head_dim=128, tiles=(128, 2, 3), schedule="+ intra-warpgroup overlap").values()
    assert re.search(r"C751[0-9]", compiled.log), compiled.log


def test_config_rules_and_refusals():
    for D in (64, 128):
        cfg = s7.config(D)
        assert cfg["smem"] <= s6.MAX_SMEM and dict(cfg["defines"])["Q_STAGES"] == 2
        assert dict(cfg["defines"])["LAZY_RESCALE"] == 0 and dict(cfg["defines"])["P_OFFSET_LOG2"] == 8
    assert dict(s7.config(64, p_offset=False)["defines"])["P_OFFSET_LOG2"] == 0
    with pytest.raises(ValueError, match="448"):
        s7.config(64, lazy_rescale=8)  # P·2^8 past e4m3's range
    with pytest.raises(ValueError, match="tiles"):
        s7.config(64, (176, 2, 2))
    with pytest.raises(ValueError, match="v_in_kernel"):
        s7.config(128, (224, 2, 2), v_in_kernel=True)  # the producer's transpose writes 128-key tiles
    assert [s7.vt_atom(n) for n in (128, 160, 192, 224)] == [128, 32, 64, 32]
    with pytest.raises(ValueError, match="eighths"):
        s7.config(64, exp2_poly=9)
    assert dict(s7.config(64, exp2_poly=4)["defines"])["EXP2_POLY_EIGHTHS"] == 4
    with pytest.raises(ValueError, match="row_sum_mma"):
        s7.config(64, (160, 3, 3), row_sum_mma=True)
    # the default: D64's row sums by P·V where the tiles have room for them
    assert dict(s7.config(64)["defines"])["ROW_SUM_MMA"] == 1 and dict(s7.config(128)["defines"])["ROW_SUM_MMA"] == 0
    assert dict(s7.config(64, (160, 3, 3))["defines"])["ROW_SUM_MMA"] == 0
    assert dict(s7.config(64, s7.FEW_ROWS_TILES[64], s6.DECODE_SCHEDULE)["defines"])["ROW_SUM_MMA"] == 0
    assert s7.emulation_of(1, 8, 512, 512, 64, False, 132) == {"key_tile": 128, "sum_rounded": False}  # few rows
    assert s7.emulation_of(16, 16, 2048, 2048, 64, False, 132) == {"key_tile": 128, "sum_rounded": True}
    assert s7.emulation_of(1, 8, 300, 300, 64, False, 132, tiles=(160, 3, 3)) == {"key_tile": 160, "sum_rounded": False}
    assert dict(s7.config(128, row_sum_mma=True)["defines"])["ROW_SUM_MMA"] == 1
    assert s7.config(128, row_sum_mma=True)["smem"] == s7.config(128, row_sum_mma=False)["smem"] + 8 * 192 * 2
    with pytest.raises(ValueError, match="one"):
        s7.config(64, (128, 3, 1), "+ ping-pong")
    with pytest.raises(NotImplementedError, match="sm_90a"):
        s7.compile_for("sm_80")
    # few rows: one consumer per block; many: the head dim's tiles and stage 6's launch rule
    assert s7.choose(1, 8, 512, 512, 64, False, 132)["tiles"][2] == 1
    big = s7.choose(16, 16, 2048, 2048, 64, False, 132)
    assert big["tiles"] == s7.TILES[64] and big["schedule"] == s7.PERSISTENT_SCHEDULE
    assert s7.choose(16, 16, 2048, 2048, 64, False, 132, v_in_kernel=True)["schedule"] == "+ persistent blocks"
    assert big["work"] == 16 * 16 * math.ceil(2048 / 192)
    # TAIL_SPLIT: in the queue's builds only, by head dim unless asked
    for D in (64, 128):
        assert dict(s7.config(D, None, s7.PERSISTENT_SCHEDULE)["defines"])["TAIL_SPLIT"] == int(s7.TAIL_SPLIT[D])
        assert dict(s7.config(D, None, s7.PERSISTENT_SCHEDULE, tail_split=True)["defines"])["TAIL_SPLIT"] == 1
        assert dict(s7.config(D, None, s7.PERSISTENT_SCHEDULE, tail_split=False)["defines"])["TAIL_SPLIT"] == 0
    assert dict(s7.config(128, None, "+ persistent blocks")["defines"])["TAIL_SPLIT"] == 0


def test_tail_pieces_rule():
    """TAIL_SPLIT's rule (stage7.tail_pieces): the queue's last partial wave is split only for full
    attention, into as many pieces as the idle SMs make room for, each of TAIL_PIECE_TILES key
    tiles or more; whole waves, one wave or less, and causal work are left as they are."""
    n = s7.TAIL_PIECE_TILES
    # B4 H16 S8192 D128 (128-row tiles, 43 key tiles of 192): 4 tiles left over on 132 SMs
    assert s7.tail_pieces(4096, 43, 132, False) == min(132 // 4, 43 // n)
    # B16 H16 S2048 D64 (192-row tiles, 16 key tiles of 128): 44 left over
    assert s7.tail_pieces(2816, 16, 132, False) == 3
    assert s7.tail_pieces(2816, 16, 132, True) == 1     # causal: the queue's tail goes longest first
    assert s7.tail_pieces(264, 43, 132, False) == 1     # two whole waves
    assert s7.tail_pieces(100, 43, 132, False) == 1     # less than a wave: every tile has its SM
    assert s7.tail_pieces(132 + 70, 43, 132, False) == 1  # more than half a wave left: no room
    assert s7.tail_pieces(133, n - 1, 132, False) == 1  # too few key tiles for two pieces
    assert s7.tail_pieces(133, 2 * n, 132, False) == 2
    for work, tiles in ((133, 1000), (4096, 43), (500, 9)):
        p = s7.tail_pieces(work, tiles, 132, False)
        assert (work % 132) * p <= 132 and (p == 1 or tiles // p >= n)


def test_bad_input_is_refused_offline():
    """The checks before any launch, on the CPU: e4m3 accepted as a dtype, mixed dtypes and
    unsupported head dims refused, descales required with e4m3 inputs, no grad, no seqlens_k."""
    q = torch.randn(1, 4, 9, 64)
    k = torch.randn(1, 2, 11, 64)
    q8, k8 = q.to(fp8.E4M3), k.to(fp8.E4M3)
    assert validate(q8, k8, k8, causal=False, scale=None, info=s7.INFO, check_device=False) == 1 / 8
    with pytest.raises(TypeError, match="share one dtype"):
        validate(q8, k, k, causal=False, scale=None, info=s7.INFO, check_device=False)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        validate(q.to(torch.int8), k.to(torch.int8), k.to(torch.int8), causal=False, scale=None,
                 info=s7.INFO, check_device=False)
    with pytest.raises(NotImplementedError, match="64, 128"):
        validate(q[..., :32].to(fp8.E4M3), k[..., :32].to(fp8.E4M3), k[..., :32].to(fp8.E4M3), causal=False,
                 scale=None, info=s7.INFO, check_device=False)
    with pytest.raises(ValueError, match="k_descale is missing"):
        fp8.prepare(q8, k8, k8, q_descale=torch.ones(1, 2), v_descale=torch.ones(1, 2))
    with pytest.raises(NotImplementedError, match="seqlens_k"):
        s7.attention(q, k, k, seqlens_k=torch.ones(1, dtype=torch.int32))
    qg = q.clone().requires_grad_()
    with pytest.raises(NoBackwardError, match="stage 7"):
        s7.attention(qg, k, k)


def test_p_fragments_times_vt_is_p_times_v():
    """The kernel's P·V from its pieces: each thread's e4m3 A fragment packed from its own
    accumulators as stage7.cu's to_operand packs them (accumulator j0, j0+1, j0+4, j0+5 with
    j0 = 16t + 8(r/2) + 2(r%2): lib.fp8.a8_sources), laid out by lib.fp8.a8_element, times the
    Vᵀ tile lib.fp8.v_for_pv makes (B[n][k] = Vᵀ[n][32t + k]), summed over the k-steps as wgmma
    sums them: equal to P·V in the keys' own order (float64, exact on small integers)."""
    g = torch.Generator().manual_seed(11)
    n_keys, D = 128, 64
    P = torch.randint(0, 9, (64, n_keys), generator=g).double()
    v8 = torch.randint(-8, 9, (1, 1, n_keys, D), generator=g).float().to(fp8.E4M3)
    vt = fp8.v_for_pv(v8)[0, 0].double()  # [D, keys in slot order]
    A = torch.full((64, n_keys), math.nan, dtype=torch.float64)
    for thread in range(128):
        acc = [P[fp8.acc_element(thread, j)] for j in range(n_keys // 2)]  # the thread's accumulators
        for t in range(n_keys // 32):
            for r in range(4):
                j0 = 16 * t + 8 * (r // 2) + 2 * (r % 2)
                for b, j in enumerate((j0, j0 + 1, j0 + 4, j0 + 5)):
                    row, kslot = fp8.a8_element(thread, 4 * r + b)
                    A[row, 32 * t + kslot] = acc[j]
    assert not torch.isnan(A).any()  # every element of every k-step's fragment was written
    assert torch.equal(A @ vt.T, P @ v8[0, 0].double())


def test_emulation_on_e4m3_inputs_and_the_kernel_rule():
    """emulate_on_e4m3 is lib.fp8's FP8 forward: with one K/V head per query head, prepare's
    scales are fp8_attention's per-head ones, and within one key tile (where the running max is
    the final one) the two agree to float32 rounding. Over several key tiles P is rounded against
    the running max, which moves it by about as much as P's rounding itself: check_on_emulation
    (the rule the GPU tests hold the kernel to) passes the emulation in bf16, and fails the
    final-max emulation, a NaN, a wrong mask and a 10% error in every column."""
    q, k, v = fp8.outlier_inputs(2, 3, 50, 64, seed=4)
    q, k, v = q[:, :, :37], k[:, :, :45], v[:, :, :45]
    for causal in (False, True):
        emu = fp8.emulate_on_e4m3(*fp8.prepare(q.bfloat16(), k.bfloat16(), v.bfloat16()), causal=causal)
        ref = fp8.fp8_attention(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), causal=causal)
        assert torch.allclose(emu.float(), ref, rtol=0, atol=1e-5 * float(ref.abs().max()))
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 4, s, 64, generator=g).bfloat16() for s in (70, 300, 300))
    k, v = k[:, :2], v[:, :2]  # GQA, three key tiles
    inputs = fp8.prepare(q, k, v)
    for causal in (False, True, "bottom_right"):
        emu = fp8.emulate_on_e4m3(*inputs, causal=causal)
        final_max = fp8.emulate_on_e4m3(*inputs, causal=causal, key_tile=None)
        assert fp8.check_on_emulation(emu.bfloat16(), *inputs, causal=causal)["passed"]
        bad = {"final max": final_max, "10% in every column": emu * 1.1,
               "other mask": fp8.emulate_on_e4m3(*inputs, causal=not causal if causal != "bottom_right" else True)}
        nan = emu.clone()
        nan[0, 1, 2, 3] = math.nan
        bad["a NaN"] = nan
        for name, out in bad.items():
            if name == "final max" and causal is True:
                continue  # top-left causal at Sq 70 < 128: every row sees one key tile, the maxima agree
            got = fp8.check_on_emulation(out.bfloat16(), *inputs, causal=causal)
            assert not got["passed"], (causal, name, got["worst"], got["rmse_ratio"])
    # a row with no visible key (bottom-right, Sq > Sk) is 0, not NaN, in the emulation and the rule
    inputs = fp8.prepare(q[:, :, :9], k[:, :, :3], v[:, :, :3])
    emu = fp8.emulate_on_e4m3(*inputs, causal="bottom_right")
    assert torch.isfinite(emu).all() and (emu[:, :, :6] == 0).all() and (emu[:, :, 6:] != 0).any()
    assert fp8.check_on_emulation(emu.bfloat16(), *inputs, causal="bottom_right")["passed"]


def test_emulated_row_sums_of_rounded_p():
    """sum_rounded (stage 7's ROW_SUM_MMA): l is the sum of the e4m3 P that P·V multiplies, so
    O is a weighted mean of V's rows with weights summing to 1 exactly — with V all ones, O is 1
    to float64 rounding, where l of the unrounded P leaves it off by P's rounding. The rule with
    sum_rounded passes that emulation in bf16 and fails it with 10% in every column."""
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, s, 64, generator=g).bfloat16() for s in (50, 333))
    ones = torch.ones(1, 2, 333, 64).bfloat16()
    inputs = fp8.prepare(q, k, ones)
    one = inputs[2][0, 0, 0, 0].double() * inputs[5][0, 0].double()  # 1 through e4m3 and its descale
    for causal in (False, True):
        by_sum = fp8.emulate_on_e4m3(*inputs, causal=causal, sum_rounded=True)
        plain = fp8.emulate_on_e4m3(*inputs, causal=causal)
        assert (by_sum - one).abs().max() < 1e-12 and (plain - one).abs().max() > 1e-4
    v = torch.randn(1, 2, 333, 64, generator=g).bfloat16()
    inputs = fp8.prepare(q, k, v)
    emu = fp8.emulate_on_e4m3(*inputs, causal=True, sum_rounded=True)
    assert fp8.check_on_emulation(emu.bfloat16(), *inputs, causal=True, sum_rounded=True)["passed"]
    assert not fp8.check_on_emulation((emu * 1.1).bfloat16(), *inputs, causal=True, sum_rounded=True)["passed"]


def byte_perm(x: int, y: int, selector: int) -> int:
    """CUDA's __byte_perm(x, y, s): byte n of the result is byte s_n of the 8 bytes y:x."""
    pool = [(x >> 8 * i) & 255 for i in range(4)] + [(y >> 8 * i) & 255 for i in range(4)]
    return sum(pool[(selector >> 4 * n) & 7] << 8 * n for n in range(4))


@pytest.mark.parametrize("D", [64, 128])
def test_in_kernel_transpose_lays_out_what_v_for_pv_does(D):
    """stage7.cu's transpose_v (V_IN_KERNEL), replayed here index for index on one V tile: the
    tile as TMA swizzles it (kv_offset: chunk c of row r at c ^ (r mod 8) for 128-byte rows,
    c ^ ((r / 2) mod 4) for 64-byte rows), every thread's tasks, its loads, byte permutes and
    stores; the resulting Vᵀ tile, its 128-byte swizzle undone, is v_for_pv's tile byte for byte."""
    g = torch.Generator().manual_seed(D)
    v = torch.randint(0, 256, (128, D), generator=g, dtype=torch.uint8)

    def kv_offset(row, byte):
        chunk = (byte // 16) ^ (row % 8) if D == 128 else (byte // 16) ^ ((row // 2) % 4)
        return row * D + chunk * 16 + byte % 16
    src = bytearray(128 * D)
    for r in range(128):
        for b in range(D):
            src[kv_offset(r, b)] = int(v[r, b])
    word = lambda off: int.from_bytes(src[off:off + 4], "little")  # noqa: E731
    dst = bytearray(D * 128)
    for pt in range(128):
        rq, re = (pt % 32) >> 3, (pt >> 1) & 3
        for task in range(pt, (D // 4) * (128 // 16), 128):
            d0, c = 4 * (task % (D // 4)), task // (D // 4)
            for qq in range(4):
                q = (qq + rq) & 3
                k = 16 * c + 2 * q
                w0, w1, w2, w3 = (word(kv_offset(key, d0)) for key in (k, k + 1, k + 8, k + 9))
                lo01, hi01 = byte_perm(w0, w1, 0x5140), byte_perm(w0, w1, 0x7362)
                lo23, hi23 = byte_perm(w2, w3, 0x5140), byte_perm(w2, w3, 0x7362)
                out = (byte_perm(lo01, lo23, 0x5410), byte_perm(lo01, lo23, 0x7632),
                       byte_perm(hi01, hi23, 0x5410), byte_perm(hi01, hi23, 0x7632))
                for ee in range(4):
                    e = (ee + re) & 3
                    d = d0 + e
                    off = d * 128 + ((c ^ (d % 8)) * 16) + 4 * q
                    dst[off:off + 4] = out[e].to_bytes(4, "little")
    want = fp8.v_for_pv(v.view(fp8.E4M3)[None, None]).view(torch.uint8)[0, 0]  # [D, 128 slots]
    got = torch.tensor([[dst[d * 128 + (((s // 16) ^ (d % 8)) * 16) + s % 16] for s in range(128)] for d in range(D)],
                       dtype=torch.uint8)
    assert torch.equal(got, want)


# ---- on an H100 / H200 -----------------------------------------------------------------------

def where_wrong(out, check) -> str:
    """For a GPU run's failure: which (batch, head) slices, query rows and head-dim columns hold
    the elements over lib.fp8.check_on_emulation's bound (a wrong layout shows as a pattern:
    every other column, rows 8 apart, ...)."""
    emu = check["emu"]
    bad = ~torch.isfinite(out.double()) | ((out.double() - emu).abs() > check["bound"])
    if not bad.any():
        return "no element over its bound"
    b, h, r, c = (int(x) for x in bad.nonzero()[0])
    rows = bad.any(dim=-1).double().mean().item()
    cols = sorted(set((bad.nonzero()[:, 3] % 32).tolist()))[:16]
    qrows = sorted(set((bad.nonzero()[:, 2] % 64).tolist()))[:16]
    return (f"{int(bad.sum())} of {bad.numel()} elements over it, first at [{b}, {h}, {r}, {c}] (kernel "
            f"{float(out[b, h, r, c]):.4g}, emulation {float(emu[b, h, r, c]):.4g}); {rows:.0%} of rows hit; "
            f"columns mod 32 hit: {cols}; rows mod 64 hit: {qrows}")


def assert_close_to_emulation(out, q, k, v, *, causal=False, scale=None, descales=None, p_offset=True, tiles=None,
                              schedule=None, v_in_kernel=False, row_sum_mma=None):
    """The call's output against the emulation on its e4m3 inputs, its running max moved at the
    key tiles the call ran and with its row sums (stage7.emulation_of, from the call's options)."""
    inputs = fp8.prepare(q, k, v, **(descales or {}))
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    build = s7.emulation_of(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], bool(causal), sms,
                            tiles=tiles, schedule=schedule, v_in_kernel=v_in_kernel, row_sum_mma=row_sum_mma)
    c = fp8.check_on_emulation(out, *inputs, causal=causal, scale=scale, p_offset=p_offset, **build)
    print(f"vs emulation: worst element {c['worst']:.3f} of its bound, RMSE {c['rmse_ratio']:.3f} of its allowance")
    assert c["passed"], (f"worst element {c['worst']:.2f} of its bound, RMSE {c['rmse_ratio']:.2f} of its "
                         f"allowance; " + where_wrong(out, c))
    emu = c["emu"]
    if q.dtype != fp8.E4M3:  # against the float64 reference of the unquantized inputs
        ref = reference_attention(q, k, v, causal=causal, scale=scale)
        rounding = fp8.rmse(ref.to(out.dtype), ref)
        assert fp8.rmse(out, ref) <= 1.5 * fp8.rmse(emu, ref) + rounding
        # and the FP8 error rule (lib.fp8.fp8_error_rule: bf16's rounding and the emulation as baselines)
        bf16 = fp8.attention_16bit(q, k, v, torch.bfloat16, causal=causal, scale=scale)
        verdict = fp8.fp8_error_rule(out, ref, bf16, emu)
        assert verdict["passed"], verdict


SHAPES = [(1, 1, 1, 1, 1), (2, 4, 2, 17, 17), (1, 2, 2, 127, 1000), (2, 8, 2, 1000, 127), (1, 4, 1, 333, 333),
          (1, 2, 2, 65, 1)]


@gpu
@hopper
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_matches_emulation_and_reference(shape, causal, dtype, D, seed):
    B, H, Hk, Sq, Sk = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, s, D, generator=g).to("cuda", dtype) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
    out = s7.attention(q, k, v, causal=causal)
    assert out.dtype == dtype and out.shape == q.shape and out.is_contiguous()
    assert_close_to_emulation(out, q, k, v, causal=causal)


@gpu
@hopper
@pytest.mark.parametrize("schedule", list(s6.ALL_SCHEDULES))
@pytest.mark.parametrize("D", [64, 128])
def test_every_schedule(schedule, D, seed):
    """Each of stage 6's schedules on this kernel, at a shape whose K/V ring wraps several times
    and whose work tiles outnumber the SMs (persistent blocks walk several)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, 40, 700, D, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    for causal in (False, True):
        assert_close_to_emulation(s7.attention(q, k, v, causal=causal, schedule=schedule), q, k, v, causal=causal,
                                  schedule=schedule)


WIDE_TILES = [(64, (160, 3, 3)), (64, (192, 3, 2)), (128, (160, 3, 2)), (128, (192, 2, 2)), (128, (224, 2, 2)),
              (128, (224, 3, 2))]


@gpu
@hopper
@pytest.mark.parametrize("D,tiles", WIDE_TILES, ids=[f"D{d}-{t}" for d, t in WIDE_TILES])
def test_wider_key_tiles(D, tiles, seed):
    """Key tiles of 160, 192 and 224 (Vᵀ copied and read in sub-tiles of 32, 64 or 128 keys), at
    lengths that are no multiple of the tile (a last tile of 1 key, of 33, of tile − 1), GQA,
    both causal alignments, one block per work tile and persistent blocks walking several (their
    K/V ring wrapping across work tiles)."""
    g = torch.Generator().manual_seed(seed)
    bn = tiles[0]
    for B, H, Hk, Sq, Sk in ((2, 8, 2, 300, 3 * bn + 1), (1, 4, 4, 1000, bn + 33), (3, 40, 20, 130, 2 * bn - 1)):
        q, k, v = (torch.randn(B, h, s, D, generator=g).to("cuda", torch.bfloat16)
                   for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
        for causal in (False, True, "bottom_right"):
            for schedule in (None, "+ persistent blocks"):
                out = s7.attention(q, k, v, causal=causal, tiles=tiles, schedule=schedule)
                assert_close_to_emulation(out, q, k, v, causal=causal, tiles=tiles, schedule=schedule)


@gpu
@hopper
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
def test_v_transposed_in_the_kernel(causal, D, seed):
    """V_IN_KERNEL: the producer warpgroup transposes V's tiles (no Vᵀ pass), at shapes with odd
    lengths, GQA, work tiles without keys, blocks of one consumer and persistent blocks walking
    several work tiles (its staging buffers run on across them)."""
    g = torch.Generator().manual_seed(seed)
    for B, H, Hk, Sq, Sk in [(1, 2, 1, 77, 300), (2, 8, 2, 1000, 333), (4, 40, 8, 700, 700), (1, 4, 4, 300, 65)]:
        q, k, v = (torch.randn(B, h, s, D, generator=g).to("cuda", torch.bfloat16) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
        assert_close_to_emulation(s7.attention(q, k, v, causal=causal, v_in_kernel=True), q, k, v, causal=causal,
                                  v_in_kernel=True)


@gpu
@hopper
@pytest.mark.parametrize("D", [64, 128])
def test_row_sums_by_mma(D, seed):
    """ROW_SUM_MMA: each row's sum of P from P·V's extra column (a row of ones under every Vᵀ
    sub-tile), at odd lengths, GQA, both causal alignments (rows with no visible key: zeros),
    one block per work tile, the work queue and persistent blocks (the ring wrapping across work
    tiles), blocks of one consumer and V transposed in the kernel; against the emulation whose l
    sums the rounded P."""
    g = torch.Generator().manual_seed(seed)
    for B, H, Hk, Sq, Sk in [(1, 2, 1, 77, 300), (2, 8, 2, 1000, 333), (4, 40, 8, 700, 700), (1, 4, 4, 300, 65),
                             (1, 4, 2, 130, 9000)]:  # the last: 70 key tiles' sums (take_row_sums)
        q, k, v = (torch.randn(B, h, s, D, generator=g).to("cuda", torch.bfloat16) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
        for causal in (False, True, "bottom_right"):
            for opts in ({}, {"schedule": "+ persistent blocks"}, {"v_in_kernel": True}):
                out = s7.attention(q, k, v, causal=causal, row_sum_mma=True, **opts)
                assert_close_to_emulation(out, q, k, v, causal=causal, row_sum_mma=True, **opts)


@gpu
@hopper
@pytest.mark.parametrize("D", [64, 128])
def test_tail_split(D, seed):
    """TAIL_SPLIT: the queue's last partial wave of work tiles split along the keys, each piece's
    rows in fp32, combined by a second kernel. Shapes made so that the rule splits (it is
    asserted): more work tiles than SMs by a few, key lengths of no multiple of the tile, a last
    query block that is partial, GQA; against the emulation, and the same bits on a second run
    (the combine weighs the pieces in one order). At D64, where it is off by default, asked for."""
    g = torch.Generator().manual_seed(seed)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bn, _, consumers = s7.TILES[D]
    rows = 64 * consumers
    for B, H, group, Sq, Sk in [(1, sms + 4, 2, rows, 40 * bn + 5), (2, (sms + 6) // 2, 1, 2 * rows - 37, 12 * bn - 1),
                                (1, sms + 2, 1, 100, 8 * bn + 1)]:
        H -= H % group
        q, k, v = (torch.randn(B, h, s, D, generator=g).to("cuda", torch.bfloat16)
                   for h, s in ((H, Sq), (H // group, Sk), (H // group, Sk)))
        work = B * H * -(-Sq // rows)
        assert s7.tail_pieces(work, -(-Sk // bn), sms, False) > 1, (work, Sk)
        out = s7.attention(q, k, v, tail_split=True)
        assert torch.equal(out, s7.attention(q, k, v, tail_split=True))
        assert_close_to_emulation(out, q, k, v)
        whole = s7.attention(q, k, v, tail_split=False)
        assert_close_to_emulation(whole, q, k, v)
        for causal in (True, "bottom_right"):  # the same build, never split
            assert_close_to_emulation(s7.attention(q, k, v, causal=causal, tail_split=True), q, k, v, causal=causal)



@gpu
@hopper
@pytest.mark.parametrize("D", [64, 128])
def test_rows_past_end_same_bits(D, seed):
    """SKIP_ROWS_PAST_END (stage 6's): a consumer whose rows all lie past Sq computes nothing, and
    every row the call returns has the same bits as the build without: at D64 lengths that leave
    one or two of the last block's three consumers without a row (2048, 1024), at D128 one of
    two (700); the work queue with its tail split (D128) and without, one block per work tile,
    causal both ways, GQA; against the emulation too."""
    g = torch.Generator().manual_seed(seed)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {64: [(2, 40, 8, 2048, 2048), (1, 16, 16, 1024, 999)], 128: [(1, sms + 4, sms + 4, 700, 5 * 192 + 7), (2, 8, 2, 700, 700)]}
    for B, H, Hk, Sq, Sk in shapes[D]:
        q, k, v = (torch.randn(B, h, s, D, generator=g).to("cuda", torch.bfloat16) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
        for causal in (False, True, "bottom_right"):
            runs = [s7.attention(q, k, v, causal=causal, skip_past_end=skip) for skip in (True, False)]
            assert torch.equal(runs[0], runs[1]), (B, H, Sq, Sk, causal)
            assert_close_to_emulation(runs[0], q, k, v, causal=causal)

@gpu
@hopper
@pytest.mark.parametrize("D", [64, 128])
def test_tail_waves_same_bits(D, seed):
    """The work queue handing its last causal tiles out longest first (stage 6's tail_heads_for)
    changes which block computes which tile, not any tile's arithmetic: the same bits as the plain
    order, with a tail of one wave, two and every head, both causal alignments, GQA."""
    g = torch.Generator().manual_seed(seed)
    for B, H, Hk, Sq, Sk in [(2, 40, 8, 700, 700), (4, 24, 24, 1000, 333)]:
        q, k, v = (torch.randn(B, h, s, D, generator=g).to("cuda", torch.bfloat16) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
        for causal in (True, "bottom_right"):
            runs = [s7.attention(q, k, v, causal=causal, schedule="work queue without ping-pong", tail_waves=w)
                    for w in (0, 1, 2, 1000)]
            for r in runs[1:]:
                assert torch.equal(runs[0], r), (B, H, Sq, Sk, causal)
            assert_close_to_emulation(runs[2], q, k, v, causal=causal, schedule="work queue without ping-pong")


def test_quantize_kernels_compile_offline():
    """stages/stage7_quantize.cu builds for both 16-bit types and head dims without spills."""
    from lib import nvrtc
    for D in (64, 128):
        for dtype in (torch.float16, torch.bfloat16):
            compiled = nvrtc.compile_stage(s7.QUANTIZE_SOURCE, arch=s7.ARCH, dtype=dtype, head_dim=D)
            use = compiled.resource_usage()
            assert set(use) >= {"fp8_amax", "fp8_cast"} or not use, compiled.log  # an empty log: see above
            assert all(u["spill_stores"] == 0 for u in use.values()), use


@gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
def test_quantize_gives_prepares_bytes(D, dtype, seed):
    """stage7.quantize (two launches for the three tensors, V transposed in the second) gives the
    bytes of lib.fp8.prepare and lib.fp8.v_for_pv, and the same descales, bit for bit: GQA, key
    lengths that are not a multiple of 32 (Vᵀ's padding keys zero), an all-zero head (descale
    1e-12), outliers, transposed views, one key, more batch·K/V heads than a grid's y holds
    (65,535: the blocks are numbered along x), and V left untransposed (v_transposed=False)."""
    g = torch.Generator().manual_seed(seed)
    for B, H, Hk, Sq, Sk in [(2, 8, 2, 77, 300), (1, 4, 4, 1, 1), (3, 6, 3, 130, 64), (2, 33000, 33000, 1, 3)]:
        q, k, v = (torch.randn(B, h, s, D, generator=g) for h, s in ((H, Sq), (Hk, Sk), (Hk, Sk)))
        k = k + 30 * torch.randn(k.shape, generator=g) * (torch.rand(k.shape, generator=g) < 1e-3)
        v[0, 0] = 0.0
        q, k, v = (t.to("cuda", dtype) for t in (q, k, v))
        q = q.transpose(1, 2).contiguous().transpose(1, 2)  # a [B, S, H, D] tensor's view
        ref = fp8.prepare(q, k, v)
        got = s7.quantize(q, k, v)
        for name, a, b in zip(("q8", "k8", "vt", "q_descale", "k_descale", "v_descale"), got,
                              (*ref[:2], fp8.v_for_pv(ref[2]), *ref[3:])):
            same = torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.dtype == fp8.E4M3 else torch.equal(a, b)
            assert same, f"{name} B{B} H{H}/{Hk} Sq{Sq} Sk{Sk} D{D} {dtype}: {a.shape} vs {b.shape}"
        assert torch.equal(s7.quantize(q, k, v, v_transposed=False)[2].view(torch.uint8), ref[2].view(torch.uint8))


@gpu
@hopper
def test_e4m3_inputs_strided_views_and_odd_options(seed):
    """e4m3 inputs with their descales (bf16 out), transposed [B, S, H, D] views read in place,
    a negative scale, P without its 2^8 offset, the rescale on every tile, empty inputs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 300, 6, 128, generator=g).to("cuda", torch.bfloat16)  # [B, S, H, D]
    q, k, v = x.transpose(1, 2), x[:, :, :3].transpose(1, 2), x[:, :, 3:].transpose(1, 2)
    assert_close_to_emulation(s7.attention(q, k, v, causal=True), q, k, v, causal=True)
    assert_close_to_emulation(s7.attention(q, k, v, scale=-0.2), q, k, v, scale=-0.2)
    for opts in ({"p_offset": False}, {"lazy_rescale": -1}, {"v_in_kernel": True}, {"exp2_poly": 4}):
        assert_close_to_emulation(s7.attention(q, k, v, **opts), q, k, v, p_offset=opts.get("p_offset", True),
                                  v_in_kernel=opts.get("v_in_kernel", False))
    q8, k8, v8, qd, kd, vd = fp8.prepare(q.contiguous(), k.contiguous(), v.contiguous())
    descales = {"q_descale": qd, "k_descale": kd, "v_descale": vd}
    out = s7.attention(q8, k8, v8, **descales)
    assert out.dtype == torch.bfloat16
    assert_close_to_emulation(out, q8, k8, v8, descales=descales)
    assert s7.attention(q[:, :, :0], k, v).shape == (2, 6, 0, 128)
    assert torch.equal(s7.attention(q, k[:, :, :0], v[:, :, :0]), torch.zeros_like(q))


@gpu
@hopper
@pytest.mark.parametrize("v_in_kernel", [False, True])
def test_cuda_graph_replays(v_in_kernel, seed):
    """The whole call (quantization, V's transpose or not, the kernel) captured in a CUDA graph
    after a warm-up on the capturing side, then replayed on new inputs copied into the captured
    ones: each replay's output, NaN-poisoned before it, against the emulation."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 8, 333, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    call = lambda: s7.attention(q, k, v, causal=True, v_in_kernel=v_in_kernel)  # noqa: E731
    graph, out = captured(call)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=g).to("cuda", torch.bfloat16))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_emulation(out, q, k, v, causal=True, v_in_kernel=v_in_kernel)


@gpu
@hopper
def test_tail_split_in_a_graph_and_on_two_streams(seed):
    """D128's split tail (its fp32 partial rows, one set per stream, and the combine kernel
    launched with PDL) captured in a CUDA graph and replayed on new inputs, NaN-poisoned before
    each replay; and two calls on two streams at once. Each output the same bits as the same
    call made alone."""
    g = torch.Generator().manual_seed(seed)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bn, _, consumers = s7.TILES[128]
    H, Sk = sms + 4, 16 * bn - 7
    assert s7.TAIL_SPLIT[128] and s7.tail_pieces(H, -(-Sk // bn), sms, False) > 1
    new = lambda: [torch.randn(1, h, s, 128, generator=g).to("cuda", torch.bfloat16)  # noqa: E731
                   for h, s in ((H, 64 * consumers), (H // 2, Sk), (H // 2, Sk))]
    q, k, v = new()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        s7.attention(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = s7.attention(q, k, v)
    for _ in range(2):
        for t, x in zip((q, k, v), new()):
            t.copy_(x)
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, s7.attention(q, k, v))
        assert_close_to_emulation(out, q, k, v)
    inputs = [new(), new()]
    alone = [s7.attention(*x) for x in inputs]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = []
    for st, x in zip(streams, inputs):
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            outs.append(s7.attention(*x))
    torch.cuda.synchronize()
    for o, a in zip(outs, alone):
        assert torch.equal(o, a)


@gpu
@hopper
@pytest.mark.parametrize("v_in_kernel", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_small_shapes_for_the_sanitizers(D, v_in_kernel, seed):
    """What compute-sanitizer runs (scripts/gpu_session.sh, fp8 step): small shapes, so that its
    racecheck finishes, with a K/V ring that wraps several times (500 keys: 4 tiles of 128
    through 3 stages at D64, 3 of 192 through 2 at D128); one block per work tile (and blocks of
    one consumer), then 280 one-block work tiles under a persistent launch, so that each block
    walks two or three; both causal alignments. Then the work queue with its last partial wave
    split in two along 1,400 keys (TAIL_SPLIT, asked for: D64 runs without it by default): 136
    one-block work tiles, 4 past the H100's 132 SMs."""
    g = torch.Generator().manual_seed(seed)
    for H, Sq, Sk, schedules in ((4, 200, 500, (None, "+ intra-warpgroup overlap")), (280, 64, 500, ("+ persistent blocks",)),
                                 (136, 64, 1400, (None,))):
        if v_in_kernel and Sk > 500:
            continue  # v_in_kernel has no work queue
        q, k, v = (torch.randn(1, h, s, D, generator=g).to("cuda", torch.bfloat16)
                   for h, s in ((H, Sq), (H // 2, Sk), (H // 2, Sk)))
        for causal in (False, "bottom_right"):
            for schedule in schedules:
                split = {"tail_split": True} if Sk > 500 else {}
                out = s7.attention(q, k, v, causal=causal, schedule=schedule, v_in_kernel=v_in_kernel, **split)
                assert_close_to_emulation(out, q, k, v, causal=causal, schedule=schedule, v_in_kernel=v_in_kernel)
