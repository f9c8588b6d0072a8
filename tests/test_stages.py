"""One suite for every registered stage: random shapes (odd lengths, Sq != Sk, causal), every
supported dtype and head dim, strided views, grouped-query inputs, empty inputs and many heads,
poisoned outputs, CUDA-graph capture, and the whole bad-input list."""
import dataclasses
import math

import pytest
import torch

import stages
from conftest import assert_graph_replays, compile_cases, cpu_only, gpu, prebuild, runs_here
from lib.inputs import (FLOAT_DTYPES, GPUTooOldError, NoBackwardError, make_qkv,
                        poisoned_outputs, validate)
from lib.reference import check_output
from lib.simulator import HAS_GPU, SIMULATOR, GPURequiredError

MODULES = {n: stages.get(n) for n in stages.NUMBERS}


def head_dims_to_test(info):
    want = (64, 128, 256, 40, 8) if HAS_GPU else (16, 64, 8)
    dims = [d for d in want if d in info.head_dims]
    if isinstance(info.head_dims, range):  # its edges too
        dims += [info.head_dims.start, info.head_dims.stop - 1]
    return sorted(set(dims))


# (B, H, Sq, Sk): odd lengths, a single token, Sq != Sk both ways
SHAPES_GPU = [(1, 1, 1, 1), (2, 3, 17, 17), (1, 2, 127, 127), (1, 2, 1000, 1000),
              (2, 1, 127, 1000), (1, 2, 1000, 127), (1, 1, 65, 1)]
SHAPES_SIM = [(1, 1, 1, 1), (1, 2, 17, 17), (2, 1, 5, 9), (1, 1, 9, 5), (1, 1, 33, 3)]


def cases():
    for n, mod in MODULES.items():
        shapes = SHAPES_GPU if HAS_GPU else SHAPES_SIM
        for D in head_dims_to_test(mod.INFO):
            for dtype in mod.INFO.dtypes:
                for i, shape in enumerate(shapes):
                    # every shape with the main head dims; the rest on two shapes
                    if D not in (64, 16) and i not in (1, len(shapes) - 2):
                        continue
                    for causal in (False, True):
                        yield pytest.param(n, shape, D, dtype, causal,
                                           id=f"stage{n}-{'x'.join(map(str, shape))}-D{D}-"
                                              f"{str(dtype)[6:]}-{'causal' if causal else 'full'}")


@pytest.mark.parametrize("n,shape,D,dtype,causal", list(cases()))
def test_matches_reference(n, shape, D, dtype, causal, seed):
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("CUDA C++ stages need a GPU of their compute capability here")
    B, H, Sq, Sk = shape
    if SIMULATOR and D > 64:
        Sq, Sk = min(Sq, 3), min(Sk, 3)  # the simulator is one Python thread per CUDA thread
    assert_matches_reference(mod, *make_qkv(B, H, Sq, D, Sk=Sk, dtype=dtype, seed=seed),
                             causal=causal, seed=seed)


def assert_matches_reference(mod, q, k, v, *, causal, seed):
    """Run the stage on (q, k, v) with a NaN-poisoned output and judge it against the reference."""
    with poisoned_outputs():  # unwritten elements stay NaN and fail
        out = mod.attention(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    c = check_output(out, q, k, v, causal=causal)
    assert c.passed, f"seed {seed}: {c.summary()}"


@pytest.mark.parametrize("n", MODULES)
def test_custom_scale(n, seed):
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("needs a GPU")
    q, k, v = make_qkv(1, 2, 17, 16 if 16 in mod.INFO.head_dims else 64, Sk=20, seed=seed)
    for scale in (0.5, -0.3, 0.0):
        out = mod.attention(q, k, v, scale=scale)
        c = check_output(out, q, k, v, scale=scale)
        assert c.passed, f"scale {scale}, seed {seed}: {c.summary()}"


# (B, H, H_kv, Sq, Sk): grouped-query attention, k and v with fewer heads than q
GQA_SHAPES = ([(2, 8, 2, 129, 77), (1, 6, 3, 1000, 1000), (1, 4, 1, 33, 200)] if HAS_GPU else
              [(2, 4, 2, 5, 7), (1, 3, 1, 9, 4)])
GQA_STAGES = [n for n, m in MODULES.items() if m.INFO.gqa]


def gqa_cases():
    for n in GQA_STAGES:
        info = MODULES[n].INFO
        for D in [d for d in head_dims_to_test(info) if d in (16, 64, 128)]:
            for dtype in info.dtypes:
                for shape in GQA_SHAPES:
                    for causal in (False, True):
                        yield pytest.param(n, shape, D, dtype, causal,
                                           id=f"stage{n}-{'x'.join(map(str, shape))}-D{D}-"
                                              f"{str(dtype)[6:]}-{'causal' if causal else 'full'}")


@pytest.mark.parametrize("n,shape,D,dtype,causal", list(gqa_cases()))
def test_gqa_matches_reference(n, shape, D, dtype, causal, seed):
    """Query head h must read K/V head h // (H // H_kv), as SDPA with enable_gqa=True."""
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("CUDA C++ stages need a GPU of their compute capability here")
    B, H, Hkv, Sq, Sk = shape
    assert_matches_reference(mod, *make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hkv, dtype=dtype, seed=seed),
                             causal=causal, seed=seed)


# Layouts models hand attention: views, read in place by the CUDA C++ stages (stage 0 copies).
def _bshd(B, H, S, D, dtype, device):
    """A [B, H, S, D] view of a [B, S, H, D] tensor, as a model's .transpose(1, 2) gives."""
    return torch.randn(B, S, H, D, dtype=torch.float32).to(device=device, dtype=dtype).transpose(1, 2)


LAYOUTS = {  # name: (B, H, H_kv, Sq, Sk, D) -> q, k, v of those sizes in some strided layout
    "transposed [B, S, H, D]": lambda B, H, Hk, Sq, Sk, D, dt, dev: (
        _bshd(B, H, Sq, D, dt, dev), _bshd(B, Hk, Sk, D, dt, dev), _bshd(B, Hk, Sk, D, dt, dev)),
    "sliced heads": lambda B, H, Hk, Sq, Sk, D, dt, dev: tuple(
        t[:, 1:1 + t.shape[1] - 3] for t in make_qkv(B, H + 3, Sq, D, Sk=Sk, Hkv=Hk + 3, dtype=dt, device=dev)),
    "batch slice": lambda B, H, Hk, Sq, Sk, D, dt, dev: tuple(
        t[1:] for t in make_qkv(B + 1, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=dt, device=dev)),
    "sliced seq": lambda B, H, Hk, Sq, Sk, D, dt, dev: tuple(
        t[:, :, 3:] for t in make_qkv(B, H, Sq + 3, D, Sk=Sk + 3, Hkv=Hk, dtype=dt, device=dev)),
    "mixed (q transposed, k sliced, v a view of kv)": lambda B, H, Hk, Sq, Sk, D, dt, dev: (
        _bshd(B, H, Sq, D, dt, dev), make_qkv(B, Hk + 1, Sk, D, dtype=dt, device=dev)[1][:, 1:],
        torch.randn(B, Sk, 2, Hk, D).to(device=dev, dtype=dt)[:, :, 1].transpose(1, 2)),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", MODULES)
def test_strided_layouts(n, layout, causal, seed):
    """Strided views (last dimension unit-stride) give the same answer as contiguous inputs."""
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("CUDA C++ stages need a GPU of their compute capability here")
    torch.manual_seed(seed)
    D = 64 if 64 in mod.INFO.head_dims and HAS_GPU else 16
    B, H, Hk, Sq, Sk = (2, 4, 2 if mod.INFO.gqa else 4, 77, 130) if HAS_GPU else (2, 2, 1, 5, 7)
    for dtype in mod.INFO.dtypes[:2]:
        q, k, v = LAYOUTS[layout](B, H, Hk, Sq, Sk, D, dtype, device_for(mod.INFO))
        assert any(not t.is_contiguous() or t.storage_offset() for t in (q, k, v))  # a view
        assert_matches_reference(mod, q, k, v, causal=causal, seed=seed)


EMPTY = {"Sq = 0": (1, 2, 2, 0, 5), "Sk = 0": (1, 2, 2, 5, 0), "B = 0": (0, 2, 2, 5, 5),
         "H = 0": (1, 0, 0, 5, 5)}


@pytest.mark.parametrize("case", EMPTY)
@pytest.mark.parametrize("n", MODULES)
def test_empty_inputs(n, case):
    """Nothing to compute gives SDPA's answer: an empty output, or zeros when there are no keys
    (what SDPA returns for Sk = 0)."""
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("CUDA C++ stages need a GPU of their compute capability here")
    B, H, Hk, Sq, Sk = EMPTY[case]
    D = 64 if 64 in mod.INFO.head_dims else 16
    q, k, v = make_qkv(B, H, Sq, D, Sk=Sk, Hkv=Hk, dtype=mod.INFO.dtypes[0], device=device_for(mod.INFO))
    for causal in (False, True):
        out = mod.attention(q, k, v, causal=causal)
        assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
        if q.numel() == 0:  # nothing to compare (and torch 2.11's CPU SDPA dies on H = 0: SIGFPE)
            continue
        want = torch.nn.functional.scaled_dot_product_attention(q.cpu().float(), k.cpu().float(),
                                                                v.cpu().float(), is_causal=causal)
        torch.testing.assert_close(out.cpu().float(), want, rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("n", MODULES)
def test_many_heads(n, seed):
    """B·H = 70,000 is more than a grid's y or z dimension holds (65,535)."""
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("needs a GPU of the stage's compute capability")
    D = 64 if 64 in mod.INFO.head_dims else 16
    B, H, Hk, S = 2, 35_000, 35_000 // 7 if mod.INFO.gqa else 35_000, 3
    if mod.INFO.backend == "numba":
        B, H, Hk = 1, 70_000, 70_000 // 7 if mod.INFO.gqa else 70_000
    assert_matches_reference(mod, *make_qkv(B, H, S, D, Sk=S + 2, Hkv=Hk, dtype=mod.INFO.dtypes[0],
                                            seed=seed), causal=True, seed=seed)


@gpu
@pytest.mark.parametrize("n", [n for n, m in MODULES.items() if m.INFO.backend == "nvrtc"])
def test_cuda_graph_capture(n, seed):
    """Captured into a CUDA graph, a stage launches on the capturing stream (torch's current
    stream at call time) and replays on whatever the static inputs hold then."""
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("needs a GPU of the stage's compute capability")
    D = 64 if 64 in mod.INFO.head_dims else mod.INFO.head_dims[0]
    Hk = 2 if mod.INFO.gqa else 4
    q, k, v = make_qkv(2, 4, 100, D, Sk=90, Hkv=Hk, dtype=mod.INFO.dtypes[0], seed=seed)
    q = q.transpose(1, 2).contiguous().transpose(1, 2)  # a strided view, as models capture
    assert_graph_replays(lambda q, k, v: mod.attention(q, k, v, causal=True), (q, k, v),
                         (make_qkv(2, 4, 100, D, Sk=90, Hkv=Hk, dtype=mod.INFO.dtypes[0]) for _ in range(2)),
                         causal=True, label=f"seed {seed}")


@pytest.mark.parametrize("n", MODULES)
def test_gqa_declared(n):
    """A stage without grouped-query support says so and names those with it; one with it
    rejects a head count that is not a multiple of K/V's."""
    info = MODULES[n].INFO
    D = 64 if 64 in info.head_dims else info.head_dims[0]
    if info.gqa:
        with pytest.raises(ValueError, match="multiple"):
            call_or_validate(MODULES[n], *make_qkv(1, 4, 8, D, Hkv=3, dtype=info.dtypes[0],
                                                   device=device_for(info)))
    without = dataclasses.replace(info, gqa=False)
    with pytest.raises(ValueError, match=r"same number of heads .*stages [0-9, ]+\)"):
        validate(*make_qkv(1, 4, 8, D, Hkv=2, dtype=info.dtypes[0], device="cpu"),
                 causal=False, scale=None, info=without, check_device=False)


@pytest.mark.parametrize("n", MODULES)
def test_metadata(n):
    info = MODULES[n].INFO
    assert info.number == n and info.title and info.adds and info.backend in ("numba", "nvrtc")
    assert all(p.exists() for p in info.source_paths())
    assert info.dtypes and len(info.head_dims) > 0 and len(info.min_cc) == 2
    assert (MODULES[n].__file__.endswith(f"stage{n}.py"))


# ---------------------------------------------------------------------------------------------
# bad input: a clear error naming the argument, never a crash, never garbage

def _good(info, device):
    D = 64 if 64 in info.head_dims else info.head_dims[0]
    return make_qkv(1, 2, 8, D, dtype=info.dtypes[0], device=device)


def _unsupported_dim(info):
    return next(d for d in (96, 80, 257, 512, 3) if d not in info.head_dims)


def _unsupported_dtype(info):
    return next(d for d in (torch.float64, torch.float32, torch.bfloat16) if d not in info.dtypes)


ALL_FLOAT_NAMES = ", ".join(str(d)[6:] for d in FLOAT_DTYPES)

BAD = {  # name: (make (q, k, v, kwargs) from good inputs, exception, message fragment)
    "q not a tensor": (lambda q, k, v, i: (q.tolist(), k, v, {}), TypeError, "q must be a torch.Tensor"),
    "rank 3": (lambda q, k, v, i: (q[0], k, v, {}), ValueError, "rank 4"),
    "integer dtype": (lambda q, k, v, i: (q.to(torch.int32), k, v, {}), TypeError,
                      f"floating-point tensor \\({ALL_FLOAT_NAMES}\\)"),
    "mixed dtypes": (lambda q, k, v, i: (q, k.to(_unsupported_dtype(i)), v, {}), TypeError, "one dtype"),
    "batch mismatch": (lambda q, k, v, i: (q, k.repeat(2, 1, 1, 1), v.repeat(2, 1, 1, 1), {}), ValueError, "batch"),
    "heads mismatch": (lambda q, k, v, i: (q, k[:, :1].repeat(1, 3, 1, 1).contiguous(),
                                           v[:, :1].repeat(1, 3, 1, 1).contiguous(), {}), ValueError, "heads"),
    "k/v length mismatch": (lambda q, k, v, i: (q, k, v[:, :, :5].contiguous(), {}), ValueError, "same sequence length"),
    "head dim mismatch": (lambda q, k, v, i: (q, k, v[..., :-1].contiguous(), {}), ValueError, "head dims differ"),
    "kv heads not dividing": (lambda q, k, v, i: (q.repeat(1, 2, 1, 1), k[:, :1].repeat(1, 3, 1, 1),
                                                  v[:, :1].repeat(1, 3, 1, 1), {}), ValueError, "multiple"),
    "nan scale": (lambda q, k, v, i: (q, k, v, {"scale": math.nan}), ValueError, "finite"),
    "inf scale": (lambda q, k, v, i: (q, k, v, {"scale": math.inf}), ValueError, "finite"),
    "string scale": (lambda q, k, v, i: (q, k, v, {"scale": "0.1"}), TypeError, "scale"),
    "non-bool causal": (lambda q, k, v, i: (q, k, v, {"causal": "yes"}), TypeError, "causal"),
    "last dim strided": (lambda q, k, v, i: (q.transpose(2, 3).contiguous().transpose(2, 3), k, v, {}),
                         ValueError, "q must have a unit-stride last dimension"),
    "v's last dim strided": (lambda q, k, v, i: (q, k, torch.cat([v, v], -1)[..., ::2], {}),
                             ValueError, "v must have a unit-stride last dimension"),
    "unsupported head dim": (lambda q, k, v, i: (*(t.new_ones(1, 2, 8, _unsupported_dim(i)).normal_()
                                                   for t in (q, k, v)), {}), NotImplementedError, "head dims"),
    "unsupported dtype": (lambda q, k, v, i: (*(t.to(_unsupported_dtype(i)) for t in (q, k, v)), {}),
                          NotImplementedError, "dtypes"),
}


def device_for(info):
    return "cpu" if (SIMULATOR and info.backend == "numba") or not HAS_GPU else "cuda"


def call_or_validate(mod, q, k, v, **kw):
    """The stage itself where it runs; elsewhere (a CUDA C++ stage without a GPU, which would
    say "needs a GPU" first) its validation with the machine and device checks left out."""
    if runs_here(mod):
        return mod.attention(q, k, v, **kw)
    return validate(q, k, v, causal=kw.get("causal", False), scale=kw.get("scale"),
                    info=mod.INFO, check_device=False)


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("n", MODULES)
def test_bad_input(n, case):
    mod = MODULES[n]
    make, exc, fragment = BAD[case]
    q, k, v, kw = make(*_good(mod.INFO, device_for(mod.INFO)), mod.INFO)
    with pytest.raises(exc, match=fragment):
        call_or_validate(mod, q, k, v, **kw)


ALIGNED_STAGES = [n for n, m in MODULES.items() if m.INFO.align_bytes > 2]


def _misaligned(info, device, what):
    """Good values in a layout that breaks the stage's alignment: the data pointer 2 bytes off,
    or rows D + 1 elements apart."""
    B, H, S, D = 1, 2, 8, 64 if 64 in info.head_dims else info.head_dims[0]
    if what == "pointer":
        buf = torch.randn(B * H * S * D + 1, device=device).to(info.dtypes[0])
        return buf[1:].view(B, H, S, D)
    return torch.randn(B, H, S, D + 1, device=device).to(info.dtypes[0])[..., :D]


@pytest.mark.parametrize("what", ["pointer", "seq stride"])
@pytest.mark.parametrize("n", ALIGNED_STAGES)
def test_misaligned_input(n, what):
    mod = MODULES[n]
    q, k, v = _good(mod.INFO, device_for(mod.INFO))
    bad = _misaligned(mod.INFO, device_for(mod.INFO), what)
    with pytest.raises(ValueError, match=f"stage {n} copies {mod.INFO.align_bytes} bytes at a "
                                         f"time: k's data pointer.*{what}"):
        call_or_validate(mod, q, bad, v)


@cpu_only
@pytest.mark.parametrize("n", [n for n, m in MODULES.items() if m.INFO.backend == "nvrtc"])
def test_no_gpu_is_said_first(n):
    """Without a GPU a CUDA C++ stage says so before anything else (not after the learner has
    fixed the dtype, then the layout), and points at the offline inspection of that stage."""
    q, k, v = _good(MODULES[n].INFO, "cpu")
    with pytest.raises(GPURequiredError, match=rf"stage {n} .*lib\.sass\.inspect_stage\({n}\)"):
        MODULES[n].attention(q.to(torch.int32).transpose(2, 3), k[:, :1], v, scale=math.nan)


@pytest.mark.parametrize("n", MODULES)
def test_wrong_device(n):
    mod = MODULES[n]
    if SIMULATOR and mod.INFO.backend == "numba":
        q, k, v = _good(mod.INFO, "meta")
        with pytest.raises(ValueError, match="CPU tensor"):
            mod.attention(q, k, v)
    elif not HAS_GPU:
        with pytest.raises(GPURequiredError, match="needs a CUDA GPU"):
            mod.attention(*_good(mod.INFO, "cpu"))
    else:
        with pytest.raises(ValueError, match="CUDA tensor"):
            mod.attention(*_good(mod.INFO, "cpu"))
        q, k, v = _good(mod.INFO, "cuda")
        with pytest.raises(ValueError, match="device"):
            mod.attention(q, k.cpu(), v)


@gpu
@pytest.mark.parametrize("n", MODULES)
def test_gpu_too_old(n):
    info = dataclasses.replace(MODULES[n].INFO, min_cc=(99, 0))
    q, k, v = _good(info, "cuda")
    with pytest.raises(GPUTooOldError, match="compute capability 99.0"):
        validate(q, k, v, causal=False, scale=None, info=info)


# ---------------------------------------------------------------------------------------------
# CUDA C++ stages without a GPU: every variant compiles for its oldest and newest target, the
# matrix products run on tensor cores, nothing spills, and the kernels follow the naming rule
# the sanitizer filter relies on.

NVRTC_STAGES = [n for n, m in MODULES.items() if m.INFO.backend == "nvrtc"]


def offline_cases():
    for n in NVRTC_STAGES:
        info = MODULES[n].INFO
        for dtype in info.dtypes:
            for D in info.head_dims:
                arches = ([info.extra["arch"]] if "arch" in info.extra
                          else [f"sm_{info.min_cc[0]}{info.min_cc[1]}", "sm_90a"])
                for arch in arches:
                    yield n, dtype, D, arch


# Without a GPU, each of a stage's dtypes, head dims and arches in one build at least
# (conftest.compile_cases), not every combination of them.
@compile_cases("n,dtype,D,arch", offline_cases(),
               ids=[f"stage{n}-{str(dtype)[6:]}-D{D}-{arch}" for n, dtype, D, arch in offline_cases()],
               switches=lambda case: {(case[0], i, v) for i, v in enumerate(case[1:])},
               build=lambda n, dtype, D, arch: MODULES[n].compile_for(arch, dtype, D))
def test_offline_compile(n, dtype, D, arch):
    from lib.sass import inspect_cubin
    for name, compiled in MODULES[n].compile_for(arch, dtype, D).items():
        ins = inspect_cubin(compiled.cubin, arch, compiled.resource_usage())
        op = MODULES[n].INFO.extra.get("tensor_core_op", "HMMA")  # HGMMA for wgmma
        assert ins.mix[op] > 0, f"{name}: no {op} (tensor-core instruction) in the SASS"
        assert ins.ptxas, f"{name}: no ptxas report"
        for kernel, r in ins.ptxas.items():
            assert "attention" in kernel, f"{kernel}: kernel names must contain 'attention'"
            allowed = MODULES[n].INFO.extra.get("spill_bytes_allowed", {}).get(D, 0)
            assert r["spill_stores"] <= allowed and r["spill_loads"] <= 2 * allowed, \
                f"{kernel} spills: {r} (the stage allows {allowed} bytes at D{D})"
            assert r["static_smem_bytes"] <= 48 * 1024, f"{kernel}: static shared memory > 48 KB"


# ---------------------------------------------------------------------------------------------
# the launch path of the fused stages, on the CPU: the kernel launch itself replaced by a record

@pytest.fixture
def recorded_launches(monkeypatch):
    """lib.nvrtc.launch_fused with no GPU: validation without the machine checks, a stand-in
    kernel, and launches recorded instead of made."""
    from lib import nvrtc
    calls = {"validate": 0, "launches": []}

    def validate_here(*a, **kw):
        calls["validate"] += 1
        return validate(*a, **kw, check_device=False)

    monkeypatch.setattr(nvrtc, "validate", validate_here)
    monkeypatch.setattr(nvrtc, "stage_kernels", lambda *a, **kw: {"attention_fused": "kernel"})
    monkeypatch.setattr(nvrtc, "launch_prepared",
                        lambda kernel, config, params: calls["launches"].append((config, params)))
    monkeypatch.setattr(nvrtc, "_plans", {})
    return calls


@pytest.mark.parametrize("n", [n for n in (2, 3, 4, 5) if n in MODULES])
def test_launch_arguments(n, recorded_launches):
    """The kernel gets the pointers, sizes, heads, group and each tensor's own strides, on a
    1-D grid of query tiles × batch·heads; a second call with the same layout reuses the plan
    (no second validation); another layout makes its own."""
    mod = MODULES[n]
    B, H, Hk, Sq, Sk, D = 3, 4, 2, 70, 50, 64
    q = _bshd(B, H, Sq, D, torch.float16, "cpu")
    k, v = (torch.randn(B, Hk + 1, Sk, D, dtype=torch.float16)[:, 1:] for _ in range(2))
    out = mod.attention(q, k, v, causal=True, scale=0.5)
    assert out.shape == q.shape and out.is_contiguous()
    (config, params), = recorded_launches["launches"]
    assert params[:4] == (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    Sq_, Sk_, scale_log2, causal, H_, group, *strides = params[4:19]
    assert (Sq_, Sk_, causal, H_, group) == (Sq, Sk, 1, H, H // Hk)
    assert scale_log2 == pytest.approx(0.5 * math.log2(math.e))
    assert [int(s) for s in strides] == [*q.stride()[:3], *k.stride()[:3], *v.stride()[:3]]
    # a stage with packed sequences takes their offsets last: none for a [B, H, S, D] call
    # ... and a stage whose forward can save the log-sum-exp its pointer after them (null here)
    assert params[19:] == ((0, 0) if mod.INFO.varlen else ()) + ((0,) if mod.INFO.saves_lse else ())
    block_q = mod.config(D)["block_q"] if hasattr(mod, "config") else mod.BLOCK_Q
    assert config.grid == (-(-Sq // block_q) * B * H, 1, 1)
    mod.attention(q, k, v, causal=True, scale=0.5)
    assert recorded_launches["validate"] == 1 and len(recorded_launches["launches"]) == 2
    mod.attention(q.contiguous(), k, v, causal=True, scale=0.5)
    assert recorded_launches["validate"] == 2
    with pytest.raises(ValueError, match="finite"):  # never a plan for bad input
        mod.attention(q, k, v, causal=True, scale=math.nan)
    if mod.INFO.align_bytes > 2:  # same layout, pointer off by one element: checked every call
        buf = torch.randn(q.numel() + 1, dtype=torch.float16)
        mod.attention(buf[:-1].view(q.shape), k, v, causal=True)
        with pytest.raises(ValueError, match="data pointer"):
            mod.attention(buf[1:].view(q.shape), k, v, causal=True)


@gpu
@pytest.mark.parametrize("n", [n for n in (5, 6) if n in MODULES])
def test_host_time_per_call(n):
    """What a model making many small attention calls waits on: the wall time per call of
    back-to-back calls at the latency shape (B1 H8 S512 D64), against SDPA's measured the same
    way. The target is 1.2× SDPA's; this fails only past 1.5×, as host timings are noisy."""
    import time
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("needs a GPU of the stage's compute capability")
    q, k, v = make_qkv(1, 8, 512, 64, dtype=torch.float16)

    def per_call_us(f, calls=2000):
        for _ in range(50):
            f()
        torch.cuda.synchronize()
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        return best

    ours = per_call_us(lambda: mod.attention(q, k, v))
    sdpa = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    print(f"\nstage {n}: {ours:.1f} µs per call, SDPA {sdpa:.1f} µs ({ours / sdpa:.2f}×)")
    assert ours <= 1.5 * sdpa, f"stage {n}: {ours:.1f} µs per call vs SDPA's {sdpa:.1f} µs"


@pytest.mark.parametrize("n", [n for n in (2, 3, 4, 5) if n in MODULES])
def test_packed_rows_build(n, monkeypatch):
    """Inputs whose rows are packed (row stride D, as any contiguous tensor) run the build with
    constant row strides (ROWS_PACKED); a transposed [B, S, H, D] view runs the general one."""
    from lib import nvrtc
    builds = []
    monkeypatch.setattr(nvrtc, "validate", lambda *a, **kw: validate(*a, **kw, check_device=False))
    monkeypatch.setattr(nvrtc, "_plans", {})
    monkeypatch.setattr(nvrtc, "stage_kernels",
                        lambda *a, defines=(), **kw: builds.append(dict(defines)) or
                        {"attention_fused": "kernel"})
    monkeypatch.setattr(nvrtc, "launch_prepared", lambda *a: None)
    q, k, v = make_qkv(2, 4, 40, 64, Sk=33, dtype=torch.float16, device="cpu")
    MODULES[n].attention(q, k, v)
    MODULES[n].attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v)
    assert [b.get("ROWS_PACKED") for b in builds] == [1, None]


@pytest.mark.parametrize("n", [n for n in (2, 3) if n in MODULES])
@pytest.mark.parametrize("D", [64, 128])
@prebuild(lambda n, D: [MODULES[n].compile_for("sm_80", torch.float16, D, packed=p) for p in (True, False)])
def test_packed_copies_unrolled(n, D):
    """Stages 2 and 3 copy K and V with one load per element and thread. With constant row
    strides every one of them sits in the K/V loop, unrolled (all in flight together); the
    general build loops over batches of 4 loads. (The record before row strides were
    arguments had the unrolled form; losing it made these stages 2-3× slower.)"""
    from lib import sass
    mod = MODULES[n]
    want = 2 * 32 * D // mod.THREADS  # K and V tiles of BLOCK_K = 32 rows, per thread
    counts = {}
    for packed in (True, False):
        (compiled,) = mod.compile_for("sm_80", torch.float16, D, packed=packed).values()
        counts[packed] = sass.kv_loop(sass.sass_text(compiled.cubin))["mix"]["LDG"]
    assert counts[True] == want, f"packed build: {counts[True]} loads in the K/V loop, want {want}"
    assert counts[False] < want, counts


def _param_sizes(mod, dtype, D) -> dict:
    """{kernel: [byte size of each parameter]}, read from the stage's cubin (EIATTR_KPARAM_INFO
    in cuobjdump -elf; no GPU needed)."""
    import re
    from lib import sass
    out = {}
    for compiled in mod.compile_for("sm_80", dtype, D).values():
        kernel = None
        for line in sass._cuobjdump(compiled.cubin, "-elf").splitlines():
            if m := re.search(r"\.nv\.info\.(\w+)", line):
                kernel = m.group(1)
            elif kernel and (m := re.search(r"Ordinal\s*:\s*(0x[0-9a-f]+).*Size\s*:\s*(0x[0-9a-f]+)", line)):
                out.setdefault(kernel, {})[int(m.group(1), 16)] = int(m.group(2), 16)
    return {k: [v[i] for i in sorted(v)] for k, v in out.items()}


def _arg_size(a) -> int:
    import numpy as np
    return 8 if isinstance(a, int) else np.asarray(a).itemsize


@pytest.mark.parametrize("n", [n for n in (1, 2, 3, 4, 5) if n in MODULES])
def test_launch_arguments_match_kernel_signature(n, monkeypatch):
    """What the launcher passes has the count and sizes of the kernel's parameters (read from
    its PTX): a mismatch would read garbage on the GPU, not fail."""
    from lib import nvrtc
    mod = MODULES[n]
    launches = []
    monkeypatch.setattr(nvrtc, "validate",
                        lambda *a, **kw: validate(*a, **kw, check_device=False))
    monkeypatch.setattr(nvrtc, "_plans", {})
    monkeypatch.setattr(nvrtc, "stage_kernels",
                        lambda source, names, *a, **kw: {k: k for k in names})
    monkeypatch.setattr(nvrtc, "launch_prepared",
                        lambda kernel, config, params: launches.append((kernel, params)))
    if n == 1:  # stage 1 allocates its workspace and checks its inputs itself
        monkeypatch.setattr(mod, "validate", lambda *a, **kw: validate(*a, **kw, check_device=False))
    q, k, v = make_qkv(2, 4, 40, 64, Sk=33, Hkv=2, dtype=torch.float16, device="cpu")
    mod.attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, causal=True)
    want = _param_sizes(mod, torch.float16, 64)
    assert {kernel for kernel, _ in launches} == set(want)
    for kernel, params in launches:
        assert [_arg_size(a) for a in params] == want[kernel], kernel


def test_validate_cached(monkeypatch):
    """validate_cached gives validate()'s answer, validates a layout once, and still checks
    every call's pointers and every new layout or scale."""
    from lib import inputs
    info = dataclasses.replace(MODULES[0].INFO, align_bytes=16)
    calls = []
    monkeypatch.setattr(inputs, "validate",
                        lambda *a, **kw: calls.append(1) or validate(*a, **kw, check_device=False))
    monkeypatch.setattr(inputs, "_validated", {})
    buf = torch.randn(3 * 2 * 8 * 16 + 1)
    q, k, v = (buf[:-1].view(3, 2, 8, 16) for _ in range(3))
    assert inputs.validate_cached(q, k, v, causal=True, scale=None, info=info) == 0.25
    assert inputs.validate_cached(q, k, v, causal=True, scale=None, info=info) == 0.25
    assert len(calls) == 1
    with pytest.raises(ValueError, match="data pointer"):  # same layout, misaligned pointer
        inputs.validate_cached(buf[1:].view(3, 2, 8, 16), k, v, causal=True, scale=None, info=info)
    with pytest.raises(ValueError, match="finite"):
        inputs.validate_cached(q, k, v, causal=True, scale=math.inf, info=info)
    with pytest.raises(TypeError, match="causal"):  # 1 == True, but it is not a bool
        inputs.validate_cached(q, k, v, causal=1, scale=None, info=info)
    assert inputs.validate_cached(q, k, v, causal=True, scale=0.5, info=info) == 0.5


# --------------------------------------------------------------------------------------------
# autograd: a stage's attention() is its forward alone, so an input that requires grad (grad
# mode on) is refused, never answered with an output that has no grad_fn (a gradient that
# silently leaves attention out); stages 5 and 6 say where the backward is (stages.autograd);
# under no_grad / inference_mode, or with detached inputs, the call runs.

GRAD_INPUTS = ["q", "k", "v", "qkv"]


def _grad_inputs(mod, which, device=None):
    D = head_dims_to_test(mod.INFO)[0]
    q, k, v = make_qkv(1, 2, 9, D, Sk=13, dtype=mod.INFO.dtypes[0], device=device)
    for name, t in zip("qkv", (q, k, v)):
        t.requires_grad_(name in which)
    return q, k, v


@pytest.mark.parametrize("which", GRAD_INPUTS)
@pytest.mark.parametrize("n", MODULES)
def test_requires_grad_is_refused(n, which):
    """Checked by validate() itself, so on any machine (the GPU-only stages without a GPU too)."""
    mod = MODULES[n]
    q, k, v = _grad_inputs(mod, which, device="cpu")
    # A forward whose log-sum-exp stage 8's backward starts from (stages 5 and 6) points to the
    # composition of the two, stages.autograd.attention.
    what = (rf"stage {n}'s attention is the forward alone.*stages\.autograd\.attention\(q, k, v, forward={n}"
            if mod.INFO.saves_lse else rf"stage {n} has no backward")
    with pytest.raises(NoBackwardError, match=rf"{what}.*no_grad"):
        validate(q, k, v, causal=False, scale=None, info=mod.INFO, check_device=False)
    with torch.no_grad():  # grad mode off: nothing to refuse
        validate(q, k, v, causal=False, scale=None, info=mod.INFO, check_device=False)


@pytest.mark.parametrize("n", MODULES)
def test_requires_grad_refused_by_attention(n, seed):
    """The whole call, cached plans included: a layout first seen without grad and then with
    it is refused too; under no_grad and inference_mode the same inputs give the reference."""
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("CUDA C++ stages need a GPU of their compute capability here")
    refusal = (f"stage {n}'s attention is the forward alone" if mod.INFO.saves_lse
               else f"stage {n} has no backward")
    q, k, v = _grad_inputs(mod, "")
    mod.attention(q, k, v)  # a plan for this layout, made without grad
    for which in GRAD_INPUTS:
        q, k, v = _grad_inputs(mod, which)
        with pytest.raises(NoBackwardError, match=refusal):
            mod.attention(q, k, v, causal=True)
        with pytest.raises(NoBackwardError):
            mod.attention(q, k, v)
        for ctx in (torch.no_grad, torch.inference_mode):
            with ctx():
                out = mod.attention(q, k, v)
            assert out.grad_fn is None and not out.requires_grad
            c = check_output(out, q.detach(), k.detach(), v.detach(), causal=False)
            assert c.passed, f"seed {seed}: {c.summary()}"


@cpu_only
def test_simulator_refuses_large_shapes():
    """Without a GPU a numba stage runs in the simulator, a Python thread per GPU thread: a
    shape it would take minutes over is refused with the reason (issue 24, item 7)."""
    from lib.inputs import SIMULATOR_MAX_SCORES
    mod = MODULES[0]
    q, k, v = make_qkv(1, 8, 512, 64, dtype=torch.float32, device="cpu")
    with pytest.raises(NotImplementedError, match="simulator.*2,097,152 scores"):
        mod.attention(q, k, v)
    assert 1 * 1 * 64 * 64 <= SIMULATOR_MAX_SCORES  # the simulator's own shapes stay allowed


# SDPA's own keywords (issue 49, item 6): a call ported from F.scaled_dot_product_attention runs
# as written, is_causal= and enable_gqa= included.

@pytest.mark.parametrize("n", stages.NUMBERS + stages.BEYOND)
def test_every_stage_takes_sdpas_keywords(n):
    import inspect
    params = inspect.signature(stages.get(n).attention).parameters
    assert {"is_causal", "enable_gqa", "attn_mask", "scale"} <= set(params), sorted(params)


@pytest.mark.parametrize("n", MODULES)
def test_sdpas_keywords_mean_what_they_mean_in_sdpa(n, seed):
    """is_causal=True gives causal=True's output; enable_gqa=False refuses fewer K/V heads, as
    SDPA does; causal and is_causal that disagree are refused."""
    mod = MODULES[n]
    if not runs_here(mod):
        pytest.skip("CUDA C++ stages need a GPU of their compute capability here")
    D = head_dims_to_test(mod.INFO)[0]
    q, k, v = make_qkv(1, 4, 11, D, Sk=11, Hkv=2, dtype=mod.INFO.dtypes[0], seed=seed)
    assert torch.equal(mod.attention(q, k, v, is_causal=True), mod.attention(q, k, v, causal=True))
    assert torch.equal(mod.attention(q, k, v, is_causal=False, enable_gqa=True), mod.attention(q, k, v))
    with pytest.raises(ValueError, match="enable_gqa"):
        mod.attention(q, k, v, enable_gqa=False)
    with pytest.raises(ValueError, match="disagree"):
        mod.attention(q, k, v, causal=True, is_causal=False)
