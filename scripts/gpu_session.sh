#!/usr/bin/env bash
# Every GPU step of a session in one go, on a machine with a CUDA GPU:
#   1. the benchmark in record mode (results/<gpu>.json, plots, README table), and the tile
#      choices of stages 4 and 5 (scripts/tile_sweep.py),
#   2. the notebooks executed in place, so they are committed with GPU outputs,
#   3. the whole pytest suite with nbval (stages running for real),
#   4. compute-sanitizer memcheck and racecheck on every stage at a small and an odd shape.
# Logs and the changed files end up in $OUT (default ./gpu-out) as gpu-run.tgz.
#
# Usage (repo root):  bash scripts/gpu_session.sh
# FA_STEPS picks a subset, in this order: "bench tiles profile notebooks pytest sanitize" (the
# default, all of them); e.g. FA_STEPS="pytest sanitize" when one call has a time limit.
# On the curriculum's H100 machine (no package registry, numpy 2.5), first fetch wheels on a
# CPU machine with `bash ../shared/h100/fetch-wheels.sh` and carry .whl/ along: they are
# installed here before anything else. Set FA_GIT_COMMIT to the commit being measured when
# the tree has no .git.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/logs"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_CACHE_DIR=/tmp/fa-cache

nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1
python3 -c "import torch, numpy, numba, numba_cuda; print('torch', torch.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/logs/versions.txt"

: > "$OUT/summary.txt"
step() {  # step NAME CMD...: run, log to $OUT/logs/NAME.log, record the exit code
  local name=$1; shift
  local t0=$(date +%s)
  echo "== $name: $*"
  "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/logs/$name.log"
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
}

STEPS=" ${FA_STEPS:-bench tiles profile notebooks pytest sanitize} "
want() { [[ "$STEPS" == *" $1 "* ]]; }

want bench && step bench python3 -m lib.bench --record --sweep ${FA_BENCH_ARGS:-}
# Every tile choice of stages 4 and 5 (and stage 5 unswizzled), stored next to the table.
want tiles && step tiles python3 scripts/tile_sweep.py --record
# Nsight Compute on one call of every CUDA C++ stage at the throughput shape: where the time
# goes (the notebooks read these reports; results/profiles/stageN-throughput.ncu.txt).
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if want profile && [ -x "$NCU" ]; then
  mkdir -p results/profiles
  for n in $(python3 -c "import stages; print(*[m.INFO.number for m in stages.all_stages() if m.INFO.backend == 'nvrtc'])"); do
    f=results/profiles/stage$n-throughput.ncu.txt
    echo "# ncu -k regex:attention --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis_Tables python3 scripts/one_call.py $n throughput; commit ${FA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u '+%Y-%m-%d %H:%M UTC')" > "$f"
    step "profile-stage$n" "$NCU" -k regex:attention --section SpeedOfLight --section Occupancy --section WarpStateStats \
      --section MemoryWorkloadAnalysis_Tables python3 scripts/one_call.py "$n" throughput
    cat "$OUT/logs/profile-stage$n.log" >> "$f"
  done
  # Stage 5's swizzle, before and after: the same call with plain rows, for the bank conflicts.
  f=results/profiles/stage5-noswizzle-throughput.ncu.txt
  echo "# ncu -k regex:attention --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables python3 scripts/one_call.py 5 throughput --no-swizzle; commit ${FA_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u '+%Y-%m-%d %H:%M UTC')" > "$f"
  step profile-stage5-noswizzle "$NCU" -k regex:attention --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables \
    python3 scripts/one_call.py 5 throughput --no-swizzle
  cat "$OUT/logs/profile-stage5-noswizzle.log" >> "$f"
fi
want notebooks && step notebooks python3 -m lib.notebook --execute ${FA_NOTEBOOKS:-notebooks/*.ipynb}
want pytest && step pytest python3 -m pytest -p no:cacheprovider -q
# Only the curriculum's kernels are checked (every stage's kernel names contain "attention");
# the reference and SDPA's kernels (cuDNN, cuBLAS) are PyTorch's, not ours to fix. Host API
# errors are left out: cuda-bindings probes driver entry points that may not exist.
for tool in memcheck racecheck; do
  want sanitize || break
  step "sanitize-$tool" compute-sanitizer --tool "$tool" --error-exitcode 9 \
    --kernel-name kns=attention --report-api-errors no python3 -m lib.bench --check
done

tar czf "$OUT/gpu-run.tgz" results README.md notebooks -C "$OUT" logs summary.txt
cat "$OUT/summary.txt"
