#!/usr/bin/env bash
# GPU call 5 of session 46: stage 8's backward record timed again with the settled rounds
# (lib.timing.SETTLE_MS, session 44; the record at 08dc5a6 came before them), same kernels; then
# the two notebooks that show it (stage 8, journey).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-27-s46call5
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | tee $L/gpu.txt
if step backward 330 python3 scripts/backward_bench.py --record --variants --rounds 5; then
  grep -E "^\| B|recorded|not recorded" $L/backward.log | cut -c1-220
  for nb in stage8_backward journey; do
    left=$(( 570 - ($(date +%s) - T0) ))
    [ $left -lt 60 ] && { echo "$nb not run: $left s left"; continue; }
    step nb-$nb $left python3 -m lib.notebook --execute notebooks/$nb.ipynb; tail -1 $L/nb-$nb.log
  done
else
  tail -5 $L/backward.log
fi
tar czf $OUT/run.tgz results/*.json notebooks/stage8_backward.ipynb notebooks/journey.ipynb $L
