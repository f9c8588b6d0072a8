#!/usr/bin/env bash
# GPU call 8 of session 43: stage 7's tests again with a new one, D128's split tail in a CUDA graph
# and on two streams at once; and compute-sanitizer's memcheck and racecheck on that test.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FA_CACHE_DIR=/tmp/fa-cache NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 FA_GIT_COMMIT=${FA_GIT_COMMIT:-unknown}
here=results/logs/2026-11-26-s43call8
L=$here/device; mkdir -p $L
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout $limit "$@" > $L/$name.log 2>&1; local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; return $rc; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
par=(); python3 -c "import xdist" 2>/dev/null && par=(-n 8)
step pytest7 150 python3 -m pytest -q -rf -p no:cacheprovider "${par[@]}" tests/test_stage7.py
grep -E "passed|failed|^FAILED" $L/pytest7.log | cut -c1-300 | head -12
for tool in memcheck racecheck; do
  step sanitize-$tool 200 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=attention \
    --report-api-errors no python3 -m pytest -x -q -p no:cacheprovider tests/test_stage7.py -k graph_and
  tail -1 $L/sanitize-$tool.log | cut -c1-200
done
tar czf $OUT/run.tgz $L
