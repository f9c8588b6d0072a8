#!/usr/bin/env bash
# Every GPU step of a session in one go, on a machine with a CUDA GPU:
#   bench      the benchmark in record mode (results/<gpu>.json, plots, README table)
#   gap        SDPA and stages 3, 5, 6 timed with and without the GPU held (scripts/launch_gap.py)
#   tiles      the tile choices of stages 4 and 5 (scripts/tile_sweep.py --record)
#   stage6     stage 6 idea by idea (scripts/stage6_schedules.py --record)
#   stage5     stage 5 idea by idea: waterfall and leave-one-out (scripts/stage5_ideas.py --record)
#   shapemap   stage 6 against SDPA at prefill and decode shapes (scripts/shape_map.py --record)
#   splits     issue 21's decoding experiment: split counts × combine placement at the decode rows
#              below SDPA (scripts/shape_map.py --parts splits; logs only)
#   fp8        stage 7 (FP8, a draft until a GPU has checked it): the loop probe, its tests, its
#              benchmark against stage 6, SDPA and the GEMM ceilings (logs only: no record yet)
#   profile    Nsight Compute on one call of every CUDA C++ stage (results/profiles/)
#   notebooks  every notebook executed with outputs
#   pytest     the whole suite with nbval (stages running for real)
#   sanitize   compute-sanitizer memcheck and racecheck on every stage at small and odd shapes
# Logs, a summary, the executed notebooks (executed-notebooks/) and gpu-run.tgz (results,
# README, notebooks, logs, summary) end up in $OUT (default ./gpu-out).
#
# Nothing a failed or GPU-less run does can overwrite the recorded work: with no GPU the script
# refuses before running anything (exit 3; an unknown step name: exit 2); notebooks are executed into a scratch copy and replace the
# committed ones only when every step of the run passed; a profile replaces its report only
# when ncu succeeded; lib.bench --record writes nothing when a correctness check fails. Any
# failing step makes the script exit non-zero, and the summary names it.
#
# Usage (repo root):  bash scripts/gpu_session.sh
#   FA_STEPS       a subset of the steps, run in the order given; e.g. FA_STEPS="pytest sanitize"
#                  when one call has a time limit (default: all of them, in the order above)
#   FA_BENCH_ARGS  extra arguments for lib.bench, e.g. "--stages 5"
#   FA_NOTEBOOKS   the notebooks to execute (default: notebooks/*.ipynb)
#   FA_PYTEST_ARGS extra arguments for pytest, e.g. "tests/test_stage6.py" for a subset
#   FA_GIT_COMMIT  the commit being measured, when the tree has no .git (or a stale one: a
#                  copied working tree); always set it when the tree is not a fresh checkout
# On the curriculum's H100 machine (no package registry, numpy 2.5), first fetch wheels on a
# CPU machine with `bash scripts/fetch_wheels.sh` and carry .whl/ along: they are
# installed here before anything else.
#
# A new step: write a function step_NAME that calls `run NAME command...` (once or several
# times with distinct names), and add NAME to ALL_STEPS.
set -uo pipefail
cd "$(dirname "$0")/.."
ALL_STEPS="bench gap tiles stage6 stage5 shapemap splits fp8 profile notebooks pytest sanitize"

refuse() {  # refuse WHY: nothing has run yet
  echo "gpu_session.sh: $1" >&2
  echo "gpu_session.sh: refusing to run: nothing was run, and results/, notebooks/ and README.md are untouched." >&2
  exit 3
}

FAILED=()
run() {  # run NAME CMD...: log to $OUT/logs/NAME.log, record the exit code in the summary
  local name=$1; shift
  local t0
  t0=$(date +%s)
  echo "== $name: $*"
  "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/logs/$name.log"
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
  [ "$rc" -eq 0 ] || FAILED+=("$name (rc $rc)")
  return "$rc"
}

commit_short() { echo "${FA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"; }

step_bench() {
  # --max-call-s 10 keeps recording stage 0 at the long shape (about 5 s a call), as before
  # the 1 s default of an interactive run.
  # shellcheck disable=SC2086  # FA_BENCH_ARGS is a list of arguments
  # Both dtypes: a record replaces all of a stage's rows, so an fp16-only run would drop the
  # bf16 rows the record holds (the sweep runs in fp16 only).
  run bench python3 -m lib.bench --record --sweep --max-call-s 10 --dtype float16 bfloat16 ${FA_BENCH_ARGS:-}
}

step_gap() {  # how much of an event-timed call the host's launch was (the tables mark it: §)
  run gap python3 scripts/launch_gap.py --shapes latency throughput long --record
}

step_tiles() {  # every tile choice of stages 4 and 5 (and stage 5 unswizzled), next to the table
  run tiles python3 scripts/tile_sweep.py --record
}

step_stage6() {  # stage 6 idea by idea (schedules), its tile choices and a measured timeline
  run stage6 python3 scripts/stage6_schedules.py --record
}

step_shapemap() {  # stage 6 at the shapes models run: prefill grid, decoding, decoding waterfall
  # shellcheck disable=SC2086  # FA_SHAPEMAP_ARGS is a list of arguments, e.g. "--dtype bfloat16"
  run shapemap python3 scripts/shape_map.py --record ${FA_SHAPEMAP_ARGS:-}
}

step_splits() {  # where split-KV's time goes at the decode rows below SDPA (an experiment, not a record)
  run splits python3 scripts/shape_map.py --parts splits --dtype bfloat16 --out "$OUT/logs/splits.json"
}

step_fp8() {  # stage 7 step by step: the loop's arithmetic alone, then the kernel's tests, then its speed
  # No -x: a first GPU run should show which builds fail (D 64's 64-byte swizzle, V_IN_KERNEL, ...);
  # a time limit in case a kernel waits forever on a barrier.
  run fp8probe timeout 300 python3 experiments/fp8_loop_probe/fp8_loop_probe.py
  run fp8tests timeout 600 python3 -m pytest -q tests/test_stage7.py
  run fp8bench timeout 600 python3 scripts/fp8_bench.py --out "$OUT/logs/fp8_bench.json"
  local tool  # small shapes (racecheck is slow): both producers (Vᵀ by the pass, and transposed in the kernel), persistent blocks, rings that wrap
  for tool in memcheck racecheck synccheck; do
    run "fp8-sanitize-$tool" timeout 600 compute-sanitizer --tool "$tool" --error-exitcode 9 --kernel-name kns=attention \
      --report-api-errors no python3 -m pytest -x -q tests/test_stage7.py -k sanitizers
  done
}

step_stage5() {  # stage 5 idea by idea: the waterfall from stage-4-like and the leave-one-out variants
  run stage5 python3 scripts/stage5_ideas.py --record
}

# Raw shared-memory counters, so the notebooks show bank conflicts as measured counts (conflicts
# and wavefronts per load/store, ldmatrix instructions) rather than ncu's derived ratios.
SMEM_METRICS=l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_shared_st.sum,smsp__sass_inst_executed_op_ldsm.sum

# Where the warps wait and how much they branch (the stage 3 and 4 notebooks test their
# hypotheses with these; lib.notebook.NCU_WARP_METRICS reads them): the share of active warps
# stalled for each reason, instructions and branch instructions executed, branch uniformity.
WARP_METRICS=smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_barrier_per_warp_active.pct,smsp__warp_issue_stalled_branch_resolving_per_warp_active.pct,smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct,smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct,smsp__warp_issue_stalled_wait_per_warp_active.pct,smsp__warp_issue_stalled_no_instruction_per_warp_active.pct,smsp__warp_issue_stalled_not_selected_per_warp_active.pct,smsp__inst_executed.sum,smsp__sass_inst_executed_op_branch.sum,smsp__sass_average_branch_targets_threads_uniform.pct

profile_one() {  # profile_one NAME REPORT NCU-ARGS... -- lib.one_call ARGS...: replace REPORT only on success
  local name=$1 report=$2; shift 2
  local ncu_args=() call_args=()
  while [ "$1" != "--" ]; do ncu_args+=("$1"); shift; done
  shift
  call_args=("$@")
  # --clock-control none: ncu would otherwise lock the GPU's clocks to base for the run; the
  # curriculum leaves the clocks alone (and times the kernels at the clocks they really get).
  if run "$name" "$NCU" --clock-control none -k regex:attention "${ncu_args[@]}" python3 -m lib.one_call "${call_args[@]}"; then
    { echo "# ncu --clock-control none -k regex:attention ${ncu_args[*]} python3 -m lib.one_call ${call_args[*]}; commit $(commit_short), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u '+%Y-%m-%d %H:%M UTC')"
      cat "$OUT/logs/$name.log"; } > "$report"
  fi
}

step_profile() {
  # Nsight Compute on one call of every CUDA C++ stage at the throughput shape: where the time
  # goes (the notebooks read these reports; results/profiles/stageN-throughput.ncu.txt).
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  if [ ! -x "$NCU" ]; then
    echo "profile: Nsight Compute (ncu) not found on PATH or in /usr/local/cuda/bin" | tee -a "$OUT/summary.txt"
    FAILED+=("profile (no ncu)")
    return
  fi
  mkdir -p results/profiles
  local n
  for n in $(python3 -c "import stages; print(*[m.INFO.number for m in stages.all_stages() if m.INFO.backend == 'nvrtc'])"); do
    profile_one "profile-stage$n" "results/profiles/stage$n-throughput.ncu.txt" \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis_Tables \
      --metrics "$SMEM_METRICS,$WARP_METRICS" -- "$n" throughput
  done
  # Stage 3 in both dtypes at D 64 (throughput) and D 128 (long), with the registers a thread
  # got (LaunchStats): where its time goes, and whether bf16 runs as fp16 (its notebook reads these).
  local dt shape
  for shape in throughput long; do
    for dt in float16 bfloat16; do
      profile_one "profile-stage3-$shape-$dt" "results/profiles/stage3-$shape-$dt.ncu.txt" \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --metrics "$WARP_METRICS" -- 3 "$shape" --dtype "$dt"
    done
  done
  # Stage 5's swizzle, before and after: the same call with plain rows, for the bank conflicts.
  profile_one profile-stage5-noswizzle results/profiles/stage5-noswizzle-throughput.ncu.txt \
    --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --metrics "$SMEM_METRICS" -- 5 throughput --no-swizzle
}

step_notebooks() {
  # Executed in a scratch tree whose notebooks/ holds copies and whose other entries link to
  # this repository (notebooks find the repository as their directory's parent); the copies
  # replace the committed notebooks at the end, only if every step passed.
  NB_TREE=$(mktemp -d "${TMPDIR:-/tmp}/fa-notebooks.XXXXXX")
  mkdir "$NB_TREE/notebooks"
  local entry nb
  for entry in * .[!.]*; do
    [ -e "$entry" ] && [ "$entry" != notebooks ] && ln -s "$PWD/$entry" "$NB_TREE/$entry"
  done
  NB_EXECUTED=()
  # shellcheck disable=SC2086  # FA_NOTEBOOKS is a list of paths (globs allowed)
  for nb in ${FA_NOTEBOOKS:-notebooks/*.ipynb}; do
    [ -f "$nb" ] || { echo "notebooks: no notebook $nb" | tee -a "$OUT/summary.txt"; FAILED+=("notebooks (no $nb)"); return; }
    cp "$nb" "$NB_TREE/notebooks/"
    NB_EXECUTED+=("$nb")
  done
  local copies=()
  for nb in "${NB_EXECUTED[@]}"; do copies+=("notebooks/$(basename "$nb")"); done
  ( cd "$NB_TREE" && run notebooks python3 -m lib.notebook --execute "${copies[@]}" ) || FAILED+=("notebooks")
  mkdir -p "$OUT/executed-notebooks"
  for nb in "${NB_EXECUTED[@]}"; do cp "$NB_TREE/notebooks/$(basename "$nb")" "$OUT/executed-notebooks/"; done
}

step_pytest() {
  # pytest-xdist, where installed (the GPU image has it), spreads the suite over 8 processes.
  local par=()
  python3 -c "import xdist" 2> /dev/null && par=(-n 8)
  # shellcheck disable=SC2086  # FA_PYTEST_ARGS is a list of arguments (a subset: -k, files)
  run pytest python3 -m pytest -p no:cacheprovider -q "${par[@]}" ${FA_PYTEST_ARGS:-}
}

step_sanitize() {
  # Only the curriculum's kernels are checked (every stage's kernel names contain "attention");
  # the reference and SDPA's kernels (cuDNN, cuBLAS) are PyTorch's, not ours to fix. Host API
  # errors are left out: cuda-bindings probes driver entry points that may not exist.
  local tool
  for tool in memcheck racecheck synccheck; do
    run "sanitize-$tool" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      --kernel-name kns=attention --report-api-errors no python3 -m lib.bench --check
  done
}

STEPS=${FA_STEPS:-$ALL_STEPS}
for s in $STEPS; do
  [[ " $ALL_STEPS " == *" $s "* ]] || { echo "gpu_session.sh: unknown step '$s' in FA_STEPS; the steps are: $ALL_STEPS" >&2; exit 2; }
done

# A GPU first, before anything is installed, run or written.
command -v nvidia-smi > /dev/null 2>&1 \
  || refuse "no GPU here (nvidia-smi not found). This script records measured results and re-executes the committed notebooks, so it needs a CUDA GPU; without one, run \`python -m lib.bench\` and \`python -m pytest\` (CPU mode)."
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' \
  || refuse "no GPU here (\`nvidia-smi -L\` lists none). This script needs a CUDA GPU; without one, run \`python -m lib.bench\` and \`python -m pytest\` (CPU mode)."

WHEELS=${FA_WHEELS:-.whl}  # the tests point this elsewhere: a CPU machine may hold the GPU machine's wheels
if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_CACHE_DIR=/tmp/fa-cache

python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || refuse "torch finds no CUDA GPU (torch.cuda.is_available() is False, though nvidia-smi lists one): a CPU build of torch, or a driver problem; check: python3 -c \"import torch; print(torch.__version__, torch.version.cuda)\""

OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/logs"
: > "$OUT/summary.txt"
nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1
python3 -c "import torch, numpy, numba, numba_cuda; print('torch', torch.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/logs/versions.txt"

NB_TREE=""
NB_EXECUTED=()
for s in $STEPS; do "step_$s"; done

if [ -n "$NB_TREE" ]; then
  if [ ${#FAILED[@]} -eq 0 ]; then
    for nb in "${NB_EXECUTED[@]}"; do cp "$NB_TREE/notebooks/$(basename "$nb")" "$nb"; done
    echo "notebooks: ${#NB_EXECUTED[@]} replaced with this run's outputs" | tee -a "$OUT/summary.txt"
  else
    echo "notebooks: left as committed (a step failed); this run's copies are in $OUT/executed-notebooks" | tee -a "$OUT/summary.txt"
  fi
  rm -rf "$NB_TREE"
fi

if [ ${#FAILED[@]} -eq 0 ]; then
  echo "all steps passed: $STEPS" | tee -a "$OUT/summary.txt"
else
  echo "FAILED: ${FAILED[*]}" | tee -a "$OUT/summary.txt"
fi
tar czf "$OUT/gpu-run.tgz" results README.md notebooks -C "$OUT" logs summary.txt
echo "---"; cat "$OUT/summary.txt"
[ ${#FAILED[@]} -eq 0 ]
