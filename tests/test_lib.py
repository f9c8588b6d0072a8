"""Unit tests of the shared harness (lib/)."""
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import cpu_only, gpu
from lib import inputs, nvrtc, reference, results, sass
from lib.simulator import HAS_GPU, SIMULATOR, GPURequiredError, numba_cuda

HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------------------------
# reference and the error rule

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq,Sk", [(7, 7), (5, 11), (11, 5)])
def test_reference_matches_sdpa_math(Sq, Sk, causal, seed):
    q, k, v = inputs.make_qkv(2, 3, Sq, 16, Sk=Sk, dtype=torch.float64, device="cpu", seed=seed)
    ref = reference.reference_attention(q, k, v, causal=causal)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(ref, want, rtol=1e-10, atol=1e-12)


def test_reference_slices_heads_like_whole(seed):
    q, k, v = inputs.make_qkv(2, 3, 9, 8, dtype=torch.float32, device="cpu", seed=seed)
    whole = reference.reference_attention(q, k, v, causal=True)
    sliced = reference.reference_attention(q, k, v, causal=True, max_scores=81)  # a head a slice
    torch.testing.assert_close(whole, sliced, rtol=0, atol=0)


def test_error_rule_passes_sdpa_and_fails_perturbed(seed):
    q, k, v = inputs.make_qkv(1, 2, 33, 16, dtype=torch.float16, device="cpu", seed=seed)
    good = reference.reference_attention(q, k, v).to(torch.float16)
    assert reference.check_output(good, q, k, v).passed
    bad = good.clone()
    bad[0, 1, 7, 3] += 0.05  # one element off by far more than fp16 rounding
    c = reference.check_output(bad, q, k, v)
    assert not c.passed and c.max_abs_err >= 0.04


def test_error_rule_fails_unwritten_output(seed):
    q, k, v = inputs.make_qkv(1, 1, 5, 8, dtype=torch.bfloat16, device="cpu", seed=seed)
    out = reference.reference_attention(q, k, v).to(torch.bfloat16)
    out[0, 0, 4, 7] = math.nan
    c = reference.check_output(out, q, k, v)
    assert not c.passed and c.nonfinite == 1


def test_flops_and_bytes():
    assert reference.attention_flops(2, 3, 5, 7, 11) == 4 * 2 * 3 * 5 * 7 * 11
    assert reference.attention_flops(2, 3, 5, 7, 11, causal=True) == 2 * 2 * 3 * 5 * 7 * 11
    assert reference.attention_min_bytes(1, 2, 3, 4, 8, 2) == 2 * (2 * 2 * 3 * 8 + 2 * 2 * 4 * 8)


# ---------------------------------------------------------------------------------------------
# inputs

def test_make_qkv_is_fresh_random_and_seedable():
    a = inputs.make_qkv(1, 2, 5, 8, Sk=7, Hkv=1, device="cpu")
    b = inputs.make_qkv(1, 2, 5, 8, Sk=7, Hkv=1, device="cpu")
    assert [t.shape for t in a] == [(1, 2, 5, 8), (1, 1, 7, 8), (1, 1, 7, 8)]
    assert not torch.equal(a[0], b[0])
    assert all(t.abs().sum() > 0 for t in a)
    c, d = (inputs.make_qkv(1, 2, 5, 8, device="cpu", seed=3) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(c, d))


def test_poisoned_outputs():
    q = torch.ones(1, 1, 2, 4)
    with inputs.poisoned_outputs():
        assert torch.isnan(inputs.new_output(q)).all()
    out = inputs.new_output(q, D=3, dtype=torch.float16)
    assert out.shape == (1, 1, 2, 3) and out.dtype == torch.float16


def test_validate_returns_default_scale():
    info = dataclasses.replace(__import__("stages").get(0).INFO)
    q, k, v = inputs.make_qkv(1, 1, 3, 16, dtype=torch.float32)
    assert inputs.validate(q, k, v, causal=False, scale=None, info=info) == pytest.approx(0.25)
    assert inputs.validate(q, k, v, causal=False, scale=2, info=info) == 2.0


@cpu_only
def test_cuda_stage_without_gpu_says_so():
    info = dataclasses.replace(__import__("stages").get(0).INFO, backend="nvrtc")
    q, k, v = inputs.make_qkv(1, 1, 3, 16, dtype=torch.float16, device="cpu")
    with pytest.raises(GPURequiredError, match="lib.sass"):
        inputs.validate(q, k, v, causal=False, scale=None, info=info)


# ---------------------------------------------------------------------------------------------
# the warp shim (simulator) / real warp functions (GPU): the same kernel, checked with numpy

cuda = numba_cuda()


@cuda.jit
def _warp_ops(x, out, bits):
    t = cuda.threadIdx.x
    lane = t % 32
    mask = cuda.activemask()
    v = x[t]
    out[0, t] = cuda.shfl_sync(mask, v, 0)
    out[1, t] = cuda.shfl_up_sync(mask, v, 3)
    out[2, t] = cuda.shfl_down_sync(mask, v, 2)
    s = v
    for m in (1, 2, 4, 8):  # butterfly sum within groups of 16 lanes
        s += cuda.shfl_xor_sync(mask, s, m)
    out[3, t] = s
    bits[0, t] = cuda.ballot_sync(mask, v > 0)
    out[5, t] = cuda.all_sync(mask, v > -100)
    out[6, t] = cuda.any_sync(mask, v > 2.5)
    cuda.syncwarp(mask)
    bits[1, t] = mask
    out[8, t] = lane


@pytest.mark.parametrize("threads", [64, 48])  # 48: the second warp is partial (16 lanes)
def test_warp_functions_match_numpy(threads):
    rng = np.random.default_rng()
    x = rng.standard_normal(threads).astype(np.float32)
    out = np.zeros((9, threads), dtype=np.float32)
    bits = np.zeros((2, threads), dtype=np.int64)  # masks: compared as 32-bit patterns
    _warp_ops[1, threads](x, out, bits)
    bits &= 0xFFFFFFFF
    for w in range(0, threads, 32):
        xs = x[w:w + 32]
        n = len(xs)
        lanes = np.arange(n)
        np.testing.assert_array_equal(out[0, w:w + n], np.full(n, xs[0]))
        np.testing.assert_array_equal(out[1, w:w + n], np.where(lanes >= 3, xs[lanes - 3], xs))
        ok = lanes + 2 < n  # beyond the warp's last lane the value is undefined on hardware
        np.testing.assert_array_equal(out[2, w:w + n][ok], xs[lanes[ok] + 2])
        sums = xs.reshape(-1, 16).sum(axis=1).repeat(16)
        np.testing.assert_allclose(out[3, w:w + n], sums, rtol=1e-5, atol=1e-5)
        ballot = sum(1 << int(i) for i in lanes if xs[i] > 0)
        assert (bits[0, w:w + n] == ballot).all()
        assert (out[5, w:w + n] == 1).all()
        assert (out[6, w:w + n] == float(bool((xs > 2.5).any()))).all()
        assert (bits[1, w:w + n] == (1 << n) - 1).all()
        np.testing.assert_array_equal(out[8, w:w + n], lanes)


# ---------------------------------------------------------------------------------------------
# NVRTC: offline compile, cache, resource report, SASS; launch on a GPU

WMMA_SOURCE = (HERE / "kernels" / "wmma_tile.cu").read_text()


# CPU only: on the H100 machine under pytest-xdist, NVRTC has twice returned a good cubin with an
# empty log (no ptxas report to read registers from; results/logs/2026-11-25-3103364-call5).
@cpu_only
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_wmma_compiles_offline_with_hmma(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("FA_CACHE_DIR", str(tmp_path))
    c = nvrtc.compile_cuda(WMMA_SOURCE, arch=arch, name="wmma_tile.cu")
    assert c.cubin[:4] == b"\x7fELF" and c.path.exists()
    usage = c.resource_usage()["wmma_tile"]
    assert usage["registers"] > 0 and usage["spill_stores"] == 0
    mix = sass.instruction_mix(sass.sass_text(c.cubin))
    assert mix["HMMA"] >= 2  # a 16x16x16 WMMA is two HMMA.16816 on sm_80+
    assert sass.resource_usage(c.cubin)["wmma_tile"]["REG"] == usage["registers"]
    again = nvrtc.compile_cuda(WMMA_SOURCE, arch=arch, name="wmma_tile.cu")
    assert again.key == c.key and again.cubin == c.cubin  # served from the disk cache
    other = nvrtc.compile_cuda(WMMA_SOURCE, arch=arch, name="wmma_tile.cu", defines={"X": 1})
    assert other.key != c.key


def test_compile_error_shows_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("FA_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="undefined_thing"):
        nvrtc.compile_cuda('extern "C" __global__ void f() { undefined_thing(); }', arch="sm_80")


def test_ptxas_log_parser():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers, 32768 bytes smem\n")
    assert nvrtc.parse_ptxas_log(log) == {"k": {"registers": 168, "stack_bytes": 16,
                                                "spill_stores": 8, "spill_loads": 4,
                                                "static_smem_bytes": 32768}}


@gpu
def test_wmma_launch_on_torch_tensors(seed):
    torch.manual_seed(seed)
    a = torch.randn(16, 16, device="cuda", dtype=torch.float16)
    b = torch.randn(16, 16, device="cuda", dtype=torch.float16)
    c = torch.full((16, 16), math.nan, device="cuda")
    kernel = nvrtc.load_kernel(nvrtc.compile_cuda(WMMA_SOURCE, arch=nvrtc.gpu_arch()), "wmma_tile")
    nvrtc.launch(kernel, (1, 1, 1), (32, 1, 1), a, b, c, np.float32(0.5))
    torch.cuda.synchronize()
    torch.testing.assert_close(c, 0.5 * (a.float() @ b.float()), rtol=1e-3, atol=1e-3)
    with pytest.raises(TypeError, match="numpy scalar"):
        nvrtc.launch(kernel, (1, 1, 1), (32, 1, 1), a, b, c, 0.5)


def test_stage0_inspects_offline():
    ins = sass.inspect_stage(0)["attention_rows"]
    assert ins.mix["FFMA"] > 0 and ins.mix["MUFU"] > 0  # the dot products and exp()
    assert ins.mix["STL"] > 0 and ins.mix["HMMA"] == 0  # a local-memory accumulator, no tensor cores
    assert "attention_rows" in next(iter(ins.resources))


# ---------------------------------------------------------------------------------------------
# timing

@gpu
def test_time_cuda_median_and_sdpa_backends():
    from lib.timing import sdpa_call, time_cuda
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    t = time_cuda(lambda: a @ a, min_runs=5, max_runs=20, budget_s=0.2)
    assert 5 <= t.runs <= 20 and 0 < t.min_us <= t.median_us <= t.p80_us
    q, k, v = inputs.make_qkv(1, 2, 64, 64, dtype=torch.float32)
    assert sdpa_call(q, k, v, backend="flash") is None  # FLASH has no float32 kernel
    assert sdpa_call(q, k, v) is not None


@pytest.mark.parametrize("causal", [False, True, "top_left", "bottom_right"])
def test_sdpa_call_takes_each_causal_alignment(causal):
    """sdpa_call (what the benchmarks time SDPA with) masks as the float64 reference does for
    each spelling of causal, bottom-right through SDPA's own causal_lower_right bias; GQA too."""
    from lib.reference import reference_attention
    from lib.timing import sdpa_call
    q, k, v = inputs.make_qkv(2, 8, 5, 64, Sk=37, Hkv=2, dtype=torch.float32, device="cpu")
    got = sdpa_call(q, k, v, causal=causal)().double()
    want = reference_attention(q.double(), k.double(), v.double(), causal=causal)
    assert (got - want).abs().max().item() < 1e-5
    if causal == "bottom_right":  # differs from top-left when Sq < Sk
        assert (got - reference_attention(q.double(), k.double(), v.double(), causal=True)).abs().max() > 1e-2
    with pytest.raises(ValueError, match="causal must be"):  # never read as a bool
        sdpa_call(q, k, v, causal="bottom-right")


def test_sdpa_backward_call_gives_autograds_gradients():
    """lib.timing.sdpa_backward_call (the backward benchmark's and profiler's SDPA side) returns
    what autograd of the same SDPA forward does, on fresh inputs, with the default backend and
    with one forced (FLASH, which this torch also has on the CPU)."""
    from lib.timing import sdpa_backward_call
    q, k, v = inputs.make_qkv(1, 2, 33, 64, Sk=45, dtype=torch.float32, device="cpu")
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
    want = torch.autograd.grad(out, leaves, dout)
    for backend in ("default", "flash"):
        grads = sdpa_backward_call(q, k, v, dout, causal=True, backend=backend)()
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(grads, want)), backend


@gpu
def test_interleaved_timing_keeps_a_slow_spell_out_of_the_median():
    """A slow spell that lasts one round of five (here: a GPU spin added to every call of that
    round) shows in that round's median, and the median over all runs stays near the steady
    time; each callable gets the runs time_cuda would give it, split over the rounds."""
    from lib.timing import time_cuda, time_interleaved
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    steady = time_cuda(lambda: a @ a, max_runs=50, budget_s=0.2, flush=False).median_us
    calls = {"n": 0}
    per_round = 10

    def spell():  # calls 2 (warm-up) + 1 (probe) come first; round 3 of 5 is slow
        calls["n"] += 1
        if 3 + 2 * per_round < calls["n"] <= 3 + 3 * per_round:
            torch.cuda._sleep(int(2e3 * 5 * steady))  # about 5x the matmul's time at 2 GHz
        return a @ a

    t = time_interleaved({"spell": spell, "plain": lambda: a @ a, "none": None}, rounds=5,
                         min_runs=5 * per_round, max_runs=5 * per_round, flush=False,
                         settle_ms=0)  # no untimed runs between the rounds: the count above holds
    assert set(t) == {"spell", "plain"}
    assert t["spell"].runs == 5 * per_round and len(t["spell"].round_medians_us) == 5
    assert t["spell"].round_medians_us[2] > 3 * steady and t["spell"].spread > 3
    assert t["spell"].median_us < 1.25 * steady and t["plain"].median_us < 1.25 * steady


def test_settle_runs_rule():
    """Untimed runs before each batch: about settle_ms of the call's own work, at least one,
    at most SETTLE_MAX_RUNS; none when settle_ms is 0."""
    from lib.timing import SETTLE_MAX_RUNS, settle_runs
    assert settle_runs(3.3e-3, 50) == 16  # 16 runs of 3.3 ms: 52.8 ms
    assert settle_runs(0.2, 50) == 1 and settle_runs(3.3e-3, 0) == 0
    assert settle_runs(10e-6, 50) == SETTLE_MAX_RUNS


@gpu
def test_interleaved_timing_settles_and_rotates():
    """With settle_ms, every batch follows that callable's own untimed runs (the calls counted:
    warm-up, probe, then per round the settle runs and the timed ones); each round starts one
    callable further on (the order of first calls per round)."""
    from lib.timing import settle_runs, time_interleaved
    order, calls = [], {"a": 0, "b": 0}

    def fn(name):
        def call():
            calls[name] += 1
            order.append(name)
            return torch.cuda._sleep(20_000)
        return call

    t = time_interleaved({"a": fn("a"), "b": fn("b")}, rounds=4, warmup=2, min_runs=8, max_runs=8,
                         flush=False, settle_ms=100.0)
    assert t["a"].runs == t["b"].runs == 8
    # the probe run's time sets the settle count: 100 ms of ~10 µs runs is past the cap
    settle = settle_runs(1e-5, 100.0)
    assert calls["a"] == calls["b"] == 2 + 1 + 4 * (settle + 2), calls
    firsts = [order[2 * 3 + r * 2 * (settle + 2)] for r in range(4)]
    assert firsts == ["a", "b", "a", "b"], firsts


@gpu
def test_held_timing_leaves_the_hosts_launch_out():
    """A call that keeps the host busy 300 µs before it launches 20 µs of GPU work: timed
    without hold, the GPU waits for the host between the events; held, it does not."""
    import time as _time

    from lib.timing import time_cuda

    def slow_launch():
        t0 = _time.perf_counter()
        while _time.perf_counter() - t0 < 300e-6:
            pass
        torch.cuda._sleep(40_000)  # about 20 µs at 2 GHz

    old = time_cuda(slow_launch, hold=False, min_runs=20, max_runs=20).median_us
    held = time_cuda(slow_launch, hold=True, min_runs=20, max_runs=20).median_us
    assert old > 200 and held < 100, (old, held)


@cpu_only
def test_timing_needs_a_gpu():
    from lib.timing import time_cuda
    with pytest.raises(GPURequiredError):
        time_cuda(lambda: None)


# ---------------------------------------------------------------------------------------------
# results, freshness machinery, plots

def _fake_results(tmp_path, monkeypatch, info):
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    env = {"gpu": "Test GPU 1", "sm_count": 2, "driver": "1", "cuda": "13.0", "torch": "x",
           "numba_cuda": "y", "nvrtc": "13.0", "commit": "abc", "date": "today"}
    runs = [{"stage": info.number, "suite": "standard", "B": 1, "H": 2, "Sq": 3, "Sk": 3, "D": 4,
             "dtype": "float16", "causal": c, "us": 10.0 + c, "tflops": 1.5, "sdpa_us": 5.0,
             "sdpa_flash_us": None, "sdpa_tflops": 3.0, "max_abs_err": 1e-3, "passed": True}
            for c in (False, True)]
    return results.save(env, [info], runs, extra={"ceilings": {"matmul_TFLOPS": 100.0,
                                                               "matmul_dtype": "bf16",
                                                               "matmul_shape": "n"}})


def test_refresh_readme_blocks_follows_a_pending_declaration(tmp_path, monkeypatch):
    """A declared pending re-record changes the provenance the README's results block shows:
    refresh_readme_blocks writes README.md's and docs/results.md's blocks again from the record
    results/CURRENT names (plots kept), and leaves them alone for another record."""
    src = tmp_path / "stage_fake.py"
    src.write_text("print('kernel v1')\n")
    info = dataclasses.replace(__import__("stages").get(0).INFO, number=7, sources=(str(src),))
    path = _fake_results(tmp_path, monkeypatch, info)
    readme, docs, current = tmp_path / "README.md", tmp_path / "results.md", tmp_path / "CURRENT"
    for f in (readme, docs):
        f.write_text(f"head\n{results.TABLE_BEGIN}\nthe previous block\n![TFLOPS per stage](results/x.png)\n"
                     f"{results.TABLE_END}\ntail\n")
    monkeypatch.setattr(results, "README", readme)
    monkeypatch.setattr(results, "DOCS_RESULTS", docs)
    monkeypatch.setattr(results, "CURRENT", current)
    current.write_text("another.json\n")
    assert not results.refresh_readme_blocks(path) and "the previous block" in readme.read_text()
    current.write_text(path.name + "\n")
    results.declare_pending(path, [], "nothing")  # (no stage: the file rewritten as it is)
    data = results.load(path)
    data["pending_rerecord"] = {"7": {"sha256": "x", "why": "a host-side check", "since_commit": "abc1234"}}
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "_path"}))
    assert results.refresh_readme_blocks(path)
    text = readme.read_text()
    assert "the previous block" not in text and "a host-side check" in text and "](results/x.png)" in text
    assert text.startswith("head\n") and text.endswith("tail\n")
    assert "a host-side check" in docs.read_text() and "](../results/x.png)" in docs.read_text()


def test_results_roundtrip_table_and_staleness(tmp_path, monkeypatch):
    src = tmp_path / "stage_fake.py"
    src.write_text("print('kernel v1')\n")
    info = dataclasses.replace(__import__("stages").get(0).INFO, number=7, sources=(str(src),))
    path = _fake_results(tmp_path, monkeypatch, info)
    assert path.name == "test-gpu-1.json"
    data = results.load(path)
    assert data["stages"]["7"]["sha256"] == results.stage_sha256(info)
    table = results.markdown_table(results.standard_runs(data), 100.0)
    assert table.count("\n") == 3 and "0.5×" in table and "1.5" in table

    class Mod:
        INFO = info
    assert results.stale_stages(data, [Mod]) == []
    src.write_text("print('kernel v2')\n")  # edit the kernel without re-recording
    assert "changed" in results.stale_stages(data, [Mod])[0]
    # Declared pending (no GPU): accepted for exactly these sources, and said in provenance.
    data["pending_rerecord"] = {"7": {"sha256": results.stage_sha256(info), "why": "no GPU",
                                      "since_commit": "abc1234"}}
    assert results.stale_stages(data, [Mod]) == []
    assert "re-record pending" in results.provenance(data) and "no GPU" in results.provenance(data)
    src.write_text("print('kernel v3')\n")  # edited again after the declaration
    assert "changed" in results.stale_stages(data, [Mod])[0]
    # The next record of the stage clears its declaration.
    path.write_text(json.dumps({k: v for k, v in data.items() if k != "_path"}))
    results.save(results.load(path)["env"], [info], [])
    assert "pending_rerecord" not in results.load(path)


def test_save_keeps_every_dtype_of_a_stage_and_replaces_its_old_rows(tmp_path, monkeypatch):
    info = __import__("stages").get(0).INFO
    path = _fake_results(tmp_path, monkeypatch, info)  # two fp16 rows, us 10 and 11
    env = {**results.load(path)["env"], "commit": "def"}
    row = {"stage": 0, "suite": "standard", "B": 1, "H": 2, "Sq": 3, "Sk": 3, "D": 4,
           "causal": False, "tflops": 1.0, "sdpa_us": 5.0, "passed": True}
    new = [{**row, "dtype": "bfloat16", "us": 21.0}, {**row, "dtype": "float16", "us": 20.0}]
    data = results.load(results.save(env, [info], new))
    assert [(r["dtype"], r["us"]) for r in data["runs"]] == [("float16", 20.0), ("bfloat16", 21.0)]
    assert data["stages"]["0"]["commit"] == "def"


def test_a_stage_kept_by_a_later_record_keeps_its_commit_and_date(tmp_path, monkeypatch):
    s = __import__("stages")
    path = _fake_results(tmp_path, monkeypatch, s.get(0).INFO)  # stage 0 at abc, "today"
    old = results.load(path)
    old["stages"]["0"].pop("date")  # as files written before stages carried their own dates
    path.write_text(json.dumps({k: v for k, v in old.items() if k != "_path"}))
    env = {**old["env"], "commit": "def", "date": "tomorrow"}
    data = results.load(results.save(env, [s.get(1).INFO], []))
    assert (data["stages"]["0"]["commit"], data["stages"]["0"]["date"]) == ("abc", "today")
    assert (data["stages"]["1"]["commit"], data["stages"]["1"]["date"]) == ("def", "tomorrow")


def test_records_made_side_by_side_merge_stage_by_stage(tmp_path):
    """Two processes on one host's two GPUs each write their own copy of the record: the merge
    takes each stage (rows and entry) and each other entry from the copy that made it last."""
    def record(date, stages, extra):
        runs = [{"stage": n, "suite": "standard", "B": 1, "H": 1, "Sq": 8, "Sk": 8, "D": 64,
                 "causal": False, "dtype": "float16", "us": float(n) + len(date)} for n in stages]
        return {"env": {"gpu": "G", "commit": date[:3], "date": date},
                "stages": {str(n): {"title": f"s{n}", "commit": date[:3], "date": date} for n in stages},
                "runs": runs, **extra}
    base = record("2026-01-01", [0, 1], {"tiles": {"env": {"date": "2026-01-01"}, "rows": [1]},
                                          "pending_rerecord": {"1": {}}})
    lane0 = record("2026-02-02 10:00", [0], {"tiles": {"env": {"date": "2026-02-02 10:00"}, "rows": [2]}})
    lane1 = record("2026-02-02 10:05", [1, 2], {"tiles": {"env": {"date": "2026-01-01"}, "rows": [1]},
                                                 "shape_map": {"env": {"date": "2026-02-02"}, "rows": [3]}})
    paths = []
    for name, rec in (("base", base), ("lane0", lane0), ("lane1", lane1)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(rec))
    taken = results.merge_records(paths[0], paths[1:])
    got = json.loads(paths[0].read_text())
    assert {n: s["date"] for n, s in got["stages"].items()} == {
        "0": "2026-02-02 10:00", "1": "2026-02-02 10:05", "2": "2026-02-02 10:05"}
    assert sorted((r["stage"], r["us"]) for r in got["runs"]) == [(0, 16.0), (1, 17.0), (2, 18.0)]
    assert got["tiles"]["rows"] == [2] and got["shape_map"]["rows"] == [3]
    assert "pending_rerecord" not in got and got["env"]["date"] == "2026-02-02 10:05"
    assert taken["stage 0"].endswith("lane0.json") and taken["shape_map"].endswith("lane1.json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**lane0, "env": {**lane0["env"], "gpu": "H"}}))
    with pytest.raises(ValueError, match="record"):
        results.merge_records(paths[0], [other])


def test_readers_default_to_float16(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from lib import notebook, plots
    info = __import__("stages").get(0).INFO
    data = results.load(_fake_results(tmp_path, monkeypatch, info))
    bf16 = [{**r, "dtype": "bfloat16", "us": 2 * r["us"], "tflops": 0.75, "sdpa_us": 7.0}
            for r in data["runs"]]
    data["runs"] += bf16
    monkeypatch.setattr(results, "load", lambda *a: data)
    assert {r["dtype"] for r in notebook.recorded_runs(0)} == {"float16"}
    assert len(notebook.recorded_runs(0, dtype=None)) == 4
    assert notebook.recorded_runs(0, dtype="bfloat16") == bf16
    assert notebook.sdpa_median_of(bf16[0]) == 7.0  # bf16's SDPA time, not the fp16 rows'
    assert len(notebook.recorded_verdicts(0)) == 4   # every recorded check counts
    fig = plots.plot_stages(data)
    heights = {round(b.get_height(), 3) for b in fig.axes[0].patches}
    assert 1.5 in heights and 0.75 not in heights and "float16" in fig.axes[0].get_title()
    plt.close(fig)


def test_readme_table_between_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{results.TABLE_BEGIN}\nold\n{results.TABLE_END}\noutro\n")
    results.update_readme("NEW TABLE", readme)
    text = readme.read_text()
    assert "NEW TABLE" in text and "old" not in text and text.endswith("outro\n")


def test_plot_writes_png(tmp_path, monkeypatch):
    from lib.plots import plot_stages
    info = __import__("stages").get(0).INFO
    data = results.load(_fake_results(tmp_path, monkeypatch, info))
    png = plot_stages(data, tmp_path / "p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_capture_env_has_provenance():
    env = results.capture_env()
    for key in ("gpu", "sm_count", "driver", "cuda", "torch", "numba_cuda", "nvrtc", "commit",
                "date"):
        assert key in env
    json.dumps(env)
    if HAS_GPU:
        assert env["sm_count"] > 0


@cpu_only
def test_bench_cpu_mode_runs_simulator_and_prints_recorded(capsys):
    from lib import bench
    assert bench.main(["--stages", "0"]) == 0
    out = capsys.readouterr().out
    assert "CPU mode" in out and "(simulator)" in out and "FAIL" not in out
    assert "Recorded results" in out or "No recorded results" in out
    assert SIMULATOR


def test_journey_prediction_verdict_and_label():
    """The journey's verdict on a predicted range, and its short provenance (one commit per
    group of stages, as the results file records them)."""
    from lib.notebook import prediction_verdict, recorded_label
    assert prediction_verdict((2.0, 4.0), 3.0) == ("yes", "1.5, 0.75")
    assert prediction_verdict((2.0, 4.0), 1.0)[0] == "no, below"
    assert prediction_verdict((2.0, 4.0), 5.0)[0] == "no, above"
    assert prediction_verdict((2.0, 2.0), 3.0) == ("— (a single value)", "1.5")
    assert prediction_verdict(None, 3.0) == ("—", "—")
    data = {"env": {"gpu": "G", "commit": "bbbbbbb"},
            "stages": {"0": {"commit": "aaaaaaa"}, "1": {}, "2": {}}}
    assert recorded_label(data) == "recorded on G, stage 0 at commit aaaaaaa; stages 1–2 at commit bbbbbbb"


def test_source_hash_ignores_comments_not_code():
    """A record goes stale when a stage's code changes, not when a comment or docstring does
    (lib.results.code_only): checked on every registered stage's real sources."""
    import stages
    for mod in stages.all_stages():
        info = mod.INFO
        texts = {rel: p.read_text() for rel, p in zip(info.sources, info.source_paths())}
        base = results.stage_sha256(info, texts.__getitem__)
        assert base == results.stage_sha256(info)
        for rel, text in texts.items():
            if rel.endswith(".py"):
                commented = text.replace("\n\n", "\n\n# a new comment line\n\n", 1) + "\n# trailing note\n"
                code = text + "\n_EXTRA = 1\n"
            else:
                commented = "// a new comment\n" + text.replace("\n", "  /* note */\n", 1)
                code = text + "\nstatic const int extra_value = 1;\n"
            for variant, same in ((commented, True), (code, False)):
                h = results.stage_sha256(info, {**texts, rel: variant}.__getitem__)
                assert (h == base) is same, (info.number, rel, same)


def test_docstrings_are_not_code():
    src = 'def f(x):\n    """Say what f does."""\n    return x  # why\n'
    assert results.code_only("m.py", src) == "def f(x):\n    return x"
    assert results.code_only("k.cu", "int a; // note\n/* block\n comment */ int b;\n\n") == "int a;\n  int b;"


def test_docstrings_with_non_ascii_end_where_they_end():
    """ast gives docstring columns in UTF-8 bytes: a "·" or "≈" on a docstring's closing line must
    not move the cut into the next line (its newline and indentation), and so must not change
    the code that is hashed."""
    def src(doc_end):
        return ('def f(x):\n    """Scale x.\n\n    Costs B' + doc_end + '."""\n'
                '    if x:\n        return x  # µs\n    return 0\n')
    want = "def f(x):\n    if x:\n        return x\n    return 0"
    for doc_end in ("", "·S", "·S ≈ 2 → µs", "≈" * 16):  # the first without a non-ASCII character
        assert results.code_only("m.py", src(doc_end)) == want, doc_end
    one_line = 'class C:\n    """C · D."""\n    x = 1\n'
    assert results.code_only("m.py", one_line) == "class C:\n    x = 1"


def test_shape_map_presentation_reads_the_rows():
    """lib.shape_map on a small made-up record: the heatmap puts each ratio in its row and
    column, the summary counts what it says, the waterfall lists every variant."""
    import matplotlib
    matplotlib.use("Agg")
    from lib import shape_map

    def row(part, **kw):
        base = {"part": part, "dtype": "bfloat16", "causal": False, "B": 1, "H": 32, "Hkv": 8, "Sq": 1,
                "Sk": 4096, "D": 128, "us": 10.0, "vs_sdpa": 1.0, "vs_flash": 1.5, "gbps": 900.0, "splits": 1}
        return {**base, **kw}
    rows = [row("decode", Sq=1, vs_sdpa=0.5), row("decode", Sq=4, vs_sdpa=2.0),
            row("decode", Sq=1, B=8, vs_sdpa=1.25), row("prefill", Sq=512, Sk=512, H=16, Hkv=16, D=64, vs_sdpa=0.8),
            row("prefill", Sq=1024, Sk=1024, H=16, Hkv=16, D=64, causal=True, vs_sdpa=1.1),
            row("waterfall", variant="prefill build", vs_sdpa=0.4), row("waterfall", variant="both", vs_sdpa=1.0)]
    rec = {"env": {"date": "d", "gpu": "g", "commit": "c"}, "sha256": "x", "rows": rows}
    text = shape_map.summary(rec)
    assert "prefill grid: 0.80× to 1.10×" in text and "at or above it in 1 of 2 rows" in text
    assert "decoding grid, Sq 1: 0.50× to 1.25×" in text and "Sq 4: 2.00× to 2.00×" in text
    table = shape_map.waterfall_table(rec)
    assert "| prefill build |" in table and "| both |" in table and "0.40×" in table
    ys, xs, z = shape_map._grid(rows, "decode", lambda r: r["Sq"], lambda r: r["B"])
    assert ys == [1, 4] and xs == [1, 8] and z[0, 0] == 0.5 and z[0, 1] == 1.25 and z[1, 0] == 2.0
    assert str(z[1, 1]) == "nan"  # no row there: an empty cell, not a made-up value
    fig = shape_map.plot_shape_map(rec)
    assert len(fig.axes) == 3  # two heatmaps and the colour bar


def test_timeline_overlaps_of_two_consumers():
    """Consumer 1's softmax [10, 20) per tile; consumer 2 waits for S over [10, 15) and runs its
    softmax over [15, 25): half of consumer 1's softmax is under S, half beside a softmax."""
    from lib.plots import timeline_overlaps
    c1 = [[0, 10 + 30 * j, 20 + 30 * j, 25 + 30 * j] for j in range(14)]
    c2 = [[10 + 30 * j, 15 + 30 * j, 25 + 30 * j, 28 + 30 * j] for j in range(14)]
    tl = {"consumers": 2, "stamps": {"s": [[[0, 0, 0, 0]] * 14, c1, c2]}}
    got = timeline_overlaps(tl)["s"]
    assert got["under S"] == pytest.approx(0.5) and got["softmaxes"] == pytest.approx(0.5)


def test_timeline_tensor_share():
    """Two consumers, a key tile every 2000 clocks each (first S to first S), 128-key tiles at
    D128: each consumer's two products are 2·2·64·128·128 FLOP = 1024 clocks at 4096 per clock,
    so the pair keeps the tensor cores 2048 / 2000 > 100% busy: the stamps cannot be right, and the
    function says so by its number, not by hiding it."""
    from lib.plots import TENSOR_FLOP_PER_CLOCK, timeline_tensor_share
    assert TENSOR_FLOP_PER_CLOCK == 4096
    c = [[2000 * j, 2000 * j + 500, 2000 * j + 1500, 2000 * j + 1900] for j in range(14)]
    tl = {"D": 128, "consumers": 2, "stamps": {"s": [[[0, 0, 0, 0]] * 14, c, c]}}
    got = timeline_tensor_share(tl, 128)["s"]
    assert got["wgmma_clocks_per_tile"] == 2048 and got["period_clocks"] == 2000
    assert got["share"] == pytest.approx(1.024)
    tl["stamps"]["s"] = [[[0, 0, 0, 0]] * 14, [[4 * x for x in t] for t in c], [[4 * x for x in t] for t in c]]
    assert timeline_tensor_share(tl, 128)["s"]["share"] == pytest.approx(0.256)


def test_stage6_ablations_table():
    """Stage 6's steps as same-run ratios beside FlashAttention-3's Table 2 and the FA4 flag."""
    from lib.notebook import FA3_TABLE2, stage6_ablations_table
    rows = [{"kind": "schedule", "variant": v, "B": 4, "H": 16, "S": 8192, "D": 128, "causal": c,
             "dtype": "float16", "us": us * (0.5 if c else 1.0)}
            for c in (False, True) for v, us in (("no warp specialization", 5000.0), ("+ ping-pong", 4000.0),
                                                 ("+ intra-warpgroup overlap", 3200.0))]
    anchor = [{"B": 4, "H": 16, "Sq": 8192, "D": 128, "dtype": "float16", "causal": c,
               "tflops": {"fa4_sm90": 640, "fa4_sm90_no_intra_wg_overlap": 610}} for c in (False, True)]
    table = stage6_ablations_table({"rows": rows}, anchor)
    assert "1.25× (3,200 against 4,000 µs)" in table          # 4000 / 3200, full
    assert "1.25× (1,600 against 2,000 µs)" in table          # causal
    assert "1.56× (3,200 against 5,000 µs)" in table          # warp specialization, full
    assert f"{661 / 582:.2f}× (661 against 582 TFLOPS)" in table and FA3_TABLE2["without warp specialization"] == 570
    assert "1.05× (640 against 610)" in table


def test_waterfall_error_bars_span_the_rounds():
    """plot_waterfall draws a bar per row and, with round medians, an error bar from the slowest
    round's TFLOPS to the fastest's."""
    import matplotlib
    matplotlib.use("Agg")
    from lib.plots import plot_waterfall
    rows = [{"variant": "a", "tflops": 100.0, "us": 10.0, "us_rounds": [9.0, 10.0, 12.5]},
            {"variant": "b", "tflops": 200.0, "us": 5.0, "us_rounds": [5.0, 5.0, 5.0]}]
    ax = plot_waterfall(rows, "t")
    (bars,) = [c for c in ax.containers if hasattr(c, "errorbar") and c.errorbar is not None]
    segs = bars.errorbar.lines[2][0].get_segments()
    assert [tuple(s[:, 1]) for s in segs][0] == pytest.approx((80.0, 100.0 * 10 / 9))
    assert tuple(segs[1][:, 1]) == pytest.approx((200.0, 200.0))


def test_journey_reading_table():
    """One row per stage after 0; each step is this stage's speed against SDPA in its own run over
    the previous stage's; a stage missing at a shape leaves its step and the next one empty."""
    from lib.notebook import journey_reading_table
    runs = []
    for n, (t64, s64) in {0: (1000.0, 10.0), 1: (100.0, 11.0), 2: (50.0, 10.0), 3: (40.0, 10.0),
                          4: (40.0, 10.0), 5: (10.0, 10.0), 6: (5.0, 10.0)}.items():
        runs.append({"stage": n, "B": 16, "H": 16, "Sq": 2048, "D": 64, "dtype": "float16", "causal": False,
                     "us": t64, "sdpa_us": s64})
    table = journey_reading_table({"runs": runs})
    lines = table.splitlines()
    assert len(lines) == 2 + 6
    assert lines[2].startswith("| 1 |") and "| 11.00× | — |" in lines[2]   # (11/100) / (10/1000)
    assert "| 1.82× |" in lines[3]                                         # (10/50) / (11/100)
    assert "| 2.00× |" in lines[7]


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("Sq,Sk", [(37, 53), (53, 37), (64, 64), (1, 20)])
def test_flash_backward_matches_autograd(causal, Sq, Sk):
    """FlashAttention-2's block-by-block backward (lib.reference.flash_backward) against float64
    autograd of the reference: odd lengths that no block size divides, GQA 4/2, causal in both
    alignments (bottom-right with Sq > Sk leaves rows with no key: zero gradient there), blocks
    smaller than the sequence. In float64 it must agree to rounding; in float32, within a few
    float32 ulps of the gradients' size."""
    from lib.reference import attention_lse, flash_backward, reference_attention, reference_backward
    g = torch.Generator().manual_seed(Sq * 1000 + Sk)
    q = torch.randn(2, 4, Sq, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, Sk, 16, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(2, 4, Sq, 16, generator=g, dtype=torch.float64)
    out = reference_attention(q, k, v, causal=causal)
    lse = attention_lse(q, k, causal=causal)
    want = reference_backward(q, k, v, dout, causal=causal)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        got = flash_backward(q, k, v, out, dout, lse, causal=causal, block_m=16, block_n=8, dtype=dtype)
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            assert torch.isfinite(a).all(), name
            err = (a.double() - b).abs().max().item()
            assert err <= tol * max(1.0, b.abs().max().item()), (name, dtype, err)
    if causal == "bottom_right" and Sq > Sk:  # the first Sq − Sk rows see no key
        assert want[0][:, :, : Sq - Sk].abs().max().item() == 0.0


def test_flash_backward_skips_hidden_blocks_and_still_matches():
    """With top-left causal masking and small blocks, the blocks wholly past the diagonal are
    skipped (counted here by wrapping exp): fewer block products than the full grid, same answer."""
    from lib import reference as ref
    g = torch.Generator().manual_seed(7)
    q, k, v, dout = (torch.randn(1, 1, 32, 8, generator=g, dtype=torch.float64) for _ in range(4))
    out, lse = ref.reference_attention(q, k, v, causal=True), ref.attention_lse(q, k, causal=True)
    calls = []
    real_exp = torch.exp

    def counting_exp(x):
        calls.append(x.shape)
        return real_exp(x)
    torch.exp = counting_exp
    try:
        got = ref.flash_backward(q, k, v, out, dout, lse, causal=True, block_m=8, block_n=8, dtype=torch.float64)
    finally:
        torch.exp = real_exp
    assert len(calls) == 10  # 4 query blocks × 4 key blocks, 6 of them past the diagonal
    for a, b in zip(got, ref.reference_backward(q, k, v, dout, causal=True)):
        assert (a - b).abs().max().item() < 1e-10


def test_fp8_scaling_and_rotation():
    """e4m3 quantization puts each block's largest entry at 448; the Hadamard matrix is
    orthogonal; the incoherent rotation leaves Q·Kᵀ unchanged and spreads an outlier."""
    from lib import fp8
    x = torch.randn(2, 3, 100, 64, dtype=torch.float64)
    x[0, 1, 70, 5] = 1000.0
    q8, s = fp8.quantize(x, block=32)
    assert q8.dtype == fp8.E4M3 and s.shape == (2, 3, 100, 1)
    assert q8[0, 1, 70, 5].float().item() == fp8.E4M3_MAX            # the outlier's block top
    assert s[0, 1, 69].item() == s[0, 1, 64].item() != s[0, 1, 0].item()  # one scale per 32 rows
    err = (fp8.dequantize(q8, s) - x).abs() / (x.abs() + s)           # e4m3: 3 mantissa bits
    assert err.max().item() <= 2 ** -4 + 1e-6
    h = fp8.hadamard(64)
    assert torch.allclose(h @ h.T, torch.eye(64, dtype=torch.float64), atol=1e-12)
    with pytest.raises(ValueError):
        fp8.hadamard(48)
    q, k = torch.randn(1, 2, 30, 64, dtype=torch.float64), torch.randn(1, 2, 40, 64, dtype=torch.float64)
    q[0, 0, 3, 7] = 500.0
    qr, kr = fp8.incoherent(q, k, seed=3)
    assert torch.allclose(qr @ kr.transpose(-1, -2), q @ k.transpose(-1, -2), atol=1e-9)
    assert qr[0, 0, 3].abs().max().item() < 100.0                     # 500 spread over 64 columns


def test_fp8_emulation_reproduces_flashattention3s_ordering():
    """On FlashAttention-3's outlier inputs (N(0,1) + N(0,100)·Bernoulli(0.001)), the emulated FP8
    forward's error against float64: every variant finite and far above fp16's; the incoherent
    rotation cuts the per-tensor error by a fifth or more, block quantization alone helps a
    little, and on top of the rotation does a little better or a little worse: the ordering the
    paper's Table 3 reports (its numbers are for its kernel and shapes)."""
    from lib import fp8
    from lib.reference import reference_attention
    q, k, v = fp8.outlier_inputs(1, 2, 512, 128, seed=5)
    ref = reference_attention(q, k, v)
    half = fp8.rmse(reference_attention(q.half(), k.half(), v.half(), dtype=torch.float32), ref)
    got = {name: fp8.rmse(fp8.fp8_attention(q, k, v, **kw), ref)
           for name, kw in (("tensor", {}), ("block", {"block": 64}), ("rotated", {"rotate": True}),
                            ("both", {"block": 64, "rotate": True}))}
    assert all(math.isfinite(x) for x in got.values())
    assert min(got.values()) > 10 * half
    # seeds 5-7 measured here: rotated ÷ tensor 0.64-0.70, both ÷ rotated 0.94-1.12, block ÷ tensor 0.87-0.92
    assert got["rotated"] < 0.8 * got["tensor"] and got["both"] <= 1.15 * got["rotated"]
    assert got["block"] <= got["tensor"]


def test_fp8_p_fragment_needs_no_shuffle():
    """issue 25, item 3: with the keys of each k-step in fp8.key_order(), every byte of the e4m3
    A fragment of P·V comes from an accumulator of the same thread (same row, key π(k)), and
    a8_sources names which; π is a permutation of the 32 keys."""
    from lib import fp8
    order = fp8.key_order()
    assert sorted(order) == list(range(32))
    for kstep in (0, 1):
        sources = fp8.a8_sources(kstep)
        for t in range(128):
            held = {fp8.acc_element(t, j): j for j in range(64)}  # a 64 × 128-key S: 64 per thread
            for i in range(16):
                row, k = fp8.a8_element(t, i)
                want = (row, 32 * kstep + order[k])
                assert want in held, (t, i, want)  # the same thread holds that score
                assert held[want] == sources[i], (t, i)
    # and in the natural key order, three bytes in four would have to come from another thread
    elsewhere = 0
    for t in range(128):
        held = {fp8.acc_element(t, j) for j in range(64)}
        elsewhere += sum(fp8.a8_element(t, i) not in held for i in range(16))
    assert elsewhere == 128 * 16 * 3 // 4, elsewhere


def test_fp8_prepare_checks_and_quantizes():
    """issue 25's input rules, on the CPU: fp16/bf16 inputs quantized with one scale per (batch,
    K/V head) — an input far beyond e4m3's 448 comes back finite and within e4m3's rounding;
    e4m3 inputs need their descales, each float32 (B, H_kv) on q's device; mixed dtypes and
    descales with 16-bit inputs are refused."""
    from lib import fp8
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 6, 9, 64, generator=g).to(torch.bfloat16)
    k = (torch.randn(2, 3, 11, 64, generator=g) * 5000).to(torch.bfloat16)  # overflows e4m3 unscaled
    v = torch.randn(2, 3, 11, 64, generator=g).to(torch.bfloat16)
    q8, k8, v8, qd, kd, vd = fp8.prepare(q, k, v)
    assert {t.dtype for t in (q8, k8, v8)} == {fp8.E4M3} and qd.shape == kd.shape == vd.shape == (2, 3)
    for x, x8, d, group in ((q, q8, qd, 2), (k, k8, kd, 1), (v, v8, vd, 1)):
        back = x8.float() * d.repeat_interleave(group, dim=1)[:, :, None, None]
        assert torch.isfinite(back).all()
        assert ((back - x.float()).abs() <= x.float().abs() / 16 + d.max() * 2 ** -9).all()  # 3 mantissa bits
    assert k8.float().abs().max() == fp8.E4M3_MAX  # the largest entry lands on the top of the range
    assert fp8.prepare(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)[3] is qd
    with pytest.raises(ValueError, match="k_descale is missing"):
        fp8.prepare(q8, k8, v8, q_descale=qd, v_descale=vd)
    for bad in (qd.double(), qd[:, :1], qd.t().contiguous(), [1.0]):
        with pytest.raises(ValueError, match="v_descale must be a float32 tensor of shape"):
            fp8.prepare(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=bad)
    with pytest.raises(ValueError, match="descale factors go with e4m3"):
        fp8.prepare(q, k, v, q_descale=qd)
    with pytest.raises(TypeError, match="must all be float16, all bfloat16 or all float8"):
        fp8.prepare(q, k.half(), v)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        fp8.prepare(q[:, :5], k, v)


def test_fp8_v_for_pv_keeps_p_times_v():
    """Vᵀ in key_order within each 32-key k-step, zero-padded to whole k-steps: P with its columns
    taken in the same slot order, times that Vᵀ, is P·V (float64), at a key count that is not a
    multiple of 32; the layout is K-major (keys contiguous) as the FP8 wgmma's B operand needs."""
    from lib import fp8
    g = torch.Generator().manual_seed(2)
    v8 = (torch.randn(1, 2, 45, 64, generator=g) * 8).to(fp8.E4M3)
    vt = fp8.v_for_pv(v8)
    assert vt.shape == (1, 2, 64, 64) and vt.dtype == fp8.E4M3 and vt.stride(-1) == 1
    slot = torch.tensor([32 * j + pi for j in range(2) for pi in fp8.key_order()])  # position → key
    assert vt.float()[..., slot >= 45].abs().max() == 0  # the padded keys are zero
    assert torch.equal(vt.float()[0, 1, :, (slot == 7).nonzero().item()], v8.float()[0, 1, 7])
    p = torch.rand(1, 2, 7, 64, generator=g, dtype=torch.float64)
    p[..., 45:] = 0
    got = p[..., slot] @ vt.double().transpose(-1, -2)
    want = p[..., :45] @ v8.double()
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_ncu_source_page_reading(tmp_path):
    """lib.ncu on a profile the stage 6 notebook reads: every sample and execution is counted
    once, whether the instructions are cut into runs, grouped by execution count or read from a
    plain CSV; and a run boundary falls wherever the execution count changes."""
    import csv
    import gzip
    import shutil

    from lib import ncu
    path = (Path(__file__).resolve().parent.parent / "results" / "logs" / "2026-11-26-6e4cb88-h100"
            / "causal512-sass.csv.gz")
    kernels = ncu.load(path)
    assert any("attention_wgmma" in n for n in kernels) and any("cudnn" in n for n in kernels)
    # an independent count: the raw rows between the kernels' header lines
    raw, name = {}, None
    with gzip.open(path, "rt", newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                name = row[1]
                raw[name] = [0.0, 0.0]
            elif row and row[0].startswith("0x"):
                raw[name][0] += float(row[2].replace(",", ""))
                raw[name][1] += float(row[5].replace(",", ""))
    for kname, rows in kernels.items():
        total, segs = ncu.segments(rows)
        assert total == raw[kname][0] > 0
        assert sum(g["samples"] for g in segs) == total
        assert sum(g["instructions"] for g in segs) == len(rows)
        assert all(a["executed"] != b["executed"] for a, b in zip(segs, segs[1:]))
        groups = ncu.samples_by_count(rows, {"once": {segs[0]["executed"]}})
        assert sum(groups.values()) == total and groups["once"] >= segs[0]["samples"]
        assert sum(ncu._number(r[ncu.EXECUTED]) for r in rows) == raw[kname][1]
    plain = tmp_path / "page.csv"
    with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert ncu.load(plain).keys() == kernels.keys()
    with pytest.raises(ValueError, match="kernels named like"):
        ncu.kernel(kernels, "no such kernel")


def test_function_text_prefers_the_exact_kernel_name():
    """lib.sass.function_text: a kernel whose name is the start of another's (rate_f16 and
    rate_f16x2 in one module) is found by its own name, whichever the listing has first; a
    part of a name still finds the first kernel holding it (mangled C++ names)."""
    from lib.sass import function_text
    for order in ((0, 1), (1, 0)):
        parts = [("rate_f16x2", "MUFU.EX2.F16 R1, R2.H1"), ("rate_f16", "MUFU.EX2.F16 R3, R4")]
        listing = "header\n" + "".join(f"Function : {parts[i][0]}\n{parts[i][1]}\n" for i in order)
        assert "R3, R4" in function_text(listing, "rate_f16")
        assert "R2.H1" in function_text(listing, "rate_f16x2")
        assert function_text(listing, "f16x").startswith("rate_f16x2")
    with pytest.raises(ValueError):
        function_text("Function : a\nNOP\n", "b")


@cpu_only
def test_without_a_gpu_the_record_is_the_one_current_names(tmp_path, monkeypatch):
    """With several GPUs' records in results/, a machine without a GPU reads the one
    results/CURRENT names, whatever the files' modification times."""
    import os
    import time
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(results, "CURRENT", tmp_path / "CURRENT")
    for i, name in enumerate(("gpu-a.json", "gpu-b.json")):
        (tmp_path / name).write_text(json.dumps({"env": {"gpu": name}, "stages": {}, "runs": []}))
        os.utime(tmp_path / name, (time.time() + i, time.time() + i))
    assert results.load()["env"]["gpu"] == "gpu-b.json"  # no CURRENT: the newest
    (tmp_path / "CURRENT").write_text("gpu-a.json\n")
    assert results.load()["env"]["gpu"] == "gpu-a.json"
    assert (results.ROOT / "results" / "CURRENT").read_text().strip() in {
        p.name for p in (results.ROOT / "results").glob("*.json")}  # the repository's names a record


def test_a_record_under_way_is_not_read_as_a_whole(tmp_path, monkeypatch):
    """On a GPU whose own record holds only some entries (no stage rows yet), load() reads the
    record CURRENT names, not pieces of two GPUs' records; once its own has rows, its own.
    load_entry reads one entry of a given GPU's record either way."""
    import json
    from lib import results as R
    monkeypatch.setattr(R, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(R, "CURRENT", tmp_path / "CURRENT")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    (tmp_path / "old-gpu.json").write_text(json.dumps({"env": {"gpu": "old"}, "stages": {}, "runs": [{"stage": 0}]}))
    (tmp_path / "CURRENT").write_text("old-gpu.json\n")
    own = tmp_path / "nvidia-h200.json"
    own.write_text(json.dumps({"env": {"gpu": "NVIDIA H200"}, "stages": {}, "runs": [],
                               "train_step": {"rows": [1, 2]}}))
    assert R.load()["env"]["gpu"] == "old"
    assert R.load_entry("NVIDIA H200", "train_step")["rows"] == [1, 2]
    assert R.load_entry("NVIDIA H200", "backward") is None and R.load_entry("Other", "x") is None
    own.write_text(json.dumps({"env": {"gpu": "NVIDIA H200"}, "stages": {"0": {}}, "runs": [{"stage": 0}]}))
    assert R.load()["env"]["gpu"] == "NVIDIA H200"
