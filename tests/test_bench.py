"""The main job's command line (lib.bench) and the tables it prints and records (lib.results)."""
import copy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cpu_only, gpu
import stages
from lib import bench, results

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "lib.bench", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------
# command line

def test_help_is_fast_shows_defaults_and_imports_no_torch():
    t0 = time.time()
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "lib.bench", "--help"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    elapsed = time.time() - t0
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # help wraps its lines
    assert "(default: 1.0)" in text and "(default: ['float16'])" in text
    assert "--all" in text and "long (B4 H16 S8192 D128)" in text
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines()}
    assert "torch" not in imported and "numba" not in imported
    assert elapsed < 2.0, f"--help took {elapsed:.1f} s"


def test_unknown_stage_is_a_usage_error_not_a_traceback():
    r = _bench("--stages", "9")
    assert r.returncode == 2
    assert "invalid choice: 9" in r.stderr and "usage:" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("n,script", [(7, "scripts/fp8_bench.py"), (8, "scripts/backward_bench.py")])
def test_stages_7_and_8_point_to_their_own_benchmarks(n, script):
    """Stage 7 (FP8) and stage 8 (the backward) are timed by their own scripts: lib.bench says
    so and exits non-zero (alone or among forward stages) before any stage runs."""
    assert (ROOT / script).is_file()
    for args in (["--stages", str(n)], ["--stages", "6", str(n)]):
        r = _bench(*args)
        assert r.returncode == 2, r
        assert f"stage {n}" in r.stderr and f"python {script}" in r.stderr, r.stderr
        assert "invalid choice" not in r.stderr and "usage:" not in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and r.stdout == "", r
    assert bench.OWN_BENCHMARKS[n] == script and n in stages.BEYOND


@pytest.mark.parametrize("args,message", [(["--shapes", "huge"], "invalid choice: 'huge'"),
                                          (["--stages", "x"], "invalid int value"),
                                          (["--dtype", "float8"], "invalid choice"),
                                          (["--record", "--shapes", "latency"],
                                           "--record replaces every recorded row"),
                                          (["--record", "--dtype", "bfloat16", "float16"],
                                           "list float16 first in --dtype")])
def test_bad_options_are_usage_errors(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(args)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_plan_orders_shapes_and_adds_the_sweep():
    std = bench.plan(["latency", "long"], sweep=False)
    assert [(p[1], p[6]) for p in std] == [("latency", False), ("latency", True),
                                           ("long", False), ("long", True)]
    assert len(bench.plan(["latency"], sweep=True)) == 2 + 2 * 2 * len(bench.SWEEP_SEQS)


def test_dtype_takes_several_and_the_sweep_runs_in_the_first_only():
    a = bench.parser().parse_args(["--dtype", "float16", "bfloat16"])
    assert a.dtype == ["float16", "bfloat16"]
    assert bench.parser().parse_args([]).dtype == ["float16"]
    steps = bench.plan(["latency", "long"], sweep=True, dtypes=["float16", "bfloat16"])
    std = [(p[1], p[6], p[7]) for p in steps if p[0] == "standard"]
    assert std == [(n, c, d) for d in ("float16", "bfloat16") for n in ("latency", "long")
                   for c in (False, True)]
    sweep = [p for p in steps if p[0] == "sweep"]
    assert len(sweep) == 2 * 2 * len(bench.SWEEP_SEQS) and {p[7] for p in sweep} == {"float16"}
    assert {p[7] for p in bench.plan(["latency"], True, ["bfloat16", "float16"])
            if p[0] == "sweep"} == {"bfloat16"}
    assert steps.index(sweep[0]) > max(steps.index(p) for p in steps if p[0] == "standard")


def test_predicted_slow_shape_is_skipped_with_reason():
    import stages
    import torch
    row = bench.measure(stages.get(0), 4, 16, 8192, 8192, 128, torch.float16, False,
                        suite="standard", max_call_s=1.0, predicted_s=5.2)
    assert row["skipped"].startswith("predicted 5.2 s per call > 1 s") and "--all" in row["skipped"]
    assert "us" not in row


def test_progress_line():
    row = {"stage": 3, "B": 16, "H": 16, "Sq": 2048, "Sk": 2048, "D": 64, "dtype": "float16",
           "causal": True, "us": 1957.0, "tflops": 70.2, "sdpa_us": 346.1, "passed": True}
    assert bench.progress_line(row) == ("[stage 3] B16 H16 S2048 D64 float16 causal: "
                                        "1,957.0 µs (70.2 TFLOPS), 0.18x SDPA, pass")
    row.update(host_us=40.0, sdpa_host_us=20.5, passed=False)
    assert bench.progress_line(row).endswith("host 40.0 µs/call (SDPA 20.5), FAIL")
    skipped = {k: row[k] for k in ("stage", "B", "H", "Sq", "Sk", "D", "dtype", "causal")}
    assert bench.progress_line({**skipped, "skipped": "too slow"}).endswith(": skipped, too slow")


@cpu_only
def test_cpu_mode_filters_the_recorded_table_and_names_ignored_options(capsys):
    assert bench.main(["--stages", "2", "--shapes", "latency", "--sweep", "--max-call-s", "3"]) == 0
    cap = capsys.readouterr()
    rows = [ln for ln in cap.out.splitlines() if ln.startswith("| ") and "---" not in ln
            and not ln.startswith("| stage") and ln.count("|") == 12]  # the main table, not host times
    assert len(rows) == 2 and all(ln.startswith("| 2 | B1 H8 S512 D64 | float16 |") for ln in rows)
    assert "% of matmul peak" in cap.out and "Recorded results (not measured here)" in cap.out
    assert "--sweep, --max-call-s only change what is timed on a GPU" in cap.err
    assert "ignored here" in cap.err
    summary = cap.out.strip().splitlines()[-1]
    assert summary.startswith("summary (CPU mode): compiled offline: stages 2; 2 recorded rows "
                              "printed from results/"), summary


@cpu_only
def test_cpu_mode_record_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--record", "--stages", "1"])
    assert e.value.code == 2 and "--record needs a GPU" in capsys.readouterr().err


@cpu_only
def test_cpu_mode_summary_counts_simulator_checks(capsys):
    assert bench.main(["--stages", "0", "--shapes", "latency"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("summary (CPU mode): simulator checks 12 passed, 0 failed "
                              "(stages 0); 2 recorded rows"), summary


# ---------------------------------------------------------------------------------------------
# tables

def _row(stage, sdpa_us, **kw):
    r = {"stage": stage, "suite": "standard", "B": 1, "H": 8, "Sq": 512, "Sk": 512, "D": 64,
         "dtype": "float16", "causal": False, "us": 100.0, "tflops": 1.0, "sdpa_us": sdpa_us,
         "sdpa_flash_us": 20.0, "max_abs_err": 1e-4, "passed": True}
    r.update(kw)
    return r


def test_sdpa_ratio_uses_the_median_and_flags_outliers():
    runs = [_row(0, 10.0), _row(1, 10.2), _row(2, 12.0)]  # stage 2's SDPA ran 18% slow
    medians = results.sdpa_medians(runs)
    assert medians[(results.shape_key(runs[0]), "sdpa_us")] == 10.2
    table = results.markdown_table(runs).splitlines()
    assert "| 0.102×" in table[4] and "0.102×†" in table[4]  # 10.2 / 100, flagged
    assert "0.102× |" in table[2] and "†" not in table[2]    # 10.0 is within 5% of 10.2
    notes = results.sdpa_outliers(runs, medians)
    assert len(notes) == 1 and "stage 2" in notes[0] and "+18%" in notes[0]
    assert "own ratio 0.12×" in notes[0]


def test_unsteady_rows_are_flagged_and_older_rows_named():
    steady = _row(5, 10.0, us_rounds=[100.0, 101.0, 99.0, 100.5, 100.0])
    unsteady = _row(6, 10.0, us_rounds=[100.0, 101.0, 180.0, 100.5, 100.0])
    old = _row(4, 10.0)  # recorded before the timing took turns: no rounds
    table = results.markdown_table([old, steady, unsteady]).splitlines()
    assert "| 100.0 |" in table[2] and "| 100.0 |" in table[3] and "| 100.0‡ |" in table[4]
    notes = results.unsteady_rows([old, steady, unsteady])
    assert len(notes) == 1 and notes[0].startswith("‡ stage 6") and "180.0 µs" in notes[0]
    assert "stage 4: recorded before" in results.ratio_legend("x", [old, steady])
    assert "recorded before" not in results.ratio_legend("x", [steady])


def test_host_bound_sdpa_is_marked_against_its_held_time():
    """§ where scripts/launch_gap.py found SDPA host-bound and its held time well below the
    median the table divides by; not where SDPA is GPU-bound, whatever the two figures say."""
    runs = [_row(5, 20.0), _row(6, 21.0), _row(6, 500.0, B=16, us=1000.0)]

    def gap(B, held, host, gpu):
        return {"B": B, "H": 8, "S": 512, "D": 64, "causal": False, "call": "SDPA default",
                "held_us": held, "host_us": host, "gpu_unflushed_us": gpu}
    data = {"launch_gap": {"env": {"commit": "abc1234", "date": "d"},
                           "rows": [gap(1, 12.0, 20.0, 11.0), gap(16, 400.0, 520.0, 480.0)]}}
    held = results.held_sdpa(data)
    assert list(held.values()) == [12.0]  # the B16 call is GPU-bound: no mark
    medians = results.sdpa_medians(runs)
    table = results.markdown_table(runs, medians=medians, held=held).splitlines()
    assert "×§" in table[2] and "×§" in table[3] and "§" not in table[4]
    notes = results.launch_gap_notes(runs, medians, held, data["launch_gap"]["env"])
    assert len(notes) == 1 and "12.0 µs" in notes[0] and "abc1234" in notes[0]
    assert "1.71×" in notes[0]  # median 20.5 over held 12
    # a stage whose own call is host-bound and event-timed far above its held GPU time
    launch = _row(1, 20.0, us=180.0, host_us=140.0, host_gpu_us=48.0)
    flushed = _row(2, 20.0, us=77.0, host_us=58.0, host_gpu_us=60.0)  # L2 flush, not launch
    table = results.markdown_table([launch, flushed]).splitlines()
    assert "| 180.0§ |" in table[2] and "| 77.0 |" in table[3]
    notes = results.launch_gap_notes([launch, flushed], {}, {}, None)
    assert len(notes) == 1 and notes[0].startswith("§ stage 1") and "140.0 µs" in notes[0]


def test_other_dtypes_get_their_own_table_after_float16s():
    fp16 = [_row(5, 10.0), _row(6, 10.0)]
    bf16 = [_row(6, 11.0, dtype="bfloat16", us=50.0)]
    alone = results.markdown_table(fp16)
    both = results.markdown_table([fp16[0], bf16[0], fp16[1]])  # as save() orders a stage's rows
    assert both.startswith(alone + "\n\nbfloat16 rows")
    tail = both[len(alone):].splitlines()
    assert tail[-3].startswith("| stage") and tail[-1].startswith("| 6 | B1 H8 S512 D64 | bfloat16")
    assert "0.22×" in tail[-1]  # against bf16's own SDPA time (11 / 50), not fp16's
    assert "bfloat16" not in alone


def test_recorded_table_matches_the_readme():
    """The README's results block is what lib.results generates from the recorded file (the
    same columns as the table the main job prints)."""
    data = results.load()
    readme = (ROOT / "README.md").read_text()
    block = readme.split(results.TABLE_BEGIN, 1)[1].split(results.TABLE_END, 1)[0].strip()
    plot = next(ln for ln in block.splitlines() if ln.startswith("![")).split("](")[1][:-1]
    assert block == results.readme_block(data, plot), \
        "README table out of date: regenerate it with lib.results (python -m lib.bench --record)"
    docs = results.DOCS_RESULTS.read_text()
    full = docs.split(results.TABLE_BEGIN, 1)[1].split(results.TABLE_END, 1)[0].strip()
    assert full == results.docs_block(data, plot), "docs/results.md out of date (lib.bench --record)"
    assert "bfloat16" not in block or "bfloat16" in full
    header = next(ln for ln in block.splitlines() if ln.startswith("| stage"))
    assert "% of matmul peak" in header and "vs SDPA default" in header
    printed = results.results_block(data, results.standard_runs(data)[:2])
    assert header in printed.splitlines()


def test_provenance_names_each_stages_commit():
    data = {"env": {"gpu": "G", "commit": "bbbbbbb", "date": "d2"}, "_path": "f.json",
            "stages": {"0": {"commit": "aaaaaaa", "date": "d1"},
                       "1": {"commit": "aaaaaaa", "date": "d1"},
                       "2": {"commit": "bbbbbbb", "date": "d2"}}}
    text = results.provenance(data)
    assert "stages 0–1 at commit aaaaaaa, d1; stage 2 at commit bbbbbbb, d2" in text
    assert "commit aaaaaaa, d1;" in results.provenance(data, [0, 1])
    same = copy.deepcopy(data)
    same["stages"]["2"] = {"commit": "aaaaaaa", "date": "d1"}
    assert "commit aaaaaaa, d1; file" in results.provenance(same)


def test_host_table_only_with_host_times():
    assert results.host_table([_row(0, 10.0)]) == ""
    table = results.host_table([_row(0, 10.0, host_us=45.5, host_gpu_us=30.0, host_calls=300,
                                      sdpa_host_us=20.0, sdpa_host_gpu_us=12.5)])
    assert "300 back-to-back calls" in table
    assert "| 0 | B1 H8 S512 D64 | float16 | no | 45.5 | 30.0 | 20.0 | 12.5 |" in table


# ---------------------------------------------------------------------------------------------
# host time per call (GPU)

@gpu
def test_time_host_is_at_least_the_gpu_time():
    import torch

    from lib.timing import time_host
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    t = time_host(lambda: a @ a, calls=50)
    assert t.calls == 50 and t.gpu_us > 0
    # back-to-back calls cannot finish faster than the GPU runs them
    assert t.host_us >= 0.9 * t.gpu_us, t


# ---------------------------------------------------------------------------------------------
# the GPU path's plumbing, on any machine: measurements faked, everything around them real

@pytest.fixture
def fake_gpu(monkeypatch):
    """lib.bench in GPU mode with `measure` faked past its real skip rule: stage 0 runs at
    0.4 TFLOPS (so the long shape is predicted slow), others at 300; stage 1 fails its check."""
    import torch

    import lib.simulator
    monkeypatch.setattr(lib.simulator, "HAS_GPU", True)
    monkeypatch.setattr(lib.simulator, "banner", lambda: "GPU mode: fake")
    gpu_name = results.load()["env"]["gpu"]  # read before faking: on a GPU, load() asks the name
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: gpu_name)
    real_measure = bench.measure

    budgets = set()

    def fake_measure(mod, B, H, Sq, Sk, D, dtype, causal, *, suite, max_call_s,
                     predicted_s=None, host_calls=0, budget_s=1.0):
        budgets.add(budget_s)
        if predicted_s is not None and predicted_s > max_call_s:
            return real_measure(mod, B, H, Sq, Sk, D, dtype, causal, suite=suite,
                                max_call_s=max_call_s, predicted_s=predicted_s)
        from lib.reference import attention_flops
        n = mod.INFO.number
        tflops = 0.4 if n == 0 else 300.0
        us = attention_flops(B, H, Sq, Sk, D, causal) / tflops / 1e6
        row = {"stage": n, "suite": suite, "B": B, "H": H, "Sq": Sq, "Sk": Sk, "D": D,
               "dtype": "float16", "causal": causal, "us": us, "tflops": tflops,
               "sdpa_us": 0.5 * us, "sdpa_flash_us": us, "max_abs_err": 1e-4, "passed": n != 1}
        if host_calls:
            row.update(host_us=us + 20, host_gpu_us=us, host_calls=host_calls,
                       sdpa_host_us=0.5 * us + 10, sdpa_host_gpu_us=0.5 * us)
        return row

    monkeypatch.setattr(bench, "measure", fake_measure)
    monkeypatch.setattr(results, "save", lambda *a, **k: pytest.fail("recorded"))
    # compiling ahead (tests/test_compile_ahead.py) needs the GPU's arch and SMs: said, not done
    monkeypatch.setattr(bench, "compile_ahead", lambda mods, shapes, sweep, dtypes: bench.log(
        f"compile ahead: stages {[m.INFO.number for m in mods]} {shapes} sweep={sweep} {dtypes}"))
    return budgets


def test_gpu_path_progress_skips_and_summary(fake_gpu, capsys):
    assert bench.main(["--stages", "0", "5", "--shapes", "latency", "long"]) == 0
    cap = capsys.readouterr()
    # the builds compiled ahead, before the first row, from the rows the run asked for
    assert cap.err.startswith("compile ahead: stages [0, 5] ['latency', 'long'] sweep=False "
                              "['float16']\n[stage 0] "), cap.err
    assert "[stage 0] B1 H8 S512 D64 float16 full: " in cap.err and "0.5x SDPA, host" in cap.err
    assert "[stage 0] B4 H16 S8192 D128 float16 causal: skipped, predicted" in cap.err
    assert "[stage 5] B4 H16 S8192 D128 float16 causal: " in cap.err
    assert "| 0 | B4 H16 S8192 D128 | float16 | no | skipped |" in cap.out
    assert "host µs/call (SDPA)" in cap.out  # the latency rows carry host times
    assert "| % of matmul peak |" in cap.out and "matmul rate recorded for this GPU" in cap.out
    summary = cap.out.strip().splitlines()[-1]
    assert summary.startswith("summary (GPU mode): 6 rows timed, stages 0, 5; 2 skipped; "
                              "checks 6 passed, 0 failed; printed only"), summary
    assert fake_gpu == {bench.RUN_BUDGET_S}  # a plain run times lightly; a record (below) fully


def test_gpu_path_all_skips_nothing_and_failed_check_records_nothing(fake_gpu, capsys):
    assert bench.main(["--stages", "0", "1", "--all", "--record"]) == 1
    cap = capsys.readouterr()
    assert "skipped" not in cap.err
    summary = cap.out.strip().splitlines()[-1]
    # --record adds the sweep: 6 standard and 24 sweep rows per stage; stage 1 fails them all
    assert "60 rows timed, stages 0, 1; 0 skipped; checks 30 passed, 30 failed" in summary, summary
    assert "NOT recorded: 30 row(s) failed the correctness check" in summary
    assert fake_gpu == {bench.RECORD_BUDGET_S}


def test_record_keeps_the_recorded_ceilings_unless_asked(monkeypatch):
    """lib.bench --record keeps the ceilings recorded for the GPU model (they are the GPU's, and
    the notebooks divide by them); --ceilings, or none recorded, measures them, and says when."""
    from lib import bench, microbench
    measured = {"matmul_TFLOPS": 700.0, "copy_GBps": 4000.0}
    monkeypatch.setattr(microbench, "measure_ceilings", lambda: dict(measured))
    env = {"commit": "abc1234", "date": "2026-11-29 12:00 UTC"}
    recorded = {"matmul_TFLOPS": 682.0, "copy_GBps": 4225.0}
    assert bench.record_ceilings(recorded, env, again=False) == recorded
    for before, again in ((recorded, True), ({}, False)):
        got = bench.record_ceilings(before, env, again=again)
        assert got == {**measured, "measured_at": "commit abc1234, 2026-11-29 12:00 UTC"}, (before, again)
