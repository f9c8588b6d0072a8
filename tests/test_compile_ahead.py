"""The main job compiles every CUDA C++ build its rows need before the first row, at once
(lib.bench.compile_ahead, lib.nvrtc.compile_many). Its list (lib.bench.ahead_builds: each stage's
CALL_BUILDS entry at each row) must be exactly what the rows compile: checked here without a GPU against
the builds the stages' offline helpers (compile_for, and stage 6's choose) give at the bench's
shapes, and on a GPU against what the stages' calls really compile."""
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import stages
from conftest import gpu, runs_here
from lib import bench, nvrtc

H200 = dict(cc=(9, 0), arch="sm_90", sms=132)  # the machine the main job is timed on
ALL_SHAPES = [s[0] for s in bench.STANDARD_SHAPES]


def _key(source, arch, dtype, head_dim, defines) -> tuple:
    return (Path(source).name, arch, dtype, head_dim, tuple(sorted(dict(defines).items())))


def _build_keys(builds) -> set:
    return {_key(b.source, b.arch, b.dtype, b.head_dim, b.defines) for b in builds}


def _offline_keys(monkeypatch, shapes, sweep, dtypes, *, cc, arch, sms) -> set:
    """The builds of the bench's rows as the stages' offline helpers give them: compile_for
    (contiguous inputs: packed rows), at stage 6 with the tiles, schedule and Q buffers its
    choose() picks for the row; compile_stage recorded, nothing compiled."""
    seen = set()
    monkeypatch.setattr(nvrtc, "compile_stage", lambda source, *, arch, dtype=torch.float16, head_dim=64,
                        defines=None: seen.add(_key(source, arch, dtype, head_dim, defines or {})))
    for n in stages.NUMBERS:
        mod = stages.get(n)
        info = mod.INFO
        if info.backend == "numba" or cc < tuple(info.min_cc):
            continue
        for suite, name, B, H, S, D, causal, dtype in bench.plan(shapes, sweep, dtypes):
            dt = getattr(torch, dtype)
            if D not in info.head_dims or dt not in info.dtypes:
                continue
            if n == 6:
                ch = mod.choose(B, H, H, S, S, D, int(causal), sms)
                assert not ch["pack_gqa"]
                mod.compile_for(mod.ARCH, dt, D, tiles=ch["tiles"], schedule=ch["schedule"],
                                q_stages=ch["q_stages"], blocks_per_sm=ch["blocks_per_sm"])
            else:
                mod.compile_for(arch, dt, D)
    return seen


def _diff(monkeypatch, shapes=ALL_SHAPES, sweep=False, dtypes=("float16",), machine=H200):
    ahead = _build_keys(bench.ahead_builds(stages.all_stages(), shapes, sweep, list(dtypes), **machine))
    with monkeypatch.context() as m:
        offline = _offline_keys(m, shapes, sweep, list(dtypes), **machine)
    return offline - ahead, ahead - offline  # (missing from the list, listed but not compiled)


@pytest.mark.parametrize("shapes, sweep, dtypes", [
    (ALL_SHAPES, False, ("float16",)),  # the README's `python3 -m lib.bench`
    (ALL_SHAPES, True, ("float16", "bfloat16")),  # a record's rows
    (["latency"], False, ("bfloat16",))])
def test_ahead_list_is_exactly_the_rows_builds(monkeypatch, shapes, sweep, dtypes):
    missing, extra = _diff(monkeypatch, shapes, sweep, dtypes)
    assert not missing and not extra, (missing, extra)


def test_ahead_list_of_the_main_job():
    builds = bench.ahead_builds(stages.all_stages(), ALL_SHAPES, False, ["float16"], **H200)
    assert len(builds) == len(set(builds))  # each once
    per_stage = {}
    for b in builds:
        per_stage.setdefault(Path(b.source).name, set()).add(b.head_dim)
    # every CUDA C++ stage at both head dims, nothing of stage 0 (numba)
    assert per_stage == {f"stage{n}.cu": {64, 128} for n in range(1, 7)}
    assert all(b.arch == ("sm_90a" if "stage6" in str(b.source) else "sm_90") for b in builds)
    # an older GPU: no stage 6 (sm_90a only), the rest for its own arch
    ampere = bench.ahead_builds(stages.all_stages(), ALL_SHAPES, False, ["float16"],
                                cc=(8, 0), arch="sm_80", sms=108)
    assert {b.arch for b in ampere} == {"sm_80"} and len(ampere) == 10


def test_the_check_fails_when_the_list_drifts(monkeypatch):
    """The comparison above catches a list that misses builds or names others."""
    # an entry forgetting the packed-rows define the launcher adds (here stage 5's)
    monkeypatch.setitem(bench.CALL_BUILDS, 5, lambda mod, B, H, Hk, Sq, Sk, D, dtype, causal, *, arch, sms: [
        nvrtc.Build(mod.SOURCE, arch, dtype, D, mod.config(D)["defines"])])
    missing, extra = _diff(monkeypatch, ["latency"])
    assert {m[0] for m in missing} == {"stage5.cu"} and {e[0] for e in extra} == {"stage5.cu"}
    monkeypatch.undo()
    # stage 6's entry planning its calls for a GPU of fewer SMs than the rows run on
    real = bench.CALL_BUILDS[6]
    monkeypatch.setitem(bench.CALL_BUILDS, 6, lambda *a, arch, sms: real(*a, arch=arch, sms=16))
    missing, extra = _diff(monkeypatch, ["latency"])
    assert {m[0] for m in missing} == {"stage6.cu"} and {e[0] for e in extra} == {"stage6.cu"}
    monkeypatch.undo()
    # a stage without an entry: its rows are left to compile their own, and the list lacks them
    monkeypatch.delitem(bench.CALL_BUILDS, 6)
    missing, extra = _diff(monkeypatch)
    assert {m[0] for m in missing} == {"stage6.cu"} and not extra
    monkeypatch.undo()
    # the list made from fewer rows than the bench runs (here: its causal ones left out)
    rows = bench.stage_rows
    monkeypatch.setattr(bench, "stage_rows", lambda *a: (rows(*a)[0], [r for r in rows(*a)[1] if not r[6]]))
    missing, extra = _diff(monkeypatch)
    assert {m[0] for m in missing} == {"stage6.cu"} and not extra  # stage 6 builds per mask


# --------------------------------------------------------------------------------------------
# compile_ahead: nothing when all is cached, one line otherwise, failures left to the rows

@dataclass(frozen=True)
class _FakeBuild:
    name: str
    is_cached: bool = False
    fails: bool = False
    arch: str = "sm_90"
    head_dim: int = 64

    def cached(self):
        return self.is_cached

    def compile(self):
        _compiled.append(self.name)
        if self.fails:
            raise RuntimeError("NVRTC failed")

    def __str__(self):
        return self.name


_compiled = []


@pytest.fixture
def fake_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *a: type("P", (), {"multi_processor_count": 132}))
    monkeypatch.setattr(nvrtc, "gpu_arch", lambda *a, **k: "sm_90")
    _compiled.clear()

    def with_builds(builds):
        monkeypatch.setattr(bench, "ahead_builds", lambda *a, **k: builds)
    return with_builds


def test_compile_ahead_does_nothing_when_every_build_is_cached(fake_machine, capsys, monkeypatch):
    fake_machine([_FakeBuild("a", is_cached=True), _FakeBuild("b", is_cached=True)])
    monkeypatch.setattr(nvrtc, "compile_many", lambda *a, **k: pytest.fail("compiled"))
    bench.compile_ahead([stages.get(2)], ["latency"], False, ["float16"])
    assert capsys.readouterr().err == "" and _compiled == []


def test_compile_ahead_compiles_what_is_missing_in_one_line_and_leaves_failures(fake_machine, capsys):
    fake_machine([_FakeBuild("a", is_cached=True), _FakeBuild("b"), _FakeBuild("c", fails=True)])
    bench.compile_ahead([stages.get(2)], ["latency"], False, ["float16"])  # no exception
    err = capsys.readouterr().err
    assert sorted(_compiled) == ["b", "c"]
    assert err.count("\n") == 1 and err.startswith("compiling 2 kernel builds the rows need"), err
    assert f"on {min(2, nvrtc.usable_cores())} core" in err
    assert "1 failed, left for their rows to compile and report: c" in err


def test_compile_many_compiles_in_threads_beside_the_callers_calls(tmp_path, monkeypatch):
    """Real NVRTC, two tiny sources (one broken) in an empty cache: the good builds land in the
    cache, the broken one is reported, not raised; the caller's call ran meanwhile."""
    monkeypatch.setenv("FA_CACHE_DIR", str(tmp_path / "cache"))
    good, bad = tmp_path / "good.cu", tmp_path / "bad.cu"
    good.write_text('extern "C" __global__ void k(float* o) { o[threadIdx.x] = HEAD_DIM; }\n')
    bad.write_text('extern "C" __global__ void k(float* o) { o[threadIdx.x] = NO_SUCH_NAME; }\n')
    builds = [nvrtc.Build(good, "sm_80", torch.float16, 64), nvrtc.Build(good, "sm_80", torch.float16, 128),
              nvrtc.Build(bad, "sm_80", torch.float16, 64)]
    assert not any(b.cached() for b in builds)
    ran = []
    done, failed = nvrtc.compile_many(builds + builds[:1], workers=2, alongside=[lambda: ran.append(1)])
    assert done == 2 and [b for b, _ in failed] == [builds[2]] and ran == [1]
    assert "NO_SUCH_NAME" in str(failed[0][1])
    assert builds[0].cached() and builds[1].cached() and not builds[2].cached()
    assert builds[0].compile().key == builds[0].key()  # the key compile_cuda files it under


# --------------------------------------------------------------------------------------------
# on a GPU: what the stages' calls compile at the bench's rows is the list

@gpu
def test_rows_compile_exactly_the_ahead_list(monkeypatch):
    import functools

    import stages.stage6 as s6
    from lib.inputs import make_qkv
    mods = [m for m in stages.all_stages() if m.INFO.backend == "nvrtc" and runs_here(m)]
    cc = torch.cuda.get_device_capability()
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    dtypes = ["float16", "bfloat16"]
    ahead = _build_keys(bench.ahead_builds(mods, ALL_SHAPES, False, dtypes, cc, nvrtc.gpu_arch(), sms))
    # every cache of loaded kernels and plans emptied, so that each call compiles (or reads from
    # the disk cache) what it runs
    monkeypatch.setattr(nvrtc, "stage_kernels", functools.lru_cache(None)(nvrtc.stage_kernels.__wrapped__))
    monkeypatch.setattr(nvrtc, "_plans", {})
    monkeypatch.setattr(s6, "_kernels", {})
    monkeypatch.setattr(s6, "_plans", {})
    real, seen = nvrtc.compile_stage, set()

    def recording(source, *, arch, dtype=torch.float16, head_dim=64, defines=None):
        seen.add(_key(source, arch, dtype, head_dim, defines or {}))
        return real(source, arch=arch, dtype=dtype, head_dim=head_dim, defines=defines)
    monkeypatch.setattr(nvrtc, "compile_stage", recording)
    for mod in mods:
        for suite, name, B, H, S, D, causal, dtype in bench.stage_rows(mod, ALL_SHAPES, False, dtypes, cc)[1]:
            q, k, v = make_qkv(B, H, S, D, dtype=getattr(torch, dtype))
            try:
                mod.attention(q, k, v, causal=causal)
            except MemoryError:  # stage 1's score matrix at the long shape on a smaller GPU
                ahead -= {a for a in ahead if a[0] == "stage1.cu" and a[3] == D}
            del q, k, v
    torch.cuda.synchronize()
    assert seen == ahead, (seen - ahead, ahead - seen)
