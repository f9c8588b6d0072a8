"""Stage 8's Hopper dK/dV kernel with a producer warpgroup (PRODUCER, issue 48 item 2: the loads
and dQ's bulk reductions issued by a warpgroup of their own, setmaxnreg; stages/stage8_wgmma.cu).
CPU: the builds' settings and refusals, and every producer build compiled for sm_90a (no spill,
no local memory, wgmma not serialized, setmaxnreg in the SASS, no TMA load or bulk reduction
between the consumers' setmaxnreg and the producer's). GPU (an H100/H200): gradients against
float64 autograd (lib.reference.check_gradients) at odd shapes, and dK and dV bit-equal to the
build without the producer, whose dK and dV add the same products in the same order (dQ's bulk
reductions from many blocks land in any order, so dQ is only judged by the rule)."""
import math
import re
from collections import Counter

import pytest
import torch

from conftest import assert_no_local_memory, compile_cases, gpu
from lib import sass
from lib.inputs import make_qkv
from lib.reference import check_gradients
from stages import stage5, stage6, stage8
from stages.stage6_variants import Variants
from test_backward import SHAPES as BACKWARD_SHAPES
from test_backward_variants import _assert_passes, _check, _inputs as variant_inputs

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
hopper = pytest.mark.skipif(not HOPPER, reason="the WGMMA build needs an sm_90 GPU (H100/H200)")
SM_SMEM = 233472  # 228 KB of shared memory an SM, 1 KB of it reserved per block

# ---- CPU -------------------------------------------------------------------------------------

# (D, dtype, warpgroups, variant defines, other switches): both head dims and dtypes, one and two
# warpgroups that multiply, without and with each variant build (stage8.config's softcap, window),
# but those the launcher runs without the producer (stage8.variant_switches: with it they spill);
# then dQ in turns (two warpgroups at D 64), dQ issued early, and the overlap flipped. At D 128 fp16 a softcap
# with dK's product first keeps the scale on dS, and a window with lse read early keeps dK and dV's
# stores from registers: with SCALE_AT_END or EPILOGUE_SMEM (the stage's build) ptxas spilled 12-20 bytes
VARIANT_DEFINES = [{}, {"softcap": 1}, {"softcap": 2}, {"window": True}, {"softcap": 2, "window": True}]


# ROWS80 (80 queries a step) with the switches that fit it in 240 registers without serializing wgmma
ROWS80 = {"rows80": 1, "dk_last": 0, "prep_early": 0}


def _runs_the_producer(D, v):
    var = Variants(softcap=30.0 if v.get("softcap") else None, window=(8, 0) if v.get("window") else None,
                   softcap_build=v.get("softcap", 0))
    return stage8.variant_switches(D, var).get("producer", 1) == 1


BUILDS = ([(D, dt, w, v, {}) for D in (64, 128) for dt in (torch.float16, torch.bfloat16) for w in (1, 2)
           for v in VARIANT_DEFINES if _runs_the_producer(D, v)]
          + [(64, torch.bfloat16, 2, {}, {"dq_turns": 1}), (64, torch.bfloat16, 2, {"softcap": 2, "window": True},
                                                             {"dq_turns": 1}),
             (64, torch.bfloat16, 1, {}, {"dq_early": 1}), (128, torch.bfloat16, 2, {}, {"dq_early": 1}),
             (64, torch.bfloat16, 1, {}, {"overlap": 1}), (128, torch.bfloat16, 2, {}, {"overlap": 0}),
             (128, torch.float16, 1, {}, {"overlap": 0}),
             (64, torch.bfloat16, 2, {}, {"dq_turns": 1, "dk_last": 1}), (64, torch.bfloat16, 1, {}, {"dk_last": 1}),
             (128, torch.bfloat16, 2, {}, {"dk_last": 0}), (128, torch.float16, 2, {"softcap": 1}, {"dk_last": 0, "scale_at_end": 0}),
             (64, torch.bfloat16, 2, {}, {"mask_split": 0}), (128, torch.float16, 2, {}, {"mask_split": 0}),
             (128, torch.bfloat16, 2, {"window": True}, {"mask_split": 0}),
             (64, torch.bfloat16, 2, {}, {"epilogue_smem": 0}), (128, torch.float16, 2, {}, {"epilogue_smem": 0}),
             (64, torch.float16, 2, {"window": True}, {"epilogue_smem": 0}),
             (128, torch.bfloat16, 2, {"window": True}, {"epilogue_smem": 0}),
             (64, torch.bfloat16, 2, {}, {"ds_stmatrix": 1}), (64, torch.float16, 2, {}, {"ds_stmatrix": 1, "overlap": 1}),
             (128, torch.float16, 2, {}, {"ds_stmatrix": 1}), (64, torch.bfloat16, 1, {"window": True}, {"ds_stmatrix": 1}),
             (64, torch.bfloat16, 2, {}, {"prep_early": 2}), (64, torch.float16, 2, {"softcap": 2, "window": True},
                                                              {"prep_early": 2}),
             (128, torch.bfloat16, 2, {}, {"prep_early": 1}), (128, torch.float16, 2, {"window": True}, {"prep_early": 1, "epilogue_smem": 0}),
             (64, torch.bfloat16, 2, {}, {"prep_early": 2, "ds_stmatrix": 1}),
             (128, torch.bfloat16, 2, {}, {"prep_early": 1, "ds_stmatrix": 1}),
             (64, torch.bfloat16, 2, {}, {"kv_regs": 1}), (64, torch.float16, 2, {"softcap": 2, "window": True},
                                                             {"kv_regs": 1}),
             (64, torch.bfloat16, 1, {}, {"kv_regs": 1}), (64, torch.float16, 2, {}, {"kv_regs": 2}),
             (64, torch.bfloat16, 2, {}, {"kv_regs": 1, "prep_early": 3}),
             (128, torch.bfloat16, 2, {}, {"prep_early": 3}), (128, torch.float16, 2, {"window": True}, {"prep_early": 3, "epilogue_smem": 0}),
             (128, torch.bfloat16, 2, {}, ROWS80), (128, torch.float16, 2, {}, ROWS80)])
_build_id = lambda b: (f"D{b[0]}-{str(b[1])[6:]}-wg{b[2]}-" + "-".join(f"{k}{int(v)}" for k, v in {**b[3], **b[4]}.items())  # noqa: E731
                       ).rstrip("-")
# setmaxnreg's counts (stages/stage8_wgmma.cu): the producer's, the consumers' per (warpgroups, D)
PRODUCER_REGS, CONSUMER_REGS = 24, {(2, 64): 240, (2, 128): 240, (1, 64): 232, (1, 128): 248}


def _config(D, w, variant, extra):
    return stage8.config(D, None, None, 1, **variant, warpgroups=w, producer=1, **extra)


def _build(D, dtype, w, variant, extra):
    """A fresh compile with ptxas's report (a define of its own, as test_backward's offline builds)."""
    from lib import nvrtc
    cfg = _config(D, w, variant, extra)
    return nvrtc.compile_stage(stage8.WGMMA_SOURCE, arch="sm_90a", dtype=dtype, head_dim=D,
                               defines={"STAGE8_OFFLINE_CHECK": 1, **dict(cfg["defines"])})


def test_producer_config():
    """One more warpgroup (threads), two mbarriers per dQ buffer and warpgroup; one block fits an SM's
    shared memory (two at D 64 with one warpgroup, as without the producer); refused without the
    TMA loads or the bulk reductions it issues, and with three blocks per SM."""
    for D in (64, 128):
        for w in (1, 2):
            # (EPILOGUE_SMEM named: at D 128 the build without the producer leaves it off, where it spills)
            plain = stage8.config(D, wgmma=1, warpgroups=w, producer=0, dq_turns=0, epilogue_smem=1)
            cfg = stage8.config(D, wgmma=1, warpgroups=w, producer=1, dq_turns=0, epilogue_smem=1)
            assert dict(cfg["defines"]) == {**dict(plain["defines"]), "PRODUCER": 1}
            assert cfg["threads"] == plain["threads"] + 128 == 128 * (w + 1)
            assert cfg["smem"] == plain["smem"] + 2 * 2 * w * 8
            assert cfg["smem"] + 1024 <= SM_SMEM
        assert dict(stage8.config(D, wgmma=1)["defines"])["PRODUCER"] == 1  # on in the stage's build
    assert 2 * (stage8.config(64, wgmma=1, warpgroups=1, producer=1, dq_turns=0)["smem"] + 1024) <= SM_SMEM
    for bad in ({"tma_loads": 0}, {"dq_bulk": 0}, {"dq_atomics": 0}):
        with pytest.raises(ValueError, match="producer=1"):
            stage8.config(128, wgmma=1, producer=1, **bad)
    with pytest.raises(ValueError, match="producer=1"):
        stage8.config(64, wgmma=1, producer=1, warpgroups=1, overlap=0, blocks_per_sm=3)
    with pytest.raises(ValueError, match="producer"):
        stage8.config(64, wgmma=1, producer=2)


def test_dk_last_config():
    """DK_LAST (dK's product after dQ's) is on in the stage's build at D 128 (and D 96, in its tiles),
    off at D 64; refused where the dK/dV kernel makes no dQ product (the dQ pass), issues it early,
    or makes two a turn (one warpgroup at D 128), and left off where such a call does not name it."""
    for D, on in ((64, 0), (96, 1), (128, 1)):
        assert dict(stage8.config(D, wgmma=1)["defines"])["DK_LAST"] == on
        assert dict(stage8.config(D, wgmma=1, dk_last=1)["defines"])["DK_LAST"] == 1
    for D, bad in ((128, {"dq_atomics": 0}), (64, {"dq_early": 1}), (128, {"warpgroups": 1})):
        with pytest.raises(ValueError, match="dk_last=1"):
            stage8.config(D, wgmma=1, dk_last=1, **bad)
        assert dict(stage8.config(D, wgmma=1, **bad)["defines"])["DK_LAST"] == 0


def test_scale_at_end_config():
    """SCALE_AT_END is a switch a call may flip wherever dQ's sum has the postprocess (DQ_BULK) or the
    dQ pass makes dQ; refused with the vector reductions, whose dQ no postprocess scales; the
    postprocess then takes the softmax scale, else 1."""
    for D in (64, 96, 128, 256):
        on = dict(stage8.config(D, wgmma=1, scale_at_end=1)["defines"])
        assert on == {**dict(stage8.config(D, wgmma=1)["defines"]), "SCALE_AT_END": 1}
    with pytest.raises(ValueError, match="scale_at_end=1"):
        stage8.config(64, None, 1, 1, dq_bulk=0, scale_at_end=1)
    assert dict(stage8.config(64, None, 1, 1, dq_bulk=0)["defines"])["SCALE_AT_END"] == 0  # unsaid: off
    stage8.config(64, None, 0, 1, scale_at_end=1)  # the dQ pass: its own dS keeps the scale


def test_mask_split_config():
    """MASK_SPLIT is on in the stage's build at every head dim of the WGMMA build with a dQ in this
    kernel (D 64, 96, 128); a switch a call may flip."""
    for D in (64, 96, 128):
        defines = dict(stage8.config(D, wgmma=1)["defines"])
        assert defines["MASK_SPLIT"] == 1, defines
        flipped = dict(stage8.config(D, wgmma=1, mask_split=0)["defines"])
        assert flipped == {**defines, "MASK_SPLIT": 0}


def test_epilogue_smem_config():
    """EPILOGUE_SMEM is a switch a call may flip at every head dim, changing no other define; on in
    the builds of D 64, 96 and 128 (not D 256's); at D 96 and 128 off with a softcap or without the
    producer unless the call says (its addresses spilled there), and a call's word wins."""
    for D in (64, 96, 128, 256):
        flipped = dict(stage8.config(D, wgmma=1, epilogue_smem=1)["defines"])
        assert flipped == {**dict(stage8.config(D, wgmma=1, epilogue_smem=0)["defines"]), "EPILOGUE_SMEM": 1}
    assert [stage8.WGMMA_BUILD[D]["EPILOGUE_SMEM"] for D in (64, 96, 128, 256)] == [1, 1, 1, 0]
    for D in (96, 128):
        for softcap in (1, 2):
            assert dict(stage8.config(D, wgmma=1, softcap=softcap)["defines"])["EPILOGUE_SMEM"] == 0
            assert dict(stage8.config(D, wgmma=1, softcap=softcap, epilogue_smem=1)["defines"])["EPILOGUE_SMEM"] == 1
        assert dict(stage8.config(D, wgmma=1, window=True)["defines"])["EPILOGUE_SMEM"] == 1
        assert dict(stage8.config(D, wgmma=1, producer=0)["defines"])["EPILOGUE_SMEM"] == 0
    assert dict(stage8.config(64, wgmma=1, softcap=1)["defines"])["EPILOGUE_SMEM"] == 1


def test_epilogue_smem_stores_whole_pieces():
    """Offline (NVRTC, no GPU): with EPILOGUE_SMEM a thread of the dK/dV kernel stores dK and dV as
    16-byte pieces of rows (STG.E.128: 2 tensors × 128 keys × D/8 pieces over 256 threads), where the
    accumulators' pairs take D/2 4-byte stores (2 tensors × 2 rows × D/8); dQ leaves by bulk
    reductions, so no other global store is left. The postprocess reads 64 bytes a thread and
    stores two 16-byte pieces (ROWS80's: eight 16-byte loads, four pieces)."""
    for D in (64, 128):
        stores = {}
        for on in (0, 1):
            built = stage8.compile_for("sm_90a", torch.bfloat16, D, epilogue_smem=on)
            stores[on] = Counter(re.findall(r"\bSTG\S*", sass.function_text(sass.sass_text(built["attention_backward"].cubin),
                                                                              "attention_backward")))
        assert stores[0] == {"STG.E": D // 2} and stores[1] == {"STG.E.128": D // 8}, (D, stores)
        listing = sass.sass_text(built["attention_backward_postprocess"].cubin)
        post = Counter(re.findall(r"\b(?:LDG|STG)\S*", sass.function_text(listing, "attention_backward_postprocess")))
        assert post == {"LDG.E.128.CONSTANT": 4, "STG.E.128": 2}, post
        # ROWS80's: eight 16-byte loads a thread, two 32-byte pieces of each of two rows
        post = Counter(re.findall(r"\b(?:LDG|STG)\S*", sass.function_text(listing, "attention_backward_postprocess_rows80")))
        assert post == {"LDG.E.128.CONSTANT": 8, "STG.E.128": 4}, post


def test_prep_early_config():
    """PREP_EARLY is a switch a call may flip (1 at every head dim of the WGMMA build with a dQ in this
    kernel, 2 at D 64 only: elsewhere it spills), changing no other define; DS_STMATRIX likewise, and
    refused where the dK/dV kernel makes no dQ product (the dQ pass)."""
    for D in (64, 96, 128):
        base = dict(stage8.config(D, wgmma=1, prep_early=0, ds_stmatrix=0)["defines"])
        for name, values in (("prep_early", (1, 2) if D == 64 else (1,)), ("ds_stmatrix", (1,))):
            for value in values:
                flipped = {"prep_early": 0, "ds_stmatrix": 0, name: value}
                assert dict(stage8.config(D, wgmma=1, **flipped)["defines"]) == {**base, name.upper(): value}
    for D in (96, 128, 256):
        with pytest.raises(ValueError, match="prep_early=2"):
            stage8.config(D, wgmma=1, prep_early=2)
    with pytest.raises(ValueError, match="ds_stmatrix=1"):
        stage8.config(64, None, 0, 1, ds_stmatrix=1)


def test_kv_regs_config():
    """KV_REGS (K, or K and V, held in registers for Sᵀ and dPᵀ) is a D 64 switch a call may flip,
    changing no other define; refused at the head dims where K alone spills (96, 128) or where two
    warpgroups split D (256). PREP_EARLY 3 likewise at D 64 and 128."""
    base = dict(stage8.config(64, wgmma=1, kv_regs=0, prep_early=0)["defines"])
    for value in (1, 2):
        assert dict(stage8.config(64, wgmma=1, kv_regs=value, prep_early=0)["defines"]) == {**base, "KV_REGS": value}
    assert dict(stage8.config(64, wgmma=1, kv_regs=0, prep_early=3)["defines"]) == {**base, "PREP_EARLY": 3}
    for D in (96, 128, 256):
        with pytest.raises(ValueError, match="kv_regs"):
            stage8.config(D, wgmma=1, kv_regs=1)
        with pytest.raises(ValueError, match="kv_regs"):
            stage8.config(D, wgmma=1, kv_regs=2)


# A wgmma with a register A operand and a K-major B (no .tnspB): Sᵀ and dPᵀ under KV_REGS
KMAJOR_REG_A = r"HGMMA\.\S+ R\d+, R(\d+), gdesc\[UR\d+\](?!\.tnsp)"


def test_kv_regs_refused_at_three_blocks_per_sm():
    """Three blocks per SM leave 168 registers: K and V would spill there, so kv_regs is refused."""
    with pytest.raises(ValueError, match="blocks_per_sm=3"):
        stage8.config(64, wgmma=1, warpgroups=1, overlap=0, producer=0, blocks_per_sm=3, kv_regs=1)
    assert dict(stage8.config(64, wgmma=1, warpgroups=1, overlap=0, producer=0, blocks_per_sm=3)["defines"])["KV_REGS"] == 0


def test_rows80_config():
    """rows80=1: 80 queries a step, one buffer of dQ tiles (shared memory within an SM's), the
    dSᵀ buffer's second atom; refused where its dQᵀ product does not fit (D 64, one warpgroup, no
    producer, the variants)."""
    base = stage8.config(128, wgmma=1, dk_last=0, prep_early=0)
    cfg = stage8.config(128, wgmma=1, **ROWS80)
    assert dict(cfg["defines"]) == {**dict(base["defines"]), "ROWS80": 1}
    assert cfg["block_m"] == 80 and base["block_m"] == 64 and cfg["smem"] <= SM_SMEM - 1024
    assert stage8.config(96, wgmma=1, **ROWS80)["block_m"] == 80
    assert stage8.config(128, wgmma=1, rows80=1) == cfg  # DK_LAST and PREP_EARLY off unless said
    for bad in ({"warpgroups": 1}, {"producer": 0}, {"dq_atomics": 0}, {"softcap": 1}, {"window": True},
                {"dk_last": 1}, {"prep_early": 1}):
        with pytest.raises(ValueError, match="rows80"):
            stage8.config(128, wgmma=1, **{**ROWS80, **bad})
    with pytest.raises(ValueError, match="rows80"):
        stage8.config(64, wgmma=1, rows80=1)


def test_kv_regs_products():
    """Offline (NVRTC, no GPU): with KV_REGS 1 the dK/dV kernel's Sᵀ and dPᵀ products read their A
    operand (K, V) from registers — 2·D/16 wgmmas with a register A and a K-major B, where the build
    without it has none (its register-A wgmmas are dV's and dK's, whose B is transposed); with
    KV_REGS 2, Sᵀ's alone (D/16)."""
    def register_a_kmajor(kv_regs):
        built = stage8.compile_for("sm_90a", torch.bfloat16, 64, kv_regs=kv_regs)
        text = sass.function_text(sass.sass_text(built["attention_backward"].cubin), "attention_backward")
        return len(re.findall(KMAJOR_REG_A, text))
    assert [register_a_kmajor(v) for v in (0, 1, 2)] == [0, 8, 4]


def _kmajor_a_written_in_loop(text: str) -> list[str]:
    """SASS lines inside the loop that issues the wgmmas with a register A operand and a K-major B
    (Sᵀ and dPᵀ under KV_REGS) which write one of those A registers: K and V must stay in them
    from one step to the next. The loop: the shortest backward branch around those wgmmas."""
    ins = [(int(m.group(1), 16), " ".join(m.group(2).split())) for m in
           re.finditer(r"/\*([0-9a-f]{4,5})\*/\s+([^;]*);", text)]
    kmajor = [(a, m) for a, t in ins if (m := re.match(KMAJOR_REG_A, t))]
    regs = {int(m.group(1)) + i for _, m in kmajor for i in range(4)}
    first, last = min(a for a, _ in kmajor), max(a for a, _ in kmajor)
    loops = [(int(m.group(1), 16), a) for a, t in ins if (m := re.search(r"\bBRA (?:\S+, )?0x([0-9a-f]+)", t))
             and int(m.group(1), 16) <= first and a >= last]
    head, tail = min(loops, key=lambda loop: loop[1] - loop[0])
    written = []
    for a, t in ins:
        m = re.match(r"(?:@!?U?P\w+ )?([A-Z][A-Z0-9_.]*) R(\d+)\b", t)
        if head <= a <= tail and m and not m.group(1).startswith(("HGMMA", "ST", "RED", "ATOM", "ISETP", "FSETP")):
            width = 4 if ".128" in m.group(1) else 2 if ".64" in m.group(1) else 1
            if {int(m.group(2)) + i for i in range(width)} & regs:
                written.append(f"{a:04x} {t}")
    return written


def test_kv_regs_registers_stay():
    """Offline (NVRTC, no GPU): in every KV_REGS build the config allows (the stage's D 64 build, with
    the variants, one warpgroup, the overlap, dQ by vector reductions, K alone), no instruction of the step
    loop writes the registers that hold K and V for Sᵀ and dPᵀ. In the dQ pass's build the compiled loop did
    (it gave them to Pᵀ and dSᵀ after the first step: wrong gradients), so config() leaves KV_REGS
    off there; the check finds that build's writes, so it can fail."""
    def written(**kw):
        built = stage8.compile_for("sm_90a", kw.pop("dtype", torch.bfloat16), 64, **kw)
        return _kmajor_a_written_in_loop(sass.function_text(sass.sass_text(built["attention_backward"].cubin),
                                                            "attention_backward"))
    for kw in ({}, {"dtype": torch.float16, "softcap": 2, "window": True}, {"warpgroups": 1, "dq_turns": 0},
               {"overlap": 1}, {"dq_bulk": 0, "producer": 0}, {"kv_regs": 2}):
        assert written(**kw) == [], kw
    from lib import nvrtc  # the dQ pass's build with KV_REGS forced on, past config()
    defines = {**dict(stage8.config(64, wgmma=1, dq_atomics=0)["defines"]), "KV_REGS": 1}
    forced = nvrtc.compile_stage(stage8.WGMMA_SOURCE, arch="sm_90a", dtype=torch.bfloat16, head_dim=64, defines=defines)
    assert _kmajor_a_written_in_loop(sass.function_text(sass.sass_text(forced.cubin), "attention_backward"))
    with pytest.raises(ValueError, match="kv_regs"):
        stage8.config(64, wgmma=1, dq_atomics=0, kv_regs=1)
    with pytest.raises(ValueError, match="kv_regs"):
        stage8.config(64, wgmma=1, tma_loads=0, producer=0, kv_regs=1)
    assert dict(stage8.config(64, wgmma=1, dq_atomics=0)["defines"])["KV_REGS"] == 0


def test_ds_stmatrix_stores():
    """Offline (NVRTC, no GPU): with DS_STMATRIX a warp of the dK/dV kernel stores its dSᵀ of a step by
    four stmatrix (STSM, one per 16 queries) and sixteen fewer 4-byte shared stores; without it, none."""
    for D in (64, 128):
        ops = {}
        for on in (0, 1):
            built = stage8.compile_for("sm_90a", torch.bfloat16, D, ds_stmatrix=on)
            text = sass.function_text(sass.sass_text(built["attention_backward"].cubin), "attention_backward")
            ops[on] = Counter(re.findall(r"\b(STSM\S*|STS)\b", text))
        assert ops[0]["STSM.16.M88.4"] == 0 and ops[1]["STSM.16.M88.4"] == 4, (D, ops)
        assert ops[0]["STS"] - ops[1]["STS"] == 16, (D, ops)


def _sass_parts(text):
    """The dK/dV kernel's SASS lines, and the consumers' part: from their setmaxnreg (TRY_ALLOC) to
    the producer's (DEALLOC). (ptxas lays the consumers' branch out first; the wait loops' retries
    sit after the last EXIT, in neither part's span.)"""
    body = next(part for part in text.split("Function : ")[1:] if part.split("\n", 1)[0].strip() == "attention_backward")
    lines = body.splitlines()
    claim = [i for i, line in enumerate(lines) if "USETMAXREG.TRY_ALLOC" in line]
    release = [i for i, line in enumerate(lines) if "USETMAXREG.DEALLOC" in line]
    assert len(claim) == 1 and len(release) == 1 and claim[0] < release[0], (claim, release)
    return lines, lines[claim[0]:release[0]], lines[claim[0]], lines[release[0]]


@compile_cases("D,dtype,w,variant,extra", BUILDS, ids=[_build_id(b) for b in BUILDS],
               keep=lambda b: not b[3] and not b[4] and b[1] == torch.bfloat16,
               build=lambda D, dtype, w, variant, extra: _build(D, dtype, w, variant, extra))
def test_producer_builds_compile_offline(D, dtype, w, variant, extra):
    """Every producer build: no spill or local memory, wgmma not serialized; setmaxnreg as SASS has
    it (the producer down to 24, the consumers up to theirs); the launch's registers fit the block
    (or two at D 64 with one warpgroup); the TMA loads and the bulk reductions only outside the
    consumers' part, one reduction per 64-column dQ tile of a warpgroup's turn."""
    from lib import sass
    compiled = _build(D, dtype, w, variant, extra)
    use = assert_no_local_memory(compiled, ("attention_backward",), (D, dtype, w, variant, extra))
    assert "serializ" not in compiled.log.lower(), compiled.log
    cfg = _config(D, w, variant, extra)
    if use:
        blocks = 2 if (w, D) == (1, 64) else 1
        assert use["attention_backward"]["registers"] * cfg["threads"] * blocks <= 65536, use
    lines, consumers, claim, release = _sass_parts(sass.sass_text(compiled.cubin))
    assert claim.split(";")[0].rstrip().endswith(hex(CONSUMER_REGS[w, D])), claim
    assert release.split(";")[0].rstrip().endswith(hex(PRODUCER_REGS)), release
    assert not [line for line in consumers if "UTMALDG" in line or "UBLKRED" in line or "LDL" in line]
    tiles = 1 if w == D // 64 else D // 64  # 64-column dQ tiles per warpgroup and turn
    assert sum("UBLKRED" in line for line in lines) == tiles
    assert sum("UTMALDG" in line for line in lines) == 2 * 2 * (D // 64)  # Q and dO: the first two steps, then the loop


# ---- GPU -------------------------------------------------------------------------------------

SHAPES = BACKWARD_SHAPES + [  # tests/test_backward.py's, and two of several query blocks per key block
    (2, 4, 1, 250, 520, 128, "bottom_right"),
    (1, 4, 2, 520, 250, 64, False),
]


def _inputs(shape, dtype, seed):
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dtype, seed=seed)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=dtype)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device="cuda")
    out = stage5.attention(q, k, v, causal=causal, lse=lse)
    return q, k, v, out, dout, lse


@gpu
@hopper
@pytest.mark.parametrize("w", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_producer_matches_reference(shape, dtype, w, seed):
    """producer=1 with one and two warpgroups that multiply (the stage's other switches): dq, dk, dv
    by the rule; dk and dv the same bits as producer=0's."""
    causal = shape[6]
    q, k, v, out, dout, lse = _inputs(shape, dtype, seed)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, wgmma=1, warpgroups=w, producer=1)
    _assert_passes(check_gradients(grads, q, k, v, dout, causal=causal), f"{shape} {dtype} wg{w} seed {seed}")
    _, dk, dv = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, wgmma=1, warpgroups=w, producer=0)
    assert torch.equal(grads[1], dk) and torch.equal(grads[2], dv), f"{shape} {dtype} wg{w} seed {seed}"


def _one_switch(q, k, v, out, dout, lse, causal, on: dict, off: dict, label: str, window=None, exact=True):
    """stage 8's gradients with the switches `on` by the rule against float64, and its dK and dV
    bit-equal to those with `off`: builds that add the same products in the same order (exact=False:
    dV only, for a build whose dK rounds differently)."""
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, window=window, wgmma=1, **on)
    _assert_passes(check_gradients(grads, q, k, v, dout, causal=causal, window=window), label)
    _, dk, dv = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, window=window, wgmma=1, **off)
    assert (torch.equal(grads[1], dk) or not exact) and torch.equal(grads[2], dv), label


@gpu
@hopper
@pytest.mark.parametrize("switches", [{"warpgroups": 2, "dq_turns": 1}, {"dq_early": 1}, {"overlap": 1},
                                      {"overlap": 0}], ids=str)
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[3] > 1], ids=str)
def test_producer_with_other_switches(shape, switches, seed):
    """The producer with dQ in turns (D 64), dQ issued early and the overlap either way; dk and dv
    bit-equal to the same switches without it."""
    if "dq_turns" in switches and shape[5] != 64:
        pytest.skip("dq_turns is a D 64 build")
    q, k, v, out, dout, lse = _inputs(shape, torch.bfloat16, seed)
    _one_switch(q, k, v, out, dout, lse, shape[6], {"producer": 1, **switches}, {"producer": 0, **switches},
                f"{shape} {switches} seed {seed}")


# DK_LAST (dK's product after dQ's; also with one warpgroup at D 64), MASK_SPLIT (no per-score compares
# where no mask edge cuts a step's tile), SCALE_AT_END (the
# softmax scale on dK and dQ once, not on dS), EPILOGUE_SMEM (dK and dV out through shared memory; also
# with one warpgroup), DS_STMATRIX (dSᵀ stored by stmatrix; also with one warpgroup and the overlap at
# D 64), PREP_EARLY (lse, and at D 64 with 2 δ too, read before the waits): each on ("name=value": at
# that value) and off
SWITCH_CASES = [("dk_last", {}), ("dk_last", {"warpgroups": 1, "dq_turns": 0}), ("mask_split", {}),
                ("scale_at_end", {}), ("epilogue_smem", {}), ("epilogue_smem", {"warpgroups": 1, "dq_turns": 0}),
                ("ds_stmatrix", {}), ("ds_stmatrix", {"overlap": 1, "warpgroups": 1, "dq_turns": 0}),
                ("prep_early", {}), ("prep_early=2", {}), ("prep_early=3", {}), ("kv_regs", {}), ("kv_regs=2", {}),
                ("kv_regs", {"warpgroups": 1, "dq_turns": 0})]


@gpu
@hopper
@pytest.mark.parametrize("case", SWITCH_CASES, ids=str)
@pytest.mark.parametrize("window", [None, (70, 0), (33, 9)], ids=str)
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[3] > 1] + [(1, 4, 2, 700, 900, 64, "bottom_right"),
                                                                    (2, 8, 2, 1100, 2100, 128, True)], ids=str)
def test_one_switch_matches_reference(shape, window, case, seed):
    """Each switch on: gradients by the rule against float64, dK and dV bit-equal to the build with it
    off, with the causal masks and with windows (stage 6's forward with the same window)."""
    switch, others = case
    switch, _, value = switch.partition("=")
    if (others or value == "2" or switch == "kv_regs") and shape[5] != 64:
        pytest.skip("one warpgroup with DK_LAST, prep_early=2 or kv_regs: D 64 (at D 128 DK_LAST makes two dQ "
                    "products a step with one warpgroup; prep_early=2 and kv_regs spill)")
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=torch.bfloat16, seed=seed)
    dout = torch.randn_like(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device="cuda")
    out = stage6.attention(q, k, v, causal=causal, lse=lse, window=window)
    # SCALE_AT_END: dK bit-equal where the scale is a power of two (D 64's 2⁻³), else rounded apart
    exact = switch != "scale_at_end" or math.log2(D ** -0.5).is_integer()
    _one_switch(q, k, v, out, dout, lse, causal, {switch: int(value or 1), **others}, {switch: 0, **others},
                f"{shape} {window} {case} seed {seed}", window=window, exact=exact)


@gpu
@hopper
@pytest.mark.parametrize("shape", [(2, 3, 1, 90, 130, 96, False), (1, 4, 2, 75, 200, 96, "bottom_right"),
                                   (2, 2, 2, 130, 70, 256, True), (1, 2, 1, 64, 193, 256, False)], ids=str)
def test_epilogue_smem_other_head_dims(shape, seed):
    """EPILOGUE_SMEM where the tile is wider than D (D 96: columns 96-127 not stored) and where two
    warpgroups split D (D 256), key counts that cut the last block: dK and dV bit-equal to the
    pairs' stores, gradients by the rule."""
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=torch.bfloat16, seed=seed)
    dout = torch.randn_like(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device="cuda")
    out = stage6.attention(q, k, v, causal=causal, lse=lse)
    _one_switch(q, k, v, out, dout, lse, causal, {"epilogue_smem": 1}, {"epilogue_smem": 0}, f"{shape} seed {seed}")


@gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[5] in (96, 128)]
                         + [(2, 4, 2, 333, 517, 128, False), (1, 6, 3, 1000, 777, 96, False),
                            (2, 8, 2, 2100, 1100, 128, "bottom_right"), (1, 2, 2, 80, 80, 128, True)], ids=str)
def test_rows80_matches_reference(shape, dtype, seed):
    """ROWS80 (80 queries a step, dQᵀ = Kᵀ·dSᵀ, its own postprocess): gradients by the rule against
    float64 at row counts that are and are not multiples of 80, with grouped heads and both causal
    alignments (its sums run in another order than 64 rows', so nothing is compared bit for bit)."""
    B, H, Hk, Sq, Sk, D, causal = shape
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dtype, seed=seed)
    dout = torch.randn_like(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device="cuda")
    out = stage6.attention(q, k, v, causal=causal, lse=lse)  # (stage 5's forward has no D 96)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, wgmma=1, **ROWS80)
    _assert_passes(check_gradients(grads, q, k, v, dout, causal=causal), f"{shape} {dtype} seed {seed}")


@gpu
@hopper
def test_producer_many_steps_and_blocks(seed):
    """A long row (many query blocks per key block: both rings wrap many times, the mbarriers'
    phases flip) and more key blocks than SMs, at both head dims and warpgroup counts."""
    for D in (64, 128):
        for w in (1, 2):
            shape = (2, 8, 2, 2100, 1100, D, "bottom_right")
            q, k, v, out, dout, lse = _inputs(shape, torch.bfloat16, seed)
            grads = stage8.attention_backward(q, k, v, out, dout, lse, causal="bottom_right", wgmma=1,
                                              warpgroups=w, producer=1)
            _assert_passes(check_gradients(grads, q, k, v, dout, causal="bottom_right"), f"{shape} wg{w} seed {seed}")


# the models' variants (stage 6's forward wrote out and lse with them)
VARIANTS = [{"window": (5, 3)}, {"window": (63, 0)}, {"softcap": 30.0}, {"softcap": 5.0, "window": (20, 0)},
            {"window": (7, 7), "softcap": 5.0, "sinks": True}]


@gpu
@hopper
@pytest.mark.parametrize("w", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("shape", [(2, 4, 2, 150, 97, 64, "bottom_right"), (1, 8, 2, 200, 330, 128, True)], ids=str)
def test_producer_with_variants(shape, variant, dtype, w, seed):
    """The variant builds with the producer (the softcap's tanh as the dtype's forward has it; at
    D 128 fp16's ex2 tanh with a window keeps its bulk reductions, unlike the build without the
    producer, stage8_variants.variant_switches): gradients by the rule, dk and dv bit-equal to the
    same build without the producer."""
    q, k, v, dout, causal, kw = variant_inputs(shape, dtype, seed, variant)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = stage6.attention(q, k, v, causal=causal, lse=lse, **kw)
    grads = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, warpgroups=w, producer=1, **kw)
    _assert_passes(_check(grads, q, k, v, dout, causal, kw), f"{shape} {variant} {dtype} wg{w}")
    plain = stage8.attention_backward(q, k, v, out, dout, lse, causal=causal, warpgroups=w, producer=0,
                                      dq_atomics=1, dq_bulk=1, **kw)
    assert torch.equal(grads[1], plain[1]) and torch.equal(grads[2], plain[2]), f"{shape} {variant} {dtype} wg{w}"
