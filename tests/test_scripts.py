"""scripts/gpu_session.sh, run on any machine with a faked GPU environment: it refuses without
a GPU before touching anything, fails when a step fails, and replaces the committed notebooks
only when every step passed."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cpu_only

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_session.sh"


def _tree_digest(*dirs) -> str:
    h = hashlib.sha256()
    for d in dirs:
        for p in sorted(Path(d).rglob("*")):
            if p.is_file():
                h.update(str(p).encode() + p.read_bytes())
    return h.hexdigest()


def _fake_bin(tmp_path, *, gpu_listed: bool, torch_sees_gpu: bool) -> Path:
    """A bin/ with an nvidia-smi that lists a GPU (or none) and a python3 that answers the
    script's torch.cuda.is_available() check as told and runs everything else for real."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    if gpu_listed:
        smi.write_text('#!/bin/sh\ncase "$*" in *-L*) echo "GPU 0: Fake GPU (UUID: GPU-0)";; '
                       '*query*) echo "Fake GPU";; *) echo "Fake GPU table";; esac\n')
    else:
        smi.write_text('#!/bin/sh\necho "No devices were found"\nexit 6\n')
    py = bin_dir / "python3"
    py.write_text(f'#!/bin/sh\ncase "$*" in *torch.cuda.is_available*) exit '
                  f'{0 if torch_sees_gpu else 1};; esac\nexec "{sys.executable}" "$@"\n')
    for f in (smi, py):
        f.chmod(0o755)
    return bin_dir


def _run(script, tmp_path, bin_dir, **env):
    full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "OUT": str(tmp_path / "out"), "FA_WHEELS": str(tmp_path / "no-wheels"), **env}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=full_env,
                          timeout=300)


@pytest.mark.parametrize("gpu_listed,torch_sees_gpu,why", [
    (False, False, "nvidia-smi -L` lists none"),
    (True, False, "torch.cuda.is_available() is False"),
])
def test_refuses_without_gpu_and_touches_nothing(tmp_path, gpu_listed, torch_sees_gpu, why):
    before = _tree_digest(ROOT / "notebooks", ROOT / "results")
    readme = (ROOT / "README.md").read_bytes()
    r = _run(SCRIPT, tmp_path, _fake_bin(tmp_path, gpu_listed=gpu_listed,
                                         torch_sees_gpu=torch_sees_gpu))
    assert r.returncode == 3, r.stdout + r.stderr
    assert why in r.stderr and "refusing to run" in r.stderr
    assert "untouched" in r.stderr
    assert not (tmp_path / "out").exists()  # not even the log folder
    assert _tree_digest(ROOT / "notebooks", ROOT / "results") == before
    assert (ROOT / "README.md").read_bytes() == readme


def test_unknown_step_is_refused(tmp_path):
    r = _run(SCRIPT, tmp_path, _fake_bin(tmp_path, gpu_listed=True, torch_sees_gpu=True),
             FA_STEPS="bench timelin")
    assert r.returncode == 2 and "unknown step 'timelin'" in r.stderr


def _notebook(text: str) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": 1, "id": "c1", "metadata": {},
                       "outputs": [{"name": "stdout", "output_type": "stream", "text": [text]}],
                       "source": ["print('fresh output')"]}],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def sandbox(tmp_path):
    """A copy of the script in a small tree: the real lib/ and stages/, one tiny notebook."""
    tree = tmp_path / "repo"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, tree / "scripts")
    for name in ("lib", "stages"):
        (tree / name).symlink_to(ROOT / name)
    (tree / "results").mkdir()
    (tree / "README.md").write_text("readme\n")
    (tree / "notebooks").mkdir()
    (tree / "notebooks" / "tiny.ipynb").write_text(json.dumps(_notebook("committed output\n")))
    return tree


def test_failing_step_fails_the_run_and_keeps_the_notebooks(sandbox, tmp_path):
    nb = sandbox / "notebooks" / "tiny.ipynb"
    committed = nb.read_bytes()
    # bench fails at once with a usage error (exit 2), on a GPU machine too, measuring nothing
    r = _run(sandbox / "scripts" / "gpu_session.sh", tmp_path,
             _fake_bin(tmp_path, gpu_listed=True, torch_sees_gpu=True), FA_STEPS="bench notebooks",
             FA_BENCH_ARGS="--stages 99")
    out = tmp_path / "out"
    summary = (out / "summary.txt").read_text()
    assert r.returncode != 0, r.stdout + r.stderr
    assert "bench rc=2" in summary and "FAILED: bench (rc 2)" in summary, summary
    assert "invalid choice: 99" in (out / "logs" / "bench.log").read_text()
    assert "notebooks rc=0" in summary and "left as committed" in summary
    assert nb.read_bytes() == committed
    executed = (out / "executed-notebooks" / "tiny.ipynb").read_text()
    assert "fresh output" in executed
    assert (out / "gpu-run.tgz").exists()


def test_notebooks_replaced_when_every_step_passed(sandbox, tmp_path):
    nb = sandbox / "notebooks" / "tiny.ipynb"
    r = _run(sandbox / "scripts" / "gpu_session.sh", tmp_path,
             _fake_bin(tmp_path, gpu_listed=True, torch_sees_gpu=True), FA_STEPS="notebooks")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 replaced" in summary and "all steps passed" in summary
    assert "fresh output" in nb.read_text() and "committed output" not in nb.read_text()


@cpu_only
@pytest.mark.parametrize("args,message", [
    (["scripts/tile_sweep.py", "--record"], "none was found; nothing measured or recorded"),
    (["scripts/tile_sweep.py", "--stages", "2"], "stage(s) [2] offer no tile choices"),
    (["scripts/tile_sweep.py", "--interleaved", "--record"], "--interleaved rows are not the record's kind"),
    (["-m", "lib.one_call", "5", "throughput"], "needs a CUDA GPU and none was found"),
    (["-m", "lib.one_call", "9", "throughput"], "invalid choice: 9"),
    (["experiments/kernel_or_run/then_and_now.py", "4506624", "3", "long"], "needs a CUDA GPU and none was found"),
    (["scripts/launch_gap.py"], "needs a CUDA GPU; none was found"),
    (["scripts/shape_map.py", "--record"], "runs on sm_90 GPUs (H100/H200) only"),
    (["scripts/shape_map.py", "--parts", "splits", "--out", "splits.json"], "runs on sm_90 GPUs (H100/H200) only"),
    (["scripts/shape_map.py", "--parts", "splits", "--record"], "its rows go to --out, not into the record"),
    (["scripts/shape_map.py", "--fp8-kv", "--record"], "runs on sm_90 GPUs (H100/H200) only"),
    (["experiments/fp8_kv_decode/sanitize.py"], "needs an H100 or H200 and none was found"),
    (["experiments/fp8_decode_registers/sanitize.py"], "needs an H100 or H200 and none was found"),
    (["experiments/fp8_decode_registers/probe.py", "--quick"], "needs an H100 or H200 and none was found"),
    (["scripts/backward_bench.py", "--record"], "needs a CUDA GPU and none was found"),
    (["scripts/train_curve.py", "--record"], "trains on a CUDA GPU and none was found"),
    (["experiments/fp8_tile_probe/fp8_tile_probe.py"], "needs an H100 or H200 and none was found"),
    (["experiments/fp8_loop_probe/fp8_loop_probe.py"], "needs an H100 or H200 and none was found"),
    (["scripts/fp8_bench.py"], "needs an H100 or H200 and none was found"),
    (["scripts/fp8_tiles.py", "--record"], "needs an H100 or H200 and none was found"),
    (["scripts/fp8_waterfall.py", "--record"], "needs an H100 or H200 and none was found"),
    (["experiments/kernel_or_run/stage6_ab.py"], "stage 6 runs on sm_90 GPUs (H100/H200) only"),
    (["experiments/profile_pair/profile_pair.py", "1", "1", "1", "64", "64", "64"], "needs an H100 or H200"),
    (["experiments/carveout/carveout_ab.py"], "needs an H100 or H200 and none was found"),
    (["experiments/l2_promotion/l2_promotion_ab.py"], "run it at commit 3525efe"),
    (["experiments/tail_split/tail_split_ab.py"], "needs an H100 or H200 and none was found"),
    (["experiments/tail_split/queue_tail_probe.py"], "needs an H100 or H200 and none was found"),
    (["experiments/wave_tail/wave_tail.py"], "needs an H100 or H200 and none was found"),
    (["experiments/rows_past_end/rows_past_end_ab.py"], "needs an H100 or H200 and none was found"),
    (["experiments/place_in_round/place_probe.py"], "needs an H100 or H200 and none was found"),
    (["experiments/train_step_parts/probe.py", "--row", "1,2,2,64,64,1"], "needs an H100 or H200 and none was found"),
    (["experiments/backward_epilogue/probe.py", "--only", "post"], "needs an H100 or H200 and none was found"),
    (["experiments/backward_longest_first/probe_gqa.py"], "needs an H100 or H200 and none was found"),
    (["experiments/backward_longest_first/probe_map.py"], "needs an H100 or H200 and none was found"),
    (["experiments/backward_fp16_data/probe.py"], "needs an H100 or H200 and none was found"),
    (["experiments/backward_step_overheads/probe.py"], "needs an H100 or H200 and none was found"),
    (["experiments/backward_kv_regs/probe.py"], "needs an H100 or H200 and none was found"),
    (["experiments/backward_rows80/probe.py"], "needs an H100 or H200 and none was found"),
    (["experiments/backward_d128_end_switches/probe.py"], "needs an H100 or H200 and none was found"),
    (["experiments/train_step_rounds/probe_start.py"], "needs an H100 or H200 and none was found"),
    (["experiments/train_step_rounds/probe_phases.py"], "needs an H100 or H200 and none was found"),
])
def test_gpu_scripts_say_what_is_wrong_without_a_traceback(args, message, run_script):
    before = _tree_digest(ROOT / "results")
    r = run_script(args, cwd=ROOT, timeout=120)  # python3 <args>, torch imported already
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert _tree_digest(ROOT / "results") == before


def test_ci_runs_the_readme_test_command():
    """.ci/run extracts the test command after README's <!-- test-command --> marker with its
    own awk line; that line must still find the install-and-test command."""
    extract = next(ln for ln in (ROOT / ".ci" / "run").read_text().splitlines()
                   if ln.startswith("cmd=$(awk"))
    r = subprocess.run(["bash", "-c", f'{extract}; printf "%s" "$cmd"'], cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    assert r.stdout == 'python3 -m pip install -e ".[test,hf]" && python3 -m pytest', r.stdout


def test_shape_map_records_partial_rows_then_the_map(tmp_path, monkeypatch):
    """scripts/shape_map.py --record with the GPU parts replaced: every 10 rows land under
    "shape_map_partial" (what a run cut short keeps); a finished run writes "shape_map" and
    drops the partial rows. No GPU: the measurement itself is a stand-in."""
    import importlib.util
    import torch
    from lib import results as R
    spec = importlib.util.spec_from_file_location("shape_map_script", ROOT / "scripts" / "shape_map.py")
    sm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sm)
    monkeypatch.setattr(R, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(R, "capture_env", lambda: {"gpu": "Fake GPU", "commit": "abc", "date": "d"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    seen = []

    def fake_measure(row, opts=None, budget_s=0.3):
        saved = json.loads((tmp_path / "fake-gpu.json").read_text()) if (tmp_path / "fake-gpu.json").exists() else {}
        seen.append(len(saved.get("shape_map_partial", {}).get("rows", [])))
        row.update(us=1.0, vs_sdpa=1.0, vs_flash=1.0, passed=True, splits=1, packed=False, tiles=[128, 2, 3])
        return row
    monkeypatch.setattr(sm, "measure", fake_measure)
    monkeypatch.setattr(sm, "_fmt", lambda row: "row")
    monkeypatch.setattr(sys, "argv", ["shape_map.py", "--record", "--parts", "decode", "--dtype", "bfloat16"])
    assert sm.main() == 0
    n = len(list(sm.decode_rows(["bfloat16"], False)))
    assert n > 20 and seen[10] == 10 and seen[20] == 20 and seen[9] == 0  # saved every 10 rows
    data = json.loads((tmp_path / "fake-gpu.json").read_text())
    assert len(data["shape_map"]["rows"]) == n and "shape_map_partial" not in data
    # --resume: a run cut short after 20 rows goes on from them, measuring only the rest; a
    # partial record of another plan (or other sources) is not kept
    kept_rows = data["shape_map"]["rows"][:20]
    data["shape_map_partial"] = {"env": {}, "sha256": R.stage_sha256(sm.s6.INFO), "of": n, "rows": kept_rows}
    (tmp_path / "fake-gpu.json").write_text(json.dumps(data))
    seen.clear()
    monkeypatch.setattr(sys, "argv", ["shape_map.py", "--record", "--resume", "--parts", "decode", "--dtype", "bfloat16"])
    assert sm.main() == 0 and len(seen) == n - 20
    assert len(json.loads((tmp_path / "fake-gpu.json").read_text())["shape_map"]["rows"]) == n
    plan = [(r, None) for r in sm.decode_rows(["bfloat16"], False)]
    partial = {"shape_map_partial": {"sha256": "x", "of": n, "rows": kept_rows}}
    assert sm.resumable_rows(partial, plan, "x") == kept_rows
    assert sm.resumable_rows(partial, plan, "y") == [] and sm.resumable_rows(partial, plan[:-1], "x") == []


def test_fp8_tile_probe_compiles_offline():
    """issue 25's probe (one FP8 tile, both products) builds for sm_90a without a GPU and spills nothing."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fp8_tile_probe", ROOT / "experiments/fp8_tile_probe/fp8_tile_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    use = probe.compile_probe("sm_90a").resource_usage()["fp8_tile_probe"]
    assert use["spill_stores"] == 0 and use["spill_loads"] == 0, use



def test_fp8_loop_probe_compiles_offline():
    """issue 25's second step (the whole FP8 loop, one warpgroup) builds for sm_90a without a GPU:
    no spills, and ptxas neither serializes its wgmma nor injects waits."""
    import importlib.util
    import re
    spec = importlib.util.spec_from_file_location("fp8_loop_probe", ROOT / "experiments/fp8_loop_probe/fp8_loop_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    compiled = probe.compile_probe("sm_90a")
    use = compiled.resource_usage()["fp8_loop_probe"]
    assert use["spill_stores"] == 0 and use["spill_loads"] == 0, use
    assert not re.search(r"C75\d\d", compiled.log), compiled.log


def test_fp8_consumers_offline_edits_the_kernel_it_claims_to():
    """experiments/fp8_four_consumers/fp8_consumers_offline.py rewrites three lines of stages/stage7.cu in memory (the
    consumer limit and the setmaxnreg split): each must still be there, and the rewritten source
    must hold the split asked for (a stale line would make it compile the unchanged kernel)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fp8_consumers_offline", ROOT / "experiments/fp8_four_consumers/fp8_consumers_offline.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    src = script.source_with_regs(24, 120)
    assert "constexpr int PRODUCER_REGS = 24;" in src and "constexpr int CONSUMER_REGS = 120;" in src
    assert script.LIMIT not in src
    with pytest.raises(ValueError, match="more than an SM has"):
        script.source_with_regs(40, 128)  # 128·40 + 512·128 registers: more than an SM has


def test_mufu_half_rates_times_the_instructions_it_names():
    """experiments/mufu_half_rates/mufu_half_rates.py: each form's loop holds the MUFU opcode of that form (a form
    the compiler dropped, or a kernel found under another's name, fails), and the float32 form
    takes one MUFU.EX2 per exponential, as lib.microbench's own kernel does."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mufu_half_rates", ROOT / "experiments/mufu_half_rates/mufu_half_rates.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    per = script.mufu_per_exponential()
    assert set(per) == {name for name, _, _ in script.FORMS}
    assert per["f32"] == (1.0, {"MUFU.EX2": script.CHAINS})
    assert set(per["f16x2"][1]) == {"MUFU.EX2.F16"} and set(per["bf16x2"][1]) == {"MUFU.EX2.BF16"}
    assert set(per["f16x1"][1]) == {"MUFU.EX2.F16"} and per["f16x1"][0] == 1.0


def test_mufu_half_rates_counts_each_sm_from_its_first_start_to_its_last_end():
    """per_sm_clock: blocks of one SM that ran in turns share its span (two blocks of 100
    exponentials over 0-200 clocks: 1 per clock), blocks side by side too; median over SMs."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mufu_half_rates", ROOT / "experiments/mufu_half_rates/mufu_half_rates.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    in_turns = [(0, 0, 100), (0, 100, 200)]
    side_by_side = [(1, 5, 105), (1, 5, 105)]
    assert script.per_sm_clock(in_turns, 100) == 1.0
    assert script.per_sm_clock(side_by_side, 100) == 2.0
    assert script.per_sm_clock(in_turns + side_by_side + [(2, 0, 50)], 100) == 2.0


def test_fp8_exp_turns_ab_edits_the_kernel_it_claims_to():
    """experiments/fp8_exp_turns/fp8_exp_turns_ab.py edits stages/stage7.cu in memory: every edit must still find
    its line once (else the script stops), and the edited source must take the turn in
    softmax_tile and give it in to_operand, with softmax_begin/end no longer taking it."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fp8_exp_turns_ab", ROOT / "experiments/fp8_exp_turns/fp8_exp_turns_ab.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    src = script.exp_turns_source()
    assert src.count("turn_zero()") == 3 and "if (0) take_turn(c);" in src and "if (0) give_turn(c);" in src
    tile = src[src.index("void softmax_tile("):src.index("void rescale(")]
    assert "named_bar_sync(TURN_BAR + c" in tile and tile.index("named_bar_sync") < tile.index("fast_exp2(x)")
    operand = src[src.index("void to_operand("):src.index("void take_turn(")]
    assert "named_bar_arrive(TURN_BAR + (c + 1) % CONSUMERS" in operand


def test_fp8_four_consumers_ab_edits_the_kernel_it_claims_to():
    """experiments/fp8_four_consumers/fp8_four_consumers_ab.py: its four edits of stages/stage7.cu still find their
    lines, four consumers get a setmaxnreg split within the 96 registers 640 threads start with,
    and three-consumer builds keep theirs."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fp8_four_consumers_ab", ROOT / "experiments/fp8_four_consumers/fp8_four_consumers_ab.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    src = script.four_consumer_source()
    assert script.LIMIT not in src and "BLOCK_N == 64 ||" in src
    assert "PRODUCER_REGS = CONSUMERS == 4 ? 32 :" in src and "CONSUMER_REGS = CONSUMERS == 4 ? 112 :" in src
    assert 128 * 32 + 4 * 128 * 112 <= (65536 // 640) // 8 * 8 * 640
    assert "CONSUMERS == 3 ? 32" in src and "CONSUMERS == 3 ? 160" in src


def test_readme_is_short_and_relative_links_resolve():
    """README.md stays a front page: at most 15,000 characters, its generated results block
    (float16's rows; every dtype's in docs/results.md) included. Every relative link in
    README.md and docs/*.md (markdown links and images) points to a file or folder that exists."""
    import re
    readme = (ROOT / "README.md").read_text()
    assert len(readme) <= 15_000, f"README.md has {len(readme)} characters (limit 15,000)"
    link = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not links in code blocks
        for target in link.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
                continue  # a URL, mailto: or an anchor in the same page
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "relative links to missing files:\n" + "\n".join(broken)


MAX_SCRIPTS = 15  # issue 49: every file left writes a record entry or runs a GPU session


def test_scripts_folder_stays_small_and_moved_paths_resolve():
    """Issue 49 asks for at most 15 files in scripts/: the commands that write
    an entry of results/<gpu>.json or run GPU sessions (one-off probes live in
    experiments/<question>/, each with a README). And every path `scripts/<name>` or
    `experiments/<...>` that README.md, docs/*.md, experiments/README.md, lib/*.py or tests/*.py
    mentions exists (relative to the repository root; a leading ../ is dropped), so that a moved
    script leaves no stale mention behind. Templates (`<folder>`, `{name}`, `*`) are skipped."""
    import re
    files = sorted(p.name for p in (ROOT / "scripts").iterdir() if p.is_file() and not p.name.startswith("."))
    assert len(files) <= MAX_SCRIPTS, (f"scripts/ holds {len(files)} files (at most {MAX_SCRIPTS}; issue 49 asks for 15): "
                                       "move one-off probes to experiments/<question>/")
    mention = re.compile(r"(?<![\w./-])(?:\.\./)*((?:scripts|experiments)/[\w./-]*)([*<{]?)")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md",
             *sorted((ROOT / "lib").glob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]
    missing = []
    for page in pages:
        for path, template in mention.findall(page.read_text()):
            path = path.rstrip(".,-")
            if template:
                continue  # a template such as experiments/<folder>/ or scripts/{name}
            if not (ROOT / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, "mentioned paths that do not exist:\n" + "\n".join(sorted(set(missing)))
